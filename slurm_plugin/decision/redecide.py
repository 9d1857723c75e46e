"""The cores of a pending job an update changed: which updates call for a new decision, and
that decision (pure).

coda sets a GPU job's ``--cpus-per-gpu`` at submission for the GPUs, tasks, nodes and
partition the job asked for then.  ``scontrol update`` can change those of a pending job
afterwards, and coda's value may then ask for more cores than any node has (16 per GPU on
a 32-core node, updated from 1 GPU to 4): the job would stay pending where it runs without
coda.  So an update that changes a pending job's shape has its cores decided again from the
job's record (:func:`redecide`), by the same :func:`~slurm_plugin.decision.decide.decide`
as a submission, with its caps and clamps.  The rules:

* only a value coda set with no CPU request of the user's (``was=`` empty, ``action=set``
  or ``default``) is decided again: a user's own value, or one coda only kept, advised or
  raised, stays as it is;
* an update that itself carries cores (``CpusPerTres``, ``CPUsPerTask``, ``NumCPUs``,
  ``MinCPUsNode``) wins: it is not decided again (:func:`update_triggers`), and a job whose
  ``cpus_per_tres`` is no longer the record's ``cpg=`` was changed by someone since: it is
  left alone;
* a job coda no longer manages after the update (a partition in ``ExcludePartitions``, no
  profile nor default, ``coda:off``) gets what Slurm gives without coda: its
  ``cpus_per_tres`` is cleared, and its record says ``action=skip``.

The hook side (:mod:`slurm_plugin.hook.modify`) notices such updates in ``job_modify``,
reads the job through libslurm once the update is done and writes what this module says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from coda_common.config.codaconf import CodaConfig
from coda_common.signature import Signature
from slurm_plugin.decision.decide import (
    ADMIN_PREFIX,
    NO_VAL,
    NO_VAL16,
    Decision,
    JobRequest,
    ProfileView,
    decide,
    gpu_shape,
    parse_admin_record,
)
from slurm_plugin.decision.tres import TresError, cpus_per_gpu

__all__ = [
    "NO_VAL",
    "REDECIDED_ACTIONS",
    "Kept",
    "PendingJob",
    "Redecision",
    "UpdateFields",
    "redecide",
    "update_job_id",
    "update_triggers",
]

REDECIDED_ACTIONS = frozenset({"set", "default"})
"""Record actions whose value is coda's alone (no user value): the only ones decided again."""

_CARRIED = ("prefer", "pcie")
"""Placement fields of the old record the new one keeps (the re-decision adds none)."""


@dataclass(frozen=True, slots=True)
class UpdateFields:
    """What one update message (job_modify's job_desc) carries; numbers as job_desc holds
    them (NO_VAL / NO_VAL16 when not in the update), strings None when not."""

    job_id_str: str | None
    job_id: int = NO_VAL
    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    num_tasks: int = NO_VAL
    min_nodes: int = NO_VAL
    ntasks_per_node: int = NO_VAL16
    partition: str | None = None
    cpus_per_tres: str | None = None
    cpus_per_task: int = NO_VAL16
    min_cpus: int = NO_VAL
    pn_min_cpus: int = NO_VAL16


def update_job_id(job_id_str: str | None, job_id: int) -> int | None:
    """The one job an update names, or None: ``scontrol update`` sends the id as text
    (``job_id_str``; a name is resolved to ids by scontrol first); an array task
    (``N_M``), a hetjob part (``N+K``) or anything but digits names none coda re-decides."""
    if job_id_str is not None:
        text = job_id_str.strip()
        if not text.isascii() or not text.isdigit() or len(text) > 10:
            return None
        value = int(text)
    else:
        value = job_id
    return value if 0 < value < NO_VAL else None


def update_triggers(update: UpdateFields) -> int | None:
    """The job id whose cores are to be decided again after ``update``, or None: the update
    names one job, changes its GPUs, tasks, nodes or partition, and carries no cores."""
    explicit_cores = (
        update.cpus_per_tres is not None
        or update.cpus_per_task != NO_VAL16
        or update.min_cpus != NO_VAL
        or update.pn_min_cpus != NO_VAL16
    )
    if explicit_cores:
        return None
    shape = (
        update.tres_per_node is not None
        or update.tres_per_job is not None
        or update.tres_per_task is not None
        or update.tres_per_socket is not None
        or update.num_tasks != NO_VAL
        or update.min_nodes != NO_VAL
        or update.ntasks_per_node != NO_VAL16
        or update.partition is not None
    )
    return update_job_id(update.job_id_str, update.job_id) if shape else None


@dataclass(frozen=True, slots=True)
class PendingJob:
    """The job as slurmctld holds it after the update (``slurm_load_job``)."""

    job_id: int
    uid: int
    pending: bool
    in_array: bool
    """An array job or task, or a hetjob part: not decided again."""
    name: str | None = None
    partition: str | None = None
    admin_comment: str | None = None
    comment: str | None = None
    cpus_per_tres: str | None = None
    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    num_nodes: int = NO_VAL
    num_tasks: int = NO_VAL
    ntasks_per_node: int = NO_VAL16
    cpus_per_task: int = NO_VAL16


@dataclass(frozen=True, slots=True)
class Kept:
    """The job's cores stay as they are, and why."""

    reason: str
    recorded: bool
    """Whether the job holds a coda record (the hook logs the others only at verbose)."""


@dataclass(frozen=True, slots=True)
class Redecision:
    """What to write into the job: ``cpus_per_tres`` ("" clears it) and the admin comment
    with the new record."""

    cpus_per_tres: str
    admin_comment: str
    min_cpus: int | None
    """The job's minimum CPU count when cleared cores take it back to the tasks' own
    (Slurm 23.11 and later keep the one coda's cores raised it to); None: left to Slurm."""
    record: str
    """The new record alone (for the journal)."""
    was_record: str
    """The record it replaces."""
    decision: Decision
    log_msg: str


def _signature(key: str, job_name: str | None) -> Signature:
    """The record's signature: ``workload:<uid>:<NAME>`` names its workload; a script or
    name key the job's name."""
    kind, _, rest = key.partition(":")
    if kind == "workload":
        return Signature(key, rest.partition(":")[2], "comment")
    return Signature(key, job_name or "(unnamed)", "script" if kind == "script" else "name")


def _record_span(admin_comment: str) -> tuple[int, int]:
    """Where the first record of ``admin_comment`` starts and ends."""
    start = admin_comment.find(ADMIN_PREFIX)
    end = start
    while end < len(admin_comment) and not admin_comment[end].isspace():
        end += 1
    return start, end


def _request(job: PendingJob) -> JobRequest:
    """The request :func:`decide` reads: the job's shape now, without the CPU values coda
    wrote (the record says the user asked for none)."""
    return JobRequest(
        uid=job.uid,
        job_name=job.name,
        partition=job.partition,
        tres_per_node=job.tres_per_node,
        tres_per_job=job.tres_per_job,
        tres_per_task=job.tres_per_task,
        tres_per_socket=job.tres_per_socket,
        min_nodes=job.num_nodes,
        num_tasks=job.num_tasks,
        ntasks_per_node=job.ntasks_per_node,
        comment=job.comment,
    )


def _unchanged_reason(job: PendingJob, record: dict[str, str], mode: str) -> str | None:
    """Why the job's cores stay as they are whatever its shape (None: decide again)."""
    if not job.pending:
        return "not pending"
    if job.in_array:
        return "part of a job array or hetjob"
    if mode != "enforce":
        return f"Mode={mode}"
    if record["was"] or record["action"] not in REDECIDED_ACTIONS:
        return f"the record says action={record['action']} was={record['was'] or '-'}"
    try:
        now = cpus_per_gpu(job.cpus_per_tres)
    except TresError as exc:
        return f"cpus_per_tres not understood ({exc})"
    if str(now or "") != record["cpg"]:
        return f"cpus_per_tres changed since coda set it ({job.cpus_per_tres or 'none'})"
    return None


def redecide(
    job: PendingJob,
    cfg: CodaConfig,
    profiles: Mapping[str, ProfileView],
    node_cap: Callable[[int], int | None],
    node_share: Callable[[int], int | None] | None = None,
    token: str = "",
) -> Redecision | Kept:
    """The cores of ``job`` for its shape now, or why they stay (rules in the module
    docstring).  ``token``: the new record's ``tok=`` (16 hex digits; "" for none)."""
    text = job.admin_comment or ""
    try:
        record = parse_admin_record(text)
    except ValueError as exc:
        return Kept(str(exc), recorded=False)
    why = _unchanged_reason(job, record, cfg.mode)
    if why is not None:
        return Kept(why, recorded=True)
    # Placement is the submission's: the re-decision sets cores only.
    plain = replace(cfg, pcie_spread_gres=None, prefer_gpu_types=())
    decision = decide(
        _request(job),
        plain,
        profiles,
        node_cap,
        node_share=node_share,
        signature=_signature(record["sig"], job.name),
    )
    base, cpus_per_tres = _written(job, record, decision)
    new = parse_admin_record(base)
    if all(new.get(k) == record.get(k) for k in ("cpg", "action", "gpn", "nodes")):
        return Kept(
            f"unchanged (cpg={record['cpg']} gpn={record['gpn']} nodes={record['nodes']})",
            recorded=True,
        )
    for key in _CARRIED:
        if key in record:
            base += f";{key}={record[key]}"
    new_record = base + (f";tok={token}" if token else "")
    start, end = _record_span(text)
    was_record = text[start:end]
    log_msg = (
        f"job {job.job_id} updated: cores decided again for gpn={new['gpn']} "
        f"nodes={new['nodes']}: cpg {record['cpg'] or '-'} -> {new['cpg'] or '-'} "
        f"action={new['action']} ({decision.reason})"
    )
    return Redecision(
        cpus_per_tres=cpus_per_tres,
        admin_comment=text[:start] + new_record + _note_after(text[end:], decision),
        min_cpus=None if cpus_per_tres else _tasks_cpus(job),
        record=new_record,
        was_record=was_record,
        decision=decision,
        log_msg=log_msg,
    )


def _written(job: PendingJob, record: dict[str, str], decision: Decision) -> tuple[str, str]:
    """``(record without token, cpus_per_tres)`` the job gets for ``decision``."""
    if decision.action in REDECIDED_ACTIONS and decision.cpus_per_tres and decision.admin_comment:
        return decision.admin_comment, decision.cpus_per_tres
    # Not managed now, or nothing to set: what Slurm gives without coda.
    shape = gpu_shape(_request(job))
    gpn, nodes = (record.get("gpn", ""), record.get("nodes", "")) if shape is None else shape
    base = f"{ADMIN_PREFIX}{record['sig']};cpg=;was=;action=skip;src=none;gpn={gpn};nodes={nodes}"
    return base, ""


def _tasks_cpus(job: PendingJob) -> int:
    """The CPUs the job's tasks ask without coda's cores: tasks (else nodes) times
    ``--cpus-per-task`` (else 1), as sbatch sends ``min_cpus``."""
    tasks = job.num_tasks if 0 < job.num_tasks < NO_VAL else max(job.num_nodes, 1)
    if not 0 < tasks < NO_VAL:
        tasks = 1
    per_task = job.cpus_per_task if 0 < job.cpus_per_task < NO_VAL16 else 1
    return min(tasks * per_task, NO_VAL - 1)


def _note_after(rest: str, decision: Decision) -> str:
    """What follows the record: the hook's line for the user (it starts ``coda``) is
    replaced by the new decision's; anything else (another plugin's text) stays."""
    if not rest.startswith(" coda"):
        return rest
    msg = decision.user_msg or f"coda: {decision.reason}; CPUs per GPU left to Slurm"
    return " " + msg.replace(ADMIN_PREFIX, "coda:sig:") + " (after an update of the job)"
