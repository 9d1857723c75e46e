"""The daemon's versioned state file: everything it changed, so nothing stays changed.

Before coda-node touches a job it records here how Slurm had set it (the cpuset of the
job and of each step, each task's affinity, the CPU quota), fsyncs, and only then writes.
After a crash, a restart (or ``coda-node restore``) finds the record and puts the job back;
a job that ended needs nothing but the clean-up of coda's own cgroup/resctrl groups. The
record is written only when it changes.

The last tick's view of the node (for ``coda-node status``, and for a restarted daemon to
go on with each job's profiling) is another file, ``view.json`` in NodeRuntimeDir
(``/run/coda-node``, tmpfs), rewritten every tick. It used to be part of ``state.json``,
which made a node write its state file to disk every second (docs/benchmarks.md, the
tick's eighth pass); a state file that still holds a view is read as before.

Format: JSON, ``{"format": "coda-node-state", "format_version": 1, ...}`` and
``{"format": "coda-node-view", "format_version": 1, ...}``. A state file from a newer
coda-node is refused with what to do, never overwritten.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "coda-node-state"
FORMAT_VERSION = 1
STATE_FILE = "state.json"
LIMITS_FILE = "limits.json"
VIEW_FORMAT = "coda-node-view"
VIEW_FORMAT_VERSION = 1
VIEW_FILE = "view.json"

log = logging.getLogger("coda_node.state")


class StateError(RuntimeError):
    """The state file cannot be used; the message says what an operator should do."""


@dataclass(slots=True)
class JobChanges:
    """What coda-node changed on one job, and what it found there before."""

    cpuset_original: dict[str, Any] | None = None
    """The cpuset snapshot taken before the first shrink (cgroup writer's to_dict())."""
    cpuset_applied: list[int] | None = None
    allocated_cpus: list[int] | None = None
    """The job's CPUs as Slurm allocated them (effective CPUs on v2, where a job's
    ``cpuset.cpus`` may be empty and inherited), recorded before the first change."""
    quota_original: float | None = None
    """The job's CPU quota in cores before coda-node set one (None = unlimited)."""
    quota_applied: float | None = None
    quota_active: bool = False
    rdt_group: str | None = None
    """The resctrl control group coda-node moved the job's tasks into."""
    rdt_mon_group: str | None = None

    def is_empty(self) -> bool:
        return (
            self.cpuset_original is None
            and not self.quota_active
            and self.rdt_group is None
            and self.rdt_mon_group is None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpuset_original": self.cpuset_original,
            "cpuset_applied": self.cpuset_applied,
            "allocated_cpus": self.allocated_cpus,
            "quota_original": self.quota_original,
            "quota_applied": self.quota_applied,
            "quota_active": self.quota_active,
            "rdt_group": self.rdt_group,
            "rdt_mon_group": self.rdt_mon_group,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobChanges:
        return cls(
            cpuset_original=d.get("cpuset_original"),
            cpuset_applied=d.get("cpuset_applied"),
            allocated_cpus=d.get("allocated_cpus"),
            quota_original=d.get("quota_original"),
            quota_applied=d.get("quota_applied"),
            quota_active=bool(d.get("quota_active", False)),
            rdt_group=d.get("rdt_group"),
            rdt_mon_group=d.get("rdt_mon_group"),
        )


@dataclass(slots=True)
class NodeState:
    changes: dict[int, JobChanges] = field(default_factory=dict)
    view: dict[str, Any] = field(default_factory=dict)
    """The last tick's observation (jobs, GPUs, counters, events) for ``coda-node status``."""

    def job(self, job_id: int) -> JobChanges:
        return self.changes.setdefault(job_id, JobChanges())

    def prune(self) -> None:
        for job_id in [j for j, c in self.changes.items() if c.is_empty()]:
            del self.changes[job_id]


_encode_state = json.JSONEncoder(check_circular=False).encode
"""The state file's encoder, run every tick on ~40 KB of view. Keys stay in the order the
daemon built them (deterministic; sorting them cost ~20 % more), and the cycle check is
off (the view is built afresh from plain values): together ~25 % less time than
``json.dumps(sort_keys=True)`` (docs/benchmarks.md, the tick's third pass)."""


class StateFile:
    """``<NodeStateDir>/state.json``, what coda-node changed, written atomically (temp file,
    fsync, rename) and only when it changed; and ``<view_dir>/view.json``, the last tick's
    view, written atomically every tick without fsync. ``view_dir`` is NodeRuntimeDir
    (default: beside the state file)."""

    KEPT_PARTS = ("events",)
    """Parts of the view whose encoding is kept and written again while the part is equal
    to the one encoded: the last 200 events are most of a busy node's view (~30 KB) and
    change only when an event is added. The daemon never changes an event once made."""

    def __init__(self, state_dir: Path, view_dir: Path | None = None) -> None:
        self.dir = state_dir
        self.path = state_dir / STATE_FILE
        self.view_path = (view_dir or state_dir) / VIEW_FILE
        self._kept: dict[str, tuple[Any, str]] = {}
        self._written: tuple[str, bool] | None = None
        """(the changes' encoding, whether fsynced) as this process last wrote them."""

    def load(self) -> NodeState:
        """The recorded state; empty when there is none. A corrupt file is moved aside
        (kept for the operator) and an empty state returned, since the cgroups themselves
        still hold Slurm's allocation; a newer format raises :class:`StateError`. The view
        is the view file's, or the state file's where that is newer (written by a
        coda-node from before the view had its own file); {} when neither can be read."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return NodeState(view=self._load_view(None))
        except OSError as exc:
            raise StateError(f"cannot read {self.path} ({exc.strerror})") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a coda-node state file")
            version = int(data.get("format_version", 0))
            changes: dict[int, JobChanges] = {}
            legacy: tuple[float, dict[str, Any]] | None = None
            if version <= FORMAT_VERSION:
                changes = {
                    int(k): JobChanges.from_dict(v) for k, v in (data.get("changes") or {}).items()
                }
                if isinstance(data.get("view"), dict):
                    legacy = (_unix_s(data.get("written_unix_s")), dict(data["view"]))
        except (ValueError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.corrupt.{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            raise StateError(
                f"{self.path} is unreadable ({exc}); moved to {aside.name}. Jobs changed "
                "before this cannot be restored from it: check them with coda-node status"
            ) from None
        if version > FORMAT_VERSION:
            raise StateError(
                f"{self.path} was written by a newer coda-node (format {version}; this one "
                f"reads {FORMAT_VERSION}). Run `coda-node restore` with the newer version "
                "first, or upgrade this one; the file is left untouched"
            )
        return NodeState(changes=changes, view=self._load_view(legacy))

    def _load_view(self, legacy: tuple[float, dict[str, Any]] | None) -> dict[str, Any]:
        """The view file's view, or ``legacy`` (the state file's) where that is newer or the
        view file cannot be used. A view is only what the last run saw: one that cannot be
        read is logged and measured again, never fatal."""
        try:
            data = json.loads(self.view_path.read_text())
            if not isinstance(data, dict) or data.get("format") != VIEW_FORMAT:
                raise ValueError("not a coda-node view file")
            view = data.get("view")
            if not isinstance(view, dict):
                raise ValueError("no view in it")
        except FileNotFoundError:
            return legacy[1] if legacy else {}
        except (OSError, ValueError) as exc:
            log.warning(
                "cannot use %s (%s): the last run's view is not adopted", self.view_path, exc
            )
            return legacy[1] if legacy else {}
        if legacy and legacy[0] > _unix_s(data.get("written_unix_s")):
            return legacy[1]
        return view

    def save(self, state: NodeState, *, durable: bool = True, view: bool = True) -> None:
        """Write the record of changes where it differs from the one last written (or was
        written without fsync and ``durable`` asks for it), then, with ``view``, the view.
        ``durable`` fsyncs the record before its rename: needed for the record made before
        a change (the write-ahead); the view is never fsynced."""
        state.prune()
        changes = self._kept_text(
            "\0changes",
            {str(k): v.to_dict() for k, v in sorted(state.changes.items())},
            copy_value=True,
        )
        written = self._written
        if written is None or written[0] != changes or (durable and not written[1]):
            head = self._head(FORMAT, FORMAT_VERSION)
            write_bytes_atomic(
                self.path, f'{head[:-1]}, "changes": {changes}}}'.encode(), durable=durable
            )
            self._written = (changes, durable)
        if view:
            head = self._head(VIEW_FORMAT, VIEW_FORMAT_VERSION)
            text = f'{head[:-1]}, "view": {self._encode_view(state.view)}}}'
            write_bytes_atomic(self.view_path, text.encode(), durable=False)

    @staticmethod
    def _head(fmt: str, version: int) -> str:
        return _encode_state(
            {
                "format": fmt,
                "format_version": version,
                "pid": os.getpid(),
                "written_unix_s": time.time(),
            }
        )

    def _encode_view(self, view: dict[str, Any]) -> str:
        """``view`` as JSON, part by part, :attr:`KEPT_PARTS` reused."""
        parts = []
        for key, value in view.items():
            text = self._kept_text(key, value) if key in self.KEPT_PARTS else None
            parts.append(f"{_encode_state(key)}: {text or _encode_state(value)}")
        return f"{{{', '.join(parts)}}}"

    def _kept_text(self, key: str, value: Any, *, copy_value: bool = False) -> str:
        """``value`` encoded, or the kept encoding of an equal value. Without
        ``copy_value`` the value itself is kept: right for events, dicts never changed once
        made (equal lists of the same event dicts compare by identity, element by
        element); with it a deep copy, for values that may change in place (the enforcer
        adds a new step's original cpuset to a record's nested dict), so that such an
        addition never compares equal. The records of changes are encoded afresh only when
        the daemon writes to a job: with 16 changed jobs that was ~55 µs of every tick
        (docs/benchmarks.md, the tick's sixth pass)."""
        kept = self._kept.get(key)
        if kept is not None and kept[0] == value:
            return kept[1]
        text = _encode_state(value)
        self._kept[key] = (copy.deepcopy(value) if copy_value else value, text)
        return text


def _unix_s(value: object) -> float:
    """A file's ``written_unix_s``; 0 when it has none that can be read."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def write_json_atomic(path: Path, data: Any, *, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` as JSON so that a reader (or a crash) never sees half a file."""
    write_bytes_atomic(path, json.dumps(data, sort_keys=True).encode(), mode=mode, durable=durable)


def write_bytes_atomic(
    path: Path, encoded: bytes, *, mode: int = 0o644, durable: bool = True
) -> None:
    """Write ``encoded`` to ``path`` so that a reader (or a crash) never sees half a file:
    a temp file beside it, fsynced when ``durable``, renamed over it."""
    # One os.write of the bytes: the daemon writes its state every tick, and a text file
    # object's layers cost more than the write itself (docs/benchmarks.md).
    tmp = f"{os.fspath(path.parent)}/.{path.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    except FileNotFoundError:  # no directory yet (a first start)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            left = memoryview(encoded)
            while left:
                left = left[os.write(fd, left) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- admin limits: what an operator asked for with `coda-node limit` -----------------


@dataclass(frozen=True, slots=True)
class Limit:
    """An operator's limit on one job (``coda-node limit``); None = leave as Slurm set."""

    cores: int | None = None
    """Keep the job on this many of its allocated cores (cpuset)."""
    cpus: tuple[int, ...] | None = None
    """Keep the job on exactly these of its allocated CPUs (cpuset)."""
    quota_cores: float | None = None
    """Cap the job's CPU time at this many cores' worth (CFS bandwidth)."""
    mem_bw_pct: int | None = None
    """Cap the job's memory bandwidth (Intel RDT MBA, percent of a socket's, or MBps on
    an mba_MBps mount)."""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "cpus": list(self.cpus) if self.cpus is not None else None,
            "quota_cores": self.quota_cores,
            "mem_bw_pct": self.mem_bw_pct,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Limit:
        cpus = d.get("cpus")
        return cls(
            cores=d.get("cores"),
            cpus=tuple(int(c) for c in cpus) if cpus is not None else None,
            quota_cores=d.get("quota_cores"),
            mem_bw_pct=d.get("mem_bw_pct"),
            reason=str(d.get("reason", "")),
        )


def load_limits(state_dir: Path) -> dict[int, Limit]:
    """The operator's limits; an unreadable file means none (the daemon logs it)."""
    path = state_dir / LIMITS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read {path} ({exc}); limits ignored") from None
    if not isinstance(data, dict) or data.get("format") != "coda-node-limits":
        raise StateError(f"{path} is not a coda-node limits file; limits ignored")
    return {int(k): Limit.from_dict(v) for k, v in (data.get("limits") or {}).items()}


LIMITS_SETTLED_S = 1.0
"""A limits file whose mtime is at least this old is kept and not read again while its
stat stays the same. A younger one is read every time: a rewrite within the filesystem's
timestamp granularity could keep size and mtime (and reuse the freed inode), the "racy"
case git's index guards against the same way (Documentation/technical/racy-git.txt).
Any later rewrite then gets a later mtime on a filesystem whose timestamps are at least
this fine (ext4, xfs, btrfs, tmpfs: a jiffy; ext3's small inodes: 1 s)."""


class LimitsFile:
    """The operator's limits (:func:`load_limits`), read by the daemon on every tick and
    parsed again only when the file changed: one stat instead of an open, a read, a JSON
    parse and the Limit objects (docs/benchmarks.md, the tick's sixth pass). A change by
    ``coda-node limit`` (an atomic rename: a new inode, size, mtime and ctime) is seen on
    the next tick as before."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.dir = state_dir
        self._path = os.fspath(state_dir / LIMITS_FILE)
        self._clock = clock
        self._kept: tuple[tuple[int, ...], dict[int, Limit]] | None = None
        self.reads = 0
        """How many times the file was read and parsed (tests count them)."""

    def load(self) -> dict[int, Limit]:
        """As :func:`load_limits`; raises :class:`StateError` the same way, every time."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._kept = None
            return {}
        except OSError:
            st = None  # load_limits says what is wrong
        key = (
            (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if st is not None
            else None
        )
        if key is not None and self._kept is not None and self._kept[0] == key:
            return dict(self._kept[1])
        self._kept = None
        self.reads += 1
        limits = load_limits(self.dir)
        # Read after the stat: a file replaced in between is read again next time (its
        # stat differs), never kept under a newer stat than what was read.
        if key is not None and self._clock() - max(st.st_mtime, st.st_ctime) >= LIMITS_SETTLED_S:
            self._kept = (key, limits)
        return dict(limits)


def save_limits(state_dir: Path, limits: Mapping[int, Limit]) -> None:
    write_json_atomic(
        state_dir / LIMITS_FILE,
        {
            "format": "coda-node-limits",
            "format_version": 1,
            "limits": {str(k): v.to_dict() for k, v in sorted(limits.items())},
        },
    )
