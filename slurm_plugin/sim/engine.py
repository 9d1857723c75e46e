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
reads for every later job. ``SimParams.starter_table`` puts global profiles in that store
before the run, which the hook takes as priors for the jobs that name their model
(``JobModel.script_names_model``) until their own profile is confident.

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

**Layout.** :class:`_Sim` runs the loop and each job's submission, start and end; the rooms
it drives: :mod:`~slurm_plugin.sim.params` (what a run is asked),
:mod:`~slurm_plugin.sim.events` (the clock), :mod:`~slurm_plugin.sim.nodes` (the nodes'
books, placement, reservations), :mod:`~slurm_plugin.sim.scheduler` (backfill),
:mod:`~slurm_plugin.sim.booking` (the mechanisms' books and reserve),
:mod:`~slurm_plugin.sim.sharing` (``shard`` GRES), :mod:`~slurm_plugin.sim.rates`
(progress rates), :mod:`~slurm_plugin.sim.profiling` (probing, the profile store, the hook's
decision) and :mod:`~slurm_plugin.sim.accounting` (utilisation).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coda_common.config.codaconf import parse_config
from coda_common.model.curves import throughput_at
from coda_common.slurm.slurmconf import NodeShape
from coda_node.policy.contention import params_from_config
from slurm_plugin.config.nodecap import NodeCap
from slurm_plugin.sim.accounting import Utilisation
from slurm_plugin.sim.booking import MechanismBooks
from slurm_plugin.sim.events import END, PROBE_BEGIN, RESERVE, EventQueue
from slurm_plugin.sim.nodes import Need, Nodes, Run
from slurm_plugin.sim.params import CODA_CONF, POLICIES, Policy, SimParams
from slurm_plugin.sim.profiling import WARMUP_S, OnlineProfiling, probe_run
from slurm_plugin.sim.rates import Rates
from slurm_plugin.sim.scheduler import Backfill
from slurm_plugin.sim.sharing import GpuSharing
from slurm_plugin.sim.traces import NodeSpec, Trace
from slurm_plugin.sim.workloads import JobModel, Workloads

__all__ = [
    "CODA_CONF",
    "POLICIES",
    "WARMUP_S",
    "Policy",
    "RunResult",
    "SimParams",
    "probe_run",
    "simulate",
]


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
    work_s: np.ndarray
    """Each GPU job's work as it started, in seconds at full speed (its run time in the
    trace times its rate there); NaN for CPU jobs and jobs that never started."""
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


COUNTERS = (
    "events",
    "rate_changes",
    "probed_jobs",
    "profiles_published",
    "profiles_published_ended",
    "probe_slot_busy",
    "probe_slot_waited",
    "multi_node_measured",
    "multi_node_figures",
    "shield_lookups",
    "decide_calls",
    "capped_requests",
    "rejected",
)
"""What a run counts (``--json``'s ``counters``), each from 0."""


class _Sim:
    """One run: the event loop, each job's submission, start and end; the rest in its rooms."""

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
        self.nodes = Nodes(trace, nodes)
        self.running = self.nodes.running
        n = len(trace)
        self.start_s = np.full(n, np.nan)
        self.end_s = np.full(n, np.nan)
        self.cores_per_node = np.zeros(n, dtype=np.int32)
        self.asked = np.zeros(n, dtype=np.int32)
        self.work_s = np.full(n, np.nan)
        self.nodes_used = np.zeros(n, dtype=np.int32)
        self.finished = 0
        self.events = EventQueue()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.use = Utilisation(trace, params.utilisation_bins)
        self._init_controller()
        self.books = MechanismBooks(self.nodes, nodes, wl, model, params, self.counters)
        self.rates = Rates(
            self.nodes,
            wl,
            model,
            policy,
            params,
            self.contention,
            self.books,
            self.use,
            self.events,
            self.counters,
        )
        self.sharing = GpuSharing(self.nodes, wl, model, params, self.use, self.rates.dirty)
        self.nodes.sharing = self.sharing.on
        self.sched = Backfill(
            self.nodes, self.books, self.sharing, self._limit_s, params.bf_window, self._start
        )

    def _init_controller(self) -> None:
        """CODA's controller side: the hook's coda.conf, the node shapes it reads, the
        eliminator's settings, and the profiling that publishes what the hook reads."""
        params = self.p
        self.cfg, _ = parse_config("\n".join(params.coda_conf), source="coda policy settings")
        nd = self.nodes
        shapes = tuple(
            NodeShape(str(i), int(c), int(g))
            for i, (c, g) in enumerate(zip(nd.node_cores, nd.node_gpus, strict=True))
        )
        self.node_cap = NodeCap(shapes, "the simulated nodes")
        self.node_share = self.node_cap.share
        self.contention = params.contention or params_from_config(
            self.cfg, membw_spread=params.membw_spread
        )
        self.profiling = OnlineProfiling(
            self.wl,
            self.m,
            params.probe,
            self.cfg,
            self.node_cap,
            nd.running,
            self.events,
            self.counters,
            multi_node_measured=params.multi_node_measured,
        )
        if params.starter_table:
            self.profiling.import_table(params.starter_table, 0.0)
        self.profiles = self.profiling.profiles
        self.views = self.profiling.views
        self.probe_memo = self.profiling.probe_memo

    # -- what a job asks ---------------------------------------------------------------------
    def _limit_s(self, j: int) -> float:
        """Job ``j``'s time limit."""
        return self.m.time_limit_factor * float(self.t.duration_s[j])

    def _gpn_nodes(self, j: int) -> tuple[int, int]:
        g = int(self.t.gpus[j])
        k = max(int(self.t.nodes[j]), -(-g // self.nodes.max_gpn))
        while g % k and k < g:
            k += 1  # GPUs spread evenly over whole nodes
        return g // k, k

    def _theta(self, j: int, gpn: int, k: int) -> float:
        return self.wl.sweet_spot(j, gpn, k, self.m)

    def _user_cores(self, j: int, gpn: int) -> int:
        return max(1, math.ceil(self.wl.user_cpus_per_gpu[j] * gpn))

    def _cores(self, j: int, gpn: int, k: int) -> int:
        """Cores per node the policy gives GPU job ``j`` (not ``even``'s: per node)."""
        how = self.pol.cores
        if how == "user":
            return self._user_cores(j, gpn)
        if how == "fixed":
            return self.p.fixed_cpus_per_gpu * gpn
        if how == "oracle":
            return self._best_cores(j, gpn, k)
        return self.profiling.coda_cores(j, gpn, k)

    def _best_cores(self, j: int, gpn: int, k: int) -> int:
        """Job ``j``'s sweet spot per node, or the most a node that could hold it has when
        that is fewer: the oracle gives a job the best it can have, never a request Slurm
        would refuse (an 8-GPU job whose sweet spot is beyond every 8-GPU node's cores
        runs with all of a node's cores)."""
        best = max(1, math.ceil(self._theta(j, gpn, k)))
        most = self.nodes.most_cores(j, gpn, k)
        return min(best, most) if most > 0 else best

    def _need(self, j: int) -> Need:
        """What job ``j`` asks, as the hook leaves it at submission."""
        g = int(self.t.gpus[j])
        max_cores = self.nodes.max_cores
        if g == 0:
            c = int(self.t.cpus[j]) if self.t.cpus[j] > 0 else 1
            if c > max_cores:
                self.counters["capped_requests"] += 1
                c = max_cores
            self.books.route_check(c)
            return False, 0, 1, c
        gpn, k = self._gpn_nodes(j)
        if self.books.place is not None:
            self.books.mark(j, gpn)
        if self.pol.cores == "even":
            if self.sharing.on and k == 1:
                self.sharing.mark(j, gpn, max_cores // self.nodes.max_gpn * gpn)
            return True, gpn, k, -1
        c = min(self._cores(j, gpn, k), max_cores)
        if self.sharing.on and k == 1:
            self.sharing.mark(j, gpn, c)
        return True, gpn, k, c

    # -- starting and finishing ------------------------------------------------------------
    def _start(self, j: int, need: Need, nodes: list[int], now: float) -> None:
        gpu, gpn, k, c = need
        nd = self.nodes
        if c < 0:
            c = min(nd.even_cores(i, gpn) for i in nodes)
        host = self.sharing.take_host() if self.sharing.on else -1
        take = gpn if host < 0 else 0  # a second job on shared GPUs takes none of the free
        for i in nodes:
            nd.free_gpus[i] -= take
            nd.free_cores[i] -= c
            nd.on_node[i].add(j)
            self.rates.dirty.add(i)
            if self.p.check and (nd.free_gpus[i] < 0 or nd.free_cores[i] < 0):
                raise RuntimeError(
                    f"node {i} over-allocated by job {j}: {nd.free_gpus[i]} GPUs and "
                    f"{nd.free_cores[i]} cores free"
                )
        extra = self.books.start(j, gpu, gpn, c, nodes) if self.books.on else None
        run = self._run(j, gpu, gpn, k, c, nodes, now)
        if extra is not None:
            run.speed, run.pcie_unit, run.pcie_heavy = extra
        if gpu:
            run.has_baseline = not any(
                not self.running[o].gpu for i in nodes for o in nd.on_node[i] if o != j
            )
            if self.pol.profile:
                self.profiling.admit(run, now)
        self.running[j] = run
        if self.sharing.on and gpu and k == 1:
            self.sharing.start(run, host, now)
        self.start_s[j] = now
        self.cores_per_node[j] = c
        self.nodes_used[j] = k
        self.use.now_cores += c * k

    def _run(
        self, j: int, gpu: bool, gpn: int, k: int, c: int, nodes: list[int], now: float
    ) -> Run:
        """Job ``j`` as it starts: its work is its run time in the trace at the rate it ran
        there (a DNN job: its curve at the cores its user asked for)."""
        dur = float(self.t.duration_s[j])
        if gpu:
            asked = min(self._user_cores(j, gpn), self.nodes.max_cores)
            rate_trace = throughput_at(self._theta(j, gpn, k), asked, log_share=self.m.log_share)
            work = dur * rate_trace
            self.asked[j] = asked
            self.work_s[j] = work
        else:
            work = dur
            self.asked[j] = c
        return Run(
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

    def _finish(self, j: int, now: float) -> None:
        run = self.running.pop(j)
        if run.probing:
            self.profiling.publish_ended(j, run, now)
        if run.gpu and len(run.nodes) > 1 and self.pol.profile:
            self.profiling.multi_node_ended(run, now - float(self.start_s[j]), now)
        # Shared GPUs stay with the partner: they are freed when both jobs have ended.
        gpus_back = run.gpn
        if self.sharing.on and run.gpu and len(run.nodes) == 1:
            gpus_back = self.sharing.end(run, now)
        nd = self.nodes
        for i in run.nodes:
            nd.free_gpus[i] += gpus_back
            nd.free_cores[i] += run.cores
            nd.on_node[i].discard(j)
            self.rates.dirty.add(i)
            if run.probing:
                self.profiling.probing_on[i] -= 1
        if self.books.on:
            self.books.end(j, run.gpu, run.cores, run.nodes, run.pcie_unit, run.pcie_heavy)
        self.end_s[j] = now
        use = self.use
        use.now_cores -= run.cores * len(run.nodes)
        if run.gpu:
            if run.owner:
                use.now_alloc -= run.gpn * len(run.nodes)
            use.now_eff -= run.gpn * len(run.nodes) * run.rate
        if run.probing:
            self.profiling.ended(run, now)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        submit = self.t.submit_s
        n = len(self.t)
        ptr = 0
        events = self.events
        if self.p.reserve and n:
            events.push(float(submit[0]), RESERVE, -1, 0)
        while ptr < n or events:
            t_arr = float(submit[ptr]) if ptr < n else math.inf
            t_ev = events.next_s() if events else math.inf
            now = min(t_arr, t_ev)
            self.use.advance(now)
            # Everything that happens at ``now``: ends first, then publishes, then arrivals.
            freed = self._events_at(now)
            while ptr < n and float(submit[ptr]) <= now:
                self._arrive(ptr)
                ptr += 1
            self.sched.schedule(now, freed)
            self.rates.resolve(now)
        self.counters["finished"] = self.finished

    def _events_at(self, now: float) -> set[int]:
        """Handle every event due by ``now``; the nodes where jobs ended."""
        events = self.events
        freed: set[int] = set()
        while events and events.next_s() <= now:
            _, kind, _, j, version = events.pop()
            self.counters["events"] += 1
            if kind == END:
                run = self.running.get(j)
                if run is None or run.version != version:
                    continue
                freed.update(run.nodes)
                self._finish(j, now)
                self.finished += 1
                if self.progress is not None:
                    self.progress(1)
            elif kind == RESERVE:
                self._reserve_tick(now)
            elif kind == PROBE_BEGIN:
                self.profiling.probe_begin(j, now)
            else:
                self.profiling.publish(j, now)
        return freed

    def _arrive(self, j: int) -> None:
        """Job ``j`` is submitted: the hook decides now, the cores are fixed from here on."""
        need = self._need(j)
        self.counters["events"] += 1
        if self.nodes.feasible(j, need):
            self.sched.submit(j, need, bool(self.t.gpus[j] > 0))
            if self.books.reserve_on and need[0]:
                self.books.pend(j, need)
        else:
            self.counters["rejected"] += 1

    def _reserve_tick(self, now: float) -> None:
        """``coda-slurm reserve`` runs; again in ``reserve_interval_s`` while there is work."""
        self.books.reserve_pass()
        if now < self.books.last_submit_s or self.running or self.sched.needs:
            self.events.push(now + self.p.reserve_interval_s, RESERVE, -1, 0)

    def result(self, wall_s: float) -> RunResult:
        """What the run gives back; ``wall_s``: how long it took."""
        counters = self.counters
        counters["shield_settles"] = self.rates.shield.settles
        counters.update(self.books.counters_at_end())
        if self.p.gpu_share:
            counters.update(self.sharing.counters())
        nd = self.nodes
        return RunResult(
            policy=self.pol.name,
            start_s=self.start_s,
            end_s=self.end_s,
            cores_per_node=self.cores_per_node,
            nodes_used=self.nodes_used,
            asked_cores_per_node=self.asked,
            work_s=self.work_s,
            horizon_s=self.use.horizon - self.use.w0,
            bin_edges_s=self.use.edges_s(),
            alloc_gpu_s=self.use.alloc_gpu_s,
            effective_gpu_s=self.use.eff_gpu_s,
            busy_core_s=self.use.core_s,
            total_gpus=int(nd.node_gpus.sum()),
            total_cores=int(nd.node_cores.sum()),
            events=counters["events"],
            wall_s=wall_s,
            counters=dict(counters),
        )


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
    return sim.result(time.perf_counter() - t0)
