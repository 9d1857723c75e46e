"""CPU time per tick and resident memory of coda-node's daemon on a fixture GPU node.

    .venv/bin/python bench/bench_node_tick.py [--ticks 200] [--dir DIR] [--run-dir DIR] [--tick-s 1]

The node is tests/node/node_fixtures.py's: 64 CPUs, 8 GPUs (NVML double), 32 Slurm jobs (16 GPU
jobs, 16 CPU jobs) in a cgroup v1 tree, scontrol answered in-process. Root is needed for
the /dev/nvidia* character devices. ``--dir`` puts the fixture (and so the state file,
written and fsynced when the daemon changes a job) on another filesystem; the default is
the temp directory. ``--run-dir`` is NodeRuntimeDir, where the view is written every tick:
on a node ``/run/coda-node``, tmpfs; the default here is a new directory in /dev/shm
(tmpfs) where there is one, else in the fixture's directory.

Measured with time.process_time (this process's CPU time, user + system), per tick. The
daemons run on a simulated monotonic clock moved on by ``--tick-s`` before each tick (the
NodeIntervalS default, 1 s), so what they do every so many seconds comes as often per tick
as on a node, however fast the ticks run here:

1. ``Daemon.tick()`` with no limits;
2. ``Daemon.tick()`` with 8 GPU jobs held to 2 of their 3 CPUs (cpuset) and 8 CPU jobs
   capped at 0.5 cores (quota), in steady state: the first tick, which applies them, and
   the tick after it, which checks every changed job in full, are shown on their own; the
   steady ticks start one second later (a limits file younger than that is re-read every
   tick) and one check period after; and the median of each tick of the enforcer's check
   period (``VERIFY_EVERY_TICKS``) is shown: its periodic work is spread over the period,
   so no tick of it should stand out.

   After each tick of 1 and 2 the same fixed work is timed (``_Reference``: Python
   arithmetic of the ticks' median CPU time, calibrated on ``CALIBRATION_TICKS`` ticks
   before), so the tick's p99 can be read beside what the machine's own noise does to a
   job of the same size measured the same way;
3. the parts of a tick, timed by calling them directly as ``tick()`` does: sampling
   (cgroups, scontrol cache, NVML), limits file + plan, the adaptive loop's step (progress
   files, profiling, contention; the run fails if it would act), reconcile (cgroup reads
   and writes), the status view, and state saves (the enforcer saves the record of changes
   before a change, fsynced; ``tick()`` saves the view, without fsync, and the record only
   if it changed; each file is a JSON encoding, a write and a rename).

Then the per-job memory-bandwidth monitor (``NodeJobMemBw``, coda_node/sampling/mbm.py), side by
side: two more fixture nodes built alike, each with the fake resctrl mount of
tests/node/resctrl_fixtures.py (variant ``full``: MBM, two L3 domains) and every thread in its
default group, one daemon with ``NodeJobMemBw=no`` and one with ``yes`` (nothing injected,
so it makes its own JobMonitor: one MON group per CPU job). Their ticks alternate on a
simulated clock, ``--tick-s`` apart (the NodeIntervalS default, 1 s: the monitor re-reads
each CPU job's threads every 5 s, so on every 5th tick). Before each tick every CPU job's
``mbm_total_bytes`` and ``mbm_local_bytes`` advance by a known amount (job k: k GB/s);
after the run every CPU job must show exactly that rate. The monitor's ``sample`` and
``sync`` are timed inside the same ticks (the daemon's own calls, wrapped).

The fake's counter files are regular files on the temp directory's filesystem. On real
hardware each ``mon_L3_*`` counter read also makes the kernel read the counter MSR on a CPU
of that domain (an IPI when it is not the reading CPU); that cost is not in these numbers.

Then the resident memory of this process (which also holds the fixture, pynvml and psutil)
and, for comparison, of a fresh ``python -c "import coda_node.daemon.service"``.
Targets: < 5 ms CPU per tick, < 60 MB resident.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from coda_common.config.codaconf import load_config
from coda_node.daemon.service import Daemon, TickReport
from coda_node.enforce.enforcer import VERIFY_EVERY_TICKS
from coda_node.enforce.state import LIMITS_SETTLED_S, Limit
from coda_node.policy.targets import JobFacts, plan
from coda_node.sampling.mbm import mon_group_name
from coda_node.system.nvml import Nvml
from tests.node import resctrl_fixtures
from tests.node.node_fixtures import FakeNode, build_node, mknod_reason
from tests.node.test_daemon_loop_fixture import mount_resctrl

TARGET_TICK_MS = 5.0
TARGET_RSS_MB = 60.0
CALIBRATION_TICKS = 50
MB = 1024 * 1024


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _row(name: str, ms: list[float], target: str = "") -> str:
    line = f"{name:<36} {_pct(ms, 50):>7.3f} {_pct(ms, 99):>7.3f} {statistics.fmean(ms):>7.3f}"
    return f"{line}  {target}".rstrip()


def _verdict(ms: list[float]) -> str:
    p99 = _pct(ms, 99)
    return f"<{TARGET_TICK_MS:g} {'ok' if p99 < TARGET_TICK_MS else 'OVER'}"


class _Clock:
    """The daemons' monotonic clock, advanced by hand: one tick every ``step_s``."""

    def __init__(self, step_s: float) -> None:
        self.now_s = 1000.0
        self.step_s = step_s

    def __call__(self) -> float:
        return self.now_s


def _tick_times_ms(daemon: Daemon, ticks: int, clock: _Clock) -> list[float]:
    """CPU time of ``ticks`` ticks, ``clock`` moved on by its step before each."""
    out = []
    for _ in range(ticks):
        clock.now_s += clock.step_s
        t0 = time.process_time()
        daemon.tick()
        out.append((time.process_time() - t0) * 1e3)
    return out


class _Reference:
    """Fixed work of a tick's median CPU time, timed the same way between ticks.

    It does the same thing every time (Python arithmetic and small allocations, no system
    calls), so what its times spread by is the machine's: other processes' cache and
    memory traffic, interrupts charged to this process, the VM's CPU. A tick's p99 beside
    this one's says how much of it is the tick and how much is the machine."""

    def __init__(self, target_ms: float) -> None:
        self.rounds = 1
        per_round_ms = min(self._time_ms(200) for _ in range(5)) / 200
        self.rounds = max(1, round(target_ms / max(per_round_ms, 1e-6)))

    @staticmethod
    def _work(rounds: int) -> int:
        acc = 0
        for k in range(rounds):
            row = [k * j for j in range(40)]
            acc ^= sum(row) & 0xFFFF
        return acc

    def _time_ms(self, rounds: int) -> float:
        t0 = time.process_time()
        self._work(rounds)
        return (time.process_time() - t0) * 1e3

    def __call__(self) -> float:
        return self._time_ms(self.rounds)


def _steady_ms(daemon: Daemon, ticks: int, clock: _Clock) -> tuple[list[float], list[float]]:
    """``ticks`` ticks, each followed by the reference work of the ticks' median (calibrated
    on ``CALIBRATION_TICKS`` ticks before them, not counted): the tick's times and the
    reference's."""
    ref = _Reference(statistics.median(_tick_times_ms(daemon, CALIBRATION_TICKS, clock)))
    tick_ms, ref_ms = [], []
    for _ in range(ticks):
        tick_ms += _tick_times_ms(daemon, 1, clock)
        ref_ms.append(ref())
    return tick_ms, ref_ms


class _TimedSave:
    """Wraps the enforcer's save callback to count its calls and CPU time."""

    def __init__(self, save: Callable[[], None]) -> None:
        self.inner = save
        self.calls = 0
        self.cpu_s = 0.0

    def __call__(self) -> None:
        t0 = time.process_time()
        self.inner()
        self.cpu_s += time.process_time() - t0
        self.calls += 1


def _breakdown_ms(daemon: Daemon, ticks: int, clock: _Clock) -> tuple[dict[str, list[float]], int]:
    """Daemon.tick()'s steps, each timed, in its order; and the state saves per tick."""
    names = (
        "sample",
        "limits file + plan",
        "adaptive loop",
        "reconcile (without saves)",
        "status view",
    )
    parts: dict[str, list[float]] = {name: [] for name in names}
    parts["state saves"] = []
    timed = _TimedSave(daemon.enforcer._save)
    daemon.enforcer._save = timed
    try:
        for _ in range(ticks):
            timed.cpu_s, timed.calls = 0.0, 0
            clock.now_s += clock.step_s
            t0 = time.process_time()
            snap = daemon.sampler.sample()
            t1 = time.process_time()
            limits = daemon.limits_file.load()
            facts = {
                job_id: JobFacts(
                    job_id=job_id,
                    allocated_cpus=daemon._allocated(job_id, view.cgroup),
                    is_dnn=view.kind == "dnn",
                )
                for job_id, view in snap.jobs.items()
                if view.cgroup is not None
            }
            targets, problems = plan(facts, limits, mba=daemon.mba_unavailable)
            t2 = time.process_time()
            loop = daemon.loop.step(
                snap,
                lambda j, facts=facts: facts[j].allocated_cpus if j in facts else None,
                blocked={j: "an admin limit is set" for j in limits},
            )
            if loop.cores or loop.throttles:
                raise AssertionError("the adaptive loop acted: the breakdown does not apply it")
            t2b = time.process_time()
            cg_jobs = {j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None}
            results = daemon.enforcer.reconcile(cg_jobs, targets)
            t3 = time.process_time()
            saves_in_reconcile_s = timed.cpu_s
            report = TickReport(snapshot=snap, targets=targets, results=results)
            daemon.state.view = daemon._view(report, limits)
            t4 = time.process_time()
            # tick()'s own save, after the view: the view, and the record if it changed.
            daemon.state_file.save(daemon.state, durable=False)
            tick_save_s = time.process_time() - t4
            if problems:
                raise AssertionError(f"the plan refused a limit: {problems}")
            parts["sample"].append((t1 - t0) * 1e3)
            parts["limits file + plan"].append((t2 - t1) * 1e3)
            parts["adaptive loop"].append((t2b - t2) * 1e3)
            parts["reconcile (without saves)"].append((t3 - t2b - saves_in_reconcile_s) * 1e3)
            parts["status view"].append((t4 - t3) * 1e3)
            parts["state saves"].append((timed.cpu_s + tick_save_s) * 1e3)
    finally:
        daemon.enforcer._save = timed.inner
    return parts, timed.calls + 1


def _fresh_import_rss_mb() -> float:
    """Resident memory of a new interpreter that has imported coda_node.daemon.service."""
    code = "import sys, coda_node.daemon.service; print('ready', flush=True); sys.stdin.read()"
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=repo,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return psutil.Process(proc.pid).memory_info().rss / MB
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def _filesystem_of(path: Path) -> str:
    best = ("?", "?", "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, point, fs_type = line.split()[:3]
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best[2]):
            best = (fs_type, dev, point)
    return f"{best[0]} ({best[1]} on {best[2]})"


def _tmpfs() -> str | None:
    """/dev/shm where it is a tmpfs (NodeRuntimeDir's /run is one on a systemd node)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fs_type = line.split()[:3]
        if point == "/dev/shm" and fs_type == "tmpfs":
            return point
    return None


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _limits(node: FakeNode) -> dict[int, Limit]:
    dnn = [j for j, job in sorted(node.jobs.items()) if job.kind == "dnn"][:8]
    cpu = [j for j, job in sorted(node.jobs.items()) if job.kind == "cpu"][:8]
    limits = {j: Limit(cores=2, reason="bench") for j in dnn}
    limits.update({j: Limit(quota_cores=0.5, reason="bench") for j in cpu})
    return limits


# -- the per-job memory-bandwidth monitor, on and off side by side ---------------------------

GB = 10**9
MBM_DOMAIN0_SHARE = 0.75
"""Of a CPU job's traffic, the part counted in L3 domain 0 (socket 0); the rest in 1."""
MBM_LOCAL_SHARE = 0.9
"""Of each domain's count, the part that went to that socket's own memory."""


def _mbm_daemon(
    tmp: Path, clock: _Clock, run_dir: Path, *, monitor: bool
) -> tuple[FakeNode, resctrl_fixtures.FakeResctrl, Daemon]:
    """The bench's fixture node with resctrl mounted and a daemon built as test_mbm.py's
    ``_sim`` builds it: the fake kernel as ``rdt_control``, no ``mbm`` injected."""
    node = build_node(tmp, version=1, cpus=64, gpus=8, jobs=32)
    fake = mount_resctrl(node, tasks_in_root=True)
    conf = node.coda_conf.read_text()
    if "NodeIntervalS=5\n" not in conf:
        raise AssertionError("the fixture's coda.conf changed: no NodeIntervalS=5")
    conf = conf.replace("NodeIntervalS=5\n", f"NodeIntervalS={clock.step_s:g}\n")
    node.coda_conf.write_text(conf + f"NodeJobMemBw={'yes' if monitor else 'no'}\n")
    daemon = Daemon(
        dataclasses.replace(load_config(node.coda_conf), node_runtime_dir=run_dir),
        runner=node.slurm,
        nvml=Nvml(lib=node.nvml_lib),
        cpuset_writer=node.cpuset_writer,
        quota_writer=node.quota_writer,
        rdt_control=lambda _root, info: fake.control(info),
        clock=clock,
    )
    daemon.start()
    if monitor != (daemon.mem_bw_monitor is not None):
        raise AssertionError(f"monitor wanted {monitor}, got {daemon.mem_bw_monitor_off}")
    return node, fake, daemon


def _cpu_job_bytes_per_s(node: FakeNode) -> dict[int, int]:
    """What each CPU job draws: the k-th CPU job k GB/s."""
    cpu = sorted(j for j, job in node.jobs.items() if job.kind == "cpu")
    return {job_id: (k + 1) * GB for k, job_id in enumerate(cpu)}


def _charge(fake: resctrl_fixtures.FakeResctrl, draws: dict[int, int], step_s: float) -> None:
    """The kernel counts one tick of each CPU job's traffic in its MON group (a job with
    no group yet is counted in its control group, which nobody reads)."""
    for job_id, bytes_per_s in draws.items():
        rel = f"mon_groups/{mon_group_name(job_id)}"
        if not (fake.path / rel).is_dir():
            continue
        nbytes = round(bytes_per_s * step_s)
        for domain, share in ((0, MBM_DOMAIN0_SHARE), (1, 1 - MBM_DOMAIN0_SHARE)):
            d = fake.path / rel / "mon_data" / f"mon_L3_{domain:02d}"
            part = round(nbytes * share)
            for event, more in (
                ("mbm_total_bytes", part),
                ("mbm_local_bytes", round(part * MBM_LOCAL_SHARE)),
            ):
                now = int((d / event).read_text())
                fake.set_counter(rel, domain, event, now + more)


class _MonitorTimer:
    """Wraps a running daemon's JobMonitor.sample and .sync (the daemon's own calls, with
    its own arguments) to record each call's CPU time, and inside sync the time spent in
    its ``tids`` callback (reading a job's threads from its cgroup) and how many jobs it
    asked."""

    def __init__(self, daemon: Daemon) -> None:
        monitor = daemon.mem_bw_monitor
        assert monitor is not None
        self.sample_ms: list[float] = []
        self.sync_ms: list[float] = []
        self.tids_ms: list[float] = []
        self.tids_jobs: list[int] = []
        self.recording = False
        inner_sample, inner_sync = monitor.sample, monitor.sync

        def sample(now_s: float) -> None:
            t0 = time.process_time()
            inner_sample(now_s)
            if self.recording:
                self.sample_ms.append((time.process_time() - t0) * 1e3)

        def sync(
            now_s: float,
            jobs: Iterable[int],
            ctrl_group_of: Callable[[int], str],
            tids: Callable[[int], Iterable[int] | None],
        ) -> None:
            spent = [0.0, 0]

            def timed_tids(job_id: int) -> Iterable[int] | None:
                t = time.process_time()
                out = tids(job_id)
                spent[0] += time.process_time() - t
                spent[1] += 1
                return out

            t0 = time.process_time()
            inner_sync(now_s, jobs, ctrl_group_of, timed_tids)
            if self.recording:
                self.sync_ms.append((time.process_time() - t0) * 1e3)
                self.tids_ms.append(spent[0] * 1e3)
                self.tids_jobs.append(int(spent[1]))

        monitor.sample = sample  # type: ignore[method-assign]
        monitor.sync = sync  # type: ignore[method-assign]


@dataclasses.dataclass(frozen=True)
class MbmRun:
    """What the side-by-side run of the monitor measured."""

    tick_s: float
    off_ms: list[float]
    on_ms: list[float]
    first_off_ms: float
    first_on_ms: float
    sample_ms: list[float]
    sync_ms: list[float]
    tids_ms: list[float]
    tids_jobs: list[int]
    groups: int
    domains: int
    files_per_domain: int
    first_writes: int
    steady_writes: int
    rates: dict[int, tuple[int, float | None, Any]]
    """CPU job -> (bytes/s its counters advanced by, monitor.rate, the status view's value)."""
    threads_in_groups: dict[int, bool]
    """CPU job -> its MON group's tasks file lists exactly the job's threads."""
    cgroup_writes: tuple[int, int]
    """cgroup writes in the measured ticks, off node and on node."""
    events: tuple[int, int]
    """Events (throttles, probes, ...) the two daemons logged in the measured ticks."""


def _mbm_side_by_side(tmp: Path, ticks: int, tick_s: float, run_dir: Path) -> MbmRun:
    clock = _Clock(tick_s)
    off_node, off_fake, off = _mbm_daemon(tmp / "mbm-off", clock, run_dir / "off", monitor=False)
    on_node, on_fake, on = _mbm_daemon(tmp / "mbm-on", clock, run_dir / "on", monitor=True)
    draws = _cpu_job_bytes_per_s(on_node)
    if draws != _cpu_job_bytes_per_s(off_node):
        raise AssertionError("the two fixture nodes differ")
    timer = _MonitorTimer(on)

    def tick(daemon: Daemon) -> float:
        t0 = time.process_time()
        daemon.tick()
        return (time.process_time() - t0) * 1e3

    # First ticks: scontrol for every job, NVML init; the 'on' daemon makes the MON groups,
    # moves the threads in and takes the first reading. Then one more for a first rate.
    first_off, first_on = tick(off), tick(on)
    first_writes = len(on_fake.writes)
    for _ in range(max(2, round(10 / tick_s) + 1)):  # warm-up: two thread re-reads
        clock.now_s += tick_s
        for fake in (off_fake, on_fake):
            _charge(fake, draws, tick_s)
        tick(off), tick(on)

    writes_before = len(on_fake.writes)
    journal_before = (len(off_node.journal), len(on_node.journal))
    events_before = (sum(off.events_total.values()), sum(on.events_total.values()))
    off_ms: list[float] = []
    on_ms: list[float] = []
    timer.recording = True
    for i in range(ticks):
        clock.now_s += tick_s
        for fake in (off_fake, on_fake):
            _charge(fake, draws, tick_s)
        # Alternate which goes first, so neither always runs on the other's warm cache.
        if i % 2:
            on_ms.append(tick(on))
            off_ms.append(tick(off))
        else:
            off_ms.append(tick(off))
            on_ms.append(tick(on))
    timer.recording = False

    monitor = on.mem_bw_monitor
    assert monitor is not None and monitor.info.mon is not None
    view = {j["job_id"]: j.get("mem_bw_bytes_per_s") for j in on.state.view["jobs"]}
    rates = {j: (bw, monitor.rate(j), view.get(j)) for j, bw in draws.items()}
    threads = {}
    for job_id in draws:
        listed = on_fake.text(f"mon_groups/{mon_group_name(job_id)}/tasks").split()
        want = {t for ts in on_node.jobs[job_id].v1_threads.values() for t in ts}
        threads[job_id] = {int(t) for t in listed} == want
    return MbmRun(
        tick_s=tick_s,
        off_ms=off_ms,
        on_ms=on_ms,
        first_off_ms=first_off,
        first_on_ms=first_on,
        sample_ms=timer.sample_ms,
        sync_ms=timer.sync_ms,
        tids_ms=timer.tids_ms,
        tids_jobs=timer.tids_jobs,
        groups=len(monitor.monitored()),
        domains=len(monitor.info.mon.domain_ids),
        files_per_domain=1,  # JobMonitor reads one event (mbm_total_bytes) per domain
        first_writes=first_writes,
        steady_writes=len(on_fake.writes) - writes_before,
        rates=rates,
        threads_in_groups=threads,
        cgroup_writes=(
            len(off_node.journal) - journal_before[0],
            len(on_node.journal) - journal_before[1],
        ),
        events=(
            sum(off.events_total.values()) - events_before[0],
            sum(on.events_total.values()) - events_before[1],
        ),
    )


def _print_mbm(run: MbmRun) -> bool:
    """The side-by-side table; False when the monitor did not measure what it should."""
    n = len(run.on_ms)
    if not n == len(run.sample_ms) == len(run.sync_ms):
        raise AssertionError("the monitor was not sampled and synced once per tick")
    reread = [i for i, jobs in enumerate(run.tids_jobs) if jobs]
    quiet = [i for i, jobs in enumerate(run.tids_jobs) if not jobs]
    print()
    print(
        f"per-job memory-bandwidth monitor (NodeJobMemBw), fake resctrl 'full' (MBM, "
        f"{run.domains} L3 domains); simulated clock, {run.tick_s:g} s per tick"
    )
    print(
        "two more fixture nodes built alike, each daemon on its own; ticks alternate; the "
        "monitor is the only difference"
    )
    print(f"CPU time per tick, ms ({n} ticks each)")
    print(f"{'':<36} {'p50':>7} {'p99':>7} {'mean':>7}  target")
    print(_row("monitor off (NodeJobMemBw=no)", run.off_ms, _verdict(run.off_ms)))
    print(_row(f"monitor on ({run.groups} MON groups)", run.on_ms, _verdict(run.on_ms)))
    if reread and quiet:
        print(
            _row(f"  on, ticks re-reading threads ({len(reread)})", [run.on_ms[i] for i in reread])
        )
        print(_row(f"  on, other ticks ({len(quiet)})", [run.on_ms[i] for i in quiet]))
    diff = [a - b for a, b in zip(run.on_ms, run.off_ms, strict=True)]
    print(_row("on minus off, tick by tick", diff))
    print(
        f"first tick: off {run.first_off_ms:.1f} ms, on {run.first_on_ms:.1f} ms ({run.groups} "
        f"MON groups made, {run.first_writes} resctrl writes, each re-rendered by the fake kernel)"
    )
    print()
    reads = run.groups * run.domains * run.files_per_domain
    print(f"the monitor's calls inside the 'on' ticks, ms ({n} ticks)")
    print(f"{'part':<36} {'p50':>7} {'p99':>7} {'mean':>7}")
    print(_row(f"sample ({reads} counter files)", run.sample_ms))
    print(_row("sync, every tick", run.sync_ms))
    if reread:
        jobs = statistics.mean(run.tids_jobs[i] for i in reread)
        print(
            _row(
                f"sync, ticks re-reading threads ({len(reread)})", [run.sync_ms[i] for i in reread]
            )
        )
        print(_row(f"  of which {jobs:.1f} jobs' threads read", [run.tids_ms[i] for i in reread]))
    if quiet:
        print(_row(f"sync, other ticks ({len(quiet)})", [run.sync_ms[i] for i in quiet]))
    both = [a + b for a, b in zip(run.sample_ms, run.sync_ms, strict=True)]
    print(_row("sample + sync", both))
    print(
        f"in the {n} measured ticks: resctrl writes {run.steady_writes}; cgroup writes off/on "
        f"{run.cgroup_writes[0]}/{run.cgroup_writes[1]}; daemon events off/on "
        f"{run.events[0]}/{run.events[1]}"
    )
    if run.cgroup_writes != (0, 0) or run.events != (0, 0):
        # With per-job bandwidth the contention loop may act where it could not before
        # (e.g. cap CPU jobs to measure a DNN job's baseline, once past its warm-up).
        print(
            "note: a daemon's policy acted in the measured ticks, so 'on minus off' includes "
            "that work as well as the monitor's own (sample + sync)"
        )
    ok = True
    measured = 0
    for job_id, (want, rate, shown) in sorted(run.rates.items()):
        if rate is not None and abs(rate - want) <= 1e-9 * want and shown == rate:
            measured += 1
            continue
        ok = False
        print(f"  job {job_id}: counters advanced {want / GB:g} GB/s, monitor {rate}, view {shown}")
    threads_ok = sum(run.threads_in_groups.values())
    ok = ok and threads_ok == len(run.threads_in_groups)
    lo, hi = min(r[0] for r in run.rates.values()), max(r[0] for r in run.rates.values())
    print(
        f"measured: {measured}/{len(run.rates)} CPU jobs show the rate their counters advanced "
        f"by ({lo / GB:g}-{hi / GB:g} GB/s) in monitor.rate and the status view; "
        f"{threads_ok}/{len(run.threads_in_groups)} MON groups hold exactly their job's threads"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ticks", type=int, default=200, help="ticks per measurement")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the node")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="NodeRuntimeDir's parent, where the view is written every tick (default: "
        "/dev/shm, a tmpfs as /run is on a node)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=1.0,
        help="simulated seconds per tick (NodeIntervalS; default 1)",
    )
    args = parser.parse_args()
    reason = mknod_reason()
    if reason is not None:
        print(f"bench_node_tick: cannot build the fixture node ({reason})", file=sys.stderr)
        return 2

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(
            tempfile.TemporaryDirectory(dir=args.dir, prefix="coda-node-bench-")
        )
        run_dir = Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(dir=args.run_dir or _tmpfs() or tmp, prefix="run-")
            )
        )
        node = build_node(Path(tmp), version=1, cpus=64, gpus=8, jobs=32)
        clock = _Clock(args.tick_s)
        daemon = node.daemon(
            dataclasses.replace(node.cfg, node_runtime_dir=run_dir / "node"), clock=clock
        )
        daemon.tick()  # first tick: every job's scontrol, NVML init

        idle, idle_ref = _steady_ms(daemon, args.ticks, clock)
        idle_parts, idle_saves = _breakdown_ms(daemon, args.ticks, clock)

        node.set_limits(_limits(node))
        clock.now_s += clock.step_s
        t0 = time.process_time()
        first = daemon.tick()
        first_ms = (time.process_time() - t0) * 1e3
        applied = sum(1 for r in first.results.values() if r.applied)
        writes_first = len(node.journal)
        clock.now_s += clock.step_s
        t0 = time.process_time()
        daemon.tick()  # checks every job it changed in full, once
        after_ms = (time.process_time() - t0) * 1e3
        # Steady state: the limits file a second old (a younger one is re-read every tick),
        # and one whole check period gone by.
        time.sleep(LIMITS_SETTLED_S)
        _tick_times_ms(daemon, VERIFY_EVERY_TICKS, clock)
        limited, limited_ref = _steady_ms(daemon, args.ticks, clock)
        writes_steady = len(node.journal) - writes_first
        lim_parts, lim_saves = _breakdown_ms(daemon, args.ticks, clock)

        gc.collect()
        rss_mb = psutil.Process().memory_info().rss / MB
        scontrol = sum(node.slurm.scontrol_counts().values())
        jobs = len(node.jobs)
        where = _filesystem_of(Path(tmp))
        state_kib = node.state_file.stat().st_size / 1024
        view_where = _filesystem_of(daemon.state_file.view_path)
        view_kib = daemon.state_file.view_path.stat().st_size / 1024

        mbm = _mbm_side_by_side(Path(tmp), args.ticks, args.tick_s, run_dir)
        gc.collect()
        rss_mbm_mb = psutil.Process().memory_info().rss / MB

    fresh_mb = _fresh_import_rss_mb()

    print("coda-node tick: 64 CPUs, 8 GPUs, 32 jobs (16 GPU, 16 CPU), cgroup v1")
    print(f"command: {shlex.join(sys.orig_argv)}")
    print(f"python {sys.version.split()[0]} on {_cpu_model()}, {os.cpu_count()} CPUs")
    print(f"fixture and state file on {where}; state file {state_kib:.0f} KiB")
    print(f"view file (NodeRuntimeDir) on {view_where}; view file {view_kib:.0f} KiB")
    print()
    print(f"CPU time per tick, ms ({args.ticks} ticks each)")
    print(f"{'':<36} {'p50':>7} {'p99':>7} {'mean':>7}  target")
    print(_row("no limits", idle, _verdict(idle)))
    print(_row("  reference work of its median", idle_ref))
    print(_row("8 cpuset + 8 quota limits, steady", limited, _verdict(limited)))
    print(_row("  reference work of its median", limited_ref))
    print(
        f"{'first tick applying the 16 limits':<36} {first_ms:>7.3f}  (one tick: "
        f"{applied} jobs changed, {writes_first} cgroup writes)"
    )
    print(f"{'the tick after it':<36} {after_ms:>7.3f}  (checks the 16 changed jobs in full)")
    print(
        "p99/p50, the machine's noise on fixed work against the tick's: "
        f"no limits {_pct(idle_ref, 99) / _pct(idle_ref, 50):.2f} vs "
        f"{_pct(idle, 99) / _pct(idle, 50):.2f}, limited "
        f"{_pct(limited_ref, 99) / _pct(limited_ref, 50):.2f} vs "
        f"{_pct(limited, 99) / _pct(limited, 50):.2f}"
    )
    print(f"cgroup writes in the {args.ticks} steady ticks: {writes_steady}")
    if args.ticks >= VERIFY_EVERY_TICKS:
        # The periodic work (full checks, fresh reads) is spread over the period: a tick
        # that did all of it would stand out here whatever the machine's load.
        by_tick = [
            statistics.median(limited[k::VERIFY_EVERY_TICKS]) for k in range(VERIFY_EVERY_TICKS)
        ]
        print(
            f"limited, median ms by tick of the {VERIFY_EVERY_TICKS}-tick check period: "
            + " ".join(f"{ms:.2f}" for ms in by_tick)
        )
    all_ticks = 4 * args.ticks + 3 + 2 * CALIBRATION_TICKS + VERIFY_EVERY_TICKS
    print(f"scontrol calls in all {all_ticks} ticks: {scontrol} for {jobs} jobs")
    for title, parts, saves in (
        ("no limits", idle_parts, idle_saves),
        ("8 cpuset + 8 quota limits, steady", lim_parts, lim_saves),
    ):
        print()
        print(f"where a tick's CPU time goes, ms ({title}; {saves} state saves per tick)")
        print(f"{'part':<36} {'p50':>7} {'p99':>7} {'mean':>7}")
        for name, ms in parts.items():
            print(_row(name, ms))
        total = [sum(v) for v in zip(*parts.values(), strict=True)]
        print(_row("sum of parts", total))
    measured = _print_mbm(mbm)
    print()
    print("resident memory, MB")
    verdict = "ok" if rss_mb < TARGET_RSS_MB else "OVER"
    print(f"{'this process after the ticks':<44} {rss_mb:>7.1f}  <{TARGET_RSS_MB:g} {verdict}")
    verdict = "ok" if rss_mbm_mb < TARGET_RSS_MB else "OVER"
    after = "... after the monitor comparison (3 nodes)"
    print(f"{after:<44} {rss_mbm_mb:>7.1f}  <{TARGET_RSS_MB:g} {verdict}")
    fresh = "fresh python -c 'import coda_node.daemon.service'"
    print(f"{fresh:<44} {fresh_mb:>7.1f}")
    if not measured:
        print("bench_node_tick: the monitor did not measure every CPU job", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
