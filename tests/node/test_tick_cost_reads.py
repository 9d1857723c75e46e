"""What a tick that reads only what changed still does: the daemon reads little of a limited
job's cgroup tree each tick, and none of it may cost a user what the full reads gave.

A tick on the fixture node (tests/node/node_fixtures.py: 64 CPUs, 32 jobs, cgroup v1 with the
cpu controller mounted alone, so a CPU quota lives in coda's own ``<cpu>/coda/job_<id>``)
reads a limited job's steps' CPUs and mems only when its directories change, and its
tasks only where a limit acts on tasks (a quota that moves them, a resctrl group). Each
test makes a change a real node sees and asserts what an operator or a user would notice:
the bytes in the job's cgroup files, where its threads are, what ``coda-node status`` shows.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from coda_node.daemon.service import Daemon
from coda_node.enforce.enforcer import VERIFY_EVERY_TICKS
from coda_node.enforce.state import Limit
from coda_node.status.document import load_status
from tests.node.cgroup_fixtures import proc_thread
from tests.node.node_fixtures import FakeNode, build_node

# Job 5001 is a GPU job on CPUs 0-1,32 (step 0's task_0 on 0-1, task_1 on 32); 5002 a CPU
# job on CPU 33; 5003 a GPU job on 2-3,34; 5004 a CPU job.
GPU_JOB, CPU_JOB, GPU_JOB_2, CPU_JOB_2 = 5001, 5002, 5003, 5004
SETTLE_TICKS = 4  # the first tick writes, the second checks in full and finds nothing to do


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return build_node(tmp_path)


def _settled(node: FakeNode, limits: dict[int, Limit]) -> Daemon:
    node.set_limits(limits)
    daemon = node.daemon()
    for _ in range(SETTLE_TICKS):
        daemon.tick()
    return daemon


def _cpu_tasks(node: FakeNode, job_id: int) -> set[int]:
    return {int(t) for t in (node.cpu_dir(job_id) / "tasks").read_text().split()}


def test_a_step_cpuset_rewritten_behind_the_daemons_back_is_put_right_within_the_verify_period(
    node: FakeNode,
) -> None:
    # The steps' CPUs of a settled job are served from what the sampler kept, so a step's
    # cpuset someone narrowed is no longer seen by the next sample; the enforcer's full
    # check, every VERIFY_EVERY_TICKS ticks, reads the files itself and puts it right.
    daemon = _settled(node, {GPU_JOB: Limit(cores=2)})
    shrunk = node.cpuset_texts(GPU_JOB)
    assert shrunk["."] == shrunk["step_batch"] == "0-1\n"
    count = len(node.journal)
    batch = node.job_dir(GPU_JOB) / "step_batch/cpuset.cpus"
    batch.write_text("1\n")  # a legal v1 write: a leaf narrowed within its parent
    for _ in range(VERIFY_EVERY_TICKS):
        daemon.tick()
        if batch.read_text() == "0-1\n":
            break
    assert batch.read_text() == "0-1\n", f"not put right in {VERIFY_EVERY_TICKS} ticks"
    assert node.job_journal(GPU_JOB)[count:] == [("step_batch/cpuset.cpus", b"0-1")]
    assert node.cpuset_texts(GPU_JOB) == shrunk


def test_a_task_adopted_into_a_quota_limited_job_is_held_at_the_next_tick(
    node: FakeNode,
) -> None:
    # pam_slurm_adopt puts an ssh session into the job's extern step: a new task in a
    # directory that already existed (no new step), in slurmd's cpu cgroup, outside the
    # quota. The job's tasks are read every tick while a quota moves them, so the settled
    # job's new task is moved into coda's cpu cgroup at once.
    daemon = _settled(node, {CPU_JOB: Limit(quota_cores=0.5)})
    job = node.jobs[CPU_JOB]
    assert _cpu_tasks(node, CPU_JOB) == set(job.all_tids) - {job.tid(12), job.tid(13)}
    tid = job.tid(15)  # no thread of the fixture's
    extern = node.job_dir(CPU_JOB) / "step_extern/tasks"
    extern.write_text(extern.read_text() + f"{tid}\n")
    slurmd = node.cpu_mount / "system.slice/slurmd.service/tasks"
    slurmd.write_text(slurmd.read_text() + f"{tid}\n")
    # In the extern step as its sleep is, but in the cpu hierarchy where sshd forked it.
    lines = (node.root / f"proc/{job.tid(0)}/cgroup").read_text()
    assert f"4:cpu:/coda/job_{CPU_JOB}\n" in lines
    lines = lines.replace(f"4:cpu:/coda/job_{CPU_JOB}\n", "4:cpu:/system.slice/slurmd.service\n")
    proc_thread(node.root, tid, "bash", 0, 0, lines)

    daemon.tick()
    assert tid in _cpu_tasks(node, CPU_JOB)
    assert f"4:cpu:/coda/job_{CPU_JOB}\n" in (node.root / f"proc/{tid}/cgroup").read_text()
    assert str(tid) not in slurmd.read_text().split()


def test_a_limit_changed_from_cpuset_to_quota_moves_the_jobs_threads_at_once(
    node: FakeNode,
) -> None:
    # A cpuset limit needs the job's steps but not its tasks; a quota needs its tasks. The
    # tick that sees the new limit reads them, and every thread is held from that tick.
    daemon = _settled(node, {GPU_JOB_2: Limit(cores=2)})
    assert node.cpuset_texts(GPU_JOB_2)["."] == "2-3\n"
    assert not node.cpu_dir(GPU_JOB_2).exists()
    node.set_limits({GPU_JOB_2: Limit(quota_cores=0.25)})
    report = daemon.tick()
    assert report.results[GPU_JOB_2].applied == [
        "cpuset restored to 2-3,34",
        "cpu quota 0.25 cores",
    ]
    job = node.jobs[GPU_JOB_2]
    assert _cpu_tasks(node, GPU_JOB_2) == set(job.all_tids) - {job.tid(12), job.tid(13)}
    assert node.quota_file(GPU_JOB_2).read_text() == "25000\n"


def test_a_step_that_replaced_another_in_a_settled_cpuset_limited_job_is_shrunk_and_restored(
    node: FakeNode,
) -> None:
    # srun in a loop: step 0 ends and step 1 starts between two ticks. The job directory
    # keeps its link count, so its kept listing still names step 0; the stat that checks a
    # kept step's CPUs finds it gone, and the job is read afresh in the same tick. The new
    # step is recorded as Slurm set it before it is shrunk, so a release puts it back.
    daemon = _settled(node, {GPU_JOB: Limit(cores=2)})
    top = node.job_dir(GPU_JOB)
    nlink = top.stat().st_nlink
    shutil.rmtree(top / "step_0")
    node.start_step(GPU_JOB, "1")  # slurmd re-widens the job and gives the step all of it
    assert top.stat().st_nlink == nlink
    assert node.cpuset_texts(GPU_JOB)["step_1"] == "0-1,32\n"

    report = daemon.tick()
    assert [s.name for s in report.snapshot.jobs[GPU_JOB].cgroup.steps] == [  # type: ignore[union-attr]
        "1",
        "batch",
        "extern",
    ]
    texts = node.cpuset_texts(GPU_JOB)
    assert texts["."] == texts["step_1"] == "0-1\n"
    saved = json.loads(node.state_file.read_text())["changes"][str(GPU_JOB)]
    assert saved["cpuset_original"]["cpus"]["step_1"] == "0-1,32"

    node.set_limits({})
    daemon.tick()
    assert node.cpuset_texts(GPU_JOB)["step_1"] == "0-1,32\n"
    assert node.cpuset_texts(GPU_JOB)["."] == "0-1,32\n"


class _Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_status_shows_each_ticks_readings_of_settled_limited_jobs(node: FakeNode) -> None:
    # The status view is written every tick, with that tick's sample, also while the
    # limited jobs are settled and their steps are served from what the sampler kept.
    clock = _Clock()
    node.set_limits({GPU_JOB: Limit(cores=2), CPU_JOB: Limit(quota_cores=0.5)})
    daemon = node.daemon(clock=clock)
    for _ in range(SETTLE_TICKS):
        clock.now_s += 1.0
        daemon.tick()
    writes = len(node.journal)
    for k in (1, 2, 3):
        clock.now_s += 1.0
        node.advance_cpu(GPU_JOB, k * 250_000_000)  # k/4 of a core over the second
        node.advance_cpu(CPU_JOB, k * 100_000_000)
        node.advance_cpu(CPU_JOB_2, 500_000_000)
        daemon.tick()
        doc = load_status(node.view_file, interval_s=node.cfg.node_interval_s)
        assert doc["daemon"]["status"] == "running"
        assert doc["state"]["age_s"] < 5.0
        assert doc["daemon"]["ticks_total"] == SETTLE_TICKS + k
        jobs = {j["job_id"]: j for j in doc["jobs"]}
        assert jobs[GPU_JOB]["cpu_rate_cores"] == pytest.approx(k / 4)
        assert jobs[CPU_JOB]["cpu_rate_cores"] == pytest.approx(k / 10)
        assert jobs[CPU_JOB_2]["cpu_rate_cores"] == pytest.approx(0.5)
        assert jobs[GPU_JOB]["cpus_now"] == "0-1"
        assert jobs[CPU_JOB]["quota_cores"] == 0.5
    assert len(node.journal) == writes  # settled: nothing was written meanwhile
    assert time.time() - doc["state"]["written_unix_s"] < 5.0
