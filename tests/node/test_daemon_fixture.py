"""coda-node's daemon on a whole fixture node: 64 CPUs, 8 GPUs, 32 Slurm jobs.

Everything the daemon reads is laid out under one root (tests/node/node_fixtures.py); cgroup
writes go through the fixture kernel, which refuses what the real one refuses. Each test
asserts what an operator or a user would see: the jobs ``coda-node status`` lists, the
bytes in the job's cgroup files, what is on disk in the state file, the RPCs slurmctld gets.
"""

from __future__ import annotations

import errno
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from coda_node.enforce.enforcer import VERIFY_EVERY_TICKS
from coda_node.enforce.state import FORMAT_VERSION, Limit, StateNewer
from tests.node.node_fixtures import FakeNode, build_node

# Job 5001 is a GPU job on CPUs 0-1,32 holding Slurm's GPUs 0 and 1; step 0's task_0 is
# bound to 0-1 and task_1 to 32. Job 5002 is a CPU job on CPU 33; 5003 a GPU job on 2-3,34.
GPU_JOB, CPU_JOB, GPU_JOB_2 = 5001, 5002, 5003


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return build_node(tmp_path)


def _on_disk(node: FakeNode) -> dict[str, Any]:
    return json.loads(node.state_file.read_text())


# --------------------------------------------------------------------------------------------
# What one tick sees


@pytest.mark.parametrize(
    "variant,gpu_job_refs",
    [
        # /dev/nvidiaN is minor N; NVML's index order (PCI) puts minors 0 and 1 at 2 and 3.
        (dict(version=1), [(0, 0, 2), (1, 1, 3)]),
        (dict(version=1, cpu_comounted=True), [(0, 0, 2), (1, 1, 3)]),
        (dict(version=2), [(0, 0, 2), (1, 1, 3)]),
        # Device files whose minors are not their names: the minor is read from the device.
        (dict(version=1, dev_minors=(5, 4, 7, 6, 1, 0, 3, 2)), [(0, 5, 7), (1, 4, 6)]),
    ],
    ids=["v1", "v1-cpu,cpuacct", "v2", "v1-dev-minors-permuted"],
)
def test_one_tick_lists_every_job_with_kind_cpus_and_gpus(
    tmp_path: Path, variant: dict[str, Any], gpu_job_refs: list[tuple[int, int, int]]
) -> None:
    node = build_node(tmp_path, **variant)
    report = node.daemon().tick()
    jobs = report.snapshot.jobs

    assert report.snapshot.errors == ()
    assert sorted(jobs) == sorted(node.jobs) and len(jobs) == 32
    assert Counter(v.kind for v in jobs.values()) == {"dnn": 16, "cpu": 16}
    for job_id, job in node.jobs.items():
        view = jobs[job_id]
        assert view.kind == job.kind, job_id
        assert view.cpus_now == job.cpus, job_id  # from the job's cgroup
        assert view.slurm is not None and view.slurm.cpu_ids == job.cpus
        refs = [(r.slurm_index, r.minor, r.nvml_index) for r in view.gpus]
        assert refs == node.expected_gpu_refs(job_id), job_id
    assert [(r.slurm_index, r.minor, r.nvml_index) for r in jobs[GPU_JOB].gpus] == gpu_job_refs
    assert jobs[CPU_JOB].gpus == ()
    # The fixture's NVML order really differs from Slurm's: following the index would be wrong.
    assert any(r.nvml_index != r.slurm_index for v in jobs.values() for r in v.gpus)

    # What `coda-node status` prints comes from the state file: the GPU's utilisation shown
    # for the job is that of the NVML device with the job's minor.
    view = {j["job_id"]: j for j in node.view()["jobs"]}
    util_by_nvml = {i: g.util_pct for i, g in enumerate(node.nvml_lib.gpus)}
    assert [g["util_pct"] for g in view[GPU_JOB]["gpus"]] == [
        float(util_by_nvml[nvml]) for _, _, nvml in gpu_job_refs
    ]
    assert view[GPU_JOB]["cpus_slurm"] == "0-1,32"
    assert view[GPU_JOB]["hook_record"]["cpg"] == "1"


@pytest.mark.parametrize("version", [1, 2])
def test_cpu_time_and_rate_follow_the_cgroup_counters(tmp_path: Path, version: int) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    daemon = node.daemon()
    first = daemon.tick().snapshot.jobs
    assert first[GPU_JOB].cpu_usage_ns == node.cpu_usage_ns(GPU_JOB)
    assert first[GPU_JOB].cpu_rate_cores is None  # one reading is not a rate
    node.advance_cpu(GPU_JOB, 3_000_000_000)
    second = daemon.tick().snapshot.jobs
    assert second[GPU_JOB].cpu_usage_ns == first[GPU_JOB].cpu_usage_ns + 3_000_000_000
    assert second[GPU_JOB].cpu_rate_cores is not None and second[GPU_JOB].cpu_rate_cores > 0
    assert second[CPU_JOB].cpu_rate_cores == 0.0


# --------------------------------------------------------------------------------------------
# Slurm: one RPC per job


def test_scontrol_once_per_job_again_for_a_new_one_and_a_vanished_job_is_dropped(
    node: FakeNode,
) -> None:
    daemon = node.daemon()
    for _ in range(3):
        daemon.tick()
    assert node.slurm.scontrol_counts() == {job_id: 1 for job_id in node.jobs}
    assert node.slurm.squeue_calls() == 0  # the cgroups list the jobs; squeue is not needed

    gone_cpus = node.jobs[CPU_JOB].cpus
    node.remove_job(CPU_JOB)
    new = node.add_job("dnn", gone_cpus, (7,), job_id=6001, name="whisper")
    report = daemon.tick()
    daemon.tick()

    counts = node.slurm.scontrol_counts()
    assert counts[new.job_id] == 1
    assert counts[CPU_JOB] == 1  # not asked again once gone
    assert all(n == 1 for n in counts.values())
    assert CPU_JOB not in report.snapshot.jobs
    assert report.snapshot.jobs[new.job_id].kind == "dnn"
    assert [(r.slurm_index, r.nvml_index) for r in report.snapshot.jobs[new.job_id].gpus] == [
        (7, node.expected_gpu_refs(new.job_id)[0][2])
    ]
    listed = [j["job_id"] for j in node.view()["jobs"]]
    assert CPU_JOB not in listed and new.job_id in listed and len(listed) == 32


def test_tick_survives_slurmctld_being_unreachable(node: FakeNode) -> None:
    node.slurm.error = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    node.set_limits({GPU_JOB: Limit(cores=1)})
    daemon = node.daemon()
    report = daemon.tick()  # must not raise

    jobs = report.snapshot.jobs
    assert sorted(jobs) == sorted(node.jobs)
    assert {v.kind for v in jobs.values()} == {"unknown"}
    assert all(jobs[j].cpus_now == node.jobs[j].cpus for j in node.jobs)
    assert len(report.snapshot.errors) == 1
    assert "Unable to contact slurm controller" in report.snapshot.errors[0]
    assert "Unable to contact" in node.view()["node"]["errors"][0]
    # Limits come from the cgroups, not from slurmctld: they still hold.
    assert report.results[GPU_JOB].applied == ["cpuset 0"]

    node.slurm.error = None
    jobs = daemon.tick().snapshot.jobs
    assert Counter(v.kind for v in jobs.values()) == {"dnn": 16, "cpu": 16}
    assert jobs[GPU_JOB].gpus and jobs[GPU_JOB].slurm is not None


# --------------------------------------------------------------------------------------------
# cpuset limits: exact bytes, nothing written twice, everything put back


@pytest.mark.parametrize(
    "version,limit,written",
    [
        # v1: CPUs a child lacks are added first (parents first), then removed children first.
        (
            1,
            Limit(cores=2),
            [
                ("step_0/task_1/cpuset.cpus", b"0-1"),
                ("step_extern/cpuset.cpus", b"0-1"),
                ("step_batch/cpuset.cpus", b"0-1"),
                ("step_0/cpuset.cpus", b"0-1"),
                ("cpuset.cpus", b"0-1"),
            ],
        ),
        (
            1,
            Limit(cpus=(1, 32)),
            [
                ("step_0/task_0/cpuset.cpus", b"1"),
                ("step_extern/cpuset.cpus", b"1,32"),
                ("step_batch/cpuset.cpus", b"1,32"),
                ("step_0/cpuset.cpus", b"1,32"),
                ("cpuset.cpus", b"1,32"),
            ],
        ),
        # v2: the job and each step's user/ level hold CPUs; the step, slurm/ and task
        # directories inherit (empty cpuset.cpus) and are left alone.
        (
            2,
            Limit(cores=2),
            [
                ("step_extern/user/cpuset.cpus", b"0-1"),
                ("step_batch/user/cpuset.cpus", b"0-1"),
                ("step_0/user/cpuset.cpus", b"0-1"),
                ("cpuset.cpus", b"0-1"),
            ],
        ),
    ],
    ids=["v1-cores", "v1-cpus", "v2-cores"],
)
def test_cpuset_limit_shrinks_once_and_release_restores_slurms_values(
    tmp_path: Path, version: int, limit: Limit, written: list[tuple[str, bytes]]
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    original = node.cpuset_texts(GPU_JOB)
    affinity = dict(node.affinity.masks)
    daemon = node.daemon()
    daemon.tick()
    assert node.journal == []  # no limit, no write

    node.set_limits({GPU_JOB: limit})
    report = daemon.tick()
    assert node.job_journal(GPU_JOB) == written
    assert len(node.journal) == len(written)  # no other job touched
    wanted = written[-1][1].decode()
    assert report.results[GPU_JOB].applied == [f"cpuset {wanted}"]
    assert node.cpuset_texts(GPU_JOB)["."] == wanted + "\n"
    assert report.snapshot.jobs[GPU_JOB].cpus_now == node.jobs[GPU_JOB].cpus  # sampled before
    # Slurm's setting was on disk before the first write.
    saved = _on_disk(node)["changes"][str(GPU_JOB)]["cpuset_original"]["cpus"]
    assert saved == {rel: text.strip() for rel, text in original.items()}

    report = daemon.tick()
    assert len(node.journal) == len(written)  # steady state: nothing written
    assert report.results[GPU_JOB].applied == []
    status = {j["job_id"]: j for j in node.view()["jobs"]}[GPU_JOB]
    assert (status["cpus_now"], status["cpus_allocated"]) == (wanted, "0-1,32")

    node.set_limits({})
    report = daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpuset restored to 0-1,32"]
    assert node.cpuset_texts(GPU_JOB) == original  # every step and task file, byte for byte
    assert node.affinity.masks == affinity
    assert _on_disk(node)["changes"] == {}
    count = len(node.journal)
    daemon.tick()
    assert len(node.journal) == count


@pytest.mark.parametrize("version", [1, 2])
def test_a_job_slurm_rewidens_for_a_new_step_is_shrunk_again_next_tick(
    tmp_path: Path, version: int
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    node.set_limits({GPU_JOB: Limit(cores=1)})
    daemon = node.daemon()
    daemon.tick()
    assert node.cpuset_texts(GPU_JOB)["."] == "0\n"

    tid = node.start_step(GPU_JOB, "1")  # srun: slurmd writes the whole allocation back
    assert node.cpuset_texts(GPU_JOB)["."] == "0-1,32\n"
    before = len(node.job_journal(GPU_JOB))
    report = daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpuset 0"]
    step_cpus = "step_1/user" if version == 2 else "step_1"  # v2: on the step's user/ level
    assert node.job_journal(GPU_JOB)[before:] == [
        (f"{step_cpus}/cpuset.cpus", b"0"),
        ("cpuset.cpus", b"0"),
    ]
    assert node.affinity.masks[tid] == {0, 1, 32}  # the kernel narrows it; no call of ours


def test_a_deep_cpuset_changed_behind_the_daemons_back_is_put_right_within_the_verify_period(
    node: FakeNode,
) -> None:
    # Steady ticks trust the sample (the job's and its steps' CPUs, its tasks) and read a
    # settled job's whole cpuset tree only every VERIFY_EVERY_TICKS ticks. A task directory's
    # cpuset is below what the sample shows; rewritten behind the daemon's back, it must
    # still come back to the limit's value within that period.
    node.set_limits({GPU_JOB: Limit(cores=2)})
    daemon = node.daemon()
    daemon.tick()
    shrunk = node.cpuset_texts(GPU_JOB)
    assert shrunk["."] == "0-1\n"
    assert shrunk["step_0/task_1"] == "0-1\n"
    for _ in range(3):
        daemon.tick()
    count = len(node.journal)
    task_1 = node.job_dir(GPU_JOB) / "step_0/task_1/cpuset.cpus"
    task_1.write_text("1\n")  # someone narrowed it: a legal v1 write
    for _ in range(VERIFY_EVERY_TICKS):
        daemon.tick()
        if task_1.read_text() == "0-1\n":
            break
    assert task_1.read_text() == "0-1\n", f"not put right in {VERIFY_EVERY_TICKS} ticks"
    assert node.job_journal(GPU_JOB)[-1] == ("step_0/task_1/cpuset.cpus", b"0-1")
    assert len(node.journal) == count + 1  # that one file, nothing else
    assert node.cpuset_texts(GPU_JOB) == shrunk


@pytest.mark.parametrize("version", [1, 2])
def test_a_step_started_while_quota_limited_is_held_from_the_next_tick(
    tmp_path: Path, version: int
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    node.set_limits({GPU_JOB: Limit(quota_cores=1.5)})
    daemon = node.daemon()
    for _ in range(4):  # settled: the steady ticks skip the quota files
        daemon.tick()
    tid = node.start_step(GPU_JOB, "1")
    daemon.tick()
    if version == 1:
        # coda's own v1 cpu directory: the new step's thread is moved in at once.
        inside = (node.cpu_dir(GPU_JOB) / "tasks").read_text().split()
        assert str(tid) in inside
        cgroup = (node.root / f"proc/{tid}/cgroup").read_text()
        assert f"4:cpu:/coda/job_{GPU_JOB}\n" in cgroup
    else:
        # v2: the job's cpu.max holds every step below it.
        assert node.quota_file(GPU_JOB).read_text() == "150000 100000\n"


# --------------------------------------------------------------------------------------------
# CPU quota


@pytest.mark.parametrize(
    "variant,quota_bytes,released_text",
    [
        (dict(version=1), b"150000", None),  # coda's own <cpu>/coda/job_<id>, removed after
        (dict(version=1, cpu_comounted=True), b"150000", "-1\n"),  # Slurm's cpu,cpuacct dir
        (dict(version=2), b"150000 100000", "max 100000\n"),
    ],
    ids=["v1-cpu-alone", "v1-cpu,cpuacct", "v2"],
)
def test_quota_limit_writes_the_bandwidth_and_release_puts_it_back(
    tmp_path: Path, variant: dict[str, Any], quota_bytes: bytes, released_text: str | None
) -> None:
    node = build_node(tmp_path, **variant)
    job = node.jobs[GPU_JOB]
    proc_before = node.proc_cgroup_texts(GPU_JOB)
    cpu_dir = node.cpu_dir(GPU_JOB)
    own_dir = variant == dict(version=1)
    assert cpu_dir.is_dir() is not own_dir
    daemon = node.daemon()

    node.set_limits({GPU_JOB: Limit(quota_cores=1.5)})
    report = daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpu quota 1.5 cores"]
    # The period is written only when it is not already the kernel's default 100000 us.
    bandwidth = [(p.name, d) for p, d in node.journal if p.parent == cpu_dir and p.name != "tasks"]
    assert bandwidth == [(node.quota_file(GPU_JOB).name, quota_bytes)]
    assert node.quota_file(GPU_JOB).read_text() == quota_bytes.decode() + "\n"
    if node.version == 2:
        # Slurm's scope has the cpu controller enabled down to every job: nothing to enable.
        assert [p for p, _ in node.journal if p.name.endswith("control")] == []
    if node.version == 1:
        assert (cpu_dir / "cpu.cfs_period_us").read_text() == "100000\n"
    if own_dir:
        # Every thread of the job now sits in coda's directory, and /proc says so.
        inside = {int(t) for t in (cpu_dir / "tasks").read_text().split()}
        assert inside == {t for ts in job.v1_threads.values() for t in ts}
        tid = job.tid(1)
        cgroup = (node.root / f"proc/{tid}/cgroup").read_text()
        assert f"4:cpu:/coda/job_{GPU_JOB}\n" in cgroup
    count = len(node.journal)
    daemon.tick()
    assert len(node.journal) == count  # steady state

    node.set_limits({})
    report = daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpu quota released"]
    if own_dir:
        assert not cpu_dir.exists()
        assert not (node.cpu_mount / "coda" / f"job_{GPU_JOB}").exists()
    else:
        assert node.quota_file(GPU_JOB).read_text() == released_text
    assert node.proc_cgroup_texts(GPU_JOB) == proc_before  # threads back where they were
    assert _on_disk(node)["changes"] == {}


# --------------------------------------------------------------------------------------------
# The state file: write-ahead, crashes, versions


class Crash(BaseException):
    """Stands in for SIGKILL: nothing catches it, nothing after it runs."""


@pytest.mark.parametrize("writes_before_crash", [0, 3], ids=["before-any-write", "mid-shrink"])
def test_crash_after_the_state_save_is_undone_by_restore(
    node: FakeNode, writes_before_crash: int
) -> None:
    original = node.cpuset_texts(GPU_JOB)
    affinity = dict(node.affinity.masks)
    job_dir = node.job_dir(GPU_JOB)
    on_disk_at_crash: list[dict[str, Any]] = []
    writes: list[Path] = []

    def crash(path: Path, data: bytes) -> None:
        if job_dir not in path.parents:
            return
        if len(writes) == writes_before_crash:
            on_disk_at_crash.append(_on_disk(node))
            raise Crash(path)
        writes.append(path)

    node.set_limits({GPU_JOB: Limit(cores=1)})
    node.before_write = crash
    with pytest.raises(Crash):
        node.daemon().tick()
    node.before_write = None

    # Slurm's cpusets and every thread's affinity were on disk before the first write.
    recorded = on_disk_at_crash[0]["changes"][str(GPU_JOB)]["cpuset_original"]
    assert recorded["cpus"] == {rel: text.strip() for rel, text in original.items()}
    assert set(recorded["affinity"]) == {
        str(t) for ts in node.jobs[GPU_JOB].v1_threads.values() for t in ts
    }
    assert (node.cpuset_texts(GPU_JOB) == original) is (writes_before_crash == 0)

    # systemd runs `coda-node restore` after the daemon died: a fresh process, same state dir.
    restarted = node.daemon()
    results = restarted.restore()
    assert list(results) == [GPU_JOB] and results[GPU_JOB].failed == []
    assert node.cpuset_texts(GPU_JOB) == original
    assert node.affinity.masks == affinity
    assert _on_disk(node)["changes"] == {}


def test_state_file_from_a_newer_version_is_refused_and_left_untouched(node: FakeNode) -> None:
    node.state_file.write_text(
        json.dumps(
            {
                "format": "coda-node-state",
                "format_version": FORMAT_VERSION + 1,
                "changes": {str(GPU_JOB): {"cpuset_original": {"job_id": GPU_JOB, "cpus": {}}}},
            }
        )
    )
    before = node.state_file.read_bytes()
    daemon = node.daemon(start=False)
    with pytest.raises(StateNewer) as err:
        daemon.start()
    message = str(err.value)
    assert str(node.state_file) in message and "newer coda-node" in message
    assert "coda-node restore" in message and "upgrade" in message  # what to do
    assert node.state_file.read_bytes() == before
    assert list(node.state_dir.iterdir()) == [node.state_file]
    assert node.journal == []


def _newer(node: FakeNode) -> None:
    data = _on_disk(node)
    data["format_version"] = FORMAT_VERSION + 1
    node.state_file.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "what_is_left",
    [
        ("a file from a newer coda-node", _newer),
        ("no file", lambda node: node.state_file.unlink()),
        ("a damaged file", lambda node: node.state_file.write_bytes(b'{"format": "coda-n')),
    ],
    ids=lambda p: p[0],
)
def test_restore_puts_a_shrunk_job_back_to_slurms_allocation_whatever_the_state_file_says(
    node: FakeNode, what_is_left: tuple[str, Any]
) -> None:
    """A job slimmed to one core, a daemon killed, the limit released meanwhile, and a state
    file this coda-node cannot use: ``restore`` still puts the job back to the CPUs Slurm
    allocated it, and a newer coda-node's file stays byte for byte as it was."""
    original = node.cpuset_texts(GPU_JOB)
    node.set_limits({GPU_JOB: Limit(cores=1)})
    node.daemon().tick()
    assert node.cpuset_texts(GPU_JOB)["."] == "0\n"
    node.set_limits({})
    what_is_left[1](node)
    before = node.state_file.read_bytes() if node.state_file.exists() else None

    daemon = node.daemon(start=False)
    daemon.start(put_back=True)
    results = daemon.restore()
    assert results[GPU_JOB].applied == ["cpuset restored to 0-1,32 (Slurm's allocation)"]
    assert results[GPU_JOB].failed == []
    assert node.cpuset_texts(GPU_JOB)["."] == original["."]
    if what_is_left[0] == "a file from a newer coda-node":
        assert node.state_file.read_bytes() == before
    else:
        assert _on_disk(node)["changes"] == {} and "repair" not in _on_disk(node)


def test_damaged_state_file_is_kept_aside_and_replaced_by_a_repair_of_every_job(
    node: FakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    garbage = b'{"format": "coda-node-state", "format_version": 1, "chan'
    node.state_file.write_bytes(garbage)
    daemon = node.daemon()
    aside = list(node.state_dir.glob("state.json.damaged.*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert f"kept as {aside[0].name}" in caplog.text
    # Before anything is written, the file says every job is to be repaired.
    assert _on_disk(node)["repair"] == {"-1": daemon.state.repair[-1]}
    assert _on_disk(node)["format_version"] == 2
    assert daemon.state.changes == {}

    report = daemon.tick()
    assert len(report.snapshot.jobs) == 32
    assert node.journal == []  # every job holds its allocation: nothing to put back
    assert _on_disk(node)["format_version"] == 1 and "repair" not in _on_disk(node)


# --------------------------------------------------------------------------------------------
# One job's trouble is that job's


def test_job_that_ends_between_sampling_and_the_write_is_forgotten(node: FakeNode) -> None:
    node.set_limits({GPU_JOB: Limit(cores=1), GPU_JOB_2: Limit(cores=1)})
    job_dir = node.job_dir(GPU_JOB)

    def job_ends(path: Path, data: bytes) -> None:
        if job_dir in path.parents:
            node.before_write = None
            node.remove_job(GPU_JOB)  # the write below now finds no file: ENOENT

    node.before_write = job_ends
    daemon = node.daemon()
    report = daemon.tick()

    assert GPU_JOB in report.snapshot.jobs  # it was there when sampled
    assert report.results[GPU_JOB].gone and report.results[GPU_JOB].failed == []
    assert report.results[GPU_JOB_2].applied == ["cpuset 2"]
    assert node.cpuset_texts(GPU_JOB_2)["."] == "2\n"
    assert set(daemon.state.changes) == {GPU_JOB_2}
    assert set(_on_disk(node)["changes"]) == {str(GPU_JOB_2)}

    report = daemon.tick()
    assert GPU_JOB not in report.snapshot.jobs and GPU_JOB not in report.results
    assert report.problems == []  # a limit on a job no longer here is not a problem


def test_a_write_refused_on_one_job_names_the_file_and_the_other_job_is_limited(
    node: FakeNode,
) -> None:
    original = {j: node.cpuset_texts(j) for j in (GPU_JOB, GPU_JOB_2)}
    refused = node.job_dir(GPU_JOB) / "step_batch/cpuset.cpus"
    node.cgroups.kernel.fail[refused] = errno.EACCES
    node.set_limits({GPU_JOB: Limit(cores=1), GPU_JOB_2: Limit(cores=1)})
    daemon = node.daemon()
    report = daemon.tick()

    assert report.results[GPU_JOB].failed == [
        f"cpuset: {refused}: write b'0' failed: Permission denied"
    ]
    assert report.results[GPU_JOB].applied == []
    assert report.results[GPU_JOB_2].applied == ["cpuset 2"]
    assert node.cpuset_texts(GPU_JOB_2)["."] == "2\n"
    status = {j["job_id"]: j for j in node.view()["jobs"]}
    assert status[GPU_JOB]["last_failed"] == report.results[GPU_JOB].failed
    assert any(e["what"].startswith("failed: cpuset: ") for e in node.view()["events"])

    del node.cgroups.kernel.fail[refused]  # the operator fixes the permission
    assert daemon.tick().results[GPU_JOB].applied == ["cpuset 0"]
    node.set_limits({})
    daemon.tick()
    assert {j: node.cpuset_texts(j) for j in original} == original


def test_empty_node_enforce_observes_only(tmp_path: Path) -> None:
    node = build_node(tmp_path, enforce="")
    assert node.cfg.node_enforce == ()
    before = {j: node.cpuset_texts(j) for j in node.jobs}
    node.set_limits({GPU_JOB: Limit(cores=1), CPU_JOB: Limit(quota_cores=0.5)})
    daemon = node.daemon()
    for _ in range(2):
        report = daemon.tick()
    assert set(report.targets) == {GPU_JOB, CPU_JOB}  # planned, shown in status ...
    assert all(not r.applied and not r.failed for r in report.results.values())
    assert node.journal == []  # ... and nothing written
    assert {j: node.cpuset_texts(j) for j in node.jobs} == before
    assert not (node.cpu_mount / "coda").exists()
    assert _on_disk(node)["changes"] == {}


def test_documented_limit_after_a_restart_released_quota_threads_go_to_the_cpu_root(
    node: FakeNode,
) -> None:
    """docs/admin-guide.md, Known limits: where each thread came from is kept in memory."""
    node.set_limits({GPU_JOB: Limit(quota_cores=1.5)})
    node.daemon().tick()
    node.daemon().restore()  # a new process, as after a crash
    assert not node.cpu_dir(GPU_JOB).exists()
    root_tasks = {int(t) for t in (node.cpu_mount / "tasks").read_text().split()}
    job_threads = {t for ts in node.jobs[GPU_JOB].v1_threads.values() for t in ts}
    assert job_threads <= root_tasks
    texts = node.proc_cgroup_texts(GPU_JOB)
    assert all("\n4:cpu:/\n" in texts[t] for t in job_threads)


# --------------------------------------------------------------------------------------------
# Regressions: bugs found by these fixtures and fixed


def test_regression_v2_job_with_inherited_cpuset_does_not_flap(tmp_path: Path) -> None:
    node = build_node(tmp_path, version=2, jobs=4)
    (node.job_dir(GPU_JOB) / "cpuset.cpus").write_text("\n")  # Slurm left it empty: inherits
    node.set_limits({GPU_JOB: Limit(cores=2)})
    daemon = node.daemon()
    daemon.tick()
    count = len(node.journal)
    daemon.tick()
    assert len(node.journal) == count
    assert node.cpuset_texts(GPU_JOB)["."] == "0-1\n"


def test_regression_job_gone_mid_write_leaves_no_coda_cpu_dir(node: FakeNode) -> None:
    node.set_limits({GPU_JOB: Limit(cores=2, quota_cores=1.5)})
    daemon = node.daemon()
    daemon.tick()
    assert node.cpu_dir(GPU_JOB).is_dir()
    node.set_limits({GPU_JOB: Limit(cores=1, quota_cores=1.5)})
    job_dir = node.job_dir(GPU_JOB)

    def job_ends(path: Path, data: bytes) -> None:
        if job_dir in path.parents:
            node.before_write = None
            node.remove_job(GPU_JOB)

    node.before_write = job_ends
    daemon.tick()
    daemon.tick()
    assert not node.cpu_dir(GPU_JOB).exists()


@pytest.mark.parametrize("version", [1, 2])
def test_regression_release_widens_a_step_started_while_limited(
    tmp_path: Path, version: int
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    node.set_limits({GPU_JOB: Limit(cores=1)})
    daemon = node.daemon()
    daemon.tick()
    tid = node.start_step(GPU_JOB, "1")
    daemon.tick()  # step_1 shrunk to 0 with the job
    node.set_limits({})
    daemon.tick()
    step_cpus = "step_1/user" if version == 2 else "step_1"  # v2: on the step's user/ level
    assert node.cpuset_texts(GPU_JOB)[step_cpus] == "0-1,32\n"
    assert node.affinity.masks[tid] == {0, 1, 32}


@pytest.mark.parametrize("changes", [{"job_5001": {}}, {"5001": "cpuset"}])
def test_regression_state_file_with_a_bad_entry_is_treated_as_damaged(
    node: FakeNode, changes: dict[str, Any]
) -> None:
    node.state_file.write_text(
        json.dumps({"format": "coda-node-state", "format_version": 1, "changes": changes})
    )
    node.daemon()
    assert list(node.state_dir.glob("state.json.damaged.*"))


@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        ({"quota_cores": "2"}, "quota_cores is '2', not a number of cores"),
        ({"quota_cores": float("nan")}, "quota_cores is nan, not a number of cores"),
        ({"cores": True}, "cores is True, not a whole number"),
        ({"cpus": "0-3"}, "cpus is '0-3', not a list of CPU numbers"),
        ({"cpus": [0, 10**12]}, "not a list of CPU numbers"),
        (7, "the limit is int, not an object"),
    ],
)
def test_a_damaged_entry_in_the_limits_file_is_named_and_the_other_limits_hold(
    tmp_path: Path, damaged: object, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A hand-edited limits file with one entry coda-node limit would never write: the
    daemon goes on ticking, limits the other job, says which entry it ignores (in the log
    once and in status), and applies nothing for that job."""
    node = build_node(tmp_path)
    daemon = node.daemon()
    node.set_limits({GPU_JOB: Limit(cores=1)})
    path = node.state_dir / "limits.json"
    data = json.loads(path.read_text())
    data["limits"][str(CPU_JOB)] = damaged
    data["limits"]["x"] = {"cores": 1}
    path.write_text(json.dumps(data))
    report = daemon.tick()
    daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpuset 0"]
    assert CPU_JOB not in report.targets
    errors = node.view()["node"]["errors"]
    shown = [e for e in errors if e.startswith(f"{path}: job {CPU_JOB}: ")]
    assert len(shown) == 1 and said in shown[0] and shown[0].endswith("; that limit is ignored")
    assert any(f"{path}: job x: 'x' is not a job id" in e for e in errors)
    assert caplog.text.count(f"job {CPU_JOB}:") == 1  # once, not on every tick


def test_restore_puts_jobs_back_and_says_so_when_the_view_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NodeRuntimeDir replaced by a file (or a full /run): the jobs still go back, the
    record of changes says so, and the view's failure is logged instead of raised."""
    node = build_node(tmp_path)
    original = node.cpuset_texts(GPU_JOB)
    daemon = node.daemon()
    node.set_limits({GPU_JOB: Limit(cores=1)})
    daemon.tick()
    assert node.cpuset_texts(GPU_JOB) != original
    run_dir = node.view_file.parent
    for f in run_dir.iterdir():
        f.unlink()
    run_dir.rmdir()
    run_dir.write_text("not a directory\n")

    results = daemon.restore()

    assert results[GPU_JOB].applied == ["cpuset restored to 0-1,32"]
    assert node.cpuset_texts(GPU_JOB) == original
    assert _on_disk(node)["changes"] == {}
    assert f"cannot write the status view {node.view_file}" in caplog.text
