"""A job whose cgroup cannot be read, on a whole fixture node (tests/node/node_fixtures.py).

A job's own processes can write some of its cgroup files (a job that owns its subtree under
cgroup v2 delegation makes directories and files there), so a file of garbage, or an I/O
error that is not "the job is gone", is that job's trouble alone: every other job is
sampled and enforced in the same tick, the job is named in ``coda-node status``'s errors,
and what coda-node did to it (its limit, its record in the state file) stays exactly as
it is, neither forgotten nor put back, until it reads again or is gone for good.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from coda_node.daemon.tick import cgroups_to_enforce
from coda_node.enforce.state import Limit
from coda_node.policy.targets import JobTarget
from coda_node.system.cgroups import discover_layout, scan_jobs
from tests.node.cgroup_fixtures import build_v1_debian
from tests.node.node_fixtures import FakeNode, build_node

# Job 5001 is a GPU job on CPUs 0-1,32; 5002 a CPU job on CPU 33; 5003 a GPU job on 2-3,34.
GPU_JOB, CPU_JOB, GPU_JOB_2 = 5001, 5002, 5003

GARBAGE = [
    (1, "cpuset.cpus", "not a CPU list: 'garbage'"),
    (2, "cpuset.cpus", "not a CPU list: 'garbage'"),
    (1, "tasks", "not a list of task ids: 'garbage\\n'"),
    (2, "cgroup.procs", "not a list of task ids: 'garbage\\n'"),
]


def _on_disk(node: FakeNode) -> dict[str, Any]:
    return json.loads(node.state_file.read_text())


def _garble(node: FakeNode, job_id: int, name: str) -> list[Path]:
    """Every file ``name`` in the job's tree now holds garbage; the files, sorted."""
    damaged = sorted(node.job_dir(job_id).rglob(name))
    for path in damaged:
        path.write_text("garbage\n")
    return damaged


def _errors_naming(node: FakeNode, job_id: int) -> list[str]:
    """The lines of ``coda-node status``'s errors that say the job cannot be read."""
    errors = node.view()["node"]["errors"]
    return [e for e in errors if e.startswith(f"job {job_id}: cannot read its cgroup (")]


def _writes_under(node: FakeNode, *dirs: Path) -> list[tuple[Path, bytes]]:
    return [(p, d) for p, d in node.journal if any(top in p.parents for top in dirs)]


@pytest.mark.parametrize(("version", "name", "said"), GARBAGE)
def test_a_job_of_garbage_is_named_and_the_other_jobs_are_enforced_in_the_same_tick(
    tmp_path: Path, version: int, name: str, said: str
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    daemon = node.daemon()
    daemon.tick()
    damaged = _garble(node, CPU_JOB, name)
    # A quota acts on tasks: the bad job's tasks are read as well as its CPUs.
    node.set_limits({GPU_JOB_2: Limit(cores=1), CPU_JOB: Limit(quota_cores=0.5)})
    report = daemon.tick()

    assert report.results[GPU_JOB_2].applied == ["cpuset 2"]
    assert node.cpuset_texts(GPU_JOB_2)["."] == "2\n"
    assert GPU_JOB in report.snapshot.jobs and report.snapshot.jobs[GPU_JOB].cgroup is not None
    assert CPU_JOB not in report.results
    assert _writes_under(node, node.job_dir(CPU_JOB), node.cpu_dir(CPU_JOB)) == []
    assert str(CPU_JOB) not in _on_disk(node)["changes"]
    [line] = _errors_naming(node, CPU_JOB)
    assert any(f"{path}: {said}" in line for path in damaged)
    assert CPU_JOB in {j["job_id"] for j in node.view()["jobs"]}  # still listed, from Slurm


def test_an_io_error_on_one_job_is_that_jobs_alone(tmp_path: Path) -> None:
    """A file that cannot be read at all (here a directory where the file belongs: EISDIR),
    not "the job is gone"."""
    fx = build_v1_debian(tmp_path)
    cpus = fx.cg("cpuset/slurm/uid_1001/job_202/cpuset.cpus")
    cpus.unlink()
    cpus.mkdir()
    scan = scan_jobs(discover_layout(fx.root))
    assert set(scan.jobs) == {101}
    assert scan.unreadable == {202: f"{cpus}: Is a directory"}


@pytest.mark.parametrize("version", [1, 2])
def test_a_limited_job_that_turns_unreadable_keeps_its_limit_and_record_until_it_reads_again(
    tmp_path: Path, version: int, caplog: pytest.LogCaptureFixture
) -> None:
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    original = node.cpuset_texts(GPU_JOB)
    daemon = node.daemon()
    node.set_limits({GPU_JOB: Limit(cores=1)})
    daemon.tick()
    limited = node.cpuset_texts(GPU_JOB)
    assert limited["."] == "0\n"
    record = _on_disk(node)["changes"][str(GPU_JOB)]

    top = node.job_dir(GPU_JOB) / "cpuset.cpus"
    top.write_text("0-1,garbage\n")
    node.set_limits({})  # the limit is to be released, but the job cannot be read
    count = len(node.journal)
    with caplog.at_level(logging.INFO, logger="coda-node"):
        for _ in range(3):
            report = daemon.tick()
            assert GPU_JOB not in report.results and GPU_JOB in report.held
            assert _on_disk(node)["changes"] == {str(GPU_JOB): record}
            assert len(_errors_naming(node, GPU_JOB)) == 1
    assert len(node.journal) == count  # nothing written to it, nothing put back
    del limited["."]
    assert {rel: t for rel, t in node.cpuset_texts(GPU_JOB).items() if rel != "."} == limited
    warned = [r for r in caplog.records if f"job {GPU_JOB}: cannot read" in r.getMessage()]
    assert len(warned) == 1  # logged once, not every tick

    top.write_text("0\n")  # readable again, as coda-node left it
    with caplog.at_level(logging.INFO, logger="coda-node"):
        report = daemon.tick()
    assert report.results[GPU_JOB].applied == ["cpuset restored to 0-1,32"]
    assert node.cpuset_texts(GPU_JOB) == original
    assert _on_disk(node)["changes"] == {}
    assert _errors_naming(node, GPU_JOB) == []
    assert any(
        r.getMessage().startswith(f"resolved: job {GPU_JOB}: cannot read") for r in caplog.records
    )


def test_an_unreadable_job_that_then_ends_is_dropped_like_any_ended_job(tmp_path: Path) -> None:
    node = build_node(tmp_path, version=1)
    cpu_dir = node.cpu_dir(GPU_JOB)  # coda's own coda/job_<id> in the v1 cpu hierarchy
    daemon = node.daemon()
    node.set_limits({GPU_JOB: Limit(quota_cores=1.5)})
    daemon.tick()
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == "150000\n"
    threads = (cpu_dir / "tasks").read_text()

    _garble(node, GPU_JOB, "cpuset.cpus")
    report = daemon.tick()
    assert GPU_JOB not in report.results
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == "150000\n"  # the limit holds
    assert (cpu_dir / "tasks").read_text() == threads
    assert set(_on_disk(node)["changes"]) == {str(GPU_JOB)}

    node.remove_job(GPU_JOB)  # gone for good: no directory, and Slurm forgot it
    report = daemon.tick()
    assert report.results[GPU_JOB].gone and report.results[GPU_JOB].failed == []
    assert not cpu_dir.exists()
    assert _on_disk(node)["changes"] == {}
    assert _errors_naming(node, GPU_JOB) == []
    assert daemon.tick().results == {}


def test_restore_puts_back_every_job_but_the_unreadable_one_and_names_it(
    tmp_path: Path,
) -> None:
    node = build_node(tmp_path)
    original = node.cpuset_texts(GPU_JOB_2)
    node.set_limits({GPU_JOB: Limit(cores=1), GPU_JOB_2: Limit(cores=1)})
    node.daemon().tick()
    damaged = node.job_dir(GPU_JOB) / "cpuset.cpus"
    damaged.write_text("garbage\n")
    record = _on_disk(node)["changes"][str(GPU_JOB)]

    # systemd runs `coda-node restore` after the daemon stopped: a fresh process.
    results = node.daemon().restore()

    assert results[GPU_JOB_2].applied == ["cpuset restored to 2-3,34"]
    assert node.cpuset_texts(GPU_JOB_2) == original
    assert results[GPU_JOB].applied == []
    assert results[GPU_JOB].failed == [
        f"cannot read its cgroup ({damaged}: not a CPU list: 'garbage'); left as it is"
    ]
    assert _on_disk(node)["changes"] == {str(GPU_JOB): record}


def test_a_repair_of_every_job_skips_none_and_waits_for_the_unreadable_one(
    tmp_path: Path,
) -> None:
    """No state file (a record lost): ``restore`` puts every job back to Slurm's
    allocation. The unreadable job keeps its repair on record and is named as not put
    back; the next run that can read it puts it back."""
    node = build_node(tmp_path)
    original = {j: node.cpuset_texts(j)["."] for j in (GPU_JOB, GPU_JOB_2)}
    node.set_limits({GPU_JOB: Limit(cores=1), GPU_JOB_2: Limit(cores=1)})
    node.daemon().tick()
    node.set_limits({})
    node.state_file.unlink()
    damaged = node.job_dir(GPU_JOB) / "cpuset.cpus"
    damaged.write_text("garbage\n")

    daemon = node.daemon(start=False)
    daemon.start(put_back=True)
    results = daemon.restore()
    assert results[GPU_JOB_2].applied == ["cpuset restored to 2-3,34 (Slurm's allocation)"]
    assert node.cpuset_texts(GPU_JOB_2)["."] == original[GPU_JOB_2]
    assert results[GPU_JOB].failed == [
        f"repair: waiting: its cgroup cannot be read ({damaged}: not a CPU list: 'garbage')"
    ]
    assert set(_on_disk(node)["repair"]) == {str(GPU_JOB)}

    damaged.write_text("0\n")
    results = daemon.restore()
    assert results[GPU_JOB].applied == ["cpuset restored to 0-1,32 (Slurm's allocation)"]
    assert node.cpuset_texts(GPU_JOB)["."] == original[GPU_JOB]
    assert "repair" not in _on_disk(node)


def test_a_job_that_turns_unreadable_between_the_sample_and_the_plans_read_is_held(
    tmp_path: Path,
) -> None:
    """A target that acts on tasks, for a job the sample read without them: its tasks are
    read after the plan, and a file of garbage there leaves the job out with a failed
    result (held this tick), not the tick stopped."""
    node = build_node(tmp_path, version=1)
    daemon = node.daemon()
    snap = daemon.tick().snapshot
    assert snap.jobs[CPU_JOB].cgroup is not None and snap.jobs[CPU_JOB].cgroup.detail == "cpus"
    _garble(node, CPU_JOB, "tasks")
    targets = {CPU_JOB: JobTarget(quota_cores=0.5), GPU_JOB_2: JobTarget(quota_cores=1.0)}

    cg_jobs, unreadable = cgroups_to_enforce(snap, frozenset(), targets, {}, daemon.layout)

    assert CPU_JOB not in cg_jobs and cg_jobs[GPU_JOB_2].detail == "tasks"
    assert list(unreadable) == [CPU_JOB]
    [why] = unreadable[CPU_JOB].failed
    assert why.startswith("cannot read its cgroup (") and "not a list of task ids" in why
    assert f"{node.job_dir(CPU_JOB)}/" in why  # names the file, in the job's tree
