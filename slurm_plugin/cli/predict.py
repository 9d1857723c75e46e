"""``coda-slurm predict``: run the hook's decision offline on an sbatch command line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from coda_common.cli import CliError
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path, slurm_conf_for
from coda_common.signature import (
    DirectiveError,
    Directives,
    parse_coda_directives,
    workload_signature,
)
from coda_common.slurm.conffile import ConfigError
from coda_common.store.profiles import ProfileCache, StoreUnavailable
from coda_common.store.request import NO_VAL16
from slurm_plugin.cli.sbatchopts import SbatchOptionError, local_gres_separator, request_from_sbatch
from slurm_plugin.config.nodecap import NodeCap
from slurm_plugin.decision.decide import Decision, JobRequest, decide, parse_admin_record
from slurm_plugin.decision.tres import TresError, gpu_count


def _asks_for_gpus(req: JobRequest) -> bool:
    fields = (req.tres_per_node, req.tres_per_job, req.tres_per_task, req.tres_per_socket)
    try:
        return any(gpu_count(tres) for tres in fields)
    except TresError:
        return False


def predict_submission(
    argv: list[str], script_path: Path, *, conf_file: Path | None = None, uid: int | None = None
) -> dict[str, Any]:
    conf = conf_file or default_conf_path()
    try:
        cfg = load_config(conf)
    except (OSError, ConfigError) as exc:
        raise CliError(f"cannot load {conf}", str(exc)) from exc
    req = _request(argv, script_path, uid)
    notes: list[str] = []
    decision = _decide_here(req, cfg, conf, notes)
    return _report(req, cfg, decision, notes)


def _request(argv: list[str], script_path: Path, uid: int | None) -> JobRequest:
    """The job request sbatch would send for ``argv`` and the script at ``script_path``."""
    try:
        script = script_path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise CliError(f"cannot read {script_path}", exc.strerror or str(exc)) from exc
    try:
        req = request_from_sbatch(argv, script, uid=uid, sep=local_gres_separator())
    except SbatchOptionError as exc:
        raise CliError("bad sbatch options", str(exc)) from exc
    if req.job_name is None:
        # sbatch names a job after its script file when -J is not given.
        req = replace(req, job_name=script_path.name)
    return req


def _decide_here(req: JobRequest, cfg: CodaConfig, conf: Path, notes: list[str]) -> Decision:
    """The hook's decision for ``req`` with this machine's profile store and slurm.conf;
    what the hook would have logged about them goes to ``notes``."""

    def note(_level: str, msg: str) -> None:
        notes.append(msg)

    cache = ProfileCache(Path(cfg.profile_store), note)
    try:
        cache.refresh()
    except StoreUnavailable as exc:
        notes.append(f"profile store unavailable: {exc}")
    node_cap = NodeCap.from_slurm_conf(slurm_conf_for(conf, cfg.slurm_conf), note)
    # As the hook does: --prefer only ever names a feature some node has.
    features = frozenset(f for node in node_cap.nodes for f in node.features)
    return decide(
        req,
        cfg,
        cache.snapshot(),
        node_cap,
        node_features=features,
        node_share=node_cap.share,
        gres_units=node_cap.gres_units,
        gres_sep=local_gres_separator(),
        default_partition=node_cap.default_partition,
    )


def _report(
    req: JobRequest, cfg: CodaConfig, decision: Decision, notes: list[str]
) -> dict[str, Any]:
    """The JSON object ``predict`` prints: the request's fields before and after."""
    record = parse_admin_record(decision.admin_comment) if decision.admin_comment else {}
    try:
        directives = parse_coda_directives(req.comment)
    except DirectiveError:
        directives = Directives()
    signature = workload_signature(
        req.uid, req.job_name, req.script, directives, cfg.signature_ignore
    )
    return {
        "signature": record.get("sig", signature.key),
        "workload": signature.workload,
        "gpu_job": _asks_for_gpus(req),
        "action": decision.action,
        "src": record.get("src"),
        "cpus_per_tres_before": req.cpus_per_tres,
        "cpus_per_tres_after": decision.cpus_per_tres,
        "cpus_per_task_before": req.cpus_per_task if 0 < req.cpus_per_task < NO_VAL16 else None,
        "cpus_per_task_after": decision.cpus_per_task,
        "partition_before": req.partition,
        "partition_after": decision.partition,
        "tres_per_node_before": req.tres_per_node,
        "tres_per_node_after": decision.tres_per_node,
        "prefer_before": req.prefer,
        "prefer_after": decision.prefer,
        "reason": decision.reason,
        "user_msg": decision.user_msg,
        "admin_comment": decision.admin_comment,
        "notes": notes,
    }
