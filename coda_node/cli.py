"""``coda-node``: the node-side command (check, run, restore, limit, release, status)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from coda_common.cli import CliError, FiniteFloatRange, conf_option, emit_json, run_cli
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path
from coda_common.slurm.conffile import ConfigError
from coda_node import __version__
from coda_node.enforce.mechanisms import probe, registered
from coda_node.enforce.state import (
    STATE_FILE,
    VIEW_FILE,
    Limit,
    StateError,
    StateNewer,
    load_limits,
    save_limits,
)
from coda_node.status.document import load_status
from coda_node.status.text import render
from coda_node.system.cgroups import CgroupError
from coda_node.system.check import probe_slurm_jobs
from coda_node.system.paths import SystemRoot
from coda_node.system.slurmjobs import Runner, make_runner

if TYPE_CHECKING:
    from coda_node.enforce.enforcer import JobResult

WATCH_DEFAULT_S = 2.0
WATCH_MAX_S = 3600.0
"""The longest ``--watch`` interval (an hour): longer ones are no watch, and beyond about
292 years the sleep cannot be made at all."""
TERMINAL_FALLBACK = (160, 50)
"""Columns and lines when stdout is not a terminal and $COLUMNS is unset (a pipe, a file):
wide enough that a piped screen keeps every column."""

CONF_OPTION = conf_option()
JOB_ID = click.IntRange(1, (1 << 32) - 1)
"""A Slurm job id (a uint32; 0 names no job): the ids the limits file holds
(:func:`~coda_node.enforce.state.load_limits`)."""


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
@CONF_OPTION
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="System root (a fixture tree in tests; overrides NodeRoot).",
)
@click.option("--json", "as_json", is_flag=True)
def check(conf_path: Path | None, root: Path | None, as_json: bool) -> None:
    """Which capabilities (cpusets, CPU quota, RDT, uncore PMUs, NVML) are usable here.

    The Slurm job cgroups row shows only the tree of coda.conf's NodeName where one host
    runs several slurmd (every tree when NodeName is unset). On the real system the Slurm
    jobs seen row compares the jobs squeue runs here with those in the tree; a directory
    there that names no job, or running jobs the tree does not show, is a PROBLEM and the
    exit status is 1 (a missing capability is not).
    """
    # check runs before a node is configured: no coda.conf at all means the defaults, quietly.
    if conf_path is None and not default_conf_path().exists():
        cfg = CodaConfig()
    else:
        cfg = load_node_config(conf_path)
    system_root = root if root is not None else cfg.node_root
    # Ask slurmctld only about the real system, not about a fixture tree.
    real = system_root.resolve() == Path("/")
    try:
        caps = probe(SystemRoot(system_root), slurm=real, node_name=cfg.node_name)
    except CgroupError as exc:
        raise CliError("cannot probe", f"{exc} (NodeRoot={system_root})") from None
    jobs_runner = _jobs_runner(real)
    if jobs_runner is not None:
        # As the daemon names the node (coda_node.daemon.service).
        node_name = cfg.node_name or socket.gethostname().split(".")[0]
        caps.append(probe_slurm_jobs(SystemRoot(system_root), node_name, jobs_runner))
    problems = [c for c in caps if c.problem]
    if as_json:
        emit_json([c.to_dict() for c in caps])
    else:
        width = max(len(c.name) for c in caps)
        for c in caps:
            state = "PROBLEM" if c.problem else "available" if c.available else "unavailable"
            click.echo(f"{c.name:<{width}}  {state:<11}  {c.detail}")
    if problems:
        raise CliError("; ".join(c.name for c in problems), "; ".join(c.detail for c in problems))


def _jobs_runner(real: bool) -> Runner | None:
    """The Slurm commands ``check`` compares the node's jobs with: the real ones on the
    real system, none for a fixture tree."""
    return make_runner() if real else None


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
    from coda_node.daemon.service import Daemon, default_state_dir_ok, install_signal_handlers

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="coda-node: %(levelname)s %(message)s",
    )
    cfg = load_node_config(conf_path, root)
    for where in (cfg.node_state_dir, cfg.node_runtime_dir):
        problem = default_state_dir_ok(where)
        if problem:
            raise CliError("cannot keep state", problem)
    try:
        daemon = Daemon(cfg)
    except CgroupError as exc:
        raise CliError("cannot start", f"{exc} (NodeRoot={cfg.node_root})") from None
    try:
        daemon.start()
    except StateNewer as exc:
        # A newer coda-node ran here: this one is a downgrade or a second installation,
        # and what the newer one recorded may be more than this one can read. Running on
        # would have an older policy act on the jobs behind a record it cannot keep, so
        # the operator decides; but first every job goes back to Slurm's allocation, so
        # that the refusal leaves none shrunk (a `run` by hand has no systemd
        # ExecStopPost to run `coda-node restore` after it).
        summary = _put_back(cfg)
        raise CliError("cannot start", f"{exc}; {summary}") from None
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
    logging.basicConfig(level=logging.INFO, format="coda-node: %(message)s")
    cfg = load_node_config(conf_path)
    _check_can_put_back(cfg, "restore")
    results = _restore(cfg, None)
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


def _check_can_put_back(cfg: CodaConfig, command: str) -> None:
    """Root and a usable NodeStateDir, or a CliError saying so."""
    from coda_node.daemon.service import default_state_dir_ok

    if os.geteuid() != 0 and cfg.node_root.resolve() == Path("/"):
        raise CliError(
            f"coda-node {command} must run as root",
            f"it writes the jobs' cgroups and the state file; try: sudo coda-node {command}",
        )
    problem = default_state_dir_ok(cfg.node_state_dir)
    if problem:
        raise CliError(f"cannot {command}", problem)


def _restore(cfg: CodaConfig, only: frozenset[int] | None) -> dict[int, JobResult]:
    """Every job (or those ``only`` names) put back as Slurm set it, whatever the state
    file says or cannot say (Daemon.start's ``put_back``)."""
    from coda_node.daemon.service import Daemon

    try:
        daemon = Daemon(cfg)
        daemon.start(put_back=True)
        return daemon.restore(only)
    except StateError as exc:
        raise CliError("cannot restore", str(exc)) from None
    except CgroupError as exc:
        raise CliError("cannot restore", f"{exc} (NodeRoot={cfg.node_root})") from None
    except PermissionError as exc:
        raise CliError(
            "cannot restore", f"{exc.filename or exc}: permission denied; run as root"
        ) from None


def _put_back(cfg: CodaConfig) -> str:
    """:func:`_restore` of every job, in words (for a command that then fails)."""
    try:
        results = _restore(cfg, None)
    except CliError as exc:
        return f"the jobs could not be put back ({exc})"
    restored = [str(j) for j, r in results.items() if r.applied]
    failed = [f"job {j}: {', '.join(r.failed)}" for j, r in results.items() if r.failed]
    said = (
        f"put jobs {', '.join(restored)} back to Slurm's allocation"
        if restored
        else "no job needed putting back"
    )
    return said + (f"; not put back: {'; '.join(failed)}" if failed else "")


class LimitCommand(click.Command):
    """``coda-node limit``: the job, then each registered mechanism's options
    (:attr:`~coda_node.enforce.mechanisms.base.Mechanism.limit_options`), then
    ``--reason``; the mechanisms are read each time the command parses or shows its help,
    so a mechanism registered at any time before has its options there."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        at = next(i for i, p in enumerate(params) if p.name == "reason")
        return [
            *params[:at],
            *(o for kind in registered() for o in kind.limit_options),
            *params[at:],
        ]


def _limit_of(options: dict[str, Any], reason: str) -> Limit:
    """The limit the mechanisms' options ask for (each mechanism's
    :meth:`~coda_node.enforce.mechanisms.base.Mechanism.limit_fields`)."""
    given = {name: value for name, value in options.items() if value is not None}
    if not given:
        flags = [o.opts[0] for kind in registered() for o in kind.limit_options]
        listed = ", ".join(flags[:-1]) + " or " + flags[-1] if len(flags) > 1 else "".join(flags)
        raise CliError("nothing to limit", f"give {listed}")
    fields: dict[str, Any] = {}
    extra: list[tuple[str, Any]] = []
    for kind in registered():
        mine = {o.name: given[o.name] for o in kind.limit_options if o.name in given}
        part = kind.limit_fields(mine)
        extra += part.pop("extra", ())
        fields.update(part)
    return Limit(**fields, reason=reason, extra=tuple(sorted(extra)))


REASON_MAX_CHARS = 200
"""The longest ``--reason``: the daemon copies it into its view on every tick and into
each event of the job."""


def _one_line_reason(ctx: click.Context, param: click.Parameter, reason: str) -> str:
    """``--reason`` as given, when it is one line of printable text of at most
    :data:`REASON_MAX_CHARS` characters."""
    if len(reason) > REASON_MAX_CHARS:
        raise click.BadParameter(f"at most {REASON_MAX_CHARS} characters, not {len(reason)}")
    if not reason.isprintable():
        raise click.BadParameter("one line of printable text (no line break or control character)")
    return reason


@cli.command(cls=LimitCommand)
@CONF_OPTION
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--reason",
    default="admin limit",
    show_default=True,
    callback=_one_line_reason,
    help=f"Shown by coda-node status; one line, at most {REASON_MAX_CHARS} characters.",
)
def limit(conf_path: Path | None, job_id: int, reason: str, **options: Any) -> None:
    """Limit a running job on this node; the daemon applies it on its next tick.

    Limits stay within the job's Slurm allocation and are undone by `coda-node release`,
    when the job ends, or when the daemon stops.
    """
    new_limit = _limit_of(options, reason)
    cfg = load_node_config(conf_path)
    limits = _limits(cfg)
    limits[job_id] = new_limit
    _save_limits(cfg, limits)
    click.echo(
        f"job {job_id}: limit recorded; coda-node applies it within {cfg.node_interval_s:g}s"
    )


@cli.command()
@CONF_OPTION
@click.argument("job_id", type=JOB_ID)
def release(conf_path: Path | None, job_id: int) -> None:
    """Remove a job's limit and put the job back as Slurm set it.

    With the daemon running, its next tick puts the job back. Without one, this command
    does it now (whatever the state file says or cannot say, and with or without a limit),
    and says what it did.
    """
    cfg = load_node_config(conf_path)
    if _daemon_running(cfg):
        limits = _limits(cfg)
        if limits.pop(job_id, None) is None:
            raise CliError(f"job {job_id} has no limit")
        _save_limits(cfg, limits)
        click.echo(
            f"job {job_id}: limit removed; the running coda-node puts it back within "
            f"{cfg.node_interval_s:g}s"
        )
        return
    logging.basicConfig(level=logging.INFO, format="coda-node: %(message)s")
    _check_can_put_back(cfg, "release")
    try:
        limits = load_limits(cfg.node_state_dir)
    except StateError as exc:
        # The limit is not needed to put the job back, only to say it is gone.
        click.echo(f"coda-node: {exc}", err=True)
        limits = {}
    if limits.pop(job_id, None) is not None:
        _save_limits(cfg, limits)
        click.echo(f"job {job_id}: limit removed")
    result = _restore(cfg, frozenset({job_id})).get(job_id)
    # Nothing else puts the job back: say what this command did, and only that.
    if result is not None and result.gone:
        click.echo(f"job {job_id}: not running on this node; coda's groups of it removed")
    elif result is not None and result.applied:
        click.echo(f"job {job_id}: put back as Slurm set it ({'; '.join(result.applied)})")
    elif result is None or not result.failed:
        click.echo(f"job {job_id}: nothing of coda's on it to undo")
    if result is not None and result.failed:
        raise CliError(f"job {job_id} could not be put back", "; ".join(result.failed))


def _daemon_running(cfg: CodaConfig) -> bool:
    """Whether a coda-node daemon is ticking on this node: its view is fresh and says it
    runs, and its process is alive (a daemon killed a moment ago left a fresh view)."""
    doc = load_status(
        cfg.node_runtime_dir / VIEW_FILE,
        state_path=cfg.node_state_dir / STATE_FILE,
        interval_s=cfg.node_interval_s,
    )
    pid = doc["daemon"].get("pid")
    if doc["daemon"]["status"] != "running" or not isinstance(pid, int):
        return False
    from coda_node.daemon.recovery import pid_alive

    return pid_alive(pid)


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
@click.option(
    "--json", "as_json", is_flag=True, help="The same facts as JSON (docs/status.schema.json)."
)
@click.option(
    "--watch",
    "watch_s",
    type=FiniteFloatRange(min=0.1, max=WATCH_MAX_S),
    is_flag=False,
    flag_value=WATCH_DEFAULT_S,
    default=None,
    metavar="[SECONDS]",
    help=f"Refresh in place every SECONDS (default {WATCH_DEFAULT_S:g}); Ctrl-C ends.",
)
@click.option(
    "--color",
    "color_mode",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="auto: colour on a terminal unless NO_COLOR is set.",
)
@click.pass_context
def status(
    ctx: click.Context,
    conf_path: Path | None,
    as_json: bool,
    watch_s: float | None,
    color_mode: str,
) -> None:
    """Jobs, cores, GPUs, throttles, probes and recent decisions on this node.

    Reads the daemon's view file, NodeRuntimeDir/view.json (works as any user who can read
    it). Exit status 0 when the daemon is running, 1 when it is not (or its view is stale),
    2 on a usage error.
    """
    if as_json and watch_s is not None:
        raise click.UsageError("--json and --watch do not go together")
    cfg = load_node_config(conf_path)
    paths = _StatusPaths(cfg.node_runtime_dir / VIEW_FILE, cfg.node_state_dir / STATE_FILE)
    color = _use_color(color_mode)
    if watch_s is not None:
        _watch(paths, cfg.node_interval_s, watch_s, color)
        ctx.exit(0)
    doc = paths.load(cfg.node_interval_s)
    ok = doc["daemon"]["status"] == "running"
    if as_json:
        emit_json(doc)
    elif doc["daemon"]["status"] == "absent":
        for problem in doc["problems"]:
            click.echo(f"coda-node: {problem}", err=True)
    else:
        width = shutil.get_terminal_size(TERMINAL_FALLBACK).columns
        click.echo(render(doc, width=width, color=color), color=color)
    ctx.exit(0 if ok else 1)


WATCH_CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, erase the screen (ECMA-48 CUP and ED)."""
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def _use_color(mode: str) -> bool:
    """``auto``: only on a terminal, and not when NO_COLOR is set (https://no-color.org)."""
    if mode != "auto":
        return mode == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return sys.stdout.isatty()


@dataclass(frozen=True, slots=True)
class _StatusPaths:
    """Where ``coda-node status`` reads the daemon's view: its view file, else its state
    file (a daemon from before the view had its own file)."""

    view: Path
    state: Path

    def load(self, interval_s: float) -> dict[str, Any]:
        return load_status(self.view, state_path=self.state, interval_s=interval_s)


def _watch(paths: _StatusPaths, interval_s: float, every_s: float, color: bool) -> None:
    """Redraw in place on a terminal (frames separated by a blank line elsewhere) until
    Ctrl-C; the cursor is shown again whatever ends the loop."""
    tty = sys.stdout.isatty()
    first = True
    try:
        if tty:
            click.echo(HIDE_CURSOR, nl=False)
        while True:
            size = shutil.get_terminal_size(TERMINAL_FALLBACK)
            doc = paths.load(interval_s)
            title = f"every {every_s:g} s: coda-node status    {time.strftime('%H:%M:%S')}"
            body = render(doc, width=size.columns, color=color, max_events=5)
            if tty and doc["jobs"]:
                # One screen (title, blank line, body, the cursor's line): fewer job rows,
                # failed, throttled and probing ones first.
                over = len(body.splitlines()) + 3 - size.lines
                if over > 0:
                    rows = max(3, len(doc["jobs"]) - over - 1)
                    body = render(
                        doc, width=size.columns, color=color, max_job_rows=rows, max_events=5
                    )
            frame = title[: size.columns] + "\n\n" + body + "\n"
            if tty:
                click.echo(WATCH_CLEAR + frame, nl=False, color=color)
            else:
                click.echo(("" if first else "\n") + frame, nl=False, color=color)
            first = False
            sys.stdout.flush()
            time.sleep(every_s)
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            click.echo(SHOW_CURSOR, nl=False)
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    return run_cli(cli, "coda-node", argv)


if __name__ == "__main__":
    sys.exit(main())
