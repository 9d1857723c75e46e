"""Intel RDT through the kernel's resctrl filesystem: discovery, monitoring, control.

Three parts, kept apart on purpose (STYLE.md, "three layers"):

* **Discovery** (read-only): :func:`discover` reads ``info/`` and the mount options once at
  start-up and returns a :class:`ResctrlInfo`. A missing piece is a state with a reason in
  plain words, never an exception.
* **Monitoring** (read-only): :func:`read_mbm` reads a group's ``mon_data`` counters
  (:class:`MbmCounters` the same, with its paths joined once, for reads every tick);
  :meth:`MbmRate.between` turns two readings into bytes per second.
* **Control** (write-only): :class:`ResctrlControl` creates and removes groups and writes
  ``schemata`` and ``tasks``. Each call writes only what differs from what is already there
  and records the exact bytes it wrote.

Every path goes through :class:`coda_node.system.paths.SystemRoot`. "Kernel doc" below means
``Documentation/filesystems/resctrl.rst`` (``Documentation/arch/x86/resctrl.rst`` in older
trees); section names are quoted so they can be found in either.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coda_node.system.paths import SystemRoot

RESCTRL_MOUNT = "/sys/fs/resctrl"
GROUP_PREFIX = "coda_"
NOT_MOUNTED = "resctrl not mounted (Intel RDT absent or not enabled)"
MBA_MAX_PERCENT = 100
# The kernel's MBA_MAX_MBPS (U32_MAX): the "unlimited" MB value of a group in mba_MBps mode.
MBA_MAX_MBPS = 2**32 - 1
# What a mon_data event file holds instead of a number (fs/resctrl/ctrlmondata.c,
# rdtgroup_mondata_show): "Error" (-EIO), "Unavailable" (-EINVAL, e.g. just after an RMID
# was reset or a BMEC event was reconfigured) and "Unassigned" (mbm_event mode, no counter).
_NOT_A_COUNT = frozenset({"Error", "Unavailable", "Unassigned"})
_NAME_RE = re.compile(r"coda_[A-Za-z0-9_.-]{1,200}")
_MON_DOMAIN_RE = re.compile(r"mon_L3_(\d+)")


# --------------------------------------------------------------------------------------
# Discovery (read-only)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheAllocInfo:
    """``info/L3``: L3 cache allocation (CAT)."""

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int
    # info/L3/sparse_masks (newer kernels): 1 when non-contiguous masks are allowed. Absent
    # means contiguous only, which is what Intel CAT has always required.
    sparse_masks: bool
    domain_ids: tuple[int, ...]

    @property
    def cbm_bits(self) -> int:
        return self.cbm_mask.bit_count()


@dataclass(frozen=True, slots=True)
class MemBwAllocInfo:
    """``info/MB``: memory-bandwidth allocation (MBA)."""

    bandwidth_gran: int
    min_bandwidth: int
    num_closids: int
    delay_linear: bool
    # Mounted with -o mba_MBps: schemata MB values are MBps (the kernel's software
    # controller), not percentages.
    mba_mbps: bool
    thread_throttle_mode: str | None
    domain_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MonInfo:
    """``info/L3_MON``: RDT monitoring (CMT, MBM)."""

    num_rmids: int
    mon_features: tuple[str, ...]
    domain_ids: tuple[int, ...]

    @property
    def mbm_total(self) -> bool:
        return "mbm_total_bytes" in self.mon_features

    @property
    def mbm_local(self) -> bool:
        return "mbm_local_bytes" in self.mon_features

    @property
    def llc_occupancy(self) -> bool:
        return "llc_occupancy" in self.mon_features


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    """What resctrl offers on this node. ``*_reason`` says, in plain words, why a piece is
    missing; it is ``None`` when the piece is there."""

    mounted: bool
    reason: str | None  # why resctrl as a whole is unusable; None when it is usable
    mount_point: str | None = None  # as the system sees it, e.g. "/sys/fs/resctrl"
    mount_options: tuple[str, ...] = ()
    l3: CacheAllocInfo | None = None
    l3_reason: str | None = None
    mb: MemBwAllocInfo | None = None
    mb_reason: str | None = None
    mon: MonInfo | None = None
    mbm_reason: str | None = None
    # "The kernel uses the smallest number of CLOSIDs of all enabled resources as limit"
    # (kernel doc, "Info directory"). 0 when there is no allocation resource.
    num_closids: int = 0

    @property
    def usable(self) -> bool:
        return self.mounted and self.reason is None

    @property
    def can_allocate(self) -> bool:
        return self.usable and self.num_closids > 0

    @property
    def max_ctrl_groups(self) -> int:
        """Control groups that can be created: CLOSID 0 belongs to the default group."""
        return max(self.num_closids - 1, 0)

    @property
    def mbm(self) -> bool:
        return self.mon is not None and (self.mon.mbm_total or self.mon.mbm_local)


def _unescape_mount_field(field: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _find_resctrl_mount(mounts_text: str) -> tuple[str, tuple[str, ...]] | None:
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "resctrl":
            return _unescape_mount_field(parts[1]), tuple(parts[3].split(","))
    return None


def parse_schemata(text: str) -> dict[str, dict[int, int]]:
    """``L3:0=fffff;1=fffff`` / ``MB:0= 50;1=100`` lines -> {resource: {domain: value}}.

    Cache resources (L2*, L3*) are hex masks, the others decimal. The kernel pads names to
    the longest one ("%*s:"), and older kernels pad values too ("%0*x", "%*u"), so both
    are stripped. A line that is not numbers (a pseudo-locksetup group's "uninitialized") is
    left out.
    """
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name:
            continue
        base = 16 if name.startswith(("L2", "L3")) else 10
        values: dict[int, int] = {}
        try:
            for item in rest.split(";"):
                if not item.strip():
                    continue
                dom, _, val = item.partition("=")
                values[int(dom.strip(), 10)] = int(val.strip(), base)
        except ValueError:
            continue
        out[name] = values
    return out


def _read_text(path: Path) -> str:
    return path.read_text().strip()


def _read_int(path: Path, base: int = 10) -> int:
    return int(_read_text(path), base)


def _read_optional(path: Path) -> str | None:
    try:
        return _read_text(path)
    except FileNotFoundError:
        return None


def _discover_l3(
    info_dir: Path, schemata: Mapping[str, Mapping[int, int]]
) -> tuple[CacheAllocInfo | None, str | None]:
    d = info_dir / "L3"
    if not d.is_dir():
        if (info_dir / "L3CODE").is_dir():
            return None, (
                "L3 cache allocation is split into L3CODE/L3DATA (resctrl mounted with "
                "-o cdp); CODA only manages unified L3 masks"
            )
        return None, "no L3 cache allocation (info/L3 missing: CAT not supported or disabled)"
    try:
        sparse = _read_optional(d / "sparse_masks")
        shareable = _read_optional(d / "shareable_bits")
        l3 = CacheAllocInfo(
            cbm_mask=_read_int(d / "cbm_mask", 16),
            min_cbm_bits=_read_int(d / "min_cbm_bits"),
            num_closids=_read_int(d / "num_closids"),
            shareable_bits=int(shareable, 16) if shareable else 0,
            sparse_masks=sparse == "1",
            domain_ids=tuple(sorted(schemata.get("L3", {}))),
        )
    except (OSError, ValueError) as exc:
        return None, f"cannot read info/L3 ({exc})"
    return l3, None


def _discover_mb(
    info_dir: Path, schemata: Mapping[str, Mapping[int, int]], mba_mbps: bool
) -> tuple[MemBwAllocInfo | None, str | None]:
    d = info_dir / "MB"
    if not d.is_dir():
        return None, (
            "no memory-bandwidth allocation (info/MB missing: MBA not supported or disabled)"
        )
    try:
        mb = MemBwAllocInfo(
            bandwidth_gran=_read_int(d / "bandwidth_gran"),
            min_bandwidth=_read_int(d / "min_bandwidth"),
            num_closids=_read_int(d / "num_closids"),
            delay_linear=_read_int(d / "delay_linear") == 1,
            mba_mbps=mba_mbps,
            thread_throttle_mode=_read_optional(d / "thread_throttle_mode"),
            domain_ids=tuple(sorted(schemata.get("MB", {}))),
        )
    except (OSError, ValueError) as exc:
        return None, f"cannot read info/MB ({exc})"
    if mb.bandwidth_gran <= 0:
        return None, f"info/MB/bandwidth_gran is {mb.bandwidth_gran}; expected a positive step"
    return mb, None


def _mon_domain_ids(mon_data: Path) -> tuple[int, ...]:
    try:
        names = [p.name for p in mon_data.iterdir()]
    except OSError:
        return ()
    ids = [int(m.group(1)) for n in names if (m := _MON_DOMAIN_RE.fullmatch(n))]
    return tuple(sorted(ids))


def _discover_mon(info_dir: Path, resctrl: Path) -> tuple[MonInfo | None, str | None]:
    d = info_dir / "L3_MON"
    if not d.is_dir():
        return None, (
            "no memory-bandwidth monitoring (info/L3_MON missing: RDT monitoring not "
            "supported or disabled)"
        )
    try:
        mon = MonInfo(
            num_rmids=_read_int(d / "num_rmids"),
            mon_features=tuple(
                line.strip()
                for line in (d / "mon_features").read_text().splitlines()
                if line.strip()
            ),
            domain_ids=_mon_domain_ids(resctrl / "mon_data"),
        )
    except (OSError, ValueError) as exc:
        return None, f"cannot read info/L3_MON ({exc})"
    if not (mon.mbm_total or mon.mbm_local):
        return mon, (
            "no memory-bandwidth monitoring (L3_MON lists neither mbm_total_bytes nor "
            "mbm_local_bytes: this CPU monitors cache occupancy only)"
        )
    return mon, None


def _min_closids(info_dir: Path) -> int:
    counts = []
    try:
        subs = sorted(info_dir.iterdir())
    except OSError:
        return 0
    for sub in subs:
        try:
            counts.append(_read_int(sub / "num_closids"))
        except (OSError, ValueError):
            continue  # L3_MON has none; an unreadable one is reported by its own probe
    return min(counts, default=0)


def discover(root: SystemRoot) -> ResctrlInfo:
    """Probe resctrl once. Never raises for missing or odd hardware; says why instead."""
    try:
        mounts = root.path("/proc/self/mounts").read_text()
    except OSError as exc:
        return ResctrlInfo(False, f"cannot read /proc/self/mounts ({exc.strerror})")
    found = _find_resctrl_mount(mounts)
    if found is None:
        return ResctrlInfo(False, NOT_MOUNTED)
    mount_point, options = found
    path = root.path(mount_point)
    info_dir = path / "info"
    if not info_dir.is_dir():
        return ResctrlInfo(
            True,
            f"resctrl is mounted at {mount_point} but has no info/ directory",
            mount_point,
            options,
        )
    try:
        schemata = parse_schemata((path / "schemata").read_text())
    except FileNotFoundError:
        schemata = {}  # a monitoring-only system has no schemata file
    except OSError as exc:
        return ResctrlInfo(
            True, f"cannot read {mount_point}/schemata ({exc.strerror})", mount_point, options
        )
    l3, l3_reason = _discover_l3(info_dir, schemata)
    mb, mb_reason = _discover_mb(info_dir, schemata, "mba_MBps" in options)
    mon, mbm_reason = _discover_mon(info_dir, path)
    return ResctrlInfo(
        mounted=True,
        reason=None,
        mount_point=mount_point,
        mount_options=options,
        l3=l3,
        l3_reason=l3_reason,
        mb=mb,
        mb_reason=mb_reason,
        mon=mon,
        mbm_reason=mbm_reason,
        num_closids=_min_closids(info_dir),
    )


# --------------------------------------------------------------------------------------
# Monitoring (read-only)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MbmReading:
    """One L3 domain's counters for one group at one moment. ``None``: not a number now
    (the kernel said Unavailable/Error/Unassigned, or the event does not exist here)."""

    group: str  # relative to the resctrl root: "" (default group), "coda_j1",
    #             "coda_j1/mon_groups/coda_m1", "mon_groups/coda_m1"
    domain_id: int
    mbm_total_bytes: int | None
    mbm_local_bytes: int | None
    llc_occupancy_bytes: int | None
    monotonic_s: float
    # Inode of the group's directory. kernfs hands out a new inode number when a group is
    # removed and created again under the same name, so a change means "new RMID, the
    # counters started again": the two readings are not comparable.
    group_ino: int | None = None


def group_rel(ctrl_group: str = "", mon_group: str | None = None) -> str:
    """The group's path relative to the resctrl root ("" is the default group)."""
    if mon_group is None:
        return ctrl_group
    return f"{ctrl_group}/mon_groups/{mon_group}" if ctrl_group else f"mon_groups/{mon_group}"


def _read_count(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        # Absent event (not in mon_features) or the group vanished under us (job ended).
        return None
    if text in _NOT_A_COUNT:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_mbm(
    root: SystemRoot,
    info: ResctrlInfo,
    ctrl_group: str = "",
    mon_group: str | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    events: Collection[str] | None = None,
) -> tuple[MbmReading, ...]:
    """Read ``<group>/mon_data/mon_L3_<id>/*`` for every L3 domain, one reading per domain.

    A group that does not exist (any more) or a node without monitoring reads as ``()``.
    On SNC systems the ``mon_L3_<id>`` top-level files are already the sum over the
    sub-NUMA nodes (kernel doc, "Notes on Sub-NUMA Cluster mode"), so those are read.
    ``events``: read only these (the others are None). Each read of an event file makes
    the kernel read the counter on a CPU of that domain (an MSR read, by IPI), so a caller
    that needs one event reads one; it also skips listing ``mon_data`` and uses the domains
    found at discovery.
    """
    if not info.usable or info.mon is None or info.mount_point is None:
        return ()
    rel = group_rel(ctrl_group, mon_group)
    gdir = root.path(info.mount_point) / rel if rel else root.path(info.mount_point)
    try:
        ino = gdir.stat().st_ino
    except OSError:
        return ()
    mon_data = gdir / "mon_data"
    readings = []
    domain_ids = _mon_domain_ids(mon_data) if events is None else info.mon.domain_ids
    wanted = ("mbm_total_bytes", "mbm_local_bytes", "llc_occupancy")
    if events is not None:
        wanted = tuple(e for e in wanted if e in events)
    for domain_id in domain_ids:
        d = mon_data / f"mon_L3_{domain_id:02d}"
        counts = {e: _read_count(d / e) for e in wanted}
        total = counts.get("mbm_total_bytes")
        local = counts.get("mbm_local_bytes")
        occupancy = counts.get("llc_occupancy")
        readings.append(MbmReading(rel, domain_id, total, local, occupancy, clock(), ino))
    return tuple(readings)


# A counter file holds at most "18446744073709551615\n" or one of _NOT_A_COUNT; one read()
# of this size gets it whole (a longer file is read to its end all the same).
_COUNT_READ_BYTES = 4096


def _read_count_at(path: str) -> int | None:
    """:func:`_read_count` for a string path, with os.open/os.read: no Path, no TextIOWrapper.

    ``int`` takes the bytes as they are (surrounding whitespace and the newline included),
    so a number reads as :func:`_read_count` reads it; "Unavailable", "Error" and
    "Unassigned" (``_NOT_A_COUNT``) and anything else that is not a number read as None.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # absent event, or the group vanished under us (job ended)
    try:
        data = os.read(fd, _COUNT_READ_BYTES)
        if len(data) == _COUNT_READ_BYTES:  # never for a counter; read on as read_text does
            while more := os.read(fd, _COUNT_READ_BYTES):
                data += more
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return int(data)
    except ValueError:
        return None


class MbmCounters:
    """One group's counter files, their paths joined once, read as :func:`read_mbm` with
    ``events`` reads them, reading for reading.

    :class:`coda_node.sampling.mbm.JobBandwidth` reads every job's group on every tick (16
    groups x 2 L3 domains on the bench's node). Joining ``Path`` objects cost more than the reads,
    and ``Path.read_text`` about twice an os.open/os.read (docs/benchmarks.md, "coda-node:
    cost of one tick"), so the paths are strings made here, from the one root, once.

    They stay right as long as the group keeps its name and parent: a group that moves to
    another control group is another group (another path, another ``MbmCounters``). A
    group removed and made again under the same name has the same paths and a new inode,
    which every reading carries (see :class:`MbmReading`). The domains are those found at
    discovery, as in :func:`read_mbm` with ``events``: a domain whose ``mon_L3_<id>`` is
    missing reads as None, like a missing event.
    """

    __slots__ = ("_dir", "_files", "group")

    def __init__(
        self,
        root: SystemRoot,
        info: ResctrlInfo,
        ctrl_group: str = "",
        mon_group: str | None = None,
        *,
        events: Collection[str],
    ) -> None:
        self.group = group_rel(ctrl_group, mon_group)
        """The group's path relative to the resctrl root, as :attr:`MbmReading.group`."""
        self._dir: str | None = None
        self._files: tuple[tuple[int, str | None, str | None, str | None], ...] = ()
        if not info.usable or info.mon is None or info.mount_point is None:
            return  # reads as () like read_mbm
        base = root.path(info.mount_point)
        self._dir = os.fspath(base / self.group if self.group else base)

        def file(domain_id: int, event: str) -> str | None:
            if event not in events:
                return None
            return f"{self._dir}/mon_data/mon_L3_{domain_id:02d}/{event}"

        self._files = tuple(
            (
                domain_id,
                file(domain_id, "mbm_total_bytes"),
                file(domain_id, "mbm_local_bytes"),
                file(domain_id, "llc_occupancy"),
            )
            for domain_id in info.mon.domain_ids
        )

    def read(self, monotonic_s: float) -> tuple[MbmReading, ...]:
        """One reading per L3 domain, each stamped ``monotonic_s``; ``()`` when the group
        does not exist (any more)."""
        if self._dir is None:
            return ()
        try:
            ino = os.stat(self._dir).st_ino
        except OSError:
            return ()
        group = self.group
        return tuple(
            MbmReading(
                group,
                domain_id,
                None if total is None else _read_count_at(total),
                None if local is None else _read_count_at(local),
                None if occupancy is None else _read_count_at(occupancy),
                monotonic_s,
                ino,
            )
            for domain_id, total, local, occupancy in self._files
        )


def _per_s(prev: int | None, cur: int | None, interval_s: float) -> float | None:
    if prev is None or cur is None:
        return None
    if cur < prev:
        # The kernel extends the 24..62-bit hardware counter in software (mbm_overflow_count
        # adds the wrapped difference to a 64-bit running total), so the file never wraps in
        # practice. It does start again from 0 when the RMID is reset: a group re-created
        # under the same name, an RMID taken from the free list, a BMEC event
        # reconfiguration or an mbm_assign_mode change. A decrease therefore means "reset",
        # and the honest answer for this interval is "unknown", not a negative or wrapped
        # huge number.
        return None
    return (cur - prev) / interval_s


@dataclass(frozen=True, slots=True)
class MbmRate:
    """Bytes per second over one interval, one L3 domain. ``None``: not known this interval
    (a counter was not a number, or went backwards because it was reset)."""

    group: str
    domain_id: int
    interval_s: float
    mbm_total_bytes_per_s: float | None
    mbm_local_bytes_per_s: float | None

    @staticmethod
    def between(prev: MbmReading, cur: MbmReading) -> MbmRate | None:
        """Rate from ``prev`` to ``cur``; ``None`` when the two are not comparable (no time
        passed, or the group was re-created in between)."""
        if (prev.group, prev.domain_id) != (cur.group, cur.domain_id):
            raise ValueError(
                f"readings of different counters: {prev.group!r} domain {prev.domain_id} vs "
                f"{cur.group!r} domain {cur.domain_id}"
            )
        interval_s = cur.monotonic_s - prev.monotonic_s
        if interval_s <= 0:
            return None
        recreated = None not in (prev.group_ino, cur.group_ino) and (
            prev.group_ino != cur.group_ino
        )
        if recreated:
            return None
        return MbmRate(
            group=cur.group,
            domain_id=cur.domain_id,
            interval_s=interval_s,
            mbm_total_bytes_per_s=_per_s(prev.mbm_total_bytes, cur.mbm_total_bytes, interval_s),
            mbm_local_bytes_per_s=_per_s(prev.mbm_local_bytes, cur.mbm_local_bytes, interval_s),
        )


def group_mem_bw_bytes_per_s(
    prev: Sequence[MbmReading], cur: Sequence[MbmReading], *, local: bool = False
) -> float | None:
    """Sum over L3 domains of one group's rate (``mbm_total_bytes`` unless ``local``).

    ``None`` when any domain seen in ``cur`` has no rate this interval: a partial sum would
    read as a drop in bandwidth.
    """
    before = {r.domain_id: r for r in prev}
    total_bytes_per_s = 0.0
    if not cur:
        return None
    for reading in cur:
        earlier = before.get(reading.domain_id)
        if earlier is None:
            return None
        rate = MbmRate.between(earlier, reading)
        if rate is None:
            return None
        value = rate.mbm_local_bytes_per_s if local else rate.mbm_total_bytes_per_s
        if value is None:
            return None
        total_bytes_per_s += value
    return total_bytes_per_s


# --------------------------------------------------------------------------------------
# Control (write-only)
# --------------------------------------------------------------------------------------


class ResctrlError(Exception):
    """A resctrl operation failed. ``last_cmd_status`` is the kernel's own explanation
    (``info/last_cmd_status``) when there is one."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        errno_code: int | None = None,
        last_cmd_status: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.errno_code = errno_code
        self.last_cmd_status = last_cmd_status


class OutOfIds(ResctrlError):
    """No hardware id left for a new group; share an existing group instead."""


class OutOfClosids(OutOfIds):
    """mkdir of a control group failed with ENOSPC: every CLOSID is in use."""


class OutOfRmids(OutOfIds):
    """mkdir failed because no RMID is free (ENOSPC) or all free ones are still in limbo,
    tagged on cache lines of their previous user (EBUSY; kernel doc,
    "max_threshold_occupancy - generic concepts")."""


@dataclass(frozen=True, slots=True)
class Write:
    """Exactly what one write() call put into one resctrl file."""

    path: Path
    data: bytes


@dataclass(frozen=True, slots=True)
class AssignResult:
    moved: int  # written to the group's tasks file
    gone: int  # the kernel said ESRCH: the task exited before we got to it
    already: int  # already listed in the group's tasks file, nothing written


def write_once(path: Path, data: bytes) -> None:
    """One open + one write() + close, as ``echo ... > file`` does. No O_CREAT: a resctrl
    file that is not there is an error, not something to create."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", str(path))


def mb_percent_steps(mb: MemBwAllocInfo) -> list[int]:
    """Valid MB percentages, 100 down to ``min_bandwidth`` in ``bandwidth_gran`` steps."""
    steps = list(range(MBA_MAX_PERCENT, mb.min_bandwidth - 1, -mb.bandwidth_gran))
    return steps or [MBA_MAX_PERCENT]


def mb_value(requested: int, mb: MemBwAllocInfo) -> int:
    """What to write for a requested MB value.

    Percent mode: the largest step <= ``requested`` (rounded *down*, so a group never gets
    more than asked; the kernel itself would round up, kernel doc "Memory bandwidth
    Allocation and monitoring"), clamped to [min_bandwidth, 100]. mba_MBps mode: MBps, no
    steps, at least 1 and at most the kernel's u32 limit.
    """
    if mb.mba_mbps:
        return min(max(requested, 1), MBA_MAX_MBPS)
    steps = mb_percent_steps(mb)
    for step in steps:
        if step <= requested:
            return step
    return steps[-1]


def validate_l3_mask(mask: int, l3: CacheAllocInfo) -> None:
    """Raise ValueError unless the kernel would accept ``mask`` (checks as in the kernel's
    cbm_validate: inside cbm_mask, contiguous unless sparse_masks, min_cbm_bits)."""
    if mask <= 0:
        raise ValueError(
            f"L3 mask {mask:#x} is empty; at least {l3.min_cbm_bits} bit(s) are needed"
        )
    if mask & ~l3.cbm_mask:
        raise ValueError(f"L3 mask {mask:#x} has bits outside cbm_mask {l3.cbm_mask:#x}")
    low = mask & -mask
    first_run = ((mask + low) & ~mask) - low  # the lowest block of consecutive 1-bits
    if not l3.sparse_masks and first_run != mask:
        raise ValueError(f"L3 mask {mask:#x} is not contiguous; this CPU needs one block of 1-bits")
    if first_run.bit_count() < l3.min_cbm_bits:
        raise ValueError(
            f"L3 mask {mask:#x} has {first_run.bit_count()} consecutive bit(s); this CPU "
            f"needs at least {l3.min_cbm_bits} (info/L3/min_cbm_bits)"
        )


def l3_mask(ways: int, l3: CacheAllocInfo, from_high: bool = True) -> int:
    """A contiguous mask of ``ways`` bits inside cbm_mask, at its top or bottom end."""
    if not l3.min_cbm_bits <= ways <= l3.cbm_bits:
        raise ValueError(
            f"{ways} L3 ways requested; this cache allows {l3.min_cbm_bits}..{l3.cbm_bits}"
        )
    lowest = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1
    shift = lowest + l3.cbm_bits - ways if from_high else lowest
    mask = ((1 << ways) - 1) << shift
    validate_l3_mask(mask, l3)
    return mask


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"resctrl group name {name!r} must start with {GROUP_PREFIX!r} and use only "
            "letters, digits, '_', '.' and '-'"
        )


def _diff_line(
    resource: str,
    want: Mapping[int, int],
    have: Mapping[int, int],
    fmt: Callable[[int], str],
) -> str | None:
    """One schemata line with only the domains whose value changes ("When writing you only
    need to specify those values which you wish to change", kernel doc)."""
    changed = sorted(d for d, v in want.items() if have.get(d) != v)
    if not changed:
        return None
    return f"{resource}:" + ";".join(f"{d}={fmt(want[d])}" for d in changed) + "\n"


def _check_domains(resource: str, want: Mapping[int, int], domain_ids: Sequence[int]) -> None:
    unknown = sorted(set(want) - set(domain_ids))
    if unknown:
        raise ValueError(
            f"{resource} domain(s) {unknown} do not exist here; domains are {list(domain_ids)}"
        )


Mkdir = Callable[[Path], None]
Rmdir = Callable[[Path], None]
Writer = Callable[[Path, bytes], None]


class ResctrlControl:
    """Writes to resctrl; decides nothing.

    Injection points, for tests on a tree without a kernel behind it: ``mkdir``, ``rmdir``
    and ``write`` (one write() call of exactly these bytes to an existing file). A fixture
    passes functions that do what the kernel does (populate a new group, move tasks back
    on rmdir, reject bad values with errno and ``info/last_cmd_status``). Reads go straight
    to the files.
    """

    def __init__(
        self,
        root: SystemRoot,
        info: ResctrlInfo,
        *,
        mkdir: Mkdir = os.mkdir,
        rmdir: Rmdir = os.rmdir,
        write: Writer = write_once,
        recorded_writes: int = 256,
    ) -> None:
        if not info.usable or info.mount_point is None:
            raise ResctrlError(f"resctrl not usable: {info.reason}")
        self.info = info
        self.path = root.path(info.mount_point)
        self._mkdir = mkdir
        self._rmdir = rmdir
        self._write_fn = write
        # The last writes, oldest first, for `coda-node status` and tests; bounded because
        # the daemon runs for months.
        self.recent_writes: deque[Write] = deque(maxlen=recorded_writes)

    # -- helpers -----------------------------------------------------------------------

    def _last_cmd_status(self) -> str:
        try:
            return _read_text(self.path / "info" / "last_cmd_status")
        except OSError as exc:
            return f"(info/last_cmd_status unreadable: {exc.strerror})"

    def _error(
        self, what: str, path: Path, exc: OSError, cls: type[ResctrlError] = ResctrlError
    ) -> ResctrlError:
        status = self._last_cmd_status()
        code = exc.errno or 0
        name = errno.errorcode.get(code, str(code))
        return cls(
            f"{what} {path} failed: {name} ({os.strerror(code)}); kernel: {status}",
            path=path,
            errno_code=code,
            last_cmd_status=status,
        )

    def _write(self, path: Path, data: bytes) -> Write:
        try:
            self._write_fn(path, data)
        except OSError as exc:
            raise self._error(f"writing {data!r} to", path, exc) from exc
        record = Write(path, data)
        self.recent_writes.append(record)
        return record

    def _group_dir(self, ctrl_group: str, mon_group: str | None = None) -> Path:
        rel = group_rel(ctrl_group, mon_group)
        return self.path / rel if rel else self.path

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold flock(LOCK_EX) on the resctrl root, the protocol the kernel doc asks every
        application to follow around read-modify-write sequences ("Locking between
        applications")."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    # -- groups ------------------------------------------------------------------------

    def _make_dir(self, path: Path, what: str) -> Path:
        if path.is_dir():
            return path
        try:
            self._mkdir(path)
        except FileExistsError:
            return path
        except OSError as exc:
            status = self._last_cmd_status()
            if exc.errno == errno.EBUSY:
                raise self._error(f"creating {what}", path, exc, OutOfRmids) from exc
            if exc.errno == errno.ENOSPC:
                cls = OutOfRmids if "RMID" in status else OutOfClosids
                raise self._error(f"creating {what}", path, exc, cls) from exc
            raise self._error(f"creating {what}", path, exc) from exc
        return path

    def ensure_group(self, name: str) -> Path:
        """mkdir the control group ``name`` (one CLOSID, plus one RMID when monitoring is
        on). Already there is fine. OutOfClosids / OutOfRmids (both OutOfIds) when the
        hardware has no id left: the caller can put the job in an existing group."""
        _check_name(name)
        if not self.info.can_allocate:
            raise ResctrlError(
                f"cannot create resctrl group {name}: no allocation resource here "
                f"({self.info.mb_reason}; {self.info.l3_reason})"
            )
        return self._make_dir(self.path / name, "resctrl group")

    def remove_group(self, name: str) -> bool:
        """rmdir; the kernel moves the group's tasks back to the default group and removes
        its MON groups. Returns False when there was no such group."""
        _check_name(name)
        path = self.path / name
        try:
            self._rmdir(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("removing resctrl group", path, exc) from exc
        return True

    def ensure_mon_group(self, ctrl_name: str, mon_name: str) -> Path:
        """mkdir ``<ctrl>/mon_groups/<mon>`` (``ctrl_name`` "" is the default group): one
        RMID to watch a job's bandwidth without giving it its own CLOSID."""
        if ctrl_name:
            _check_name(ctrl_name)
        _check_name(mon_name)
        if self.info.mon is None:
            raise ResctrlError(f"cannot create monitoring group {mon_name}: {self.info.mbm_reason}")
        return self._make_dir(self._group_dir(ctrl_name, mon_name), "resctrl monitoring group")

    def remove_mon_group(self, ctrl_name: str, mon_name: str) -> bool:
        if ctrl_name:
            _check_name(ctrl_name)
        _check_name(mon_name)
        path = self._group_dir(ctrl_name, mon_name)
        try:
            self._rmdir(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error("removing resctrl monitoring group", path, exc) from exc
        return True

    def list_coda_groups(self) -> list[str]:
        """Control groups CODA made (``coda_*``), e.g. to clean up after a crash."""
        return sorted(
            p.name for p in self.path.iterdir() if p.name.startswith(GROUP_PREFIX) and p.is_dir()
        )

    def list_coda_mon_groups(self, ctrl_name: str = "") -> list[str]:
        mon_groups = self._group_dir(ctrl_name) / "mon_groups"
        try:
            entries = list(mon_groups.iterdir())
        except FileNotFoundError:
            return []
        return sorted(p.name for p in entries if p.name.startswith(GROUP_PREFIX) and p.is_dir())

    # -- schemata ----------------------------------------------------------------------

    def read_schemata(self, name: str) -> dict[str, dict[int, int]]:
        path = self._group_dir(name) / "schemata"
        try:
            return parse_schemata(path.read_text())
        except FileNotFoundError as exc:
            raise ResctrlError(
                f"resctrl group {name or '(default)'} does not exist ({path} missing)",
                path=path,
                errno_code=errno.ENOENT,
            ) from exc

    def set_schemata(
        self, name: str, mb: Mapping[int, int] | None = None, l3: Mapping[int, int] | None = None
    ) -> tuple[Write, ...]:
        """Set MB (percent, or MBps under mba_MBps) and/or L3 masks per domain.

        Everything is validated before anything is written. Then one resource per write()
        call, each carrying only the domains that change, so a kernel rejection names one
        resource in last_cmd_status. Returns the writes; ``()`` when nothing changed.
        """
        _check_name(name)
        lines: list[str] = []
        current = self.read_schemata(name)
        if mb is not None:
            if self.info.mb is None:
                raise ResctrlError(f"cannot set MB for {name}: {self.info.mb_reason}")
            want_mb = {d: mb_value(v, self.info.mb) for d, v in mb.items()}
            _check_domains("MB", want_mb, self.info.mb.domain_ids)
            line = _diff_line("MB", want_mb, current.get("MB", {}), str)
            if line:
                lines.append(line)
        if l3 is not None:
            if self.info.l3 is None:
                raise ResctrlError(f"cannot set L3 for {name}: {self.info.l3_reason}")
            for mask in l3.values():
                validate_l3_mask(mask, self.info.l3)
            _check_domains("L3", l3, self.info.l3.domain_ids)
            line = _diff_line("L3", l3, current.get("L3", {}), lambda m: f"{m:x}")
            if line:
                lines.append(line)
        path = self._group_dir(name) / "schemata"
        return tuple(self._write(path, line.encode()) for line in lines)

    # -- tasks -------------------------------------------------------------------------

    def read_tasks(self, ctrl_group: str, mon_group: str | None = None) -> set[int]:
        """Thread ids listed in the group's ``tasks`` file; empty when the group is gone."""
        try:
            text = (self._group_dir(ctrl_group, mon_group) / "tasks").read_text()
        except FileNotFoundError:
            return set()
        return {int(tok) for tok in text.split()}

    def _move(self, target: Path, pids: Iterable[int], listed: set[int]) -> AssignResult:
        moved = gone = already = 0
        for pid in dict.fromkeys(pids):  # de-duplicated, order kept
            if pid in listed:
                already += 1
                continue
            # One id per write(): older kernels parse the whole buffer as one integer
            # (rdtgroup_tasks_write); comma-separated lists are a later addition.
            try:
                self._write_fn(target, f"{pid}\n".encode())
            except ProcessLookupError:
                gone += 1  # ESRCH: "No task <pid>"; it exited, which is not an error here
                continue
            except OSError as exc:
                raise self._error(f"writing task {pid} to", target, exc) from exc
            self.recent_writes.append(Write(target, f"{pid}\n".encode()))
            moved += 1
        return AssignResult(moved, gone, already)

    def assign_tasks(self, name: str, pids: Iterable[int]) -> AssignResult:
        """Move tasks into control group ``name``, skipping those already there.

        resctrl moves *threads*: writing an id moves that one task only, and the tasks file
        lists thread ids. New threads and children inherit the group at clone time, so pass
        every thread id of a running job (``/proc/<pid>/task/*``).
        """
        _check_name(name)
        return self._move(self._group_dir(name) / "tasks", pids, self.read_tasks(name))

    def assign_mon_tasks(self, ctrl_name: str, mon_name: str, pids: Iterable[int]) -> AssignResult:
        """Move tasks into a MON group; they must already be in its parent control group
        (kernel doc, "tasks"), or the kernel answers EINVAL."""
        if ctrl_name:
            _check_name(ctrl_name)
        _check_name(mon_name)
        target = self._group_dir(ctrl_name, mon_name) / "tasks"
        return self._move(target, pids, self.read_tasks(ctrl_name, mon_name))

    def release_tasks(self, name: str, pids: Iterable[int]) -> AssignResult:
        """Move tasks of ``name`` back to the default group. Tasks no longer in ``name``
        (moved elsewhere since) are left where they are and counted as ``already``."""
        _check_name(name)
        members = self.read_tasks(name)
        wanted = list(dict.fromkeys(pids))
        result = self._move(self.path / "tasks", [p for p in wanted if p in members], set())
        return AssignResult(result.moved, result.gone, len(wanted) - result.moved - result.gone)
