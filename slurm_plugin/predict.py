"""``coda-slurm predict``: run the hook's decision offline on an sbatch command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_plugin.cli_common import CliError
from slurm_plugin.conf import ConfigError, load_config
from slurm_plugin.nodecap import NodeCap
from slurm_plugin.paths import default_conf_path, slurm_conf_for
from slurm_plugin.policy import decide
from slurm_plugin.sbatchopts import SbatchOptionError, request_from_sbatch
from slurm_plugin.store import ProfileCache, StoreUnavailable
from slurm_plugin.tres import TresError, gpu_count


def predict_submission(
    argv: list[str], script_path: Path, *, conf_file: Path | None = None, uid: int | None = None
) -> dict[str, Any]:
    conf = conf_file or default_conf_path()
    try:
        cfg = load_config(conf)
    except FileNotFoundError as exc:
        raise CliError(f"cannot read {conf}", "no such file; pass --conf") from exc
    except (OSError, ConfigError) as exc:
        raise CliError(f"cannot load {conf}", str(exc)) from exc
    try:
        script = script_path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise CliError(f"cannot read {script_path}", exc.strerror or str(exc)) from exc
    try:
        req = request_from_sbatch(argv, script, uid=uid)
    except SbatchOptionError as exc:
        raise CliError("bad sbatch options", str(exc)) from exc
    if req.job_name is None:
        # sbatch names a job after its script file when -J is not given.
        from dataclasses import replace

        req = replace(req, job_name=script_path.name)
    notes: list[str] = []

    cache = ProfileCache(Path(cfg.profile_store), lambda level, msg: notes.append(msg))
    try:
        cache.refresh()
    except StoreUnavailable as exc:
        notes.append(f"profile store unavailable: {exc}")
    node_cap = NodeCap.from_slurm_conf(
        slurm_conf_for(conf, cfg.slurm_conf), lambda level, msg: notes.append(msg)
    )
    decision = decide(req, cfg, cache.snapshot(), node_cap)
    try:
        gpu_job = any(
            gpu_count(t)
            for t in (req.tres_per_node, req.tres_per_job, req.tres_per_task, req.tres_per_socket)
        )
    except TresError:
        gpu_job = False
    from slurm_plugin.policy import parse_admin_record

    record = parse_admin_record(decision.admin_comment) if decision.admin_comment else {}
    return {
        "signature": record.get("sig", "-"),
        "workload": req.job_name if not record else record.get("sig", "-").split(":")[-1],
        "gpu_job": gpu_job,
        "action": decision.action,
        "cpus_per_tres_before": req.cpus_per_tres,
        "cpus_per_tres_after": decision.cpus_per_tres,
        "clear_cpus_per_task": decision.clear_cpus_per_task,
        "reason": decision.reason,
        "user_msg": decision.user_msg,
        "admin_comment": decision.admin_comment,
        "notes": notes,
    }
