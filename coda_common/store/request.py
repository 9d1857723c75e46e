"""What the submit decision reads: the job's request fields and the profile view.

A leaf module (stdlib and :mod:`coda_common.store.usage` only) so that the decision
(:mod:`slurm_plugin.decision.decide`), the placement rules
(:mod:`slurm_plugin.decision.placement`) and the
profile store (:mod:`coda_common.store.profiles`) share these types without importing each other;
:mod:`slurm_plugin.decision.decide` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from coda_common.store.usage import CpuUsageRecord, UsageRecord

__all__ = ["INFINITE", "INFINITE16", "NO_VAL", "NO_VAL16", "JobRequest", "ProfileView"]

NO_VAL16 = 0xFFFE
INFINITE16 = 0xFFFF
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF


@dataclass(slots=True)
class JobRequest:
    """The job_desc fields CODA reads.  Strings may be None (NULL in C); numbers carry
    Slurm's unset markers (NO_VAL16 for uint16 fields, NO_VAL for uint32 ones).

    Not frozen, though nothing changes a request once it is built: the submit hook builds
    one for every job it decides, cold in cache, and a frozen dataclass's ``__init__`` sets
    each field through ``object.__setattr__`` (with the decision's other per-job records,
    about a tenth of a never-seen job's cold time in ``bench/bench_hook_stages.py``)."""

    uid: int
    job_name: str | None = None
    partition: str | None = None
    """Comma-separated partition list as submitted, None when not given."""
    tres_per_node: str | None = None
    tres_per_job: str | None = None
    tres_per_task: str | None = None
    tres_per_socket: str | None = None
    cpus_per_tres: str | None = None
    cpus_per_task: int = NO_VAL16
    """uint16; NO_VAL16 when unset."""
    min_nodes: int = NO_VAL
    """uint32; NO_VAL when unset."""
    max_nodes: int = NO_VAL
    num_tasks: int = NO_VAL
    """uint32; NO_VAL when unset."""
    ntasks_per_node: int = NO_VAL16
    """uint16; NO_VAL16 when unset."""
    sockets_per_node: int = NO_VAL16
    """uint16; NO_VAL16 when unset."""
    comment: str | None = None
    script: str | None = None
    prefer: str | None = None
    """``--prefer`` (soft node features) as submitted, None when not given."""


@dataclass(frozen=True, slots=True)
class ProfileView:
    """The hook's in-memory record of one workload profile (the store gives the hook a
    ``Mapping[str, ProfileView]`` keyed by signature key)."""

    signature: str
    workload: str
    cpus_per_gpu: int
    """Predicted CPUs per GPU on one node."""
    confidence: float
    """0..1."""
    n_samples: int
    multi_node_cpus_per_gpu: int | None
    """Measured multi-node value when known; else the CODA rule applies."""
    usage: tuple[UsageRecord, ...] = ()
    """What the workload did with its GPUs, at most one record per GPU model."""
    cpu_usage: CpuUsageRecord | None = None
    """The memory bandwidth the workload drew as a CPU job; None = never measured."""
    multi_node_measured_cores_per_gpu: float | None = None
    """The cores per GPU multi-node runs used per node (the p90 of the last per-node
    figures, :mod:`coda_common.store.multinode`); None = no multi-node run measured."""
    multi_node_runs: int = 0
    """How many per-node figures that is from (``MultiNodeMinSamples`` counts these)."""
