"""Per-job memory bandwidth from resctrl MON groups (coda_node.sampling.mbm), on the fake resctrl
kernel of tests/node/resctrl_fixtures.py, and through the daemon's closed loop on a fixture node
(tests/node/test_daemon_loop_fixture.py's Sim) with no bandwidth injected."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest

from coda_node.daemon.service import TickReport
from coda_node.enforce.mongroups import JobMonitor
from coda_node.sampling.mbm import job_of_mon_group, mon_group_name
from coda_node.system.cgroups import CgroupReadError
from coda_node.system.resctrl import ResctrlError
from tests.node import resctrl_fixtures
from tests.node.resctrl_fixtures import FakeResctrl
from tests.node.test_daemon_loop_fixture import (
    CPU,
    CPU_CORES,
    DNN,
    ONSET,
    R0,
    B,
    S,
    Sim,
    mount_resctrl,
)

JOBS = {1: (5001, 5002, 5003), 2: (6001, 6002), 3: (7001,)}


class Rig:
    """A fake resctrl mount, jobs whose threads start in the default group, a monitor, and
    the enforcer's side done by hand (threads moved into and out of ``coda_mb*``)."""

    def __init__(self, tmp: Path, *, num_rmids: int = 224, sync_every_s: float = 5.0) -> None:
        self.fake = resctrl_fixtures.build(tmp, "full", num_rmids=num_rmids)
        self.control = self.fake.control()
        self.threads: dict[int, list[int]] = {j: list(t) for j, t in JOBS.items()}
        for tids in JOBS.values():
            self.spawn(*tids)
        self.ctrl: dict[int, str] = {}
        self.monitor = JobMonitor(self.fake.root, self.control, sync_every_s=sync_every_s)

    def spawn(self, *tids: int) -> None:
        """New threads: like every task, they start in the default group (written into the
        root's tasks file through the fake kernel)."""
        self.fake.live_pids |= set(tids)
        for tid in tids:
            self.fake.write(self.fake.path / "tasks", f"{tid}\n".encode())

    def sync(self, now_s: float, jobs: list[int] | None = None) -> None:
        self.monitor.sync(
            now_s,
            sorted(self.threads) if jobs is None else jobs,
            lambda j: self.ctrl.get(j, ""),
            lambda j: self.threads.get(j),
        )

    def tasks(self, rel: str) -> set[int]:
        return {int(t) for t in self.fake.text(f"{rel}/tasks" if rel else "tasks").split()}

    def add_bytes(self, group: str, d0: int, d1: int, event: str = "mbm_total_bytes") -> None:
        for domain, more in ((0, d0), (1, d1)):
            rel = f"{group}/mon_data" if group else "mon_data"
            now = int(self.fake.text(f"{rel}/mon_L3_{domain:02d}/{event}"))
            self.fake.set_counter(group, domain, event, now + more)

    def throttle(self, job_id: int, group: str) -> None:
        """What the enforcer does: its threads into a shared control group."""
        self.control.ensure_group(group)
        self.control.assign_tasks(group, self.threads[job_id])
        self.ctrl[job_id] = group

    def release(self, job_id: int) -> None:
        group = self.ctrl.pop(job_id)
        self.control.release_tasks(group, self.threads[job_id])
        self.control.remove_group(group)

    def job_groups(self) -> list[str]:
        return sorted(
            p.relative_to(self.fake.path).as_posix() for p in self.fake.path.rglob("coda_j*")
        )


def test_names() -> None:
    assert mon_group_name(4242) == "coda_j4242"
    assert job_of_mon_group("coda_j4242") == 4242
    assert job_of_mon_group("coda_mb50") is None and job_of_mon_group("coda_j") is None


def test_each_job_gets_a_group_under_root_with_its_threads_and_an_exact_rate(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.sync(10.0)
    assert rig.job_groups() == [
        "mon_groups/coda_j1",
        "mon_groups/coda_j2",
        "mon_groups/coda_j3",
    ]
    for job_id, tids in JOBS.items():
        assert rig.tasks(f"mon_groups/coda_j{job_id}") == set(tids)
    assert rig.monitor.monitored() == {j: f"mon_groups/coda_j{j}" for j in JOBS}
    assert rig.monitor.rate(1) is None  # nothing to compare with yet
    # 3 GB on socket 0 and 1 GB on socket 1 in 2 s; local traffic differs on purpose.
    rig.add_bytes("mon_groups/coda_j1", 3_000_000_000, 1_000_000_000)
    rig.add_bytes("mon_groups/coda_j1", 1_000, 1_000, "mbm_local_bytes")
    rig.monitor.sample(12.0)
    assert rig.monitor.rate(1) == 2e9
    assert rig.monitor.rate(2) == 0.0
    assert rig.monitor.rate(99) is None
    rig.add_bytes("mon_groups/coda_j1", 500, 0)
    rig.monitor.sample(12.5)
    assert rig.monitor.rate(1) == 1000.0
    assert rig.monitor.status() == {
        "event": "mbm_total_bytes",
        "num_rmids": 224,
        "monitored": [1, 2, 3],
        "unmonitored": [],
    }


def test_the_group_follows_the_job_into_a_capped_group_and_back(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.monitor.sample(1.0)
    rig.add_bytes("mon_groups/coda_j1", 100, 100)
    rig.monitor.sample(2.0)
    assert rig.monitor.rate(1) == 200.0

    # Throttled: the enforcer's move took the threads out of the root's MON group.
    rig.throttle(1, "coda_mb50")
    assert rig.tasks("mon_groups/coda_j1") == set()
    rig.sync(2.5)
    assert rig.job_groups() == [
        "coda_mb50/mon_groups/coda_j1",
        "mon_groups/coda_j2",
        "mon_groups/coda_j3",
    ]
    assert rig.tasks("coda_mb50/mon_groups/coda_j1") == set(JOBS[1])
    assert rig.tasks("coda_mb50") == set(JOBS[1])  # still capped: only the RMID changed
    # The rate of the old group is not the job's any more; the new group's first reading
    # was taken at the sync, so the next sample has a rate again.
    assert rig.monitor.rate(1) is None
    rig.add_bytes("coda_mb50/mon_groups/coda_j1", 40, 10)
    rig.monitor.sample(3.0)
    assert rig.monitor.rate(1) == 100.0
    # A sync with nothing changed writes nothing.
    before = len(rig.fake.writes)
    rig.sync(3.5)
    assert rig.fake.writes[before:] == []

    # Released: the enforcer moved the threads back and removed coda_mb50 (and with it
    # the MON group under it).
    rig.release(1)
    rig.sync(4.0)
    assert rig.job_groups() == ["mon_groups/coda_j1", "mon_groups/coda_j2", "mon_groups/coda_j3"]
    assert rig.tasks("mon_groups/coda_j1") == set(JOBS[1])
    assert rig.monitor.rate(1) is None
    rig.add_bytes("mon_groups/coda_j1", 7, 0)
    rig.monitor.sample(5.0)
    assert rig.monitor.rate(1) == 7.0


def test_groups_of_ended_jobs_go(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.sync(1.0, jobs=[2, 3])  # job 1 ended
    assert rig.job_groups() == ["mon_groups/coda_j2", "mon_groups/coda_j3"]
    assert rig.monitor.rate(1) is None and 1 not in rig.monitor.monitored()
    # Job 2's cgroup vanished between listing and reading its threads: its group goes too.
    del rig.threads[2]
    rig.sync(10.0, jobs=[2, 3])
    assert rig.job_groups() == ["mon_groups/coda_j3"]
    assert rig.monitor.unmonitored == {}


def test_out_of_rmids_leaves_one_job_unmonitored_with_a_reason_until_one_is_free(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="coda-node")
    rig = Rig(tmp_path, num_rmids=3)  # the default group's RMID and two more
    for t in (0.0, 1.0, 2.0):
        rig.sync(t)
    assert rig.job_groups() == ["mon_groups/coda_j1", "mon_groups/coda_j2"]
    assert set(rig.monitor.unmonitored) == {3}
    reason = rig.monitor.unmonitored[3]
    assert reason.startswith("no free RMID (this CPU has 3,")
    assert "kernel: Out of RMIDs" in reason
    assert rig.monitor.status()["unmonitored"] == [{"job_id": 3, "reason": reason}]
    assert rig.monitor.monitored() == {1: "mon_groups/coda_j1", 2: "mon_groups/coda_j2"}
    # Logged once, not at every sync.
    lines = [r.getMessage() for r in caplog.records if "not monitored" in r.getMessage()]
    assert lines == [f"job=3 memory bandwidth not monitored: {reason}"]
    # The others are measured as usual.
    rig.add_bytes("mon_groups/coda_j2", 10, 0)
    rig.monitor.sample(3.0)
    rig.add_bytes("mon_groups/coda_j2", 10, 0)
    rig.monitor.sample(4.0)
    assert rig.monitor.rate(2) == 10.0 and rig.monitor.rate(3) is None
    # Job 1 ends: its RMID is free, and job 3 gets it at the next sync.
    rig.sync(5.0, jobs=[2, 3])
    assert rig.job_groups() == ["mon_groups/coda_j2", "mon_groups/coda_j3"]
    assert rig.tasks("mon_groups/coda_j3") == set(JOBS[3])
    assert rig.monitor.unmonitored == {}


def test_a_throttled_job_that_finds_no_rmid_for_its_new_group_is_retried(tmp_path: Path) -> None:
    # Default group + coda_mb50 + three MON groups: the move frees one RMID and needs one,
    # but the control group took the last.
    rig = Rig(tmp_path, num_rmids=4)
    rig.sync(0.0, jobs=[1, 2])
    rig.throttle(1, "coda_mb50")
    rig.sync(1.0, jobs=[1, 2])
    assert rig.job_groups() == ["coda_mb50/mon_groups/coda_j1", "mon_groups/coda_j2"]
    rig.sync(2.0, jobs=[1, 2, 3])
    assert set(rig.monitor.unmonitored) == {3}
    rig.release(1)  # coda_mb50 and its MON group go: two RMIDs free
    rig.sync(3.0, jobs=[1, 2, 3])
    assert rig.job_groups() == ["mon_groups/coda_j1", "mon_groups/coda_j2", "mon_groups/coda_j3"]
    assert rig.monitor.unmonitored == {}


def test_a_problem_of_one_job_leaves_the_others_monitored(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.ctrl[2] = "mb50"  # not a coda group: resctrl.py refuses to touch it

    def tids(job_id: int) -> list[int] | None:
        if job_id == 3:
            raise CgroupReadError(Path("/sys/fs/cgroup/job_3/tasks"), 13, "Permission denied")
        return rig.threads[job_id]

    rig.monitor.sync(0.0, [1, 2, 3], lambda j: rig.ctrl.get(j, ""), tids)
    assert rig.monitor.monitored() == {1: "mon_groups/coda_j1"}
    assert "must start with 'coda_'" in rig.monitor.unmonitored[2]
    assert rig.monitor.unmonitored[3] == "/sys/fs/cgroup/job_3/tasks: Permission denied"
    assert rig.tasks("mon_groups/coda_j1") == set(JOBS[1])
    # Fixed: monitored at the next sync.
    del rig.ctrl[2]
    rig.sync(1.0)
    assert rig.monitor.unmonitored == {} and sorted(rig.monitor.monitored()) == [1, 2, 3]


def test_threads_are_read_again_only_every_sync_every_s(tmp_path: Path) -> None:
    rig = Rig(tmp_path, sync_every_s=5.0)
    rig.sync(0.0)
    calls: list[int] = []

    def tids(job_id: int) -> list[int] | None:
        calls.append(job_id)
        return rig.threads.get(job_id)

    # A new step's process: not a child of the job's threads, so not in the group.
    rig.threads[1].append(5004)
    rig.spawn(5004)
    reread: dict[int, list[int]] = {}
    for t in range(1, 16):
        calls.clear()
        rig.monitor.sync(float(t), [1, 2, 3], lambda j: "", tids)
        reread[t] = list(calls)
        if 1 not in [j for ts in range(1, t + 1) for j in reread[ts]]:
            assert 5004 not in rig.tasks("mon_groups/coda_j1")
    # Each job once per 5 s, and not all on one tick (jobs found together are spread).
    for job in (1, 2, 3):
        ticks = [t for t, jobs in reread.items() if job in jobs]
        assert len(ticks) == 3 and all(b - a == 5 for a, b in itertools.pairwise(ticks))
    assert max(len(jobs) for jobs in reread.values()) < 3
    assert rig.tasks("mon_groups/coda_j1") == {*JOBS[1], 5004}


def test_an_exited_thread_is_skipped(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.fake.exit_task(5002)  # still listed by the job's cgroup a moment ago
    rig.sync(0.0)
    assert rig.tasks("mon_groups/coda_j1") == {5001, 5003}
    assert rig.monitor.unmonitored == {}


def test_stale_groups_are_removed_at_the_first_sync_and_a_running_jobs_is_kept(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    ctl = rig.control
    # Left by a daemon that was SIGKILLed: ended jobs' groups, a running job's group in
    # the right place, one in a place it no longer belongs, and another tool's group.
    ctl.ensure_mon_group("", "coda_j77")
    ctl.ensure_group("coda_mb30")
    ctl.ensure_mon_group("coda_mb30", "coda_j78")
    ctl.ensure_mon_group("coda_mb30", "coda_j2")
    kept = ctl.ensure_mon_group("", "coda_j1")
    ino = kept.stat().st_ino
    ctl.ensure_mon_group("", "coda_m5")
    rig.sync(0.0)
    assert rig.job_groups() == ["mon_groups/coda_j1", "mon_groups/coda_j2", "mon_groups/coda_j3"]
    assert kept.stat().st_ino == ino  # adopted, not re-created
    assert rig.tasks("mon_groups/coda_j1") == set(JOBS[1])
    assert ctl.list_coda_mon_groups() == ["coda_j1", "coda_j2", "coda_j3", "coda_m5"]
    assert ctl.list_coda_mon_groups("coda_mb30") == []


def test_close_removes_every_job_group(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.throttle(2, "coda_mb50")
    rig.sync(1.0)
    rig.control.ensure_mon_group("", "coda_j99")  # not even known to this monitor
    assert len(rig.job_groups()) == 4
    rig.monitor.close()
    assert rig.job_groups() == []
    assert set(JOBS[1]) | set(JOBS[3]) <= rig.tasks("")
    assert rig.tasks("coda_mb50") == set(JOBS[2])  # the cap itself is the enforcer's
    assert rig.monitor.monitored() == {} and rig.monitor.rate(1) is None


def test_a_counter_reset_or_unavailable_gives_no_rate_not_a_wrong_one(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.add_bytes("mon_groups/coda_j1", 5000, 5000)
    rig.monitor.sample(1.0)
    rig.fake.set_counter("mon_groups/coda_j1", 0, "mbm_total_bytes", 100)  # RMID reset
    rig.monitor.sample(2.0)
    assert rig.monitor.rate(1) is None
    rig.add_bytes("mon_groups/coda_j1", 300, 0)
    rig.monitor.sample(3.0)
    assert rig.monitor.rate(1) == 300.0
    rig.fake.set_counter("mon_groups/coda_j1", 1, "mbm_total_bytes", "Unavailable")
    rig.monitor.sample(4.0)
    assert rig.monitor.rate(1) is None


def test_mbm_local_is_used_where_there_is_no_total(tmp_path: Path) -> None:
    fake = resctrl_fixtures.build(tmp_path, "full")
    (fake.path / "info/L3_MON/mon_features").write_text("llc_occupancy\nmbm_local_bytes\n")
    monitor = JobMonitor(fake.root, fake.control())
    assert monitor.event == "mbm_local_bytes"
    fake.live_pids.add(5001)
    fake.write(fake.path / "tasks", b"5001\n")
    monitor.sync(0.0, [1], lambda j: "", lambda j: [5001])
    fake.set_counter("mon_groups/coda_j1", 0, "mbm_local_bytes", 64)
    monitor.sample(2.0)
    assert monitor.rate(1) == 32.0


def test_no_monitor_without_mbm(tmp_path: Path) -> None:
    fake = resctrl_fixtures.build(tmp_path, "nombm")
    with pytest.raises(ResctrlError, match="mbm_total_bytes nor mbm_local_bytes"):
        JobMonitor(fake.root, fake.control())


# --------------------------------------------------------------------------------------------
# Through the daemon: nothing injected, the monitor's measured bandwidth drives MBA


def _sim(tmp_path: Path, variant: str = "full", conf_extra: str = "") -> Sim:
    """The loop test's Sim, its daemon rebuilt on a resctrl mount with no ``mbm`` given."""
    sim = Sim(tmp_path)
    sim.rdt = mount_resctrl(sim.node, variant, tasks_in_root=True)
    sim.new_daemon(conf_extra=conf_extra)
    return sim


def _charge(rdt: FakeResctrl, tids: set[int], nbytes: float) -> None:
    """The kernel counts the job's traffic against the RMID of each thread's MON group
    (shared evenly by its threads; 3/4 on socket 0): threads in no MON group are counted
    in their control group, which nobody reads."""
    for tasks in [*rdt.path.glob("mon_groups/*/tasks"), *rdt.path.glob("*/mon_groups/*/tasks")]:
        share = len(tids & {int(t) for t in tasks.read_text().split()}) / len(tids)
        if not share:
            continue
        group = tasks.parent.relative_to(rdt.path).as_posix()
        for domain, part in ((0, 0.75), (1, 0.25)):
            d = tasks.parent / "mon_data" / f"mon_L3_{domain:02d}"
            total = int((d / "mbm_total_bytes").read_text())
            rdt.set_counter(group, domain, "mbm_total_bytes", total + round(nbytes * share * part))


def _step(sim: Sim, drawing: bool, cpu_tids: set[int]) -> TickReport:
    """One second: the CPU job draws B scaled by its MB cap and CPU quota (as in the loop
    test), counted by resctrl; the DNN job slows by S times its share of B."""
    assert sim.rdt is not None
    sim.advance()
    quota = sim.quota_cores(CPU)
    cores = min(float(CPU_CORES), quota if quota is not None else float(CPU_CORES))
    bw = B * sim.mb_pct(CPU) / 100 * cores / CPU_CORES if drawing else 0.0
    sim.node.advance_cpu(CPU, int(cores * 1e9) if drawing else 0)
    _charge(sim.rdt, cpu_tids, bw)
    sim.write_progress(DNN, R0 * (1.0 - S * bw / B))
    return sim.tick()


def _cpu_tids(sim: Sim) -> set[int]:
    return {t for ts in sim.node.jobs[CPU].v1_threads.values() for t in ts}


def test_the_daemon_measures_the_cpu_job_and_caps_it_with_mba_then_cleans_up(
    tmp_path: Path,
) -> None:
    sim = _sim(tmp_path)
    rdt = sim.rdt
    assert rdt is not None
    monitor = sim.daemon.mem_bw_monitor
    assert monitor is not None
    assert sim.daemon.loop.eliminator.mba, "the monitor counts as per-job bandwidth"
    cpu_tids = _cpu_tids(sim)
    for _ in range(ONSET):
        _step(sim, False, cpu_tids)
    # The CPU job has its group, with its threads; the DNN job has none.
    assert monitor.monitored() == {CPU: f"mon_groups/coda_j{CPU}"}
    assert {int(t) for t in rdt.text(f"mon_groups/coda_j{CPU}/tasks").split()} == cpu_tids
    assert sim.daemon.loop.eliminator.cpu_status(CPU) is None  # quiet so far
    view_job = {j["job_id"]: j for j in sim.daemon.state.view["jobs"]}[CPU]
    assert view_job["mem_bw_bytes_per_s"] == 0.0

    for _ in range(30):
        _step(sim, True, cpu_tids)
    throttles = sim.events("throttle", CPU)
    assert throttles, sim.timeline
    t_first, first = throttles[0]
    assert ONSET <= t_first <= ONSET + 2
    # What the eliminator saw is what resctrl counted: B, in both sockets together.
    assert first["reading"]["mem_bw_bytes_per_s"] == pytest.approx(B)
    assert first["reason"].startswith("memory bandwidth capped at MB 70%")
    mba = [e["reading"]["mem_bw_bytes_per_s"] for _, e in throttles if "MB" in e["reason"]]
    assert mba == pytest.approx([B, 0.7 * B, 0.5 * B, 0.3 * B])
    assert [e["reading"]["level"] for _, e in throttles] == [1, 2, 3, 4]
    assert sim.quota_cores(CPU) is None
    assert sim.mb_pct(CPU) == 10
    assert "MB:0= 10;1= 10" in rdt.text("coda_mb10/schemata")
    # The MON group followed the job into its capped group.
    assert monitor.monitored() == {CPU: f"coda_mb10/mon_groups/coda_j{CPU}"}
    assert {int(t) for t in rdt.text(f"coda_mb10/mon_groups/coda_j{CPU}/tasks").split()} == (
        cpu_tids
    )
    assert monitor.rate(CPU) == pytest.approx(0.1 * B)
    rate, base = sim.rate(DNN), sim.baseline(DNN)
    assert rate is not None and base is not None and rate >= 0.9 * base
    node_view = sim.daemon.state.view["node"]
    assert node_view["mem_bw_monitor"] == {
        "state": "on",
        "event": "mbm_total_bytes",
        "num_rmids": 224,
        "monitored": [CPU],
        "unmonitored": [],
    }
    cap = next(c for c in node_view["capabilities"] if c["name"] == "per-job memory bandwidth")
    assert cap == {
        "name": "per-job memory bandwidth",
        "available": True,
        "detail": "resctrl MBM (mbm_total_bytes): 1 CPU job(s) measured",
    }

    # Quiet: released step by step, and the MON group follows the threads back to the root.
    for _ in range(40):
        _step(sim, False, cpu_tids)
    assert [e["what"] for _, e in sim.events("release", CPU)] == ["release"]
    assert sim.coda_groups() == [] and CPU not in sim.daemon.state.changes
    assert monitor.monitored() == {CPU: f"mon_groups/coda_j{CPU}"}
    assert {int(t) for t in rdt.text(f"mon_groups/coda_j{CPU}/tasks").split()} == cpu_tids
    assert monitor.rate(CPU) == 0.0

    # SIGTERM's restore: no coda group of any kind is left, every thread is in the root.
    sim.daemon.restore()
    assert sorted(p.name for p in rdt.path.rglob("coda_*")) == []
    assert cpu_tids <= {int(t) for t in rdt.text("tasks").split()}


def test_without_mbm_the_daemon_makes_no_group_and_caps_with_cpu_quota(tmp_path: Path) -> None:
    sim = _sim(tmp_path, "nombm")
    rdt = sim.rdt
    assert rdt is not None
    assert sim.daemon.mem_bw_monitor is None
    assert "neither mbm_total_bytes nor mbm_local_bytes" in (sim.daemon.mem_bw.off or "")
    assert not sim.daemon.loop.eliminator.mba
    cpu_tids = _cpu_tids(sim)
    for _ in range(ONSET):
        _step(sim, False, cpu_tids)
    for _ in range(30):
        _step(sim, True, cpu_tids)
    reasons = [e["reason"] for _, e in sim.events("throttle", CPU)]
    assert reasons and not any("memory bandwidth" in r for r in reasons)
    assert any(r.startswith("CPU capped at") for r in reasons), reasons
    assert sim.quota_cores(CPU) is not None
    assert list(rdt.path.rglob("mon_groups/coda_*")) == []
    assert list(rdt.path.glob("coda_mb*")) == []
    view = sim.daemon.state.view["node"]
    assert view["mem_bw_monitor"]["state"].startswith("no memory-bandwidth monitoring")
    assert all(c["name"] != "per-job memory bandwidth" for c in view["capabilities"])


def test_node_job_mem_bw_no_turns_the_monitor_off(tmp_path: Path) -> None:
    sim = _sim(tmp_path, conf_extra="NodeJobMemBw=no\n")
    assert sim.cfg.node_job_mem_bw is False
    assert sim.daemon.mem_bw_monitor is None
    assert not sim.daemon.loop.eliminator.mba
    _step(sim, False, _cpu_tids(sim))
    assert sim.rdt is not None and list(sim.rdt.path.rglob("coda_j*")) == []
    view = sim.daemon.state.view["node"]
    assert view["mem_bw_monitor"] == {"state": "off (NodeJobMemBw=no)"}
    cap = next(c for c in view["capabilities"] if c["name"] == "per-job memory bandwidth")
    assert cap["available"] is False and cap["detail"] == "resctrl MBM: off (NodeJobMemBw=no)"


def test_restore_with_the_monitor_off_removes_groups_a_killed_daemon_left(tmp_path: Path) -> None:
    """A daemon SIGKILLed while NodeJobMemBw=yes, restarted with it off: its groups still
    hold RMIDs, and `coda-node restore` (or the stop) must give them back."""
    sim = _sim(tmp_path, conf_extra="NodeJobMemBw=no\n")
    assert sim.rdt is not None and sim.daemon.mem_bw_monitor is None
    control = sim.rdt.control()
    control.ensure_mon_group("", "coda_j5002")
    sim.rdt.mkdir(sim.rdt.path / "mon_groups" / "other_tool")  # not ours: left alone
    sim.daemon.restore()
    assert list(sim.rdt.path.rglob("coda_j*")) == []
    assert (sim.rdt.path / "mon_groups" / "other_tool").is_dir()
