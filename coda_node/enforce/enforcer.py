"""Enforcement: make each job's cgroups match the plan, writing only what differs.

The writes are the mechanisms' (:mod:`coda_node.enforce.mechanisms`), applied to each job
in the order they are registered; this module runs them, keeps their records in the
state file and decides when a full check of a settled job may be skipped.

Every change is recorded in the state file *before* it is made (how Slurm had set the job),
so a crash at any point leaves enough on disk to put the job back; a record leaves the file
only once everything it covers is back. Each job is handled on its own: an error on one job
is reported in its :class:`JobResult` and the others go on. This is one of the two places
that catch every exception (the other is the submit hook).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from coda_node.enforce import mechanisms
from coda_node.enforce.mechanisms.base import ENFORCE_ERRORS, JobResult, Mechanism, Record
from coda_node.enforce.mechanisms.cpuset import snapshot_from_dict, snapshot_to_dict
from coda_node.enforce.mechanisms.rdt import RdtClass
from coda_node.enforce.state import JobChanges, NodeState
from coda_node.policy.targets import JobTarget
from coda_node.system.cgroups import CgroupJob, CpuQuotaWriter, CpusetWriter, JobGone
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import ResctrlControl

__all__ = [
    "VERIFY_EVERY_TICKS",
    "Enforcer",
    "JobResult",
    "RdtClass",
    "snapshot_from_dict",
    "snapshot_to_dict",
]

log = logging.getLogger("coda-node")

VERIFY_EVERY_TICKS = 10
"""A job's cpuset or CPU quota found exactly as wanted is read again in full at least once
every this many ticks while the sampler sees the job unchanged (same CPUs, steps and, for
a quota, tasks); in between, its steady state costs no cgroup reads. Anything the sampler
sees change (the job's own cpuset, which Slurm rewrites for a new step; a new step; a new
task of a job whose tasks are read) and any new target is checked at once. The sampler
keeps a step's CPUs while the step's directory stays (coda_node.system.cgroups.SubdirCache), so
a step's or a task's cpuset rewritten in place is put right by the full check, within
this many ticks. Each settled job has its own tick in the period (its phase), so the full
checks of many limited jobs are spread over the period, not all done on one tick."""


class _Step:
    """One mechanism's view of the enforcer while it works on one job (the
    :class:`~coda_node.enforce.mechanisms.base.JobStep` it is handed)."""

    __slots__ = ("_ch", "_enforcer", "_name", "job_id")

    def __init__(self, enforcer: Enforcer, job_id: int, name: str, ch: JobChanges) -> None:
        self._enforcer = enforcer
        self.job_id = job_id
        self._name = name
        self._ch = ch

    def write_ahead(self) -> None:
        self._enforcer._write_ahead(self.job_id, self._ch)

    def save(self) -> None:
        self._enforcer._save()

    def is_settled(self, seen: object) -> bool:
        return self._enforcer._is_settled(self.job_id, self._name, seen)

    def checked(self, seen: object, written: int) -> None:
        self._enforcer._checked(self.job_id, self._name, seen, written)

    def unsettle(self) -> None:
        self._enforcer._unsettle(self.job_id, self._name)

    def tids(self, cg: CgroupJob) -> list[int]:
        return self._enforcer.tids(cg)

    def records(self, name: str) -> Iterator[tuple[int, Record]]:
        for job_id, ch in self._enforcer.state.changes.items():
            yield job_id, ch.record(name)


class Enforcer:
    """Every registered mechanism (:mod:`coda_node.enforce.mechanisms`), in its order, on
    every job. ``cpuset``, ``quota`` and ``rdt`` are the built-in mechanisms' writers,
    ``writers`` those of any other by name; a mechanism without one does nothing."""

    def __init__(
        self,
        *,
        state: NodeState,
        save: Callable[[], None],
        cpuset: CpusetWriter | None,
        quota: CpuQuotaWriter | None,
        rdt: ResctrlControl | None = None,
        root: SystemRoot | None = None,
        cgroup_version: int | None = 1,
        mechanisms: Iterable[str] | None = None,
        writers: Mapping[str, Any] | None = None,
    ) -> None:
        self.state = state
        self._save = save
        self.cpuset = cpuset
        self.quota = quota
        self.rdt = rdt
        self.root = root or SystemRoot()
        self.cgroup_version = cgroup_version
        given = {"cpuset": cpuset, "quota": quota, "rdt": rdt, **(writers or {})}
        self.steps: tuple[Mechanism, ...] = tuple(
            kind(given.get(kind.name)) for kind in _registered()
        )
        """One instance of each registered mechanism, in the order they are applied."""
        self.mechanisms = frozenset(
            mechanisms if mechanisms is not None else (m.name for m in self.steps)
        )
        """The mechanisms coda.conf turns on; the others only undo what they did."""
        self._settled: dict[tuple[int, str], tuple[object, int]] = {}
        """(job, mechanism) -> (what the sampler showed and the target, when a full check
        found nothing to write; the tick of the next full check)."""
        self._phase: dict[int, int] = {}
        """Settled job -> its full checks' tick modulo VERIFY_EVERY_TICKS."""
        self._ticks = 0
        """Calls of :meth:`reconcile` so far."""

    def _is_settled(self, job_id: int, what: str, seen: object) -> bool:
        """Whether a full check of ``what`` may be skipped this tick: the last one wrote
        nothing under the same target and sampled job, and the job's next one is not due."""
        entry = self._settled.get((job_id, what))
        return entry is not None and entry[0] == seen and self._ticks < entry[1]

    def _checked(self, job_id: int, what: str, seen: object, written: int) -> None:
        """Record a full check: settled when it wrote nothing (a write is seen by the next
        tick's sample, which is then checked in full once more)."""
        if written or seen is None:
            self._unsettle(job_id, what)
            return
        phase = self._phase.get(job_id)
        if phase is None:
            phase = self._phase[job_id] = self._quietest_phase()
        # The first tick after this one that is the job's phase: at most a period away.
        due = self._ticks + 1 + (phase - self._ticks - 1) % VERIFY_EVERY_TICKS
        self._settled[(job_id, what)] = (seen, due)

    def _quietest_phase(self) -> int:
        """The phase fewest settled jobs have, for a job that settles now: many jobs
        settle on one tick (a limit set on all of them), and would otherwise all be read in
        full again on one tick. Job ids do not spread evenly (a node's jobs may all end in
        the same digit). On a tie, the phase that comes latest (a full period from now,
        then one tick sooner, ...), so a job just checked is not checked again at once."""
        load = [0] * VERIFY_EVERY_TICKS
        for phase in self._phase.values():
            load[phase] += 1
        now = self._ticks % VERIFY_EVERY_TICKS
        order = [(now - k) % VERIFY_EVERY_TICKS for k in range(VERIFY_EVERY_TICKS)]
        return min(order, key=load.__getitem__)

    def _unsettle(self, job_id: int, what: str) -> None:
        """``what`` of the job is checked in full at every tick from now until it settles
        again; a job with nothing settled gives up its phase."""
        self._settled.pop((job_id, what), None)
        if job_id in self._phase and not any((job_id, m.name) in self._settled for m in self.steps):
            del self._phase[job_id]

    # -- one tick -------------------------------------------------------------
    def reconcile(
        self,
        jobs: Mapping[int, CgroupJob],
        targets: Mapping[int, JobTarget],
        held: Collection[int] = (),
    ) -> dict[int, JobResult]:
        """Bring every job in ``jobs`` to its target (absent = as Slurm set it), and
        forget jobs that ended. ``jobs`` are the cgroups seen this tick; a job in ``held``
        (still running, but left alone this tick) is neither written nor forgotten, and
        its record stays as it is."""
        self._ticks += 1
        results: dict[int, JobResult] = {}
        with self._locked():
            for job_id in sorted(set(targets) | set(self.state.changes)):
                if job_id in held:
                    continue
                cg = jobs.get(job_id)
                if cg is None:
                    if job_id in self.state.changes:
                        results[job_id] = self._ended(job_id)
                    continue
                results[job_id] = self._job(cg, targets.get(job_id, JobTarget()))
            self._tidy(jobs, results)
        self.state.prune()
        return results

    def restore_all(
        self,
        jobs: Mapping[int, CgroupJob],
        only: frozenset[int] | None = None,
        unreadable: Mapping[int, str] | None = None,
    ) -> dict[int, JobResult]:
        """Put every job coda-node changed (or those of them ``only`` names) back as Slurm
        set it (SIGTERM, ``restore``, ``release`` without a daemon). A job in
        ``unreadable`` (its cgroup is there but could not be read -> why) cannot be put
        back: its record is kept and its result says why it failed."""
        results: dict[int, JobResult] = {}
        unreadable = unreadable or {}
        with self._locked():
            for job_id in sorted(self.state.changes):
                if only is not None and job_id not in only:
                    continue
                cg = jobs.get(job_id)
                if job_id in unreadable:
                    why = f"cannot read its cgroup ({unreadable[job_id]}); left as it is"
                    results[job_id] = JobResult(failed=[why])
                elif cg is None:
                    results[job_id] = self._ended(job_id)
                else:
                    results[job_id] = self._job(cg, JobTarget(), restoring=True)
            self._tidy(jobs, results)
        self.state.prune()
        return results

    def repair(self, cg: CgroupJob, allocation: frozenset[int]) -> JobResult:
        """Put a job back to ``allocation``, the CPUs Slurm reports it holds here, where
        coda-node's record of it is missing or cannot be trusted: every cpuset of the job
        to the allocation (:meth:`CpusetWriter.reset`), its CPU quota lifted (Slurm sets
        none) and its threads out of coda's resctrl groups, each mechanism in turn. The
        job's record, if any, is dropped once all of that is done; until then it stays
        for a retry."""
        result = JobResult()
        ch = self.state.changes.get(cg.job_id) or JobChanges()
        with self._locked():
            try:
                for mech in self.steps:
                    mech.repair(_Step(self, cg.job_id, mech.name, ch), cg, allocation, result)
            except JobGone:
                result.gone = True
            except (*ENFORCE_ERRORS, ValueError) as exc:
                result.failed.append(f"repair: {exc}")
        if not result.failed:
            self.state.changes.pop(cg.job_id, None)
            for mech in self.steps:
                self._unsettle(cg.job_id, mech.name)
        return result

    def _locked(self) -> contextlib.ExitStack:
        """Every mechanism's lock (resctrl's, shared with ``coda-node`` commands)."""
        stack = contextlib.ExitStack()
        for mech in self.steps:
            stack.enter_context(mech.locked())
        return stack

    def _write_ahead(self, job_id: int, ch: JobChanges) -> None:
        """Put ``ch`` on record for the job and on disk, fsynced, before the change it now
        covers is made. The record is (re)attached to the state first: a record that
        covered nothing a moment ago is not in the file, and may have been dropped."""
        self.state.changes[job_id] = ch
        self._save()

    def _tidy(self, jobs: Mapping[int, CgroupJob], results: dict[int, JobResult]) -> None:
        """Each mechanism removes what of its own no record uses (a v1 quota directory,
        a resctrl group), with every lock held."""
        for mech in self.steps:
            records = {j: ch.record(mech.name) for j, ch in self.state.changes.items()}
            mech.tidy(records, jobs, results)

    # -- per job ----------------------------------------------------------------
    def _job(self, cg: CgroupJob, target: JobTarget, *, restoring: bool = False) -> JobResult:
        result = JobResult()
        ch = self.state.job(cg.job_id)
        for mech in self.steps:
            name = mech.name
            # A mechanism turned off in coda.conf still undoes what it did before.
            wanted = target if (name in self.mechanisms and not restoring) else JobTarget()
            try:
                mech.apply(_Step(self, cg.job_id, name, ch), cg, wanted, ch.record(name), result)
            except JobGone:
                # It ended between sampling and writing: clean up what is ours (a v1
                # quota directory, an MB group) as for any ended job.
                ended = self._ended(cg.job_id)
                ended.applied[:0] = result.applied
                return ended
            except ENFORCE_ERRORS as exc:
                # The daemon logs each failure once, as a "failed: ..." event (job id first).
                result.failed.append(f"{name}: {exc}")
                log.debug("job=%d %s: %s", cg.job_id, name, exc)
            except Exception as exc:  # the per-job boundary: one job never stops the others
                result.failed.append(f"{name}: unexpected {type(exc).__name__}: {exc}")
                log.exception("job=%d %s failed unexpectedly", cg.job_id, name)
        return result

    def tids(self, cg: CgroupJob) -> list[int]:
        """Thread ids of the job: resctrl moves threads, one id per write."""
        return self.thread_ids(cg.pids)

    def thread_ids(self, pids: Iterable[int]) -> list[int]:
        """Thread ids of a job's tasks ``pids`` (a :class:`CgroupJob`'s ``pids``). On v1 the
        cgroup ``tasks`` files already list threads; on v2 ``cgroup.procs`` lists
        processes, whose threads are under /proc/<pid>/task."""
        if self.cgroup_version == 1:
            return list(pids)
        tids: list[int] = []
        for pid in pids:
            try:
                tids += sorted(
                    int(t.name) for t in self.root.proc.joinpath(str(pid), "task").iterdir()
                )
            except (OSError, ValueError):
                continue
        return tids

    def _ended(self, job_id: int) -> JobResult:
        """The job is gone; its cgroups went with it. Each mechanism removes what is ours;
        one that cannot keeps the record for a retry."""
        result = JobResult(gone=True)
        ch = self.state.changes.get(job_id)
        if ch is not None:
            for mech in self.steps:
                try:
                    mech.ended(job_id, ch.record(mech.name))
                except ENFORCE_ERRORS as exc:
                    result.failed.append(f"{mech.name} clean-up: {exc}")
                    log.debug("job=%d ended: %s clean-up: %s", job_id, mech.name, exc)
                    return result
        self._forget(job_id)
        return result

    def _forget(self, job_id: int) -> None:
        self.state.changes.pop(job_id, None)
        for mech in self.steps:
            self._unsettle(job_id, mech.name)
        self._save()


def _registered() -> tuple[type[Mechanism], ...]:
    return mechanisms.registered()
