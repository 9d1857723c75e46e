"""perf_event counters: PMU discovery, event encoding, counters, rates, uncore bandwidth.

The C extension ``coda_node._perf`` (csrc/perf_event.c) only makes the syscalls and
returns raw numbers or ``-errno``; everything here is Python, as psutil splits
``_psutil_linux.c`` from ``_pslinux.py``:

- :func:`discover_pmus` reads ``/sys/bus/event_source/devices/<pmu>/{type,format,events,
  cpumask}`` (Documentation/ABI/testing/sysfs-bus-event_source-devices-{format,events}).
- :func:`encode` turns ``"event=0x04,umask=0x03"`` into ``perf_event_attr.config[12]``.
- :class:`Counter` wraps one perf fd; :class:`CounterSet` reads several in one FFI crossing.
- :func:`counter_rate` / :class:`RateTracker` turn two readings into a rate (wrap, reset,
  multiplexing).
- :class:`UncoreMemBw` and :class:`UncorePcieBw` sample per-socket memory and PCIe
  bandwidth from Intel's uncore IMC / IIO PMUs where the kernel exposes them.

Importing this module never loads the C extension: it is loaded the first time a counter
is opened through the default backend, and a missing build is a :class:`PerfUnavailable`
raised then. Every system path goes through :class:`~coda_node.system.paths.SystemRoot`.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import importlib
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self

from coda_node.system.capability import Capability
from coda_node.system.cpulist import parse_cpulist
from coda_node.system.paths import SystemRoot

PMU_DEVICES = "/sys/bus/event_source/devices"
PERF_EVENT_PARANOID = "/proc/sys/kernel/perf_event_paranoid"

# enum perf_type_id in include/uapi/linux/perf_event.h.
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_TYPE_RAW = 4

# enum perf_sw_ids in include/uapi/linux/perf_event.h, named as perf-list(1) names them.
SOFTWARE_EVENTS: dict[str, int] = {
    "cpu-clock": 0,
    "task-clock": 1,
    "page-faults": 2,
    "context-switches": 3,
    "cpu-migrations": 4,
    "minor-faults": 5,
    "major-faults": 6,
    "alignment-faults": 7,
    "emulation-faults": 8,
}

# Units the kernel writes into events/<name>.unit for byte-counting uncore events.
_UNIT_BYTES: dict[str, float] = {
    "B": 1.0,
    "Bytes": 1.0,
    "KiB": 2.0**10,
    "MiB": 2.0**20,
    "GiB": 2.0**30,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
}

# A rate above this for a single IMC channel or IIO port is not a measurement but a reset
# the wrap arithmetic misread: one DDR5 channel moves well under 100 GB/s and one PCIe 6.0
# x16 port about 128 GB/s per direction.
MAX_PLAUSIBLE_BYTES_PER_S = 1e12

_WORDS = ("config", "config1", "config2")


# --------------------------------------------------------------------------- errors


class PerfError(OSError):
    """A perf_event syscall failed; ``errno`` is the kernel's, ``what`` the operation."""

    def __init__(self, err: int, what: str, why: str | None = None) -> None:
        self.what = what
        self.why = why if why is not None else _explain(err)
        super().__init__(err, f"{what} ({self.why})")

    def __str__(self) -> str:
        return f"{self.what} ({self.why})"


class PerfUnavailable(PerfError):
    """Counting is not possible here at all: extension not built, or no such PMU."""


def _errname(err: int) -> str:
    return _errno.errorcode.get(err, f"errno {err}")


def _explain(err: int, op: str = "") -> str:
    if err in (_errno.EACCES, _errno.EPERM):
        why = (
            "permission denied: needs CAP_PERFMON (or CAP_SYS_ADMIN), or a lower "
            "/proc/sys/kernel/perf_event_paranoid"
        )
    elif op == "open" and err in (_errno.ENOENT, _errno.EINVAL, _errno.EOPNOTSUPP):
        why = "event not supported by this PMU"
    elif op == "open" and err == _errno.ENODEV:
        why = "no such PMU or CPU"
    elif op == "open" and err == _errno.ESRCH:
        why = "no such process"
    elif err == _errno.EBADF:
        why = "bad file descriptor: the counter is closed"
    elif err in (_errno.EMFILE, _errno.ENFILE):
        why = "too many open files"
    elif err == _errno.ENOSYS:
        why = "perf_event_open is not available in this kernel or sandbox"
    else:
        why = os.strerror(err).lower()
    return f"{why}; {_errname(err)}"


def _raise_for(rc: int, what: str, op: str) -> None:
    """The boundary: a ``-errno`` from C becomes a :class:`PerfError`."""
    if rc < 0:
        raise PerfError(-rc, what, _explain(-rc, op))


# --------------------------------------------------------------------------- sysfs model


@dataclass(frozen=True, slots=True)
class FormatField:
    """One ``format/<name>`` file: where a term's value bits go in config/config1/config2.

    ``bits[i]`` is the attr bit that receives bit ``i`` of the value, lowest first, so
    ``config:0-7,32-35`` (AMD's core ``event``) puts value bits 8-11 at config bits 32-35.
    """

    name: str
    word: str
    bits: tuple[int, ...]

    @property
    def width_bits(self) -> int:
        return len(self.bits)


@dataclass(frozen=True, slots=True)
class PmuEvent:
    """One ``events/<name>`` alias, with its ``.scale`` and ``.unit`` siblings."""

    name: str
    terms: str
    scale: float = 1.0
    unit: str = ""

    @property
    def bytes_per_count(self) -> float | None:
        """scale x unit in bytes; None when the unit is not a byte unit."""
        unit_bytes = _UNIT_BYTES.get(self.unit)
        return None if unit_bytes is None else self.scale * unit_bytes


@dataclass(frozen=True, slots=True)
class Pmu:
    name: str
    type: int
    formats: dict[str, FormatField]
    events: dict[str, PmuEvent]
    cpumask: tuple[int, ...]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What perf_event_open needs besides pid/cpu: attr.type and attr.config[012]."""

    type: int
    config: int
    config1: int = 0
    config2: int = 0
    label: str = ""

    def describe(self) -> str:
        name = self.label or "event"
        return f"{name} (type {self.type}, config {self.config:#x})"


_FORMAT_RE = re.compile(r"(config\d?):([0-9,\-]+)")


def parse_format(name: str, text: str) -> FormatField:
    """``config:0-7`` / ``config:21`` / ``config1:0-31`` / ``config:0-7,32-35``."""
    m = _FORMAT_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"format {name}: cannot parse {text.strip()!r}")
    bits: list[int] = []
    for part in m.group(2).split(","):
        lo_text, dash, hi_text = part.partition("-")
        if not lo_text or (dash and not hi_text):
            raise ValueError(f"format {name}: bad bit range {part!r} in {text.strip()!r}")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if lo > hi or hi > 63:
            raise ValueError(f"format {name}: bit range {part!r} outside 0-63 or reversed")
        bits.extend(range(lo, hi + 1))
    if len(set(bits)) != len(bits):
        raise ValueError(f"format {name}: bit ranges overlap in {text.strip()!r}")
    return FormatField(name=name, word=m.group(1), bits=tuple(bits))


def _parse_int(text: str) -> int:
    text = text.strip()
    try:
        return int(text, 0)
    except ValueError:
        # strtoull(..., 0), which perf uses, reads a leading 0 as octal.
        if re.fullmatch(r"0[0-7]+", text):
            return int(text, 8)
        raise


def _read(path: Path) -> str:
    return path.read_text().strip()


def _read_pmu(name: str, directory: Path) -> Pmu | None:
    try:
        pmu_type = int(_read(directory / "type"))
    except (OSError, ValueError):
        return None  # not a usable PMU: perf_event_open needs its type number
    problems: list[str] = []
    formats: dict[str, FormatField] = {}
    format_dir = directory / "format"
    if format_dir.is_dir():
        for entry in sorted(format_dir.iterdir()):
            try:
                formats[entry.name] = parse_format(entry.name, entry.read_text())
            except (OSError, ValueError) as exc:
                problems.append(str(exc))
    events: dict[str, PmuEvent] = {}
    events_dir = directory / "events"
    if events_dir.is_dir():
        files = {entry.name: entry for entry in events_dir.iterdir()}
        for fname, path in sorted(files.items()):
            base, dot, suffix = fname.rpartition(".")
            # <event>.scale / .unit / .snapshot / .per-pkg describe <event>; they are not
            # events themselves (sysfs-bus-event_source-devices-events).
            if dot and base in files and suffix in ("scale", "unit", "snapshot", "per-pkg"):
                continue
            try:
                terms = _read(path)
                scale_path = files.get(f"{fname}.scale")
                unit_path = files.get(f"{fname}.unit")
                scale = float(_read(scale_path)) if scale_path is not None else 1.0
                unit = _read(unit_path) if unit_path is not None else ""
            except (OSError, ValueError) as exc:
                problems.append(f"event {fname}: {exc}")
                continue
            events[fname] = PmuEvent(name=fname, terms=terms, scale=scale, unit=unit)
    cpumask: tuple[int, ...] = ()
    cpumask_path = directory / "cpumask"
    if cpumask_path.exists():
        try:
            cpumask = tuple(sorted(parse_cpulist(cpumask_path.read_text())))
        except (OSError, ValueError) as exc:
            problems.append(f"cpumask: {exc}")
    return Pmu(name, pmu_type, formats, events, cpumask, tuple(problems))


def discover_pmus(root: SystemRoot) -> dict[str, Pmu]:
    """Every PMU under ``/sys/bus/event_source/devices``, by name; {} when there is none."""
    devices = root.path(PMU_DEVICES)
    try:
        entries = sorted(devices.iterdir(), key=lambda p: _natural_key(p.name))
    except OSError:
        return {}
    pmus: dict[str, Pmu] = {}
    for entry in entries:
        pmu = _read_pmu(entry.name, entry)
        if pmu is not None:
            pmus[pmu.name] = pmu
    return pmus


def _natural_key(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*?)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def encode(pmu: Pmu, terms: str) -> tuple[int, int, int]:
    """``"event=0x04,umask=0x03"`` -> (config, config1, config2) per ``pmu``'s format.

    A term without ``=`` means 1 (``edge`` is ``edge=1``), as perf reads it; the raw words
    ``config=``, ``config1=``, ``config2=`` are accepted too.
    """
    words = dict.fromkeys(_WORDS, 0)
    seen: set[str] = set()
    for raw in terms.split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, has_value, value_text = raw.partition("=")
        name = name.strip()
        if name in seen:
            raise ValueError(f"{pmu.name}: term {name!r} given twice in {terms!r}")
        seen.add(name)
        if has_value and value_text.strip() == "?":
            raise ValueError(f"{pmu.name}: term {name!r} in {terms!r} needs a value")
        try:
            value = _parse_int(value_text) if has_value else 1
        except ValueError:
            raise ValueError(f"{pmu.name}: {name}={value_text.strip()!r} is not a number") from None
        if value < 0:
            raise ValueError(f"{pmu.name}: {name}={value} is negative")
        if name in words:
            if value >> 64:
                raise ValueError(f"{pmu.name}: {name}={value:#x} does not fit in 64 bits")
            words[name] |= value
            continue
        field = pmu.formats.get(name)
        if field is None:
            known = ", ".join(sorted(pmu.formats)) or "none"
            raise ValueError(
                f"{pmu.name}: unknown term {name!r} in {terms!r} (format terms: {known})"
            )
        if field.word not in words:
            raise ValueError(f"{pmu.name}: term {name!r} lives in {field.word}, not supported")
        if value >> field.width_bits:
            raise ValueError(
                f"{pmu.name}: {name}={value:#x} does not fit in its {field.width_bits} bits"
            )
        for i, bit in enumerate(field.bits):
            if (value >> i) & 1:
                words[field.word] |= 1 << bit
    return words["config"], words["config1"], words["config2"]


def event_spec(pmu: Pmu, event: str) -> EventSpec:
    """An ``events/<name>`` alias, or raw terms, of ``pmu`` as an :class:`EventSpec`."""
    alias = pmu.events.get(event)
    terms = alias.terms if alias is not None else event
    config, config1, config2 = encode(pmu, terms)
    return EventSpec(pmu.type, config, config1, config2, label=f"{pmu.name}/{event}/")


# --------------------------------------------------------------------------- readings, rates


class CounterReading(NamedTuple):
    """One read(2) of a counter opened with TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING."""

    value: int
    time_enabled_ns: int
    time_running_ns: int

    def scaled(self) -> int | None:
        """The count extrapolated over multiplexing (value x enabled / running).

        None when the counter never ran: there is nothing to extrapolate from. This is
        perf's own rule (tools/lib/perf/evsel.c, perf_counts_values__scale).
        """
        if self.time_running_ns == 0:
            return None
        if self.time_running_ns >= self.time_enabled_ns:
            return self.value
        return round(self.value * self.time_enabled_ns / self.time_running_ns)


@dataclass(frozen=True, slots=True)
class TimedReading:
    reading: CounterReading
    monotonic_s: float


def counter_rate(
    prev: TimedReading,
    new: TimedReading,
    *,
    width_bits: int = 64,
    max_rate_per_s: float = math.inf,
) -> float | None:
    """Counts per second between two readings of one counter; None if the interval lies.

    - A raw value that went down wrapped at ``width_bits``: add ``2**width_bits``. Counts
      read through perf_event are already 64-bit (the kernel folds the hardware width, 48
      bits on Intel uncore, into a 64-bit count: arch/x86/events/intel/uncore.c,
      uncore_perf_event_update, polled by an hrtimer so it cannot wrap twice unseen);
      a smaller width is for raw hardware readers.
    - A wrap-corrected delta of half the range or more, a rate above ``max_rate_per_s``,
      time standing still or going backwards, or running time going backwards is a reset
      (counter reopened, machine resumed): None for that interval.
    - If the counter was multiplexed, the delta is scaled by Δenabled / Δrunning; a
      counter that did not run at all in the interval gives None.
    """
    interval_s = new.monotonic_s - prev.monotonic_s
    if not interval_s > 0:
        return None
    delta = new.reading.value - prev.reading.value
    if delta < 0:
        delta += 1 << width_bits
        if delta <= 0 or delta >= 1 << (width_bits - 1):
            return None
    running_ns = new.reading.time_running_ns - prev.reading.time_running_ns
    enabled_ns = new.reading.time_enabled_ns - prev.reading.time_enabled_ns
    if running_ns <= 0 or enabled_ns < 0:
        return None
    scaled = delta * enabled_ns / running_ns if enabled_ns > running_ns else float(delta)
    rate = scaled / interval_s
    if rate > max_rate_per_s:
        return None
    return rate


class RateTracker:
    """Keeps the previous reading of one counter; :meth:`update` returns the last rate."""

    def __init__(self, *, width_bits: int = 64, max_rate_per_s: float = math.inf) -> None:
        self.width_bits = width_bits
        self.max_rate_per_s = max_rate_per_s
        self._prev: TimedReading | None = None

    def update(self, reading: CounterReading, monotonic_s: float) -> float | None:
        new = TimedReading(reading, monotonic_s)
        prev, self._prev = self._prev, new
        if prev is None:
            return None
        return counter_rate(
            prev, new, width_bits=self.width_bits, max_rate_per_s=self.max_rate_per_s
        )


# --------------------------------------------------------------------------- backend (C)


class PerfBackend(Protocol):
    """The syscalls, with Python values; failures raise :class:`PerfError` named ``what``.

    :class:`CffiBackend` is the real one; tests pass a fake to see exactly what would be
    opened and to feed readings.
    """

    def open(
        self,
        spec: EventSpec,
        *,
        pid: int,
        cpu: int,
        group_fd: int,
        disabled: bool,
        inherit: bool,
        what: str,
    ) -> int: ...

    def read(self, fd: int, *, what: str) -> CounterReading: ...

    def read_many(self, fds: Sequence[int], *, what: str) -> list[CounterReading]: ...

    def ioctl(self, fd: int, op: str, *, what: str) -> None: ...

    def close(self, fd: int, *, what: str) -> None: ...


def _load_extension() -> tuple[Any, Any]:
    try:
        # import_module, not "from coda_node import _perf": it honours sys.modules, so a
        # test can make the extension missing.
        _perf = importlib.import_module("coda_node._perf")
    except ImportError as exc:
        raise PerfUnavailable(
            _errno.ENOSYS,
            "perf counters",
            f"coda_node._perf is not built ({exc}); build the extension: pip install -e .",
        ) from exc
    return _perf.ffi, _perf.lib


class CffiBackend:
    """The one choke point for ``coda_node._perf``: every C call goes through here."""

    def __init__(self) -> None:
        self._ffi, self._lib = _load_extension()
        self._ioctls: dict[str, Callable[[int], int]] = {
            "enable": self._lib.coda_perf_enable,
            "disable": self._lib.coda_perf_disable,
            "reset": self._lib.coda_perf_reset,
        }

    def open(
        self,
        spec: EventSpec,
        *,
        pid: int,
        cpu: int,
        group_fd: int,
        disabled: bool,
        inherit: bool,
        what: str,
    ) -> int:
        rc = self._lib.coda_perf_open(
            spec.type,
            spec.config,
            spec.config1,
            spec.config2,
            pid,
            cpu,
            group_fd,
            int(disabled),
            int(inherit),
        )
        _raise_for(rc, what, "open")
        return int(rc)

    def read(self, fd: int, *, what: str) -> CounterReading:
        # A buffer per call: the GIL is released during the C call, so a shared one would
        # race between threads.
        buf = self._ffi.new("uint64_t[3]")
        rc = self._lib.coda_perf_read(fd, buf, buf + 1, buf + 2)
        _raise_for(rc, what, "read")
        return CounterReading(buf[0], buf[1], buf[2])

    def read_many(self, fds: Sequence[int], *, what: str) -> list[CounterReading]:
        n = len(fds)
        out = self._ffi.new("uint64_t[]", 3 * n)
        rc = self._lib.coda_perf_read_many(n, self._ffi.new("int[]", fds), out)
        _raise_for(rc, what, "read")
        words = self._ffi.unpack(out, 3 * n)
        return [CounterReading(*words[i : i + 3]) for i in range(0, 3 * n, 3)]

    def ioctl(self, fd: int, op: str, *, what: str) -> None:
        _raise_for(self._ioctls[op](fd), what, op)

    def close(self, fd: int, *, what: str) -> None:
        _raise_for(self._lib.coda_perf_close(fd), what, "close")


_default_backend: CffiBackend | None = None
_default_lock = threading.Lock()


def default_backend() -> CffiBackend:
    """The process-wide :class:`CffiBackend`, created (and the extension loaded) on first use."""
    global _default_backend
    with _default_lock:
        if _default_backend is None:
            _default_backend = CffiBackend()
        return _default_backend


# --------------------------------------------------------------------------- counters


class Counter:
    """One open perf counter. Close it (or use ``with``); reads return raw readings."""

    def __init__(
        self, backend: PerfBackend, fd: int, spec: EventSpec, *, pid: int, cpu: int
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.pid = pid
        self.cpu = cpu
        self._fd = fd
        self.label = spec.label or f"type {spec.type} config {spec.config:#x}"
        self._what_read = f"read {self.label} counter (cpu {cpu})"

    @property
    def fd(self) -> int:
        """The perf fd; -1 once closed."""
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def read(self) -> CounterReading:
        # A closed counter reads fd -1, and the kernel's EBADF becomes the error: the fd
        # number is never kept after close, since another open() may reuse it.
        return self.backend.read(self._fd, what=self._what_read)

    def enable(self) -> None:
        self.backend.ioctl(self._fd, "enable", what=f"enable {self.label} counter")

    def disable(self) -> None:
        self.backend.ioctl(self._fd, "disable", what=f"disable {self.label} counter")

    def reset(self) -> None:
        self.backend.ioctl(self._fd, "reset", what=f"reset {self.label} counter")

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        self.backend.close(fd, what=f"close {self.label} counter")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_counter(
    spec: EventSpec,
    *,
    pid: int = 0,
    cpu: int = -1,
    disabled: bool = False,
    inherit: bool = False,
    backend: PerfBackend | None = None,
) -> Counter:
    """perf_event_open(spec, pid, cpu). Uncore events need ``pid=-1`` and a CPU from the
    PMU's cpumask; task events ``pid`` (0 = this thread) and ``cpu=-1``."""
    be = backend if backend is not None else default_backend()
    fd = be.open(
        spec,
        pid=pid,
        cpu=cpu,
        group_fd=-1,
        disabled=disabled,
        inherit=inherit,
        what=f"open {spec.describe()} for pid {pid} cpu {cpu}",
    )
    return Counter(be, fd, spec, pid=pid, cpu=cpu)


def open_software(
    event: str,
    pid: int = 0,
    cpu: int = -1,
    *,
    inherit: bool = False,
    backend: PerfBackend | None = None,
) -> Counter:
    """A PERF_TYPE_SOFTWARE counter: ``task-clock``, ``cpu-clock``, ``context-switches``, ...

    These need no hardware PMU, so they work on any VM.
    """
    config = SOFTWARE_EVENTS.get(event)
    if config is None:
        raise ValueError(f"unknown software event {event!r} (known: {', '.join(SOFTWARE_EVENTS)})")
    spec = EventSpec(PERF_TYPE_SOFTWARE, config, label=event)
    return open_counter(spec, pid=pid, cpu=cpu, inherit=inherit, backend=backend)


class CounterSet:
    """Counters read together: one :meth:`read` is one crossing into C for all of them."""

    def __init__(self, counters: Sequence[Counter]) -> None:
        self.counters = tuple(counters)
        backends = {id(c.backend) for c in self.counters}
        if len(backends) > 1:
            raise ValueError("a CounterSet's counters must share one backend")
        self._what = f"read {len(self.counters)} counters"

    def read(self) -> list[CounterReading]:
        if not self.counters:
            return []
        backend = self.counters[0].backend
        try:
            return backend.read_many([c.fd for c in self.counters], what=self._what)
        except PerfError:
            # C stops at the first failure without saying which fd: read them one by one
            # so the error names the counter. If all succeed now, the failure was transient.
            return [c.read() for c in self.counters]

    def close(self) -> None:
        errors: list[PerfError] = []
        for counter in self.counters:
            try:
                counter.close()
            except PerfError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __len__(self) -> int:
        return len(self.counters)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------- uncore plans


@dataclass(frozen=True, slots=True)
class PlannedCounter:
    """One uncore counter to open: ``spec`` on ``cpu`` (one CPU of ``socket``)."""

    pmu: str
    event: str
    direction: str
    socket: int
    cpu: int
    spec: EventSpec
    bytes_per_count: float


@dataclass(frozen=True, slots=True)
class UncorePlan:
    """Which counters a bandwidth sampler would open; empty with ``reason`` when none."""

    what: str
    counters: tuple[PlannedCounter, ...]
    reason: str

    @property
    def available(self) -> bool:
        return bool(self.counters)

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.counters}))


def cpu_socket(root: SystemRoot, cpu: int) -> int:
    """physical_package_id of ``cpu`` (Documentation/ABI/stable/sysfs-devices-system-cpu)."""
    path = root.path(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id")
    return int(path.read_text().strip())


# IMC read/write events by PMU family. uncore_imc_<N> on server parts has
# cas_count_read/cas_count_write, "event=0x04,umask=0x03" / "umask=0x0c" on SNB-EP..SKX
# with scale 6.103515625e-5 and unit MiB: 64 / 2**20, i.e. one 64-byte line per CAS
# (arch/x86/events/intel/uncore_snbep.c, snbep_uncore_imc_events; the scale is spelled
# out as "64 / 1024.0 / 1024.0" in the perf DRAM_BW_Use metric fix on LKML).
# uncore_imc_free_running_<N> has data_read/data_write (client) or read/write (ICX); the
# single client uncore_imc of SNB..SKL desktops has data_reads/data_writes
# (arch/x86/events/intel/uncore_snb.c), same 64-byte scale.
_IMC_EVENTS = {
    "read": ("cas_count_read", "data_reads", "data_read", "read"),
    "write": ("cas_count_write", "data_writes", "data_write", "write"),
}
_IMC_PROGRAMMABLE = re.compile(r"uncore_imc(_\d+)?")
_IMC_FREE_RUNNING = re.compile(r"uncore_imc_free_running_\d+")
# SKX..SPR: uncore_iio_free_running_<N> has bw_in_port<k> / bw_out_port<k>, scale
# 3.814697266e-6 MiB = 4 bytes per count (uncore_snbep.c, skx_uncore_iio_freerunning_events).
# "in" is data from the PCIe device into the socket (device DMA writes, GPU->host copies),
# "out" data from the socket to the device.
_IIO_PMU = re.compile(r"uncore_iio(_free_running)?_\d+")
_IIO_EVENTS = {"in": re.compile(r"bw_in_port\d+"), "out": re.compile(r"bw_out_port\d+")}


def _plan_counters(
    root: SystemRoot, events_by_direction: dict[str, list[tuple[Pmu, PmuEvent]]]
) -> tuple[list[PlannedCounter], list[str]]:
    counters: list[PlannedCounter] = []
    problems: list[str] = []
    socket_of: dict[int, int] = {}
    for direction, pairs in events_by_direction.items():
        for pmu, event in pairs:
            if not pmu.cpumask:
                problems.append(f"{pmu.name} has no cpumask")
                continue
            bytes_per_count = event.bytes_per_count
            if bytes_per_count is None:
                problems.append(
                    f"{pmu.name}/{event.name}: unit {event.unit or '(none)'!r} is not bytes"
                )
                continue
            try:
                spec = event_spec(pmu, event.name)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            for cpu in pmu.cpumask:
                if cpu not in socket_of:
                    try:
                        socket_of[cpu] = cpu_socket(root, cpu)
                    except (OSError, ValueError) as exc:
                        problems.append(f"socket of cpu {cpu}: {exc}")
                        continue
                counters.append(
                    PlannedCounter(
                        pmu.name,
                        event.name,
                        direction,
                        socket_of[cpu],
                        cpu,
                        spec,
                        bytes_per_count,
                    )
                )
    counters.sort(key=lambda c: (c.socket, _natural_key(c.pmu), c.direction, c.event, c.cpu))
    return counters, problems


def _pmu_list(pmus: dict[str, Pmu]) -> str:
    return ", ".join(pmus) or "none"


def plan_mem_bw(root: SystemRoot, pmus: dict[str, Pmu] | None = None) -> UncorePlan:
    """One cas_count_read and one cas_count_write counter per (IMC PMU, socket CPU).

    The IMC PMU's cpumask names one CPU per socket (per die on multi-die parts); the
    kernel reads the socket's channel through whichever CPU the counter is opened on.
    """
    what = "uncore memory bandwidth"
    pmus = discover_pmus(root) if pmus is None else pmus
    programmable = [p for n, p in pmus.items() if _IMC_PROGRAMMABLE.fullmatch(n)]
    free_running = [p for n, p in pmus.items() if _IMC_FREE_RUNNING.fullmatch(n)]
    if not programmable and not free_running:
        return UncorePlan(what, (), f"no uncore_imc PMUs (PMUs here: {_pmu_list(pmus)})")

    def pick(family: list[Pmu]) -> dict[str, list[tuple[Pmu, PmuEvent]]]:
        chosen: dict[str, list[tuple[Pmu, PmuEvent]]] = {d: [] for d in _IMC_EVENTS}
        for pmu in family:
            for direction, names in _IMC_EVENTS.items():
                event = next((pmu.events[n] for n in names if n in pmu.events), None)
                if event is not None:
                    chosen[direction].append((pmu, event))
        return chosen

    # Ice Lake-SP has both families over the same channels: counting both would double
    # the bandwidth, so the free-running ones are only a fallback.
    chosen = pick(programmable)
    if not any(chosen.values()):
        chosen = pick(free_running)
    if not any(chosen.values()):
        names = ", ".join(p.name for p in programmable + free_running)
        return UncorePlan(
            what, (), f"uncore_imc PMUs ({names}) expose no CAS/data read or write events"
        )
    counters, problems = _plan_counters(root, chosen)
    if not counters:
        return UncorePlan(what, (), "; ".join(problems))
    sockets = ", ".join(str(n) for n in sorted({c.socket for c in counters}))
    reason = (
        f"{len({c.pmu for c in counters})} IMC PMUs, {len(counters)} counters, sockets {sockets}"
    )
    if problems:
        reason += " (skipped: " + "; ".join(problems) + ")"
    return UncorePlan(what, tuple(counters), reason)


def plan_pcie_bw(root: SystemRoot, pmus: dict[str, Pmu] | None = None) -> UncorePlan:
    """Per-port bw_in/bw_out counters of the IIO PMUs, to be summed per socket.

    The programmable uncore_iio_<N> PMUs have only a format directory: the PCIe data
    events there need raw codes with ch_mask/fc_mask from Intel's uncore event list. We
    do not guess those; without the free-running bandwidth events PCIe bandwidth is
    reported as not available.
    """
    what = "uncore PCIe bandwidth"
    pmus = discover_pmus(root) if pmus is None else pmus
    iio = [p for n, p in pmus.items() if _IIO_PMU.fullmatch(n)]
    if not iio:
        return UncorePlan(what, (), f"no uncore_iio PMUs (PMUs here: {_pmu_list(pmus)})")
    chosen: dict[str, list[tuple[Pmu, PmuEvent]]] = {d: [] for d in _IIO_EVENTS}
    for pmu in iio:
        for direction, pattern in _IIO_EVENTS.items():
            chosen[direction].extend(
                (pmu, e) for n, e in sorted(pmu.events.items()) if pattern.fullmatch(n)
            )
    if not any(chosen.values()):
        return UncorePlan(
            what,
            (),
            f"{len(iio)} uncore_iio PMUs but no named data in/out events (no "
            "uncore_iio_free_running bw_in_port/bw_out_port); raw IIO event codes would "
            "have to be configured",
        )
    counters, problems = _plan_counters(root, chosen)
    if not counters:
        return UncorePlan(what, (), "; ".join(problems))
    reason = f"{len({c.pmu for c in counters})} IIO PMUs, {len(counters)} port counters"
    if problems:
        reason += " (skipped: " + "; ".join(problems) + ")"
    return UncorePlan(what, tuple(counters), reason)


# --------------------------------------------------------------------------- samplers


@dataclass(frozen=True, slots=True)
class MemBwSample:
    """DRAM traffic of one socket over the last interval; None where unknown."""

    socket: int
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None
    monotonic_s: float


@dataclass(frozen=True, slots=True)
class PcieBwSample:
    """PCIe traffic of one socket: ``in`` = device to socket, ``out`` = socket to device."""

    socket: int
    in_bytes_per_s: float | None
    out_bytes_per_s: float | None
    monotonic_s: float


class _UncoreSampler:
    """Opens a plan's counters system-wide and sums their byte rates per socket."""

    def __init__(
        self,
        plan: UncorePlan,
        *,
        backend: PerfBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self._backend = backend
        self._clock = clock
        self._set: CounterSet | None = None
        self._trackers: list[RateTracker] = []

    @property
    def is_open(self) -> bool:
        return self._set is not None

    def open(self) -> None:
        """Open every planned counter and take the baseline reading."""
        if not self.plan.available:
            raise PerfUnavailable(_errno.ENODEV, self.plan.what, self.plan.reason)
        if self._set is not None:
            return
        backend = self._backend if self._backend is not None else default_backend()
        opened: list[Counter] = []
        try:
            for planned in self.plan.counters:
                opened.append(open_counter(planned.spec, pid=-1, cpu=planned.cpu, backend=backend))
        except PerfError:
            for counter in opened:
                with contextlib.suppress(PerfError):  # the open error is the one to report
                    counter.close()
            raise
        self._set = CounterSet(opened)
        self._trackers = [
            RateTracker(max_rate_per_s=MAX_PLAUSIBLE_BYTES_PER_S / c.bytes_per_count)
            for c in self.plan.counters
        ]
        self._rates()

    def _rates(self) -> tuple[float, list[float | None]]:
        if self._set is None:
            raise PerfError(_errno.EBADF, f"sample {self.plan.what}", "sampler is not open")
        readings = self._set.read()
        now_s = self._clock()
        rates: list[float | None] = []
        for planned, tracker, reading in zip(
            self.plan.counters, self._trackers, readings, strict=True
        ):
            counts_per_s = tracker.update(reading, now_s)
            rates.append(None if counts_per_s is None else counts_per_s * planned.bytes_per_count)
        return now_s, rates

    def _per_socket(self) -> tuple[float, dict[int, dict[str, float | None]]]:
        now_s, rates = self._rates()
        totals: dict[int, dict[str, float | None]] = {}
        for planned, rate in zip(self.plan.counters, rates, strict=True):
            by_direction = totals.setdefault(planned.socket, {})
            so_far = by_direction.get(planned.direction, 0.0)
            # One unknown counter makes the socket's total unknown, not smaller.
            by_direction[planned.direction] = (
                None if so_far is None or rate is None else so_far + rate
            )
        return now_s, totals

    def close(self) -> None:
        if self._set is not None:
            counters, self._set = self._set, None
            counters.close()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class UncoreMemBw(_UncoreSampler):
    """Per-socket DRAM read/write bytes/s from the IMC CAS counters.

    ``open()`` takes a baseline; each ``sample()`` returns the rates since the previous one.
    """

    def __init__(
        self,
        root: SystemRoot,
        *,
        plan: UncorePlan | None = None,
        backend: PerfBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(plan or plan_mem_bw(root), backend=backend, clock=clock)

    def sample(self) -> list[MemBwSample]:
        now_s, totals = self._per_socket()
        return [
            MemBwSample(socket, t.get("read"), t.get("write"), now_s)
            for socket, t in sorted(totals.items())
        ]


class UncorePcieBw(_UncoreSampler):
    """Per-socket PCIe in/out bytes/s from the IIO free-running bandwidth counters."""

    def __init__(
        self,
        root: SystemRoot,
        *,
        plan: UncorePlan | None = None,
        backend: PerfBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(plan or plan_pcie_bw(root), backend=backend, clock=clock)

    def sample(self) -> list[PcieBwSample]:
        now_s, totals = self._per_socket()
        return [
            PcieBwSample(socket, t.get("in"), t.get("out"), now_s)
            for socket, t in sorted(totals.items())
        ]


# --------------------------------------------------------------------------- capabilities


def read_perf_event_paranoid(root: SystemRoot) -> int | None:
    """``/proc/sys/kernel/perf_event_paranoid``; None when absent (no perf in the kernel)."""
    try:
        return int(root.path(PERF_EVENT_PARANOID).read_text().strip())
    except (OSError, ValueError):
        return None


# include/uapi/linux/capability.h
_CAP_SYS_ADMIN = 21
_CAP_PERFMON = 38


def _has_perfmon(root: SystemRoot) -> bool | None:
    try:
        text = root.path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
            return bool(caps >> _CAP_PERFMON & 1 or caps >> _CAP_SYS_ADMIN & 1)
    return None


def _paranoid_meaning(level: int) -> str:
    # Documentation/admin-guide/sysctl/kernel.rst, perf_event_paranoid. Debian and
    # Ubuntu add level 3 / 4: no perf_event_open at all without CAP_PERFMON.
    if level <= -1:
        return "all events for all users"
    if level == 0:
        return "CPU-wide (uncore) events for all users"
    if level == 1:
        return "per-process events for all users; CPU-wide events need CAP_PERFMON"
    if level == 2:
        return "user-space per-process events for all users; the rest needs CAP_PERFMON"
    return "nothing without CAP_PERFMON"


def _extension_error() -> str | None:
    try:
        _load_extension()
    except PerfUnavailable as exc:
        return exc.why
    return None


def probe_perf(root: SystemRoot, pmus: dict[str, Pmu] | None = None) -> list[Capability]:
    """Capability rows for ``coda-node check``: perf itself, IMC and IIO bandwidth."""
    pmus = discover_pmus(root) if pmus is None else pmus
    paranoid = read_perf_event_paranoid(root)
    privileged = _has_perfmon(root)
    ext_error = _extension_error()
    if paranoid is None:
        perf = Capability("perf counters", False, f"no {PERF_EVENT_PARANOID} (perf disabled?)")
    elif ext_error is not None:
        perf = Capability("perf counters", False, ext_error)
    else:
        who = (
            "this process has CAP_PERFMON"
            if privileged
            else "this process lacks CAP_PERFMON"
            if privileged is False
            else "capabilities unknown"
        )
        perf = Capability(
            "perf counters",
            True,
            f"perf_event_paranoid={paranoid} ({_paranoid_meaning(paranoid)}); {who}",
        )
    rows = [perf]
    for plan in (plan_mem_bw(root, pmus), plan_pcie_bw(root, pmus)):
        detail = plan.reason
        usable = plan.available and perf.available
        if plan.available and not perf.available:
            detail += f"; but {perf.detail}"
        elif plan.available and privileged is False and paranoid is not None and paranoid > 0:
            usable = False
            detail += f"; CPU-wide counters need CAP_PERFMON at perf_event_paranoid={paranoid}"
        rows.append(Capability(plan.what, usable, detail))
    return rows
