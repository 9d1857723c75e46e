"""Per-job memory bandwidth from resctrl monitoring groups (Intel RDT MBM): the reading.

The contention eliminator caps the CPU job that draws the most memory bandwidth, so it
needs each CPU job's bandwidth. resctrl counts bytes per RMID; a monitoring ("MON") group
is one RMID, and each CPU job gets one, named ``coda_j<job_id>``.

This is the sampling layer: :class:`JobBandwidth` reads the counters of the groups it is
told about and turns two readings into bytes per second; it never writes. Making the
groups, moving them when the job's control group changes and moving the job's threads in
is :mod:`coda_node.enforce.mongroups`, which tells the reader where each job's group is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import (
    MbmCounters,
    MbmReading,
    ResctrlError,
    ResctrlInfo,
    group_mem_bw_bytes_per_s,
)

JOB_GROUP_PREFIX = "coda_j"
_JOB_GROUP_RE = re.compile(r"coda_j(\d+)")


def mon_group_name(job_id: int) -> str:
    """The MON group of job ``job_id``: ``coda_j<job_id>``."""
    return f"{JOB_GROUP_PREFIX}{job_id}"


def job_of_mon_group(name: str) -> int | None:
    """``coda_j42`` -> 42; None for any other name (other tools' groups are left alone)."""
    m = _JOB_GROUP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(slots=True)
class _Counted:
    """What the reader keeps of one job's group (mutable bookkeeping, not a record)."""

    counters: MbmCounters
    """The group's counter files, paths joined once (they hold while its parent does)."""
    readings: tuple[MbmReading, ...] = ()
    rate_bytes_per_s: float | None = None


class JobBandwidth:
    """Reads each known job's MON group counters into bytes per second.

    Which groups exist, and under which control group, is told by the group owner
    (:meth:`read_from`, :meth:`stop`); a group it has not been told of is never read.
    """

    def __init__(self, root: SystemRoot, info: ResctrlInfo) -> None:
        if info.mon is None or not info.mbm:
            raise ResctrlError(f"no memory-bandwidth monitoring here: {info.mbm_reason}")
        self.root = root
        self.info = info
        # mbm_total_bytes counts traffic to every memory controller; use mbm_local_bytes
        # (this socket's only) just where the CPU has no total event.
        self.event = "mbm_total_bytes" if info.mon.mbm_total else "mbm_local_bytes"
        self._local = self.event == "mbm_local_bytes"
        self._counted: dict[int, _Counted] = {}

    # -- which groups -------------------------------------------------------------------

    def read_from(self, job_id: int, ctrl: str) -> None:
        """Read the job's group under control group ``ctrl`` ("" for the root) from now
        on, with no earlier reading. The paths of a group under another parent differ: a
        job whose group moves is told again, so they are joined here and nowhere else."""
        counters = MbmCounters(
            self.root, self.info, ctrl, mon_group_name(job_id), events=(self.event,)
        )
        self._counted[job_id] = _Counted(counters)

    def stop(self, job_id: int) -> None:
        """Read the job's group no more (it was removed)."""
        self._counted.pop(job_id, None)

    def stop_all(self) -> None:
        self._counted.clear()

    # -- reading ----------------------------------------------------------------------

    def first_reading(self, job_id: int, now_s: float) -> None:
        """Read the job's group once, right after its threads moved in, so that the next
        :meth:`sample` already gives a rate; no rate until then."""
        c = self._counted[job_id]
        c.readings = c.counters.read(now_s)
        c.rate_bytes_per_s = None

    def drop_rate(self, job_id: int) -> None:
        """No rate for the job until the next :meth:`sample` (its group lost threads)."""
        c = self._counted.get(job_id)
        if c is not None:
            c.rate_bytes_per_s = None

    def sample(self, now_s: float) -> None:
        """Read every group's counters once (stamped ``now_s``); each job's rate is then
        the bytes between this reading and the previous one, per second. A group with no
        earlier reading, re-created in between (new inode) or whose counter went back (an
        RMID reset) has no rate this time."""
        for c in self._counted.values():
            cur = c.counters.read(now_s)
            c.rate_bytes_per_s = (
                group_mem_bw_bytes_per_s(c.readings, cur, local=self._local) if c.readings else None
            )
            c.readings = cur

    def rate(self, job_id: int) -> float | None:
        """The job's group's bytes/s over the last two readings; None when it has no
        group or no rate yet."""
        c = self._counted.get(job_id)
        return c.rate_bytes_per_s if c is not None else None
