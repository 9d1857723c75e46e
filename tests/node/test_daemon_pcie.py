"""Per-socket PCIe traffic (uncore IIO counters) from the daemon's tick to ``coda-node status``.

The daemon runs on the fixture node (tests/node/node_fixtures.py); the IIO PMUs are those of the
2-socket Skylake-SP tree of tests/node/perf_fixtures.py (6 IIO stacks x 4 ports, bw_in/bw_out at
4 bytes per count), and the counters behind them are tests/node/test_perf.py's FakeBackend, whose
values the test advances. What is asserted is what an admin sees: the ``--json`` document
(against docs/status.schema.json) and the screen's ``PCIe:`` line.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from coda_node.cli import cli
from coda_node.daemon.service import Daemon
from coda_node.status.metrics import StatusCollector
from coda_node.system import perf
from coda_node.system.perf import CounterReading, EventSpec, PerfError, PlannedCounter
from tests.node.node_fixtures import FakeNode, build_node
from tests.node.perf_fixtures import make_skx_tree
from tests.node.test_perf import Clock, FakeBackend

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/status.schema.json").read_text())
PORTS_PER_SOCKET = 6 * 4  # IIO stacks x ports: the counters summed into one socket's rate


class FlakyBackend(FakeBackend):
    """A FakeBackend whose counters on ``offline_cpus`` fail read(2) with ENODEV, as the
    kernel's do while the CPU an uncore counter was opened on is offline."""

    def __init__(self) -> None:
        super().__init__()
        self.offline_cpus: set[int] = set()
        self._cpu_of: dict[int, int] = {}

    def open(self, spec: EventSpec, *, pid: int, cpu: int, **kw: Any) -> int:
        fd = super().open(spec, pid=pid, cpu=cpu, **kw)
        self._cpu_of[fd] = cpu
        return fd

    def read(self, fd: int, *, what: str) -> CounterReading:
        if self._cpu_of.get(fd) in self.offline_cpus:
            raise PerfError(errno.ENODEV, what)
        return super().read(fd, what=what)


def _status(node: FakeNode, *args: str) -> str:
    result = CliRunner().invoke(
        cli, ["status", "--conf", str(node.coda_conf), *args], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def _advance(
    backend: FakeBackend,
    counters: dict[int, PlannedCounter],
    counts: dict[tuple[int, str], int],
    at_s: float,
) -> None:
    """Add ``counts[(socket, direction)]`` to every port counter of that socket."""
    backend.advance({fd: counts[(c.socket, c.direction)] for fd, c in counters.items()}, at_s)


def _tick_at(daemon: Daemon, iio: Any, counts: dict[tuple[int, str], int], at_s: float) -> Any:
    """One tick at ``at_s`` after the counters advanced by ``counts``; its report."""
    _, backend, clock, counters = iio
    clock.now_s = at_s
    _advance(backend, counters, counts, at_s)
    return daemon.tick()


def _rates(counts: dict[tuple[int, str], int], interval_s: float) -> list[dict[str, Any]]:
    """The view's pcie_bw (less monotonic_s) for ``counts`` per port counter in ``interval_s``."""
    bytes_per_count = 3.814697266e-6 * 2**20  # the events' .scale in MiB: 4 bytes
    return [
        {
            "socket": socket,
            "in_bytes_per_s": pytest.approx(
                PORTS_PER_SOCKET * counts[(socket, "in")] * bytes_per_count / interval_s
            ),
            "out_bytes_per_s": pytest.approx(
                PORTS_PER_SOCKET * counts[(socket, "out")] * bytes_per_count / interval_s
            ),
        }
        for socket in (0, 1)
    ]


def _view_rates(daemon: Daemon) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in s.items() if k != "monotonic_s"}
        for s in daemon.state.view["node"]["pcie_bw"]
    ]


@pytest.fixture
def iio(tmp_path: Path) -> Iterator[tuple[perf.UncorePcieBw, FlakyBackend, Clock, dict]]:
    """A real UncorePcieBw over the SKX IIO PMUs, opened on a FlakyBackend at t=0."""
    backend, clock = FlakyBackend(), Clock()
    sampler = perf.UncorePcieBw(make_skx_tree(tmp_path / "skx"), backend=backend, clock=clock)
    sampler.open()
    counters = dict(zip(backend.live, sampler.plan.counters, strict=True))
    yield sampler, backend, clock, counters
    sampler.close()


# 250e6 counts x 4 B x 24 ports / 2 s = 12 GB/s into socket 0.
BUSY = {(0, "in"): 250_000_000, (0, "out"): 62_500_000, (1, "in"): 10_000_000, (1, "out"): 0}
FIRST = {(0, "in"): 1_000, (0, "out"): 2_000, (1, "in"): 3_000, (1, "out"): 4_000}


def test_status_shows_each_sockets_pcie_traffic(tmp_path: Path, iio: Any) -> None:
    sampler = iio[0]
    node = build_node(tmp_path / "node", jobs=4)
    daemon = node.daemon(pcie_bw=sampler.sample)

    _tick_at(daemon, iio, FIRST, 2.0)
    report = _tick_at(daemon, iio, BUSY, 4.0)

    # The second tick's rates, over its own 2 s: not the totals since the counters opened.
    assert _view_rates(daemon) == _rates(BUSY, 2.0)
    assert [s["monotonic_s"] for s in daemon.state.view["node"]["pcie_bw"]] == [4.0, 4.0]
    assert report.snapshot.errors == ()

    doc = json.loads(_status(node, "--json"))
    jsonschema.validate(doc, SCHEMA)
    assert doc["missing"] == []
    assert doc["node"]["pcie_bw"] == [
        {
            "socket": 0,
            "in_bytes_per_s": pytest.approx(12e9, rel=1e-9),
            "out_bytes_per_s": pytest.approx(3e9, rel=1e-9),
            "bytes_per_s": pytest.approx(15e9, rel=1e-9),
        },
        {
            "socket": 1,
            "in_bytes_per_s": pytest.approx(480e6, rel=1e-9),
            "out_bytes_per_s": 0.0,
            "bytes_per_s": pytest.approx(480e6, rel=1e-9),
        },
    ]
    lines = _status(node).splitlines()
    assert "PCIe: socket 0 in 12GB/s out 3GB/s, socket 1 in 480MB/s out 0B/s" in lines
    # with the node's lines, above the GPU table and the jobs
    pcie_at = lines.index("PCIe: socket 0 in 12GB/s out 3GB/s, socket 1 in 480MB/s out 0B/s")
    assert pcie_at < min(i for i, line in enumerate(lines) if line.startswith(("GPU", "JOBID")))

    # The Prometheus exporter reports the same numbers, one series per socket and direction.
    scraped = {
        (s.labels["socket"], s.labels["direction"]): s.value
        for family in StatusCollector(daemon.metrics_view, 1.0).collect()
        if family.name == "coda_node_pcie_bandwidth_bytes_per_second"
        for s in family.samples
    }
    assert scraped == {
        ("0", "in"): pytest.approx(12e9, rel=1e-9),
        ("0", "out"): pytest.approx(3e9, rel=1e-9),
        ("1", "in"): pytest.approx(480e6, rel=1e-9),
        ("1", "out"): 0.0,
    }


@pytest.mark.parametrize("pmus", ["none", "iio-without-bandwidth-events"])
def test_no_iio_bandwidth_events_no_pcie_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pmus: str
) -> None:
    node = build_node(tmp_path, jobs=4)
    if pmus != "none":
        # Programmable uncore_iio_<N> only: PCIe data there needs raw event codes.
        make_skx_tree(node.root, iio_free_running=False, imc_programmable=False)
        (node.root / "sys/devices/system/cpu/online").write_text("0-63\n")
    backend = FakeBackend()
    monkeypatch.setattr(perf, "default_backend", lambda: backend)
    daemon = node.daemon()
    daemon.tick()
    report = daemon.tick()

    assert backend.opened == []  # nothing to open, and nothing tried
    assert daemon.state.view["node"]["pcie_bw"] == [] and report.snapshot.errors == ()
    assert len(daemon.state.view["jobs"]) == 4
    doc = json.loads(_status(node, "--json"))
    jsonschema.validate(doc, SCHEMA)
    assert doc["node"]["pcie_bw"] == [] and doc["missing"] == []
    caps = {c["name"]: c for c in doc["node"]["capabilities"]}
    assert not caps["uncore PCIe bandwidth"]["available"]
    want = "no uncore_iio PMUs" if pmus == "none" else "raw IIO event codes"
    assert want in caps["uncore PCIe bandwidth"]["detail"]
    text = _status(node)
    assert "PCIe:" not in text
    assert "uncore PCIe bandwidth" in text  # the capability line says why not


def test_a_failed_read_skips_pcie_for_that_tick_only(
    tmp_path: Path, iio: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sampler, backend = iio[0], iio[1]
    node = build_node(tmp_path / "node", jobs=4)
    daemon = node.daemon(pcie_bw=sampler.sample)
    _tick_at(daemon, iio, FIRST, 2.0)

    backend.offline_cpus = {28}  # socket 1's uncore CPU
    caplog.set_level(logging.INFO, logger="coda-node")
    for t_s in (4.0, 6.0):
        report = _tick_at(daemon, iio, BUSY, t_s)  # returns: the tick is not lost
        view = daemon.state.view
        assert view["node"]["pcie_bw"] == []
        assert sorted(j["job_id"] for j in view["jobs"]) == sorted(node.jobs)
        assert len(view["node"]["gpus"]) == 8
        assert report.snapshot.errors == (
            "cannot read the uncore PCIe bandwidth counters: read "
            "uncore_iio_free_running_0/bw_in_port0/ counter (cpu 28) (no such device; ENODEV)",
        )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "PCIe" in r.message]
    assert len(warnings) == 1  # once, not every tick it keeps failing
    assert daemon.ticks_total == 3 and daemon.tick_errors_total == 0
    text = _status(node)
    assert "PCIe:" not in text and "! cannot read the uncore PCIe bandwidth counters" in text

    backend.offline_cpus = set()
    report = _tick_at(daemon, iio, BUSY, 8.0)
    assert report.snapshot.errors == ()
    # Over the 6 s since the last reading that worked: three intervals of BUSY counts.
    three = {k: 3 * v for k, v in BUSY.items()}
    assert _view_rates(daemon) == _rates(three, 6.0)
    assert "PCIe: socket 0 in 12GB/s out 3GB/s" in _status(node)
    assert any("counters read again" in r.message for r in caplog.records)


def test_counters_the_daemon_opened_are_closed_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = build_node(tmp_path, jobs=4)
    # The node's own PMUs: IIO (free-running bandwidth) and IMC, as on a Skylake-SP server.
    make_skx_tree(node.root)
    (node.root / "sys/devices/system/cpu/online").write_text("0-63\n")
    backend = FakeBackend()
    monkeypatch.setattr(perf, "default_backend", lambda: backend)
    daemon = node.daemon()
    # 96 IIO port counters and 24 IMC CAS counters, system-wide on CPUs 0 and 28
    assert len(backend.opened) == 96 + 24
    assert {(pid, cpu) for _, pid, cpu in backend.opened} == {(-1, 0), (-1, 28)}
    daemon.tick()
    backend.advance(dict.fromkeys(backend.live, 1_000_000), 1.0)
    daemon.tick()
    pcie = daemon.state.view["node"]["pcie_bw"]
    assert [s["socket"] for s in pcie] == [0, 1]
    assert all(s["in_bytes_per_s"] > 0 and s["out_bytes_per_s"] > 0 for s in pcie)
    assert [m["socket"] for m in daemon.state.view["node"]["mem_bw"]] == [0, 1]

    stop = threading.Event()
    stop.set()
    daemon.run(stop)  # restores, then closes the counters
    assert backend.live == {} and len(backend.closed) == 96 + 24
    on_disk = node.view()
    assert on_disk["daemon"]["running"] is False
    assert [s["socket"] for s in on_disk["node"]["pcie_bw"]] == [0, 1]  # read before closing
