"""``coda-slurm reserve``: keep the spare CPU partitions' ``MaxCPUsPerNode`` at the cores
the GPU jobs do not need (:mod:`slurm_plugin.reserve.plan` decides,
:mod:`slurm_plugin.reserve.cluster` talks to Slurm)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import click

from coda_common.cli import CliError, conf_option, emit_json
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmjson import Runner, SlurmQueryError, make_runner
from slurm_plugin.reserve.cluster import (
    PartitionOutcome,
    ReserveSettings,
    ReserveStateError,
    format_outcome,
    reconcile,
    revert,
    run_loop,
)


def _load(conf_path: Path) -> CodaConfig:
    try:
        return load_config(conf_path)
    except ConfigError as exc:
        raise CliError(f"cannot load {conf_path}", exc.message) from exc


def _error(message: str) -> None:
    click.echo(f"coda-slurm: {message}", err=True)


def _install_signal_handlers(stop: threading.Event) -> None:
    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@click.command("reserve")
@conf_option()
@click.option("--once", is_flag=True, help="One pass, then exit (for cron).")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--revert",
    "do_revert",
    is_flag=True,
    help="Put back every MaxCPUsPerNode saved in ReserveStateFile, then exit.",
)
def reserve_cmd(
    conf_path: Path | None, once: bool, dry_run: bool, as_json: bool, do_revert: bool
) -> None:
    """Lend the spare cores of GPU nodes to CPU jobs: keep MaxCPUsPerNode of each
    ReservePartitions partition at what the running and expected GPU jobs leave free.

    Loops every ReserveIntervalS until SIGTERM/SIGINT; writes only when a value changes.
    """
    path = conf_path if conf_path is not None else default_conf_path()
    cfg = _load(path)
    env = dict(os.environ)
    if cfg.slurm_conf is not None and cfg.slurm_conf.exists():
        env["SLURM_CONF"] = str(cfg.slurm_conf)
    runner = make_runner(env)
    state_path = cfg.reserve_state_file

    if do_revert:
        _revert(runner, state_path, as_json)
        return
    if not cfg.reserve_partitions:
        raise CliError("reserve is off", f"ReservePartitions is empty in {path}")
    settings = ReserveSettings(
        partitions=cfg.reserve_partitions,
        min_cpus=cfg.reserve_min_cpus,
        cpus_per_gpu=cfg.reserve_cpus_per_gpu,
    )
    if once:
        _once(runner, settings, state_path, dry_run, as_json)
        return

    stop = threading.Event()
    _install_signal_handlers(stop)

    def emit(line: str, is_error: bool) -> None:
        if is_error:
            _error(line)
        elif not as_json:
            click.echo(line)

    def on_pass(outcomes: list[PartitionOutcome]) -> None:
        if as_json:
            emit_json_line([o.to_json() for o in outcomes], dry_run)

    if not as_json:
        click.echo(
            f"coda-slurm reserve: managing {', '.join(settings.partitions)} every "
            f"{cfg.reserve_interval_s:g} s" + (" (dry run)" if dry_run else "")
        )
    run_loop(
        runner,
        settings,
        state_path,
        cfg.reserve_interval_s,
        stop,
        emit,
        dry_run=dry_run,
        on_pass=on_pass,
    )


def emit_json_line(partitions: list[dict[str, object]], dry_run: bool) -> None:
    """The loop's --json: one compact line per pass that changed or noticed something."""
    click.echo(json.dumps({"dry_run": dry_run, "partitions": partitions}, sort_keys=True))


@contextlib.contextmanager
def _cli_errors() -> Iterator[None]:
    """Slurm or the state file failing, as one clear error line (exit 1)."""
    try:
        yield
    except SlurmQueryError as exc:
        raise CliError("cannot read Slurm", str(exc)) from exc
    except ReserveStateError as exc:
        raise CliError("cannot use the state file", str(exc)) from exc


def _once(
    runner: Runner, settings: ReserveSettings, state_path: Path, dry_run: bool, as_json: bool
) -> None:
    with _cli_errors():
        outcomes = reconcile(runner, settings, state_path, dry_run=dry_run)
    errors = [o for o in outcomes if o.error is not None]
    if as_json:
        emit_json(
            {
                "dry_run": dry_run,
                "ok": not errors,
                "partitions": [o.to_json() for o in outcomes],
            }
        )
    else:
        for outcome in outcomes:
            if outcome.error is None:
                click.echo(format_outcome(outcome, dry_run=dry_run))
    for outcome in errors:
        _error(format_outcome(outcome))
    if errors:
        raise click.exceptions.Exit(1)


def _revert(runner: Runner, state_path: Path, as_json: bool) -> None:
    with _cli_errors():
        outcomes = revert(runner, state_path)
    errors = [o for o in outcomes if o.error is not None]
    if as_json:
        emit_json({"ok": not errors, "reverted": [o.to_json() for o in outcomes]})
    elif not outcomes:
        click.echo(f"nothing to revert ({state_path} holds no saved value)")
    else:
        for o in outcomes:
            if o.error is None:
                same = " (already so)" if o.before == o.original else ""
                click.echo(f"{o.partition}: MaxCPUsPerNode {o.before} -> {o.original}{same}")
    for o in errors:
        _error(f"{o.partition}: {o.error}")
    if errors:
        raise click.exceptions.Exit(1)
