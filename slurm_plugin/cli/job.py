"""``coda-slurm job JOBID``: one job's report (what CODA decided, what the job asked, had and
used, and whether its GPUs waited on the CPU); see :mod:`slurm_plugin.cli.jobreport`."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import click

from coda_common.cli import CliError, conf_option, emit_json
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path, slurm_conf_for
from coda_common.slurm.conffile import ConfigError
from coda_common.store.summaries import store_for
from slurm_plugin.cli.jobreport import ReportError, fetch_report, render
from slurm_plugin.config.controllers import read_controllers


def _journal_paths(cfg: CodaConfig | None, conf_path: Path | None) -> list[Path]:
    """Every controller's DecisionJournal (one per SlurmctldHost where there are several)."""
    if cfg is None or cfg.decision_journal is None:
        return []
    path = conf_path or default_conf_path()
    controllers, _ = read_controllers(slurm_conf_for(path, cfg.slurm_conf))
    return list(controllers.files(cfg.decision_journal).values())


def _config(conf_path: Path | None) -> CodaConfig | None:
    """coda.conf, or None where there is none (a login node without coda)."""
    path = conf_path or default_conf_path()
    if not path.exists():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CliError(f"cannot load {path}", exc.message) from exc


def _node_status(cfg: CodaConfig | None) -> dict[str, Any] | None:
    """coda-node's status document of this node, or None where no daemon view is readable
    (a login node, a controller, a node without coda-node)."""
    from coda_node.enforce.state import STATE_FILE, VIEW_FILE
    from coda_node.status.document import load_status

    if cfg is None:
        return None
    view = cfg.node_runtime_dir / VIEW_FILE
    if not view.exists():
        return None
    doc = load_status(
        view, state_path=cfg.node_state_dir / STATE_FILE, interval_s=cfg.node_interval_s
    )
    if doc["daemon"]["status"] == "absent":
        return None
    doc.setdefault("node", {})
    if isinstance(doc["node"], dict):
        doc["node"].setdefault("name", cfg.node_name or socket.gethostname().split(".")[0])
    return doc


@click.command("job")
@conf_option("NodeRuntimeDir, NodeStateDir, JobSummaryDir, DecisionJournal")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("job_id", type=click.IntRange(min=1))
def job_cmd(conf_path: Path | None, as_json: bool, job_id: int) -> None:
    """What happened to one finished or running job: what CODA decided at submission
    (the admin comment's record, else coda-node's job summary's, else the decision
    journal's entry; the report names which), what the job asked, the cores it had and
    used (sacct), and whether its GPUs waited on the CPU: from coda-node's samples where
    this node runs it, from its job summaries once it has ended.

    Needs Slurm accounting (slurmdbd): sacct must list the job.
    """
    cfg = _config(conf_path)
    try:
        report = fetch_report(
            job_id,
            status=_node_status(cfg),
            env=os.environ,
            summary_store=store_for(cfg) if cfg is not None else None,
            journal_path=_journal_paths(cfg, conf_path),
        )
    except ReportError as exc:
        raise CliError(*exc.args) from exc
    if as_json:
        emit_json(report)
    else:
        click.echo(render(report))
