"""The state file always says how to put back what coda-node changed, whatever it changes
and whenever it dies, on the fixture node (tests/node/node_fixtures.py) in each cgroup layout.

Random mixes of admin limits (cores, CPU lists, CPU quotas, both), releases, steps started
by slurmd (which re-widens the job), restores and crashes at any cgroup write. Before every
write the test reads the state file on disk; after every tick each job must hold what the
daemon planned, and after a crash a new daemon must get there within one tick.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from coda_node.daemon.service import Daemon
from coda_node.enforce.state import REPAIR_ALL, Limit
from coda_node.system.cgroups import format_cpulist, parse_cpulist
from tests.node.node_fixtures import FakeNode, build_node

JOBS = (5001, 5002, 5003)  # a GPU job on 0-1,32, a CPU job on 33, a GPU job on 2-3,34


class Crash(BaseException):
    """Stands in for SIGKILL: nothing catches it, nothing after it runs."""


def _on_disk(node: FakeNode) -> dict[str, Any]:
    try:
        return json.loads(node.state_file.read_text())
    except FileNotFoundError:
        return {"changes": {}}


def _quota_cores(node: FakeNode, job_id: int) -> float | None:
    path = node.quota_file(job_id)
    try:
        text = path.read_text().split()
    except FileNotFoundError:
        return None
    if node.version == 2:
        return None if text[0] == "max" else int(text[0]) / int(text[1])
    quota = int(text[0])
    period = int((path.parent / "cpu.cfs_period_us").read_text())
    return None if quota < 0 else quota / period


def _quota_dir(node: FakeNode, job_id: int) -> Path:
    return node.quota_file(job_id).parent


def _check_covered(node: FakeNode, path: Path) -> None:
    """A write into a job's cpusets or CPU quota must be covered by the record on disk."""
    disk = _on_disk(node)
    repair = disk.get("repair") or {}
    for job_id in node.jobs:
        if str(job_id) in repair or str(REPAIR_ALL) in repair:
            continue  # put back to Slurm's allocation: nothing to record
        record = (disk.get("changes") or {}).get(str(job_id)) or {}
        if path.name == "cpuset.cpus" and node.job_dir(job_id) in path.parents:
            assert record.get("cpuset_original"), f"{path} written with no record on disk"
        quota_dir = _quota_dir(node, job_id)
        into_quota = path.parent == quota_dir and path.name != "cpuset.cpus"
        if into_quota and path.name != "cgroup.subtree_control":
            assert record.get("quota_active"), f"{path} written with no quota record on disk"


def _random_limit(rng: random.Random, node: FakeNode, job_id: int) -> Limit | None:
    cpus = sorted(node.jobs[job_id].cpus)
    kind = rng.choice(["none", "none", "cores", "cpus", "quota", "cores+quota"])
    quota = rng.choice([0.3, 0.5, 1.0])
    if kind == "none":
        return None
    if kind == "cores":
        return Limit(cores=rng.randint(1, len(cpus)))
    if kind == "cpus":
        return Limit(cpus=tuple(sorted(rng.sample(cpus, rng.randint(1, len(cpus))))))
    if kind == "quota":
        return Limit(quota_cores=quota)
    return Limit(cores=rng.randint(1, len(cpus)), quota_cores=quota)


def _expect(node: FakeNode, daemon: Daemon, limits: dict[int, Limit]) -> None:
    """Every job holds its limit's cpuset and quota, or what Slurm gave it."""
    for job_id in JOBS:
        want_cpus = node.jobs[job_id].cpus
        limit = limits.get(job_id)
        view = {j["job_id"]: j for j in daemon.state.view["jobs"]}[job_id]
        if limit is not None and (limit.cores is not None or limit.cpus is not None):
            want_cpus = parse_cpulist(view["cpus_now"])
            assert len(want_cpus) == (limit.cores or len(limit.cpus or ())), view
            assert want_cpus <= node.jobs[job_id].cpus
        texts = node.cpuset_texts(job_id)
        assert texts["."].strip() == format_cpulist(want_cpus), (job_id, limit, texts)
        for rel, text in texts.items():
            assert parse_cpulist(text) <= want_cpus, (job_id, rel, text)
        want_quota = limit.quota_cores if limit is not None else None
        assert _quota_cores(node, job_id) == want_quota, (job_id, limit)
        if node.version == 1 and not node.cpu_comounted and want_quota is None:
            assert not _quota_dir(node, job_id).exists(), job_id


@pytest.mark.parametrize(
    "variant",
    [dict(version=1), dict(version=1, cpu_comounted=True), dict(version=2)],
    ids=["v1", "v1-cpu,cpuacct", "v2"],
)
@pytest.mark.parametrize("seed", range(4))
def test_every_write_is_covered_on_disk_and_a_crash_anywhere_converges(
    tmp_path: Path, variant: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    node = build_node(tmp_path, jobs=3, **variant)
    writes = 0
    crash_at: int | None = None

    def before_write(path: Path, data: bytes) -> None:
        nonlocal writes
        _check_covered(node, path)
        writes += 1
        if crash_at is not None and writes >= crash_at:
            raise Crash(path)

    node.before_write = before_write
    daemon = node.daemon()
    limits: dict[int, Limit] = {}
    steps = 0
    for _ in range(40):
        for job_id in JOBS:
            if rng.random() < 0.5:
                limit = _random_limit(rng, node, job_id)
                if limit is None:
                    limits.pop(job_id, None)
                else:
                    limits[job_id] = limit
        node.set_limits(limits)
        free = [j for j in (5001, 5003) if len(node.jobs[j].later_steps) < 2]
        if free and rng.random() < 0.2:  # the fixture has thread ids for two more steps
            steps += 1
            node.start_step(rng.choice(free), str(steps))
        event = rng.random()
        if event < 0.3:
            crash_at = writes + rng.randint(1, 6)
            with contextlib.suppress(Crash):
                daemon.tick()
            crash_at = None
            daemon = node.daemon()  # a new process, from what is on disk
        elif event < 0.4:
            daemon.restore()
            for job_id in JOBS:
                assert node.cpuset_texts(job_id)["."].strip() == format_cpulist(
                    node.jobs[job_id].cpus
                )
                assert _quota_cores(node, job_id) is None
        daemon.tick()
        _expect(node, daemon, limits)
    node.set_limits({})
    daemon.tick()
    _expect(node, daemon, {})
    assert _on_disk(node)["changes"] == {}
    if node.version == 1 and not node.cpu_comounted:
        assert not [p for p in (node.cpu_mount / "coda").glob("job_*")]


def test_a_job_waits_shrunk_for_slurm_to_say_its_allocation_and_is_then_repaired(
    tmp_path: Path,
) -> None:
    node = build_node(tmp_path, jobs=3)
    node.set_limits({5001: Limit(cores=1, quota_cores=0.5), 5003: Limit(cores=1)})
    node.daemon().tick()
    shrunk = node.cpuset_texts(5001)["."]
    assert shrunk.strip() == "0" and _quota_cores(node, 5001) == 0.5
    node.set_limits({5003: Limit(cores=1)})
    node.state_file.write_bytes(b"\xff\xfe not a state file")
    node.slurm.error = "Unable to contact slurm controller"

    daemon = node.daemon()
    daemon.tick()
    # No one says what the allocation is: the jobs are left as they are, and say why.
    assert node.cpuset_texts(5001)["."] == shrunk
    errors = "\n".join(daemon.state.view["node"]["errors"])
    assert "job 5001: to be put back to Slurm's allocation" in errors
    assert "waiting for Slurm" in errors and "Unable to contact slurm controller" in errors
    view = {j["job_id"]: j for j in daemon.state.view["jobs"]}
    assert view[5001]["cpus_allocated"] != "0"  # the shrunk cpuset is never the allocation

    # Killed while it waits: the repair is still on disk for the next daemon.
    assert set(_on_disk(node)["repair"]) == {str(j) for j in JOBS}
    node.slurm.error = None
    daemon = node.daemon()
    daemon.tick()
    assert node.cpuset_texts(5001)["."].strip() == format_cpulist(node.jobs[5001].cpus)
    assert _quota_cores(node, 5001) is None
    assert "repair" not in _on_disk(node)
    actions = [e["action"] for e in daemon.state.view["events"] if e["job_id"] == 5001]
    assert actions[:1] == ["state-repair"]
    daemon.tick()  # the limit that is still set applies again, from a fresh record
    kept = parse_cpulist(node.cpuset_texts(5003)["."])
    assert len(kept) == 1 and kept <= node.jobs[5003].cpus
    assert _on_disk(node)["changes"].keys() == {"5003"}


def test_temporary_files_of_killed_writers_are_removed_at_start(tmp_path: Path) -> None:
    node = build_node(tmp_path, jobs=2)
    dead = 4_194_305  # above PID_MAX_LIMIT: never a live process
    runtime = node.cfg.node_runtime_dir
    runtime.mkdir(parents=True, exist_ok=True)
    left = [
        node.state_dir / f".state.json.{dead}.tmp",
        node.state_dir / f".limits.json.{dead}.tmp",
        runtime / f".view.json.{dead}.tmp",
    ]
    alive = runtime / f".view.json.{os.getpid()}.tmp"  # a writer still running
    other = node.state_dir / f".notes.{dead}.tmp"  # not coda-node's
    for path in [*left, alive, other]:
        path.write_text("{")
    node.daemon()
    assert [p for p in left if p.exists()] == []
    assert alive.exists() and other.exists()


@pytest.mark.skipif(shutil.which("runuser") is None, reason="needs runuser(1)")
@pytest.mark.skipif(os.geteuid() != 0, reason="runs coda-node as another user, from root")
def test_restore_as_a_user_says_in_one_line_that_it_needs_root() -> None:
    with tempfile.TemporaryDirectory() as where:  # pytest's tmp_path is root's alone
        tmp_path = Path(where)
        tmp_path.chmod(0o755)
        _restore_as_nobody(tmp_path)


def _restore_as_nobody(tmp_path: Path) -> None:
    conf = tmp_path / "coda.conf"
    conf.write_text(f"NodeStateDir={tmp_path / 'state'}\nNodeRuntimeDir={tmp_path / 'run'}\n")
    (tmp_path / "state").mkdir(mode=0o755)
    (tmp_path / "state" / "state.json").write_bytes(b"\xff")
    coda_node = str(Path(sys.executable).with_name("coda-node"))
    proc = subprocess.run(
        ["runuser", "-u", "nobody", "--", coda_node, "restore", "--conf", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "coda-node: coda-node restore must run as root (it writes the jobs' cgroups and the "
        "state file; try: sudo coda-node restore)"
    ]
    assert (tmp_path / "state" / "state.json").read_bytes() == b"\xff"  # left as it was


def test_coda_cpu_cgroups_no_record_covers_are_removed(tmp_path: Path) -> None:
    """A quota directory whose record is gone (here: the state file deleted by hand) is
    coda's own and no part of any job: the next tick removes it, for a running job (its
    threads go back to the cpu hierarchy's root, uncapped) and for one that ended."""
    node = build_node(tmp_path, jobs=3)
    node.set_limits({5001: Limit(quota_cores=0.5), 5002: Limit(quota_cores=0.5)})
    node.daemon().tick()
    assert node.cpu_dir(5001).is_dir() and node.cpu_dir(5002).is_dir()
    node.state_file.unlink()
    node.set_limits({})
    node.remove_job(5002)
    daemon = node.daemon()
    report = daemon.tick()
    assert not node.cpu_dir(5001).exists() and not node.cpu_dir(5002).exists()
    assert report.results[5001].applied == ["cpu quota released (no record of it)"]
    root_tasks = {int(t) for t in (node.cpu_mount / "tasks").read_text().split()}
    assert {t for ts in node.jobs[5001].v1_threads.values() for t in ts} <= root_tasks
