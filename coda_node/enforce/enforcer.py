"""Enforcement: make each job's cgroups match the plan, writing only what differs.

Every change is recorded in the state file *before* it is made (how Slurm had set the job),
so a crash at any point leaves enough on disk to put the job back; a record leaves the file
only once everything it covers is back. Each job is handled on its own: an error on one job
is reported in its :class:`JobResult` and the others go on. This is one of the two places
that catch every exception (the other is the submit hook).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coda_node.enforce.state import JobChanges, NodeState
from coda_node.policy.targets import JobTarget
from coda_node.system.cgroups import (
    CgroupError,
    CgroupJob,
    CpuQuotaWriter,
    CpusetSnapshot,
    CpusetWriter,
    JobGone,
    format_cpulist,
    parse_cpulist,
)
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import OutOfIds, ResctrlControl, ResctrlError, l3_mask, mb_value

log = logging.getLogger("coda-node")

MECHANISMS = ("cpuset", "quota", "rdt")

_RDT_CLASS = re.compile(r"coda_(?:mb(\d+)(?:_l3w(\d+))?|l3w(\d+))")

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


@dataclass(frozen=True, slots=True)
class RdtClass:
    """What a coda resctrl control group limits: the MB value written to ``MB:`` and the
    number of L3 ways of its ``L3:`` mask; None where the group keeps the default (100 %,
    the full mask)."""

    mb: int | None = None
    l3_ways: int | None = None

    @property
    def group(self) -> str:
        """``coda_mb<v>``, ``coda_l3w<n>`` or ``coda_mb<v>_l3w<n>``: jobs limited alike
        share one group (one CLOSID)."""
        parts = ([f"mb{self.mb}"] if self.mb is not None else []) + (
            [f"l3w{self.l3_ways}"] if self.l3_ways is not None else []
        )
        return "coda_" + "_".join(parts)

    @staticmethod
    def of(group: str) -> RdtClass | None:
        """The class a group name stands for; None for a name that is not one."""
        m = _RDT_CLASS.fullmatch(group)
        if m is None:
            return None
        mb, l3_with_mb, l3_alone = m.groups()
        ways = l3_with_mb or l3_alone
        return RdtClass(
            mb=int(mb) if mb is not None else None,
            l3_ways=int(ways) if ways is not None else None,
        )

    def at_least_as_strict(self, other: RdtClass) -> bool:
        """Whether a job limited to ``other`` may be put here: every resource ``other``
        limits is limited here too, to no more (lower MB, fewer ways)."""
        return (other.mb is None or (self.mb is not None and self.mb <= other.mb)) and (
            other.l3_ways is None or (self.l3_ways is not None and self.l3_ways <= other.l3_ways)
        )

    def describe(self, l3_total: int | None) -> list[str]:
        """The enforcer's lines for this class, one per limited resource."""
        out = []
        if self.mb is not None:
            out.append(f"memory bandwidth {self.mb}")
        if self.l3_ways is not None:
            out.append(f"L3 cache {self.l3_ways} of {l3_total or '?'} ways")
        return out


@dataclass(slots=True)
class JobResult:
    applied: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    gone: bool = False


def snapshot_to_dict(snap: CpusetSnapshot) -> dict[str, Any]:
    return {
        "job_id": snap.job_id,
        "cpus": dict(snap.cpus),
        "affinity": {str(tid): format_cpulist(mask) for tid, mask in snap.affinity.items()},
    }


def snapshot_from_dict(d: Mapping[str, Any]) -> CpusetSnapshot:
    return CpusetSnapshot(
        job_id=int(d["job_id"]),
        cpus={str(k): str(v) for k, v in d["cpus"].items()},
        affinity={int(k): parse_cpulist(v) for k, v in d.get("affinity", {}).items()},
    )


class Enforcer:
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
        mechanisms: Iterable[str] = MECHANISMS,
    ) -> None:
        self.state = state
        self._save = save
        self.cpuset = cpuset
        self.quota = quota
        self.rdt = rdt
        self.root = root or SystemRoot()
        self.cgroup_version = cgroup_version
        self.mechanisms = frozenset(mechanisms)
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
        if job_id in self._phase and not any(
            (job_id, other) in self._settled for other in ("cpuset", "quota")
        ):
            del self._phase[job_id]

    # -- one tick -------------------------------------------------------------
    def reconcile(
        self, jobs: Mapping[int, CgroupJob], targets: Mapping[int, JobTarget]
    ) -> dict[int, JobResult]:
        """Bring every job in ``jobs`` to its target (absent = as Slurm set it), and
        forget jobs that ended. ``jobs`` are the cgroups seen this tick."""
        self._ticks += 1
        results: dict[int, JobResult] = {}
        with self._rdt_lock():
            for job_id in sorted(set(targets) | set(self.state.changes)):
                cg = jobs.get(job_id)
                if cg is None:
                    if job_id in self.state.changes:
                        results[job_id] = self._ended(job_id)
                    continue
                results[job_id] = self._job(cg, targets.get(job_id, JobTarget()))
            self._remove_unused_rdt_groups()
        self._remove_unused_quota_dirs(jobs, results)
        self.state.prune()
        return results

    def restore_all(
        self, jobs: Mapping[int, CgroupJob], only: frozenset[int] | None = None
    ) -> dict[int, JobResult]:
        """Put every job coda-node changed (or those of them ``only`` names) back as Slurm
        set it (SIGTERM, ``restore``, ``release`` without a daemon)."""
        results: dict[int, JobResult] = {}
        with self._rdt_lock():
            for job_id in sorted(self.state.changes):
                if only is not None and job_id not in only:
                    continue
                cg = jobs.get(job_id)
                if cg is None:
                    results[job_id] = self._ended(job_id)
                else:
                    results[job_id] = self._job(cg, JobTarget(), restoring=True)
            self._remove_unused_rdt_groups()
        self._remove_unused_quota_dirs(jobs, results)
        self.state.prune()
        return results

    def repair(self, cg: CgroupJob, allocation: frozenset[int]) -> JobResult:
        """Put a job back to ``allocation``, the CPUs Slurm reports it holds here, where
        coda-node's record of it is missing or cannot be trusted: every cpuset of the job
        to the allocation (:meth:`CpusetWriter.reset`), its CPU quota lifted (Slurm sets
        none) and its threads out of coda's resctrl groups. The job's record, if any, is
        dropped once all of that is done; until then it stays for a retry."""
        result = JobResult()
        with self._rdt_lock():
            try:
                if self.cpuset is not None and self.cpuset.reset(cg, allocation):
                    result.applied.append(
                        f"cpuset restored to {format_cpulist(allocation)} (Slurm's allocation)"
                    )
                if self.quota is not None and self.quota.set_quota(cg, None):
                    result.applied.append("cpu quota released")
                if self.rdt is not None:
                    tids = self.tids(cg)
                    for group in self.rdt.list_coda_groups():
                        if self.rdt.release_tasks(group, tids).moved:
                            result.applied.append(f"resctrl group {group} left")
            except JobGone:
                result.gone = True
            except (CgroupError, ResctrlError, ValueError) as exc:
                result.failed.append(f"repair: {exc}")
        if not result.failed:
            self.state.changes.pop(cg.job_id, None)
            for what in ("cpuset", "quota"):
                self._unsettle(cg.job_id, what)
        return result

    def _rdt_lock(self) -> contextlib.AbstractContextManager[None]:
        return self.rdt.locked() if self.rdt is not None else contextlib.nullcontext()

    def _write_ahead(self, job_id: int, ch: JobChanges) -> None:
        """Put ``ch`` on record for the job and on disk, fsynced, before the change it now
        covers is made. The record is (re)attached to the state first: a record that
        covered nothing a moment ago is not in the file, and may have been dropped."""
        self.state.changes[job_id] = ch
        self._save()

    def _remove_unused_quota_dirs(
        self, jobs: Mapping[int, CgroupJob], results: dict[int, JobResult]
    ) -> None:
        """Remove the v1 ``coda/job_<id>`` cpu cgroups no record covers: those of jobs that
        ended, and any a lost record left on a running job (its threads go back to the cpu
        hierarchy's root and its quota with the directory)."""
        if self.quota is None:
            return
        used = {j for j, c in self.state.changes.items() if c.quota_active}
        for job_id in self.quota.coda_dirs():
            if job_id in used:
                continue
            try:
                moved = self.quota.release(job_id)
            except CgroupError as exc:
                log.error("job=%d cannot remove coda's cpu cgroup: %s", job_id, exc)
                continue
            if job_id in jobs:
                r = results.setdefault(job_id, JobResult())
                r.applied.append("cpu quota released" + (" (no record of it)" if moved else ""))

    def _remove_unused_rdt_groups(self) -> None:
        """Remove coda's resctrl groups no recorded job uses: classes emptied this tick,
        and groups left by a daemon that crashed before recording them."""
        if self.rdt is None:
            return
        used = {c.rdt_group for c in self.state.changes.values() if c.rdt_group}
        for name in self.rdt.list_coda_groups():
            if name not in used:
                try:
                    self.rdt.remove_group(name)
                except ResctrlError as exc:
                    log.error("cannot remove resctrl group %s: %s", name, exc)

    # -- per job ----------------------------------------------------------------
    def _job(self, cg: CgroupJob, target: JobTarget, *, restoring: bool = False) -> JobResult:
        result = JobResult()
        ch = self.state.job(cg.job_id)
        steps: list[tuple[str, Callable[[CgroupJob, JobTarget, JobChanges, JobResult], None]]] = [
            ("cpuset", self._cpuset),
            ("quota", self._quota),
            ("rdt", self._rdt),
        ]
        for name, step in steps:
            # A mechanism turned off in coda.conf still undoes what it did before.
            wanted = target if (name in self.mechanisms and not restoring) else JobTarget()
            try:
                step(cg, wanted, ch, result)
            except JobGone:
                # It ended between sampling and writing: clean up what is ours (a v1
                # quota directory, an MB group) as for any ended job.
                ended = self._ended(cg.job_id)
                ended.applied[:0] = result.applied
                return ended
            except (CgroupError, ResctrlError) as exc:
                # The daemon logs each failure once, as a "failed: ..." event (job id first).
                result.failed.append(f"{name}: {exc}")
                log.debug("job=%d %s: %s", cg.job_id, name, exc)
            except Exception as exc:  # the per-job boundary: one job never stops the others
                result.failed.append(f"{name}: unexpected {type(exc).__name__}: {exc}")
                log.exception("job=%d %s failed unexpectedly", cg.job_id, name)
        return result

    def _cpuset(self, cg: CgroupJob, target: JobTarget, ch: JobChanges, r: JobResult) -> None:
        if self.cpuset is None:
            return
        if target.cpus is not None:
            if ch.cpuset_original is None:
                ch.cpuset_original = snapshot_to_dict(self.cpuset.snapshot(cg))
                ch.allocated_cpus = sorted(cg.cpus)
                # Slurm's setting is on disk before we change it.
                self._write_ahead(cg.job_id, ch)
            elif not {f"step_{s.name}" for s in cg.steps} <= set(ch.cpuset_original["cpus"]):
                # A step started since (slurmd gave it the full allocation): record how
                # Slurm set it, so that a restore puts it back too.
                fresh = snapshot_to_dict(self.cpuset.snapshot(cg))
                for rel, text in fresh["cpus"].items():
                    ch.cpuset_original["cpus"].setdefault(rel, text)
                for tid, mask in fresh["affinity"].items():
                    ch.cpuset_original["affinity"].setdefault(tid, mask)
                self._write_ahead(cg.job_id, ch)
            seen = _sampled(cg, target.cpus, with_tasks=False)
            if not self._is_settled(cg.job_id, "cpuset", seen):
                snap = snapshot_from_dict(ch.cpuset_original)
                written = self.cpuset.shrink(cg, target.cpus, snapshot=snap)
                if written:
                    r.applied.append(f"cpuset {format_cpulist(target.cpus)}")
                self._checked(cg.job_id, "cpuset", seen, written)
            ch.cpuset_applied = sorted(target.cpus)
        elif ch.cpuset_original is not None:
            self._unsettle(cg.job_id, "cpuset")
            snap = snapshot_from_dict(ch.cpuset_original)
            self.cpuset.restore(cg, snap)
            r.applied.append(f"cpuset restored to {snap.cpus.get('.', '?')}")
            ch.cpuset_original = None
            ch.cpuset_applied = None
            ch.allocated_cpus = None
            self._save()

    def _quota(self, cg: CgroupJob, target: JobTarget, ch: JobChanges, r: JobResult) -> None:
        if self.quota is None:
            return
        if target.quota_cores is not None:
            if not ch.quota_active:
                ch.quota_original = self.quota.original_quota(cg)
                ch.quota_active = True
                self._write_ahead(cg.job_id, ch)
            changed = ch.quota_applied != target.quota_cores
            seen = _sampled(cg, target.quota_cores, with_tasks=True)
            if not self._is_settled(cg.job_id, "quota", seen):
                # Checked every tick the job's tasks change: moves tasks that started (v1).
                written = self.quota.set_quota(cg, target.quota_cores)
                self._checked(cg.job_id, "quota", seen, written)
            if changed:
                r.applied.append(f"cpu quota {target.quota_cores:g} cores")
            ch.quota_applied = target.quota_cores
        elif ch.quota_active:
            self._unsettle(cg.job_id, "quota")
            self.quota.put_back(cg, ch.quota_original)
            r.applied.append("cpu quota released")
            ch.quota_active = False
            ch.quota_applied = None
            ch.quota_original = None
            self._save()

    def _rdt_class(self, target: JobTarget) -> RdtClass:
        """The control group class of a target: its MB value as the kernel takes it, and
        its L3 ways (a limit of the whole cache or more is no limit)."""
        assert self.rdt is not None
        info = self.rdt.info
        mb: int | None = None
        if target.mem_bw_pct is not None:
            if info.mb is None:
                raise ResctrlError(f"no MB resource: {info.mb_reason}")
            mb = mb_value(target.mem_bw_pct, info.mb)
        ways: int | None = None
        if target.l3_ways is not None:
            if info.l3 is None:
                raise ResctrlError(f"no L3 cache allocation: {info.l3_reason}")
            if target.l3_ways < info.l3.cbm_bits:
                ways = max(target.l3_ways, info.l3.min_cbm_bits)
        return RdtClass(mb=mb, l3_ways=ways)

    def _rdt(self, cg: CgroupJob, target: JobTarget, ch: JobChanges, r: JobResult) -> None:
        """One shared control group per class of limits (``coda_mb<v>``, ``coda_l3w<n>``,
        ``coda_mb<v>_l3w<n>``): CLOSIDs are few (often 8-16 per socket), so jobs limited
        alike share one. Each group's schemata limits only what its name says; the other
        resource keeps the new group's default (100 %, the full mask)."""
        if self.rdt is None:
            return
        want = self._rdt_class(target)
        l3_total = self.rdt.info.l3.cbm_bits if self.rdt.info.l3 else None
        had = RdtClass.of(ch.rdt_group) if ch.rdt_group is not None else None
        if want == RdtClass():
            if ch.rdt_group is not None:
                self._rdt_release(cg, ch)
                r.applied += _released_lines(had, want) or ["memory bandwidth released"]
                self._save()
            return
        name = want.group
        try:
            self.rdt.ensure_group(name)
        except OutOfIds as exc:
            shared = self._stricter_group(want, keep=ch.rdt_group)
            if shared is None and self._give_back_own_group(cg, ch, r):
                # The job's own (looser) group held a CLOSID only it used: try once more.
                had = None
                with contextlib.suppress(OutOfIds):
                    self.rdt.ensure_group(name)
                    shared = name
            if shared is None:
                raise ResctrlError(
                    f"no free CLOSID for a {' and '.join(want.describe(l3_total))} group "
                    f"and no stricter coda group to share ({exc})"
                ) from exc
            if shared != name and shared != ch.rdt_group:
                log.warning("job=%d no free CLOSID; sharing %s instead", cg.job_id, shared)
            name = shared
        if ch.rdt_group != name:
            if ch.rdt_group is not None:
                self._rdt_release(cg, ch)
            ch.rdt_group = name
            self._write_ahead(cg.job_id, ch)  # the group is on record before tasks move
            now = RdtClass.of(name) or RdtClass()
            before = had.describe(l3_total) if had else []
            r.applied += [line for line in now.describe(l3_total) if line not in before]
            r.applied += _released_lines(had, now)
        if name == want.group:
            self._set_class_schemata(want)
        # Every tick: threads started since the last one join the group.
        self.rdt.assign_tasks(name, self.tids(cg))

    def _give_back_own_group(self, cg: CgroupJob, ch: JobChanges, r: JobResult) -> bool:
        """Take the job out of its group and remove the group when no other job uses it
        (its CLOSID is then free for the job's new class). False when there is nothing to
        give back."""
        assert self.rdt is not None
        old = ch.rdt_group
        if old is None or any(
            c.rdt_group == old for c in self.state.changes.values() if c is not ch
        ):
            return False
        self._rdt_release(cg, ch)
        r.applied += _released_lines(RdtClass.of(old), RdtClass()) or ["memory bandwidth released"]
        self._save()
        self.rdt.remove_group(old)
        return True

    def _set_class_schemata(self, cls: RdtClass) -> None:
        """Write the limits of ``cls`` into its group, in every domain. The L3 mask is the
        *low* ways: Intel DDIO writes inbound PCIe traffic (a GPU job's input DMA) into a
        few ways at the top of the LLC by default (Intel Data Direct I/O Technology
        overview), so a CPU job kept to the low ways stays away from those lines."""
        assert self.rdt is not None
        info = self.rdt.info
        mb = None
        if cls.mb is not None and info.mb is not None:
            mb = dict.fromkeys(info.mb.domain_ids, cls.mb)
        l3 = None
        if cls.l3_ways is not None and info.l3 is not None:
            l3 = dict.fromkeys(info.l3.domain_ids, l3_mask(cls.l3_ways, info.l3, from_high=False))
        self.rdt.set_schemata(cls.group, mb=mb, l3=l3)

    def _rdt_release(self, cg: CgroupJob, ch: JobChanges) -> None:
        assert self.rdt is not None and ch.rdt_group is not None
        self.rdt.release_tasks(ch.rdt_group, self.tids(cg))
        ch.rdt_group = None

    def _stricter_group(self, want: RdtClass, keep: str | None = None) -> str | None:
        """An existing coda group at least as strict as ``want`` on every resource it
        limits (never looser), for when CLOSIDs run out. ``keep`` (the job's group now)
        when it qualifies, so a job does not hop between groups; else the closest: one
        that limits nothing else, then the smallest gap in MB, then in ways."""
        assert self.rdt is not None
        best: tuple[tuple[int, int, int], str] | None = None
        for name in self.rdt.list_coda_groups():
            cls = RdtClass.of(name)
            if cls is None or not cls.at_least_as_strict(want):
                continue
            if name == keep:
                return name
            extra = (want.mb is None and cls.mb is not None) + (
                want.l3_ways is None and cls.l3_ways is not None
            )
            gap_mb = want.mb - cls.mb if want.mb is not None and cls.mb is not None else 0
            gap_ways = (
                want.l3_ways - cls.l3_ways
                if want.l3_ways is not None and cls.l3_ways is not None
                else 0
            )
            key = (extra, gap_mb, gap_ways)
            if best is None or key < best[0]:
                best = (key, name)
        return best[1] if best else None

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
        """The job is gone; its cgroups went with it. Remove what is ours."""
        result = JobResult(gone=True)
        ch = self.state.changes.get(job_id)
        if ch is not None and ch.quota_active and self.quota is not None:
            try:
                self.quota.release(job_id)
            except CgroupError as exc:
                result.failed.append(f"quota clean-up: {exc}")
                log.debug("job=%d ended: quota clean-up: %s", job_id, exc)
                return result
        if ch is not None:
            ch.rdt_group = None  # its threads are gone; the group goes if no one else uses it
        self._forget(job_id)
        return result

    def _forget(self, job_id: int) -> None:
        self.state.changes.pop(job_id, None)
        for what in ("cpuset", "quota"):
            self._unsettle(job_id, what)
        self._save()


def _sampled(cg: CgroupJob, target: object, *, with_tasks: bool) -> object:
    """What a skipped check relies on: the target and the job as this tick's sample shows
    it (its CPUs, each step's CPUs, with ``with_tasks`` its tasks). None when the job was
    listed without its steps (or, ``with_tasks``, without its tasks): then nothing may be
    skipped."""
    if cg.detail == "cpus" or (with_tasks and cg.detail != "tasks"):
        return None
    steps = tuple((s.name, s.cpus) for s in cg.steps)
    return (target, cg.cpus, steps, cg.pids if with_tasks else None)


def _released_lines(had: RdtClass | None, now: RdtClass) -> list[str]:
    """The enforcer's lines for the resources ``had`` limited and ``now`` does not."""
    if had is None:
        return []
    out = []
    if had.mb is not None and now.mb is None:
        out.append("memory bandwidth released")
    if had.l3_ways is not None and now.l3_ways is None:
        out.append("L3 cache ways released")
    return out
