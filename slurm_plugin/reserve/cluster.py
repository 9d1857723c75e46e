"""``coda-slurm reserve`` against Slurm: read nodes, jobs and partitions, set
``MaxCPUsPerNode`` of the spare partitions, remember and restore what the admin had.

Reads (one RPC each per pass, whatever the cluster's size):

- ``scontrol -d -o show node``: ``CPUTot``, ``State``, ``Gres`` and ``GresUsed`` (GPUs
  allocated; ``AllocTRES`` lists ``gres/gpu`` only when ``AccountingStorageTRES`` names it,
  ``GresUsed`` always does), and from Slurm 24.05 on ``RestrictedCoresPerGPU=N(cores)``:
  N cores per GPU no CPU-only job can use, and which cores they are (``node_info.c``);
- ``squeue --json --all``: each running job's allocation (``job_resources``, and
  ``gres_detail`` per node): the CPUs a job holds on every node where it holds a GPU (a
  multi-node GPU job counts on each of its nodes); each pending job's ``cpus_per_tres``
  (``gres:gpu:N``, what ``--cpus-per-gpu`` and the submit hook set). JSON, not ``scontrol
  -o`` text: a job's name and comment are the user's, and ``Nodes=gpu01 CPU_IDs=0-63
  GRES=gpu:8`` in them must not count as an allocation;
- ``scontrol -o show partition``: each partition's nodes, ``MaxCPUsPerNode`` and
  ``JobDefaults=DefCpuPerGPU=N``.

Writes ``scontrol update PartitionName=P MaxCPUsPerNode=N`` (slurmctld applies it at once;
scontrol(1) "PARTITIONS - SPECIFICATIONS FOR UPDATE COMMAND") only when the value differs
from what Slurm reports, so an admin's or a crashed loop's value is reconciled on the next
pass. Before the first write to a partition its original value is saved in the state file
(:class:`ReserveState`), so ``--revert`` restores exactly what the admin had, UNLIMITED
included, whenever the loop died.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coda_common.slurm.hostlist import expand_hostlist
from coda_common.slurm.ranges import parse_ranges
from coda_common.slurm.slurmconf import gres_gpus
from coda_common.slurm.slurmjson import (
    ACTIVE_STATES,
    Runner,
    SlurmQueryError,
    allocated_nodes,
    gpus_on_node,
    job_states,
    job_text,
    query_active_jobs,
)
from slurm_plugin.reserve.plan import NodeLoad, ReservePlan, plan_partition
from slurm_plugin.slurm.scontrol import scontrol_records

__all__ = [
    "STATE_FORMAT",
    "STATE_FORMAT_VERSION",
    "ClusterView",
    "ConditionLog",
    "PartitionInfo",
    "PartitionOutcome",
    "ReserveSettings",
    "ReserveState",
    "ReserveStateError",
    "RevertOutcome",
    "default_cpus_per_gpu",
    "format_outcome",
    "node_is_up",
    "parse_jobs",
    "parse_nodes",
    "parse_partitions",
    "read_cluster",
    "reconcile",
    "revert",
    "run_loop",
]

STATE_FORMAT = "coda-reserve-state"
STATE_FORMAT_VERSION = 1
MAX_STATE_BYTES = 8 << 20
"""Largest state file read (one entry per partition: a few KiB in practice)."""
FALLBACK_CPUS_PER_GPU = 4.0
"""Cores per idle GPU when neither ReserveCpusPerGpu nor any DefCpuPerGPU says."""

# Node state words of `scontrol show node` (slurm/src/common/slurm_protocol_defs.c,
# node_state_string) under which a node runs no new GPU job: its cores are not measured.
_NOT_UP = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "NOT_RESPONDING",
        "FUTURE",
        "UNKNOWN",
        "NO_RESPOND",
        "INVAL",
    }
)
_CPUS_PER_GPU = re.compile(r"gres[:/]gpu(?::[^:,]+)?:(\d+)")
_DEF_CPU_PER_GPU = re.compile(r"DefCpuPerGPU=(\d+)", re.IGNORECASE)
_MAX_CPUS_VALUE = re.compile(r"UNLIMITED|[0-9]+")
_RESTRICTED = re.compile(r"([0-9]+)(?:\((.*)\))?")
"""``RestrictedCoresPerGPU=2(0-1,8-9)``: cores per GPU, then the node's restricted cores
(core index = socket x cores per socket + core); ``(null)`` before the node registers."""


class ReserveStateError(RuntimeError):
    """The state file cannot be read or written; says which file and what to do."""


# ------------------------------------------------------------------------- reading Slurm


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    max_cpus_per_node: str
    """As Slurm prints it: ``UNLIMITED`` or a number."""
    def_cpu_per_gpu: int | None


@dataclass(frozen=True, slots=True)
class _NodeRecord:
    name: str
    cpus: int
    gpus: int
    gpus_used: int | None
    """From ``GresUsed``; None when scontrol did not print it."""
    up: bool
    threads_per_core: int = 1
    """CPUs Slurm counts per allocated core: ThreadsPerCore, or 1 when the node has no more
    CPUs than cores (``node_conf.c``: ``tpc``)."""
    cores_per_socket: int = 0
    restricted_cores_per_gpu: int = 0
    """``RestrictedCoresPerGPU`` (0: not set, or a Slurm without it)."""
    restricted_cores: frozenset[int] | None = None
    """The restricted cores (socket x cores per socket + core); None when not known."""


@dataclass(frozen=True, slots=True)
class PendingGpuJob:
    job_id: int
    partitions: tuple[str, ...]
    cpus_per_gpu: float


@dataclass(frozen=True, slots=True)
class JobUsage:
    """What the jobs hold and ask for."""

    gpu_job_cpus: Mapping[str, int]
    """Node -> cores held there by jobs that hold GPUs there."""
    gpu_job_gpus: Mapping[str, int]
    """Node -> GPUs held there (used when a node record lacks ``GresUsed``)."""
    pending: tuple[PendingGpuJob, ...]
    gpu_job_restricted_cpus: Mapping[str, int] = field(default_factory=dict)
    """Node -> of ``gpu_job_cpus``, those on the node's restricted cores."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    nodes: Mapping[str, NodeLoad]
    partitions: Mapping[str, PartitionInfo]
    pending: tuple[PendingGpuJob, ...]


def node_is_up(state: str) -> bool:
    """``IDLE``, ``MIXED``, ``ALLOCATED`` (``+PLANNED``, ``+COMPLETING``...) are up;
    ``DOWN``, ``*+DRAIN``, ``FAIL``, ``NOT_RESPONDING`` (also the ``*`` suffix) are not."""
    if not state or state.endswith("*"):
        return False
    return not any(word in _NOT_UP for word in state.upper().split("+"))


def _int_field(rec: Mapping[str, str], key: str, what: str) -> int:
    value = rec.get(key, "")
    if not value.isdigit():
        raise SlurmQueryError(f"{what}: no {key} in scontrol's output (got {value!r})")
    return int(value)


def _gpus(text: str, what: str) -> int:
    if not text or text in ("(null)", "N/A"):
        return 0
    try:
        return gres_gpus(text)
    except ValueError as exc:
        raise SlurmQueryError(f"{what}: {exc}") from None


def _restricted_cores(text: str, what: str) -> tuple[int, frozenset[int] | None]:
    """``RestrictedCoresPerGPU=2(0-1,8-9)`` -> ``(2, {0, 1, 8, 9})``; ``(0, None)`` when
    the node has none."""
    if not text:
        return 0, None
    m = _RESTRICTED.fullmatch(text)
    if m is None:
        raise SlurmQueryError(f"{what}: bad RestrictedCoresPerGPU {text!r}")
    listed = m.group(2)
    if listed is None or listed in ("", "(null)"):
        return int(m.group(1)), None
    try:
        return int(m.group(1)), parse_ranges(listed, "RestrictedCoresPerGPU core list")
    except ValueError as exc:
        raise SlurmQueryError(f"{what}: {exc}") from None


def parse_nodes(text: str) -> dict[str, _NodeRecord]:
    """``scontrol -d -o show node`` -> node name -> record."""
    out: dict[str, _NodeRecord] = {}
    for rec in scontrol_records(text, "NodeName"):
        name = rec["NodeName"]
        what = f"node {name}"
        used = rec.get("GresUsed")
        cpus = _int_field(rec, "CPUTot", what)
        threads = _int_field(rec, "ThreadsPerCore", what) if "ThreadsPerCore" in rec else 1
        cores_per_socket = _int_field(rec, "CoresPerSocket", what) if "CoresPerSocket" in rec else 0
        sockets = _int_field(rec, "Sockets", what) if "Sockets" in rec else 0
        if cores_per_socket and sockets and sockets * cores_per_socket >= cpus:
            threads = 1  # Slurm schedules this node by core: one CPU per core
        per_gpu, restricted = _restricted_cores(rec.get("RestrictedCoresPerGPU", ""), what)
        out[name] = _NodeRecord(
            name=name,
            cpus=cpus,
            gpus=_gpus(rec.get("Gres", ""), what),
            gpus_used=None if used is None else _gpus(used, what),
            up=node_is_up(rec.get("State", "")),
            threads_per_core=threads,
            cores_per_socket=cores_per_socket,
            restricted_cores_per_gpu=per_gpu,
            restricted_cores=restricted if cores_per_socket else None,
        )
    return out


def parse_partitions(text: str) -> dict[str, PartitionInfo]:
    """``scontrol -o show partition`` -> partition name -> info."""
    out: dict[str, PartitionInfo] = {}
    for rec in scontrol_records(text, "PartitionName"):
        name = rec["PartitionName"]
        nodes_expr = rec.get("Nodes", "")
        try:
            nodes = () if nodes_expr in ("", "(null)") else tuple(expand_hostlist(nodes_expr))
        except ValueError as exc:
            raise SlurmQueryError(f"partition {name}: {exc}") from None
        defaults = _DEF_CPU_PER_GPU.search(rec.get("JobDefaults", ""))
        out[name] = PartitionInfo(
            name=name,
            nodes=nodes,
            max_cpus_per_node=rec.get("MaxCPUsPerNode", "UNLIMITED"),
            def_cpu_per_gpu=int(defaults.group(1)) if defaults else None,
        )
    return out


def parse_jobs(
    records: Sequence[Mapping[str, Any]],
    threads_per_core: Mapping[str, int],
    restricted_cores: Mapping[str, tuple[int, frozenset[int]]] | None = None,
) -> JobUsage:
    """``squeue --json`` job records -> CPUs and GPUs GPU jobs hold per node, and the
    cores per GPU pending GPU jobs ask for. ``threads_per_core``: node -> its threads per
    core (Slurm allocates cores; a core counts as that many CPUs, as ``CPU_IDs`` does).
    ``restricted_cores``: node -> (cores per socket, its ``RestrictedCoresPerGPU`` cores),
    to count the CPUs GPU jobs hold on them."""
    cpus: dict[str, int] = {}
    gpus: dict[str, int] = {}
    restricted_cpus: dict[str, int] = {}
    restricted = restricted_cores or {}
    pending: list[PendingGpuJob] = []
    for rec in records:
        job_id = rec.get("job_id")
        what = f"job {job_id}"
        try:
            states = job_states(rec)
            state = states[0] if states else ""
            if state == "PENDING":
                m = _CPUS_PER_GPU.search(job_text(rec, "cpus_per_tres"))
                if m is not None and isinstance(job_id, int):
                    parts = tuple(p for p in job_text(rec, "partition").split(",") if p)
                    pending.append(PendingGpuJob(job_id, parts, float(m.group(1))))
                continue
            if state not in ACTIVE_STATES:
                continue
            for name, (position, cores) in allocated_nodes(rec).items():
                held_gpus = gpus_on_node(rec, position)
                if held_gpus <= 0:
                    continue  # a CPU job, or a node of the job where it has no GPU
                tpc = threads_per_core.get(name, 1)
                cpus[name] = cpus.get(name, 0) + len(cores) * tpc
                gpus[name] = gpus.get(name, 0) + held_gpus
                if name in restricted:
                    cps, kept = restricted[name]
                    on_kept = sum(1 for sock, core in cores if sock * cps + core in kept)
                    restricted_cpus[name] = restricted_cpus.get(name, 0) + on_kept * tpc
        except SlurmQueryError as exc:
            raise SlurmQueryError(f"{what}: {exc}") from None
    return JobUsage(cpus, gpus, tuple(pending), restricted_cpus)


def read_cluster(runner: Runner) -> ClusterView:
    """Ask slurmctld (three RPCs) for what :func:`reconcile` needs; SlurmQueryError."""
    records = parse_nodes(runner(["scontrol", "-d", "-o", "show", "node"]))
    jobs = parse_jobs(
        query_active_jobs(runner),
        {n: r.threads_per_core for n, r in records.items()},
        {
            n: (r.cores_per_socket, r.restricted_cores)
            for n, r in records.items()
            if r.restricted_cores is not None
        },
    )
    partitions = parse_partitions(runner(["scontrol", "-o", "show", "partition"]))
    nodes = {
        name: NodeLoad(
            name=name,
            cpus=r.cpus,
            gpus=r.gpus,
            gpus_alloc=r.gpus_used if r.gpus_used is not None else jobs.gpu_job_gpus.get(name, 0),
            cpus_alloc_gpu_jobs=jobs.gpu_job_cpus.get(name, 0),
            up=r.up,
            restricted_cpus_per_gpu=r.restricted_cores_per_gpu * r.threads_per_core,
            # Which cores are restricted is unknown until the node registers: then none
            # of the held ones is counted as restricted (fewer cores lent, never more).
            restricted_cpus_held=jobs.gpu_job_restricted_cpus.get(name, 0),
        )
        for name, r in records.items()
    }
    return ClusterView(nodes, partitions, jobs.pending)


# ------------------------------------------------------------------------------ planning


@dataclass(frozen=True, slots=True)
class ReserveSettings:
    """The coda.conf keys of ``coda-slurm reserve``."""

    partitions: tuple[str, ...]
    min_cpus: int = 1
    cpus_per_gpu: float | None = None
    """ReserveCpusPerGpu; None = DefCpuPerGPU of the GPU partitions, else 4."""


def _gpu_partitions(view: ClusterView, spare: PartitionInfo, spares: Sequence[str]) -> set[str]:
    """Partitions, other than the spare ones, that share a node with ``spare``."""
    nodes = set(spare.nodes)
    return {
        p.name
        for p in view.partitions.values()
        if p.name not in spares and p.name != spare.name and nodes.intersection(p.nodes)
    }


def default_cpus_per_gpu(
    view: ClusterView, spare: PartitionInfo, settings: ReserveSettings
) -> float:
    """ReserveCpusPerGpu, else the largest DefCpuPerGPU of the partitions over the same
    nodes (the largest: a GPU job there may get that many cores without asking), else 4."""
    if settings.cpus_per_gpu is not None:
        return settings.cpus_per_gpu
    defaults = [
        view.partitions[p].def_cpu_per_gpu
        for p in _gpu_partitions(view, spare, settings.partitions)
        if view.partitions[p].def_cpu_per_gpu
    ]
    return float(max(defaults)) if defaults else FALLBACK_CPUS_PER_GPU


def plan_for(view: ClusterView, spare: PartitionInfo, settings: ReserveSettings) -> ReservePlan:
    """The plan for ``spare``: its nodes (gone from Slurm = down), and the pending GPU jobs
    that may start on them (submitted to a partition sharing a node with it)."""
    nodes = [view.nodes.get(name) or NodeLoad(name, 0, 0, 0, 0, up=False) for name in spare.nodes]
    relevant = _gpu_partitions(view, spare, ()) | {spare.name}
    pending = [j.cpus_per_gpu for j in view.pending if relevant.intersection(j.partitions)]
    return plan_partition(
        spare.name,
        nodes,
        pending,
        default_cpus_per_gpu=default_cpus_per_gpu(view, spare, settings),
        min_cpus=settings.min_cpus,
    )


# ---------------------------------------------------------------------------- state file


@dataclass(slots=True)
class ReserveState:
    """The original ``MaxCPUsPerNode`` of every partition this tool has changed.

    A small JSON file, written atomically (temporary file, fsync, rename) *before* the
    first ``scontrol update`` of a partition; an entry leaves only when ``--revert`` has
    put the value back."""

    path: Path
    originals: dict[str, str] = field(default_factory=dict)
    saved_unix_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ReserveState:
        try:
            with path.open("rb") as f:
                data = f.read(MAX_STATE_BYTES + 1)
            if len(data) > MAX_STATE_BYTES:
                raise ReserveStateError(
                    f"the state file {path} is larger than {MAX_STATE_BYTES >> 20} MiB, which "
                    "coda-slurm reserve never writes; point ReserveStateFile elsewhere"
                )
            doc = json.loads(data)
        except FileNotFoundError:
            return cls(path)
        except OSError as exc:
            raise ReserveStateError(
                f"cannot read the state file {path} ({exc.strerror or exc})"
            ) from None
        except (ValueError, RecursionError) as exc:
            problem = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise ReserveStateError(
                f"the state file {path} is not JSON ({problem}); it holds the MaxCPUsPerNode "
                "values to restore: fix it by hand, or move it away once every spare "
                "partition has its original value"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ReserveStateError(
                f'{path} is not a coda-slurm reserve state file (no "format": '
                f'"{STATE_FORMAT}"); point ReserveStateFile elsewhere'
            )
        version = doc.get("format_version")
        if version != STATE_FORMAT_VERSION:
            newer = isinstance(version, int) and version > STATE_FORMAT_VERSION
            what = (
                "written by a newer coda-slurm: upgrade this one, or revert with the newer one"
                if newer
                else "unknown version: restore the partitions' MaxCPUsPerNode by hand"
            )
            raise ReserveStateError(f"{path}: format_version {version!r} ({what})")
        state = cls(path)
        partitions = doc.get("partitions")
        if not isinstance(partitions, dict):
            raise ReserveStateError(f'{path}: no "partitions" object')
        for name, entry in partitions.items():
            original = entry.get("original") if isinstance(entry, dict) else None
            if not isinstance(original, str) or _MAX_CPUS_VALUE.fullmatch(original) is None:
                raise ReserveStateError(
                    f"{path}: partition {name}: original {original!r} is not UNLIMITED or a number"
                )
            state.originals[name] = original
            saved = entry.get("saved_unix_s")
            state.saved_unix_s[name] = float(saved) if isinstance(saved, int | float) else 0.0
        return state

    def save(self) -> None:
        """Write the file atomically; remove it when nothing is left to restore."""
        if not self.originals:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ReserveStateError(
                    f"cannot remove the state file {self.path} ({exc.strerror or exc})"
                ) from None
            return
        doc = {
            "format": STATE_FORMAT,
            "format_version": STATE_FORMAT_VERSION,
            "partitions": {
                name: {"original": value, "saved_unix_s": self.saved_unix_s.get(name, 0.0)}
                for name, value in sorted(self.originals.items())
            },
        }
        data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".reserve-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise ReserveStateError(
                f"cannot write the state file {self.path} ({exc.strerror or exc})"
            ) from None

    def remember(self, partition: str, original: str, now_unix_s: float) -> bool:
        """Record ``original`` unless the partition already has an entry (the first value
        seen is the admin's; later ones are ours). True when the file must be written."""
        if partition in self.originals:
            return False
        self.originals[partition] = original
        self.saved_unix_s[partition] = now_unix_s
        return True


# ------------------------------------------------------------------------ one pass


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """What one pass did to one spare partition."""

    partition: str
    before: str | None
    """``MaxCPUsPerNode`` as Slurm had it (None: partition not found)."""
    after: str | None
    """As Slurm has it now (in a dry run: as it would be)."""
    changed: bool
    """An ``scontrol update`` was made (or, in a dry run, would be)."""
    plan: ReservePlan | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "partition": self.partition,
            "before": self.before,
            "after": self.after,
            "changed": self.changed,
            "planned": None if plan is None else plan.max_cpus_per_node,
            "cpus_per_gpu": None if plan is None else plan.cpus_per_gpu,
            "per_node": []
            if plan is None
            else [{"node": n, "reserved_cpus": c} for n, c in plan.per_node],
            "reason": None if plan is None else plan.reason,
            "error": self.error,
        }


def _permission_hint(message: str) -> str:
    # slurmctld refuses UPDATE_PARTITION from anyone but root and SlurmUser; 22.05 answers
    # "Invalid user id" (and logs "Security violation"), others "Access/permission denied".
    if re.search(r"denied|user id", message, re.IGNORECASE):
        return "; run coda-slurm reserve as root or SlurmUser"
    return ""


def _update(runner: Runner, partition: str, value: str) -> None:
    runner(["scontrol", "update", f"PartitionName={partition}", f"MaxCPUsPerNode={value}"])


def reconcile(
    runner: Runner,
    settings: ReserveSettings,
    state_path: Path,
    *,
    dry_run: bool = False,
    now_unix_s: Callable[[], float] = time.time,
) -> list[PartitionOutcome]:
    """One pass over ``settings.partitions``: read Slurm, plan, save originals, update.

    A partition that is missing or whose update fails gets an outcome with ``error``; the
    others are still handled. Raises SlurmQueryError when Slurm cannot be read at all and
    ReserveStateError when the state file is unusable (no partition is touched then:
    without it --revert could not restore them)."""
    state = ReserveState.load(state_path)
    view = read_cluster(runner)
    outcomes: list[PartitionOutcome] = []
    for name in settings.partitions:
        info = view.partitions.get(name)
        if info is None:
            known = ", ".join(sorted(view.partitions)) or "none"
            outcomes.append(
                PartitionOutcome(
                    name,
                    None,
                    None,
                    False,
                    None,
                    f"partition {name} not found in Slurm (renamed or removed? partitions: "
                    f"{known}); fix ReservePartitions",
                )
            )
            continue
        outcomes.append(
            _reconcile_partition(runner, view, name, info, settings, state, dry_run, now_unix_s)
        )
    return outcomes


def _reconcile_partition(
    runner: Runner,
    view: ClusterView,
    name: str,
    info: PartitionInfo,
    settings: ReserveSettings,
    state: ReserveState,
    dry_run: bool,
    now_unix_s: Callable[[], float],
) -> PartitionOutcome:
    """Plan partition ``name`` and, unless ``dry_run``, set its MaxCPUsPerNode (its
    original saved in ``state`` first)."""
    plan = plan_for(view, info, settings)
    before = info.max_cpus_per_node
    if plan.max_cpus_per_node is None or str(plan.max_cpus_per_node) == before:
        return PartitionOutcome(name, before, before, False, plan)
    target = str(plan.max_cpus_per_node)
    if dry_run:
        return PartitionOutcome(name, before, target, True, plan)
    # The original goes to disk before Slurm changes: a kill between the two leaves a
    # state file whose value is still the current one, which --revert rewrites harmlessly.
    if state.remember(name, before, now_unix_s()):
        state.save()
    try:
        _update(runner, name, target)
    except SlurmQueryError as exc:
        return PartitionOutcome(
            name,
            before,
            before,
            False,
            plan,
            f"cannot set MaxCPUsPerNode={target} on partition {name}: {exc}"
            + _permission_hint(str(exc)),
        )
    return PartitionOutcome(name, before, target, True, plan)


@dataclass(frozen=True, slots=True)
class RevertOutcome:
    partition: str
    before: str | None
    after: str | None
    original: str
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "before": self.before,
            "after": self.after,
            "original": self.original,
            "error": self.error,
        }


def revert(runner: Runner, state_path: Path) -> list[RevertOutcome]:
    """Put back every saved original ``MaxCPUsPerNode``; an entry leaves the state file only
    once Slurm has its value again (a partition gone from Slurm keeps its entry, with an
    error). Stop the loop first: it would change the value again on its next pass."""
    state = ReserveState.load(state_path)
    if not state.originals:
        return []
    partitions = parse_partitions(runner(["scontrol", "-o", "show", "partition"]))
    outcomes: list[RevertOutcome] = []
    for name, original in sorted(state.originals.items()):
        info = partitions.get(name)
        if info is None:
            outcomes.append(
                RevertOutcome(
                    name,
                    None,
                    None,
                    original,
                    f"partition {name} not found in Slurm (renamed or removed?); its original "
                    f"MaxCPUsPerNode={original} stays in {state_path}",
                )
            )
            continue
        current = info.max_cpus_per_node
        if current != original:
            try:
                _update(runner, name, original)
            except SlurmQueryError as exc:
                outcomes.append(
                    RevertOutcome(
                        name,
                        current,
                        current,
                        original,
                        f"cannot restore MaxCPUsPerNode={original} on partition {name}: {exc}"
                        + _permission_hint(str(exc)),
                    )
                )
                continue
        del state.originals[name]
        state.saved_unix_s.pop(name, None)
        outcomes.append(RevertOutcome(name, current, original, original))
    state.save()
    return outcomes


# ------------------------------------------------------------------------------ display


def format_outcome(outcome: PartitionOutcome, *, dry_run: bool = False) -> str:
    """``gpu_spare: MaxCPUsPerNode 24 -> 16 (gpu01: 16 reserved = 12 held + 1 idle GPU x
    4; ...)``; errors are the caller's to print."""
    plan = outcome.plan
    why = f" ({plan.reason})" if plan is not None else ""
    name = outcome.partition
    if outcome.error is not None:
        return f"{name}: {outcome.error}"
    if outcome.changed:
        verb = "would change " if dry_run else ""
        return f"{name}: {verb}MaxCPUsPerNode {outcome.before} -> {outcome.after}{why}"
    if plan is not None and plan.max_cpus_per_node is None:
        return f"{name}: MaxCPUsPerNode {outcome.before} left alone{why}"
    return f"{name}: MaxCPUsPerNode {outcome.before} (unchanged){why}"


class ConditionLog:
    """Says a partition's condition once, when it changes, not on every tick."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def changed(self, key: str, condition: str) -> bool:
        if self._last.get(key) == condition:
            return False
        self._last[key] = condition
        return True


def _condition(outcome: PartitionOutcome) -> str:
    if outcome.error is not None:
        return f"error:{outcome.error}"
    if outcome.plan is None or outcome.plan.max_cpus_per_node is None:
        return "left alone"
    return f"value:{outcome.after}"


Emit = Callable[[str, bool], None]
"""``emit(line, is_error)``: the CLI prints; the loop decides what is worth a line."""


def run_loop(
    runner: Runner,
    settings: ReserveSettings,
    state_path: Path,
    interval_s: float,
    stop: threading.Event,
    emit: Emit,
    *,
    dry_run: bool = False,
    on_pass: Callable[[list[PartitionOutcome]], None] | None = None,
) -> None:
    """Reconcile every ``interval_s`` until ``stop`` is set. Every write is said; a
    condition (error, all nodes down, recovered) is said once when it starts."""
    log = ConditionLog()
    failing: str | None = None
    while not stop.is_set():
        try:
            outcomes = reconcile(runner, settings, state_path, dry_run=dry_run)
        except (SlurmQueryError, ReserveStateError) as exc:
            failing = str(exc)
            if log.changed("*", f"error:{exc}"):
                emit(f"cannot reconcile the spare partitions ({exc})", True)
        else:
            if failing is not None:
                log.changed("*", "ok")
                emit(f"reconciling again (the last pass failed: {failing})", False)
                failing = None
            shown: list[PartitionOutcome] = []
            for outcome in outcomes:
                new_condition = log.changed(outcome.partition, _condition(outcome))
                # A dry run "would change" on every pass: say it when the target moves.
                wrote = outcome.changed and not dry_run
                if wrote or new_condition:
                    emit(format_outcome(outcome, dry_run=dry_run), outcome.error is not None)
                    shown.append(outcome)
            if on_pass is not None and shown:
                on_pass(shown)
        stop.wait(interval_s)
