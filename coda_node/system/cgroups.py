"""Slurm's job cgroups: where they are, what they hold, and the two knobs CODA turns.

Three parts, in the order the daemon uses them:

1. :func:`discover_layout` reads ``/proc/self/mounts`` and finds Slurm's tree.
2. :func:`list_jobs` and :func:`cpu_usage_ns` read the jobs in it (sampling; never writes).
3. :class:`CpusetWriter` and :class:`CpuQuotaWriter` write cgroup files (enforcement; never
   decides). Every write goes through one method that writes the exact bytes and can record
   them in a journal, so tests assert the bytes written.

Slurm's layouts (22.05, ``src/plugins/cgroup/v1/xcgroup.c`` and ``src/plugins/cgroup/v2``):

- cgroup v1: ``<controller mount>/slurm/uid_<uid>/job_<id>/step_<step>/[task_<n>/]`` in each
  of cpuset, memory, freezer (proctrack/cgroup) and cpuacct (jobacct_gather/cgroup). The top
  directory is ``CgroupPrepend`` from cgroup.conf: ``/slurm``, or ``/slurm_<nodename>`` when
  slurmd is built with multiple-slurmd. Slurm does not create job directories in the v1
  ``cpu`` hierarchy (unless it is co-mounted with cpuacct).
- cgroup v2: ``<unified mount>/system.slice/[<nodename>_]slurmstepd.scope/<job>/
  step_<step>/{user/task_<n>,slurm}``; the scope's ``system/`` holds idle slurmstepds, and
  its ``slurmd/`` holds slurmd itself when slurmd was started without systemd (no
  ``INVOCATION_ID``: by hand, in a container), as every cgroup/v2 plugin from 22.05 puts it.
  ``<job>`` is ``job_<id>`` up to Slurm 25.11. From 26.05 it is the job's SLUID
  (``sEKNKTV3WPV500``: "s" and 13 Crockford base32 digits, ``src/common/sluid.h``) unless
  cgroup.conf sets ``CgroupJobIdPaths=yes`` (cgroup.conf(5); ``cgroup_p_step_create`` in
  ``src/plugins/cgroup/v2/cgroup_v2.c``). The name holds no job id: :func:`scan_jobs` asks
  a resolver built on Slurm's own record of the node's jobs (``squeue --json`` carries each
  job's SLUID) which job a SLUID names. Each slurmstepd names its job's directory by the
  setting it started with, so after a change of ``CgroupJobIdPaths`` one scope holds both
  forms, and a job whose later step started under the other setting has a directory of each.

Steps are named ``batch``, ``extern``, ``interactive``, ``<n>``, or ``<n>+<het component>``.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from coda_node.system.cpulist import format_cpulist, parse_cpulist
from coda_node.system.paths import SystemRoot

# The default CFS bandwidth period, 100 ms (Documentation/scheduler/sched-bwc.rst:
# "cpu.cfs_period_us: the length of a period (in microseconds)", default 100000; cgroup v2's
# cpu.max defaults to "max 100000").
CFS_PERIOD_US = 100_000
# sched-bwc.rst: "the minimum quota allowed for the quota and period is 1ms".
MIN_CFS_QUOTA_US = 1_000
# The daemon's own directory in the v1 cpu hierarchy: <cpu mount>/coda/job_<id>/.
CODA_CPU_DIR = "coda"

_V1_CONTROLLERS = ("cpuset", "cpu", "cpuacct", "freezer", "memory")
# errnos that mean "the cgroup or the task is no longer there": ENOENT (directory removed),
# ENODEV (a file opened before its cgroup was removed), ESRCH (the task exited).
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH})
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")
_V = TypeVar("_V")


# --------------------------------------------------------------------------------------------
# Errors


class CgroupError(Exception):
    """Base of every error this module raises about cgroup files."""


class CgroupReadError(CgroupError):
    """A cgroup file could not be read for a reason other than its job ending."""

    def __init__(self, path: Path, err_no: int, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.errno = err_no
        self.message = message


class EnforceError(CgroupError):
    """A cgroup write failed; ``path`` names the file, ``errno`` is the kernel's answer."""

    def __init__(self, path: Path, err_no: int, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.errno = err_no
        self.message = message


class JobGone(CgroupError):
    """The job's cgroup vanished (ENOENT/ENODEV/ESRCH): the job ended; nothing to enforce."""

    def __init__(self, job_id: int, path: Path | None = None) -> None:
        where = f" ({path} is gone)" if path is not None else ""
        super().__init__(f"job {job_id} ended{where}")
        self.job_id = job_id
        self.path = path


# --------------------------------------------------------------------------------------------
# cpulists


def _cpulist_bytes(cpus: Iterable[int]) -> bytes:
    # A zero-length write(2) to a kernfs file never reaches cpuset's parser (measured: writing
    # b"" leaves cpuset.cpus unchanged); a lone newline is how an empty list is written.
    return format_cpulist(cpus).encode() or b"\n"


# --------------------------------------------------------------------------------------------
# Layout discovery


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the cgroup hierarchies are mounted and where Slurm's tree is.

    ``version`` is the hierarchy Slurm's jobs are read from: 1 when a v1 cpuset hierarchy holds
    Slurm's tree, 2 when a cgroup2 mount holds ``slurmstepd.scope``; with no Slurm tree, the
    version the host would use (1 if a v1 cpuset is mounted, else 2 if cgroup2 is), or None if
    no cgroup filesystem is mounted at all. ``reason`` says why no Slurm tree was found.
    """

    root: SystemRoot
    version: Literal[1, 2] | None
    cpuset_mount: Path | None
    cpu_mount: Path | None
    cpuacct_mount: Path | None
    freezer_mount: Path | None
    unified_mount: Path | None
    slurm_dirs: tuple[Path, ...]
    reason: str | None

    @property
    def has_slurm(self) -> bool:
        return bool(self.slurm_dirs)


@dataclass(frozen=True, slots=True)
class _Mount:
    mount_point: str
    fs_type: str
    options: frozenset[str]


def _read_mounts(root: SystemRoot) -> list[_Mount]:
    path = root.path("/proc/self/mounts")
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CgroupReadError(path, exc.errno or 0, exc.strerror or str(exc)) from exc
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        # proc(5): spaces, tabs, newlines and backslashes in mount points are octal escapes.
        point = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1])
        mounts.append(_Mount(point, fields[2], frozenset(fields[3].split(","))))
    return mounts


def _v1_slurm_dirs(mount: Path, node_name: str | None = None) -> tuple[Path, ...]:
    """``slurm`` and ``slurm_<nodename>`` directories at the top of a v1 hierarchy; with
    ``node_name``, only ``slurm`` and that node's ``slurm_<node_name>``."""
    found = []
    for name in _list_dir(mount):
        if node_name is None:
            ours = name == "slurm" or name.startswith("slurm_")
        else:
            ours = name in ("slurm", f"slurm_{node_name}")
        if ours and (mount / name).is_dir():
            found.append(mount / name)
    return tuple(found)


def _v2_slurm_dirs(mount: Path, node_name: str | None = None) -> tuple[Path, ...]:
    """``system.slice/slurmstepd.scope`` (or ``<nodename>_slurmstepd.scope``) under a cgroup2;
    with ``node_name``, only the plain scope and that node's."""
    slice_dir = mount / "system.slice"
    found = []
    for name in _list_dir(slice_dir):
        if node_name is None:
            ours = name.endswith("slurmstepd.scope")
        else:
            ours = name in ("slurmstepd.scope", f"{node_name}_slurmstepd.scope")
        if ours and (slice_dir / name).is_dir():
            found.append(slice_dir / name)
    return tuple(found)


def discover_layout(root: SystemRoot, node_name: str | None = None) -> CgroupLayout:
    """Find the cgroup mounts and Slurm's tree. Reads only; a missing tree is a state.

    ``node_name`` (this node's ``NodeName``) keeps only this node's tree where one host runs
    several slurmd (multiple-slurmd: ``CgroupPrepend=/slurm_%n`` on v1, ``%n_slurmstepd.scope``
    on v2), so a daemon never reads or changes another node's jobs; None takes every tree.
    """
    mounts = _read_mounts(root)
    v1: dict[str, Path] = {}
    for m in mounts:
        if m.fs_type == "cgroup":
            for controller in _V1_CONTROLLERS:
                if controller in m.options:
                    v1.setdefault(controller, root.path(m.mount_point))
    unified = [root.path(m.mount_point) for m in mounts if m.fs_type == "cgroup2"]

    cpuset = v1.get("cpuset")
    v1_slurm = _v1_slurm_dirs(cpuset, node_name) if cpuset is not None else ()
    v2_slurm: tuple[Path, ...] = ()
    unified_mount = unified[0] if unified else None
    for mount in unified:
        scopes = _v2_slurm_dirs(mount, node_name)
        if scopes:
            unified_mount, v2_slurm = mount, scopes
            break

    version: Literal[1, 2] | None
    reason: str | None = None
    # Prefer v1 when Slurm's tree is in the v1 cpuset: on a hybrid host the cgroup2 mount at
    # /sys/fs/cgroup/unified has no controllers, and Slurm's v2 plugin needs a pure v2 host.
    if v1_slurm:
        version, slurm_dirs = 1, v1_slurm
    elif v2_slurm:
        version, slurm_dirs = 2, v2_slurm
    else:
        slurm_dirs = ()
        version = 1 if cpuset is not None else 2 if unified else None
        reason = _no_slurm_reason(v1, unified, node_name)
    return CgroupLayout(
        root=root,
        version=version,
        cpuset_mount=cpuset,
        cpu_mount=v1.get("cpu"),
        cpuacct_mount=v1.get("cpuacct"),
        freezer_mount=v1.get("freezer"),
        unified_mount=unified_mount,
        slurm_dirs=slurm_dirs,
        reason=reason,
    )


def _no_slurm_reason(
    v1: Mapping[str, Path], unified: list[Path], node_name: str | None = None
) -> str:
    if not v1 and not unified:
        return "no cgroup filesystem in /proc/self/mounts"
    why = []
    cpuset = v1.get("cpuset")
    if cpuset is not None:
        if node_name is None:
            why.append(f"no slurm*/ directory in {cpuset}")
        else:
            why.append(f"no slurm/ or slurm_{node_name}/ directory in {cpuset}")
            others = [p.name for p in _v1_slurm_dirs(cpuset)]
            if others:
                why.append(
                    f"{', '.join(others)} belong to other nodes' slurmd "
                    "(is NodeName= in coda.conf this node's name in slurm.conf?)"
                )
        elsewhere = [
            c
            for c in ("freezer", "memory", "cpuacct")
            if c in v1 and _v1_slurm_dirs(v1[c], node_name)
        ]
        if elsewhere:
            why.append(
                f"Slurm's tree is in the {'/'.join(elsewhere)} hierarchy only "
                "(ConstrainCores=no in cgroup.conf?)"
            )
    else:
        why.append("no cgroup v1 cpuset mounted")
    for mount in unified:
        if node_name is None:
            why.append(f"no system.slice/*slurmstepd.scope in {mount}")
            continue
        why.append(f"no system.slice/[{node_name}_]slurmstepd.scope in {mount}")
        others = [p.name for p in _v2_slurm_dirs(mount)]
        if others:
            why.append(
                f"{', '.join(others)} belong to other nodes' slurmd "
                "(is NodeName= in coda.conf this node's name in slurm.conf?)"
            )
    return "; ".join(why)


# --------------------------------------------------------------------------------------------
# Job discovery


@dataclass(frozen=True, slots=True)
class CgroupStep:
    job_id: int
    name: str  # "batch", "extern", "interactive", "0", "0+1"
    path: Path
    cpus: frozenset[int]
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CgroupJob:
    """One job's cgroup. ``path`` is the job's cpuset directory on v1, its directory on v2.

    ``pids`` are every task in the job's subtree, deduplicated and sorted: on v1 they come from
    ``tasks`` and are thread ids; on v2 from ``cgroup.procs`` (processes). ``detail`` says how
    much was read: ``"tasks"`` everything; ``"steps"`` the job's and each step's CPUs and mems,
    with ``pids`` (the job's and each step's) empty; ``"cpus"`` the job's CPUs only (no
    mems, steps or pids).
    """

    job_id: int
    uid: int | None
    path: Path
    cpus: frozenset[int]
    mems: str
    steps: tuple[CgroupStep, ...]
    pids: tuple[int, ...]
    detail: Detail = "tasks"


Detail = Literal["cpus", "steps", "tasks"]
"""How much of a job's cgroup tree :func:`list_jobs` reads (see :class:`CgroupJob`)."""
DETAIL_RANK: Mapping[str, int] = {"cpus": 0, "steps": 1, "tasks": 2}
"""Detail levels in order: a job read at one level has everything of the lower ones."""


_PIDS_FILE = {1: "tasks", 2: "cgroup.procs"}
# Per-thread lists, for sched_setaffinity(2), which acts on one thread.
_THREADS_FILE = {1: "tasks", 2: "cgroup.threads"}


_READ_CHUNK = 65536


def _read_file(path: str | os.PathLike[str]) -> str:
    """A small kernel file's text, read with os.open/os.read.

    A tick reads a few hundred cgroup and /proc files; ``Path.read_text`` (pathlib, then an
    io.TextIOWrapper) costs about twice this on cgroupfs (bench/bench_node_tick.py). Reads
    until end of file, so a long ``tasks`` list comes whole. Undecodable bytes (a thread's
    ``comm`` in /proc/<tid>/stat is not always UTF-8) are replaced, not fatal.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _READ_CHUNK)
        if data:
            more = os.read(fd, _READ_CHUNK)
            while more:
                data += more
                more = os.read(fd, _READ_CHUNK)
    except OSError as exc:
        exc.filename = os.fspath(path)  # read(2)'s errors name no file
        raise
    finally:
        os.close(fd)
    return data.decode(errors="replace")


def _list_dir(path: Path) -> list[str]:
    """Sorted entry names; a directory that is gone (its job ended) lists as empty."""
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS or exc.errno == errno.ENOTDIR:
            return []
        raise CgroupReadError(path, exc.errno or 0, exc.strerror or str(exc)) from exc


def _subdirs(path: str | Path) -> list[str]:
    """Sorted names of the subdirectories of ``path``; gone (the job ended) lists as empty.

    ``scandir`` gives the entry type from the directory itself (cgroupfs/kernfs fill
    d_type), so a tick does not stat every control file of every cgroup.
    """
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS or exc.errno == errno.ENOTDIR:
            return []
        raise CgroupReadError(Path(path), exc.errno or 0, exc.strerror or str(exc)) from exc


def _numbered(
    parent: Path, prefix: str, join: Callable[[Path, str], Path] | None = None
) -> list[tuple[int, Path]]:
    """``job_12`` -> (12, path) for the subdirectories of ``parent`` named ``<prefix><int>``;
    ``join`` makes the paths (default ``parent / name``)."""
    out = []
    for name in _subdirs(parent):
        suffix = name[len(prefix) :]
        if name.startswith(prefix) and suffix.isdecimal():
            out.append((int(suffix), join(parent, name) if join else parent / name))
    return out


# A SLUID as Slurm prints it (``print_sluid`` in src/common/sluid.c): "s", then 13 digits of
# Crockford's base32 (0-9 and A-Z without I, L, O, U), upper case.
_SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
# The scope's own directories (src/plugins/cgroup/v2/cgroup_v2.c): SYSTEM_CGDIR "system" for
# slurmstepd's infinity process, SLURMD_CGROUP "slurmd" for a slurmd not started by systemd.
_V2_SCOPE_OWN = frozenset({"system", "slurmd"})


def is_sluid(name: str) -> bool:
    """Whether ``name`` is a SLUID as Slurm 26.05 names a job's cgroup v2 directory."""
    return _SLUID.fullmatch(name) is not None


SluidResolver = Callable[[Collection[str]], Mapping[str, int]]
"""Given the SLUID-named job directories under Slurm's scope, the job id of each one that
Slurm's record names (those it does not name are left out)."""


@dataclass(frozen=True, slots=True)
class UnattributedDir:
    """A directory under Slurm's v2 scope that is no job coda-node can name, and why."""

    path: Path
    why: str


def _subtree(
    top: str | Path, listing: Callable[[str], list[str]] | None = None
) -> list[tuple[str, str]]:
    """(relative path, path) of ``top`` (as ``"."``) and every directory below, parents
    first. Paths are strings: a tick walks every limited job's tree, and joining strings
    costs a fraction of building Path objects."""
    top = os.fspath(top)
    listing = listing or _subdirs
    out = [(".", top)]
    for name in listing(top):
        out.extend(
            (name if rel == "." else f"{name}/{rel}", path)
            for rel, path in _subtree(f"{top}/{name}", listing)
        )
    return out


class SubdirCache:
    """What :func:`list_jobs` read in each detailed job's directories, read again only when
    a directory changes: their subdirectories, listed again when the link count changes,
    and the job's mems and each step's CPUs (``cpuset.cpus``), read again when the
    directory is another one (another inode: a step that ended and one that started). The
    job's own CPUs are read every pass.

    On cgroupfs (kernfs) a directory's ``st_nlink`` is 2 + its number of subdirectories,
    so one stat (about 3 µs here) stands in for a listing (about 11 µs: a v1 cpuset
    directory has 17 control files) and for a read of each file kept. A step that ends
    while another starts between two ticks leaves the count unchanged; the ended step's
    directory is then gone when stat'ed or read, and :func:`list_jobs` reads that job again
    without the cache. A file rewritten in a directory that stayed (someone narrowed a
    step's cpuset behind the daemon's back) is seen when the job is read afresh, once
    every ``refresh_every`` passes (:meth:`fresh`); the enforcer reads a settled job's
    cpusets in full on the same period (``enforce.VERIFY_EVERY_TICKS``), whatever the
    sample showed. Each job has its own pass in the period, so the jobs' fresh reads are
    spread over it rather than all made in one pass. Directories not seen in a pass are
    forgotten. It also keeps the Path of each directory (:meth:`path`).
    """

    def __init__(self, refresh_every: int = 10) -> None:
        self.refresh_every = refresh_every
        self._entries: dict[str, tuple[int, list[str]]] = {}
        self._values: dict[tuple[str, str], tuple[int, object]] = {}
        self._stats: dict[str, tuple[int, int]] = {}
        """This pass's (st_ino, st_nlink) of each directory looked at."""
        self._passes = 0
        self._paths: dict[str, Path] = {}
        self._old_paths: dict[str, Path] = {}
        """The previous period's Paths: one not asked for in a whole period is let go."""
        self._phase: dict[str, int] = {}
        """Job directory -> the pass, modulo ``refresh_every``, that reads it afresh."""
        self._tops: set[str] = set()
        """The job directories :meth:`fresh` was asked about in this pass."""

    def new_pass(self) -> None:
        """Called once per tick before the jobs are read."""
        self._passes += 1
        seen = self._stats
        for path in [p for p in self._entries if p not in seen]:
            del self._entries[path]
        for key in [k for k in self._values if k[0] not in seen]:
            del self._values[key]
        for top in [t for t in self._phase if t not in self._tops]:
            del self._phase[top]
        if self._passes % self.refresh_every == 0:
            self._old_paths, self._paths = self._paths, {}
        self._stats = {}
        self._tops = set()

    def fresh(self, top: str) -> bool:
        """Whether this pass reads job directory ``top`` afresh (lists and reads it
        without what is kept, and keeps the new readings): on one pass in every
        ``refresh_every``, the job's own. A job seen for the first time gets the pass
        fewest jobs have, so jobs that start together, or that the daemon starts
        limiting together, are spread evenly whatever their ids."""
        self._tops.add(top)
        phase = self._phase.get(top)
        if phase is None:
            load = [0] * self.refresh_every
            for other in self._phase.values():
                load[other] += 1
            now = self._passes % self.refresh_every
            # On a tie, the latest pass: a job just listed in full is not read afresh at
            # once (this walk is its first, a full period before the next).
            order = [(now - k) % self.refresh_every for k in range(self.refresh_every)]
            phase = self._phase[top] = min(order, key=load.__getitem__)
        return self._passes % self.refresh_every == phase

    def forget(self, top: str) -> None:
        """Drop ``top`` and everything below it."""
        below = top + "/"
        for path in [p for p in self._entries if p == top or p.startswith(below)]:
            del self._entries[path]
        for key in [k for k in self._values if k[0] == top or k[0].startswith(below)]:
            del self._values[key]
        for path in [p for p in self._stats if p == top or p.startswith(below)]:
            del self._stats[path]

    def path(self, parent: Path, name: str) -> Path:
        """``parent / name``, the same object from one pass to the next: a tick names each
        job's and step's directory, and a Path join costs as much as reading a file."""
        key = f"{os.fspath(parent)}/{name}"
        hit = self._paths.get(key)
        if hit is None:
            hit = self._old_paths.get(key)
            if hit is None:
                hit = parent / name
            self._paths[key] = hit
        return hit

    def _stat(self, path: str) -> tuple[int, int]:
        """(st_ino, st_nlink) of ``path`` now, kept for :meth:`value` in this pass; OSError
        when it is gone."""
        st = os.stat(path)
        hit = self._stats[path] = (st.st_ino, st.st_nlink)
        return hit

    def subdirs(self, path: str, *, fresh: bool = False) -> list[str]:
        """The subdirectories of ``path``, listed again when its link count changed (or
        with ``fresh``)."""
        try:
            _, nlink = self._stat(path)
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS or exc.errno == errno.ENOTDIR:
                self._entries.pop(path, None)
                return []
            raise CgroupReadError(Path(path), exc.errno or 0, exc.strerror or str(exc)) from exc
        hit = self._entries.get(path)
        if hit is not None and hit[0] == nlink and not fresh:
            return hit[1]
        names = _subdirs(path)
        self._entries[path] = (nlink, names)
        return names

    def value(self, path: str, what: str, read: Callable[[str], _V], *, fresh: bool = False) -> _V:
        """``read(path)``, kept as ``what`` while ``path`` is the same directory (read
        again with ``fresh``); raises the OSError of the stat or the read when it is gone.
        The directory's stat from :meth:`subdirs` in this pass is used when there is one."""
        ino, _ = self._stats.get(path) or self._stat(path)
        hit = self._values.get((path, what))
        if hit is not None and hit[0] == ino and not fresh:
            return hit[1]  # type: ignore[return-value]
        value = read(path)
        self._values[(path, what)] = (ino, value)
        return value


def _depth(rel: str) -> int:
    return 0 if rel == "." else rel.count("/") + 1


def _parent_rel(rel: str) -> str | None:
    if rel == ".":
        return None
    head, _, _ = rel.rpartition("/")
    return head or "."


def _read_pids(path: str | Path) -> tuple[int, ...]:
    """The task ids in a ``tasks`` or ``cgroup.procs`` file; CgroupReadError naming the
    file for anything the kernel does not print there."""
    text = _read_file(path)
    try:
        return tuple(int(line) for line in text.split())
    except ValueError:
        why = f"not a list of task ids: {text[:40]!r}"
        raise CgroupReadError(Path(path), errno.EINVAL, why) from None


@dataclass(slots=True)
class _Walk:
    """How one job's tree is listed, and whether anything listed was gone when read."""

    listing: Callable[[str], list[str]] | None = None
    """None: list afresh (:func:`_subdirs`)."""
    join: Callable[[Path, str], Path] | None = None
    """Makes a directory's Path from its parent's (default ``parent / name``)."""
    value: Callable[[str, str, Callable[[str], Any]], Any] | None = None
    """Reads a directory's mems or CPUs, or serves them kept (:meth:`SubdirCache.value`);
    None: read afresh."""
    gone: bool = False


def _subtree_pids(top: str | Path, pids_file: str, walk: _Walk | None = None) -> tuple[int, ...]:
    """Pids of ``top`` and its descendants; directories that vanish while read are skipped."""
    walk = walk or _Walk()
    pids: set[int] = set()
    for _, path in _subtree(top, walk.listing):
        try:
            pids.update(_read_pids(f"{path}/{pids_file}"))
        except OSError as exc:
            if exc.errno not in _GONE_ERRNOS:
                raise CgroupReadError(
                    Path(path, pids_file), exc.errno or 0, exc.strerror or str(exc)
                ) from exc
            walk.gone = True
    return tuple(sorted(pids))


def _read_cpuset_file(path: str | Path, name: str, version: int) -> str:
    """A cpuset file's text; on v2 ``""`` when the cpuset controller is off in that cgroup.

    On v1 the job's directories are in the cpuset hierarchy, so a missing file means the
    cgroup is gone (the OSError propagates). On v2 the files exist only where the parent
    enabled cpuset in ``cgroup.subtree_control`` (ConstrainCores=no leaves it off).
    """
    try:
        return _read_file(f"{os.fspath(path)}/{name}").strip()
    except FileNotFoundError:
        if version == 2 and os.path.isdir(path):
            return ""
        raise


def _dir_cpus(path: str | Path, version: int) -> frozenset[int]:
    cpus = _cpuset_cpus(path, "cpuset.cpus", version)
    if not cpus and version == 2:
        # v2: an empty cpuset.cpus means "same as the parent"; the kernel shows the result.
        cpus = _cpuset_cpus(path, "cpuset.cpus.effective", version)
    return cpus


def _cpuset_cpus(path: str | Path, name: str, version: int) -> frozenset[int]:
    """The CPUs in a cpuset file; CgroupReadError naming it for anything else."""
    text = _read_cpuset_file(path, name, version)
    try:
        return parse_cpulist(text)
    except ValueError:
        why = f"not a CPU list: {text[:40]!r}"
        raise CgroupReadError(Path(path, name), errno.EINVAL, why) from None


def _step_cpus(path: str | Path, version: int) -> frozenset[int]:
    """The CPUs a step's tasks may use. Slurm's cgroup/v2 puts them on the step's ``user/``
    level and leaves the step's own cpuset.cpus empty (its effective list is the job's);
    v1, and a v2 step without ``user/``, keep them in the step's directory."""
    if version == 2:
        try:
            return _dir_cpus(f"{os.fspath(path)}/user", version)
        except FileNotFoundError:
            pass
    return _dir_cpus(path, version)


def _dir_mems(path: str | Path, version: int) -> str:
    mems = _read_cpuset_file(path, "cpuset.mems", version)
    if not mems and version == 2:
        mems = _read_cpuset_file(path, "cpuset.mems.effective", version)
    return mems


def _read_job(
    layout: CgroupLayout,
    job_id: int,
    uid: int | None,
    job_dir: Path,
    *,
    detail: Detail = "tasks",
    walk: _Walk | None = None,
) -> CgroupJob | None:
    """The job at ``job_dir`` read to ``detail`` (see :class:`CgroupJob`), or None if it
    vanished while being read (the job ended). ``walk`` lists the directories (default:
    afresh) and records whether a listed one was gone when read."""
    walk = walk or _Walk()
    version = 2 if layout.version == 2 else 1
    pids_file = _PIDS_FILE[version]
    job_str = os.fspath(job_dir)

    def dir_mems(path: str) -> str:
        return _dir_mems(path, version)

    try:
        cpus = _dir_cpus(job_str, version)
        if detail == "cpus":
            return CgroupJob(job_id, uid, job_dir, cpus, "", steps=(), pids=(), detail="cpus")
        # Listed before anything else is read in it: a kept mems or step CPUs is then
        # checked against the stat the listing made (SubdirCache.value).
        subdirs = (walk.listing or _subdirs)(job_str)
        mems = walk.value(job_str, "mems", dir_mems) if walk.value else dir_mems(job_str)
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return None
        where = Path(exc.filename) if exc.filename else job_dir
        raise CgroupReadError(where, exc.errno or 0, exc.strerror or str(exc)) from exc
    tasks = detail == "tasks"
    steps = _read_steps(job_id, job_dir, subdirs, version, walk, tasks=tasks)
    if not os.path.isdir(job_str):
        return None
    if not tasks:
        return CgroupJob(job_id, uid, job_dir, cpus, mems, tuple(steps), pids=(), detail="steps")
    pids = _job_pids(job_dir, subdirs, steps, pids_file, walk)
    return CgroupJob(
        job_id=job_id,
        uid=uid,
        path=job_dir,
        cpus=cpus,
        mems=mems,
        steps=tuple(steps),
        pids=tuple(sorted(pids)),
    )


def _read_steps(
    job_id: int,
    job_dir: Path,
    subdirs: list[str],
    version: int,
    walk: _Walk,
    *,
    tasks: bool,
) -> list[CgroupStep]:
    """The steps below ``job_dir`` (its ``step_*`` directories), with their tasks when
    ``tasks``; a step gone while read is left out and recorded on ``walk``."""
    job_str = os.fspath(job_dir)
    pids_file = _PIDS_FILE[version]

    def step_cpus(path: str) -> frozenset[int]:
        return _step_cpus(path, version)

    steps = []
    for name in subdirs:
        if not name.startswith("step_"):
            continue
        step_str = f"{job_str}/{name}"
        step_pids = _subtree_pids(step_str, pids_file, walk) if tasks else ()
        try:
            if walk.value is not None:
                cpus_now = walk.value(step_str, "cpus", step_cpus)
            else:
                cpus_now = step_cpus(step_str)
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS:
                walk.gone = True
                continue  # the step ended; the job goes on
            raise CgroupReadError(Path(step_str), exc.errno or 0, exc.strerror or str(exc)) from exc
        steps.append(
            CgroupStep(
                job_id=job_id,
                name=name[len("step_") :],
                path=walk.join(job_dir, name) if walk.join else job_dir / name,
                cpus=cpus_now,
                pids=step_pids,
            )
        )
    return steps


def _job_pids(
    job_dir: Path,
    subdirs: list[str],
    steps: list[CgroupStep],
    pids_file: str,
    walk: _Walk,
) -> set[int]:
    """The job's tasks: its steps' (already read) and any in the job directory itself or
    in a non-step directory below it; one walk of the tree, not two."""
    job_str = os.fspath(job_dir)
    pids: set[int] = {p for step in steps for p in step.pids}
    try:
        pids.update(_read_pids(f"{job_str}/{pids_file}"))
    except OSError as exc:
        if exc.errno not in _GONE_ERRNOS:
            err = exc.strerror or str(exc)
            raise CgroupReadError(job_dir / pids_file, exc.errno or 0, err) from exc
    for name in subdirs:
        if not name.startswith("step_"):
            pids.update(_subtree_pids(f"{job_str}/{name}", pids_file, walk))
    return pids


@dataclass(frozen=True, slots=True)
class JobScan:
    """What :func:`scan_jobs` found: the jobs by id, the directories under Slurm's v2
    scope that it could not attribute to one (each is to be reported, never skipped), and
    the jobs whose directory is there but could not be read, by id, each with one line
    naming the file and why (a job's own processes can write some of its files)."""

    jobs: dict[int, CgroupJob]
    unattributed: tuple[UnattributedDir, ...] = ()
    unreadable: dict[int, str] = field(default_factory=dict)


def _v2_job_dirs(
    top: Path,
    resolve: SluidResolver | None,
    join: Callable[[Path, str], Path] | None,
) -> tuple[list[tuple[int, int | None, Path]], list[UnattributedDir]]:
    """The job directories in one v2 scope, ``job_<id>`` and SLUID-named, by job id; and the
    directories that name no job coda-node knows."""
    found: list[tuple[int, int | None, Path]] = []
    other: list[str] = []
    for name in _subdirs(top):
        suffix = name[len("job_") :]
        if name.startswith("job_") and suffix.isdecimal():
            found.append((int(suffix), None, join(top, name) if join else top / name))
        elif name not in _V2_SCOPE_OWN:
            other.append(name)
    unattributed = []
    sluids = [n for n in other if is_sluid(n)]
    ids = resolve(sluids) if (sluids and resolve is not None) else {}
    for name in other:
        path = join(top, name) if join else top / name
        job_id = ids.get(name)
        if job_id is not None:
            found.append((job_id, None, path))
        elif not is_sluid(name):
            why = "not a job directory as Slurm names one (job_<id> or a SLUID)"
            unattributed.append(UnattributedDir(path, why))
        elif resolve is None:
            unattributed.append(UnattributedDir(path, "a SLUID, and Slurm was not asked"))
        else:
            why = "a SLUID that Slurm's record of this node's jobs does not name"
            unattributed.append(UnattributedDir(path, why))
    return found, unattributed


def scan_jobs(
    layout: CgroupLayout,
    *,
    detail: Callable[[int], Detail] | None = None,
    cache: SubdirCache | None = None,
    resolve: SluidResolver | None = None,
) -> JobScan:
    """Every job in Slurm's tree, by job id, and the v2 job directories that could not be
    attributed. Jobs that end while being read are left out. A job whose directory cannot
    be read (a file that holds no list the kernel prints, an I/O error) is in
    ``unreadable`` instead, and the other jobs are read as usual.

    ``resolve`` names the job of each SLUID-named v2 directory (Slurm 26.05 and later; see
    the module's docstring); without it such directories are reported as unattributed.
    With several ``slurm_<nodename>`` trees (multiple-slurmd) a job id seen twice keeps the
    first tree's entry; a v2 job with two directories (``CgroupJobIdPaths`` changed while it
    ran) keeps its ``job_<id>`` one and reports the other. ``detail(job_id)`` says how much
    of each job to read (default ``"tasks"``: everything; see :class:`CgroupJob`): the
    daemon reads steps only of jobs it may change, and tasks only where a change it makes
    acts on tasks, which keeps a tick on a node of many jobs to a few reads per job. With
    ``cache`` (kept between ticks) the directories inside each detailed job are listed only
    when they changed; the directories that hold the jobs are always listed afresh, so a
    new job is never missed.
    """
    if cache is not None:
        cache.new_pass()
    join = cache.path if cache is not None else None
    found, unattributed = _job_dirs(layout, resolve, join)
    jobs: dict[int, CgroupJob] = {}
    unreadable: dict[int, str] = {}
    seen: dict[int, Path] = {}
    for job_id, uid, job_dir in found:
        if job_id in seen:
            if layout.version == 2 and job_dir.parent == seen[job_id].parent:
                why = (
                    f"a second directory of job {job_id} beside {seen[job_id].name} "
                    "(CgroupJobIdPaths changed while the job ran); only that one is read"
                )
                unattributed.append(UnattributedDir(job_dir, why))
            continue
        seen[job_id] = job_dir
        want: Detail = detail(job_id) if detail is not None else "tasks"
        try:
            if cache is None or want == "cpus":
                job = _read_job(layout, job_id, uid, job_dir, detail=want)
            else:
                job = _read_job_cached(layout, job_id, uid, job_dir, want, cache)
        except CgroupReadError as exc:
            unreadable[job_id] = _one_line(str(exc))
            continue
        except OSError as exc:
            if exc.errno not in _GONE_ERRNOS:
                why = f"{exc.filename or job_dir}: {exc.strerror or exc}"
                unreadable[job_id] = _one_line(why)
            continue
        if job is not None:
            jobs[job_id] = job
    return JobScan(jobs, tuple(unattributed), unreadable)


def _one_line(text: str) -> str:
    """``text`` with every character that is not printable escaped: a path below a job's
    directory is named by the job's own processes, and a log line is one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _job_dirs(
    layout: CgroupLayout,
    resolve: SluidResolver | None,
    join: Callable[[Path, str], Path] | None,
) -> tuple[list[tuple[int, int | None, Path]], list[UnattributedDir]]:
    """Every job directory in Slurm's trees as (job id, owner uid or None, path), in tree
    order; and the v2 directories that name no job coda-node knows."""
    found: list[tuple[int, int | None, Path]] = []
    unattributed: list[UnattributedDir] = []
    for top in layout.slurm_dirs:
        if layout.version == 1:
            for owner, uid_dir in _numbered(top, "uid_", join):
                found.extend(
                    (job_id, owner, job_dir) for job_id, job_dir in _numbered(uid_dir, "job_", join)
                )
        else:
            in_scope, unknown = _v2_job_dirs(top, resolve, join)
            found.extend(in_scope)
            unattributed.extend(unknown)
    return found, unattributed


def _read_job_cached(
    layout: CgroupLayout,
    job_id: int,
    uid: int | None,
    job_dir: Path,
    want: Detail,
    cache: SubdirCache,
) -> CgroupJob | None:
    """:func:`_read_job` with its directories listed through ``cache``, and read again
    listing afresh when something the cache listed had gone."""
    if cache.fresh(os.fspath(job_dir)):
        walk = _Walk(
            listing=functools.partial(cache.subdirs, fresh=True),
            join=cache.path,
            value=functools.partial(cache.value, fresh=True),
        )
    else:
        walk = _Walk(listing=cache.subdirs, join=cache.path, value=cache.value)
    job = _read_job(layout, job_id, uid, job_dir, detail=want, walk=walk)
    if walk.gone:
        # Something listed from the cache had gone: a step ended, and another may
        # have started under the same link count. Read the job again, listing afresh.
        cache.forget(os.fspath(job_dir))
        walk = _Walk(listing=cache.subdirs, join=cache.path, value=cache.value)
        job = _read_job(layout, job_id, uid, job_dir, detail=want, walk=walk)
    return job


def list_jobs(
    layout: CgroupLayout,
    *,
    detail: Callable[[int], Detail] | None = None,
    cache: SubdirCache | None = None,
    resolve: SluidResolver | None = None,
) -> dict[int, CgroupJob]:
    """Every job in Slurm's tree, by job id: :func:`scan_jobs` without the directories it
    could not attribute."""
    return scan_jobs(layout, detail=detail, cache=cache, resolve=resolve).jobs


def read_job(layout: CgroupLayout, job: CgroupJob, detail: Detail = "tasks") -> CgroupJob | None:
    """``job`` read again to ``detail`` (a job listed with less); None when it ended
    meanwhile."""
    return _read_job(layout, job.job_id, job.uid, job.path, detail=detail)


def job_tasks(layout: CgroupLayout, job: CgroupJob) -> tuple[int, ...] | None:
    """The tasks of ``job``'s whole subtree now, as :func:`read_job` gives them (v1: thread
    ids from ``tasks``; v2: process ids from ``cgroup.procs``; deduplicated, sorted), but
    without reading any directory's CPUs or mems; None when the job ended. For a caller that
    needs only the tasks of a job listed with less (the bandwidth monitor's thread re-read):
    5 reads of the fixture's 10 for a job with three steps."""
    version = 2 if layout.version == 2 else 1
    pids = _subtree_pids(job.path, _PIDS_FILE[version])
    if not os.path.isdir(job.path):
        return None
    return pids


def _thread_cpu_ticks(root: SystemRoot, tid: int) -> int | None:
    """utime + stime of one thread, in clock ticks; None if it exited."""
    # /proc/<tid>/stat reports the whole thread group's times for any of its threads, so
    # summing it over a v1 ``tasks`` list (thread ids) would count a process once per thread;
    # /proc/<tid>/task/<tid>/stat is the thread alone (proc(5)).
    path = f"{os.fspath(root.proc)}/{tid}/task/{tid}/stat"
    try:
        text = _read_file(path)
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return None
        raise CgroupReadError(Path(path), exc.errno or 0, exc.strerror or str(exc)) from exc
    # Field 2 (comm) is in parentheses and may hold spaces and ")"; fields 14 and 15 (utime,
    # stime) are the 12th and 13th after the last ")" (proc(5)).
    fields = text[text.rindex(")") + 1 :].split()
    return int(fields[11]) + int(fields[12])


def cpu_usage_ns(layout: CgroupLayout, job: CgroupJob) -> int | None:
    """CPU time the job has used, in ns, or None when nothing could be read.

    v2: ``cpu.stat`` usage_usec. v1: ``cpuacct.usage`` of the job's directory in the cpuacct
    hierarchy when Slurm made one (jobacct_gather/cgroup), else the utime + stime of the job's
    live threads from /proc (time of threads that already exited is not counted).
    """
    if layout.version == 2:
        path = job.path / "cpu.stat"
        try:
            text = _read_file(path)
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS:
                return None
            raise CgroupReadError(path, exc.errno or 0, exc.strerror or str(exc)) from exc
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1_000
        return None
    if layout.cpuacct_mount is not None and layout.cpuset_mount is not None:
        # The same directory in the cpuacct hierarchy. Joined as strings: this runs for
        # every job every tick, and Path.relative_to plus two joins cost more than the read.
        job_str, cpuset = os.fspath(job.path), os.fspath(layout.cpuset_mount)
        if job_str.startswith(cpuset + "/"):
            path = f"{os.fspath(layout.cpuacct_mount)}{job_str[len(cpuset) :]}/cpuacct.usage"
            try:
                return int(_read_file(path))
            except OSError as exc:
                if exc.errno not in _GONE_ERRNOS:
                    err = exc.strerror or str(exc)
                    raise CgroupReadError(Path(path), exc.errno or 0, err) from exc
    ticks = [_thread_cpu_ticks(layout.root, pid) for pid in job.pids]
    alive = [t for t in ticks if t is not None]
    if not alive:
        return None
    return sum(alive) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# Enforcement

Journal = list[tuple[Path, bytes]]
WriteFile = Callable[[Path, bytes], None]
MakeDir = Callable[[Path], None]
RemoveDir = Callable[[Path], None]
GetAffinity = Callable[[int], Set[int]]
SetAffinity = Callable[[int, frozenset[int]], None]


def write_cgroup_file(path: Path, data: bytes) -> None:
    """One write(2) of ``data`` to an existing file (cgroupfs parses each write on its own)."""
    # No O_CREAT: a cgroup file that is missing means its cgroup is gone. O_TRUNC is what a
    # shell's ">" does; kernfs ignores it, and it keeps plain fixture files exact.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", str(path))


class _CgroupWriter:
    """The one place cgroup files are written, and OSError is translated."""

    def __init__(
        self,
        layout: CgroupLayout,
        *,
        journal: Journal | None = None,
        write_file: WriteFile = write_cgroup_file,
    ) -> None:
        if layout.version is None:
            raise ValueError(f"no cgroup filesystem to enforce with ({layout.reason})")
        self.layout = layout
        self.journal = journal
        self._write_file = write_file

    @property
    def _version(self) -> int:
        return 2 if self.layout.version == 2 else 1

    def _write(self, path: Path, data: bytes, job_id: int | None) -> None:
        """Write ``data`` to ``path``; with ``job_id``, "gone" errnos raise JobGone."""
        try:
            self._write_file(path, data)
        except OSError as exc:
            raise _translate(exc, path, job_id, f"write {data!r}") from exc
        if self.journal is not None:
            self.journal.append((path, data))

    def _read(self, path: Path, job_id: int | None) -> str:
        try:
            return _read_file(path)
        except OSError as exc:
            raise _translate(exc, path, job_id, "read") from exc


def _translate(exc: OSError, path: Path, job_id: int | None, what: str) -> CgroupError:
    err_no = exc.errno or 0
    if job_id is not None and err_no in _GONE_ERRNOS:
        return JobGone(job_id, path)
    return EnforceError(path, err_no, f"{what} failed: {os.strerror(err_no) if err_no else exc}")


@dataclass(frozen=True, slots=True)
class CpusetSnapshot:
    """A job's cpusets and task affinities as Slurm set them, to restore exactly.

    ``cpus`` maps the path relative to the job's directory (``"."`` for the job itself,
    ``"step_0/task_0"``) to its ``cpuset.cpus`` text; ``affinity`` maps thread ids to masks.
    """

    job_id: int
    cpus: Mapping[str, str]
    affinity: Mapping[int, frozenset[int]]


class CpusetWriter(_CgroupWriter):
    """Shrinks a job's cpusets and restores them, in the order the kernel accepts.

    cgroup v1 keeps every cpuset a subset of its parent (Documentation/admin-guide/cgroup-v1/
    cpusets.rst; measured on 6.18: shrinking a parent below a child's CPUs gives EBUSY, giving a
    child CPUs its parent lacks gives EACCES). So CPUs are added parents first and removed
    children first. v2 allows either order; the same order is used there.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        *,
        journal: Journal | None = None,
        write_file: WriteFile = write_cgroup_file,
        get_affinity: GetAffinity = os.sched_getaffinity,
        set_affinity: SetAffinity = os.sched_setaffinity,
    ) -> None:
        super().__init__(layout, journal=journal, write_file=write_file)
        self._get_affinity = get_affinity
        self._set_affinity = set_affinity

    def _current(self, job: CgroupJob) -> dict[str, tuple[str, str]]:
        """rel -> (dir, cpuset.cpus text) for the job's directory and all below it, now."""
        if not os.path.isdir(job.path):
            raise JobGone(job.job_id, job.path)
        current: dict[str, tuple[str, str]] = {}
        for rel, path in _subtree(job.path):
            try:
                current[rel] = (path, _read_file(f"{path}/cpuset.cpus").strip())
            except OSError as exc:
                file = Path(path, "cpuset.cpus")
                if rel == "." and exc.errno == errno.ENOENT and os.path.isdir(path):
                    raise EnforceError(
                        file,
                        errno.ENOENT,
                        "no cpuset.cpus: the cpuset controller is not enabled for this job",
                    ) from exc
                if rel == ".":
                    raise _translate(exc, file, job.job_id, "read") from exc
                if exc.errno not in _GONE_ERRNOS:
                    raise _translate(exc, file, None, "read") from exc
                # a step or task that ended while we looked: nothing to write there
        return current

    def _effective(self, path: Path, job_id: int) -> frozenset[int]:
        """v2: the CPUs ``path`` may use (cpuset.cpus, else cpuset.cpus.effective)."""
        try:
            return _dir_cpus(path, 2)
        except OSError as exc:
            raise _translate(exc, path / "cpuset.cpus", job_id, "read") from exc

    def _threads(self, path: str) -> tuple[int, ...]:
        name = _THREADS_FILE[self._version]
        if self._version == 2 and not os.path.exists(f"{path}/{name}"):
            name = _PIDS_FILE[2]
        try:
            return _read_pids(f"{path}/{name}")
        except OSError as exc:
            if exc.errno in _GONE_ERRNOS:
                return ()
            raise _translate(exc, Path(path, name), None, "read") from exc

    def snapshot(self, job: CgroupJob) -> CpusetSnapshot:
        """The job's cpusets (job and every descendant) and each thread's affinity, now."""
        current = self._current(job)
        affinity: dict[int, frozenset[int]] = {}
        for path, _ in current.values():
            for tid in self._threads(path):
                try:
                    affinity[tid] = frozenset(self._get_affinity(tid))
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    path_tid = self.layout.root.proc / str(tid)
                    raise _translate(exc, path_tid, None, "sched_getaffinity") from exc
        return CpusetSnapshot(
            job_id=job.job_id,
            cpus={rel: text for rel, (_, text) in current.items()},
            affinity=affinity,
        )

    def shrink(
        self, job: CgroupJob, cpus: Iterable[int], snapshot: CpusetSnapshot | None = None
    ) -> int:
        """Confine the job to ``cpus``; returns the number of files written.

        Each descendant gets its CPUs intersected with its parent's new CPUs, or all of the
        parent's if that is empty; empty descendants (v2: inheriting; v1: holding no task) are
        left alone. With ``snapshot`` (what :meth:`snapshot` stored before the first shrink) the
        allocation and each descendant's CPUs are Slurm's, so shrinking again to another subset
        does not compound; without it they are the files' current contents.
        """
        target_job = frozenset(cpus)
        current = self._current(job)
        base = {rel: parse_cpulist(text) for rel, (_, text) in current.items()}
        if snapshot is not None:
            for rel, text in snapshot.cpus.items():
                if rel in base:
                    base[rel] = parse_cpulist(text)
        allocation = base["."]
        if not allocation and self._version == 2:
            # v2: an empty cpuset.cpus inherits; the job may use what its parent has.
            allocation = self._effective(job.path.parent, job.job_id)
        if not target_job:
            raise ValueError(f"job {job.job_id}: cannot shrink to no CPUs")
        if not target_job <= allocation:
            raise ValueError(
                f"job {job.job_id}: CPUs {format_cpulist(target_job - allocation)} are outside "
                f"its allocation {format_cpulist(allocation)}"
            )
        targets: dict[str, frozenset[int]] = {}
        for rel in sorted(current, key=lambda r: (_depth(r), r)):
            if rel == ".":
                targets[rel] = target_job
                continue
            if not base[rel]:
                continue
            above = self._nearest(rel, targets) or target_job
            targets[rel] = (base[rel] & above) or above
        return self._apply(job, current, targets)

    def restore(self, job: CgroupJob, snapshot: CpusetSnapshot) -> int:
        """Put back the cpusets in ``snapshot``, then every thread's affinity.

        Directories made since the snapshot keep their CPUs. Widening a v1 cpuset gives each
        task its last sched_setaffinity(2) mask ∩ the new cpuset (measured on 6.18), so a task
        that set its affinity while shrunk (an OpenMP runtime pinning to what it sees) stays
        narrow. Hence each thread gets its snapshot mask (∩ its cpuset) again, and threads that
        appeared since get their cpuset's CPUs. Returns the number of files written.
        """
        if snapshot.job_id != job.job_id:
            raise ValueError(f"snapshot of job {snapshot.job_id} given for job {job.job_id}")
        current = self._current(job)
        targets = {
            rel: parse_cpulist(text)
            for rel, text in snapshot.cpus.items()
            # An empty v1 cpuset holds no task: nothing to put back (and writing it empty
            # would fail with ENOSPC if Slurm has since given it CPUs and tasks).
            if rel in current and (text.strip() or rel == "." or self._version == 2)
        }
        written = self._apply(job, current, targets)
        effective = {rel: parse_cpulist(text) for rel, (_, text) in current.items()}
        effective.update(targets)
        if not effective["."] and self._version == 2:
            effective["."] = self._effective(job.path, job.job_id)
        for rel, (path, _) in sorted(current.items(), key=lambda item: (_depth(item[0]), item[0])):
            allowed = self._nearest(rel, effective, include_self=True)
            if not allowed:
                continue
            for tid in self._threads(path):
                recorded = snapshot.affinity.get(tid)
                mask = (recorded & allowed if recorded is not None else allowed) or allowed
                try:
                    self._set_affinity(tid, mask)
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    path_tid = self.layout.root.proc / str(tid)
                    raise _translate(exc, path_tid, None, "sched_setaffinity") from exc
        return written

    def reset(self, job: CgroupJob, allocation: Iterable[int]) -> int:
        """Put the job back to ``allocation`` (the CPUs Slurm reports it holds here) where
        there is no snapshot to restore from. Slurm gives the job's own cpuset and each
        step's (batch, extern, and a step over the whole allocation) the allocation; when
        one of them differs, the job was changed, and its cpuset and every non-empty one
        below it get the whole allocation, every thread its cpuset's CPUs. A step or task
        that Slurm had bound to fewer of the job's CPUs then gets them all: which ones it
        had is what a snapshot would have said. A job whose own and steps' cpusets hold
        the allocation is left as it is (its tasks may be narrower by Slurm's choice).
        Returns the number of files written."""
        cpus = frozenset(allocation)
        if not cpus:
            raise ValueError(f"job {job.job_id}: Slurm reports no CPUs for it on this node")
        current = self._current(job)
        held = {rel: parse_cpulist(text) for rel, (_, text) in current.items()}
        if self._version == 2 and not held["."]:
            held["."] = self._effective(job.path, job.job_id)  # empty inherits
        if all(c == cpus for rel, c in held.items() if _depth(rel) <= 1 and (c or rel == ".")):
            return 0
        text = format_cpulist(cpus)
        snapshot = CpusetSnapshot(
            job_id=job.job_id,
            cpus={rel: text for rel, c in held.items() if c or rel == "."},
            affinity={},
        )
        return self.restore(job, snapshot)

    @staticmethod
    def _nearest(
        rel: str, cpus: Mapping[str, frozenset[int]], *, include_self: bool = False
    ) -> frozenset[int]:
        """The CPUs of ``rel`` (with ``include_self``) or its nearest ancestor that has some."""
        at: str | None = rel if include_self else _parent_rel(rel)
        while at is not None:
            if cpus.get(at):
                return cpus[at]
            at = _parent_rel(at)
        return frozenset()

    def _apply(
        self,
        job: CgroupJob,
        current: Mapping[str, tuple[str, str]],
        targets: Mapping[str, frozenset[int]],
    ) -> int:
        """Move each directory in ``targets`` from its current CPUs to its target.

        Two passes keep every intermediate state legal on v1: parents first, each directory
        gains the CPUs it lacks (keeping those its children still hold); then children first,
        each drops the CPUs it must lose.
        """
        now = {rel: parse_cpulist(text) for rel, (_, text) in current.items()}
        children: dict[str, list[str]] = {}
        for rel in current:
            parent = _parent_rel(rel)
            if parent is not None:
                children.setdefault(parent, []).append(rel)
        order = sorted(targets, key=lambda r: (_depth(r), r))
        written = 0
        for rel in order:
            want = targets[rel]
            if want - now[rel]:
                held = frozenset().union(*(now[c] for c in children.get(rel, ())))
                step = want | held
                file = Path(current[rel][0], "cpuset.cpus")
                self._write(file, _cpulist_bytes(step), job.job_id)
                now[rel] = step
                written += 1
        for rel in reversed(order):
            if now[rel] != targets[rel]:
                data = _cpulist_bytes(targets[rel])
                self._write(Path(current[rel][0], "cpuset.cpus"), data, job.job_id)
                now[rel] = targets[rel]
                written += 1
        return written


class CpuQuotaWriter(_CgroupWriter):
    """Caps a job's CPU time with CFS bandwidth control (Documentation/scheduler/sched-bwc.rst).

    v2: ``cpu.max`` of the job's directory, after enabling the cpu controller in
    ``cgroup.subtree_control`` of each ancestor that lacks it. v1: Slurm does not make job
    directories in the ``cpu`` hierarchy unless it is co-mounted with cpuacct (then its job
    directory there is used). Otherwise the daemon makes its own ``<cpu>/coda/job_<id>/`` and
    moves the job's tasks into it; tasks they fork stay there, but steps started later begin
    outside, so calling :meth:`set_quota` again moves them.
    """

    def __init__(
        self,
        layout: CgroupLayout,
        *,
        journal: Journal | None = None,
        write_file: WriteFile = write_cgroup_file,
        mkdir: MakeDir = os.mkdir,
        rmdir: RemoveDir = os.rmdir,
    ) -> None:
        super().__init__(layout, journal=journal, write_file=write_file)
        self._mkdir = mkdir
        self._rmdir = rmdir
        self._enabled: list[Path] = []
        # v1: tid -> the cpu cgroup it was in before we moved it (from /proc/<tid>/cgroup).
        self._origin: dict[int, Path] = {}

    @property
    def enabled_cpu_controller(self) -> tuple[Path, ...]:
        """v2 directories whose ``cgroup.subtree_control`` got "+cpu" from this writer."""
        return tuple(self._enabled)

    @staticmethod
    def _quota_us(quota_cores: float) -> int:
        if not math.isfinite(quota_cores) or quota_cores <= 0:
            raise ValueError(f"CPU quota must be a positive number of cores, not {quota_cores}")
        quota_us = round(quota_cores * CFS_PERIOD_US)
        if quota_us < MIN_CFS_QUOTA_US:
            raise ValueError(
                f"CPU quota {quota_cores} cores is below the kernel's minimum "
                f"{MIN_CFS_QUOTA_US / CFS_PERIOD_US} ({MIN_CFS_QUOTA_US} µs per {CFS_PERIOD_US} µs)"
            )
        return quota_us

    def set_quota(self, job: CgroupJob, quota_cores: float | None) -> int:
        """Limit the job to ``quota_cores`` CPUs' worth of time (None: no limit).

        Returns the number of files written (0 when already so).
        """
        quota_us = None if quota_cores is None else self._quota_us(quota_cores)
        if self._version == 2:
            return self._set_v2(job, quota_us)
        return self._set_v1(job, quota_us)

    def read_quota(self, job: CgroupJob) -> float | None:
        """The job's current limit in cores, or None when unlimited."""
        if self._version == 2:
            path = job.path / "cpu.max"
            if not path.exists():
                if not job.path.is_dir():
                    raise JobGone(job.job_id, job.path)
                return None  # the cpu controller is not enabled above the job: no limit
            quota, _, period = self._read(path, job.job_id).strip().partition(" ")
            return None if quota == "max" else int(quota) / int(period)
        cpu_dir, _ = self._v1_dir(job)
        if not cpu_dir.is_dir():
            return None
        quota_us = int(self._read(cpu_dir / "cpu.cfs_quota_us", None))
        period_us = int(self._read(cpu_dir / "cpu.cfs_period_us", None))
        return None if quota_us < 0 else quota_us / period_us

    def original_quota(self, job: CgroupJob) -> float | None:
        """The job's limit as Slurm set it, before coda-node sets one: what
        :meth:`read_quota` reads in Slurm's own directory (v2, or v1 with cpu and cpuacct
        co-mounted); None on v1 otherwise, where the quota lives in coda-node's own
        ``coda/job_<id>``, which Slurm never made (one found there was left by coda-node
        and is no part of the job's original setting)."""
        if self._version == 1 and self._v1_dir(job)[1]:
            return None
        return self.read_quota(job)

    def put_back(self, job: CgroupJob, original: float | None) -> int:
        """Undo :meth:`set_quota`: the job's quota in Slurm's own directory goes back to
        ``original`` (what :meth:`original_quota` read); coda-node's own ``coda/job_<id>``
        is removed whatever ``original`` says, since Slurm never made it. Returns the
        number of files written."""
        if self._version == 1 and self._v1_dir(job)[1]:
            return self.release(job.job_id)
        return self.set_quota(job, original)

    # -- v2 ------------------------------------------------------------------------------------

    def _set_v2(self, job: CgroupJob, quota_us: int | None) -> int:
        want = f"{'max' if quota_us is None else quota_us} {CFS_PERIOD_US}"
        cpu_max = job.path / "cpu.max"
        if quota_us is None and not cpu_max.exists():
            if not job.path.is_dir():
                raise JobGone(job.job_id, job.path)
            return 0  # no cpu controller here, so no limit to lift
        written = 0 if quota_us is None else self._enable_cpu_above(job)
        if self._read(cpu_max, job.job_id).split() != want.split():
            self._write(cpu_max, want.encode(), job.job_id)
            written += 1
        return written

    def _enable_cpu_above(self, job: CgroupJob) -> int:
        unified = self.layout.unified_mount
        if unified is None:
            raise EnforceError(job.path, errno.ENODEV, "no cgroup2 mount")
        available = self._read(unified / "cgroup.controllers", None).split()
        if "cpu" not in available:
            raise EnforceError(
                unified / "cgroup.controllers",
                errno.EOPNOTSUPP,
                "the cpu controller is not available on this cgroup2 mount",
            )
        try:
            below = job.path.parent.relative_to(unified).parts
        except ValueError as exc:
            raise EnforceError(job.path, errno.EINVAL, f"not under {unified}") from exc
        written = 0
        levels = [unified.joinpath(*below[:depth]) for depth in range(len(below) + 1)]
        # Documentation/admin-guide/cgroup-v2.rst, "Top-down Constraint": a controller can be
        # enabled in a cgroup only if its parent enabled it, so go from the root down.
        for level in levels:
            control = level / "cgroup.subtree_control"
            if "cpu" not in self._read(control, None).split():
                self._write(control, b"+cpu", None)
                self._enabled.append(level)
                written += 1
        return written

    # -- v1 ------------------------------------------------------------------------------------

    def _cpu_mount(self) -> Path:
        if self.layout.cpu_mount is None:
            raise EnforceError(
                self.layout.root.path("/sys/fs/cgroup"), errno.ENODEV, "no cgroup v1 cpu hierarchy"
            )
        return self.layout.cpu_mount

    def _coda_dir(self, job_id: int) -> Path:
        return self._cpu_mount() / CODA_CPU_DIR / f"job_{job_id}"

    def _v1_dir(self, job: CgroupJob) -> tuple[Path, bool]:
        """(directory to write the quota in, whether it is the daemon's own)."""
        cpu = self._cpu_mount()
        if self.layout.cpuset_mount is not None:
            try:
                slurms = cpu / job.path.relative_to(self.layout.cpuset_mount)
            except ValueError:
                pass
            else:
                # cpu co-mounted with cpuacct: jobacct_gather/cgroup made the job's directory.
                if slurms.is_dir():
                    return slurms, False
        return self._coda_dir(job.job_id), True

    def _set_v1(self, job: CgroupJob, quota_us: int | None) -> int:
        cpu_dir, ours = self._v1_dir(job)
        if quota_us is None and ours:
            return self.release(job.job_id)
        written = 0
        if ours and not cpu_dir.is_dir():
            for level in (cpu_dir.parent, cpu_dir):
                if not level.is_dir():
                    try:
                        self._mkdir(level)
                    except FileExistsError:
                        pass  # made meanwhile (another writer): fine
                    except OSError as exc:
                        raise _translate(exc, level, None, "mkdir") from exc
        gone_id = None if ours else job.job_id
        period = cpu_dir / "cpu.cfs_period_us"
        quota = cpu_dir / "cpu.cfs_quota_us"
        want_quota = -1 if quota_us is None else quota_us
        # Period before quota: the quota is checked against the period it is written under.
        if quota_us is not None and int(self._read(period, gone_id)) != CFS_PERIOD_US:
            self._write(period, str(CFS_PERIOD_US).encode(), gone_id)
            written += 1
        if int(self._read(quota, gone_id)) != want_quota:
            self._write(quota, str(want_quota).encode(), gone_id)
            written += 1
        if ours:
            written += self._move_in(job, cpu_dir)
        return written

    def _cgroup_of(self, tid: int) -> Path | None:
        """The v1 cpu cgroup ``tid`` is in, from /proc/<tid>/cgroup; None if unknown."""
        try:
            text = _read_file(f"{os.fspath(self.layout.root.proc)}/{tid}/cgroup")
        except OSError:
            return None  # exited, or unreadable: it will go back to the root
        for line in text.splitlines():
            # "<hierarchy id>:<controllers>:<path>" (proc(5), /proc/pid/cgroup)
            fields = line.split(":", 2)
            if len(fields) == 3 and "cpu" in fields[1].split(","):
                return self._cpu_mount() / fields[2].lstrip("/")
        return None

    def _move_in(self, job: CgroupJob, cpu_dir: Path) -> int:
        """Move the job's threads that are not yet in ``cpu_dir`` into it, one per write."""
        tasks = cpu_dir / "tasks"
        inside = set(_read_pids(tasks)) if tasks.exists() else set()
        written = 0
        for tid in job.pids:
            if tid in inside:
                continue
            origin = self._cgroup_of(tid)
            if origin is not None and origin != cpu_dir:
                self._origin.setdefault(tid, origin)
            if self._move(tid, tasks):
                written += 1
        return written

    def _move(self, tid: int, tasks: Path) -> bool:
        """Write ``tid`` into ``tasks``; False when the thread already exited (ESRCH)."""
        try:
            self._write(tasks, str(tid).encode(), None)
        except EnforceError as err:
            if err.errno == errno.ESRCH:
                return False
            raise
        return True

    def release(self, job_id: int) -> int:
        """Move every task out of ``coda/job_<id>`` (back where it came from) and remove it.

        Used by ``set_quota(job, None)`` on v1 and for crash cleanup with :meth:`coda_dirs`.
        Returns the number of files written.
        """
        cpu_dir = self._coda_dir(job_id)
        if not cpu_dir.is_dir():
            return 0
        root_tasks = self._cpu_mount() / "tasks"
        written = 0
        # A task can fork into the directory between reading ``tasks`` and rmdir(2), which
        # then fails with EBUSY; a few rounds settle it.
        for _ in range(3):
            for tid in _read_pids(cpu_dir / "tasks"):
                origin = self._origin.pop(tid, None)
                dest = origin / "tasks" if origin is not None and origin.is_dir() else root_tasks
                try:
                    moved = self._move(tid, dest)
                except EnforceError as err:
                    if dest == root_tasks or err.errno not in _GONE_ERRNOS:
                        raise
                    moved = self._move(tid, root_tasks)  # its old cgroup went away meanwhile
                written += int(moved)
            try:
                self._rmdir(cpu_dir)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    continue
                if exc.errno == errno.ENOENT:
                    return written
                raise _translate(exc, cpu_dir, None, "rmdir") from exc
            return written
        raise EnforceError(cpu_dir, errno.EBUSY, "rmdir failed: tasks keep appearing")

    def coda_dirs(self) -> list[int]:
        """Job ids that have a ``coda/job_<id>`` directory in the v1 cpu hierarchy."""
        if self._version == 2 or self.layout.cpu_mount is None:
            return []
        return [job_id for job_id, _ in _numbered(self.layout.cpu_mount / CODA_CPU_DIR, "job_")]
