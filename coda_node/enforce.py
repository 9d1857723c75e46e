"""Enforcement: make each job's cgroups match the plan, writing only what differs.

Every change is recorded in the state file *before* it is made (how Slurm had set the job),
so a crash at any point leaves enough on disk to put the job back. Each job is handled on
its own: an error on one job is reported in its :class:`JobResult` and the others go on.
This is one of the two places that catch every exception (the other is the submit hook).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coda_node.cgroups import (
    CgroupError,
    CgroupJob,
    CpuQuotaWriter,
    CpusetSnapshot,
    CpusetWriter,
    JobGone,
    format_cpulist,
    parse_cpulist,
)
from coda_node.paths import SystemRoot
from coda_node.policy import JobTarget
from coda_node.resctrl import OutOfIds, ResctrlControl, ResctrlError, mb_value
from coda_node.state import JobChanges, NodeState

log = logging.getLogger("coda-node")

MECHANISMS = ("cpuset", "quota", "rdt")


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

    # -- one tick -------------------------------------------------------------
    def reconcile(
        self, jobs: Mapping[int, CgroupJob], targets: Mapping[int, JobTarget]
    ) -> dict[int, JobResult]:
        """Bring every job in ``jobs`` to its target (absent = as Slurm set it), and
        forget jobs that ended. ``jobs`` are the cgroups seen this tick."""
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
        self.state.prune()
        return results

    def restore_all(self, jobs: Mapping[int, CgroupJob]) -> dict[int, JobResult]:
        """Put every job coda-node changed back as Slurm set it (SIGTERM, ``restore``)."""
        results: dict[int, JobResult] = {}
        with self._rdt_lock():
            for job_id in sorted(self.state.changes):
                cg = jobs.get(job_id)
                if cg is None:
                    results[job_id] = self._ended(job_id)
                else:
                    results[job_id] = self._job(cg, JobTarget(), restoring=True)
            self._remove_unused_rdt_groups()
        self.state.prune()
        return results

    def _rdt_lock(self) -> contextlib.AbstractContextManager[None]:
        return self.rdt.locked() if self.rdt is not None else contextlib.nullcontext()

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
                self._save()  # write-ahead: Slurm's setting is on disk before we change it
            elif not {f"step_{s.name}" for s in cg.steps} <= set(ch.cpuset_original["cpus"]):
                # A step started since (slurmd gave it the full allocation): record how
                # Slurm set it, so that a restore puts it back too.
                fresh = snapshot_to_dict(self.cpuset.snapshot(cg))
                for rel, text in fresh["cpus"].items():
                    ch.cpuset_original["cpus"].setdefault(rel, text)
                for tid, mask in fresh["affinity"].items():
                    ch.cpuset_original["affinity"].setdefault(tid, mask)
                self._save()
            snap = snapshot_from_dict(ch.cpuset_original)
            if self.cpuset.shrink(cg, target.cpus, snapshot=snap):
                r.applied.append(f"cpuset {format_cpulist(target.cpus)}")
            ch.cpuset_applied = sorted(target.cpus)
        elif ch.cpuset_original is not None:
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
                ch.quota_original = self.quota.read_quota(cg)
                ch.quota_active = True
                self._save()
            changed = ch.quota_applied != target.quota_cores
            # Called every tick while active: moves tasks that started since (v1).
            self.quota.set_quota(cg, target.quota_cores)
            if changed:
                r.applied.append(f"cpu quota {target.quota_cores:g} cores")
            ch.quota_applied = target.quota_cores
        elif ch.quota_active:
            self.quota.set_quota(cg, ch.quota_original)
            r.applied.append("cpu quota released")
            ch.quota_active = False
            ch.quota_applied = None
            ch.quota_original = None
            self._save()

    def _rdt(self, cg: CgroupJob, target: JobTarget, ch: JobChanges, r: JobResult) -> None:
        """One shared control group per MB level (``coda_mb<value>``): CLOSIDs are few
        (often 8-16 per socket), so jobs capped alike share one."""
        if self.rdt is None:
            return
        if target.mem_bw_pct is not None:
            info = self.rdt.info.mb
            if info is None:
                raise ResctrlError(f"no MB resource: {self.rdt.info.mb_reason}")
            value = mb_value(target.mem_bw_pct, info)
            name = f"coda_mb{value}"
            if ch.rdt_group not in (None, name):
                self._rdt_release(cg, ch)
            try:
                self.rdt.ensure_group(name)
            except OutOfIds as exc:
                name = self._stricter_group(value) or ""
                if not name:
                    raise ResctrlError(
                        f"no free CLOSID for a {value} MB group and no stricter coda group to "
                        f"share ({exc})"
                    ) from exc
                log.warning("job=%d no free CLOSID; sharing %s instead", cg.job_id, name)
            if ch.rdt_group != name:
                ch.rdt_group = name
                self._save()  # write-ahead: the group is on record before tasks move
                r.applied.append(f"memory bandwidth {name.removeprefix('coda_mb')}")
            domains = self.rdt.info.mb.domain_ids if self.rdt.info.mb else ()
            if name == f"coda_mb{value}":
                self.rdt.set_schemata(name, mb=dict.fromkeys(domains, value))
            # Every tick: threads started since the last one join the group.
            self.rdt.assign_tasks(name, self._tids(cg))
        elif ch.rdt_group is not None:
            self._rdt_release(cg, ch)
            r.applied.append("memory bandwidth released")
            self._save()

    def _rdt_release(self, cg: CgroupJob, ch: JobChanges) -> None:
        assert self.rdt is not None and ch.rdt_group is not None
        self.rdt.release_tasks(ch.rdt_group, self._tids(cg))
        ch.rdt_group = None

    def _stricter_group(self, value: int) -> str | None:
        """The existing coda MB group closest to ``value`` from below (never looser)."""
        assert self.rdt is not None
        best: tuple[int, str] | None = None
        for name in self.rdt.list_coda_groups():
            level = name.removeprefix("coda_mb")
            if not (name.startswith("coda_mb") and level.isdigit() and int(level) <= value):
                continue
            if best is None or int(level) > best[0]:
                best = (int(level), name)
        return best[1] if best else None

    def _tids(self, cg: CgroupJob) -> list[int]:
        """Thread ids of the job: resctrl moves threads, one id per write. On v1 the
        cgroup ``tasks`` files already list threads; on v2 ``cgroup.procs`` lists
        processes, whose threads are under /proc/<pid>/task."""
        if self.cgroup_version == 1:
            return list(cg.pids)
        tids: list[int] = []
        for pid in cg.pids:
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
        self._save()
