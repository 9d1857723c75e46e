"""``coda-slurm profiles collect``: merge the profiles node daemons dropped as munge
credentials into the profile store, and append the job summaries they dropped to the
summary store (:mod:`coda_common.publish.dropbox`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import click

from coda_common.cli import CliError, FiniteFloatRange, conf_option, emit_json
from coda_common.config.codaconf import load_config
from coda_common.config.paths import default_conf_path
from coda_common.config.values import MAX_INTERVAL_S
from coda_common.publish.dropbox import (
    Collector,
    CollectStats,
    HostFilter,
    node_addresses_from_slurm,
)
from coda_common.slurm.conffile import ConfigError
from coda_common.store.profiles import ProfileStore, StoreError
from coda_common.store.summaries import store_for


def _log(level: str, message: str) -> None:
    click.echo(f"coda-slurm: {'error: ' if level == 'error' else ''}{message}", err=True)


@click.command("collect")
@conf_option("ProfileDropDir, ProfileStore, MungeSocket, ProfileDropUids, ProfileDropHosts")
@click.option(
    "--watch",
    "interval_s",
    type=FiniteFloatRange(min=0.1, max=MAX_INTERVAL_S),
    default=None,
    metavar="SECONDS",
    help="Collect every SECONDS (at most a day) until SIGTERM/SIGINT (default: one pass, "
    "then exit).",
)
@click.option("--json", "as_json", is_flag=True, help="One pass: counts as JSON.")
def collect_cmd(conf_path: Path | None, interval_s: float | None, as_json: bool) -> None:
    """Merge the profiles node daemons dropped into ProfileDropDir (ProfilePublish=munge),
    and append the job summaries they dropped to JobSummaryDir.

    Each credential is decoded with unmunge and merged only when munge says root (or a uid
    of ProfileDropUids) made it on a node of this cluster; every file is removed once read,
    and every refusal is one line on stderr. Runs as root on the controller, which owns
    ProfileStore.
    """
    path = conf_path if conf_path is not None else default_conf_path()
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        raise CliError(f"cannot load {path}", exc.message) from exc
    env = dict(os.environ)
    if cfg.slurm_conf is not None and cfg.slurm_conf.exists():
        env["SLURM_CONF"] = str(cfg.slurm_conf)
    collector = Collector(
        cfg.profile_drop_dir,
        ProfileStore(cfg.profile_store),
        cfg.munge_socket,
        accept_uids=cfg.profile_drop_uids,
        hosts=HostFilter(cfg.profile_drop_hosts, lambda: node_addresses_from_slurm(env)),
        log=_log,
        summaries=store_for(cfg),
    )
    if interval_s is None:
        try:
            stats = collector.collect()
        except (StoreError, OSError) as exc:
            raise CliError(f"cannot collect from {cfg.profile_drop_dir}", str(exc)) from exc
        _report(stats, as_json)
        return
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    last_error: str | None = None
    while not stop.is_set():
        try:
            collector.collect()
            error = None
        except (StoreError, OSError) as exc:
            error = f"cannot collect from {cfg.profile_drop_dir} ({exc}); retrying"
        if error is not None and error != last_error:
            _log("error", error)
        last_error = error
        sys.stderr.flush()
        stop.wait(interval_s)


def _report(stats: CollectStats, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "accepted": stats.accepted,
                "refused": stats.refused,
                "samples": stats.samples,
                "summaries": stats.summaries,
                "left_alone": stats.left_alone,
            }
        )
        return
    click.echo(
        f"{stats.accepted} accepted ({stats.samples} samples merged, {stats.summaries} job "
        f"summaries appended), {stats.refused} refused, {stats.left_alone} left alone"
    )
