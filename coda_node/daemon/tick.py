"""The steps of one tick between the daemon's reads and its writes: how much of each job's
cgroup the sample reads, the plan (admin limits, then the adaptive loop's probes and
throttles), the cgroups the enforcer is handed, and each job's usage tick.

The daemon runs them in order: sample (reads), :func:`decide` (no reads or writes of the
node), enforce (writes), then records the tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from coda_node.daemon.adaptive import AdaptiveLoop, LoopOutput
from coda_node.enforce.enforcer import JobResult
from coda_node.enforce.mechanisms import registered
from coda_node.enforce.state import JobChanges, Limit
from coda_node.policy.observe import Progress
from coda_node.policy.targets import (
    JobFacts,
    JobTarget,
    PlanProblem,
    choose_cpus,
    plan,
    quota_that_caps,
)
from coda_node.policy.usage import UsageTick
from coda_node.sampling.snapshot import JobView, NodeSnapshot
from coda_node.system import cgroups
from coda_node.system.cgroups import DETAIL_RANK, CgroupJob, CgroupLayout, Detail
from coda_node.system.nvml import GpuSample
from coda_node.system.topology import GpuLocality


@dataclass(slots=True)
class TickReport:
    snapshot: NodeSnapshot
    targets: dict[int, JobTarget]
    results: dict[int, JobResult]
    problems: list[str] = field(default_factory=list)
    cpu_time_s: float = 0.0
    allocated: dict[int, frozenset[int]] = field(default_factory=dict)
    """Each job's Slurm allocation as known before this tick's writes."""
    held: frozenset[int] = frozenset()
    """Jobs left alone this tick: to be repaired from Slurm's allocation, repaired, or
    running with a cgroup that could not be read."""


@dataclass(slots=True)
class Decision:
    """What one tick decided: each job's facts and target, the plan's problems, and the
    adaptive loop's output (its events and publications included)."""

    facts: dict[int, JobFacts]
    targets: dict[int, JobTarget]
    problems: list[PlanProblem]
    loop: LoopOutput


# -- sampling ----------------------------------------------------------------------------
def detail_needed(what: JobTarget | Limit | JobChanges | None) -> Detail:
    """How much of a job's cgroup tree the enforcer needs this tick to apply (or undo)
    ``what``: a job's cpuset is checked against its steps' CPUs, and new steps are found
    among its steps; a CPU quota (v1: coda's own cpu cgroup, which the job's threads are
    moved into) and a resctrl group (threads are moved one by one) act on its tasks."""
    if what is None:
        return "cpus"
    if isinstance(what, JobChanges):
        return max(
            (m.detail(what.records[m.name]) for m in registered() if m.name in what.records),
            key=DETAIL_RANK.__getitem__,
            default="cpus",
        )
    if what.quota_cores is not None or what.mem_bw_pct is not None:
        return "tasks"
    if isinstance(what, Limit):
        return "steps" if what.cores is not None or what.cpus is not None else "cpus"
    if what.l3_ways is not None:
        return "tasks"
    return "steps" if what.cpus is not None else "cpus"


def sample_detail(
    limits: Mapping[int, Limit],
    changes: Mapping[int, JobChanges],
    adaptive_jobs: set[int],
    adaptive_task_jobs: set[int],
) -> tuple[set[int], set[int]]:
    """(jobs whose steps the sample reads, jobs whose tasks it reads): the jobs this tick
    may change or put back, and of those the ones whose change acts on tasks."""
    detail_jobs = set(limits) | set(changes) | adaptive_jobs
    task_jobs = adaptive_task_jobs | {
        j for j, d in [*limits.items(), *changes.items()] if detail_needed(d) == "tasks"
    }
    return detail_jobs, task_jobs


# -- policy ------------------------------------------------------------------------------
def decide(
    snap: NodeSnapshot,
    limits: Mapping[int, Limit],
    hold: frozenset[int],
    *,
    loop: AdaptiveLoop,
    allocated: Callable[[int, CgroupJob], frozenset[int]],
    near_cpus: Callable[[JobView], frozenset[int]],
    mba: str | None,
) -> Decision:
    """Each job's target: an admin limit's, else a probe's core count, else a throttle.
    The jobs in ``hold`` are left alone."""
    facts = {}
    for job_id, view in snap.jobs.items():
        if view.cgroup is None or job_id in hold:
            continue
        facts[job_id] = JobFacts(
            job_id=job_id,
            allocated_cpus=allocated(job_id, view.cgroup),
            is_dnn=view.kind == "dnn",
            near_cpus=near_cpus(view) if job_id in limits else frozenset(),
        )
    targets, problems = plan(facts, {j: lim for j, lim in limits.items() if j not in hold}, mba=mba)
    out = loop.step(
        snap,
        lambda j: facts[j].allocated_cpus if j in facts else None,
        blocked={j: "an admin limit is set" for j in limits},
    )
    for job_id, cores in out.cores.items():
        if job_id in facts and job_id not in targets:
            near = near_cpus(snap.jobs[job_id])
            cpus = choose_cpus(facts[job_id].allocated_cpus, cores, near)
            targets[job_id] = JobTarget(cpus=cpus, reason=f"probe: {cores} cores")
    for job_id, th in out.throttles.items():
        if job_id in facts and job_id not in targets:
            targets[job_id] = JobTarget(
                quota_cores=quota_that_caps(th.quota_cores, len(facts[job_id].allocated_cpus)),
                mem_bw_pct=th.mem_bw_pct,
                reason=th.reason,
                l3_ways=th.l3_ways,
            )
    return Decision(facts=facts, targets=targets, problems=problems, loop=out)


# -- enforce -----------------------------------------------------------------------------
def cgroups_to_enforce(
    snap: NodeSnapshot,
    hold: frozenset[int],
    targets: Mapping[int, JobTarget],
    changes: Mapping[int, JobChanges],
    layout: CgroupLayout,
) -> tuple[dict[int, CgroupJob], dict[int, JobResult]]:
    """The cgroups the enforcer is handed: every job's as sampled, but those held. A job
    this tick's policy changes for the first time (or in a new way) needs more of its
    tree than the sample read (:func:`detail_needed`): that much is read now, the one
    read after the plan; a job that ended meanwhile is left out. A job that cannot be
    read now is left out too, and returned with a failed result: it is to be held this
    tick (its record kept), as one the sample could not read."""
    cg_jobs = {j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None and j not in hold}
    unreadable: dict[int, JobResult] = {}
    for job_id in set(targets) | set(changes):
        cg = cg_jobs.get(job_id)
        if cg is None or not layout.has_slurm:
            continue
        need = max(
            detail_needed(targets.get(job_id)),
            detail_needed(changes.get(job_id)),
            key=DETAIL_RANK.__getitem__,
        )
        if DETAIL_RANK[cg.detail] < DETAIL_RANK[need]:
            try:
                full = cgroups.read_job(layout, cg, detail=need)
            except cgroups.CgroupReadError as exc:
                unreadable[job_id] = JobResult(failed=[f"cannot read its cgroup ({exc})"])
                full = None
            if full is None:
                del cg_jobs[job_id]
            else:
                cg_jobs[job_id] = full
    return cg_jobs, unreadable


def merge_repaired(results: dict[int, JobResult], repaired: Mapping[int, JobResult]) -> None:
    """The repairs' results into ``results``, each before what the job's target wrote."""
    for job_id, res in repaired.items():
        if job_id in results:  # repaired, then changed again within this tick
            results[job_id].applied[:0] = res.applied
            results[job_id].failed[:0] = res.failed
        else:
            results[job_id] = res


def near_cpus_of(snap: NodeSnapshot, locality: GpuLocality) -> Callable[[JobView], frozenset[int]]:
    """A job's CPUs local to its GPUs, by the tick's GPU bus ids."""
    bus_ids = {g.index: g.pci_bus_id for g in snap.gpus}

    def near_cpus(view: JobView) -> frozenset[int]:
        """The CPUs local to the job's GPUs; asked only where CPUs are to be chosen."""
        gpus = tuple(bus_ids.get(r.nvml_index) for r in view.gpus if r.nvml_index is not None)
        return locality.near_cpus(gpus)

    return near_cpus


def write_reason(
    job_id: int, repaired: Mapping[int, JobResult], targets: Mapping[int, JobTarget]
) -> str:
    """The reason the events of a job's writes give."""
    if job_id in repaired and job_id not in targets:
        return "repair from Slurm's allocation"
    if job_id in targets:
        return targets[job_id].reason
    return "no limit, probe or throttle applies any more"


# -- usage -------------------------------------------------------------------------------
def usage_tick(view: JobView, gpus: dict[int, GpuSample], prog: Progress) -> UsageTick | None:
    """The job's GPUs this tick as one usage tick; None when NVML gave no utilisation."""
    mine = [
        gpus[r.nvml_index] for r in view.gpus if r.nvml_index is not None and r.nvml_index in gpus
    ]
    util = [g.util_pct for g in mine if g.util_pct is not None]
    mem = [g.mem_util_pct for g in mine if g.mem_util_pct is not None]
    if not util or not mem:
        return None
    pcie = [
        (g.pcie_rx_bytes_per_s or 0.0) + (g.pcie_tx_bytes_per_s or 0.0)
        for g in mine
        if g.pcie_rx_bytes_per_s is not None or g.pcie_tx_bytes_per_s is not None
    ]
    # The progress file counts the whole job's iterations: per GPU only where all its GPUs
    # are on this node.
    single_node = view.slurm is not None and view.slurm.num_nodes <= 1
    rate = prog.rate if prog.source == "iterations" and single_node and view.gpus else None
    return UsageTick(
        gpu_util=sum(util) / len(util) / 100.0,
        gpu_mem_bw_util=sum(mem) / len(mem) / 100.0,
        pcie_bytes_per_s_per_gpu=sum(pcie) / len(pcie) if pcie else None,
        iter_per_s_per_gpu=rate / len(view.gpus) if rate is not None else None,
    )


def gpu_model(snap: NodeSnapshot, job_id: int) -> str | None:
    """The model of the job's GPUs, where they are all of one."""
    view = snap.jobs.get(job_id)
    names = {g.index: g.name for g in snap.gpus}
    models = {names.get(r.nvml_index) for r in view.gpus} if view else set()
    models.discard(None)
    return models.pop() if len(models) == 1 else None
