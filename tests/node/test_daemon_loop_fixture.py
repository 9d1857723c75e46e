"""The daemon's closed loop on a fixture node: sample, decide, enforce, and the jobs react.

Each test drives :meth:`coda_node.daemon.service.Daemon.tick` with a fake monotonic clock advanced
1 s per tick (no sleeping). Between ticks the modelled jobs react to what the daemon
enforced, read back from the fixture files the daemon wrote: a CPU job's memory bandwidth
follows the MB value of the resctrl group its threads are in and the CPU quota of its
cgroup; a DNN job's iteration rate follows the CPU job's bandwidth, or its own cpuset.
DNN jobs report progress through the real progress file (``NodeProgressDir``), written
with the job's uid and an mtime on the simulated clock, so the rates the daemon computes
are exactly the modelled ones.

Node: ``build_node(jobs=2)``: job 5001 is a 2-GPU job on 48 CPUs (0-23,32-55), job 5002 a
CPU job on 16 CPUs (24-31,56-63). The fixture has no CPU topology in sysfs, so every CPU
counts as socket 0: the two jobs share a socket.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pynvml
import pytest

from coda_common.config.codaconf import load_config
from coda_common.model.curves import cores_for_fraction, throughput_curve
from coda_common.store.profiles import ProfileStore
from coda_node.daemon.service import MAX_EVENTS, Daemon, TickReport
from coda_node.enforce.state import Limit
from coda_node.status.document import event_action
from coda_node.system.cgroups import format_cpulist, parse_cpulist
from coda_node.system.nvml import Nvml
from coda_node.system.resctrl import parse_schemata
from tests.node import resctrl_fixtures
from tests.node.node_fixtures import FakeNode, build_node

DNN, CPU = 5001, 5002
CPU_CORES = 16  # the CPU job's allocation; it uses all of it while it draws
B = 10e9  # the CPU job's unthrottled memory bandwidth, bytes/s
R0 = 100.0  # the DNN job's uncontended rate, iterations/s
S = 0.5  # the DNN job's sensitivity: rate = R0 * (1 - S * bw / B)
T0 = 1000.0  # the fake monotonic clock at the start
UNIX0 = 1_700_000_000  # unix time at T0 (for the progress files' mtimes)

SHORT_TIMES = (
    "NodeProbeWarmupS=5\n"
    "NodeProbeSettleS=2\n"
    "NodeProbeMeasureS=6\n"
    "NodeReleaseHoldS=5\n"
    "NodeProgressDir=/run/coda-node/progress\n"
    # The whole ladder (quota 75, 50, 25 %) down to a 10 % floor, stepped by draw alone and
    # every hold kept: these tests follow each step through the daemon (attribution and the
    # benefit and price tests of a hold are tested in test_contention*.py).
    "NodeThrottleFloorPct=10\n"
    "NodeThrottleMinEffectPct=0\n"
    "NodeThrottleStepPct=\n"
    "NodeThrottleMinGainPct=0\n"
    "NodeThrottleGpuWorthCores=0\n"
)


class Sim:
    """A fixture node, a Daemon on it with a fake clock, and the jobs' side of the loop."""

    def __init__(self, tmp_path: Path, *, rdt: bool = False, dnn_src: str = "profile") -> None:
        self.node: FakeNode = build_node(tmp_path, jobs=2)
        job = self.node.jobs[DNN]
        assert job.admin_comment is not None and "src=profile" in job.admin_comment
        job.admin_comment = job.admin_comment.replace("src=profile", f"src={dnn_src}")
        self.signature = f"workload:{job.uid}:{job.name}"
        conf = self.node.coda_conf.read_text()
        assert "NodeIntervalS=5\n" in conf
        self.node.coda_conf.write_text(
            conf.replace("NodeIntervalS=5\n", "NodeIntervalS=1\n") + SHORT_TIMES
        )
        self.cfg = load_config(self.node.coda_conf)
        self.rdt: resctrl_fixtures.FakeResctrl | None = None
        if rdt:
            self.rdt = mount_resctrl(self.node)
        self.now = T0
        self.ticks = 0
        self.bw: dict[int, float] = {}
        self.iterations: dict[int, float] = {}
        self.store = ProfileStore(self.cfg.profile_store)
        self.new_daemon(mbm_given=rdt)
        self.timeline: list[tuple[int, dict[str, Any]]] = []
        """(tick, event) for every event the daemon logged, in order."""

    def new_daemon(self, *, mbm_given: bool = False, conf_extra: str = "") -> None:
        """(Re)build the daemon on the node as it is now (``self.rdt`` mounted or not).
        ``mbm_given``: per-job bandwidth comes from ``self.bw`` (else the daemon measures
        it with its own resctrl monitoring groups, where the mount has MBM)."""
        if conf_extra:
            self.node.coda_conf.write_text(self.node.coda_conf.read_text() + conf_extra)
            self.cfg = load_config(self.node.coda_conf)
        rdt_fake = self.rdt
        self.daemon = Daemon(
            self.cfg,
            runner=self.node.slurm,
            nvml=Nvml(lib=self.node.nvml_lib),
            cpuset_writer=self.node.cpuset_writer,
            quota_writer=self.node.quota_writer,
            rdt_control=(lambda _root, info: rdt_fake.control(info)) if rdt_fake else None,
            mbm=self.bw.get if mbm_given else None,
            store=self.store,
            clock=lambda: self.now,
        )
        self.daemon.start()

    # -- what the daemon enforced, read back from the fixture ------------------------------
    def progress_path(self, job_id: int) -> Path:
        return self.daemon.loop.progress_files.path_for(job_id)

    def mb_pct(self, job_id: int) -> int:
        """The MB value of the coda_mb group holding the job's threads (100: none)."""
        assert self.rdt is not None
        tids = set(self.node.jobs[job_id].all_tids)
        for group in sorted(self.rdt.path.glob("coda_mb*")):
            if tids & {int(t) for t in (group / "tasks").read_text().split()}:
                return parse_schemata((group / "schemata").read_text())["MB"][0]
        return 100

    def coda_groups(self) -> list[str]:
        assert self.rdt is not None
        return sorted(p.name for p in self.rdt.path.glob("coda_*"))

    def quota_cores(self, job_id: int) -> float | None:
        path = self.node.quota_file(job_id)
        if not path.exists():
            return None
        value = int(path.read_text().split()[0])
        return None if value < 0 else value / 100_000

    def cpuset(self, job_id: int) -> frozenset[int]:
        return parse_cpulist(self.node.cpuset_texts(job_id)["."])

    # -- the jobs' side -----------------------------------------------------------------
    def write_progress(self, job_id: int, rate: float, *, uid: int | None = None) -> None:
        """The job did ``rate`` iterations in the last second: its file says so, owned by
        ``uid`` (default: the job's, as the daemon created it), mtime = simulated now."""
        self.iterations[job_id] = self.iterations.get(job_id, 0.0) + rate
        path = self.progress_path(job_id)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_text(f"{self.iterations[job_id]:.3f} train\n")
        os.chown(path, self.node.jobs[job_id].uid if uid is None else uid, -1)
        mtime_ns = round((UNIX0 + self.now - T0) * 1e9)
        os.utime(path, ns=(mtime_ns, mtime_ns))

    def tick(self) -> TickReport:
        """The daemon ticks (after :meth:`advance` and the jobs' writes); its events are
        kept with the tick's number."""
        before = len(self.daemon.events)
        report = self.daemon.tick()
        assert len(self.daemon.events) < self.daemon.events.maxlen  # type: ignore[operator]
        self.timeline += [(self.ticks, e) for e in list(self.daemon.events)[before:]]
        self.ticks += 1
        return report

    def advance(self) -> None:
        self.now += 1.0

    def events(self, what: str, job_id: int | None = None) -> list[tuple[int, dict[str, Any]]]:
        return [
            (t, e)
            for t, e in self.timeline
            if e["what"] == what and (job_id is None or e["job_id"] == job_id)
        ]

    def rate(self, job_id: int) -> float | None:
        prog = self.daemon.loop.progress.get(job_id)
        return prog.rate if prog else None

    def baseline(self, job_id: int) -> float | None:
        status = self.daemon.loop.eliminator.dnn_status(job_id)
        return status["baseline"] if status else None  # type: ignore[return-value]


def mount_resctrl(
    node: FakeNode, variant: str = "full", *, tasks_in_root: bool = False
) -> resctrl_fixtures.FakeResctrl:
    """resctrl ``variant`` (default ``full``: MB, MBM, CAT) on the node's root, keeping the
    cgroup mounts. ``tasks_in_root``: every thread on the node listed in the default
    group's ``tasks``, as on a real host."""
    mounts = (node.root / "proc/self/mounts").read_text().splitlines()
    rdt = resctrl_fixtures.build(node.root, variant)
    resctrl = [
        x for x in (node.root / "proc/self/mounts").read_text().splitlines() if "resctrl" in x
    ]
    (node.root / "proc/self/mounts").write_text("\n".join(mounts + resctrl) + "\n")
    tids = {t for job in node.jobs.values() for t in job.all_tids}
    rdt.live_pids |= tids
    if tasks_in_root:
        for tid in sorted(tids):
            rdt.write(rdt.path / "tasks", f"{tid}\n".encode())
    return rdt


# --------------------------------------------------------------------------------------------
# Contention: a CPU job's memory bandwidth slows a DNN job on its socket


def _contention_step(
    sim: Sim, drawing: bool, bw_at: Callable[[int], float], s: float = S
) -> TickReport:
    """One second of the two jobs, given what the daemon enforced, then a tick.

    The CPU job, while it draws, runs on all its cores unless a CPU quota caps it, and
    draws ``bw_at(MB %)`` scaled by the share of its cores it gets; the DNN job's rate
    falls by ``s`` times the CPU job's share of ``B``."""
    sim.advance()
    mb = sim.mb_pct(CPU)
    quota = sim.quota_cores(CPU)
    cores = min(float(CPU_CORES), quota if quota is not None else float(CPU_CORES))
    bw = bw_at(mb) * cores / CPU_CORES if drawing else 0.0
    if not drawing:
        cores = 0.0
    sim.bw[CPU] = bw
    sim.node.advance_cpu(CPU, int(cores * 1e9))
    sim.write_progress(DNN, R0 * (1.0 - s * bw / B))
    return sim.tick()


ONSET = 12  # first tick whose second the CPU job draws in (baseline: ticks 5-11)


def _run_until_onset(sim: Sim) -> None:
    for _ in range(ONSET):
        _contention_step(sim, False, lambda mb: 0.0)
    assert sim.baseline(DNN) == pytest.approx(R0)
    assert sim.events("throttle") == []
    assert sim.daemon.loop.eliminator.mba, "MBA must be usable: resctrl MB and per-job MBM"


def test_mba_throttles_the_cpu_job_the_dnn_job_recovers_and_quiet_releases_step_by_step(
    tmp_path: Path,
) -> None:
    sim = Sim(tmp_path, rdt=True)
    _run_until_onset(sim)

    def follows_cap(mb: int) -> float:
        return B * mb / 100

    # The CPU job's threads in its cgroups (v1 keeps its two slurmstepds outside them).
    cpu_tids = {t for ts in sim.node.jobs[CPU].v1_threads.values() for t in ts}
    first_group: tuple[int, str, str] | None = None
    for _ in range(30):
        _contention_step(sim, True, follows_cap)
        if first_group is None and sim.events("throttle", CPU):
            groups = sim.coda_groups()
            assert len(groups) == 1, groups
            first_group = (sim.ticks - 1, groups[0], sim.rdt.text(f"{groups[0]}/schemata"))  # type: ignore[union-attr]
            tasks = {int(t) for t in sim.rdt.text(f"{groups[0]}/tasks").split()}  # type: ignore[union-attr]
            assert tasks == cpu_tids

    # The first throttle came within 2 ticks of the onset, and it was MBA.
    throttles = sim.events("throttle", CPU)
    assert throttles, sim.timeline
    t_first, first = throttles[0]
    assert ONSET <= t_first <= ONSET + 2
    assert first["reason"].startswith("memory bandwidth capped at MB 70%")
    assert first_group is not None and first_group[0] == t_first
    assert first_group[1] == "coda_mb70"
    assert "MB:0= 70;1= 70" in first_group[2]
    # The events name the victim.
    for _, e in throttles:
        assert e["reading"]["victim"] == DNN and f"job {DNN} runs" in e["reason"]
    applied = sim.events("memory bandwidth 70", CPU)
    assert applied and applied[0][1]["reason"] == f"contention: shielding job {DNN}"
    # MBA down its ladder, never CPU quota: the cap works here.
    assert [e["reading"]["level"] for _, e in throttles] == [1, 2, 3, 4]
    assert sim.quota_cores(CPU) is None
    assert sim.mb_pct(CPU) == 10
    # The DNN job is back within 10 % of its baseline.
    rate, base = sim.rate(DNN), sim.baseline(DNN)
    assert rate is not None and base is not None and rate >= 0.9 * base
    assert sim.events("throttle-correct") == []

    # The CPU job goes quiet: released one step per hold, back to no group at all.
    quiet_from = sim.ticks
    for _ in range(40):
        _contention_step(sim, False, follows_cap)
    steps = [(t, e) for t, e in sim.timeline if t >= quiet_from and e["job_id"] == CPU]
    released = [(t, e) for t, e in steps if e["what"] in ("release-step", "release")]
    assert [e["what"] for _, e in released] == ["release-step"] * 3 + ["release"]
    assert [e["reading"]["level"] for _, e in released] == [3, 2, 1, 0]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(released)]
    assert all(g >= 5 for g in gaps), gaps  # NodeReleaseHoldS=5 between steps
    # The first step needs no quiet hold: the victim is already within 5 % of its baseline
    # (the cap held since the floor); the rest wait for the job to stay quiet a hold.
    assert "no DNN job on its socket(s)" in released[0][1]["reason"]
    assert all("has been quiet for 5 s" in e["reason"] for _, e in released[1:])
    mb_written = [e["what"] for _, e in steps if e["what"].startswith("memory bandwidth")]
    assert mb_written == [
        "memory bandwidth 30",
        "memory bandwidth 50",
        "memory bandwidth 70",
        "memory bandwidth released",
    ]
    assert sim.coda_groups() == []
    root_tasks = {int(t) for t in sim.rdt.text("tasks").split()}  # type: ignore[union-attr]
    assert cpu_tids <= root_tasks
    assert CPU not in sim.daemon.state.changes
    assert sim.events("throttle", CPU)[-1][0] < quiet_from  # no throttle while quiet


def test_mba_that_overshoots_falls_back_to_cpu_quota_and_the_dnn_job_recovers(
    tmp_path: Path,
) -> None:
    """MB caps that let 3.5x through: no ladder step above the floor changes anything
    (3.5 x 30 % > 100 %), so MBA runs to its floor, then the L3 ways (the ``full`` fixture
    has CAT; this CPU job's draw does not depend on them), then the CPU quota ladder."""
    sim = Sim(tmp_path, rdt=True)
    _run_until_onset(sim)

    def overshoots(mb: int) -> float:
        return min(B, 3.5 * B * mb / 100)

    for _ in range(30):
        _contention_step(sim, True, overshoots)

    throttles = sim.events("throttle", CPU)
    reasons = [e["reason"].split(":")[0] for _, e in throttles]
    assert reasons[:4] == [
        "memory bandwidth capped at MB 70%",
        "memory bandwidth capped at MB 50%",
        "memory bandwidth capped at MB 30%",
        "memory bandwidth capped at MB 10%",
    ]
    assert reasons[4:7] == [
        "L3 limited to 10 of 20 ways (MB 10% was not enough)",
        "L3 limited to 5 of 20 ways (MB 10% was not enough)",
        "L3 limited to 2 of 20 ways (MB 10% was not enough)",
    ]
    assert reasons[7] == "CPU capped at 12 of 16 cores (MB 10% and L3 2 of 20 ways were not enough)"
    assert throttles[0][0] <= ONSET + 2
    # The quota is in the job's cgroup, on top of the MB floor.
    quota = sim.quota_cores(CPU)
    assert quota is not None and quota < CPU_CORES
    assert sim.mb_pct(CPU) == 10
    assert sim.daemon.loop.eliminator.cpu_status(CPU)["mechanism"] == "mba+l3+quota"  # type: ignore[index]
    rate, base = sim.rate(DNN), sim.baseline(DNN)
    assert rate is not None and base is not None and rate >= 0.9 * base
    # Documented by this test: with the victim above the trigger the ladder step always
    # pre-empts the overshoot correction, so no throttle-correct happens here.
    assert sim.events("throttle-correct") == []


def test_overshoot_correction_lowers_mb_below_the_ladder_value(tmp_path: Path) -> None:
    """A victim just past the trigger: one MBA step brings it under the trigger, but the job
    still draws 1.3x its cap, more than 1.25x the aim: the loop lowers MB by 10 points."""
    sim = Sim(tmp_path, rdt=True)
    _run_until_onset(sim)
    for _ in range(12):
        _contention_step(sim, True, lambda mb: min(B, 1.3 * B * mb / 100), s=0.105)
    throttles = sim.events("throttle", CPU)
    assert len(throttles) == 1 and "MB 70%" in throttles[0][1]["reason"]
    corrections = sim.events("throttle-correct", CPU)
    assert corrections, sim.timeline
    assert corrections[0][1]["reading"]["mb_pct"] == 60
    assert corrections[0][1]["reading"]["victim"] == DNN
    assert sim.mb_pct(CPU) == 60  # below the ladder's 70, in the fixture's schemata
    assert sim.coda_groups() == ["coda_mb60"]
    assert sim.quota_cores(CPU) is None


# --------------------------------------------------------------------------------------------
# Online profiling through the daemon


THETA = 6.0  # the DNN job's knee, cores per GPU (tests that do not vary it)


def _curve_rate(cores: int, gpus: int, theta: float = THETA, softness: float = 0.0) -> float:
    """Iterations/s of the DNN job on ``cores`` cores: the per-GPU curve, times R0."""
    per_gpu = throughput_curve(theta, np.array([cores / gpus]), softness=softness)[0]
    return round(R0 * float(per_gpu), 3)


@pytest.mark.parametrize(
    ("theta", "softness"),
    [(6.0, 0.0), (9.5, 0.0), (4.5, 0.2), (14.0, 0.2)],
    ids=["knee-6", "knee-9.5", "soft-4.5", "soft-14"],
)
def test_online_profiling_publishes_the_curves_95_percent_point(
    tmp_path: Path, theta: float, softness: float
) -> None:
    sim = Sim(tmp_path, dnn_src="none")
    job = sim.node.jobs[DNN]
    gpus = len(job.gpus)
    allocation = format_cpulist(job.cpus)
    assert gpus == 2 and len(job.cpus) == 48
    seen_cores: set[int] = set()
    states: list[str] = []  # the profile state `coda-node status` shows, tick by tick
    for _ in range(200):
        sim.advance()
        cores = len(sim.cpuset(DNN))
        seen_cores.add(cores)
        sim.write_progress(DNN, _curve_rate(cores, gpus, theta, softness))
        sim.tick()
        view = {j["job_id"]: j for j in sim.daemon.state.view["jobs"]}[DNN]
        if not states or states[-1] != view["profile_state"]:
            states.append(view["profile_state"])
        if sim.events("profile-publish"):
            break
    assert sim.events("profile-publish"), sim.timeline

    truth = cores_for_fraction(theta, max_cores=len(job.cpus) // gpus, softness=softness)
    prof = sim.store.read(sim.signature)
    assert prof is not None
    assert sim.store.path_for(sim.signature).is_file()
    assert prof.source == "coda-node:gpu01"
    assert abs(prof.cpus_per_gpu - truth) <= 1, (prof.cpus_per_gpu, truth, prof.samples)
    assert prof.confidence >= sim.cfg.min_confidence
    assert {s.gpus for s in prof.samples} == {gpus}
    assert {s.node for s in prof.samples} == {"gpu01"}
    # One publish, one run id, <node>:<job id>:<unix s> (store format version 3).
    (run,) = {s.run for s in prof.samples}
    assert re.fullmatch(rf"gpu01:{DNN}:\d+", run or ""), run
    # Probed below its allocation, then given all of it back.
    assert min(seen_cores) < len(job.cpus)
    assert sim.node.cpuset_texts(DNN)["."] == allocation + "\n"
    assert DNN not in sim.daemon.state.changes
    view_events = {(e["job_id"], e["what"]) for e in sim.daemon.state.view["events"]}
    for what in ("probe", "probe-done", "profile-publish"):
        assert (DNN, what) in view_events, what
    record = sim.daemon.loop.allocator.records[DNN]
    assert record.state == "done"
    assert states == ["waiting", "probing", "confident"]
    # One more tick: the job keeps its whole allocation and is not probed again.
    sim.advance()
    sim.write_progress(DNN, _curve_rate(48, gpus, theta, softness))
    sim.tick()
    assert sim.node.cpuset_texts(DNN)["."] == allocation + "\n"


def test_a_job_that_ends_mid_probe_publishes_what_it_measured(tmp_path: Path) -> None:
    """Short jobs often end before their probes do; their samples still reach the store,
    and the next run of the workload starts from them."""
    sim = Sim(tmp_path, dnn_src="none")
    gpus = len(sim.node.jobs[DNN].gpus)
    for _ in range(200):
        sim.advance()
        sim.write_progress(DNN, _curve_rate(len(sim.cpuset(DNN)), gpus))
        sim.tick()
        rec = sim.daemon.loop.allocator.records[DNN]
        if rec.state == "probing" and len({c for c, _ in rec.samples}) >= 2:
            break
    else:
        raise AssertionError(f"never probed two counts: {sim.timeline}")
    measured = [c for c, _ in sim.daemon.loop.allocator.records[DNN].samples]
    assert sim.store.read(sim.signature) is None
    assert len(sim.cpuset(DNN)) < 48  # still slimmed by the probe when it ends

    sim.node.remove_job(DNN)
    sim.advance()
    sim.tick()
    assert sim.events("probe-ended", DNN) and sim.events("profile-publish", DNN)
    prof = sim.store.read(sim.signature)
    assert prof is not None and prof.source == "coda-node:gpu01"
    assert [s.cores for s in prof.samples] == measured
    assert measured[0] == 48 and max(s.throughput for s in prof.samples) > 90
    # The GPU model of a job that is gone, from the tick before it ended.
    assert {s.gpu_model for s in prof.samples} == {"NVIDIA A100-SXM4-80GB"}
    assert DNN not in sim.daemon.state.changes


# --------------------------------------------------------------------------------------------
# Progress files: only the job's own


def test_a_progress_file_owned_by_another_uid_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = Sim(tmp_path, dnn_src="none")
    # No NVML utilisation either: nothing else to fall back to.
    sim.node.nvml_lib.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NOT_SUPPORTED)
    owner = sim.node.jobs[DNN].uid
    other = sim.node.jobs[CPU].uid
    assert other != owner
    before = sim.node.cpuset_texts(DNN)
    caplog.set_level(logging.WARNING, logger="coda-node")
    for _ in range(30):
        sim.advance()
        sim.write_progress(DNN, _curve_rate(48, 2), uid=other)
        sim.tick()
    prog = sim.daemon.loop.progress[DNN]
    assert (prog.phase, prog.rate, prog.source) == ("no-signal", None, None)
    view = {j["job_id"]: j for j in sim.daemon.state.view["jobs"]}[DNN]
    assert view["progress"]["phase"] == "no-signal"
    record = sim.daemon.loop.allocator.records[DNN]
    assert record.state == "waiting" and record.samples == [] and record.probes == 0
    assert [e for _, e in sim.timeline if e["what"].startswith("probe")] == []
    assert sim.node.cpuset_texts(DNN) == before
    assert sim.node.job_journal(DNN) == []
    assert f"not a regular file owned by uid {owner}" in caplog.text
    # The same file, owned by the job's uid: it counts from the next reading on.
    for _ in range(8):
        sim.advance()
        sim.write_progress(DNN, _curve_rate(48, 2))
        sim.tick()
    assert sim.daemon.loop.progress[DNN].source == "iterations"
    assert sim.daemon.loop.progress[DNN].phase == "train"


# --------------------------------------------------------------------------------------------
# Logs: one line per decision and per change, job id first ("grep 'job=N '" finds a job's)

_LOG_LINE = re.compile(
    r'^job=(\d+) action=("(?:[^"\\]|\\.)*") reason=("(?:[^"\\]|\\.)*")( reading=\{.*\})?$'
)


def _decision_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str]]:
    out = []
    for rec in caplog.records:
        msg = rec.getMessage()
        if rec.name != "coda-node":
            continue
        if " action=" not in msg:
            assert not re.match(r"job \d+", msg), msg  # a job's line always starts job=N
            continue
        m = _LOG_LINE.match(msg)
        assert m is not None, msg
        out.append((int(m.group(1)), json.loads(m.group(2)), json.loads(m.group(3))))
    return out


def _events(sim: Sim) -> list[tuple[int, str, str]]:
    assert len(sim.daemon.events) < MAX_EVENTS  # none has rolled off
    return [(e["job_id"], e["what"], e["reason"]) for e in sim.daemon.events]


def test_every_decision_and_change_is_logged_once_with_the_job_id_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coda-node")
    # Contention: throttled step by step, released step by step.
    sim = Sim(tmp_path / "contention", rdt=True)
    _run_until_onset(sim)
    for _ in range(30):
        _contention_step(sim, True, lambda mb: B * mb / 100)
    for _ in range(40):
        _contention_step(sim, False, lambda mb: B * mb / 100)
    lines = _decision_lines(caplog)
    assert lines == _events(sim)
    actions = {event_action(what) for _, what, _ in lines}
    assert {"throttle", "release-step", "release", "mem-bw", "mem-bw-release"} <= actions

    # Profiling: probes, the end of probing, the profile published; then an admin limit
    # and a restore (what SIGTERM and `coda-node restore` do).
    caplog.clear()
    sim = Sim(tmp_path / "profiling", dnn_src="none")
    for _ in range(200):
        sim.advance()
        sim.write_progress(DNN, _curve_rate(len(sim.cpuset(DNN)), 2))
        sim.tick()
        if sim.events("profile-publish"):
            break
    sim.node.set_limits({CPU: Limit(cores=4, reason="admin: pinned")})
    sim.advance()
    sim.tick()
    sim.daemon.restore()
    lines = _decision_lines(caplog)
    assert lines == _events(sim)
    whats = [(job, event_action(what), reason) for job, what, reason in lines]
    for action in ("probe", "probe-done", "profile-publish", "cpuset", "cpuset-restore"):
        assert any(a == action for j, a, _ in whats if j == DNN), action
    assert (CPU, "cpuset", "admin: pinned") in whats  # the limit, one line
    assert (CPU, "cpuset-restore", "restore") in whats  # the restore, one line
    assert sum(1 for j, a, _ in whats if j == DNN and a == "profile-publish") == 1


# --------------------------------------------------------------------------------------------
# Restart: the DNN jobs' baselines carry over


@pytest.mark.parametrize("last_view", ["view file", "older state file", "none"])
def test_a_restarted_daemon_shields_at_once_with_the_baselines_of_its_last_run(
    tmp_path: Path, last_view: str
) -> None:
    """coda-node is restarted (an upgrade, or it was killed) while a DNN job trains: the job's
    baseline comes back from the last tick's view (NodeRuntimeDir/view.json), so a CPU job
    that starts drawing is throttled within two ticks, as before the restart. Without the
    view (a reboot cleared /run) the job has no baseline and nothing can be done for it
    until one is measured. An upgrade from a coda-node that kept its view in state.json
    adopts the view from there."""
    sim = Sim(tmp_path, rdt=True)
    _run_until_onset(sim)
    files = sim.daemon.state_file
    if last_view == "older state file":
        record = json.loads(files.path.read_text())
        record["view"] = json.loads(files.view_path.read_text())["view"]
        files.path.write_text(json.dumps(record))
    if last_view != "view file":
        files.view_path.unlink()
    state_kept = last_view != "none"
    sim.new_daemon(mbm_given=True)
    assert sim.baseline(DNN) == (pytest.approx(R0) if state_kept else None)
    start = sim.ticks
    for _ in range(4):
        _contention_step(sim, True, lambda mb: B * mb / 100)
    throttled = [t for t, e in sim.events("throttle") if t >= start]
    if state_kept:
        assert throttled and throttled[0] - start <= 2
    else:
        assert throttled == []
    # The new daemon's view is in the view file only; the record keeps what it changed.
    record = json.loads(files.path.read_text())
    assert "view" not in record and bool(record["changes"]) == state_kept  # the throttle
    assert json.loads(files.view_path.read_text())["view"]["jobs"]
