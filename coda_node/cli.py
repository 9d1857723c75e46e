"""``coda-node``: the node-side command (check, run, restore, limit, release, status)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from coda_node import __version__
from coda_node.check import probe_all
from coda_node.paths import SystemRoot
from coda_node.state import STATE_FILE, Limit, StateError, load_limits, save_limits
from slurm_plugin.cli_common import CliError, emit_json, run_cli
from slurm_plugin.conf import CodaConfig, ConfigError, load_config
from slurm_plugin.paths import default_conf_path

CONF_OPTION = click.option(
    "--conf",
    "conf_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="coda.conf (default: $CODA_CONF, else beside $SLURM_CONF, else /etc/slurm/coda.conf).",
)


def load_node_config(conf_path: Path | None, root: Path | None = None) -> CodaConfig:
    """coda.conf for the node; a missing file means the defaults (said once on stderr)."""
    from dataclasses import replace

    path = conf_path or default_conf_path()
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        if conf_path is None and not path.exists():
            click.echo(f"coda-node: {path} not found; using the defaults", err=True)
            cfg = CodaConfig()
        else:
            raise CliError("invalid configuration", str(exc)) from None
    if root is not None:
        cfg = replace(cfg, node_root=root)
    return cfg


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="coda-node")
def cli() -> None:
    """CODA for Slurm on a GPU node."""


@cli.command()
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="System root (a fixture tree in tests).",
)
@click.option("--json", "as_json", is_flag=True)
def check(root: Path, as_json: bool) -> None:
    """Which capabilities (cpusets, CPU quota, RDT, uncore PMUs, NVML) are usable here."""
    # Ask slurmctld only about the real system, not about a fixture tree.
    caps = probe_all(SystemRoot(root), slurm=root.resolve() == Path("/"))
    if as_json:
        emit_json([c.to_dict() for c in caps])
        return
    width = max(len(c.name) for c in caps)
    for c in caps:
        state = "available" if c.available else "unavailable"
        click.echo(f"{c.name:<{width}}  {state:<11}  {c.detail}")


@cli.command()
@CONF_OPTION
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="System root for every /sys, /proc and /dev path (overrides NodeRoot).",
)
@click.option("--once", is_flag=True, help="One tick, print what was seen, keep changes.")
@click.option("-v", "--verbose", is_flag=True, help="Log every tick.")
def run(conf_path: Path | None, root: Path | None, once: bool, verbose: bool) -> None:
    """Run the node daemon in the foreground (systemd: scripts/coda-node.service).

    SIGTERM or SIGINT puts every job back as Slurm set it, then exits.
    """
    from coda_node.daemon import Daemon, default_state_dir_ok, install_signal_handlers

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="coda-node: %(levelname)s %(message)s",
    )
    cfg = load_node_config(conf_path, root)
    problem = default_state_dir_ok(cfg.node_state_dir)
    if problem:
        raise CliError("cannot keep state", problem)
    daemon = Daemon(cfg)
    try:
        daemon.start()
    except StateError as exc:
        raise CliError("cannot start", str(exc)) from None
    if once:
        report = daemon.tick()
        emit_json(daemon.state.view)
        for p in report.problems:
            click.echo(f"coda-node: {p}", err=True)
        return
    stop = threading.Event()
    install_signal_handlers(stop)
    daemon.run(stop)


@cli.command()
@CONF_OPTION
def restore(conf_path: Path | None) -> None:
    """Put every job coda-node changed back as Slurm set it (after a crash, or by hand).

    The systemd unit runs this after the daemon stops for any reason.
    """
    from coda_node.daemon import Daemon

    logging.basicConfig(level=logging.INFO, format="coda-node: %(message)s")
    cfg = load_node_config(conf_path)
    daemon = Daemon(cfg)
    try:
        daemon.start()
    except StateError as exc:
        raise CliError("cannot restore", str(exc)) from None
    results = daemon.restore()
    failed = {j: r.failed for j, r in results.items() if r.failed}
    restored = [j for j, r in results.items() if r.applied]
    ended = [j for j, r in results.items() if r.gone]
    click.echo(
        f"restored {len(restored)} job(s)"
        + (f" ({', '.join(map(str, restored))})" if restored else "")
        + (f"; {len(ended)} had ended" if ended else "")
    )
    if failed:
        raise CliError(
            "some jobs could not be restored",
            "; ".join(f"job {j}: {', '.join(f)}" for j, f in failed.items()),
        )


@cli.command()
@CONF_OPTION
@click.argument("job_id", type=int)
@click.option("--cores", type=click.IntRange(min=1), help="Keep the job on N of its cores.")
@click.option("--cpus", "cpu_list", help="Keep the job on these of its CPUs (e.g. 0-3,8).")
@click.option(
    "--cpu-quota",
    "quota_cores",
    type=click.FloatRange(min=0, min_open=True),
    help="Cap the job's CPU time at this many cores' worth.",
)
@click.option(
    "--mem-bw",
    "mem_bw_pct",
    type=click.IntRange(min=1),
    help="Cap the job's memory bandwidth (Intel RDT MBA: percent, or MBps on mba_MBps).",
)
@click.option("--reason", default="admin limit", show_default=True)
def limit(
    conf_path: Path | None,
    job_id: int,
    cores: int | None,
    cpu_list: str | None,
    quota_cores: float | None,
    mem_bw_pct: int | None,
    reason: str,
) -> None:
    """Limit a running job on this node; the daemon applies it on its next tick.

    Limits stay within the job's Slurm allocation and are undone by `coda-node release`,
    when the job ends, or when the daemon stops.
    """
    from coda_node.cgroups import parse_cpulist

    if cores is not None and cpu_list is not None:
        raise CliError("give --cores or --cpus, not both")
    if cores is None and cpu_list is None and quota_cores is None and mem_bw_pct is None:
        raise CliError("nothing to limit", "give --cores, --cpus, --cpu-quota or --mem-bw")
    cpus = None
    if cpu_list is not None:
        try:
            cpus = tuple(sorted(parse_cpulist(cpu_list)))
        except ValueError as exc:
            raise CliError(f"bad CPU list {cpu_list!r}", str(exc)) from None
        if not cpus:
            raise CliError("an empty CPU list is not a limit")
    cfg = load_node_config(conf_path)
    limits = _limits(cfg)
    limits[job_id] = Limit(
        cores=cores, cpus=cpus, quota_cores=quota_cores, mem_bw_pct=mem_bw_pct, reason=reason
    )
    _save_limits(cfg, limits)
    click.echo(
        f"job {job_id}: limit recorded; coda-node applies it within {cfg.node_interval_s:g}s"
    )


@cli.command()
@CONF_OPTION
@click.argument("job_id", type=int)
def release(conf_path: Path | None, job_id: int) -> None:
    """Remove a job's limit; the daemon puts the job back as Slurm set it."""
    cfg = load_node_config(conf_path)
    limits = _limits(cfg)
    if limits.pop(job_id, None) is None:
        raise CliError(f"job {job_id} has no limit")
    _save_limits(cfg, limits)
    click.echo(f"job {job_id}: limit removed; restored within {cfg.node_interval_s:g}s")


def _limits(cfg: CodaConfig) -> dict[int, Limit]:
    try:
        return load_limits(cfg.node_state_dir)
    except StateError as exc:
        raise CliError("cannot read limits", str(exc)) from None


def _save_limits(cfg: CodaConfig, limits: dict[int, Limit]) -> None:
    try:
        save_limits(cfg.node_state_dir, limits)
    except OSError as exc:
        raise CliError(f"cannot write limits in {cfg.node_state_dir}", exc.strerror) from None


@cli.command()
@CONF_OPTION
@click.option("--json", "as_json", is_flag=True, help="The daemon's view, as JSON.")
def status(conf_path: Path | None, as_json: bool) -> None:
    """What the daemon sees and did: jobs with their cores, GPUs and counters."""
    cfg = load_node_config(conf_path)
    path = cfg.node_state_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(
            "coda-node is not running here", f"no state file {path}; start coda-node"
        ) from None
    except PermissionError:
        raise CliError(f"cannot read {path}", "permission denied; try as root") from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}", str(exc)) from None
    view = data.get("view") or {}
    if as_json:
        emit_json({"format_version": data.get("format_version"), **view})
        return
    click.echo(render_status(view, data.get("written_unix_s")))


def _progress_cell(progress: dict[str, Any] | None) -> str:
    """``train 97/s`` (iterations), ``train 85%`` (GPU utilisation), or the phase alone."""
    if not progress:
        return "-"
    phase, rate = progress.get("phase") or "?", progress.get("rate")
    if rate is None:
        return phase
    unit = "/s" if progress.get("source") == "iterations" else "%"
    return f"{phase} {rate:.3g}{unit}"


def _profile_cell(profiling: dict[str, Any] | None) -> str:
    """``probing 1/2c``, ``done 1c 0.99``, ``skipped``, ``waiting``."""
    if not profiling:
        return "-"
    state = profiling.get("state") or "?"
    if state == "probing" and profiling.get("cores_now") is not None:
        return f"probing {profiling['cores_now']}c"
    if state == "done" and profiling.get("sweet_spot_cores") is not None:
        return f"done {profiling['sweet_spot_cores']}c {profiling.get('confidence') or 0:.2f}"
    return state


def render_status(view: dict[str, Any], written_unix_s: float | None) -> str:
    daemon = view.get("daemon") or {}
    node = view.get("node") or {}
    lines = []
    age = f"{time.time() - written_unix_s:.0f}s ago" if written_unix_s else "never"
    state = "running" if daemon.get("running") else "stopped"
    lines.append(
        f"node {daemon.get('node_name', '?')}  coda-node {daemon.get('version', '?')} "
        f"{state} (pid {daemon.get('pid', '?')}), updated {age}; enforcing "
        + (",".join(daemon.get("enforce") or []) or "nothing")
    )
    for cap in node.get("capabilities") or []:
        mark = "yes" if cap.get("available") else "no "
        lines.append(f"  {mark} {cap.get('name')}: {cap.get('detail')}")
    jobs = view.get("jobs") or []
    lines.append(
        f"  profiling: {daemon.get('profiling', '?')}; contention: {daemon.get('contention', '?')}"
    )
    lines.append("")
    header = (
        f"{'JOBID':>8} {'USER':<10} {'KIND':<4} {'GPUS':<8} {'CPUS':<10} {'NOW':<10} "
        f"{'CPU%':>6} {'QUOTA':>6} {'PROGRESS':<14} {'PROFILE':<14}  WHY"
    )
    lines.append(header)
    for j in jobs:
        gpus = ",".join(str(g["slurm_index"]) for g in j.get("gpus") or []) or "-"
        rate = j.get("cpu_rate_cores")
        quota = j.get("quota_cores")
        lines.append(
            f"{j['job_id']:>8} {j.get('user') or '?'!s:<10.10} {j.get('kind', '?'):<4} "
            f"{gpus:<8} {j.get('cpus_allocated') or '-'!s:<10} {j.get('cpus_now')!s:<10} "
            f"{(f'{rate * 100:.0f}' if rate is not None else '-'):>6} "
            f"{(f'{quota:g}' if quota is not None else '-'):>6} "
            f"{_progress_cell(j.get('progress')):<14} {_profile_cell(j.get('profiling')):<14}  "
            f"{j.get('target_reason') or '-'}"
        )
    if not jobs:
        lines.append("  (no jobs on this node)")
    errors = node.get("errors") or []
    for e in errors:
        lines.append(f"! {e}")
    events = view.get("events") or []
    if events:
        lines.append("")
        lines.append("recent:")
        for ev in events[-10:]:
            when = time.strftime("%H:%M:%S", time.localtime(ev["unix_s"]))
            lines.append(f"  {when} job {ev['job_id']}: {ev['what']} ({ev['reason']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_cli(cli, "coda-node", argv)


if __name__ == "__main__":
    sys.exit(main())
