"""A discrete-event simulator of a Slurm cluster of GPU nodes, one allocation policy per run.

**Cluster.** Nodes with cores and GPUs (the trace's inventory, or uniform ones). GPU jobs
ask for GPUs and cores on one or more nodes; CPU-only jobs ask for cores and run on the
spare cores of the GPU nodes, as the CPU partition over GPU nodes does on a real cluster.

**Scheduling** is Slurm-like: two partitions (GPU jobs, CPU jobs), each FIFO in submit
order with EASY backfill. The first job of a partition that does not fit reserves the
node(s) that free up for it soonest (judged by the running jobs' time limits, which are
``time_limit_factor`` times their real run times); later jobs in the first ``bf_window`` of
the queue start now if they fit and either avoid the reserved nodes or end (by their own
limit) before the reservation's start. Placement is best-fit on GPUs (the node with the
fewest free GPUs that fits), then on cores.

**Progress.** Each job has work: a CPU job's run time; a DNN job's run time in the trace
times the rate it ran at there (its throughput at the cores the user asked for, uncontended:
traces record real runs). A DNN job advances at its throughput curve's value at the cores it
holds per node, times ``1 - slowdown`` from memory-bandwidth pressure on its slowest node; a
CPU job at its CPU-quota share. Rates change only when the jobs on a node change, so each
such change re-solves that node and re-times its jobs' ends.

**Policies** (:class:`Policy`) decide the cores of each GPU job; CODA's also shields DNN
jobs with coda-node's eliminator (:mod:`slurm_plugin.sim.shield`) and profiles unknown
workloads with coda-node's allocator (:mod:`slurm_plugin.sim.profiling`), publishing to an
in-memory profile store that the submit hook's own :func:`slurm_plugin.decision.decide.decide`
reads for every later job.

**Placement mechanisms** (:class:`SimParams`, all off by default) are decided by
the product's own functions through :mod:`slurm_plugin.sim.mechanisms`: ``reserve`` caps the
cores CPU jobs may hold per node at what ``coda-slurm reserve`` would set as the spare
partition's MaxCPUsPerNode, re-planned every ``reserve_interval_s``; ``pcie_spread`` gives
the jobs the hook marks PCIe-heavy one unit of a per-node count; ``membw_spread`` gives
memory-bound CPU jobs their bandwidth in units of a per-node count (the node's memory
bandwidth); ``gpu_prefer`` tries the
hook's preferred GPU type first. ``pcie_interference`` and ``gpu_speed`` model what the
last two act on (PCIe contention, GPU generations) and are on in their baselines too.
``gpu_share`` lets a single-node job that would wait start on GPUs one other job of as
many GPUs holds (Slurm's ``shard`` GRES), for the workloads the product's
:func:`slurm_plugin.decision.colocate.shareable_workloads` names (``advised``) or for any
(``any``); both jobs then progress at the rates of a time-sliced GPU
(:func:`slurm_plugin.sim.mechanisms.shared_iteration_s`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.model.curves import throughput_at
from coda_common.model.fit import is_censored, refit_profile
from coda_common.slurm.slurmconf import NodeShape
from coda_common.store.profiles import Profile, Sample, to_view
from coda_node.policy.allocator import ProbeParams
from coda_node.policy.contention import ContentionParams, params_from_config
from slurm_plugin.config.nodecap import NodeCap
from slurm_plugin.decision import placement
from slurm_plugin.decision.decide import JobRequest, ProfileView, decide
from slurm_plugin.sim.cluster import busy_window
from slurm_plugin.sim.mechanisms import PlacementModel, ShareModel, spare_cpus_by_shape
from slurm_plugin.sim.profiling import WARMUP_S, ProbeRun, probe_run
from slurm_plugin.sim.shield import NodeMix, Shield, slowdowns
from slurm_plugin.sim.traces import NodeSpec, Trace
from slurm_plugin.sim.workloads import JobModel, Workloads

__all__ = ["CODA_CONF", "POLICIES", "Policy", "RunResult", "SimParams", "simulate"]


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


@dataclass(slots=True)
class RunResult:
    policy: str
    start_s: np.ndarray
    end_s: np.ndarray
    cores_per_node: np.ndarray
    """Cores each job held per node (GPU jobs: what the policy gave; CPU jobs: asked)."""
    nodes_used: np.ndarray
    asked_cores_per_node: np.ndarray
    """What the user asked per node (GPU jobs), for the cores-freed measure."""
    horizon_s: float
    """Length of the utilisation window (the trace's busy window)."""
    bin_edges_s: np.ndarray
    alloc_gpu_s: np.ndarray
    """GPU-seconds allocated per utilisation bin."""
    effective_gpu_s: np.ndarray
    """GPU-seconds × progress rate per bin."""
    busy_core_s: np.ndarray
    total_gpus: int
    total_cores: int
    events: int
    wall_s: float
    counters: dict[str, int]


@dataclass(slots=True)
class _Run:
    job: int
    gpu: bool
    nodes: tuple[int, ...]
    cores: int
    """Per node."""
    gpn: int
    """GPUs per node."""
    work_left: float
    rate: float
    last_s: float
    limit_end_s: float
    version: int = 0
    share: float = 1.0
    """CPU jobs: share of their cores the eliminator lets them use."""
    slowdown: float = 0.0
    has_baseline: bool = False
    """DNN jobs: ran uncontended on its node for a while (the eliminator has a baseline)."""
    probing: bool = False
    probe_from_s: float = 0.0
    """When the job started (and its probing run began)."""
    speed: float = 1.0
    """DNN jobs: progress rate of its slowest GPU's generation (1 = trace speed)."""
    pcie_unit: bool = False
    """Holds one unit of the ``pcie`` GRES on each of its nodes."""
    pcie_heavy: bool = False
    """Truly PCIe-heavy with >= 2 GPUs per node: slows beside another such job."""
    partner: int = -1
    """The job it shares its GPUs with (``gpu_share``), or -1."""
    owner: bool = True
    """Holds its GPUs in the books (false for the second job on shared GPUs until the
    first ends): a shared GPU counts once in free GPUs and allocated utilisation."""
    share_factor: float = 1.0
    """Progress rate while shared over the rate alone (``T / T'``)."""
    pair_since_s: float = 0.0


class _Sim:
    def __init__(
        self,
        trace: Trace,
        nodes: list[NodeSpec],
        wl: Workloads,
        model: JobModel,
        policy: Policy,
        params: SimParams,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.t = trace
        self.wl = wl
        self.m = model
        self.pol = policy
        self.p = params
        self.progress = progress
        n_nodes = len(nodes)
        if n_nodes == 0:
            raise ValueError("the cluster has no nodes")
        self.node_cores = np.array([nd.cores for nd in nodes], dtype=np.int64)
        self.node_gpus = np.array([nd.gpus for nd in nodes], dtype=np.int64)
        self.free_cores = self.node_cores.copy()
        self.free_gpus = self.node_gpus.copy()
        self.node_model = [nd.gpu_model for nd in nodes]
        self.max_gpn = int(self.node_gpus.max())
        self.max_cores = int(self.node_cores.max())
        self.on_node: list[set[int]] = [set() for _ in range(n_nodes)]
        self.probing_on: list[int] = [0] * n_nodes
        self.probe_waiting: list[list[int]] = [[] for _ in range(n_nodes)]
        """Per node, a heap of the jobs past their warm-up that wait for its probe slot."""
        n = len(trace)
        self.start_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.cores_per_node = np.zeros(n, dtype=np.int32)
        self.asked = np.zeros(n, dtype=np.int32)
        self.nodes_used = np.zeros(n, dtype=np.int32)
        self.running: dict[int, _Run] = {}
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.q: dict[bool, deque[int]] = {True: deque(), False: deque()}
        self.tried: set[int] = set()
        self.resv: dict[bool, tuple[int, frozenset[int], float] | None] = {True: None, False: None}
        self.dirty_nodes: set[int] = set()
        self._node_slow: list[dict[int, float]] = [{} for _ in range(n_nodes)]
        """Per node: each DNN job's slowdown there, from the last re-solve."""
        self.needs: dict[int, tuple[bool, int, int, int]] = {}
        self.feasible: dict[tuple[int, int, int, int], bool] = {}
        self.counters: dict[str, int] = {
            "events": 0,
            "rate_changes": 0,
            "probed_jobs": 0,
            "profiles_published": 0,
            "profiles_published_ended": 0,
            "probe_slot_busy": 0,
            "probe_slot_waited": 0,
            "shield_lookups": 0,
            "decide_calls": 0,
            "capped_requests": 0,
            "rejected": 0,
        }
        # Utilisation integrals.
        self.w0, self.horizon = busy_window(trace)
        self.bins = params.utilisation_bins
        self.bin_w = (self.horizon - self.w0) / self.bins
        self.alloc_gpu_s = np.zeros(self.bins)
        self.eff_gpu_s = np.zeros(self.bins)
        self.core_s = np.zeros(self.bins)
        self.now_alloc = 0.0
        self.now_eff = 0.0
        self.now_cores = 0.0
        self.last_t = 0.0
        # GPU-type constraints (Alibaba's gpu_spec "A|B"): the nodes each spec allows.
        self.allowed: list[np.ndarray | None] = []
        for spec in trace.gpu_model_names:
            ok = set(spec.split("|"))
            mask = np.array([m in ok for m in self.node_model], dtype=bool)
            self.allowed.append(mask if mask.any() else None)
        # CODA's controller side.
        self.cfg, _ = parse_config("\n".join(params.coda_conf), source="coda policy settings")
        shapes = tuple(
            NodeShape(str(i), int(c), int(g))
            for i, (c, g) in enumerate(zip(self.node_cores, self.node_gpus, strict=True))
        )
        self.node_cap = NodeCap(shapes, "the simulated nodes")
        self.node_share = self.node_cap.share
        self.profiles: dict[str, Profile] = {}
        self.views: dict[str, ProfileView] = {}
        self.decided: dict[tuple[int, int, int, int], int] = {}
        self.probe_memo: dict[tuple[int, int, int], ProbeRun] = {}
        self.contention = params.contention or params_from_config(
            self.cfg, membw_spread=params.membw_spread
        )
        self._priced = self.contention.gpu_worth_cores > 0
        self.shield = Shield(
            self.contention, tick_s=params.shield_tick_s, settle_s=params.shield_settle_s
        )
        self._init_placement(nodes)

    def _init_placement(self, nodes: list[NodeSpec]) -> None:
        p = self.p
        n_nodes = len(nodes)
        # Placement constraints beyond GPUs and cores: _find takes its slower path only then.
        self.constrained = p.reserve or p.pcie_spread or p.gpu_prefer or p.membw_spread
        self.reserve_on = p.reserve
        self.pcie_on = p.pcie_interference
        self.place: PlacementModel | None = None
        if p.pcie_interference or p.pcie_spread or p.gpu_speed or p.gpu_prefer:
            self.place = PlacementModel(
                self.wl,
                self.m,
                self.node_model,
                self.node_gpus.tolist(),
                pcie_threshold_bytes_per_s=p.pcie_threshold_bytes_per_s,
                prefer_margin=p.prefer_margin,
            )
        self.booking = self.place is not None or p.reserve or p.membw_spread
        """Starts and ends book more than GPUs and cores (see _place_start)."""
        # GPU type of each node, as an index into place.types (-1: no model).
        types = self.place.types if self.place is not None else []
        self.node_type = np.array(
            [types.index(m) if m in types else -1 for m in self.node_model], dtype=np.int64
        )
        self.type_mask = [self.node_type == t for t in range(len(types))]
        n = len(self.t)
        self.pcie_mark = np.zeros(n, dtype=bool)
        self.prefer = np.full(n, -1, dtype=np.int16)
        self.free_pcie = np.full(n_nodes, self.m.pcie_domains_per_node, dtype=np.int64)
        self.heavy_on = np.zeros(n_nodes, dtype=np.int64)
        self.pcie_slowed: set[int] = set()
        """Jobs that ran beside too many PCIe-heavy jobs at some time."""
        self.membw_node_units = int(self.m.node_mem_bw_bytes_per_s // p.membw_unit_bytes_per_s)
        self.free_membw = np.full(n_nodes, self.membw_node_units, dtype=np.int64)
        self.membw_held: dict[int, int] = {}
        """Running CPU jobs' units of the membw GRES on each of their nodes."""
        self.membw_known = np.zeros(n, dtype=bool)
        if p.membw_spread:
            draw = np.random.default_rng(0x6D6277).random(n)
            self.membw_known = (draw < p.membw_known_fraction) & (self.t.gpus == 0)
        # reserve: one spare CPU partition per node shape (cores, GPUs, GPU model).
        shapes: dict[object, list[int]] = {}
        for i, nd in enumerate(nodes):
            key = i if p.reserve_per_node else (nd.cores, nd.gpus, nd.gpu_model)
            shapes.setdefault(key, []).append(i)
        self.shape_nodes = [np.array(v, dtype=np.int64) for v in shapes.values()]
        self.node_shape = np.zeros(n_nodes, dtype=np.int64)
        for si, idx in enumerate(self.shape_nodes):
            self.node_shape[idx] = si
        self.cpu_cap = self.node_cores.copy()
        """MaxCPUsPerNode of each node's spare CPU partition (reserve on)."""
        self.cpu_on = np.zeros(n_nodes, dtype=np.int64)
        """Cores CPU jobs hold on each node."""
        self.pending_cpg: dict[int, float] = {}
        """Queued GPU jobs' cores per GPU (reserve's expected demand)."""
        self.reserve_dirty = True
        self.cpu_retry = False
        # The hook routes a CPU job to the spare partition only if it fits there when no
        # GPU job is pending; a bigger one keeps today's CPU partition (it would never start).
        self.route_max_cores = max(
            max(p.reserve_min_cpus, nd.cores - math.ceil(nd.gpus * p.reserve_cpus_per_gpu))
            for nd in nodes
        )
        self.last_submit_s = float(self.t.submit_s[-1]) if n else 0.0
        self._init_share()

    def _init_share(self) -> None:
        p = self.p
        if p.gpu_share not in ("", "advised", "any"):
            raise ValueError(f"gpu_share must be '', 'advised' or 'any', got {p.gpu_share!r}")
        self.sharing = bool(p.gpu_share)
        self.share_model: ShareModel | None = None
        if self.sharing:
            stages = {(name, gpus): (d, g, c) for name, gpus, d, g, c in p.share_stage_ms}
            self.share_model = ShareModel(
                self.wl, self.m, stages, margin=p.share_margin, advised=p.gpu_share == "advised"
            )
        self.share_ok = np.zeros(len(self.t), dtype=bool)
        """Single-node GPU jobs allowed ``shard`` GRES (the hook's advice, or all)."""
        self.hosts: dict[int, set[int]] = {}
        """GPUs per node -> running jobs that may take a second job on their GPUs."""
        self.share_host = -1
        """The job whose GPUs the last successful :meth:`_find_share` chose."""
        self.share_new_nodes: set[int] = set()
        """Nodes where a job that may host started since the last scheduling pass."""
        self.shared_jobs: set[int] = set()
        self.share_gpu_s = 0.0
        self.share_job_s = 0.0
        self.share_slow_job_s = 0.0

    # -- time and utilisation ------------------------------------------------------------
    def _advance(self, t: float) -> None:
        a, b = max(self.last_t, self.w0), min(t, self.horizon)
        if b > a and (self.now_alloc or self.now_cores):
            w = self.bin_w
            i = int((a - self.w0) // w)
            while a < b and i < self.bins:
                edge = min(b, self.w0 + (i + 1) * w)
                d = edge - a
                self.alloc_gpu_s[i] += self.now_alloc * d
                self.eff_gpu_s[i] += self.now_eff * d
                self.core_s[i] += self.now_cores * d
                a = edge
                i += 1
        self.last_t = max(self.last_t, t)

    # -- cores a GPU job gets ---------------------------------------------------------------
    def _gpn_nodes(self, j: int) -> tuple[int, int]:
        g = int(self.t.gpus[j])
        k = max(int(self.t.nodes[j]), -(-g // self.max_gpn))
        while g % k and k < g:
            k += 1  # GPUs spread evenly over whole nodes
        return g // k, k

    def _theta(self, j: int, gpn: int, k: int) -> float:
        return self.wl.sweet_spot(j, gpn, k, self.m)

    def _user_cores(self, j: int, gpn: int) -> int:
        return max(1, math.ceil(self.wl.user_cpus_per_gpu[j] * gpn))

    def _cores(self, j: int, gpn: int, k: int, node: int | None) -> int:
        """Cores per node the policy gives GPU job ``j`` (``node`` for ``even``)."""
        how = self.pol.cores
        if how == "user":
            return self._user_cores(j, gpn)
        if how == "fixed":
            return self.p.fixed_cpus_per_gpu * gpn
        if how == "even":
            assert node is not None
            return max(1, int(self.node_cores[node] // self.node_gpus[node]) * gpn)
        if how == "oracle":
            return max(1, math.ceil(self._theta(j, gpn, k)))
        return self._coda_cores(j, gpn, k)

    def _coda_cores(self, j: int, gpn: int, k: int) -> int:
        wid = int(self.wl.workload[j])
        user_cpg = int(self.wl.user_cpus_per_gpu[j])
        key = (wid, gpn, k, user_cpg)
        got = self.decided.get(key)
        if got is None:
            self.counters["decide_calls"] += 1
            name = self.wl.names[wid]
            req = JobRequest(
                uid=1000 + wid,
                job_name=name,
                tres_per_node=f"gres:gpu:{gpn}",
                cpus_per_tres=f"gres:gpu:{user_cpg}",
                min_nodes=k,
                comment=f"coda:workload={name}",
            )
            d = decide(req, self.cfg, self.views, self.node_cap, node_share=self.node_share)
            cpg = user_cpg
            if d.cpus_per_tres is not None:
                cpg = int(d.cpus_per_tres.rsplit(":", 1)[1])
            got = self.decided[key] = cpg * gpn
        return got

    # -- placement ---------------------------------------------------------------------------
    def _need(self, j: int) -> tuple[bool, int, int, int]:
        """(gpu job, GPUs per node, nodes, cores per node or -1 when node-dependent)."""
        g = int(self.t.gpus[j])
        if g == 0:
            c = int(self.t.cpus[j]) if self.t.cpus[j] > 0 else 1
            if c > self.max_cores:
                self.counters["capped_requests"] += 1
                c = self.max_cores
            if self.reserve_on and c > self.route_max_cores:
                self.counters["reserve_unrouted"] = self.counters.get("reserve_unrouted", 0) + 1
            return False, 0, 1, c
        gpn, k = self._gpn_nodes(j)
        if self.place is not None:
            self._mark(j, gpn)
        if self.pol.cores == "even":
            if self.sharing and k == 1:
                self._mark_share(j, gpn, self.max_cores // self.max_gpn * gpn)
            return True, gpn, k, -1
        c = self._cores(j, gpn, k, None)
        if c > self.max_cores:
            c = self.max_cores
        if self.sharing and k == 1:
            self._mark_share(j, gpn, c)
        return True, gpn, k, c

    def _mark_share(self, j: int, gpn: int, cores: int) -> None:
        """Whether the hook lets single-node GPU job ``j`` use ``shard`` GRES: with advice,
        whether its workload's usage at these cores (what coda-node would have recorded:
        an upper bound, as for the other mechanisms) gains beside itself."""
        assert self.share_model is not None
        thr = throughput_at(self._theta(j, gpn, 1), cores, log_share=self.m.log_share)
        self.share_ok[j] = self.share_model.may_share(int(self.wl.workload[j]), gpn, thr)

    def _mark(self, j: int, gpn: int) -> None:
        """What the hook adds to GPU job ``j`` at submission: ``pcie:1`` and ``--prefer``.

        Every workload's usage record is taken as known (measured by an earlier run): an
        upper bound on what the hook can do for a workload's first run.
        """
        assert self.place is not None
        wid = int(self.wl.workload[j])
        if self.p.pcie_spread and self.m.pcie_domains_per_node > 0:
            self.pcie_mark[j] = self.place.marks_pcie(wid, gpn)
        if self.p.gpu_prefer and self.t.gpu_model[j] < 0 and self.place.types:
            self.prefer[j] = self.place.preferred_type(wid)

    def _membw_units(self, j: int, cores: int) -> int:
        """Units of the membw GRES CPU job ``j`` asks for on each node (0: none)."""
        if not self.membw_known[j]:
            return 0
        return placement.membw_units(
            float(self.wl.cpu_bw_per_core[j]),
            cores,
            heavy_bytes_per_s_per_core=self.p.membw_heavy_bytes_per_s_per_core,
            unit_bytes_per_s=self.p.membw_unit_bytes_per_s,
            node_units=self.membw_node_units,
        )

    def _feasible(self, j: int, need: tuple[bool, int, int, int]) -> bool:
        """Whether some set of nodes could ever hold the job (Slurm rejects it otherwise)."""
        key = (need[1], need[2], need[3], int(self.t.gpu_model[j]))
        ok = self.feasible.get(key)
        if ok is None:
            _gpu, gpn, k, c = need
            spec = key[3]
            mask = self.node_gpus >= gpn
            if c >= 0:
                mask &= self.node_cores >= c
            if spec >= 0:
                allowed = self.allowed[spec]
                mask &= allowed if allowed is not None else False
            ok = self.feasible[key] = int(mask.sum()) >= k
        return ok

    def _fits_node(self, i: int, gpn: int, c: int, allowed: np.ndarray | None) -> bool:
        if self.free_gpus[i] < gpn:
            return False
        if allowed is not None and not allowed[i]:
            return False
        if c < 0:
            c = max(1, int(self.node_cores[i] // self.node_gpus[i]) * gpn)
        return self.free_cores[i] >= c

    def _find_placed(
        self, j: int, need: tuple[bool, int, int, int], only: set[int] | None, avoid: frozenset[int]
    ) -> list[int] | None:
        """:meth:`_find` with the placement mechanisms' constraints (see SimParams)."""
        gpu, _gpn, _k, c = need
        mask = None
        if gpu and self.pcie_mark[j]:
            mask = self.free_pcie >= 1
        if not gpu and self.p.reserve and c <= self.route_max_cores:
            mask = self.cpu_on + c <= self.cpu_cap
        units = self._membw_units(j, c) if not gpu else 0
        if units:
            fits = self.free_membw >= units
            mask = fits if mask is None else mask & fits
        pref = int(self.prefer[j]) if gpu else -1
        if pref >= 0:
            # Slurm's --prefer: the preferred type if it fits now, else any (soft).
            tm = self.type_mask[pref]
            got = self._find(j, need, only, avoid, tm if mask is None else mask & tm)
            if got is not None:
                return got
        return self._find(j, need, only, avoid, mask)

    def _find(
        self,
        j: int,
        need: tuple[bool, int, int, int],
        only: set[int] | None,
        avoid: frozenset[int],
        mask: np.ndarray | None = None,
    ) -> list[int] | None:
        """Nodes for job ``j`` now, or None. ``only``: look only there (single-node jobs);
        ``mask``: only nodes where it is True (the placement mechanisms)."""
        _gpu, gpn, k, c = need
        spec = int(self.t.gpu_model[j])
        allowed = self.allowed[spec] if spec >= 0 else None
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        if only is not None and k == 1:
            best = None
            for i in only:
                if i in avoid or not self._fits_node(i, gpn, c, allowed):
                    continue
                key = (int(self.free_gpus[i]), int(self.free_cores[i]), i)
                if best is None or key < best:
                    best = key
            return None if best is None else [best[2]]
        if c < 0:
            per_node = np.maximum(1, self.node_cores // np.maximum(self.node_gpus, 1)) * gpn
        else:
            per_node = c
        mask = (self.free_gpus >= gpn) & (self.free_cores >= per_node)
        if allowed is not None:
            mask &= allowed
        idx = np.flatnonzero(mask)
        if avoid:
            idx = np.array([i for i in idx if i not in avoid], dtype=np.int64)
        if len(idx) < k:
            return None
        order = np.lexsort((idx, self.free_cores[idx], self.free_gpus[idx]))
        return [int(i) for i in idx[order[:k]]]

    def _availability(self, i: int, gpn: int, c: int, now: float) -> float:
        """When node ``i`` has ``gpn`` GPUs and ``c`` cores free, by running jobs' limits."""
        fg, fc = int(self.free_gpus[i]), int(self.free_cores[i])
        if c < 0:
            c = max(1, int(self.node_cores[i] // self.node_gpus[i]) * gpn)
        if fg >= gpn and fc >= c:
            return now
        ends = sorted((self.running[r].limit_end_s, r) for r in self.on_node[i])
        if self.sharing:
            return self._availability_shared(ends, fg, fc, gpn, c, now)
        for end, r in ends:
            run = self.running[r]
            fg += run.gpn
            fc += run.cores
            if fg >= gpn and fc >= c:
                return max(now, end)
        return math.inf

    def _availability_shared(
        self, ends: list[tuple[float, int]], fg: int, fc: int, gpn: int, c: int, now: float
    ) -> float:
        """:meth:`_availability` where two jobs may share GPUs: those free when both end."""
        ended: set[int] = set()
        for end, r in ends:
            run = self.running[r]
            ended.add(r)
            if run.partner < 0 or run.partner in ended:
                fg += run.gpn
            fc += run.cores
            if fg >= gpn and fc >= c:
                return max(now, end)
        return math.inf

    def _reserve(
        self, j: int, need: tuple[bool, int, int, int], now: float
    ) -> tuple[int, frozenset[int], float]:
        _gpu, gpn, k, c = need
        spec = int(self.t.gpu_model[j])
        allowed = self.allowed[spec] if spec >= 0 else None
        cand = np.flatnonzero(self.node_gpus >= gpn)
        if allowed is not None:
            cand = cand[allowed[cand]]
        if c >= 0:
            cand = cand[self.node_cores[cand] >= c]
        # Nodes likeliest to free first: most free GPUs, then most free cores.
        if len(cand) > 64:
            order = np.lexsort((-self.free_cores[cand], -self.free_gpus[cand]))
            cand = cand[order[: max(64, 4 * k)]]
        avail = sorted((self._availability(int(i), gpn, c, now), int(i)) for i in cand)
        chosen = avail[:k]
        shadow = chosen[-1][0] if len(chosen) == k else math.inf
        return j, frozenset(i for _, i in chosen), shadow

    # -- starting and finishing ------------------------------------------------------------
    def _start(
        self, j: int, need: tuple[bool, int, int, int], nodes: list[int], now: float
    ) -> None:
        gpu, gpn, k, c = need
        if c < 0:
            c = min(max(1, int(self.node_cores[i] // self.node_gpus[i]) * gpn) for i in nodes)
        host = -1
        if self.sharing:
            host, self.share_host = self.share_host, -1
        take = gpn if host < 0 else 0  # a second job on shared GPUs takes none of the free
        for i in nodes:
            self.free_gpus[i] -= take
            self.free_cores[i] -= c
            self.on_node[i].add(j)
            self.dirty_nodes.add(i)
            if self.p.check and (self.free_gpus[i] < 0 or self.free_cores[i] < 0):
                raise RuntimeError(
                    f"node {i} over-allocated by job {j}: {self.free_gpus[i]} GPUs and "
                    f"{self.free_cores[i]} cores free"
                )
        extra = self._place_start(j, gpu, gpn, c, nodes) if self.booking else None
        dur = float(self.t.duration_s[j])
        if gpu:
            asked = min(self._user_cores(j, gpn), self.max_cores)
            rate_trace = throughput_at(self._theta(j, gpn, k), asked, log_share=self.m.log_share)
            work = dur * rate_trace
            self.asked[j] = asked
        else:
            work = dur
            self.asked[j] = c
        run = _Run(
            job=j,
            gpu=gpu,
            nodes=tuple(nodes),
            cores=c,
            gpn=gpn,
            work_left=work,
            rate=0.0,
            last_s=now,
            limit_end_s=now + self.m.time_limit_factor * dur,
        )
        if extra is not None:
            run.speed, run.pcie_unit, run.pcie_heavy = extra
        if gpu:
            run.has_baseline = not any(
                not self.running[o].gpu for i in nodes for o in self.on_node[i] if o != j
            )
            if self.pol.profile:
                self._maybe_probe(run, now)
        self.running[j] = run
        if self.sharing and gpu and k == 1:
            self._share_start(run, host, now)
        self.start_s[j] = now
        self.cores_per_node[j] = c
        self.nodes_used[j] = k
        self.now_cores += c * k

    def _place_start(
        self, j: int, gpu: bool, gpn: int, c: int, nodes: list[int]
    ) -> tuple[float, bool, bool]:
        """Book job ``j``'s placement resources; (speed, holds pcie, PCIe-heavy)."""
        self.reserve_dirty = True
        if not gpu:
            for i in nodes:
                self.cpu_on[i] += c
                routed = self.p.reserve and c <= self.route_max_cores
                if self.p.check and routed and self.cpu_on[i] > self.cpu_cap[i]:
                    raise RuntimeError(
                        f"node {i}: CPU jobs hold {self.cpu_on[i]} cores, over the spare "
                        f"partition's MaxCPUsPerNode={self.cpu_cap[i]}"
                    )
            units = self._membw_units(j, c)
            if units:
                self.membw_held[j] = units
                for i in nodes:
                    self.free_membw[i] -= units
                    if self.p.check and self.free_membw[i] < 0:
                        raise RuntimeError(f"node {i}: membw GRES over-allocated by job {j}")
            return 1.0, False, False
        self.pending_cpg.pop(j, None)
        speed, unit, heavy = 1.0, False, False
        place = self.place
        if place is None:
            return speed, unit, heavy
        wid = int(self.wl.workload[j])
        if self.p.gpu_speed and place.types:
            types = self.node_type[nodes]
            known = types[types >= 0]
            if len(known):
                # Data-parallel steps wait for the slowest GPU.
                speed = float(place.speed[wid, known].min())
        if self.pcie_mark[j]:
            unit = True
            for i in nodes:
                self.free_pcie[i] -= 1
                if self.p.check and self.free_pcie[i] < 0:
                    raise RuntimeError(f"node {i}: pcie GRES over-allocated by job {j}")
        if self.p.pcie_interference and gpn >= 2 and place.pcie_heavy[wid]:
            heavy = True
            for i in nodes:
                self.heavy_on[i] += 1
        return speed, unit, heavy

    # -- GPU sharing (shard GRES) ---------------------------------------------------------
    def _find_share(
        self, j: int, need: tuple[bool, int, int, int], only: set[int] | None, avoid: frozenset[int]
    ) -> list[int] | None:
        """The node of a running job whose GPUs single-node job ``j`` may share now, or None:
        a job of as many GPUs on one node, sharing with no one, that may use ``shard`` too;
        ``j`` still needs its own cores there. Best fit as :meth:`_find`; the chosen job is
        left in :attr:`share_host` for :meth:`_start`."""
        _gpu, gpn, k, c = need
        hosts = self.hosts.get(gpn)
        if k != 1 or not hosts:
            return None
        spec = int(self.t.gpu_model[j])
        allowed = self.allowed[spec] if spec >= 0 else None
        best: tuple[int, int, int, int] | None = None
        cands: Iterable[int] = hosts
        if only is not None and len(only) < len(hosts):
            # Only a few nodes changed: look at their jobs rather than at every host.
            cands = sorted(r for i in only for r in self.on_node[i] if r in hosts)
        for h in cands:
            i = self.running[h].nodes[0]
            if (only is not None and i not in only) or i in avoid:
                continue
            if allowed is not None and not allowed[i]:
                continue
            want = c if c >= 0 else max(1, int(self.node_cores[i] // self.node_gpus[i]) * gpn)
            if self.free_cores[i] < want:
                continue
            key = (int(self.free_gpus[i]), int(self.free_cores[i]), i, h)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        self.share_host = best[3]
        return [best[2]]

    def _alone(self, run: _Run) -> tuple[float, float]:
        """(GPU busy share, iteration time) of ``run`` alone at its cores."""
        assert self.share_model is not None
        thr = throughput_at(self._theta(run.job, run.gpn, 1), run.cores, log_share=self.m.log_share)
        return self.share_model.alone(int(self.wl.workload[run.job]), run.gpn, thr)

    def _share_start(self, run: _Run, host: int, now: float) -> None:
        """Book single-node GPU job ``run``: paired with ``host`` (>= 0) on its GPUs, or, if
        it may share, offered as a host to later jobs."""
        assert self.share_model is not None
        j = run.job
        if host < 0:
            if self.share_ok[j]:
                self.hosts.setdefault(run.gpn, set()).add(j)
                self.share_new_nodes.add(run.nodes[0])
            if self.p.check:
                self._check_gpus(run.nodes[0])
            return
        h = self.running[host]
        if self.p.check and (
            h.partner >= 0 or h.gpn != run.gpn or h.nodes != run.nodes or not h.owner
        ):
            raise RuntimeError(
                f"job {j} shares the GPUs of job {host}, which is not a lone job of "
                f"{run.gpn} GPUs on node {run.nodes[0]}"
            )
        self.hosts[run.gpn].discard(host)
        h.partner, run.partner = j, host
        run.owner = False
        fh, fj = self.share_model.rate_factors(self._alone(h), self._alone(run))
        h.share_factor, run.share_factor = fh, fj
        h.pair_since_s = run.pair_since_s = now
        self.shared_jobs.update((host, j))
        self.dirty_nodes.add(run.nodes[0])  # the host's rate changes too
        if self.p.check:
            self._check_gpus(run.nodes[0])

    def _share_end(self, run: _Run, now: float) -> int:
        """Unbook ending single-node GPU job ``run`` from sharing; the GPUs it gives back
        (none while a partner still runs on them)."""
        self.hosts.get(run.gpn, set()).discard(run.job)
        if run.partner < 0:
            return run.gpn
        p = self.running[run.partner]
        dt = now - run.pair_since_s
        self.share_gpu_s += run.gpn * dt
        self.share_job_s += 2 * dt
        self.share_slow_job_s += (1.0 / run.share_factor + 1.0 / p.share_factor) * dt
        p.partner, p.share_factor = -1, 1.0  # back to its rate alone (node re-solved)
        if not p.owner:
            p.owner = True
            if p.version > 0:
                self.now_alloc += p.gpn
        if self.share_ok[p.job]:
            self.hosts.setdefault(p.gpn, set()).add(p.job)
        return 0

    def _check_gpus(self, i: int) -> None:
        """At most two jobs per GPU on node ``i``: each second job on the GPUs of a lone
        job of as many GPUs there, and the GPUs booked once."""
        held = 0
        for r in self.on_node[i]:
            run = self.running.get(r)
            if run is None or not run.gpu:
                continue
            if run.owner:
                held += run.gpn
                continue
            p = self.running.get(run.partner)
            if p is None or p.partner != r or not p.owner or p.gpn != run.gpn:
                raise RuntimeError(f"node {i}: job {r} shares GPUs with no lone owner")
        if held + int(self.free_gpus[i]) != int(self.node_gpus[i]):
            raise RuntimeError(
                f"node {i}: jobs hold {held} GPUs and {self.free_gpus[i]} are free, "
                f"of {self.node_gpus[i]}"
            )

    def _maybe_probe(self, run: _Run, now: float) -> None:
        j = run.job
        wid = int(self.wl.workload[j])
        name = self.wl.names[wid]
        sig = f"workload:{1000 + wid}:{name}"
        prof = self.profiles.get(sig)
        if (
            prof is not None
            and prof.confidence >= self.cfg.min_confidence
            and not is_censored(prof)
        ):
            return
        if len(run.nodes) != 1 or run.cores <= run.gpn or not self.p.probe.enabled:
            return
        # Admitted at its start, as coda-node admits a job at its first tick; it takes the
        # node's probe slot only when its warm-up is over, as coda-node's allocator does
        # (a job still warming up, or one that ends first, keeps no other job from it).
        run.probe_from_s = now
        self._push(now + WARMUP_S, 4, run.job, 0)

    def _probe_begin(self, j: int, now: float) -> None:
        """Job ``j``'s warm-up is over: it is probed if its node's probe slot is free, or
        else waits for it, as coda-node's allocator lets it."""
        run = self.running.get(j)
        if run is None:
            return
        node = run.nodes[0]
        if self.probing_on[node] >= self.p.probe.max_jobs:
            self.counters["probe_slot_busy"] += 1
            heapq.heappush(self.probe_waiting[node], j)
            return
        self._start_probe(j, run, now)

    def _slot_freed(self, node: int, now: float) -> None:
        """A probe on ``node`` is over: the waiting jobs take the slot by job order, as the
        allocator, which looks at a node's waiting jobs by job id, gives it."""
        waiting = self.probe_waiting[node]
        while waiting and self.probing_on[node] < self.p.probe.max_jobs:
            j = heapq.heappop(waiting)
            run = self.running.get(j)
            if run is None:
                continue  # ended while it waited
            # The probe's times count from the job's start with its warm-up first; this
            # job's warm-up ended when it began to wait, its probes begin now.
            run.probe_from_s = now - WARMUP_S
            self.counters["probe_slot_waited"] += 1
            self._start_probe(j, run, now)

    def _start_probe(self, j: int, run: _Run, now: float) -> None:
        node = run.nodes[0]
        wid = int(self.wl.workload[j])
        key = (wid, run.cores, run.gpn)
        pr = self.probe_memo.get(key)
        if pr is None:
            pr = self.probe_memo[key] = probe_run(
                theta_cores=self._theta(j, run.gpn, 1),
                allocated_cores=run.cores,
                gpus=run.gpn,
                params=self.p.probe,
                seed=hash(key) & 0xFFFF_FFFF,
                log_share=self.m.log_share,
            )
        self.counters["probed_jobs"] += 1
        run.probing = True
        self.probing_on[node] += 1
        # The work the probes cost: the job's end moves later by it.
        run.work_left -= run.rate * (now - run.last_s)
        run.last_s = now
        run.work_left += pr.lost_work_s
        run.version += 1
        self._push(now + max(0.0, run.work_left) / max(run.rate, 1e-9), 0, j, run.version)
        self._push(run.probe_from_s + pr.done_after_s, 2, j, 0)

    def _publish(self, j: int, now: float) -> None:
        run = self.running.get(j)
        if run is None or not run.probing:
            return
        run.probing = False
        self.probing_on[run.nodes[0]] -= 1
        wid = int(self.wl.workload[j])
        pr = self.probe_memo[(wid, run.cores, run.gpn)]
        self._merge(j, run.gpn, pr.samples, now)
        self._slot_freed(run.nodes[0], now)

    def _publish_ended(self, j: int, run: _Run, now: float) -> None:
        """``run`` ended while probed: what coda-node publishes for a job that ends then
        (the allocator's own ``ended_publication`` at the last sample before ``now``)."""
        wid = int(self.wl.workload[j])
        pr = self.probe_memo[(wid, run.cores, run.gpn)]
        since_s = now - run.probe_from_s
        samples: tuple[tuple[int, float], ...] = ()
        for at_s, partial in pr.partial:
            if at_s > since_s:
                break
            samples = partial
        if samples:
            self.counters["profiles_published_ended"] += 1
        self._merge(j, run.gpn, samples, now)

    def _merge(self, j: int, gpn: int, samples: tuple[tuple[int, float], ...], now: float) -> None:
        if not samples:
            return
        wid = int(self.wl.workload[j])
        name = self.wl.names[wid]
        sig = f"workload:{1000 + wid}:{name}"
        cur = self.profiles.get(sig) or Profile(
            signature=sig,
            workload=name,
            cpus_per_gpu=1,
            confidence=0.0,
            n_samples=0,
            updated_unix_s=now,
            source="coda-node",
        )
        added = tuple(Sample(float(c), float(y), gpn, 1, run=f"sim:{j}") for c, y in samples)
        merged = replace(
            cur,
            samples=(cur.samples + added)[-64:],
            n_samples=cur.n_samples + len(added),
            updated_unix_s=now,
        )
        prof = refit_profile(merged)
        self.profiles[sig] = prof
        self.views[sig] = to_view(prof)
        self.decided = {k: v for k, v in self.decided.items() if k[0] != wid}
        self.counters["profiles_published"] += 1

    def _finish(self, j: int, now: float) -> None:
        run = self.running.pop(j)
        if run.probing:
            self._publish_ended(j, run, now)
        # Shared GPUs stay with the partner: they are freed when both jobs have ended.
        gpus_back = run.gpn
        if self.sharing and run.gpu and len(run.nodes) == 1:
            gpus_back = self._share_end(run, now)
        for i in run.nodes:
            self.free_gpus[i] += gpus_back
            self.free_cores[i] += run.cores
            self.on_node[i].discard(j)
            self.dirty_nodes.add(i)
            if run.probing:
                self.probing_on[i] -= 1
        if self.booking:
            self.reserve_dirty = True
            membw = self.membw_held.pop(j, 0)
            for i in run.nodes:
                if not run.gpu:
                    self.cpu_on[i] -= run.cores
                    self.free_membw[i] += membw
                if run.pcie_unit:
                    self.free_pcie[i] += 1
                if run.pcie_heavy:
                    self.heavy_on[i] -= 1
        self.end_s[j] = now
        self.now_cores -= run.cores * len(run.nodes)
        if run.gpu:
            if run.owner:
                self.now_alloc -= run.gpn * len(run.nodes)
            self.now_eff -= run.gpn * len(run.nodes) * run.rate
        if run.probing:
            self._slot_freed(run.nodes[0], now)

    # -- rates -------------------------------------------------------------------------------
    def _resolve(self, now: float) -> None:
        """Re-solve the nodes whose jobs changed and re-time the jobs on them."""
        if not self.dirty_nodes:
            return
        touched: set[int] = set()
        for i in self.dirty_nodes:
            jobs = self.on_node[i]
            touched |= jobs
            dnn = [self.running[r] for r in jobs if self.running[r].gpu]
            cpu = [self.running[r] for r in jobs if not self.running[r].gpu]
            if not cpu:
                for r in dnn:
                    r.has_baseline = True
            if not dnn or not cpu or not self.pol.contention:
                for r in cpu:
                    r.share = 1.0
                self._node_slow[i] = {r.job: 0.0 for r in dnn}
                if self.pcie_on and self.heavy_on[i] > self.m.pcie_domains_per_node:
                    self._pcie_slow(i)
                continue
            # Canonical order, so equal mixes on different nodes share one settle.
            # Only the price test reads a job's GPUs: without it, mixes that differ in GPUs
            # alone share one settle.
            gpus = {r.job: r.gpn * len(r.nodes) if self._priced else 0 for r in dnn}
            dnn.sort(key=lambda r: (self._sensitivity(r), r.has_baseline, gpus[r.job], r.job))
            cpu.sort(key=lambda r: (r.cores, float(self.wl.cpu_bw_per_core[r.job]), r.job))
            mix = NodeMix(
                dnn=tuple((self._sensitivity(r), r.has_baseline) for r in dnn),
                cpu=tuple((r.cores, float(self.wl.cpu_bw_per_core[r.job])) for r in cpu),
                node_bw_bytes_per_s=self.m.node_mem_bw_bytes_per_s,
                exponent=self.m.pressure_exponent,
                rdt=self.p.rdt,
                dnn_gpus=tuple(gpus[r.job] for r in dnn) if self._priced else (),
            )
            raw = slowdowns(mix, [1.0] * len(cpu))
            # The eliminator acts only for a job slowed past its trigger that has a
            # baseline to compare with, or will get one from a baseline probe; otherwise
            # its outcome is known without ticking it.
            probes = self.contention.baseline_probe_after_s > 0
            acts = any(
                s > self.contention.trigger_slowdown and (has or probes)
                for s, (_, has) in zip(raw, mix.dnn, strict=True)
            )
            if self.pol.shield and acts:
                self.counters["shield_lookups"] += 1
                got = self.shield(mix)
                for r, q in zip(cpu, got.cpu_share, strict=True):
                    r.share = q
                slow = got.dnn_slowdown
                for r, extra in zip(dnn, got.dnn_transient_s, strict=True):
                    r.work_left += extra * self._base_rate(r)
            else:
                for r in cpu:
                    r.share = 1.0
                slow = raw
            self._node_slow[i] = {r.job: s for r, s in zip(dnn, slow, strict=True)}
            if self.pcie_on and self.heavy_on[i] > self.m.pcie_domains_per_node:
                self._pcie_slow(i)
        self.dirty_nodes.clear()
        for j in touched:
            run = self.running[j]
            if run.gpu:
                slow = max(self._node_slow[i].get(j, 0.0) for i in run.nodes)
                rate = self._base_rate(run) * (1.0 - slow) * run.share_factor
            else:
                rate = run.share
            if rate != run.rate or run.version == 0:
                run.work_left -= run.rate * (now - run.last_s)
                run.last_s = now
                if run.gpu:
                    w = run.gpn * len(run.nodes)
                    self.now_eff += w * (rate - run.rate)
                    if run.version == 0 and run.owner:
                        self.now_alloc += w
                run.rate = rate
                run.version += 1
                self.counters["rate_changes"] += 1
                end = now + max(0.0, run.work_left) / max(rate, 1e-9)
                self._push(end, 0, j, run.version)
            else:
                run.work_left -= run.rate * (now - run.last_s)
                run.last_s = now

    def _pcie_slow(self, i: int) -> None:
        """More PCIe-heavy multi-GPU jobs than PCIe domains on node ``i``: each of them
        slows by ``pcie_slowdown`` on top of its memory-bandwidth slowdown (CODA §II.C)."""
        slow = self._node_slow[i]
        keep = 1.0 - self.m.pcie_slowdown
        for r in self.on_node[i]:
            if self.running[r].pcie_heavy:
                slow[r] = 1.0 - (1.0 - slow.get(r, 0.0)) * keep
                self.pcie_slowed.add(r)

    def _sensitivity(self, run: _Run) -> float:
        k = self.wl.klass[self.wl.workload[run.job]]
        return float(self.wl.sensitivity[k, _bucket(run.gpn)])

    def _base_rate(self, run: _Run) -> float:
        return run.speed * throughput_at(
            self._theta(run.job, run.gpn, len(run.nodes)), run.cores, log_share=self.m.log_share
        )

    # -- the scheduler -------------------------------------------------------------------------
    def _schedule(self, now: float, freed: set[int]) -> None:
        gpu_resv_before = self.resv[True]
        find = self._find_placed if self.constrained else self._find
        if self.sharing and self.share_new_nodes:
            # A job that may host started there: a waiting job may share its GPUs now.
            freed = freed | self.share_new_nodes
            self.share_new_nodes = set()
        for gpu in (True, False):
            q = self.q[gpu]
            if not q:
                continue
            retry_all = not gpu and (self.resv[True] is not gpu_resv_before or self.cpu_retry)
            resv = self.resv[gpu]
            if resv is not None and freed & resv[1]:
                # Its nodes freed up: re-plan the reservation (it may move).
                self.resv[gpu] = self._reserve(resv[0], self.needs[resv[0]], now)
                retry_all = True
            window = [q.popleft() for _ in range(min(self.p.bf_window, len(q)))]
            keep: list[int] = []
            for j in window:
                resv = self.resv[gpu]
                is_head = resv is not None and resv[0] == j
                new = retry_all or j not in self.tried
                if not (new or freed or is_head):
                    keep.append(j)  # nothing changed that could let it start
                    continue
                self.tried.add(j)
                need = self.needs[j]
                only = None if new or is_head else freed
                limit_s = self.m.time_limit_factor * float(self.t.duration_s[j])
                avoid = frozenset() if gpu else self._gpu_head_cores(need[3], now + limit_s)
                if resv is None or is_head:
                    nodes = find(j, need, only, avoid)
                else:
                    nodes = find(j, need, only, resv[1] | avoid)
                    if nodes is None and now + limit_s <= resv[2]:
                        nodes = find(j, need, only, avoid)
                if nodes is None and self.sharing and self.share_ok[j]:
                    # Only a job that would otherwise wait shares, under the same
                    # reservation rule as any other placement.
                    if resv is None or is_head:
                        nodes = self._find_share(j, need, only, avoid)
                    else:
                        nodes = self._find_share(j, need, only, resv[1] | avoid)
                        if nodes is None and now + limit_s <= resv[2]:
                            nodes = self._find_share(j, need, only, avoid)
                if nodes is not None:
                    self._start(j, need, nodes, now)
                    self.tried.discard(j)
                    del self.needs[j]
                    if is_head:
                        self.resv[gpu] = None
                        retry_all = True  # the jobs behind it may use those nodes now
                    continue
                keep.append(j)
                if self.resv[gpu] is None:
                    self.resv[gpu] = self._reserve(j, need, now)
            q.extendleft(reversed(keep))
        self.cpu_retry = False

    def _gpu_head_cores(self, cores: int, end_s: float) -> frozenset[int]:
        """Nodes reserved for the first waiting GPU job where a CPU job of ``cores`` ending
        (by its limit) at ``end_s`` would take cores that job needs: backfill plans across
        partitions that share nodes, so CPU jobs must not delay the GPU job either."""
        resv = self.resv[True]
        if resv is None or end_s <= resv[2]:
            return frozenset()
        head = self.needs.get(resv[0])
        if head is None:
            return frozenset()
        _gpu, gpn, _k, c = head
        out = []
        for i in resv[1]:
            want = c if c >= 0 else int(self.node_cores[i] // self.node_gpus[i]) * gpn
            if self.free_cores[i] - cores < want:
                out.append(i)
        return frozenset(out)

    # -- coda-slurm reserve ----------------------------------------------------------------
    def _pend(self, j: int, need: tuple[bool, int, int, int]) -> None:
        """Queue GPU job ``j``'s cores per GPU for reserve's expected demand."""
        _gpu, gpn, _k, c = need
        if c < 0:  # even: a node's cores over its GPUs (the largest node shape's)
            c = self.max_cores // self.max_gpn * gpn
        self.pending_cpg[j] = c / gpn
        self.reserve_dirty = True

    def _reserve_tick(self, now: float) -> None:
        """One pass of ``coda-slurm reserve``: every spare partition's MaxCPUsPerNode from
        the product's :func:`spare_cpus_by_shape`; CPU jobs retry when a cap rose."""
        if self.reserve_dirty:
            self.reserve_dirty = False
            self.counters["reserve_updates"] = self.counters.get("reserve_updates", 0) + 1
            gpu_job_cores = self.node_cores - self.free_cores - self.cpu_on
            caps = spare_cpus_by_shape(
                self.shape_nodes,
                self.node_cores,
                self.node_gpus,
                self.free_gpus,
                gpu_job_cores,
                list(self.pending_cpg.values()),
                self.p.reserve_cpus_per_gpu,
                self.p.reserve_min_cpus,
            )
            new = np.array(caps, dtype=np.int64)[self.node_shape]
            if np.any(new > self.cpu_cap):
                self.cpu_retry = True
            self.cpu_cap = new
        if now < self.last_submit_s or self.running or self.needs:
            self._push(now + self.p.reserve_interval_s, 3, -1, 0)

    def _push(self, t: float, kind: int, j: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, j, version))

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        submit = self.t.submit_s
        gpus = self.t.gpus
        n = len(self.t)
        ptr = 0
        finished = 0
        heap = self.heap
        if self.p.reserve and n:
            self._push(float(submit[0]), 3, -1, 0)
        while ptr < n or heap:
            t_arr = float(submit[ptr]) if ptr < n else math.inf
            t_ev = heap[0][0] if heap else math.inf
            now = min(t_arr, t_ev)
            self._advance(now)
            freed: set[int] = set()
            # Everything that happens at ``now``: ends first, then publishes, then arrivals.
            while heap and heap[0][0] <= now:
                _, kind, _, j, version = heapq.heappop(heap)
                self.counters["events"] += 1
                if kind == 0:
                    run = self.running.get(j)
                    if run is None or run.version != version:
                        continue
                    freed.update(run.nodes)
                    self._finish(j, now)
                    finished += 1
                    if self.progress is not None:
                        self.progress(1)
                elif kind == 3:
                    self._reserve_tick(now)
                elif kind == 4:
                    self._probe_begin(j, now)
                else:
                    self._publish(j, now)
            while ptr < n and float(submit[ptr]) <= now:
                # The hook decides at submission: the cores are fixed from here on.
                need = self._need(ptr)
                self.counters["events"] += 1
                if self._feasible(ptr, need):
                    self.needs[ptr] = need
                    self.q[bool(gpus[ptr] > 0)].append(ptr)
                    if self.reserve_on and need[0]:
                        self._pend(ptr, need)
                else:
                    self.counters["rejected"] += 1
                ptr += 1
            self._schedule(now, freed)
            self._resolve(now)
        self.counters["finished"] = finished


def _bucket(gpn: int) -> int:
    return 0 if gpn <= 1 else (1 if gpn < 4 else 2)


def simulate(
    trace: Trace,
    nodes: list[NodeSpec],
    wl: Workloads,
    model: JobModel,
    policy: Policy,
    params: SimParams | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Replay ``trace`` on ``nodes`` under ``policy``; deterministic for the same inputs."""
    p = params or SimParams()
    t0 = time.perf_counter()
    sim = _Sim(trace, nodes, wl, model, policy, p, progress)
    sim.run()
    wall = time.perf_counter() - t0
    edges = np.linspace(sim.w0, sim.horizon, sim.bins + 1)
    sim.counters["shield_settles"] = sim.shield.settles
    if p.pcie_interference or p.pcie_spread:
        sim.counters["pcie_marked_jobs"] = int(sim.pcie_mark.sum())
        sim.counters["pcie_slowed_jobs"] = len(sim.pcie_slowed)
    if p.membw_spread:
        sim.counters["membw_marked_jobs"] = sum(
            1 for j in np.flatnonzero(sim.membw_known) if sim._membw_units(j, 1)
        )
    if p.gpu_prefer:
        sim.counters["prefer_jobs"] = int(np.count_nonzero(sim.prefer >= 0))
    if p.gpu_share:
        sim.counters["share_eligible_jobs"] = int(sim.share_ok.sum())
        sim.counters["share_jobs"] = len(sim.shared_jobs)
        sim.counters["share_gpu_s"] = round(sim.share_gpu_s)
        # Mean over the time jobs spent shared of T'/T (iteration time shared over alone).
        mean = sim.share_slow_job_s / sim.share_job_s if sim.share_job_s else 0.0
        sim.counters["share_slowdown_x1000"] = round(1000 * mean)
    return RunResult(
        policy=policy.name,
        start_s=sim.start_s,
        end_s=sim.end_s,
        cores_per_node=sim.cores_per_node,
        nodes_used=sim.nodes_used,
        asked_cores_per_node=sim.asked,
        horizon_s=sim.horizon - sim.w0,
        bin_edges_s=edges,
        alloc_gpu_s=sim.alloc_gpu_s,
        effective_gpu_s=sim.eff_gpu_s,
        busy_core_s=sim.core_s,
        total_gpus=int(sim.node_gpus.sum()),
        total_cores=int(sim.node_cores.sum()),
        events=sim.counters["events"],
        wall_s=wall,
        counters=dict(sim.counters),
    )
