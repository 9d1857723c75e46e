"""Online profiling of a simulated job: coda-node's own allocator, ticked.

:func:`probe_run` drives :class:`coda_node.policy.allocator.Allocator` over one job whose true
throughput curve is known, from the end of its warm-up until the allocator publishes (or
gives up), with a small measurement noise. It returns what the daemon would publish and what
probing cost the job: the work it did not do while running below its allocation; and, for
a job that ends before the allocator is done, what it would publish when it ends at each
moment (:func:`coda_node.policy.allocator.ended_publication`, asked after every new sample).

:class:`OnlineProfiling` is the cluster's side of it in a simulator run: each node's probe
slot, the in-memory profile store the probed jobs publish to, and the submit hook's own
:func:`slurm_plugin.decision.decide.decide` reading that store for every later GPU job;
with ``multi_node_measured``, also the job summaries each node of a multi-node job writes
when the job leaves it and the per-node figures they give the job's profile
(:meth:`OnlineProfiling.multi_node_ended`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np

from coda_common.config.codaconf import CodaConfig
from coda_common.model.curves import throughput_at
from coda_common.model.fit import is_censored, refit_profile
from coda_common.model.starter import STARTER_CONFIDENCE, STARTER_SOURCE
from coda_common.store.jobsummary import JobSummary, gpus_waiting
from coda_common.store.multinode import merge_figure
from coda_common.store.multinode_merge import multi_node_figure
from coda_common.store.profiles import Profile, Sample, to_view
from coda_node.policy.allocator import Allocator, ProbeJob, ProbeParams, ended_publication
from coda_node.policy.observe import Progress, SignalParams
from slurm_plugin.config.nodecap import NodeCap
from slurm_plugin.decision.decide import JobRequest, ProfileView, decide
from slurm_plugin.sim.events import END, PROBE_BEGIN, PUBLISH, EventQueue
from slurm_plugin.sim.nodes import Run
from slurm_plugin.sim.workloads import JobModel, Workloads

WARMUP_S = SignalParams().warmup_s
"""coda-node probes a job only after its warm-up: the probe slot is taken from then."""


@dataclass(frozen=True, slots=True)
class ProbeRun:
    samples: tuple[tuple[int, float], ...]
    """(cores on the node, throughput as % of the run's plateau) to publish; empty when
    the allocator published nothing."""
    done_after_s: float
    """Seconds from the job's start until the allocator finished (warm-up included)."""
    lost_work_s: float
    """Seconds of full-allocation progress the job lost while probed."""
    probes: int
    sweet_spot_cores: int | None
    confidence: float | None
    partial: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] = ()
    """(seconds from the job's start, samples): what the job publishes if it ends from then
    on, before ``done_after_s``; in time order. Empty before two core counts are measured."""


def probe_run(
    *,
    theta_cores: float,
    allocated_cores: int,
    gpus: int,
    params: ProbeParams,
    seed: int,
    log_share: float = 0.3,
    noise_rel: float = 0.02,
    tick_s: float = 10.0,
    warmup_s: float = WARMUP_S,
    max_s: float = 4 * 3600.0,
) -> ProbeRun:
    """Profile a job with sweet spot ``theta_cores`` on ``allocated_cores`` (see module)."""
    rng = np.random.default_rng(seed)
    alloc = Allocator(params)
    full = throughput_at(theta_cores, allocated_cores, log_share=log_share)
    now = warmup_s
    lost = 0.0
    cores = allocated_cores
    partial: list[tuple[float, tuple[tuple[int, float], ...]]] = []
    measured = 0
    while now < warmup_s + max_s:
        true = throughput_at(theta_cores, cores, log_share=log_share)
        rate = 100.0 * true * (1.0 + noise_rel * float(rng.standard_normal()))
        prog = Progress(rate=rate, source="iterations", phase="train", age_s=now, level=rate)
        job = ProbeJob(
            job_id=1,
            signature="workload:0:sim",
            gpus=gpus,
            allocated_cores=allocated_cores,
            single_node=True,
            progress=prog,
        )
        out = alloc.step(now, {1: job})
        lost += max(0.0, full - true) * tick_s
        cores = out.cores.get(1, allocated_cores)
        rec = alloc.records[1]
        if rec.state in ("done", "skipped"):
            pub = out.publish[0] if out.publish else None
            return ProbeRun(
                samples=pub.samples if pub else (),
                done_after_s=now,
                lost_work_s=lost,
                probes=rec.probes,
                sweet_spot_cores=rec.result.cores if rec.result else None,
                confidence=rec.result.confidence if rec.result else None,
                partial=tuple(partial),
            )
        if len(rec.samples) != measured:
            measured = len(rec.samples)
            ended = ended_publication(job, rec, params)
            if ended is not None:
                partial.append((now, ended.samples))
        now += tick_s
    return ProbeRun((), now, lost, alloc.records[1].probes, None, None, tuple(partial))


class OnlineProfiling:
    """coda-node's profiling and the hook's decision over one simulated cluster."""

    def __init__(
        self,
        wl: Workloads,
        model: JobModel,
        probe: ProbeParams,
        cfg: CodaConfig,
        node_cap: NodeCap,
        running: dict[int, Run],
        events: EventQueue,
        counters: dict[str, int],
        *,
        multi_node_measured: bool = False,
    ) -> None:
        self.wl = wl
        self.m = model
        self.probe = probe
        self.cfg = cfg
        self.node_cap = node_cap
        self.node_share = node_cap.share
        self.running = running
        self.events = events
        self.counters = counters
        n_nodes = len(node_cap.nodes)
        self.probing_on: list[int] = [0] * n_nodes
        self.probe_waiting: list[list[int]] = [[] for _ in range(n_nodes)]
        """Per node, a heap of the jobs past their warm-up that wait for its probe slot."""
        self.profiles: dict[str, Profile] = {}
        self.views: dict[str, ProfileView] = {}
        self.decided: dict[tuple[int, int, int, int], tuple[int, str | None]] = {}
        """Per (workload, GPUs per node, nodes, user's cores per GPU): the hook's cores per
        node and its admin record."""
        self.probe_memo: dict[tuple[int, int, int], ProbeRun] = {}
        self.multi_node_measured = multi_node_measured
        self.job_record: dict[int, str | None] = {}
        """Per multi-node job (with ``multi_node_measured``), the hook's admin record."""

    def _signature(self, wid: int) -> str:
        return f"workload:{1000 + wid}:{self.wl.label(wid)}"

    def import_table(self, table: tuple[tuple[str, int], ...], now: float) -> None:
        """An admin imported ``table`` (model, cores per GPU) as ``coda-slurm profiles
        starter`` does: one global profile ``workload:*:MODEL`` per model, at the starter
        table's confidence (below MinConfidence: a prior only). Before the first decision:
        the hook's index of priors is built once per profile mapping
        (:func:`slurm_plugin.decision.priors.index_for`), and the run adds only users'
        profiles to it afterwards."""
        for name, cpus_per_gpu in table:
            sig = f"workload:*:{name}"
            prof = Profile(
                signature=sig,
                workload=name,
                cpus_per_gpu=int(cpus_per_gpu),
                confidence=STARTER_CONFIDENCE,
                n_samples=0,
                updated_unix_s=now,
                source=STARTER_SOURCE,
            )
            self.views[sig] = to_view(prof)
        self.decided.clear()

    def coda_cores(self, j: int, gpn: int, k: int) -> int:
        """Cores per node the submit hook gives GPU job ``j`` from the profiles published."""
        wid = int(self.wl.workload[j])
        user_cpg = int(self.wl.user_cpus_per_gpu[j])
        key = (wid, gpn, k, user_cpg)
        got = self.decided.get(key)
        if got is None:
            got = self.decided[key] = self._decide(wid, gpn, k, user_cpg)
        if k > 1 and self.multi_node_measured:
            self.job_record[j] = got[1]
        return got[0]

    def _decide(self, wid: int, gpn: int, k: int, user_cpg: int) -> tuple[int, str | None]:
        """The hook's decision for such a job: (cores per node, admin record)."""
        self.counters["decide_calls"] += 1
        name = self.wl.label(wid)
        req = JobRequest(
            uid=1000 + wid,
            job_name=name,
            tres_per_node=f"gres:gpu:{gpn}",
            cpus_per_tres=f"gres:gpu:{user_cpg}",
            min_nodes=k,
            comment=f"coda:workload={name}",
            script=self.wl.script(wid),
        )
        d = decide(req, self.cfg, self.views, self.node_cap, node_share=self.node_share)
        cpg = user_cpg
        if d.cpus_per_tres is not None:
            cpg = int(d.cpus_per_tres.rsplit(":", 1)[1])
        return cpg * gpn, d.admin_comment

    def admit(self, run: Run, now: float) -> None:
        """GPU job ``run`` starts: coda-node profiles it if its workload has no confident
        profile yet."""
        wid = int(self.wl.workload[run.job])
        prof = self.profiles.get(self._signature(wid))
        if (
            prof is not None
            and prof.confidence >= self.cfg.min_confidence
            and not is_censored(prof)
        ):
            return
        if len(run.nodes) != 1 or run.cores <= run.gpn or not self.probe.enabled:
            return
        # Admitted at its start, as coda-node admits a job at its first tick; it takes the
        # node's probe slot only when its warm-up is over, as coda-node's allocator does
        # (a job still warming up, or one that ends first, keeps no other job from it).
        run.probe_from_s = now
        self.events.push(now + WARMUP_S, PROBE_BEGIN, run.job, 0)

    def probe_begin(self, j: int, now: float) -> None:
        """Job ``j``'s warm-up is over: it is probed if its node's probe slot is free, or
        else waits for it, as coda-node's allocator lets it."""
        run = self.running.get(j)
        if run is None:
            return
        node = run.nodes[0]
        if self.probing_on[node] >= self.probe.max_jobs:
            self.counters["probe_slot_busy"] += 1
            heapq.heappush(self.probe_waiting[node], j)
            return
        self._start_probe(j, run, now)

    def _slot_freed(self, node: int, now: float) -> None:
        """A probe on ``node`` is over: the waiting jobs take the slot by job order, as the
        allocator, which looks at a node's waiting jobs by job id, gives it."""
        waiting = self.probe_waiting[node]
        while waiting and self.probing_on[node] < self.probe.max_jobs:
            j = heapq.heappop(waiting)
            run = self.running.get(j)
            if run is None:
                continue  # ended while it waited
            # The probe's times count from the job's start with its warm-up first; this
            # job's warm-up ended when it began to wait, its probes begin now.
            run.probe_from_s = now - WARMUP_S
            self.counters["probe_slot_waited"] += 1
            self._start_probe(j, run, now)

    def _start_probe(self, j: int, run: Run, now: float) -> None:
        node = run.nodes[0]
        wid = int(self.wl.workload[j])
        key = (wid, run.cores, run.gpn)
        pr = self.probe_memo.get(key)
        if pr is None:
            pr = self.probe_memo[key] = probe_run(
                theta_cores=self.wl.sweet_spot(j, run.gpn, 1, self.m),
                allocated_cores=run.cores,
                gpus=run.gpn,
                params=self.probe,
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
        self.events.push(now + max(0.0, run.work_left) / max(run.rate, 1e-9), END, j, run.version)
        self.events.push(run.probe_from_s + pr.done_after_s, PUBLISH, j, 0)

    def publish(self, j: int, now: float) -> None:
        """Job ``j``'s probe is done: what the allocator measured goes to the store."""
        run = self.running.get(j)
        if run is None or not run.probing:
            return
        run.probing = False
        self.probing_on[run.nodes[0]] -= 1
        wid = int(self.wl.workload[j])
        pr = self.probe_memo[(wid, run.cores, run.gpn)]
        self._merge(j, run.gpn, pr.samples, now)
        self._slot_freed(run.nodes[0], now)

    def publish_ended(self, j: int, run: Run, now: float) -> None:
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

    def multi_node_ended(self, run: Run, ran_s: float, now: float) -> None:
        """Multi-node GPU job ``run`` has left its nodes after ``ran_s`` seconds: each node's
        coda-node writes its job summary (:meth:`_node_summary`), and each summary's figure
        goes into the profile the hook's record names, as coda-node's publisher merges it
        (:func:`coda_common.store.multinode_merge.multi_node_figure`,
        :func:`coda_common.store.multinode.merge_figure`). The hook reads the profile as it
        does a real store's: its ``MultiNodeMinSamples`` and ``MultiNodeMargin`` apply."""
        record = self.job_record.pop(run.job, None)
        if not self.multi_node_measured or ran_s < self.cfg.node_interval_s:
            return  # coda-node saw the job in one tick at most: no summary
        self.counters["multi_node_measured"] += 1
        wid = int(self.wl.workload[run.job])
        demand_cores = self.wl.sweet_spot(run.job, run.gpn, len(run.nodes), self.m)
        used_cores = min(float(run.cores), demand_cores)
        for node in run.nodes:
            summary = self._node_summary(run, node, record, used_cores, ran_s, now)
            found = multi_node_figure(summary)
            if found is None:
                continue
            sig, figure, starved = found
            cur = self.profiles.get(sig) or self._empty_profile(wid, now, sig)
            measure = merge_figure(cur.multi_node, figure, now, starved)
            prof = replace(cur, multi_node=measure)
            self.profiles[sig] = prof
            self.views[sig] = to_view(prof)
            self.counters["multi_node_figures"] += 1
        self.decided = {k: v for k, v in self.decided.items() if k[0] != wid}

    def _node_summary(
        self,
        run: Run,
        node: int,
        record: str | None,
        used_cores: float,
        ran_s: float,
        now: float,
    ) -> JobSummary:
        """The job summary coda-node writes for ``run`` on ``node``: the job ran there on
        all its cores and kept ``used_cores`` of them busy, and its GPUs as busy as its
        throughput curve at those cores is high (below its sweet spot they wait on the
        CPUs; :func:`coda_common.store.jobsummary.gpus_waiting` says whether they did)."""
        wid = int(self.wl.workload[run.job])
        demand = self.wl.sweet_spot(run.job, run.gpn, len(run.nodes), self.m)
        util_pct = 100.0 * throughput_at(demand, run.cores, log_share=self.m.log_share)
        waited = gpus_waiting(util_pct, used_cores, run.cores)
        return JobSummary(
            job_id=run.job + 1,
            node=f"node{node}",
            user=None,
            uid=1000 + wid,
            account=None,
            partition=None,
            kind="dnn",
            num_nodes=len(run.nodes),
            start_unix_s=now - ran_s,
            end_unix_s=now,
            sampled_s=ran_s,
            gpus=run.gpn,
            gpu_model=None,
            cores_allocated=run.cores,
            cores_mean=float(run.cores),
            cpu_used_cores_mean=used_cores,
            gpu_util_pct_mean=util_pct,
            gpu_sampled_s=ran_s,
            gpu_wait_s=ran_s if waited else 0.0,
            idle_core_s=max(0.0, run.cores - used_cores) * ran_s,
            probe_s=0.0,
            probes=0,
            slim_s=0.0,
            throttled_s=0.0,
            protected_s=0.0,
            profile_state=None,
            record=record,
        )

    def ended(self, run: Run, now: float) -> None:
        """Probed job ``run`` has ended and left its node: the slot goes to a waiting job."""
        self._slot_freed(run.nodes[0], now)

    def _merge(self, j: int, gpn: int, samples: tuple[tuple[int, float], ...], now: float) -> None:
        if not samples:
            return
        wid = int(self.wl.workload[j])
        sig = self._signature(wid)
        cur = self.profiles.get(sig) or self._empty_profile(wid, now)
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

    def _empty_profile(self, wid: int, now: float, signature: str | None = None) -> Profile:
        """Workload ``wid``'s profile (under ``signature``, else the workload's own) before
        anything was measured (confidence 0)."""
        return Profile(
            signature=signature or self._signature(wid),
            workload=self.wl.label(wid),
            cpus_per_gpu=1,
            confidence=0.0,
            n_samples=0,
            updated_unix_s=now,
            source="coda-node",
        )
