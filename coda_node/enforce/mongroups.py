"""One resctrl monitoring group per CPU job, holding the job's threads (Intel RDT MBM).

resctrl counts bytes per RMID; a monitoring ("MON") group is one RMID, and
:class:`JobMonitor` gives each CPU job one, named ``coda_j<job_id>``
(:func:`coda_node.sampling.mbm.mon_group_name`), and tells its reader
(:class:`coda_node.sampling.mbm.JobBandwidth`) where each group is.

Creating a MON group and moving a job's threads into it changes which RMID counts their
traffic and nothing else (no CLOSID, no schemata), so no job's resources change. The
kernel facts it follows (``Documentation/filesystems/resctrl.rst``, "Resource alloc and
monitor groups", "tasks"):

* A MON group lives under the control group that holds its tasks: ``mon_groups/`` of the
  root group normally, of ``coda_mb<level>`` while the enforcer caps the job. A task can be
  written into a MON group's ``tasks`` only if it is already in that parent.
* Moving a task into another control group gives it that group's RMID: the enforcer's
  throttle and release take the job's threads out of their MON group. The monitor then
  removes the old group and makes one under the new parent.
* Children inherit CLOSID and RMID at fork, so a job's new threads are counted without
  help; a new Slurm step's processes are forked by slurmstepd, not by the job's threads,
  so the job's thread list is read again every ``sync_every_s``.
* RMIDs are few (``info/L3_MON/num_rmids``, shared by every group) and a freed one can sit
  in "limbo" until its cache lines are evicted, so mkdir may fail now and work later. A job
  without a group stays unmonitored with a reason and is retried at the next sync.

Only CPU jobs get a group: the eliminator reads only their bandwidth (DNN jobs are never
throttled), and each RMID a DNN job held would be one fewer for the CPU jobs it needs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from coda_node.sampling.mbm import JobBandwidth, job_of_mon_group, mon_group_name
from coda_node.system.cgroups import CgroupError
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import (
    OutOfIds,
    ResctrlControl,
    ResctrlError,
    group_rel,
)

log = logging.getLogger("coda-node")

DEFAULT_SYNC_EVERY_S = 5.0


@dataclass(slots=True)
class _Group:
    """What the monitor knows of one job's MON group (mutable bookkeeping, not a record)."""

    ctrl: str
    """The parent control group: "" (root) or e.g. "coda_mb50"."""
    fresh: bool = True
    """Made or adopted and not yet given the job's threads and a first reading."""
    tids_s: float | None = None
    """When the job's threads were last read and moved in."""


class JobMonitor:
    """One resctrl MON group per CPU job; its reader turns their counters into bytes per
    second.

    ``sample`` reads (never writes); ``sync`` creates, moves and removes groups and moves
    threads, under the resctrl lock. Neither raises for a problem of one job: the job is
    listed in ``unmonitored`` with the reason, and the others go on.
    """

    def __init__(
        self,
        root: SystemRoot,
        control: ResctrlControl,
        *,
        sync_every_s: float = DEFAULT_SYNC_EVERY_S,
    ) -> None:
        self.reader = JobBandwidth(root, control.info)
        """Reads the groups this monitor keeps; told of each one made, moved or removed."""
        self.root = root
        self.control = control
        self.info = control.info
        self.sync_every_s = sync_every_s
        self._groups: dict[int, _Group] = {}
        self.unmonitored: dict[int, str] = {}
        """Jobs that should have a group but have none (or no threads in it), and why."""
        self._cleaned = False

    @property
    def event(self) -> str:
        """The counter read: ``mbm_total_bytes``, or ``mbm_local_bytes`` where there is no
        total."""
        return self.reader.event

    # -- reading ----------------------------------------------------------------------

    def sample(self, now_s: float) -> None:
        """Read every group's counters once (stamped ``now_s``): :meth:`JobBandwidth.sample`."""
        self.reader.sample(now_s)

    def rate(self, job_id: int) -> float | None:
        """The job's memory bandwidth in bytes/s over the last two readings; None when it
        has no group or no rate yet."""
        if job_id in self.unmonitored:
            return None  # a group short of some threads would under-count
        return self.reader.rate(job_id)

    def monitored(self) -> dict[int, str]:
        """Job -> its group's path under the resctrl root, for jobs whose group holds
        their threads."""
        return {
            j: group_rel(g.ctrl, mon_group_name(j))
            for j, g in sorted(self._groups.items())
            if j not in self.unmonitored
        }

    def status(self) -> dict[str, Any]:
        """For ``coda-node status``: what is monitored, what is not and why."""
        assert self.info.mon is not None
        return {
            "event": self.event,
            "num_rmids": self.info.mon.num_rmids,
            "monitored": sorted(self.monitored()),
            "unmonitored": [
                {"job_id": j, "reason": r} for j, r in sorted(self.unmonitored.items())
            ],
        }

    # -- writing ----------------------------------------------------------------------

    def sync(
        self,
        now_s: float,
        jobs: Iterable[int],
        ctrl_group_of: Callable[[int], str],
        tids: Callable[[int], Iterable[int] | None],
    ) -> None:
        """Give each job in ``jobs`` a group under ``ctrl_group_of(job)`` holding its
        threads, and remove the groups of every other job.

        ``tids(job)`` is the job's thread ids now, None when its cgroup is gone; it is
        called only for a job new to the monitor, one whose control group changed, and
        every ``sync_every_s``. Call this after the enforcer's ``reconcile`` returned:
        both take the resctrl lock, which does not nest.
        """
        wanted = set(jobs)
        try:
            with self.control.locked():
                if not self._cleaned:
                    self._adopt_or_remove_stale(wanted, ctrl_group_of)
                    self._cleaned = True
                for job_id in sorted(set(self._groups) - wanted):
                    self._drop(job_id)
                for job_id in set(self.unmonitored) - wanted:
                    del self.unmonitored[job_id]
                parents: dict[str, set[int]] = {}
                no_rmid: str | None = None
                # Jobs that have a group keep it before new ones ask for an RMID.
                for job_id in sorted(wanted, key=lambda j: (j not in self._groups, j)):
                    try:
                        self._sync_job(job_id, now_s, ctrl_group_of, tids, parents, no_rmid)
                    except OutOfIds as exc:
                        # Every later mkdir of this sync would fail alike: ask once.
                        no_rmid = self._no_rmid_reason(exc)
                        self._unmonitor(job_id, no_rmid)
                    except (ResctrlError, CgroupError, OSError, ValueError) as exc:
                        # ValueError: a parent group name resctrl.py refuses to touch.
                        self._unmonitor(job_id, str(exc))
        except OSError as exc:  # locked() itself: the resctrl mount went away
            log.error("memory-bandwidth monitoring: cannot lock resctrl (%s)", exc)

    def _sync_job(
        self,
        job_id: int,
        now_s: float,
        ctrl_group_of: Callable[[int], str],
        tids: Callable[[int], Iterable[int] | None],
        parents: dict[str, set[int]],
        no_rmid: str | None,
    ) -> None:
        name = mon_group_name(job_id)
        ctrl = ctrl_group_of(job_id)
        g = self._groups.get(job_id)
        if g is not None and g.ctrl != ctrl:
            # The enforcer moved the job's threads to another control group, which took
            # them out of this group: it counts nothing any more.
            self.control.remove_mon_group(g.ctrl, name)
            self._forget(job_id)
            g = None
        if g is None or not os.path.isdir(self._dir(ctrl, job_id)):
            if no_rmid is not None:
                self._unmonitor(job_id, no_rmid)
                return
            self.control.ensure_mon_group(ctrl, name)
            g = self._keep(job_id, ctrl)
        if g.fresh or g.tids_s is None or now_s - g.tids_s >= self.sync_every_s:
            first = g.tids_s is None
            ids = tids(job_id)
            if ids is None:  # its cgroup vanished: the job ended
                self._drop(job_id)
                self.unmonitored.pop(job_id, None)
                return
            # The group's own list first: in the steady state every thread is already in
            # it, and the parent's list (the default group's is every thread on the node
            # outside CODA's groups) is read only when one is not.
            listed = self.control.read_tasks(ctrl, name)
            new = [t for t in ids if t not in listed]
            if new:
                if ctrl not in parents:
                    parents[ctrl] = self.control.read_tasks(ctrl)
                # Only threads already in the parent can join ("tasks", kernel doc); any
                # other (moved elsewhere since the enforcer's pass) would fail with EINVAL.
                self.control.assign_mon_tasks(ctrl, name, [t for t in new if t in parents[ctrl]])
            g.tids_s = now_s
            if first:
                # Jobs found together would all re-read their threads on one tick: spread
                # them over the period by job id (golden-ratio steps).
                g.tids_s -= self.sync_every_s * ((job_id * 0.6180339887) % 1.0)
        if g.fresh:
            # The first reading now, right after the threads moved in, so that the next
            # sample already gives a rate.
            self.reader.first_reading(job_id, now_s)
            g.fresh = False
        if job_id in self.unmonitored:
            log.info("job=%d memory bandwidth monitored again (%s)", job_id, group_rel(ctrl, name))
            del self.unmonitored[job_id]

    def _no_rmid_reason(self, exc: ResctrlError) -> str:
        assert self.info.mon is not None
        return (
            f"no free RMID (this CPU has {self.info.mon.num_rmids}, all in use or not yet "
            f"reusable); kernel: {exc.last_cmd_status or exc}; retried each tick"
        )

    def _unmonitor(self, job_id: int, reason: str) -> None:
        if self.unmonitored.get(job_id) != reason:
            log.warning("job=%d memory bandwidth not monitored: %s", job_id, reason)
        self.unmonitored[job_id] = reason
        self.reader.drop_rate(job_id)

    def _keep(self, job_id: int, ctrl: str) -> _Group:
        """Book the job's group under ``ctrl`` (made or adopted) and have it read."""
        g = self._groups[job_id] = _Group(ctrl)
        self.reader.read_from(job_id, ctrl)
        return g

    def _forget(self, job_id: int) -> None:
        """Take the job's group off the books and out of the reader."""
        del self._groups[job_id]
        self.reader.stop(job_id)

    def _drop(self, job_id: int) -> None:
        """Remove the job's group; kept on the books (and retried) if rmdir fails."""
        g = self._groups[job_id]
        try:
            self.control.remove_mon_group(g.ctrl, mon_group_name(job_id))
        except ResctrlError as exc:
            log.error("job=%d cannot remove its monitoring group: %s", job_id, exc)
            return
        self._forget(job_id)

    def _dir(self, ctrl: str, job_id: int) -> str:
        # A string, not a Path: sync looks at every group each tick, and a Path join costs
        # more than the stat.
        return f"{os.fspath(self.control.path)}/{group_rel(ctrl, mon_group_name(job_id))}"

    def _coda_job_groups(self) -> list[tuple[str, str]]:
        return job_groups(self.control)

    def _adopt_or_remove_stale(self, wanted: set[int], ctrl_group_of: Callable[[int], str]) -> None:
        """Groups left by a daemon that was killed: keep (adopt) those of jobs to monitor
        that sit where they belong, which saves an RMID round trip; remove the rest."""
        for ctrl, name in self._coda_job_groups():
            job_id = job_of_mon_group(name)
            assert job_id is not None
            if job_id in wanted and job_id not in self._groups and ctrl == ctrl_group_of(job_id):
                self._keep(job_id, ctrl)
                continue
            try:
                self.control.remove_mon_group(ctrl, name)
                log.info("removed stale monitoring group %s", group_rel(ctrl, name))
            except ResctrlError as exc:
                log.error("cannot remove stale monitoring group %s: %s", name, exc)

    def close(self) -> None:
        """Remove every ``coda_j*`` MON group (SIGTERM, ``coda-node restore``); their
        threads go back to the parent control group's RMID."""
        remove_job_groups(self.control)
        self._groups.clear()
        self.reader.stop_all()
        self.unmonitored.clear()
        self._cleaned = False


def job_groups(control: ResctrlControl) -> list[tuple[str, str]]:
    """Every (parent control group, name) of a ``coda_j*`` MON group on the node."""
    found = []
    for ctrl in ["", *control.list_coda_groups()]:
        found += [
            (ctrl, name)
            for name in control.list_coda_mon_groups(ctrl)
            if job_of_mon_group(name) is not None
        ]
    return found


def remove_job_groups(control: ResctrlControl) -> None:
    """Remove every ``coda_j*`` MON group, also where no monitor runs now (a daemon killed
    while NodeJobMemBw=yes, restarted with it off): each holds one of the node's RMIDs."""
    try:
        with control.locked():
            for ctrl, name in job_groups(control):
                try:
                    control.remove_mon_group(ctrl, name)
                except ResctrlError as exc:
                    log.error("cannot remove monitoring group %s: %s", name, exc)
    except OSError as exc:
        log.error("memory-bandwidth monitoring: cannot clean up resctrl (%s)", exc)
