"""What one simulator run is asked: the policy that sets GPU jobs' cores, and the model's and
the mechanisms' settings (:class:`SimParams`, the placement mechanisms all off by default;
:mod:`slurm_plugin.sim.mechanisms`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from coda_common.config.codaconf import CodaConfig
from coda_node.policy.allocator import ProbeParams
from coda_node.policy.contention import ContentionParams

__all__ = ["CODA_CONF", "POLICIES", "Policy", "SimParams"]


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    cores: str
    """``user`` | ``fixed`` | ``even`` | ``coda`` | ``oracle``: how a GPU job's cores are set."""
    contention: bool = True
    """DNN jobs slow under memory-bandwidth pressure from CPU jobs on their node."""
    shield: bool = False
    """coda-node's contention eliminator throttles the CPU jobs."""
    profile: bool = False
    """coda-node profiles unknown workloads online and publishes to the store."""


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("slurm", "Slurm as users configured it (the trace's CPU requests)", "user"),
        Policy("fixed", "DefCpuPerGPU: a fixed number of cores per GPU", "fixed"),
        Policy("even", "bind CPU and GPU: a node's cores split evenly over its GPUs", "even"),
        Policy(
            "coda",
            "CODA: submit hook (UserValue=replace) + online profiling + contention eliminator",
            "coda",
            shield=True,
            profile=True,
        ),
        Policy("oracle", "each job's true sweet spot, no contention (the limit)", "oracle", False),
    )
}


_CONF = CodaConfig()
"""coda.conf's defaults, for the mechanisms' settings."""

CODA_CONF: tuple[str, ...] = (
    "UserValue=replace",
    "DefaultCpusPerGpu=share",
    "UnprofiledUserValue=raise",
)
"""The hook's settings in the ``coda`` policy: a profile replaces the user's value, and a
workload without one gets at least its GPUs' even share of the node (so its first run is
not starved and coda-node profiles it from above its sweet spot). docs/admin-guide.md
recommends these where users' requests are not trusted."""


@dataclass(frozen=True, slots=True)
class SimParams:
    fixed_cpus_per_gpu: int = 4
    """The ``fixed`` policy's DefCpuPerGPU."""
    bf_window: int = 100
    """Queued jobs per partition that backfill considers (Slurm's bf_max_job_test)."""
    utilisation_bins: int = 200
    probe: ProbeParams = field(default_factory=ProbeParams)
    contention: ContentionParams | None = None
    """The eliminator's settings; None: from the coda policy's coda.conf (its ``Node*``
    keys, as coda-node reads them)."""
    shield_tick_s: float = 2.0
    shield_settle_s: float = 600.0
    rdt: bool = False
    """Nodes have Intel RDT: the eliminator sees per-job bandwidth and uses MBA first."""
    check: bool = False
    """Verify after every start that no node holds more than it has (tests)."""
    coda_conf: tuple[str, ...] = CODA_CONF
    """coda.conf lines (``Key=Value``) the CODA policy's hook runs with; a key given again
    wins (``coda-slurm simulate --coda-conf``)."""
    starter_table: tuple[tuple[str, int], ...] = ()
    """``(model, cores per GPU)``: global profiles ``workload:*:MODEL`` in the CODA
    policy's store before the run, at a confidence below MinConfidence, as an imported
    starter table (:func:`slurm_plugin.sim.workloads.starter_table`; ``coda-slurm
    simulate --starter-table``); the hook uses one as a prior for a job that names the
    model and has no confident profile of its own. Empty: no table."""
    multi_node_measured: bool = False
    """coda-node writes a job summary on each node a multi-node GPU job leaves, and its
    per-node figure (cores per GPU used) is merged into the profile the hook's record names,
    as coda-node's publisher merges it; the hook gives the workload's later multi-node jobs
    the measured figure once ``MultiNodeMinSamples`` figures are in, with
    ``MultiNodeMargin`` (:meth:`slurm_plugin.sim.profiling.OnlineProfiling.multi_node_ended`;
    ``coda-slurm simulate --multi-node-measured``). Off: only the ``MultiNodeGpuCap`` rule,
    as with no job summaries merged."""
    # -- placement mechanisms, all off by default; see sim/mechanisms.py -------
    reserve: bool = False
    """Spare CPU partitions over the GPU nodes, one per node shape, whose MaxCPUsPerNode
    ``coda-slurm reserve`` sets every ``reserve_interval_s``: CPU jobs on a node may hold
    at most that many cores together (running ones are never preempted)."""
    reserve_per_node: bool = False
    """One spare partition per node instead of per node shape (an admin can list one
    partition per node in ``ReservePartitions`` and ``CpuJobPartitions``): a node whose GPU
    jobs hold every core no longer closes its whole shape to CPU jobs."""
    reserve_interval_s: float = _CONF.reserve_interval_s
    """coda.conf ``ReserveIntervalS`` (default 60)."""
    reserve_min_cpus: int = _CONF.reserve_min_cpus
    """coda.conf ``ReserveMinCpus`` (default 1)."""
    reserve_cpus_per_gpu: float = 4.0
    """Cores an idle GPU keeps when no GPU job is pending (``ReserveCpusPerGpu``'s fallback,
    DefCpuPerGPU=4)."""
    pcie_interference: bool = False
    """Model PCIe contention: a node running more PCIe-heavy multi-GPU jobs than it has
    PCIe domains slows each of them by ``JobModel.pcie_slowdown``."""
    pcie_spread: bool = False
    """Jobs the hook marks PCIe-heavy ask for one unit of the node's count-only ``pcie``
    GRES (``JobModel.pcie_domains_per_node`` units per node)."""
    pcie_threshold_bytes_per_s: float = _CONF.pcie_heavy_bytes_per_s
    """coda.conf ``PcieHeavyBytesPerS`` (default 8e9): traffic per GPU x GPUs per node from
    which the hook marks a multi-GPU job heavy."""
    membw_spread: bool = False
    """Memory-bound CPU jobs ask for their memory bandwidth in units of a count-only GRES
    whose per-node count is the node's bandwidth (``JobModel.node_mem_bw_bytes_per_s`` in
    ``membw_unit_bytes_per_s``; :func:`slurm_plugin.decision.placement.membw_units`), so
    the CPU jobs on a node never draw more than its memory system delivers."""
    membw_known_fraction: float = 1.0
    """Share of the CPU jobs whose bandwidth per core is known at submission (measured on
    an earlier run of the same workload); the others ask for nothing. A fixed draw per
    job: the same jobs are known in every run."""
    membw_heavy_bytes_per_s_per_core: float = 2e9
    """Bandwidth per core from which a CPU job asks for units (memory-bound jobs draw 10
    GB/s a core in the job model, compute-bound ones 0.5)."""
    membw_unit_bytes_per_s: float = 1e9
    """What one unit of the membw GRES stands for (the node's count: its bandwidth in these)."""
    gpu_speed: bool = False
    """Model GPU generations: a DNN job progresses at its class's speed on the GPU model
    it runs on (Takayama et al.); off = every GPU runs jobs at trace speed."""
    gpu_prefer: bool = False
    """Jobs without a GPU-type constraint get the hook's soft ``--prefer`` GPU type:
    nodes of that type are tried first, any other after (Slurm's --prefer)."""
    prefer_margin: float = 0.05
    """``prefer_gpu_type``'s margin: the gain below which no type is preferred."""
    gpu_share: str = ""
    """GPU sharing through ``shard`` GRES: ``""`` off; ``"advised"``: jobs of the workloads
    :func:`slurm_plugin.decision.colocate.shareable_workloads` names (at the job's cores) may share;
    ``"any"``: every single-node GPU job may (``shard`` without advice). A job shares only
    when it would otherwise wait, on GPUs one other job of as many GPUs holds."""
    share_margin: float = _CONF.colocate_margin
    """coda.conf ``ColocateMargin`` (default 0.05): the predicted gain a workload needs
    beside itself to be named shareable."""
    share_stage_ms: tuple[tuple[str, int, float, float, float], ...] = ()
    """Measured stage times per (model, GPUs): ``(model, gpus, data_ms, gpu_ms, comm_ms)``
    (Muri's trace); a model listed here takes its GPU busy share and iteration time from
    them (:class:`slurm_plugin.sim.mechanisms.ShareModel`)."""
