"""``coda-slurm colocate``: which workloads would gain from sharing one GPU, and which must not.

Reads the usage records coda-node writes into the profiles (NVML GPU and memory
utilisation, :class:`coda_common.store.profiles.UsageRecord`) and judges every pair with
:func:`slurm_plugin.decision.colocate.judge_pairs`, then names the set of workloads that may all
share
with each other (:func:`slurm_plugin.decision.colocate.shareable_workloads`): what an admin can give
``shard`` GRES. Read-only: it changes no profile and no job; it is for admins who run MPS or
Slurm's ``shard`` GRES and choose which workloads to let share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from coda_common.cli import CliError, FiniteFloatRange, conf_option, emit_json, store_option
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path
from coda_common.store.profiles import (
    Profile,
    ProfileFormatError,
    ProfileStore,
    UsageRecord,
    usage_for_model,
)
from slurm_plugin.cli.profiles import (
    _load_all,
    _warn_unusable,
    format_table,
    resolve_store,
)
from slurm_plugin.decision.colocate import (
    PairVerdict,
    ShareCandidate,
    judge_pairs,
    shareable_workloads,
)

NO_USAGE_HINT = "no NVML usage yet: run once under coda-node"


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    """The workload name, with the signature where two profiles share a workload name."""
    profile: Profile
    usage: UsageRecord | None


def _margin_from_conf(conf: Path | None, store: Path | None) -> float:
    """``ColocateMargin=`` of coda.conf; the default when only ``--store`` was given and no
    coda.conf exists (the report needs nothing else from it)."""
    conf_path = conf if conf is not None else default_conf_path()
    if conf is None and store is not None and not conf_path.exists():
        return CodaConfig().colocate_margin
    try:
        return load_config(conf_path).colocate_margin
    except OSError as exc:
        raise CliError(f"cannot read {conf_path}", exc.strerror or str(exc)) from exc
    except ValueError as exc:  # ConfigError
        raise CliError(f"cannot load {conf_path}", str(exc)) from exc


def _pick_usage(p: Profile, gpu_model: str | None) -> UsageRecord | None:
    if gpu_model is not None:
        return usage_for_model(p.usage, gpu_model)
    if not p.usage:
        return None
    # The record with most ticks: the GPU model the workload ran on most.
    return max(p.usage, key=lambda u: (u.ticks, u.updated_unix_s))


def _rows(found: Sequence[Profile], wanted: Sequence[str], gpu_model: str | None) -> list[_Row]:
    if wanted:
        missing = [w for w in wanted if not any(w in (p.workload, p.signature) for p in found)]
        if missing:
            raise CliError(
                f"no profile for {', '.join(repr(w) for w in missing)}",
                "not a stored workload or signature; see `coda-slurm profiles list`",
            )
        found = [p for p in found if p.workload in wanted or p.signature in wanted]
    names = Counter(p.workload for p in found)
    rows = [
        _Row(
            label=p.workload if names[p.workload] == 1 else f"{p.workload} ({p.signature})",
            profile=p,
            usage=_pick_usage(p, gpu_model),
        )
        for p in sorted(found, key=lambda p: (p.workload, p.signature))
    ]
    return rows


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _pair_rows(pairs: Sequence[PairVerdict], by_label: dict[str, UsageRecord]) -> list[list[str]]:
    out = []
    for v in pairs:
        ua, ub = by_label[v.a], by_label[v.b]
        out.append(
            [
                v.a,
                v.b,
                f"{v.speedup:.2f}",
                f"{_pct(ua.gpu_util)}/{_pct(ub.gpu_util)}",
                f"{_pct(ua.gpu_mem_bw_util)}/{_pct(ub.gpu_mem_bw_util)}",
            ]
        )
    return out


def _usage_json(u: UsageRecord) -> dict[str, Any]:
    return {
        "gpu_model": u.gpu_model,
        "gpu_util": u.gpu_util,
        "gpu_mem_bw_util": u.gpu_mem_bw_util,
        "ticks": u.ticks,
        "updated_unix_s": u.updated_unix_s,
    }


@dataclass(frozen=True, slots=True)
class _Report:
    """What ``coda-slurm colocate`` found, for the screen or ``--json``."""

    store_root: Path
    margin: float
    gpu_model: str | None
    rows: list[_Row]
    pairs: list[PairVerdict]
    shareable: list[str]
    errors: list[ProfileFormatError]

    @property
    def missing(self) -> list[_Row]:
        """The workloads without usage to judge them by."""
        return [r for r in self.rows if r.usage is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "store": str(self.store_root),
            "margin": self.margin,
            "gpu_model": self.gpu_model,
            "workloads": [
                {
                    "workload": r.label,
                    "signature": r.profile.signature,
                    "usage": _usage_json(r.usage) if r.usage else None,
                }
                for r in self.rows
            ],
            "pairs": [
                {
                    "a": v.a,
                    "b": v.b,
                    "speedup": round(v.speedup, 4),
                    "verdict": v.verdict,
                    "reason": v.reason,
                }
                for v in self.pairs
            ],
            "shareable": self.shareable,
            "no_usage": [
                {"workload": r.label, "signature": r.profile.signature} for r in self.missing
            ],
            "errors": [{"path": e.path, "problem": e.problem} for e in self.errors],
        }


def _judge(
    store_root: Path,
    margin: float,
    gpu_model: str | None,
    rows: list[_Row],
    errors: list[ProfileFormatError],
) -> _Report:
    """Every pair of the measured ``rows`` judged, and the workloads that may all share."""
    cands = [
        ShareCandidate(r.label, r.usage.gpu_util, r.usage.gpu_mem_bw_util)
        for r in rows
        if r.usage is not None
    ]
    return _Report(
        store_root=store_root,
        margin=margin,
        gpu_model=gpu_model,
        rows=rows,
        pairs=judge_pairs(cands, margin=margin),
        shareable=shareable_workloads(cands, margin=margin),
        errors=errors,
    )


def _echo_pairs(report: _Report) -> None:
    """The judged pairs, one table per verdict, and the workloads that may all share."""
    by_label = {r.label: r.usage for r in report.rows if r.usage is not None}
    headers = ["WORKLOAD A", "WORKLOAD B", "SPEEDUP", "GPU BUSY", "MEM BUSY"]
    sections = (
        ("share", f"Gain from sharing a GPU (speedup >= {1 + report.margin:.2f})"),
        ("neutral", f"Little to gain (1.00 <= speedup < {1 + report.margin:.2f})"),
        ("avoid", "Must not share a GPU (speedup < 1: slower together)"),
    )
    for verdict, title in sections:
        chosen = [v for v in report.pairs if v.verdict == verdict]
        if not chosen:
            continue
        click.echo("")
        click.echo(f"{title}:")
        table = format_table(headers, _pair_rows(chosen, by_label), right={2, 3, 4})
        click.echo("\n".join("  " + line for line in table.splitlines()))
    if not report.pairs:
        click.echo("")
        click.echo("No workload has usage data yet: nothing to judge.")
    else:
        # The set an admin can give shard GRES: every pair inside it is predicted to gain
        # (slurm_plugin.decision.colocate.shareable_workloads).
        click.echo("")
        names = ", ".join(report.shareable) if report.shareable else "none"
        click.echo(f"May share a GPU with each other (every pair among them gains): {names}")


def _echo_report(report: _Report) -> None:
    if not report.rows:
        click.echo(f"No profiles in {report.store_root}.")
        _warn_unusable(report.errors)
        return
    gpu_model = report.gpu_model
    on = f" on {gpu_model}" if gpu_model else ""
    click.echo(
        f"GPU sharing{on}: predicted speedup = time one after another / time together "
        f"(> 1: sharing gains; Tabrizian 2020, eq. 4.1)"
    )
    _echo_pairs(report)
    missing = report.missing
    if missing:
        click.echo("")
        what = (
            f"no NVML usage on {gpu_model} yet: run once under coda-node"
            if gpu_model
            else NO_USAGE_HINT
        )
        click.echo(f"Not judged ({what}):")
        for r in missing:
            click.echo(f"  {r.label}")
    _warn_unusable(report.errors)


@click.command("colocate")
@conf_option("ProfileStore= and ColocateMargin=")
@store_option()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--margin",
    type=FiniteFloatRange(0.0, 1.0),
    default=None,
    help="Report a pair as gaining only from a predicted speedup of 1 + MARGIN "
    "(default: ColocateMargin= of coda.conf, 0.05).",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    metavar="W",
    help="Only these workloads (name or signature); repeat for several.",
)
@click.option(
    "--gpu-model",
    default=None,
    metavar="M",
    help="Use the usage measured on this GPU model (as NVML names it, any case); "
    "default: each workload's most measured model.",
)
def colocate_cmd(
    conf_path: Path | None,
    store_path: Path | None,
    as_json: bool,
    margin: float | None,
    workloads: tuple[str, ...],
    gpu_model: str | None,
) -> None:
    """Which workloads are predicted to gain from sharing one GPU (MPS or shard), and
    which must not share.

    The speedup is Tabrizian's delta: the time to run two jobs one after another over the
    time to run them together (> 1: sharing gains). It is predicted from the GPU and memory
    utilisation coda-node measured for each workload; see docs/admin-guide.md.
    """
    if margin is None:
        margin = _margin_from_conf(conf_path, store_path)
    store = ProfileStore(resolve_store(store_path, conf_path))
    found, errors = _load_all(store)
    report = _judge(store.root, margin, gpu_model, _rows(found, workloads, gpu_model), errors)
    if as_json:
        emit_json(report.to_json())
        return
    _echo_report(report)
