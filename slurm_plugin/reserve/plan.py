"""Spare cores of GPU nodes for CPU jobs: how many a CPU partition may use per node.

Placement mechanism 1. The admin defines a CPU partition over the GPU nodes
(``PartitionName=gpu_spare Nodes=gpu[01-16] MaxCPUsPerNode=8``); ``coda-slurm reserve``
keeps its ``MaxCPUsPerNode`` at what the GPU jobs leave: per node, the cores the running GPU
jobs hold plus what the idle GPUs will need (idle GPUs x expected cores per GPU) stay
reserved, the rest may go to CPU jobs.

``MaxCPUsPerNode`` is one number per partition (slurm.conf(5): "Maximum number of CPUs on
any node available to all jobs from this partition"), so the value is the minimum over the
partition's up nodes that have an idle GPU: no node lends a CPU job a core its next GPU job
needs (nodes with every GPU allocated need no cap: Slurm keeps CPU jobs off the cores their
GPU jobs hold). Admins with mixed node shapes define one spare partition per shape, and on a
busy cluster a partition per node or per few nodes (``docs/admin-guide.md``).

A node with ``RestrictedCoresPerGPU=N`` (Slurm 24.05 on) keeps N cores per GPU for GPU
jobs: slurm.conf(5) "If a job does not request a GPU it will not have access to these
cores" (select/cons_tres ``cons_helpers.c`` takes them out of a CPU-only job's cores). They
are never lent: a node's spare cores are counted among the others only, and an idle GPU
needs from them only what its expected cores exceed its own restricted ones by.

Slurm never preempts for this: lowering the cap only stops *new* CPU jobs from starting
beyond it, and cores Slurm has allocated to a GPU job are that job's until it ends (its
own accounting, select/cons_tres, guarantees it; nothing here can take them).

Everything in this module is pure: Slurm's records in, a plan out
(:mod:`slurm_plugin.reserve.cluster` reads Slurm and applies the plan).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "NodeLoad",
    "ReservePlan",
    "expected_cpus_per_gpu",
    "node_reserved_cpus",
    "plan_partition",
    "spare_cpus_per_node",
]

REASON_NODES = 3
"""Nodes named in a plan's reason (the tightest first); ``per_node`` has them all."""
_EPS = 1e-9
"""``2.2 * 5`` is ``11.000000000000002`` in floating point; ceil() must still say 11."""


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node of a spare partition as Slurm sees it now."""

    name: str
    cpus: int
    """CPUs Slurm schedules on the node (``CPUTot``)."""
    gpus: int
    """GPUs configured (the node's ``Gres=gpu...`` count)."""
    gpus_alloc: int
    """GPUs allocated to jobs now."""
    cpus_alloc_gpu_jobs: int
    """Cores allocated on this node to jobs that hold GPUs here."""
    up: bool = True
    """False for DOWN/DRAIN/FAIL/NOT_RESPONDING nodes: they are skipped."""
    restricted_cpus_per_gpu: int = 0
    """CPUs of the cores ``RestrictedCoresPerGPU`` keeps for GPU jobs, per GPU (0: none)."""
    restricted_cpus_held: int = 0
    """Of ``cpus_alloc_gpu_jobs``, those on restricted cores."""


def _idle_gpus(node: NodeLoad) -> int:
    return max(0, node.gpus - node.gpus_alloc)


def _restricted(node: NodeLoad) -> int:
    """CPUs no CPU job can use: the restricted cores of every GPU, at most the node's."""
    return min(node.cpus, max(0, node.restricted_cpus_per_gpu) * max(0, node.gpus))


def _held_outside(node: NodeLoad) -> int:
    """CPUs GPU jobs hold on cores that are not restricted."""
    return max(0, node.cpus_alloc_gpu_jobs - max(0, node.restricted_cpus_held))


def _idle_need_per_gpu(node: NodeLoad, cpus_per_gpu: float) -> float:
    """What an idle GPU's next job needs beyond its own restricted cores."""
    return max(0.0, cpus_per_gpu - max(0, node.restricted_cpus_per_gpu))


def _idle_need(node: NodeLoad, cpus_per_gpu: float) -> int:
    per_gpu = _idle_need_per_gpu(node, cpus_per_gpu)
    return max(0, math.ceil(_idle_gpus(node) * per_gpu - _EPS))


def _need(node: NodeLoad, cpus_per_gpu: float) -> int:
    return _restricted(node) + _held_outside(node) + _idle_need(node, cpus_per_gpu)


def node_reserved_cpus(node: NodeLoad, cpus_per_gpu: float) -> int:
    """Cores of ``node`` kept for GPU jobs, at most the node's CPUs: the restricted cores
    (``RestrictedCoresPerGPU``; no CPU job can use them), those running GPU jobs hold
    outside them, and ``ceil(idle GPUs x (cpus_per_gpu - restricted per GPU))``.  Without
    restricted cores: what the GPU jobs hold plus ``ceil(idle GPUs x cpus_per_gpu)``."""
    return min(node.cpus, _need(node, cpus_per_gpu))


def spare_cpus_per_node(
    nodes: Iterable[NodeLoad], cpus_per_gpu: float, *, min_cpus: int = 1
) -> int | None:
    """The ``MaxCPUsPerNode`` for a partition over ``nodes``: the fewest cores any up node
    *with an idle GPU* can spare, never below ``min_cpus``; None when no node is up (leave
    the value alone: there is nothing to measure).

    A node whose GPUs are all allocated does not constrain the value: no GPU job can start
    there, and Slurm already keeps CPU jobs off the cores its GPU jobs hold. Taking the
    minimum over those nodes too would let one busy node close the partition on every node
    (the simulator showed CPU jobs waiting for weeks on Philly that way). When no up node
    has an idle GPU, the value is the most any up node can spare.
    """
    up = [n for n in nodes if n.up]
    if not up:
        return None
    spare = [(n.cpus - node_reserved_cpus(n, cpus_per_gpu), _idle_gpus(n) > 0) for n in up]
    constraining = [room for room, idle in spare if idle]
    value = min(constraining) if constraining else max(room for room, _ in spare)
    return max(min_cpus, value)


def expected_cpus_per_gpu(pending: Sequence[float], default: float) -> float:
    """Cores per GPU the next GPU jobs will ask for: the median ``--cpus-per-gpu`` of the
    pending GPU jobs (what the submit hook set, ``CpusPerTres=gres:gpu:N``), else
    ``default``. The median, not the mean: one job asking 64 cores per GPU should not
    close the partition to every CPU job."""
    values = [float(v) for v in pending if v > 0]
    if not values:
        return float(default)
    return float(statistics.median(values))


@dataclass(frozen=True, slots=True)
class ReservePlan:
    """What ``MaxCPUsPerNode`` one spare partition should have, and why."""

    partition: str
    max_cpus_per_node: int | None
    """None = leave the partition's value unchanged (no node is up)."""
    cpus_per_gpu: float
    """Cores per idle GPU kept reserved."""
    per_node: tuple[tuple[str, int], ...]
    """``(node, reserved cores)`` of each up node, for display."""
    reason: str


def _num(value: float) -> str:
    return f"{value:g}"


def _node_reason(node: NodeLoad, cpus_per_gpu: float) -> str:
    need = _need(node, cpus_per_gpu)
    idle = _idle_gpus(node)
    restricted = _restricted(node)
    text = f"{node.name}: {min(node.cpus, need)} reserved = "
    if restricted:
        text += (
            f"{restricted} restricted (RestrictedCoresPerGPU) + "
            f"{_held_outside(node)} held outside them"
        )
    else:
        text += f"{node.cpus_alloc_gpu_jobs} held"
    if idle:
        text += f" + {idle} idle GPU{'' if idle == 1 else 's'} x "
        if restricted:
            per_gpu = _idle_need_per_gpu(node, cpus_per_gpu)
            text += (
                f"{_num(per_gpu)} ({_num(cpus_per_gpu)} less "
                f"{node.restricted_cpus_per_gpu} restricted)"
            )
        else:
            text += _num(cpus_per_gpu)
    if need > node.cpus:
        text += f" (capped at its {node.cpus} CPUs)"
    return text


def plan_partition(
    partition: str,
    nodes: Sequence[NodeLoad],
    pending_cpus_per_gpu: Sequence[float],
    *,
    default_cpus_per_gpu: float,
    min_cpus: int,
) -> ReservePlan:
    """The plan for one spare partition over ``nodes`` (its nodes as Slurm reports them).

    ``reason`` reads ``gpu01: 16 reserved = 12 held + 1 idle GPU x 4; gpu02: down,
    skipped``; the node that sets the value comes first."""
    cpus_per_gpu = expected_cpus_per_gpu(pending_cpus_per_gpu, default_cpus_per_gpu)
    up = [n for n in nodes if n.up]
    down = [n.name for n in nodes if not n.up]
    value = spare_cpus_per_node(up, cpus_per_gpu, min_cpus=min_cpus)
    per_node = tuple((n.name, node_reserved_cpus(n, cpus_per_gpu)) for n in up)
    if value is None:
        if not nodes:
            reason = "the partition has no node"
        else:
            shown = ", ".join(down[:REASON_NODES]) + (" ..." if len(down) > REASON_NODES else "")
            reason = f"every node is down or drained: {shown}"
        return ReservePlan(partition, None, cpus_per_gpu, per_node, reason)
    # The tightest node with an idle GPU first: it is the one that sets the value.
    ordered = sorted(
        up,
        key=lambda n: (
            _idle_gpus(n) == 0,
            n.cpus - node_reserved_cpus(n, cpus_per_gpu),
            n.name,
        ),
    )
    parts = [_node_reason(n, cpus_per_gpu) for n in ordered[:REASON_NODES]]
    if len(ordered) > REASON_NODES:
        parts.append(f"{len(ordered) - REASON_NODES} more node(s) spare as many or more")
    if down:
        shown = ", ".join(down[:REASON_NODES]) + (" ..." if len(down) > REASON_NODES else "")
        parts.append(f"{len(down)} down or drained, skipped ({shown})")
    tightest = ordered[0]
    if tightest.cpus - node_reserved_cpus(tightest, cpus_per_gpu) < min_cpus:
        parts.append(f"floor ReserveMinCpus={min_cpus}")
    return ReservePlan(partition, value, cpus_per_gpu, per_node, "; ".join(parts))
