"""``coda-slurm report``: the site's GPU jobs of a window from coda-node's job summaries
(``JobSummaryDir``), summed per user, account or partition: GPU-hours, GPU-hours waiting on
CPUs, idle cores, the cores coda added and returned, what sized the jobs, and the profiles
that changed (``ProfileStore``). The figures are :mod:`slurm_plugin.cli.sitereport`'s; the
words :mod:`slurm_plugin.cli.reporttext`'s; the page :mod:`slurm_plugin.cli.reporthtml`'s."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

import click

from coda_common.cli import CliError, conf_option, emit_json
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurm_conf, read_slurm_keys
from coda_common.store.profiles import Profile, ProfileStore, StoreUnavailable
from coda_common.store.summaries import ScanProblems, SummaryStore, latest, store_for
from slurm_plugin.cli.reporthtml import render_html
from slurm_plugin.cli.reporttext import render, user_mail
from slurm_plugin.cli.sitereport import (
    GROUP_KEYS,
    Baselines,
    ProfileChange,
    Window,
    build_report,
    figures,
    user_jobs,
    window_from,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_FILE_STEM_CHARS = 64


def mail_file_name(user: str) -> str:
    """``<user>.txt`` where the name is a plain file name; otherwise its safe characters, a
    short hash of the whole name (two names never share a file) and ``.txt``: no ``/``, no
    leading dot, no ``..``."""
    safe = _UNSAFE.sub("_", user)[:MAX_FILE_STEM_CHARS].lstrip(".")
    if safe != user or not safe:
        digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        safe = f"{safe[:48] or 'user'}-{digest}"
    return f"{safe}.txt"


def write_file(path: Path, text: str) -> None:
    """Write ``path`` whole: a temporary file beside it renamed over it (a link planted at
    ``path`` is replaced, never followed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".coda-report-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _config(conf_path: Path | None) -> CodaConfig | None:
    path = conf_path or default_conf_path()
    if conf_path is None and not path.exists():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CliError(f"cannot load {path}", exc.message) from exc
    except OSError as exc:
        raise CliError(f"cannot read {path}", exc.strerror or str(exc)) from exc


def read_baselines(cfg: CodaConfig | None) -> Baselines:
    """slurm.conf's DefCpuPerGPU (``SlurmConf=`` of coda.conf, else the one beside it)."""
    if cfg is None or cfg.slurm_conf is None:
        return Baselines(why="no coda.conf, so no slurm.conf")
    path = cfg.slurm_conf
    try:
        _, partitions = read_slurm_conf(path)
        keys = read_slurm_keys(path, ["DefCpuPerGPU"])
    except (ConfigError, OSError) as exc:
        return Baselines(why=f"cannot read {path}: {exc}")
    value = keys.get("defcpupergpu", "")
    return Baselines(
        partitions={p.name: p.def_cpu_per_gpu for p in partitions if p.def_cpu_per_gpu},
        global_cpg=int(value) if value.isascii() and value.isdigit() else None,
        source=str(path),
    )


def read_profile_changes(
    cfg: CodaConfig | None, window: Window
) -> tuple[list[ProfileChange] | None, str | None]:
    """The profiles last updated in the window, or (None, why not)."""
    if cfg is None:
        return None, "no coda.conf, so no ProfileStore"
    out, bad = [], 0
    try:
        for _path, item in ProfileStore(cfg.profile_store).iter_profiles():
            if not isinstance(item, Profile):
                bad += 1
            elif window.since_unix_s <= item.updated_unix_s < window.until_unix_s:
                out.append(
                    ProfileChange(
                        item.signature,
                        item.workload,
                        item.cpus_per_gpu,
                        item.updated_unix_s,
                        item.source,
                    )
                )
    except StoreUnavailable as exc:
        return None, str(exc)
    return out, (f"{bad} profile files unreadable" if bad else None)


def _summary_store(store_dir: Path | None, cfg: CodaConfig | None) -> SummaryStore:
    if store_dir is not None:
        return SummaryStore(store_dir)
    if cfg is None:
        raise CliError(
            "no job summary store", "give --store DIR, or --conf a coda.conf (JobSummaryDir)"
        )
    return store_for(cfg)


def _write_mails(directory: Path, jobs_by_user: dict[str, list], window: Window) -> int:
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        for user, jobs in sorted(jobs_by_user.items()):
            write_file(directory / mail_file_name(user), user_mail(user, jobs, window))
    except OSError as exc:
        raise CliError(f"cannot write the mails to {directory}", exc.strerror or str(exc)) from exc
    return len(jobs_by_user)


@click.command("report")
@click.option(
    "--since",
    help="Start: now-7days, 2026-12-01, 2026-12-01T08:00 (UTC unless "
    "an offset is given). Default: --days before --until.",
)
@click.option("--until", help="End (not included): as --since. Default: now.")
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True, max=3660),
    help="Window length in days (default 7).",
)
@click.option(
    "--by",
    type=click.Choice(GROUP_KEYS),
    default="user",
    show_default=True,
    help="Group of the table and the plot (--json has all three).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--per-user",
    "per_user",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write one plain-text mail per user, DIR/<user>.txt.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report as one self-contained HTML page.",
)
@conf_option("JobSummaryDir, ProfileStore, SlurmConf")
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Job summary directory (default: JobSummaryDir of coda.conf).",
)
def report_cmd(
    since: str | None,
    until: str | None,
    days: float | None,
    by: str,
    as_json: bool,
    per_user: Path | None,
    html_path: Path | None,
    conf_path: Path | None,
    store_dir: Path | None,
) -> None:
    """The site's GPU jobs of a window (default: the last 7 days): GPU-hours, GPU-hours
    waiting on CPUs, idle cores, cores coda added and returned, what sized the jobs, per
    user, account or partition; docs/admin-guide.md says how each figure is computed."""
    now_s = time.time()
    try:
        window = window_from(since, until, days, now_s)
    except ValueError as exc:
        raise CliError("cannot tell the window", str(exc)) from None
    cfg = _config(conf_path)
    store = _summary_store(store_dir, cfg)
    problems = ScanProblems()
    summaries = latest(store.scan(window.since_unix_s, window.until_unix_s, problems))
    baselines = read_baselines(cfg)
    jobs, cpu = figures(summaries, baselines)
    changes, changes_why = read_profile_changes(cfg, window)
    doc = build_report(
        jobs,
        cpu,
        window,
        baselines,
        by=by,
        problems=(problems.count, problems.kept),
        profiles=changes,
        profiles_why=changes_why,
        generated_unix_s=now_s,
        summaries_read=len(summaries),
    )
    if per_user is not None:
        n = _write_mails(per_user, user_jobs(jobs), window)
        click.echo(f"wrote {n} user mails to {per_user}", err=True)
    if html_path is not None:
        try:
            write_file(html_path, render_html(doc))
        except OSError as exc:
            raise CliError(f"cannot write {html_path}", exc.strerror or str(exc)) from exc
        click.echo(f"wrote {html_path}", err=True)
    if as_json:
        emit_json(doc)
    else:
        click.echo(render(doc))
