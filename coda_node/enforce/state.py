"""The daemon's versioned state file: everything it changed, so nothing stays changed.

Before coda-node touches a job it records here how Slurm had set it (the cpuset of the
job and of each step, each task's affinity, the CPU quota), fsyncs, and only then writes.
After a crash, a restart (or ``coda-node restore``) finds the record and puts the job back;
a job that ended needs nothing but the clean-up of coda's own cgroup/resctrl groups. The
record is written only when it changes.

The last tick's view of the node (for ``coda-node status``, and for a restarted daemon to
go on with each job's profiling) is another file, ``view.json`` in NodeRuntimeDir
(``/run/coda-node``, tmpfs), rewritten every tick, so the node's disk sees only changes; a
state file written by an older coda-node that still holds a view is read as before.

Format: JSON, ``{"format": "coda-node-state", "format_version": 1, ...}`` and
``{"format": "coda-node-view", "format_version": 1, ...}``. A state file that records jobs
still to be repaired from Slurm's allocation (``"repair"``) is written as format 2, so a
coda-node that cannot read that part refuses the file instead of ignoring it. A state file
from a newer coda-node is never overwritten: ``run`` refuses it with what to do, after
putting every job back to the allocation Slurm reports, as ``restore`` does; a damaged one
(unreadable bytes, not JSON, a format version that is not a known one, a record that does
not parse) raises :class:`StateDamaged`, and the daemon repairs every job from Slurm.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coda_node.enforce import mechanisms
from coda_node.enforce.mechanisms.base import Record, kind
from coda_node.policy.targets import Limit
from coda_node.system.cpulist import parse_cpulist

FORMAT = "coda-node-state"
FORMAT_VERSION = 2
"""The newest state format this coda-node reads: 1, the record of changes; 2, with jobs to
repair from Slurm's allocation (written only while some are pending)."""
BASE_FORMAT_VERSION = 1
STATE_FILE = "state.json"
LIMITS_FILE = "limits.json"
VIEW_FORMAT = "coda-node-view"
VIEW_FORMAT_VERSION = 1
VIEW_FILE = "view.json"

log = logging.getLogger("coda_node.enforce.state")


class StateError(RuntimeError):
    """The state file cannot be used; the message says what an operator should do."""


class StateDamaged(StateError):
    """The state file exists but cannot be trusted (unreadable bytes, not JSON, an unknown
    format version, a record that does not parse). Nothing in it is used: the jobs it may
    describe are repaired from Slurm's allocation. ``reason`` says what is wrong."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path} is damaged ({reason})")


class StateNewer(StateError):
    """The state file was written by a newer coda-node: this one must not overwrite it (what
    it records may be more than this one can read). The jobs can still be put back to the
    allocation Slurm reports (:meth:`StateFile.leave_untouched`)."""


TEMP_SUFFIX = ".tmp"


class JobChanges:
    """What coda-node changed on one job, and what it found there before: one record per
    enforcement mechanism (:mod:`coda_node.enforce.mechanisms`), keyed by its name. In the
    state file the job's object is the union of its records' fields, so each field is also
    read and written here by its name (``changes.quota_active``)."""

    __slots__ = ("records",)

    def __init__(self, **fields: Any) -> None:
        self.records: dict[str, Record] = {}
        for key, value in fields.items():
            setattr(self, key, value)

    def record(self, name: str) -> Any:
        """Mechanism ``name``'s record of the job (an empty one until it changes
        something)."""
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = mechanisms.get(name).record()
        return rec

    def __getattr__(self, key: str) -> Any:
        return getattr(self.record(_owner(key)), key)

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "records":
            object.__setattr__(self, key, value)
        else:
            setattr(self.record(_owner(key)), key, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobChanges) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JobChanges({self.to_dict()!r})"

    def is_empty(self) -> bool:
        return all(rec.is_empty() for rec in self.records.values())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for mech in mechanisms.registered():
            rec = self.records.get(mech.name)
            out.update((rec if rec is not None else mech.record()).to_dict())
        return out

    @classmethod
    def from_dict(cls, d: object) -> JobChanges:
        """A record as :meth:`to_dict` wrote it; raises ValueError for anything else (a
        value of the wrong type, a CPU list that does not parse, a quota that is not a
        positive number of cores). Keys no mechanism knows are ignored."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a record is a JSON object, not {kind(d)}")
        ch = cls()
        for mech in mechanisms.registered():
            ch.records[mech.name] = mech.record.from_dict(d)
        return ch

    def recorded_cpus(self) -> frozenset[int]:
        """Every CPU the record names as the job's: its allocation and the cpusets of its
        snapshot (all of them must exist on the node for the record to be put back)."""
        cpus = set(self.allocated_cpus or ())
        if self.cpuset_original is not None:
            for text in self.cpuset_original["cpus"].values():
                cpus |= parse_cpulist(text)
        return frozenset(cpus)


def _owner(key: str) -> str:
    """The mechanism whose record has the field ``key``."""
    name = mechanisms.owner(key)
    if name is None:
        raise AttributeError(f"no enforcement mechanism records {key!r}")
    return name


REPAIR_ALL = -1
"""The key of :attr:`NodeState.repair` that stands for every job running at the next tick
(the state file was damaged: any of them may have been changed)."""


@dataclass(slots=True)
class NodeState:
    changes: dict[int, JobChanges] = field(default_factory=dict)
    """Job -> what coda-node changed on it. A record stays here, and in the state file,
    until everything it covers is back as Slurm set it; an empty record is not written."""
    repair: dict[int, str] = field(default_factory=dict)
    """Job (or :data:`REPAIR_ALL`) -> why its cgroups must be put back to the allocation
    Slurm reports, because what coda-node recorded of it cannot be trusted. Written before
    the repair writes anything, dropped when the job is repaired or gone."""
    view: dict[str, Any] = field(default_factory=dict)
    """The last tick's observation (jobs, GPUs, counters, events) for ``coda-node status``."""

    def job(self, job_id: int) -> JobChanges:
        return self.changes.setdefault(job_id, JobChanges())

    def prune(self) -> None:
        """Drop the records that cover nothing any more (everything in them is back)."""
        for job_id in [j for j, c in self.changes.items() if c.is_empty()]:
            del self.changes[job_id]


_encode_state = json.JSONEncoder(check_circular=False).encode
"""The state file's encoder, run every tick on ~40 KB of view. Keys stay in the order the
daemon built them (deterministic; sorting them cost ~20 % more), and the cycle check is
off (the view is built afresh from plain values): together ~25 % less time than
``json.dumps(sort_keys=True)`` (bench/bench_node_tick.py)."""


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
        self._written: tuple[tuple[str, str], bool] | None = None
        """((the changes' encoding, the repairs'), whether fsynced) as this process last
        wrote them."""
        self.untouched: str | None = None
        """Why the record of changes is never written (the file belongs to a newer
        coda-node); None while it is this process's to write."""

    def leave_untouched(self, why: str) -> None:
        """Never write the record of changes from now on (the view is still written): the
        file on disk stays as a newer coda-node left it, for that version's restore. While
        it is there, every run of this one starts by repairing every job from Slurm, so no
        record of this run's repairs is needed."""
        self.untouched = why

    def load(self) -> NodeState:
        """The recorded state; empty when there is none. Raises :class:`StateDamaged` for a
        file that cannot be trusted (the file is left as it is: the caller keeps a copy
        aside and writes a repair over it) and :class:`StateError` for one from a newer
        coda-node or one that cannot be read at all. The view is the view file's, or the
        state file's where that is newer (written by a coda-node from before the view had
        its own file); {} when neither can be read."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return NodeState(view=self._load_view(None))
        except OSError as exc:
            raise StateError(f"cannot read {self.path} ({exc.strerror})") from None
        try:
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError("not a coda-node state file")
            version = data.get("format_version")
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise ValueError(f"format_version {version!r} is not a format version")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise StateDamaged(self.path, _short(exc)) from None
        if version > FORMAT_VERSION:
            raise StateNewer(
                f"{self.path} was written by a newer coda-node (format {version}; this one "
                f"reads {FORMAT_VERSION}) and is left untouched. `coda-node restore` puts "
                "every job back to Slurm's allocation; then upgrade this coda-node, or move "
                "the file away to run this one"
            )
        try:
            changes = _job_map(data.get("changes"), "changes", JobChanges.from_dict)
            repair = _job_map(data.get("repair"), "repair", _repair_reason, allow_all=True)
        except ValueError as exc:
            raise StateDamaged(self.path, _short(exc)) from None
        legacy: tuple[float, dict[str, Any]] | None = None
        if isinstance(data.get("view"), dict):
            legacy = (_unix_s(data.get("written_unix_s")), dict(data["view"]))
        return NodeState(changes=changes, repair=repair, view=self._load_view(legacy))

    def keep_aside(self, now_unix_s: float | None = None) -> Path | None:
        """Keep the state file as it is now under ``state.json.damaged.<time>`` for the
        operator (a second name for it: ``state.json`` is only replaced by the next save,
        so a crash before then finds the damaged file again). None when there is no file
        to keep or it cannot be kept (logged)."""
        aside = self.path.with_name(f"{STATE_FILE}.damaged.{int(now_unix_s or time.time())}")
        try:
            os.link(self.path, aside)
        except FileExistsError:
            return aside
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot keep %s as %s (%s)", self.path, aside.name, exc.strerror)
            return None
        return aside

    def remove_stale_temps(self, is_alive: Callable[[int], bool]) -> list[Path]:
        """Remove the temporary files (``.state.json.<pid>.tmp``, ``.view.json.<pid>.tmp``,
        ``.limits.json.<pid>.tmp``) a writer killed before its rename left, where that
        writer is no longer running; returns what was removed."""
        removed = []
        names = (STATE_FILE, LIMITS_FILE, VIEW_FILE)
        for directory in dict.fromkeys((self.dir, self.view_path.parent)):
            try:
                entries = os.listdir(directory)
            except OSError:
                continue
            for entry in entries:
                m = _TEMP_NAME.fullmatch(entry)
                if m is None or m.group(1) not in names or is_alive(int(m.group(2))):
                    continue
                path = directory / entry
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    log.warning("cannot remove %s (%s)", path, exc.strerror)
                    continue
                removed.append(path)
        return removed

    def load_view(self) -> dict[str, Any]:
        """The view file's view alone ({} when it cannot be used)."""
        return self._load_view(None)

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
        a change (the write-ahead); the view is never fsynced. Records that cover nothing
        are left out of the file but not dropped from ``state``: the enforcer may be about
        to fill one in, and what it writes must reach the file."""
        changes = self._kept_text(
            "\0changes",
            {str(k): v.to_dict() for k, v in sorted(state.changes.items()) if not v.is_empty()},
            copy_value=True,
        )
        repair = _encode_state({str(k): v for k, v in sorted(state.repair.items())})
        record = (changes, repair)
        written = self._written
        if self.untouched is not None:
            pass
        elif written is None or written[0] != record or (durable and not written[1]):
            version = FORMAT_VERSION if state.repair else BASE_FORMAT_VERSION
            head = self._head(FORMAT, version)
            tail = f', "repair": {repair}' if state.repair else ""
            write_bytes_atomic(
                self.path,
                f'{head[:-1]}, "changes": {changes}{tail}}}'.encode(),
                durable=durable,
            )
            self._written = (record, durable)
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
        (bench/bench_node_tick.py)."""
        kept = self._kept.get(key)
        if kept is not None and kept[0] == value:
            return kept[1]
        text = _encode_state(value)
        self._kept[key] = (copy.deepcopy(value) if copy_value else value, text)
        return text


_TEMP_NAME = re.compile(r"\.(.+)\.(\d+)\.tmp")
"""What :func:`write_bytes_atomic` names its temporary file: ``.<name>.<pid>.tmp``."""


def _short(exc: Exception, limit: int = 120) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _job_map(
    value: object,
    what: str,
    parse: Callable[[object], Any],
    *,
    allow_all: bool = False,
) -> dict[int, Any]:
    """``{"<job id>": ...}`` with each value parsed; ValueError names the bad entry."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {kind(value)}, not an object")
    out: dict[int, Any] = {}
    for key, item in value.items():
        try:
            job_id = int(key)
        except ValueError:
            raise ValueError(f"{what} names {key!r}, not a job id") from None
        if job_id < 0 and not (allow_all and job_id == REPAIR_ALL):
            raise ValueError(f"{what} names {key!r}, not a job id")
        try:
            out[job_id] = parse(item)
        except ValueError as exc:
            raise ValueError(f"{what}[{key}]: {exc}") from None
    return out


def _repair_reason(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a reason is text, not {kind(value)}")
    return value


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
    a temp file beside it, fsynced when ``durable``, renamed over it; with ``durable`` the
    directory is fsynced after the rename too, so the new name survives a power loss
    (fsync(2): syncing a file does not sync the directory entry that names it)."""
    # One os.write of the bytes: the daemon writes its state every tick, and a text file
    # object's layers cost more than the write itself (bench/bench_node_tick.py).
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
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# -- admin limits: what an operator asked for with `coda-node limit` -----------------


def load_limits(state_dir: Path, refused: list[str] | None = None) -> dict[int, Limit]:
    """The operator's limits; :class:`StateError` for a file that cannot be read (the
    daemon then logs it and applies none). A job's entry that is no limit (a hand edit, a
    damaged disk) raises StateError naming it too, unless ``refused`` is given: then the
    entry is left out and why is appended there, and the other jobs' limits still hold."""
    path = state_dir / LIMITS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read {path} ({exc}); limits ignored") from None
    if not isinstance(data, dict) or data.get("format") != "coda-node-limits":
        raise StateError(f"{path} is not a coda-node limits file; limits ignored")
    entries = data.get("limits") or {}
    if not isinstance(entries, dict):
        raise StateError(f"{path}: limits is not an object; limits ignored")
    limits: dict[int, Limit] = {}
    for key, value in entries.items():
        try:
            if not (key.isascii() and key.isdigit() and 0 < int(key) < 1 << 32):
                raise ValueError(f"{key[:40]!r} is not a job id")
            limits[int(key)] = Limit.from_dict(value)
        except ValueError as exc:
            why = f"{path}: job {key[:40]}: {exc}; that limit is ignored"
            if refused is None:
                raise StateError(why) from None
            refused.append(why)
    return limits


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
    parse and the Limit objects (bench/bench_node_tick.py). A change by
    ``coda-node limit`` (an atomic rename: a new inode, size, mtime and ctime) is seen on
    the next tick as before."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.dir = state_dir
        self._path = os.fspath(state_dir / LIMITS_FILE)
        self._clock = clock
        self._kept: tuple[tuple[int, ...], dict[int, Limit], list[str]] | None = None
        self.refused: list[str] = []
        """Why entries of the file last read were left out (:func:`load_limits`)."""
        self.reads = 0
        """How many times the file was read and parsed (tests count them)."""

    def load(self) -> dict[int, Limit]:
        """As :func:`load_limits` with :attr:`refused`: raises :class:`StateError` for a
        file that cannot be read, every time; leaves out the entries that are no limit."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._kept = None
            self.refused = []
            return {}
        except OSError:
            st = None  # load_limits says what is wrong
        key = (
            (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if st is not None
            else None
        )
        if key is not None and self._kept is not None and self._kept[0] == key:
            self.refused = list(self._kept[2])
            return dict(self._kept[1])
        self._kept = None
        self.reads += 1
        self.refused = []
        limits = load_limits(self.dir, self.refused)
        # Read after the stat: a file replaced in between is read again next time (its
        # stat differs), never kept under a newer stat than what was read.
        if key is not None and self._clock() - max(st.st_mtime, st.st_ctime) >= LIMITS_SETTLED_S:
            self._kept = (key, limits, list(self.refused))
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
