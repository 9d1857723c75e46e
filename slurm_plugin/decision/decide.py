"""The submit-time decision: which ``--cpus-per-gpu`` a job gets.  Pure and stdlib-only.

:func:`decide` takes the job's request fields, the configuration, the in-memory profiles and
a node-size cap, and returns a :class:`Decision` the job_submit hook applies verbatim.

Actions (:data:`ACTIONS`, a closed set)::

    set      no user value; cpus_per_tres set to the profile's prediction
    default  no user value, no confident profile; cpus_per_tres set to DefaultCpusPerGpu,
             or to a prior's value where one the job names gives more (``src=prior:NAME``,
             :mod:`slurm_plugin.decision.priors`)
    raise    UnprofiledUserValue=raise, no confident profile and the user's per-GPU value
             is below DefaultCpusPerGpu (or the prior's value): set to that
    keep     the user's --cpus-per-gpu / --cpus-per-task left as is (UserValue=keep, or
             UserValue=lower and the prediction is not lower, or no confident profile and
             no raise)
    lower    UserValue=lower and the prediction is below the user's per-GPU value: set
    replace  UserValue=replace: the prediction replaces the user's value

A user's value is rewritten in the form the user gave it.  ``--cpus-per-gpu`` becomes the new
CPUs per GPU (``cpus_per_tres``).  ``--cpus-per-task`` stays per task: the new CPUs on a node
(CPUs per GPU x GPUs per node) are divided over the job's tasks on a node, rounded up unless
that would ask more than the node cap allows (then down), and written as ``cpus_per_task``;
so every task keeps its share and ``SLURM_CPUS_PER_TASK`` says it.  ``raise`` never lowers
what a task asked, ``lower`` never raises it: a division that does not move the user's
``--cpus-per-task`` the intended way keeps it.
    advise   Mode=advise: one of set/default/raise/lower/replace was decided but nothing is
             written (the admin record's ``would=`` says which)
    skip     CODA leaves the job alone (CPU-only, Mode=off, partition filter, coda:off,
             malformed TRES, or no confident profile and no DefaultCpusPerGpu)
    reject   refuse the submission: a malformed ``coda:`` directive in --comment

Admin record (``Decision.admin_comment``): one token, its format in
:mod:`coda_common.slurm.adminrecord`; :func:`parse_admin_record` reads it back.  Jobs
CODA skips for good (CPU-only, Mode=off, partition filter, coda:off, malformed TRES,
reject) get no record; an unknown workload's skip does, so node daemons can profile it.
A CPU-only job routed by ``CpuJobPartitions`` gets no record either: its log line says
``part=<list>``, and ``scontrol show job`` shows the list.  With ``MemBwSpreadGres`` set,
CPU-only jobs do get one (``action=skip;src=none;gpn=0``), so that coda-node measures the
memory bandwidth of their workload.

Placement (:mod:`slurm_plugin.decision.placement`, each off until its coda.conf key is set; only
in Mode=enforce, for jobs CODA manages and that did not say ``coda:off``):

* ``PcieSpreadGres``: a PCIe-heavy multi-GPU job gets ``gres:<name>:1`` (``gres/<name>:1``
  where the job's request is spelled so) appended to its ``tres_per_node`` (unless it
  already asks for that GRES);
* ``PreferGpuTypes``: a GPU job that names no GPU type and set no ``--prefer`` gets
  ``--prefer=<feature>`` of the GPU type it gains most (or least) from;
* ``CpuJobPartitions``: a CPU-only job without ``--partition`` gets that list;
* ``MemBwSpreadGres``: a CPU-only job whose workload was measured memory-bound gets
  ``gres<sep><name>:<units>`` (:func:`~slurm_plugin.decision.placement.membw_units`) appended
  to its ``tres_per_node``, at most the smallest count any node of its partitions has, and
  only when every node of them has the GRES (Slurm refuses a GRES its partition lacks).

GPUs per node, from the first of these that asks for GPUs:

* ``tres_per_node`` (``--gpus-per-node``, ``--gres``): as is;
* ``tres_per_job`` (``--gpus``): divided by the node count (``min_nodes``; 1 when unset),
  rounded up;
* ``tres_per_task`` (``--gpus-per-task``): times tasks per node (``ntasks_per_node``, else
  ``num_tasks`` / nodes rounded up, else 1);
* ``tres_per_socket`` (``--gpus-per-socket``): the job is left unchanged.  Slurm gives
  that many GPUs on every socket the job's cores land on, so the count follows the cores
  (``--sockets-per-node`` is a minimum, not a limit) and a CPU request of coda's could
  itself add GPUs; Slurm 22.05 and 24.11 also count such GPUs differently for
  ``--cpus-per-gpu``.

The node count is ``min_nodes`` when set, else 1 (``max_nodes`` is not used).  A job with
several partitions (``-p a,b``) is managed only if every one of them is; a job without
``--partition`` counts as managed only when ``Partitions`` is empty (the caller may fill in
the default partition first).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from coda_common.config.codaconf import CodaConfig
from coda_common.signature import (
    DirectiveError,
    Directives,
    Signature,
    global_key,
    parse_coda_directives,
    quote_label,
    workload_signature,
)
from coda_common.slurm.adminrecord import ADMIN_PREFIX, parse_admin_record
from coda_common.store.request import (
    INFINITE,
    INFINITE16,
    NO_VAL,
    NO_VAL16,
    JobRequest,
    ProfileView,
)
from slurm_plugin.decision import placement, priors
from slurm_plugin.decision.tres import (
    TresError,
    cpus_per_gpu,
    gpu_count,
    gpu_types,
    gres_separator,
    parse_tres,
    set_gpu_count,
)

__all__ = [
    "ACTIONS",
    "INFINITE",
    "INFINITE16",
    "NO_VAL",
    "NO_VAL16",
    "Decision",
    "JobRequest",
    "ProfileView",
    "decide",
    "gpu_shape",
    "job_tasks_per_node",
    "parse_admin_record",
    "predict_cpus_per_gpu",
    "reads_usage",
    "same_decisions",
]

ACTIONS = frozenset(
    {"set", "default", "raise", "keep", "lower", "replace", "advise", "skip", "reject"}
)
"""Every value :attr:`Decision.action` can take (see the module docstring)."""

_WRITING = frozenset({"set", "default", "raise", "lower", "replace"})


@dataclass(frozen=True, slots=True)
class Decision:
    """What the hook does with a job (see the module docstring for the formats)."""

    action: str
    """One of :data:`ACTIONS`."""
    cpus_per_tres: str | None
    """New ``cpus_per_tres`` to write; None = leave the field alone."""
    cpus_per_task: int | None
    """New ``cpus_per_task`` (the user asked per task, see the module docstring; or sbatch
    sent ``-c`` as ``--cpus-per-gpu`` x ``--gpus-per-task`` and the CPUs per GPU change);
    None = leave the field alone.  Written with what sbatch derived from it (``min_cpus``,
    ``pn_min_cpus``, 23.11's ``cpu=N`` in ``tres_per_task``)."""
    user_msg: str | None
    """One line for sbatch's output, or None."""
    log_msg: str
    """One line for slurmctld's log."""
    admin_comment: str | None
    """The admin record, or None."""
    reason: str
    """Why, in a few words (also part of ``log_msg``)."""
    partition: str | None = None
    """New ``partition`` list (CPU-only job routed); None = leave the field alone."""
    tres_per_node: str | None = None
    """New ``tres_per_node`` (PCIe spread GRES added); None = leave the field alone."""
    prefer: str | None = None
    """New ``--prefer`` node feature; None = leave the field alone."""
    cpu_job: bool = False
    """A CPU-only job with an admin record (``MemBwSpreadGres``): not a GPU decision, so
    the hook neither counts nor journals it as one."""
    min_cpus_rescale: tuple[int, int] | None = None
    """``(user's CPUs per GPU, written CPUs per GPU)`` when a user's ``--cpus-per-gpu`` is
    rewritten: sbatch from 23.11 on sends ``min_cpus`` = that value x GPUs, which the hook
    scales to the new value (left alone, Slurm refuses a job lowered below it)."""


def predict_cpus_per_gpu(
    profile: ProfileView,
    gpus_per_node: int,
    nodes: int,
    multi_node_gpu_cap: int,
    multi_node_min_samples: int | None = None,
    multi_node_margin: float = 0.0,
) -> int:
    """The CODA model rule, before clamping.

    One node: the profile's ``cpus_per_gpu``.  Several nodes: the profile's
    ``multi_node_cpus_per_gpu`` when it has one (set by an admin or an import), else its
    measured multi-node figure when that holds at least ``multi_node_min_samples`` per-node
    figures (:func:`measured_multi_node_cpus_per_gpu`; None: never), else
    ``ceil(cpus_per_gpu * min(gpus_per_node, cap) / gpus_per_node)`` (multi-node demand per
    node is at most the demand of the same workload on one node with ``cap`` GPUs).
    """
    if nodes <= 1:
        return profile.cpus_per_gpu
    if profile.multi_node_cpus_per_gpu is not None:
        return profile.multi_node_cpus_per_gpu
    measured = measured_multi_node_cpus_per_gpu(profile, multi_node_min_samples, multi_node_margin)
    if measured is not None:
        return measured
    gpn = max(gpus_per_node, 1)
    return -(-(profile.cpus_per_gpu * min(gpn, multi_node_gpu_cap)) // gpn)


def measured_multi_node_cpus_per_gpu(
    profile: ProfileView, min_samples: int | None, margin: float
) -> int | None:
    """``ceil(figure * (1 + margin))`` (at least 1) of the profile's measured multi-node
    figure when it holds at least ``min_samples`` per-node figures, else None (also when
    ``min_samples`` is None).  Two attribute reads for a profile without one."""
    figure = profile.multi_node_measured_cores_per_gpu
    if figure is None or min_samples is None or profile.multi_node_runs < min_samples:
        return None
    # The epsilon keeps a figure that is whole after the margin (5 x 1.2) from rounding up.
    return max(math.ceil(figure * (1.0 + margin) - 1e-9), 1)


def _uses_measured(profile: ProfileView | None, nodes: int, cfg: CodaConfig) -> bool:
    """Whether a ``nodes``-node job's prediction from ``profile`` is its measured
    multi-node figure (:func:`predict_cpus_per_gpu`)."""
    return (
        nodes > 1
        and profile is not None
        and profile.multi_node_cpus_per_gpu is None
        and measured_multi_node_cpus_per_gpu(
            profile, cfg.multi_node_min_samples, cfg.multi_node_margin
        )
        is not None
    )


def _predict(profile: ProfileView, gpn: int, nodes: int, cfg: CodaConfig) -> int:
    """:func:`predict_cpus_per_gpu` with coda.conf's multi-node settings."""
    return predict_cpus_per_gpu(
        profile,
        gpn,
        nodes,
        cfg.multi_node_gpu_cap,
        cfg.multi_node_min_samples,
        cfg.multi_node_margin,
    )


def job_tasks_per_node(req: JobRequest, nodes: int) -> int:
    """Tasks per node as :func:`decide` assumes them: ``ntasks_per_node``, else ``num_tasks``
    / ``nodes`` rounded up, else 1."""
    if _set16(req.ntasks_per_node):
        return req.ntasks_per_node
    if _set32(req.num_tasks):
        return -(-req.num_tasks // max(nodes, 1))
    return 1


def _gpu_counts(req: JobRequest) -> tuple[int, int, int, int]:
    """The GPUs ``req`` asks per node, per job, per task and per socket (0 where it asks
    none there); raises TresError for a request that does not parse."""
    return (
        gpu_count(req.tres_per_node),
        gpu_count(req.tres_per_job),
        gpu_count(req.tres_per_task),
        gpu_count(req.tres_per_socket),
    )


def gpu_shape(req: JobRequest) -> tuple[int, int] | None:
    """``(GPUs per node, nodes)`` as :func:`decide` counts them, or None for a request
    that asks no GPU, asks per socket or does not parse."""
    try:
        gpus = _gpu_counts(req)
    except TresError:
        return None
    if not any(gpus) or gpus[3]:
        return None
    nodes = req.min_nodes if _set32(req.min_nodes) else 1
    return _gpus_per_node(req, gpus, nodes, job_tasks_per_node(req, nodes)), nodes


def _set16(value: int) -> bool:
    return 0 < value < NO_VAL16


def _set32(value: int) -> bool:
    return 0 < value < NO_VAL


def _job_label(req: JobRequest) -> str:
    return f"job {quote_label(req.job_name or '')} uid={req.uid}"


def _skip(req: JobRequest, reason: str, user_msg: str | None = None) -> Decision:
    return Decision(
        action="skip",
        cpus_per_tres=None,
        cpus_per_task=None,
        user_msg=user_msg,
        log_msg=f"coda: {_job_label(req)} action=skip: {reason}",
        admin_comment=None,
        reason=reason,
    )


def _partition_reason(partition: str | None, cfg: CodaConfig) -> str | None:
    """Why the job's partitions are not managed, or None when they are."""
    if not cfg.partitions and not cfg.exclude_partitions:
        return None
    parts = [p for p in partition.split(",") if p] if partition else []
    for part in parts:
        if part in cfg.exclude_partitions:
            return f"partition {quote_label(part)} is in ExcludePartitions"
    if cfg.partitions:
        if not parts:
            return "no --partition given and Partitions is set"
        for part in parts:
            if part not in cfg.partitions:
                return f"partition {quote_label(part)} is not in Partitions"
    return None


def _clamp(value: int, gpn: int, cfg: CodaConfig, cap: int | None) -> tuple[int, str]:
    """``value`` within MinCpusPerGpu..MaxCpusPerGpu and the node cap, and a note (or "")
    saying which bound applied.  The node cap wins over MinCpusPerGpu (a larger value
    could not run anywhere) but never goes below 1."""
    note = ""
    if value > cfg.max_cpus_per_gpu:
        value = cfg.max_cpus_per_gpu
        note = f", capped at MaxCpusPerGpu={value}"
    elif value < cfg.min_cpus_per_gpu:
        value = cfg.min_cpus_per_gpu
        note = f", raised to MinCpusPerGpu={value}"
    if cap is not None and value > cap:
        value = max(cap, 1)
        note = f", capped at {value}: no node gives a job of {gpn} GPU(s) more per GPU"
    return value, note


def reads_usage(cfg: CodaConfig) -> bool:
    """Whether :func:`decide` reads profiles' usage records under ``cfg``: the GPU ones for
    ``PcieSpreadGres`` and ``PreferGpuTypes`` (:func:`_placement`, and the GPU ranking over
    every profile), the CPU one for ``MemBwSpreadGres`` (:func:`_membw_request`)."""
    return (
        cfg.pcie_spread_gres is not None
        or bool(cfg.prefer_gpu_types)
        or cfg.mem_bw_spread_gres is not None
    )


def same_decisions(
    old: Mapping[str, ProfileView], new: Mapping[str, ProfileView], cfg: CodaConfig
) -> bool:
    """Whether :func:`decide` gives every request the same decision under profile snapshot
    ``new`` as under ``old``, with ``cfg`` and everything else the same.

    True when both hold the same signatures and each view differs at most in its usage
    records, while ``cfg`` has decide() read none (:func:`reads_usage`): decide() reads
    profiles only through lookups by signature, and every other field of a view takes part
    in the comparison.  coda-node rewrites a running job's usage record every
    ``NodeUsageFlushS`` and at its end; those writes then keep the hook's decision memo.
    """
    if reads_usage(cfg) or len(old) != len(new):
        return False
    for key, view in new.items():
        was = old.get(key)
        if was is view:
            continue
        if was is None or replace(was, usage=(), cpu_usage=None) != replace(
            view, usage=(), cpu_usage=None
        ):
            return False
    return True


def decide(
    req: JobRequest,
    cfg: CodaConfig,
    profiles: Mapping[str, ProfileView],
    node_cap: Callable[[int], int | None],
    *,
    node_features: Collection[str] | None = None,
    node_share: Callable[[int], int | None] | None = None,
    gres_units: Callable[[str, str | None], int | None] | None = None,
    gres_sep: str = ":",
    default_partition: str | None = None,
    signature: Signature | None = None,
) -> Decision:
    """The decision for one submitted job (rules in the module docstring).

    Never raises for bad job input: malformed TRES fails open (skip), a malformed
    ``coda:`` directive rejects the job (Mode=enforce) or is reported and ignored
    (Mode=advise).  ``node_cap(gpus_per_node)`` returns the most CPUs per GPU any node can
    give (None = unknown).  ``node_features``: the features nodes have (slurm.conf
    ``Feature=``); ``--prefer`` is only set to one of them, since Slurm refuses a job that
    prefers a feature no node has ("Invalid preferred feature specification").  None = do
    not check (tools and tests).  ``node_share(gpus_per_node)``: a GPU's even share of
    cores on the leanest node that can hold the job, for ``DefaultCpusPerGpu=share`` (None,
    or no callable: no default).  ``gres_units(gres, partitions)``: the most units of a
    count-only GRES the job may ask per node in those partitions (None: ask for none; no
    callable: never ask), for ``MemBwSpreadGres``; ``gres_sep``: how the running Slurm
    spells a GRES, for a CPU-only job whose request shows no spelling;
    ``default_partition``: slurm.conf's ``Default=YES`` partition, where a CPU-only job
    without ``--partition`` runs (for ``ExcludePartitions``).  ``signature``: the workload
    a GPU job is, when it is known already (the record of an updated pending job,
    :mod:`slurm_plugin.decision.redecide`); None: from the job's name, script and directives.
    """
    if cfg.mode == "off":
        return _skip(req, "Mode=off")
    admitted = _admit(req, cfg)
    if isinstance(admitted, _CpuOnly):
        return _cpu_job(req, cfg, profiles, gres_units, gres_sep, default_partition)
    if isinstance(admitted, Decision):
        return admitted
    return _gpu_job(req, cfg, profiles, node_cap, admitted, node_features, node_share, signature)


# -- the stages of decide() --------------------------------------------------------------------
# The per-job records of the stages (_Admitted, _Choice, _Job, _Placement) are not frozen,
# for the reason JobRequest is not.


def _gpu_job(
    req: JobRequest,
    cfg: CodaConfig,
    profiles: Mapping[str, ProfileView],
    node_cap: Callable[[int], int | None],
    admitted: _Admitted,
    node_features: Collection[str] | None,
    node_share: Callable[[int], int | None] | None,
    signature: Signature | None = None,
) -> Decision:
    """The decision for a GPU job CODA manages: its prediction, weighed against the user's
    own CPU request by the user-value rules."""
    nodes = req.min_nodes if _set32(req.min_nodes) else 1
    tasks_per_node = job_tasks_per_node(req, nodes)
    gpn = _gpus_per_node(req, admitted.gpus, nodes, tasks_per_node)
    user_cpg = admitted.user_cpg
    user_cpt = req.cpus_per_task if _set16(req.cpus_per_task) else None

    sig = signature or workload_signature(
        req.uid, req.job_name, req.script, admitted.directives, cfg.signature_ignore
    )
    profile, src, weak = _lookup(sig, profiles, cfg.min_confidence)
    if profile is None and nodes > 1:
        profile, src = _lookup_measured(sig, profiles, cfg, nodes, src)
    measured = nodes > 1 and _uses_measured(profile, nodes, cfg)  # no call for one node
    place = _placement(req, cfg, sig, profiles, gpn, node_features, admitted.sep)
    cap = node_cap(gpn)
    pred, src, note = _prediction(profile, src, gpn, nodes, cfg, cap, node_share)
    prior = None
    if profile is None and cfg.priors_from_names:
        prior = _prior(req, admitted.directives, profiles, cfg, gpn, nodes, cap, pred)
        if prior is not None:
            pred, src, note = prior.cpg, f"prior:{prior.name}", prior.note
    was, user_flag = _user_value(user_cpg, user_cpt)

    # A bound that changed the prediction is said in the log line too, not only to the user.
    bound_note = note.removeprefix(", ") if "capped" in note or "raised to" in note else ""
    job = _Job(
        req, cfg, sig, was, src, gpn, nodes, tasks_per_node, cap, place, admitted.sep, bound_note
    )
    if measured and profile is not None:
        job.mn_samples = profile.multi_node_runs
    choice = _Choice(
        profile=profile,
        pred=pred,
        unknown=weak or "no profile for this workload yet",
        label=quote_label(sig.workload),
        basis=(_basis(profile, src, nodes, cfg) if prior is None else prior.basis) + note,
        prior=prior,
    )
    if not user_flag:
        return _without_user_value(job, choice)
    if user_cpg is not None:
        return _with_user_value(job, choice, user_cpg, user_flag)
    return _with_task_value(job, choice, user_cpt or 1, user_flag)


@dataclass(slots=True)
class _Admitted:
    """What :func:`_admit` parsed of a GPU job CODA manages."""

    gpus: tuple[int, int, int, int]
    """GPUs asked per node, per job, per task and per socket (0 where not asked)."""
    sep: str
    """How the job's Slurm spells a GRES (:func:`~slurm_plugin.decision.tres.gres_separator`)."""
    user_cpg: int | None
    """The user's ``--cpus-per-gpu``, None when not given."""
    directives: Directives


@dataclass(frozen=True, slots=True)
class _CpuOnly:
    """A job that asks for no GPU (:func:`_cpu_job` decides it)."""


def _admit(req: JobRequest, cfg: CodaConfig) -> _Admitted | _CpuOnly | Decision:
    """The checks a job passes before CODA decides its CPUs: a GPU request that parses and
    asks for GPUs, CPU fields it understands, managed partitions, ``coda:`` directives that
    parse and do not say ``coda:off``.  The Decision (skip, reject) of the first check that
    fails; :class:`_CpuOnly` for a job that asks for no GPU."""
    try:
        gpus = _gpu_counts(req)
        sep = gres_separator(
            req.tres_per_node, req.tres_per_job, req.tres_per_task, req.tres_per_socket
        )
    except TresError as exc:
        return _skip(req, f"malformed GPU request, job left unchanged: {exc}")
    if not any(gpus):
        return _CpuOnly()
    if gpus[3]:
        return _skip(
            req,
            "GPUs asked per socket (--gpus-per-socket): Slurm decides their number with the "
            "sockets the job's cores land on, job left unchanged",
        )
    if not (_set16(req.cpus_per_task) or req.cpus_per_task == NO_VAL16):
        # 0 or INFINITE16: no --cpus-per-task sbatch sends; Slurm decides what it means.
        return _skip(req, f"cpus_per_task={req.cpus_per_task} not understood, job left unchanged")
    try:
        user_cpg = cpus_per_gpu(req.cpus_per_tres) or None
    except TresError as exc:
        return _skip(req, f"malformed cpus_per_tres, job left unchanged: {exc}")
    not_managed = _partition_reason(req.partition, cfg)
    if not_managed is not None:
        return _skip(req, not_managed)
    try:
        directives = parse_coda_directives(req.comment)
    except DirectiveError as exc:
        return _invalid_directive(req, cfg, exc)
    if directives.off:
        return _skip(
            req,
            "coda:off in --comment",
            "coda: off for this job (coda:off in --comment); CPUs per GPU left as submitted",
        )
    return _Admitted(gpus=gpus, sep=sep, user_cpg=user_cpg, directives=directives)


def _invalid_directive(req: JobRequest, cfg: CodaConfig, exc: DirectiveError) -> Decision:
    """A malformed ``coda:`` directive: reported and ignored in advise mode, else refused."""
    if cfg.mode == "advise":
        return _skip(
            req, f"invalid coda directive (advise mode): {exc}", f"{exc} (ignored for now)"
        )
    return Decision(
        action="reject",
        cpus_per_tres=None,
        cpus_per_task=None,
        user_msg=str(exc),
        log_msg=f"coda: {_job_label(req)} action=reject: {exc}",
        admin_comment=None,
        reason="invalid coda directive in --comment",
    )


def _gpus_per_node(
    req: JobRequest, gpus: tuple[int, int, int, int], nodes: int, tasks_per_node: int
) -> int:
    """GPUs per node from the first field that asks for GPUs (the module docstring)."""
    per_node, per_job, per_task, _per_socket = gpus  # per socket: left unchanged in _admit
    if per_node:
        return per_node
    if per_job:
        return -(-per_job // nodes)
    return per_task * tasks_per_node


def _prediction(
    profile: ProfileView | None,
    src: str,
    gpn: int,
    nodes: int,
    cfg: CodaConfig,
    cap: int | None,
    node_share: Callable[[int], int | None] | None,
) -> tuple[int | None, str, str]:
    """``(CPUs per GPU or None, src, note)``: the confident profile's prediction, else
    DefaultCpusPerGpu (``src`` becomes ``default``), clamped; the note says which bound or
    share applied ("" when none)."""
    if profile is not None:
        pred, note = _clamp(
            profile.cpus_per_gpu if nodes <= 1 else _predict(profile, gpn, nodes, cfg),
            gpn,
            cfg,
            cap,
        )
        return pred, src, note
    if cfg.default_cpus_per_gpu is None:
        return None, src, ""
    default = cfg.default_cpus_per_gpu
    note = ""
    if default == "share":
        default = node_share(gpn) if node_share is not None else None
        note = f", the node's share of {default} per GPU" if default is not None else ""
    if default is None:
        return None, src, note
    pred, clamped = _clamp(default, gpn, cfg, cap)
    return pred, "default", note + clamped


def _user_value(user_cpg: int | None, user_cpt: int | None) -> tuple[str, str]:
    """``(was, flag)``: the user's own CPU request as the admin record's ``was=`` and as
    the option the user gave (``("", "")`` when none)."""
    if user_cpg is not None:
        return f"cpg:{user_cpg}", f"--cpus-per-gpu={user_cpg}"
    if user_cpt is not None:
        return f"cpt:{user_cpt}", f"--cpus-per-task={user_cpt}"
    return "", ""


@dataclass(slots=True)
class _Choice:
    """What the user-value rules weigh: the prediction and how it is explained."""

    profile: ProfileView | None
    """The confident profile, None when there is none."""
    pred: int | None
    """CPUs per GPU CODA would write, None when it has no value."""
    unknown: str
    """Why there is no confident profile (for reasons)."""
    label: str
    """The workload's name, quoted for messages."""
    basis: str
    """Where the prediction comes from, for the user's line."""
    prior: _Prior | None = None
    """The prior from a name that raised the prediction, None when none did."""

    def rewrite_msg(self, verb: str, user_flag: str, written: str = "") -> str:
        """The user's line for a rewrite; ``written`` is the option as coda wrote it when it
        is not ``--cpus-per-gpu`` (a per-task request stays per task)."""
        what = written or f"--cpus-per-gpu={self.pred}"
        return f"coda: {what} for workload {self.label} ({verb} {user_flag}; {self.basis})"


def _without_user_value(job: _Job, c: _Choice) -> Decision:
    """No ``--cpus-per-gpu`` or ``--cpus-per-task``: set, default or skip."""
    if c.pred is None:
        return _finish(job, "skip", None, c.unknown, None)
    if c.profile is not None:
        action = "set"
        reason = "measured multi-node figure" if job.mn_samples else "confident profile"
    elif c.prior is not None:
        action, reason = "default", f"{c.unknown}; {c.prior.reason}"
    else:
        action, reason = "default", f"{c.unknown}; DefaultCpusPerGpu"
    msg = f"coda: --cpus-per-gpu={c.pred} for workload {c.label} ({c.basis})"
    return _finish(job, action, c.pred, reason, msg)


def _with_user_value(job: _Job, c: _Choice, user_cpg: int, user_flag: str) -> Decision:
    """The user gave ``--cpus-per-gpu``: raise, replace, lower or keep, by
    UnprofiledUserValue and UserValue."""
    cfg, pred = job.cfg, c.pred
    if (
        c.profile is None
        and pred is not None
        and cfg.unprofiled_user_value == "raise"
        and pred > user_cpg
    ):
        msg = c.rewrite_msg("raises", user_flag)
        return _finish(job, "raise", pred, f"{c.unknown}; {_raise_reason(c)}", msg)
    if c.profile is None or pred is None:
        msg = _prior_kept_msg(c, user_flag) if pred is not None and pred > user_cpg else None
        return _finish(job, "keep", pred, f"{c.unknown}; user value kept", msg)
    if cfg.user_value == "replace":
        msg = c.rewrite_msg("replaces", user_flag)
        return _finish(job, "replace", pred, "UserValue=replace", msg)
    if cfg.user_value == "lower":
        if pred < user_cpg:
            msg = c.rewrite_msg("lowers", user_flag)
            reason = "UserValue=lower, prediction below the user value"
            return _finish(job, "lower", pred, reason, msg)
        reason = "UserValue=lower, prediction not below the user value"
    else:
        reason = "UserValue=keep"
    msg = None
    if user_cpg != pred:
        msg = _kept_msg(c, user_flag)
    return _finish(job, "keep", pred, reason, msg)


def _with_task_value(job: _Job, c: _Choice, user_cpt: int, user_flag: str) -> Decision:
    """The user gave ``--cpus-per-task``: the same rules as :func:`_with_user_value`, with
    coda's CPUs on a node divided over the job's tasks (:func:`_task_share`) and compared
    with the user's value per task, so that ``raise`` never gives a task fewer CPUs than it
    asked and ``lower`` never more."""
    cfg, pred = job.cfg, c.pred
    share = None if pred is None else _task_share(job, pred)
    if c.profile is None:
        if share is not None and cfg.unprofiled_user_value == "raise" and share > user_cpt:
            msg = c.rewrite_msg("raises", user_flag, f"--cpus-per-task={share}")
            reason = f"{c.unknown}; {_raise_reason(c)}"
            return _finish(job, "raise", pred, reason, msg, share)
        msg = _prior_kept_msg(c, user_flag) if share is not None and share > user_cpt else None
        return _finish(job, "keep", pred, f"{c.unknown}; user value kept", msg)
    if pred is None or share is None:
        return _finish(job, "keep", pred, f"{c.unknown}; user value kept", None)
    if cfg.user_value == "replace":
        msg = c.rewrite_msg("replaces", user_flag, f"--cpus-per-task={share}")
        return _finish(job, "replace", pred, "UserValue=replace", msg, share)
    if cfg.user_value == "lower":
        if share < user_cpt:
            msg = c.rewrite_msg("lowers", user_flag, f"--cpus-per-task={share}")
            reason = "UserValue=lower, prediction below the user value"
            return _finish(job, "lower", pred, reason, msg, share)
        reason = "UserValue=lower, prediction not below the user value"
    else:
        reason = "UserValue=keep"
    msg = None if share == user_cpt else _kept_msg(c, user_flag)
    return _finish(job, "keep", pred, reason, msg)


def _raise_reason(c: _Choice) -> str:
    reason = "UnprofiledUserValue=raise"
    return reason if c.prior is None else f"{reason}; {c.prior.reason}"


def _prior_kept_msg(c: _Choice, user_flag: str) -> str | None:
    """The user's line for a kept value below what a prior names, else None: without a
    profile coda keeps what the user asked (UnprofiledUserValue=keep), but says what
    workloads of that name need."""
    if c.prior is None:
        return None
    return (
        f"coda: kept your {user_flag}; {c.prior.label} suggests --cpus-per-gpu={c.pred} ({c.basis})"
    )


def _kept_msg(c: _Choice, user_flag: str) -> str:
    return (
        f"coda: kept your {user_flag}; the profile of workload {c.label} suggests "
        f"--cpus-per-gpu={c.pred} ({c.basis})"
    )


def _task_share(job: _Job, pred: int) -> int:
    """``pred`` CPUs per GPU as CPUs per task: the node's ``pred x GPUs`` over its tasks,
    rounded up, or down when rounding up would ask more than the node cap gives (the
    most any node gives a job of this many GPUs); at least 1, at most what ``cpus_per_task``
    holds."""
    tasks = max(job.tasks_per_node, 1)
    total = pred * job.gpn
    share = -(-total // tasks)
    if job.cap is not None and share * tasks > job.cap * job.gpn:
        share = job.cap * job.gpn // tasks
    return min(max(share, 1), NO_VAL16 - 1)


def _lookup(
    sig: Signature, profiles: Mapping[str, ProfileView], min_confidence: float
) -> tuple[ProfileView | None, str, str]:
    """``(confident profile or None, src, why-not)``: the user's key first, then the
    global key; a low-confidence user profile does not hide a confident global one."""
    weak = ""
    profile = profiles.get(sig.key)
    if profile is not None:
        if profile.confidence >= min_confidence:
            return profile, "profile", ""
        weak = f"profile confidence {profile.confidence:.2f} < MinConfidence {min_confidence:g}"
    gkey = global_key(sig)
    if gkey is not None:
        shared = profiles.get(gkey)
        if shared is not None:
            if shared.confidence >= min_confidence:
                return shared, "global", ""
            weak = weak or (
                f"shared profile confidence {shared.confidence:.2f} "
                f"< MinConfidence {min_confidence:g}"
            )
    return None, "none", weak


@dataclass(slots=True)
class _Prior:
    """The prior from a name that sets a job's prediction (:func:`_prior`)."""

    name: str
    """The global profile's NAME (``src=prior:NAME``)."""
    cpg: int
    """Its CPUs per GPU for this job, clamped (above what the job had without it)."""
    note: str
    """The bound that applied, as :func:`_clamp`'s note ("" when none)."""
    basis: str
    """Where the value comes from, for the user's line."""
    label: str
    """The workload the job's text names, for the user's line."""
    reason: str
    """The reason's part that names the prior."""


def _prior(
    req: JobRequest,
    directives: Directives,
    profiles: Mapping[str, ProfileView],
    cfg: CodaConfig,
    gpn: int,
    nodes: int,
    cap: int | None,
    without: int | None,
) -> _Prior | None:
    """The prior the job's text names (:mod:`slurm_plugin.decision.priors`) that gives it
    more CPUs per GPU than ``without`` (what it gets without one), or None.  Of several
    named, the one giving the most wins (ties: the longer name, then the first in order)."""
    names, views = priors.named(
        profiles, cfg.prior_aliases, req.job_name, req.script, directives.workload
    )
    if not names:
        return None
    best: tuple[int, int, str] | None = None
    best_note = ""
    for name in names:
        view = views[name]
        value, note = _clamp(_predict(view, gpn, nodes, cfg), gpn, cfg, cap)
        rank = (value, len(name), name)
        if best is None or (rank[0], rank[1]) > (best[0], best[1]):
            best, best_note = rank, note
    if best is None or (without is not None and best[0] <= without):
        return None
    value, _, name = best
    view = views[name]
    label = quote_label(name)
    without_text = "" if without is None else f"; {without} without it"
    basis = (
        f"prior: the job names {label}, a shared profile of {view.cpus_per_gpu} per GPU, "
        f"confidence {view.confidence:.2f}{without_text}"
    )
    return _Prior(name, value, best_note, basis, label, f"prior {label} named by the job")


def _lookup_measured(
    sig: Signature, profiles: Mapping[str, ProfileView], cfg: CodaConfig, nodes: int, src: str
) -> tuple[ProfileView | None, str]:
    """``(profile, src)`` for a multi-node job without a confident profile: the user's (then
    the shared) profile when its measured multi-node figure holds ``MultiNodeMinSamples``
    figures, whatever its single-node confidence; else ``(None, src)``."""
    for key, kind in ((sig.key, "profile"), (global_key(sig), "global")):
        view = profiles.get(key) if key is not None else None
        if view is not None and _uses_measured(view, nodes, cfg):
            return view, kind
    return None, src


def _basis(profile: ProfileView | None, src: str, nodes: int, cfg: CodaConfig) -> str:
    if profile is None:
        return "site default, no confident profile yet"
    kind = "profile" if src == "profile" else "shared profile"
    text = f"{kind}, {profile.n_samples} samples, confidence {profile.confidence:.2f}"
    if nodes <= 1:
        return text
    if _uses_measured(profile, nodes, cfg):
        runs = profile.multi_node_runs
        return f"{text}, {nodes} nodes, measured on {runs} nodes of multi-node runs"
    return f"{text}, {nodes} nodes"


@dataclass(slots=True)
class _Job:
    """What :func:`decide` knows of a job that has a signature, for :func:`_finish`."""

    req: JobRequest
    cfg: CodaConfig
    sig: Signature
    was: str
    src: str
    gpn: int
    nodes: int
    tasks_per_node: int
    cap: int | None
    """The node cap for ``gpn`` GPUs (most CPUs per GPU any node gives); None = unknown."""
    place: _Placement | None
    sep: str
    """How the job's Slurm spells a GRES (:func:`~slurm_plugin.decision.tres.gres_separator`)."""
    bound_note: str
    """The bound that cut the prediction, for the log line; "" when none did."""
    mn_samples: int = 0
    """The per-node figures of the measured multi-node figure the prediction is; 0 when
    it is not one (the admin record's ``mn=``)."""


def _finish(
    job: _Job,
    action: str,
    pred: int | None,
    reason: str,
    user_msg: str | None,
    task_share: int | None = None,
) -> Decision:
    """Build the Decision of a job that has a signature (and hence an admin record).
    ``task_share``: the user asked per task, and a writing action writes this
    ``--cpus-per-task`` instead of ``--cpus-per-gpu``."""
    cfg, place = job.cfg, job.place
    cpg = "" if pred is None else str(pred)
    would = ""
    new_tres: str | None = None
    new_cpt: int | None = None
    rescale: tuple[int, int] | None = None
    if action in _WRITING:
        if cfg.mode == "advise":
            would = f";would={action}"
            action = "advise"
            if user_msg is not None:
                user_msg = f"coda: would set {user_msg[6:]}; advise mode, job unchanged"
        elif task_share is not None:
            new_cpt = task_share
        else:
            new_tres, new_cpt, rescale = _rewritten_cpus_per_gpu(job.req, pred, job.sep)
    admin, log = _records(job, action, cpg, would, reason, task_share)
    if place is not None and place.user_msg:
        user_msg = f"{user_msg}; {place.user_msg[6:]}" if user_msg else place.user_msg
    return Decision(
        action=action,
        cpus_per_tres=new_tres,
        cpus_per_task=new_cpt,
        user_msg=user_msg,
        log_msg=log,
        admin_comment=admin,
        reason=reason,
        tres_per_node=None if place is None else place.tres_per_node,
        prefer=None if place is None else place.prefer,
        min_cpus_rescale=rescale,
    )


def _rewritten_cpus_per_gpu(
    req: JobRequest, pred: int | None, sep: str
) -> tuple[str, int | None, tuple[int, int] | None]:
    """``(cpus_per_tres, cpus_per_task, min_cpus_rescale)`` of a job whose CPUs per GPU
    are written as ``pred``: ``cpus_per_task`` None to leave it alone, the rescale None
    when there is no user value to scale from."""
    new_cpt: int | None = None
    rescale: tuple[int, int] | None = None
    # pred is set for every writing action; set_gpu_count cannot fail on a string
    # cpus_per_gpu() already parsed.
    new_tres = set_gpu_count(req.cpus_per_tres, pred or 1, sep)
    # cpus_per_gpu() already parsed this string in decide(): it cannot fail here.
    user_cpg = cpus_per_gpu(req.cpus_per_tres)
    per_task_gpus = gpu_count(req.tres_per_task)
    if user_cpg and _set16(req.cpus_per_task) and per_task_gpus:
        # With --gpus-per-task, sbatch also sends -c as --cpus-per-gpu x GPUs per
        # task, and Slurm refuses a job where the two differ: -c follows (and with
        # it min_cpus, by the same factor).
        new_cpt = min(pred * per_task_gpus, NO_VAL16 - 1) if pred else None
    elif user_cpg and pred and user_cpg != pred:
        rescale = (user_cpg, pred)
    return new_tres, new_cpt, rescale


def _records(
    job: _Job, action: str, cpg: str, would: str, reason: str, task_share: int | None
) -> tuple[str, str]:
    """``(admin record, log line)`` of a job that has a signature; ``would`` is the
    admin record's ``;would=<action>`` in advise mode, else ""."""
    req, sig, place = job.req, job.sig, job.place
    was, src, gpn, nodes, bound_note = job.was, job.src, job.gpn, job.nodes, job.bound_note
    admin = (
        f"{ADMIN_PREFIX}{sig.key};cpg={cpg};was={was};action={action};src={src}{would}"
        f";gpn={gpn};nodes={nodes}"
    )
    if job.mn_samples:
        admin += f";mn={job.mn_samples}"
    cpt_log = ""
    if task_share is not None:
        admin += f";cpt={task_share}"
        cpt_log = f" cpt={task_share}"
    place_log = ""
    if place is not None:
        admin += place.admin
        place_log = place.log
    log = (
        f"coda: {_job_label(req)} sig={sig.key} action={action}{would.replace(';', ' ')} "
        f"cpg={cpg or '-'}{cpt_log} was={was or '-'} src={src} gpn={gpn} nodes={nodes}"
        f"{f' mn={job.mn_samples}' if job.mn_samples else ''}{place_log}: "
        f"{reason}{'; ' + bound_note if bound_note else ''}"
    )
    return admin, log


# -- placement ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Placement:
    """The placement changes of one GPU job, and how the records show them."""

    tres_per_node: str | None
    prefer: str | None
    admin: str
    """``;pcie=1;prefer=<feature>`` for the admin record ("" when nothing)."""
    log: str
    """`` pcie=1 prefer=<feature>`` for the log line (advise mode: ``would-pcie=1``)."""
    user_msg: str | None
    """``coda: ...`` line for sbatch's output, or None."""


def _usage_view(sig: Signature, profiles: Mapping[str, ProfileView]) -> ProfileView | None:
    """The profile whose usage records describe this job: the user's own, else the shared
    one.  Confidence is not required: it grades the CPU fit, not these measurements."""
    own = profiles.get(sig.key)
    if own is not None and own.usage:
        return own
    gkey = global_key(sig)
    shared = profiles.get(gkey) if gkey is not None else None
    if shared is not None and shared.usage:
        return shared
    return None


def _placement(
    req: JobRequest,
    cfg: CodaConfig,
    sig: Signature,
    profiles: Mapping[str, ProfileView],
    gpn: int,
    node_features: Collection[str] | None,
    sep: str,
) -> _Placement | None:
    """PCIe spread and GPU-type preference for a managed GPU job; None when neither applies.

    Reads only the usage records of the job's own profile (:func:`_usage_view`); the GPU
    ranking is computed once per profile snapshot (:func:`placement.ranking_for`).
    """
    if cfg.pcie_spread_gres is None and not cfg.prefer_gpu_types:
        return None  # both off (the default): no lookup at all
    view = _usage_view(sig, profiles)
    if view is None:
        return None
    new_tres: str | None = None
    notes: list[str] = []
    tokens: list[str] = []
    item = _pcie_item(req, cfg, view, gpn, sep)
    if item is not None:
        new_tres = f"{req.tres_per_node},{item}" if req.tres_per_node else item
        tokens.append("pcie=1")
        notes.append(f"{item} per node (PCIe-heavy workload: one per PCIe domain)")
    feature, why, missing = _preferred_feature(req, cfg, view, profiles, node_features)
    if feature is not None:
        tokens.append(f"prefer={feature}")
        notes.append(f"--prefer={feature} (the workload {why})")
    if not tokens:
        if not missing:
            return None
        return _Placement(tres_per_node=None, prefer=None, admin="", log=missing, user_msg=None)
    if cfg.mode == "advise":
        return _Placement(
            tres_per_node=None,
            prefer=None,
            admin="",
            log="".join(f" would-{t}" for t in tokens) + missing,
            user_msg=None,
        )
    return _Placement(
        tres_per_node=new_tres,
        prefer=feature,
        admin="".join(f";{t}" for t in tokens),
        log="".join(f" {t}" for t in tokens) + missing,
        user_msg="coda: " + "; ".join(notes),
    )


def _pcie_item(
    req: JobRequest, cfg: CodaConfig, view: ProfileView, gpn: int, sep: str
) -> str | None:
    """The ``PcieSpreadGres`` item a PCIe-heavy job gets per node, None when it gets none."""
    gres = cfg.pcie_spread_gres
    heavy = gres is not None and placement.is_pcie_heavy(
        view.usage, gpn, threshold_bytes_per_s=cfg.pcie_heavy_bytes_per_s
    )
    # parse_tres cannot fail here: decide() already parsed tres_per_node.  A job that asked
    # for the GRES itself keeps its request.
    if heavy and not any(item.name == gres for item in parse_tres(req.tres_per_node)):
        return f"gres{sep}{gres}:1"
    return None


def _preferred_feature(
    req: JobRequest,
    cfg: CodaConfig,
    view: ProfileView,
    profiles: Mapping[str, ProfileView],
    node_features: Collection[str] | None,
) -> tuple[str | None, str, str]:
    """``(feature, why, missing)``: the ``--prefer`` feature of the GPU type the workload
    gains most (or least) from and why, or None; ``missing`` is the log's
    `` no-feature=<feature>`` when no node has the feature ("" otherwise)."""
    if cfg.prefer_gpu_types and not req.prefer and not _names_gpu_type(req):
        choice = placement.prefer_gpu_type(
            view, placement.ranking_for(profiles), cfg.prefer_gpu_types
        )
        if choice is not None:
            gpu_type, why = choice
            wanted = dict(cfg.prefer_gpu_features).get(gpu_type, gpu_type)
            if node_features is None or wanted in node_features:
                return wanted, why, ""
            return None, "", f" no-feature={wanted}"  # a PreferGpuFeatures mistake: say so
    return None, "", ""


def _names_gpu_type(req: JobRequest) -> bool:
    """Whether the job asked for a GPU type (``--gres=gpu:a100:1``, ``--gpus=v100:2`` ...)."""
    return any(
        gpu_types(tres)
        for tres in (req.tres_per_node, req.tres_per_job, req.tres_per_task, req.tres_per_socket)
    )


def _cpu_job(
    req: JobRequest,
    cfg: CodaConfig,
    profiles: Mapping[str, ProfileView],
    gres_units: Callable[[str, str | None], int | None] | None,
    gres_sep: str,
    default_partition: str | None = None,
) -> Decision:
    """A CPU-only job: its route (``CpuJobPartitions``) and, with ``MemBwSpreadGres``, an
    admin record (so coda-node measures its memory bandwidth) and its share of the
    memory-bandwidth GRES once measured.

    ``coda:off`` opts out of both.  A malformed directive is not refused on a CPU job (there
    is no GPU decision it could mean); the job then passes as without these options.  A
    partition in ``ExcludePartitions`` is left alone; ``Partitions`` (the GPU partitions
    CODA manages) does not apply to CPU jobs.
    """
    try:
        directives: Directives | None = parse_coda_directives(req.comment)
    except DirectiveError:
        directives = None
    if directives is None or directives.off:
        return _skip(req, "no GPUs requested")
    route = placement.route_cpu_job(req.partition, cfg.cpu_job_partitions)
    advise = cfg.mode == "advise"
    gres = cfg.mem_bw_spread_gres
    parts = route or req.partition
    runs_in = parts or default_partition or ""
    excluded = any(p in cfg.exclude_partitions for p in runs_in.split(",") if p)
    if gres is None or excluded:
        if route is None:
            return _skip(req, "no GPUs requested")
        if advise:
            return _skip(req, f"no GPUs requested; would route to partitions {route} (advise mode)")
        return _routed(req, route)
    return _membw_cpu_job(req, cfg, profiles, gres_units, gres_sep, directives, route, gres)


def _membw_cpu_job(
    req: JobRequest,
    cfg: CodaConfig,
    profiles: Mapping[str, ProfileView],
    gres_units: Callable[[str, str | None], int | None] | None,
    gres_sep: str,
    directives: Directives,
    route: str | None,
    gres: str,
) -> Decision:
    """A CPU-only job under ``MemBwSpreadGres`` in a partition CODA does not exclude: its
    admin record, its route (``route``: the CpuJobPartitions list it is offered, or None)
    and its share of the memory-bandwidth GRES ``gres`` once measured."""
    advise = cfg.mode == "advise"
    parts = route or req.partition
    sig = workload_signature(req.uid, req.job_name, req.script, directives, cfg.signature_ignore)
    nodes = req.min_nodes if _set32(req.min_nodes) else 1
    cpus = (req.cpus_per_task if _set16(req.cpus_per_task) else 1) * job_tasks_per_node(req, nodes)
    units, why = _membw_request(req, cfg, sig, profiles, cpus, gres_units, gres, parts)
    new_tres: str | None = None
    tokens = ""
    msgs: list[str] = []
    if units:
        item = f"gres{gres_sep}{gres}:{units}"
        tokens = f";{'would-' if advise else ''}membw={units}"
        if not advise:
            new_tres = f"{req.tres_per_node},{item}" if req.tres_per_node else item
            msgs.append(f"{item} per node ({why})")
    if route is not None and not advise:
        msgs.insert(
            0,
            f"CPU-only job offered partitions {route} (it starts in whichever can run "
            "it first; coda:off in --comment opts out)",
        )
    admin = f"{ADMIN_PREFIX}{sig.key};cpg=;was=;action=skip;src=none;gpn=0;nodes={nodes}{tokens}"
    part_log = "" if route is None else f" {'would-' if advise else ''}part={route}"
    reason = f"CPU-only job; {why}"
    return Decision(
        action="skip",
        cpus_per_tres=None,
        cpus_per_task=None,
        user_msg="coda: " + "; ".join(msgs) if msgs else None,
        log_msg=f"coda: {_job_label(req)} sig={sig.key} action=skip{part_log}"
        f"{tokens.replace(';', ' ')}: {reason}",
        admin_comment=admin,
        reason=reason,
        partition=None if advise else route,
        tres_per_node=new_tres,
        cpu_job=True,
    )


def _membw_request(
    req: JobRequest,
    cfg: CodaConfig,
    sig: Signature,
    profiles: Mapping[str, ProfileView],
    cpus: int,
    gres_units: Callable[[str, str | None], int | None] | None,
    gres: str,
    partitions: str | None,
) -> tuple[int, str]:
    """``(units of the memory-bandwidth GRES per node, why)`` for a CPU-only job; 0 units
    when it asks for none."""
    view = profiles.get(sig.key)
    record = view.cpu_usage if view is not None else None
    gkey = global_key(sig)
    if record is None and gkey is not None:
        shared = profiles.get(gkey)
        record = shared.cpu_usage if shared is not None else None
    if record is None:
        return 0, "memory bandwidth not measured yet"
    bw = record.mem_bw_bytes_per_s_per_cpu
    measured = f"{bw / 1e9:.1f} GB/s per CPU over {record.ticks} ticks"
    if bw < cfg.mem_bw_heavy_bytes_per_s_per_cpu:
        return 0, f"not memory-bound ({measured})"
    try:
        tres = parse_tres(req.tres_per_node)
    except TresError:
        return 0, "tres_per_node not understood"
    if any(item.name == gres for item in tres):
        return 0, f"asked for {gres} itself"
    cap = gres_units(gres, partitions) if gres_units is not None else None
    if cap is None:
        where = f"partitions {partitions}" if partitions else "the default partition"
        return 0, f"memory-bound ({measured}) but not every node of {where} has {gres}"
    units = placement.membw_units(
        bw,
        cpus,
        heavy_bytes_per_s_per_core=cfg.mem_bw_heavy_bytes_per_s_per_cpu,
        unit_bytes_per_s=cfg.mem_bw_unit_bytes_per_s,
        node_units=cap,
    )
    return units, f"memory-bound: {measured}, {cpus} CPUs per node"


def _routed(req: JobRequest, route: str) -> Decision:
    """A CPU-only job without ``--partition``, CpuJobPartitions set: offer it the list."""
    reason = "CPU-only job without --partition, routed by CpuJobPartitions"
    return Decision(
        action="skip",
        cpus_per_tres=None,
        cpus_per_task=None,
        user_msg=f"coda: CPU-only job offered partitions {route} (it starts in whichever "
        "can run it first; coda:off in --comment opts out)",
        log_msg=f"coda: {_job_label(req)} action=skip part={route}: {reason}",
        admin_comment=None,
        reason=reason,
        partition=route,
    )
