"""What a daemon takes over from the last run: the state file's record of changes, checked
against the CPUs online and against Slurm's allocation, jobs whose record is missing or
cannot be trusted put back to the CPUs Slurm reports, and the last run's view of each DNN
job (its warm-up, baseline and online profile) adopted into the adaptive loop.

A repair is prepared with the reads (Slurm's allocation, the job's tasks) before the tick
plans, and applied with the tick's writes: the jobs it names are left out of the plan.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coda_node.enforce.enforcer import Enforcer, JobResult
from coda_node.enforce.state import REPAIR_ALL, NodeState, StateDamaged, StateFile, StateNewer
from coda_node.sampling.snapshot import Sampler
from coda_node.system import cgroups
from coda_node.system.cgroups import CgroupJob, CgroupLayout, CgroupReadError
from coda_node.system.cpu_ids import SlurmCpuIds
from coda_node.system.cpulist import format_cpulist, parse_cpulist
from coda_node.system.slurmjobs import SlurmJobs, SlurmQueryError

if TYPE_CHECKING:
    from coda_node.daemon.adaptive import AdaptiveLoop

log = logging.getLogger("coda-node")


def allocated_cpus(state: NodeState, job_id: int, cg: CgroupJob) -> frozenset[int]:
    """Slurm's allocation: what the cgroup held before our first change."""
    ch = state.changes.get(job_id)
    if ch is not None and ch.allocated_cpus is not None:
        return frozenset(ch.allocated_cpus)
    if ch is not None and ch.cpuset_original is not None:  # a state file without it
        recorded = cgroups.parse_cpulist(ch.cpuset_original["cpus"].get(".", ""))
        return recorded or cg.cpus
    return cg.cpus


@dataclass(slots=True)
class RepairPlan:
    hold: frozenset[int] = frozenset()
    """Jobs left alone this tick: to be repaired from Slurm's allocation, repaired, or
    running with a cgroup that could not be read (limits and record kept as they are)."""
    jobs: list[tuple[int, CgroupJob, frozenset[int]]] = field(default_factory=list)
    """(job, its cgroup read with its tasks, the CPUs Slurm allocated it) to put back."""


class Recovery:
    """The state file's records checked and, where they cannot be trusted, their jobs put
    back to Slurm's allocation."""

    def __init__(
        self,
        state_file: StateFile,
        slurm: SlurmJobs,
        slurm_cpu_ids: SlurmCpuIds,
        online_cpus: frozenset[int] | None,
    ) -> None:
        self.state_file = state_file
        self.slurm = slurm
        self.slurm_cpu_ids = slurm_cpu_ids
        self.online_cpus = online_cpus
        self.unverified: set[int] = set()
        """Jobs whose record came from the state file and whose recorded allocation is not
        yet compared with Slurm's."""
        self.waiting: dict[int, str] = {}
        """Jobs to repair that could not be repaired yet -> why (shown in status)."""

    def load(self, *, put_back: bool = False) -> NodeState:
        """What a previous run changed. Raises StateError for a file we cannot read, and
        StateNewer for one we must not overwrite (a newer format) unless ``put_back``. A
        damaged file is kept aside and replaced, durably, by one that says every running
        job is to be repaired from Slurm's allocation: nothing the daemon finds in the
        cgroups is taken for the allocation before that is done.

        ``put_back`` (``restore``, ``release`` without a daemon) is for putting jobs back:
        that never needs our record, since Slurm's record says what each job owns. A file
        from a newer coda-node is then left untouched and every running job repaired from
        Slurm's allocation; so is every job when there is no file (a record deleted, or
        lost with its directory, must not leave a job shrunk)."""
        for path in self.state_file.remove_stale_temps(pid_alive):
            log.info("removed %s, left by a writer that was killed", path)
        try:
            state = self.state_file.load()
            if put_back and not self.state_file.path.exists():
                why = f"there is no state file ({self.state_file.path})"
                state.repair[REPAIR_ALL] = why
        except StateNewer as exc:
            if not put_back:
                raise
            log.error("%s. Every running job is put back to the CPUs Slurm allocated it", exc)
            self.state_file.leave_untouched(str(exc))
            why = "the state file was written by a newer coda-node"
            state = NodeState(repair={REPAIR_ALL: why}, view=self.state_file.load_view())
        except StateDamaged as exc:
            aside = self.state_file.keep_aside()
            kept = f"kept as {aside.name}" if aside is not None else "not kept"
            log.error(
                "%s: %s. Every running job will be put back to the CPUs Slurm allocated it",
                exc,
                kept,
            )
            why = f"the state file was damaged ({exc.reason})"
            state = NodeState(repair={REPAIR_ALL: why}, view=self.state_file.load_view())
            self.state_file.save(state, view=False)
        self._check_records(state)
        self.unverified = set(state.changes)
        return state

    def _check_records(self, state: NodeState) -> None:
        """Records naming CPUs this node does not have online cannot be put back (every
        write would fail): their jobs are repaired from Slurm's allocation instead."""
        online = self.online_cpus
        if online is None:
            return
        bad = {
            job_id: ch.recorded_cpus() - online
            for job_id, ch in state.changes.items()
            if not ch.recorded_cpus() <= online
        }
        for job_id, missing in sorted(bad.items()):
            del state.changes[job_id]
            state.repair.setdefault(
                job_id,
                f"its record names CPUs {format_cpulist(missing)}, which this node "
                f"does not have online ({format_cpulist(online)})",
            )
            log.error("job=%d %s", job_id, state.repair[job_id])
        if bad:
            self.state_file.save(state, view=False)

    # -- repair from Slurm's allocation ----------------------------------------------
    def prepare(
        self,
        state: NodeState,
        layout: CgroupLayout,
        cg_jobs: dict[int, CgroupJob],
        unreadable: Mapping[int, str] | None = None,
    ) -> RepairPlan:
        """Which running jobs are to be put back, to the CPUs Slurm reports, because their
        record is missing or cannot be trusted (``state.repair``), after comparing each
        record read from the state file with Slurm's allocation once. The pending repairs
        are on disk before anything is written; a job that is gone is taken off them. A
        job Slurm has not answered for, or whose cgroup could not be read (``unreadable``:
        job -> why), is left as it is, and nothing else is done to it, until it does
        (``waiting`` says why). Reads only, but for the state file."""
        if not layout.has_slurm:
            return RepairPlan(hold=frozenset(state.repair))
        unreadable = unreadable or {}
        self._pending(state, cg_jobs, set(cg_jobs) | set(unreadable))
        self.waiting = {
            j: f"waiting: its cgroup cannot be read ({unreadable[j]})"
            for j in state.repair
            if j in unreadable
        }
        pending = sorted(j for j in state.repair if j not in unreadable)
        plan = RepairPlan(hold=frozenset(state.repair) | frozenset(unreadable))
        if not pending:
            return plan
        try:
            allocated = self._slurm_allocation(pending)
        except SlurmQueryError as exc:
            self.waiting.update({j: f"waiting for Slurm ({exc})" for j in pending})
            return plan
        for job_id in pending:
            if job_id not in allocated:
                self.waiting[job_id] = "waiting: Slurm does not list it on this node"
                continue
            cpus = allocated[job_id]
            if cpus is None:
                self.waiting[job_id] = (
                    "waiting: the CPUs Slurm names for it are not this machine's (does "
                    "slurm.conf describe this node's sockets, cores and threads?)"
                )
                continue
            try:
                cg = cgroups.read_job(layout, cg_jobs[job_id], detail="tasks")
            except CgroupReadError as exc:
                self.waiting[job_id] = f"waiting: its cgroup cannot be read ({exc})"
                continue
            if cg is None:
                continue  # ended meanwhile: dropped at the next tick
            plan.jobs.append((job_id, cg, cpus))
        return plan

    def _pending(self, state: NodeState, cg_jobs: dict[int, CgroupJob], running: set[int]) -> None:
        """``state.repair`` brought up to date, on disk: a repair of every job made one
        per running job (its record dropped), records checked against Slurm's allocation,
        and jobs gone taken off."""
        if REPAIR_ALL in state.repair:
            why = state.repair.pop(REPAIR_ALL)
            for job_id in running:
                state.repair.setdefault(job_id, why)
            state.changes = {j: ch for j, ch in state.changes.items() if j not in state.repair}
            self.state_file.save(state, view=False)
        self._verify_records(state, cg_jobs, running)
        gone = [j for j in state.repair if j not in running]
        for job_id in gone:
            # Its cgroups went with it; coda's own cpu cgroup is removed by the enforcer.
            del state.repair[job_id]
            state.changes.pop(job_id, None)
        if gone:
            self.state_file.save(state, view=False)

    def apply(
        self,
        plan: RepairPlan,
        state: NodeState,
        enforcer: Enforcer,
        sampler: Sampler,
        event: Callable[[int, str, str], None],
    ) -> dict[int, JobResult]:
        """Put back the jobs ``plan`` names; a job is taken off the pending repairs, on
        disk, once repaired."""
        results: dict[int, JobResult] = {}
        for job_id, cg, cpus in plan.jobs:
            why = state.repair[job_id]
            event(
                job_id,
                "state-repair",
                f"put back to Slurm's allocation {format_cpulist(cpus)}: {why}",
            )
            result = enforcer.repair(cg, cpus)
            results[job_id] = result
            if result.failed:
                self.waiting[job_id] = "; ".join(result.failed)
                continue
            del state.repair[job_id]
            self.state_file.save(state, view=False)
            sampler.forget(cg)
        return results

    def fold_into(
        self,
        results: dict[int, JobResult],
        repaired: dict[int, JobResult],
        only: frozenset[int] | None,
    ) -> None:
        """A restore's results with the repairs' writes first, and each chosen job still
        waiting for its repair as failed, with why."""
        for job_id, res in repaired.items():
            results.setdefault(job_id, JobResult()).applied[:0] = res.applied
            results[job_id].failed[:0] = res.failed
        for job_id, why in self.waiting.items():
            if job_id not in repaired and (only is None or job_id in only):
                results.setdefault(job_id, JobResult()).failed.append(f"repair: {why}")

    def problems(self, state: NodeState) -> list[str]:
        """One line per job still to be put back to Slurm's allocation, and why not yet."""
        return [
            f"job {job_id}: to be put back to Slurm's allocation ({why}); "
            f"{self.waiting.get(job_id, 'at the next tick')}"
            for job_id, why in sorted(state.repair.items())
        ]

    def _slurm_allocation(self, job_ids: list[int]) -> dict[int, frozenset[int] | None]:
        """Job -> the CPUs Slurm allocated it here, as the kernel numbers them (None where
        Slurm names CPUs this machine does not have); a job Slurm does not list here is
        left out. Raises SlurmQueryError when Slurm does not answer."""
        return {
            job_id: self.slurm_cpu_ids.to_kernel(cpus)
            for job_id, cpus in self.slurm.allocated_cpus(job_ids).items()
        }

    def _verify_records(
        self, state: NodeState, cg_jobs: dict[int, CgroupJob], running: set[int]
    ) -> None:
        """Compare the allocation each record read from the state file names with the one
        Slurm reports; a record that disagrees is dropped and its job repaired. Records
        are trusted meanwhile: Slurm not answering, or a running job whose cgroup could
        not be read (in ``running``, not in ``cg_jobs``), is retried at the next tick."""
        ids = sorted(j for j in self.unverified if j in cg_jobs and j in state.changes)
        self.unverified &= running & set(state.changes)
        if not ids:
            return
        try:
            allocated = self._slurm_allocation(ids)
        except SlurmQueryError:
            return
        changed = False
        self.unverified -= set(ids)
        for job_id in ids:
            cpus = allocated.get(job_id)
            if cpus is None:
                # Not running here as far as Slurm knows (ending), or named in CPUs this
                # machine does not have: nothing to compare the record with.
                continue
            recorded = allocated_cpus(state, job_id, cg_jobs[job_id])
            if recorded != cpus:
                del state.changes[job_id]
                state.repair[job_id] = (
                    f"its record says it was allocated CPUs {format_cpulist(recorded)}, "
                    f"Slurm says {format_cpulist(cpus)}"
                )
                log.error("job=%d %s", job_id, state.repair[job_id])
                changed = True
        if changed:
            self.state_file.save(state, view=False)


# -- the last run's view, adopted -------------------------------------------------------
def adopt(loop: AdaptiveLoop, view: dict[str, Any], clock: Callable[[], float]) -> None:
    """What the last run's view knew of each DNN job, into this run's loop."""
    _adopt_baselines(loop, view, clock)
    _adopt_probes(loop, view)


def _since_view_s(view: dict[str, Any]) -> float:
    """Seconds since the last run wrote ``view`` in the state file (0 when unknown)."""
    with contextlib.suppress(TypeError, ValueError):
        sampled = float(view.get("sampled_unix_s") or time.time())
        return max(0.0, time.time() - sampled)
    return 0.0


def _adopt_baselines(loop: AdaptiveLoop, view: dict[str, Any], clock: Callable[[], float]) -> None:
    """What the last run knew of each DNN job (its view in the state file): how long it
    had been watched (so its warm-up is not served again) and its uncontended baseline.
    Without them a restart leaves every job unshielded for NodeProbeWarmupS and then
    until it has been measured again (quiet ticks, or a baseline probe that caps the CPU
    jobs). Jobs that ended meanwhile are forgotten at the first tick."""
    since_s = _since_view_s(view)
    adopted = []
    for job in view.get("jobs") or []:
        try:
            if job.get("kind") != "dnn":
                continue
            job_id = int(job["job_id"])
            age_s = (job.get("progress") or {}).get("age_s")
            if age_s is not None:
                loop.adopt_signal(job_id, clock() - float(age_s) - since_s)
            contention = job.get("contention") or {}
            baseline, ticks = contention.get("baseline"), contention.get("baseline_ticks")
            if baseline is not None and loop.eliminator.adopt_baseline(
                job_id, float(baseline), int(ticks)
            ):
                adopted.append(f"{job_id}={float(baseline):.4g}")
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # an entry this version cannot read: measured again instead
    if adopted:
        log.info("baselines from the last run: %s", ", ".join(adopted))


def _adopt_probes(loop: AdaptiveLoop, view: dict[str, Any]) -> None:
    """Each DNN job's online profile as the last run left it (its ``profiling`` entry
    in the view): a job half-way through its probes goes on from there, with the time
    it already spent below its allocation counted against NodeProbeBudgetS, and a job
    done is neither probed nor published again. What the allocator cannot read is
    profiled afresh."""
    since_s = _since_view_s(view)
    adopted = []
    for job in view.get("jobs") or []:
        if not isinstance(job, dict) or job.get("kind") != "dnn":
            continue
        record = job.get("profiling")
        job_id = job.get("job_id")
        # A daemon that died with a probe applied left the job below its allocation
        # since its last view (a stopping one put it back, and its view says so).
        left_below = False
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            left_below = len(parse_cpulist(job.get("cpus_now") or "")) < len(
                parse_cpulist(job.get("cpus_allocated") or "")
            )
        if (
            isinstance(record, dict)
            and isinstance(job_id, int)
            and loop.adopt_probe(job_id, record, extra_below_s=since_s if left_below else 0.0)
        ):
            rec = loop.allocator.records[job_id]
            adopted.append(f"{job_id}={rec.state} ({rec.probes} probes, {rec.below_s:.0f} s below)")
    if adopted:
        log.info("online profiles from the last run: %s", ", ".join(adopted))


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
