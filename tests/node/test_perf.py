"""coda_node.system.perf: sysfs parsing and encoding (tables), uncore plans and samplers on
fixture trees with a fake backend, and the real perf_event_open path through the cffi
extension on this machine's software PMU."""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from coda_node.system import perf
from coda_node.system.cpulist import parse_cpulist
from coda_node.system.paths import SystemRoot
from coda_node.system.perf import (
    CounterReading,
    CounterSet,
    EventSpec,
    FormatField,
    PerfError,
    PerfUnavailable,
    Pmu,
    TimedReading,
)
from tests.node.perf_fixtures import (
    SKX_TYPES,
    make_amd_tree,
    make_skx_tree,
    write_pmu,
    write_topology,
)

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text,word,bits",
    [
        ("config:0-7\n", "config", tuple(range(8))),
        ("config:8-15", "config", tuple(range(8, 16))),
        ("config:21", "config", (21,)),
        ("config1:0-31", "config1", tuple(range(32))),
        ("config2:3", "config2", (3,)),
        ("config:0-7,32-35", "config", (*range(8), 32, 33, 34, 35)),
        ("config1:1,6-10,44", "config1", (1, 6, 7, 8, 9, 10, 44)),
        ("config:0-63", "config", tuple(range(64))),
    ],
)
def test_parse_format(text: str, word: str, bits: tuple[int, ...]) -> None:
    field = perf.parse_format("f", text)
    assert (field.word, field.bits, field.width_bits) == (word, bits, len(bits))


@pytest.mark.parametrize(
    "text",
    ["config:7-0", "config:64", "config:60-64", "attr:0-7", "config:", "config:1,1", "config:0-"],
)
def test_parse_format_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="format f"):
        perf.parse_format("f", text)


@pytest.mark.parametrize(
    "text,cpus",
    [("0,28\n", (0, 28)), ("0-1", (0, 1)), ("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)), ("", ())],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert tuple(sorted(parse_cpulist(text))) == cpus


def _pmu(name: str, formats: dict[str, str]) -> Pmu:
    return Pmu(
        name=name,
        type=42,
        formats={k: perf.parse_format(k, v) for k, v in formats.items()},
        events={},
        cpumask=(),
    )


INTEL_CORE = _pmu(
    "cpu",
    {
        "event": "config:0-7",
        "umask": "config:8-15",
        "edge": "config:18",
        "any": "config:21",
        "cmask": "config:24-31",
        "ldlat": "config1:0-15",
        "frontend": "config1:0-23",
    },
)
AMD_CORE = _pmu("cpu", {"event": "config:0-7,32-35", "umask": "config:8-15"})
SPR_CHA = _pmu("uncore_cha_0", {"event": "config:0-7", "umask": "config:8-15,32-55"})
WITH_CONFIG2 = _pmu("weird", {"sel": "config2:4-7", "opc": "config1:0-5"})


@pytest.mark.parametrize(
    "pmu,terms,expect",
    [
        (INTEL_CORE, "event=0x04,umask=0x03", (0x0304, 0, 0)),
        (INTEL_CORE, "event=0x3c,any", (0x3C | 1 << 21, 0, 0)),
        (INTEL_CORE, "event=0x3c,any=1,edge=0", (0x3C | 1 << 21, 0, 0)),
        (INTEL_CORE, "event=0xcd,umask=0x1,ldlat=3", (0x01CD, 3, 0)),
        (INTEL_CORE, "event=0xc0,cmask=255", (0xFF0000C0, 0, 0)),
        (INTEL_CORE, "event=010", (0o10, 0, 0)),  # strtoull base 0: leading 0 is octal
        (INTEL_CORE, " event=0x2e , umask=0x41 ,", (0x412E, 0, 0)),
        (INTEL_CORE, "config=0x1234,config1=7", (0x1234, 7, 0)),
        (AMD_CORE, "event=0x1c0", (0xC0 | 1 << 32, 0, 0)),
        (AMD_CORE, "event=0xfff,umask=0xff", (0xFFFF | 0xF << 32, 0, 0)),
        (SPR_CHA, "event=0x35,umask=0x1c8ffff", (0x35 | 0xFF00 | 0x1C8FF << 32, 0, 0)),
        (WITH_CONFIG2, "sel=0xf,opc=0x21", (0, 0x21, 0xF0)),
        (INTEL_CORE, "", (0, 0, 0)),
    ],
)
def test_encode(pmu: Pmu, terms: str, expect: tuple[int, int, int]) -> None:
    assert perf.encode(pmu, terms) == expect


@pytest.mark.parametrize(
    "pmu,terms,message",
    [
        (INTEL_CORE, "event=0x04,colour=3", "unknown term 'colour'.*format terms: any, cmask"),
        (INTEL_CORE, "umask=0x100", r"umask=0x100 does not fit in its 8 bits"),
        (INTEL_CORE, "any=2", r"any=0x2 does not fit in its 1 bits"),
        (AMD_CORE, "event=0x1000", r"event=0x1000 does not fit in its 12 bits"),
        (INTEL_CORE, "event=1,event=2", "term 'event' given twice"),
        (INTEL_CORE, "event=?", "needs a value"),
        (INTEL_CORE, "event=lots", "'lots' is not a number"),
        (INTEL_CORE, "event=-1", "negative"),
        (INTEL_CORE, "config=0x10000000000000000", "does not fit in 64 bits"),
    ],
)
def test_encode_rejects(pmu: Pmu, terms: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        perf.encode(pmu, terms)


# --------------------------------------------------------------------------- discovery


def test_discover_skx(tmp_path: Path) -> None:
    pmus = perf.discover_pmus(make_skx_tree(tmp_path))
    assert {n for n in pmus if n.startswith("uncore_imc_")} == {f"uncore_imc_{i}" for i in range(6)}
    assert pmus["software"].type == perf.PERF_TYPE_SOFTWARE
    assert pmus["software"].cpumask == () and pmus["software"].formats == {}
    imc = pmus["uncore_imc_3"]
    assert imc.type == SKX_TYPES["uncore_imc_3"]
    assert imc.cpumask == (0, 28)
    assert imc.formats["umask"] == FormatField("umask", "config", tuple(range(8, 16)))
    assert imc.formats["edge"].bits == (18,)
    read = imc.events["cas_count_read"]
    assert (read.terms, read.scale, read.unit) == ("event=0x04,umask=0x03", 6.103515625e-5, "MiB")
    assert read.bytes_per_count == 64.0
    # .scale/.unit files are attributes of an event, not events of their own
    assert set(imc.events) == {"clockticks", "cas_count_read", "cas_count_write"}
    assert imc.events["clockticks"].bytes_per_count is None
    assert pmus["uncore_iio_0"].events == {}
    assert pmus["uncore_iio_0"].formats["ch_mask"].bits == tuple(range(36, 44))
    assert pmus["cpu"].events["topdown-total-slots"].scale == 2.0
    assert pmus["cpu"].formats["ldlat"].word == "config1"
    assert all(p.problems == () for p in pmus.values())


def test_discover_amd(tmp_path: Path) -> None:
    pmus = perf.discover_pmus(make_amd_tree(tmp_path))
    assert not [n for n in pmus if n.startswith("uncore_")]
    assert perf.encode(pmus["cpu"], "event=0x1c0") == (0xC0 | 1 << 32, 0, 0)
    assert pmus["power"].events["energy-pkg"].unit == "Joules"


def test_discover_missing_dir_and_broken_files(tmp_path: Path) -> None:
    assert perf.discover_pmus(SystemRoot(tmp_path)) == {}
    root = make_amd_tree(tmp_path)
    (tmp_path / "sys/devices/cpu/format/broken").write_text("config:9-3\n")
    (tmp_path / "sys/devices/amd_l3/type").write_text("not a number\n")
    pmus = perf.discover_pmus(root)
    assert "amd_l3" not in pmus
    assert pmus["cpu"].problems == ("format broken: bit range '9-3' outside 0-63 or reversed",)
    assert "event" in pmus["cpu"].formats


# --------------------------------------------------------------------------- readings, rates


@pytest.mark.parametrize(
    "reading,scaled",
    [
        (CounterReading(1000, 2_000_000, 2_000_000), 1000),
        (CounterReading(1000, 2_000_000, 1_000_000), 2000),  # ran half the time
        (CounterReading(1000, 3_000_000, 1_000_000), 3000),
        (CounterReading(0, 5_000_000, 0), None),  # never scheduled
        (CounterReading(7, 0, 0), None),
        (CounterReading(10, 1_000, 1_010), 10),  # running read a hair after enabled
    ],
)
def test_multiplex_scaling(reading: CounterReading, scaled: int | None) -> None:
    assert reading.scaled() == scaled


def _tr(value: int, t_s: float, enabled_ns: int | None = None, running_ns: int | None = None):
    enabled = int(t_s * 1e9) if enabled_ns is None else enabled_ns
    running = enabled if running_ns is None else running_ns
    return TimedReading(CounterReading(value, enabled, running), t_s)


W48 = 1 << 48


@pytest.mark.parametrize(
    "prev,new,kwargs,rate",
    [
        (_tr(100, 1.0), _tr(300, 2.0), {}, 200.0),
        (_tr(100, 1.0), _tr(100, 1.5), {}, 0.0),
        (_tr(0, 10.0), _tr(1_000, 10.25), {}, 4_000.0),
        # 48-bit wrap: 100 counts before the top, 100 after
        (_tr(W48 - 100, 1.0), _tr(100, 2.0), {"width_bits": 48}, 200.0),
        # a "wrap" of more than half the range is a reset (counter reopened)
        (_tr(W48 - 100, 1.0), _tr(W48 // 2 + 1, 2.0), {"width_bits": 48}, None),
        # at 64 bits (perf's own counts) a decrease is always a reset
        (_tr(5_000_000, 1.0), _tr(42, 2.0), {}, None),
        # implausibly fast
        (_tr(0, 1.0), _tr(10**12, 2.0), {"max_rate_per_s": 1e9}, None),
        (_tr(0, 1.0), _tr(10**9, 2.0), {"max_rate_per_s": 1e9}, 1e9),
        # time standing still or going backwards
        (_tr(100, 2.0), _tr(300, 2.0), {}, None),
        (_tr(100, 2.0), _tr(300, 1.0), {}, None),
        (
            _tr(100, 1.0),
            TimedReading(CounterReading(300, 2 * 10**9, 2 * 10**9), math.nan),
            {},
            None,
        ),
        # multiplexed: ran 0.5 s of the 1 s enabled -> the 100 counts stand for 200
        (
            _tr(0, 1.0, 1_000_000_000, 500_000_000),
            _tr(100, 2.0, 2_000_000_000, 1_000_000_000),
            {},
            200.0,
        ),
        # not scheduled at all during the interval
        (
            _tr(0, 1.0, 1_000_000_000, 500_000_000),
            _tr(0, 2.0, 2_000_000_000, 500_000_000),
            {},
            None,
        ),
        # enabled/running went backwards: the counter was reopened
        (_tr(0, 1.0, 5_000_000_000), _tr(10, 2.0, 1_000_000_000), {}, None),
    ],
)
def test_counter_rate(
    prev: TimedReading, new: TimedReading, kwargs: dict[str, float], rate: float | None
) -> None:
    got = perf.counter_rate(prev, new, **kwargs)  # type: ignore[arg-type]
    assert got == (None if rate is None else pytest.approx(rate))


def test_rate_tracker_recovers_after_a_reset() -> None:
    tracker = perf.RateTracker(width_bits=48)
    steps = [
        (CounterReading(1_000, 0, 0), 0.0, None),  # no previous reading
        (CounterReading(2_000, 10**9, 10**9), 1.0, 1_000.0),
        (CounterReading(50, 2 * 10**9, 2 * 10**9), 2.0, None),  # reset: the value went back
        (CounterReading(550, 3 * 10**9, 3 * 10**9), 3.0, 500.0),  # measured from the reset
    ]
    for reading, t_s, expect in steps:
        got = tracker.update(reading, t_s)
        assert got == (None if expect is None else pytest.approx(expect))


# --------------------------------------------------------------------------- fake backend


class FakeBackend:
    """Records what would be opened; each fd reads the value the test sets."""

    def __init__(self, *, fail_open_after: int | None = None) -> None:
        self.opened: list[tuple[EventSpec, int, int]] = []
        self.live: dict[int, CounterReading] = {}
        self.closed: list[int] = []
        self.read_many_calls = 0
        self._next_fd = 100
        self._fail_open_after = fail_open_after

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
        if self._fail_open_after is not None and len(self.opened) >= self._fail_open_after:
            raise PerfError(errno.EACCES, what)
        fd = self._next_fd
        self._next_fd += 1
        self.opened.append((spec, pid, cpu))
        self.live[fd] = CounterReading(0, 0, 0)
        return fd

    def read(self, fd: int, *, what: str) -> CounterReading:
        if fd not in self.live:
            raise PerfError(errno.EBADF, what)
        return self.live[fd]

    def read_many(self, fds: Sequence[int], *, what: str) -> list[CounterReading]:
        self.read_many_calls += 1
        return [self.read(fd, what=what) for fd in fds]

    def ioctl(self, fd: int, op: str, *, what: str) -> None:
        if fd not in self.live:
            raise PerfError(errno.EBADF, what)

    def close(self, fd: int, *, what: str) -> None:
        del self.live[fd]
        self.closed.append(fd)

    def advance(self, counts: dict[int, int], at_s: float) -> None:
        """Add counts to each fd; time enabled/running = at_s."""
        for fd, add in counts.items():
            old = self.live[fd]
            ns = int(at_s * 1e9)
            self.live[fd] = CounterReading(old.value + add, ns, ns)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


READ, WRITE = 0x0304, 0x0C04  # event=0x04 with umask 0x03 / 0x0c


def test_imc_plan_on_skx(tmp_path: Path) -> None:
    plan = perf.plan_mem_bw(make_skx_tree(tmp_path))
    assert plan.available and plan.sockets == (0, 1)
    opened = {(c.spec.type, c.spec.config, c.cpu, c.socket, c.direction) for c in plan.counters}
    expect = {
        (SKX_TYPES[f"uncore_imc_{i}"], config, cpu, socket, direction)
        for i in range(6)
        for cpu, socket in ((0, 0), (28, 1))
        for config, direction in ((READ, "read"), (WRITE, "write"))
    }
    assert opened == expect and len(plan.counters) == 24
    assert {c.bytes_per_count for c in plan.counters} == {64.0}
    assert plan.counters[0].spec.label == "uncore_imc_0/cas_count_read/"


def test_mem_bw_sampler_bytes_per_socket(tmp_path: Path) -> None:
    root = make_skx_tree(tmp_path)
    backend, clock = FakeBackend(), Clock()
    sampler = perf.UncoreMemBw(root, backend=backend, clock=clock)
    sampler.open()
    # system-wide on one CPU of each socket, as uncore PMUs require
    assert {(pid, cpu) for _, pid, cpu in backend.opened} == {(-1, 0), (-1, 28)}
    by_fd = dict(zip(backend.live, sampler.plan.counters, strict=True))

    def cas(socket: int, direction: str) -> int:
        return {(0, "read"): 1_000_000, (0, "write"): 250_000, (1, "read"): 10, (1, "write"): 0}[
            (socket, direction)
        ]

    clock.now_s = 0.5
    backend.advance({fd: cas(c.socket, c.direction) for fd, c in by_fd.items()}, 0.5)
    samples = sampler.sample()
    assert backend.read_many_calls == 2  # baseline + this sample: one crossing each
    assert [s.socket for s in samples] == [0, 1]
    s0, s1 = samples
    # 6 channels x counts x 64 bytes / 0.5 s
    assert s0.read_bytes_per_s == pytest.approx(6 * 1_000_000 * 64 / 0.5)
    assert s0.write_bytes_per_s == pytest.approx(6 * 250_000 * 64 / 0.5)
    assert s1.read_bytes_per_s == pytest.approx(6 * 10 * 64 / 0.5)
    assert s1.write_bytes_per_s == 0.0
    assert s0.monotonic_s == 0.5

    # One socket-1 channel is reset (value drops): that socket's read total is unknown,
    # the rest still reports.
    reset_fd = next(fd for fd, c in by_fd.items() if c.socket == 1 and c.direction == "read")
    backend.live[reset_fd] = CounterReading(3, 10**9, 10**9)
    clock.now_s = 1.0
    backend.advance({fd: 1000 for fd in by_fd if fd != reset_fd}, 1.0)
    s0, s1 = sampler.sample()
    assert s1.read_bytes_per_s is None
    assert s1.write_bytes_per_s == pytest.approx(6 * 1000 * 64 / 0.5)
    assert s0.read_bytes_per_s == pytest.approx(6 * 1000 * 64 / 0.5)

    sampler.close()
    assert sorted(backend.closed) == sorted(by_fd) and not backend.live


def test_mem_bw_open_failure_closes_what_it_opened(tmp_path: Path) -> None:
    backend = FakeBackend(fail_open_after=5)
    sampler = perf.UncoreMemBw(make_skx_tree(tmp_path), backend=backend)
    with pytest.raises(PerfError) as info:
        sampler.open()
    assert info.value.errno == errno.EACCES
    assert "perf_event_paranoid" in str(info.value) and "CAP_PERFMON" in str(info.value)
    assert len(backend.closed) == 5 and not backend.live and not sampler.is_open


def test_imc_free_running_is_only_a_fallback(tmp_path: Path) -> None:
    both = perf.plan_mem_bw(make_skx_tree(tmp_path / "both", imc_free_running=True))
    assert {c.pmu for c in both.counters} == {f"uncore_imc_{i}" for i in range(6)}
    only_free = perf.plan_mem_bw(
        make_skx_tree(tmp_path / "free", imc_programmable=False, imc_free_running=True)
    )
    assert {(c.pmu, c.event, c.spec.config, c.cpu) for c in only_free.counters} == {
        (f"uncore_imc_free_running_{i}", event, config, cpu)
        for i in range(2)
        for event, config in (("read", 0x20FF), ("write", 0x21FF))
        for cpu in (0, 28)
    }


def test_client_imc_without_index(tmp_path: Path) -> None:
    # SNB..SKL desktops: one "uncore_imc" PMU, data_reads/data_writes, cpumask "0"
    events = {"data_reads": "event=0x01", "data_writes": "event=0x02"}
    for name in events.copy():
        events[f"{name}.scale"], events[f"{name}.unit"] = "6.103515625e-5", "MiB"
    write_pmu(
        tmp_path, "uncore_imc", 13, formats={"event": "config:0-7"}, events=events, cpumask="0"
    )
    write_topology(tmp_path, [0, 0, 0, 0])
    plan = perf.plan_mem_bw(SystemRoot(tmp_path))
    assert [
        (c.direction, c.spec.type, c.spec.config, c.cpu, c.bytes_per_count) for c in plan.counters
    ] == [
        ("read", 13, 0x01, 0, 64.0),
        ("write", 13, 0x02, 0, 64.0),
    ]


def test_pcie_plan_and_sampler(tmp_path: Path) -> None:
    root = make_skx_tree(tmp_path)
    plan = perf.plan_pcie_bw(root)
    # 6 IIO stacks x 4 ports x in/out, on one CPU of each of 2 sockets
    assert len(plan.counters) == 96
    assert {c.pmu for c in plan.counters} == {f"uncore_iio_free_running_{i}" for i in range(6)}
    assert {round(c.bytes_per_count, 6) for c in plan.counters} == {4.0}
    port0_in = [c for c in plan.counters if c.event == "bw_in_port0" and c.pmu.endswith("_2")]
    assert [(c.spec.type, c.spec.config, c.cpu) for c in port0_in] == [
        (SKX_TYPES["uncore_iio_free_running_2"], 0x20FF, 0),
        (SKX_TYPES["uncore_iio_free_running_2"], 0x20FF, 28),
    ]
    backend, clock = FakeBackend(), Clock()
    with perf.UncorePcieBw(root, backend=backend, clock=clock) as sampler:
        by_fd = dict(zip(backend.live, sampler.plan.counters, strict=True))
        clock.now_s = 2.0
        backend.advance(
            {fd: (1_000 if c.direction == "in" else 0) for fd, c in by_fd.items() if c.socket == 0},
            2.0,
        )
        backend.advance({fd: 0 for fd, c in by_fd.items() if c.socket == 1}, 2.0)
        (s0, s1) = sampler.sample()
    assert s0.in_bytes_per_s == pytest.approx(24 * 1_000 * 4.0 / 2.0)
    assert (s0.out_bytes_per_s, s1.in_bytes_per_s, s1.out_bytes_per_s) == (0.0, 0.0, 0.0)
    assert not backend.live


def test_pcie_without_named_events_is_not_available(tmp_path: Path) -> None:
    plan = perf.plan_pcie_bw(make_skx_tree(tmp_path, iio_free_running=False))
    assert not plan.available
    assert "6 uncore_iio PMUs but no named data in/out events" in plan.reason
    assert "raw IIO event codes" in plan.reason
    with pytest.raises(PerfUnavailable, match="raw IIO event codes"):
        perf.UncorePcieBw(SystemRoot(tmp_path), plan=plan, backend=FakeBackend()).open()


def test_amd_has_no_uncore_bandwidth(tmp_path: Path) -> None:
    root = make_amd_tree(tmp_path)
    mem = perf.plan_mem_bw(root)
    assert not mem.available
    assert mem.reason == (
        "no uncore_imc PMUs (PMUs here: amd_df, amd_l3, breakpoint, cpu, kprobe, msr, power, "
        "software, tracepoint, uprobe)"
    )
    assert not perf.plan_pcie_bw(root).available
    with pytest.raises(PerfUnavailable) as info:
        perf.UncoreMemBw(root, backend=FakeBackend()).open()
    assert info.value.errno == errno.ENODEV


def test_socket_from_topology_not_cpu_number(tmp_path: Path) -> None:
    root = make_skx_tree(tmp_path)
    # a machine whose uncore CPU for "socket 1" actually sits in package 3
    (tmp_path / "sys/devices/system/cpu/cpu28/topology/physical_package_id").write_text("3\n")
    assert perf.plan_mem_bw(root).sockets == (0, 3)
    (tmp_path / "sys/devices/system/cpu/cpu28/topology/physical_package_id").unlink()
    plan = perf.plan_mem_bw(root)
    assert plan.sockets == (0,)
    assert "socket of cpu 28" in plan.reason


# --------------------------------------------------------------------------- capabilities


def test_paranoid_and_capability_rows(tmp_path: Path) -> None:
    root = make_skx_tree(tmp_path / "skx", paranoid=2)
    assert perf.read_perf_event_paranoid(root) == 2
    rows = {c.name: c for c in perf.probe_perf(root)}
    assert rows["perf counters"].available
    assert "perf_event_paranoid=2" in rows["perf counters"].detail
    assert rows["uncore memory bandwidth"].available
    assert rows["uncore PCIe bandwidth"].available

    unprivileged = make_skx_tree(tmp_path / "user", paranoid=2, cap_eff=0)
    rows = {c.name: c for c in perf.probe_perf(unprivileged)}
    assert not rows["uncore memory bandwidth"].available
    assert "need CAP_PERFMON at perf_event_paranoid=2" in rows["uncore memory bandwidth"].detail

    amd = make_amd_tree(tmp_path / "amd", paranoid=None)
    assert perf.read_perf_event_paranoid(amd) is None
    rows = {c.name: c for c in perf.probe_perf(amd)}
    assert (
        not rows["perf counters"].available
        and "perf_event_paranoid" in rows["perf counters"].detail
    )
    assert not rows["uncore memory bandwidth"].available


@pytest.mark.parametrize(
    "err,op,needle",
    [
        (errno.EACCES, "open", "perf_event_paranoid"),
        (errno.EPERM, "read", "CAP_PERFMON"),
        (errno.ENOENT, "open", "event not supported by this PMU; ENOENT"),
        (errno.EINVAL, "open", "event not supported by this PMU; EINVAL"),
        (errno.EBADF, "read", "the counter is closed; EBADF"),
        (errno.EIO, "read", "input/output error; EIO"),
    ],
)
def test_errno_messages(err: int, op: str, needle: str) -> None:
    with pytest.raises(PerfError) as info:
        perf._raise_for(-err, "open x", op)
    assert info.value.errno == err and needle in str(info.value)
    assert str(info.value).startswith("open x (")


# --------------------------------------------------------------------------- the real kernel


def test_import_does_not_load_the_extension() -> None:
    code = "import sys, coda_node.system.perf; print('coda_node._perf' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_unbuilt_extension_is_perf_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "coda_node._perf", None)  # import now fails
    monkeypatch.setattr(perf, "_default_backend", None)
    with pytest.raises(PerfUnavailable, match=r"build the extension: pip install -e \.") as info:
        perf.open_software("task-clock")
    assert info.value.errno == errno.ENOSYS


@pytest.fixture
def kernel() -> perf.CffiBackend:
    try:
        backend = perf.CffiBackend()
    except PerfUnavailable as exc:
        pytest.fail(f"{exc} (the extension is part of the package build)")
    try:
        backend.close(
            backend.open(
                EventSpec(perf.PERF_TYPE_SOFTWARE, 1),
                pid=0,
                cpu=-1,
                group_fd=-1,
                disabled=False,
                inherit=False,
                what="probe task-clock",
            ),
            what="close probe",
        )
    except PerfError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOSYS):
            pytest.skip(f"perf_event_open not allowed here: {exc}")
        raise
    return backend


def _burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(1000))


def test_task_clock_counts_this_thread(kernel: perf.CffiBackend) -> None:
    with perf.open_software("task-clock", backend=kernel) as counter:
        first = counter.read()
        _burn_cpu(0.02)
        second = counter.read()
    assert second.value - first.value >= 15_000_000  # >= 15 ms of the 20 ms burnt, in ns
    assert second.time_enabled_ns > first.time_enabled_ns > 0
    assert second.time_running_ns > 0
    assert second.scaled() == second.value  # a software event is never multiplexed


def test_read_many_three_counters(kernel: perf.CffiBackend) -> None:
    counters = [
        perf.open_software(e, backend=kernel)
        for e in ("task-clock", "cpu-clock", "context-switches")
    ]
    with CounterSet(counters) as group:
        before = group.read()
        _burn_cpu(0.01)
        for _ in range(3):
            time.sleep(0.001)
        after = group.read()
    assert len(before) == len(after) == 3
    assert after[0].value > before[0].value and after[1].value > before[1].value
    assert after[2].value - before[2].value >= 3
    assert all(c.closed for c in counters)


def test_context_switches_count_sleeps(kernel: perf.CffiBackend) -> None:
    with perf.open_software("context-switches", backend=kernel) as counter:
        start = counter.read().value
        for _ in range(5):
            time.sleep(0.001)  # each sleep blocks: a voluntary context switch
        assert counter.read().value - start >= 5


def test_reset_and_disable(kernel: perf.CffiBackend) -> None:
    with perf.open_software("task-clock", backend=kernel) as counter:
        _burn_cpu(0.01)
        counter.reset()
        assert counter.read().value < 5_000_000
        counter.disable()
        frozen = counter.read().value
        _burn_cpu(0.01)
        assert counter.read().value == frozen
        counter.enable()
        _burn_cpu(0.01)
        assert counter.read().value > frozen


def test_invalid_pmu_type_is_a_plain_perf_error(kernel: perf.CffiBackend) -> None:
    with pytest.raises(PerfError) as info:
        perf.open_counter(EventSpec(0x7FFF_0000, 0, label="bogus"), backend=kernel)
    assert info.value.errno in (errno.ENOENT, errno.EINVAL)
    assert "open bogus (type 2147418112, config 0x0) for pid 0 cpu -1" in str(info.value)
    assert "event not supported by this PMU" in str(info.value)


def test_unknown_software_event_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown software event 'task-clocks'.*task-clock"):
        perf.open_software("task-clocks", backend=FakeBackend())


def test_read_after_close_is_ebadf(kernel: perf.CffiBackend) -> None:
    counter = perf.open_software("cpu-clock", backend=kernel)
    fd = counter.fd
    counter.close()
    counter.close()  # idempotent
    assert counter.closed and counter.fd == -1
    with pytest.raises(PerfError) as info:
        counter.read()
    assert info.value.errno == errno.EBADF
    assert "counter is closed" in str(info.value)
    with pytest.raises(OSError):
        os.fstat(fd)  # really closed in the kernel


def test_a_sysfs_pmu_opened_for_real(kernel: perf.CffiBackend) -> None:
    """Discovery -> encode -> perf_event_open on this machine's own sysfs."""
    pmus = perf.discover_pmus(SystemRoot())
    assert pmus["software"].type == perf.PERF_TYPE_SOFTWARE
    if "msr" not in pmus or "tsc" not in pmus["msr"].events:
        pytest.skip("no msr PMU with a tsc event here")
    spec = perf.event_spec(pmus["msr"], "tsc")
    with perf.open_counter(spec, backend=kernel) as counter:
        first = counter.read().value
        time.sleep(0.001)
        assert counter.read().value > first


# --------------------------------------------------------------------------- uncore hardware


def _real_imc_missing() -> str | None:
    devices = Path("/sys/bus/event_source/devices")
    names = sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []
    if not any(n.startswith("uncore_imc") for n in names):
        return "no uncore_imc PMUs in /sys/bus/event_source/devices (" + ", ".join(names) + ")"
    return None


@pytest.fixture
def real_imc() -> Iterator[perf.UncoreMemBw]:
    reason = _real_imc_missing()
    if reason is not None:
        pytest.skip(reason)
    sampler = perf.UncoreMemBw(SystemRoot())
    with sampler:
        yield sampler


@pytest.mark.uncore
def test_real_memory_bandwidth_per_socket(real_imc: perf.UncoreMemBw) -> None:
    buf = bytearray(64 << 20)
    time.sleep(0.05)
    for i in range(0, len(buf), 4096):
        buf[i] = 1  # touch 64 MiB: at least that much must reach DRAM
    samples = real_imc.sample()
    assert [s.socket for s in samples] == list(real_imc.plan.sockets)
    total_read = sum(s.read_bytes_per_s or 0 for s in samples)
    total_write = sum(s.write_bytes_per_s or 0 for s in samples)
    assert total_read + total_write > 0
