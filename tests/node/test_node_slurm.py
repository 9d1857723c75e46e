"""coda-node against real Slurm jobs confined by real cgroups (v1 cpuset, cpu, cpuacct).

A private cluster with ``ProctrackType=proctrack/cgroup``, ``TaskPlugin=task/cgroup,
task/affinity`` and ``ConstrainCores=yes``, declaring this host's real CPUs, so that
slurmd builds the same cgroup tree it builds on a production node. The daemon shrinks
and restores those cpusets, caps CPU time, survives SIGKILL, and puts everything back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.config.codaconf import load_config
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import Limit, StateFile, load_limits, save_limits
from coda_node.system import cgroups
from slurm_plugin.devtools.cluster import DevCluster
from tests.conftest import cancel_all, require_slurm, started

pytestmark = pytest.mark.slurm

CPUSET = Path("/sys/fs/cgroup/cpuset")
BUSY = "#!/bin/bash\nwhile :; do :; done\n"
SLEEP = "#!/bin/bash\nsleep 600\n"


def _cgroup_v1_reason() -> str | None:
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return "cannot read /proc/self/mounts"
    if not re.search(r"^\S+ /sys/fs/cgroup/cpuset cgroup \S*cpuset", mounts, re.M):
        return "needs a cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset"
    if (os.cpu_count() or 1) < 2:
        return "needs at least 2 CPUs to shrink a cpuset"
    return None


@pytest.fixture(scope="module")
def cg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    # down() cancels the jobs and clears the cgroup tree of a confined cluster.
    yield from started(DevCluster(tmp_path_factory.mktemp("cgslurm"), cgroups=True))


@pytest.fixture
def cluster(cg_cluster: DevCluster) -> Iterator[DevCluster]:
    """The cgroup cluster, with no job and no coda-node limit left from another test."""
    yield cg_cluster
    cancel_all(cg_cluster)
    save_limits(cg_cluster.node_state_dir, {})


def _wait(pred, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _squeue(c: DevCluster) -> set[int]:
    out = c.run(["squeue", "-h", "-o", "%A"]).stdout
    return {int(x) for x in out.split()}


def _job_dir(job_id: int) -> Path | None:
    hits = list(CPUSET.glob(f"slurm*/uid_*/job_{job_id}"))
    return hits[0] if hits else None


def _start(c: DevCluster, args: list[str], script: str) -> tuple[int, Path, list[int]]:
    """Submit and wait until the job's batch step runs in its cgroup."""
    job_id, _ = c.sbatch(args, script)

    def ready() -> tuple[Path, list[int]] | None:
        d = _job_dir(job_id)
        if d is None or not (d / "step_batch" / "tasks").exists():
            return None
        pids = [int(p) for p in (d / "step_batch" / "tasks").read_text().split()]
        return (d, pids) if pids else None

    d, pids = _wait(ready, f"job {job_id} to run")
    return job_id, d, pids


def _allowed(tid: int) -> str:
    text = Path(f"/proc/{tid}/status").read_text()
    return re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.M).group(1)  # type: ignore[union-attr]


def _daemon(c: DevCluster) -> Daemon:
    d = Daemon(load_config(c.coda_conf))
    d.start()
    return d


def _cpu_cgroup(pid: int) -> str:
    """The v1 cpu cgroup ``pid`` is in, from /proc/<pid>/cgroup."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


def _cpu_rate(job_dir: Path, seconds: float) -> float:
    """Cores' worth of CPU the job used over ``seconds`` (cpuacct.usage, nanoseconds)."""
    acct = Path(str(job_dir).replace("/cpuset/", "/cpuacct/")) / "cpuacct.usage"
    t0, u0 = time.monotonic(), int(acct.read_text())
    time.sleep(seconds)
    t1, u1 = time.monotonic(), int(acct.read_text())
    return (u1 - u0) / 1e9 / (t1 - t0)


def test_daemon_sees_every_job_with_its_cores_gpus_and_record(cluster: DevCluster) -> None:
    gpu_job, gpu_dir, _ = _start(cluster, ["--gpus=1", "-c1", "-J", "train"], SLEEP)
    cpu_job, cpu_dir, _ = _start(cluster, ["-c1", "-J", "etl"], BUSY)
    daemon = _daemon(cluster)
    daemon.tick()
    time.sleep(1.0)
    report = daemon.tick()
    jobs = report.snapshot.jobs
    assert report.snapshot.errors == ()
    assert set(jobs) == _squeue(cluster) == {gpu_job, cpu_job}
    g, c = jobs[gpu_job], jobs[cpu_job]
    assert (g.kind, c.kind) == ("dnn", "cpu")
    # The cores shown are the cores the job's cgroup holds, which are Slurm's CPU_IDs.
    for view, d in ((g, gpu_dir), (c, cpu_dir)):
        assert view.cpus_now == cgroups.parse_cpulist((d / "cpuset.cpus").read_text())
        assert view.cpus_now == view.slurm.cpu_ids  # type: ignore[union-attr]
    # Slurm's GRES index 0 is /dev/nvidia0 of the cluster, a character device of minor 0.
    assert [(r.slurm_index, r.minor) for r in g.gpus] == [(0, 0)]
    assert g.slurm.admin_record is not None and g.slurm.admin_record["gpn"] == "1"  # type: ignore[union-attr]
    # The busy job burns what CPU it gets (about a core on an idle machine, less on a busy
    # one); the sleeping one nearly none.
    assert c.cpu_rate_cores is not None and g.cpu_rate_cores is not None
    assert c.cpu_rate_cores > g.cpu_rate_cores and g.cpu_rate_cores < 0.2
    view = {j["job_id"]: j for j in daemon.state.view["jobs"]}
    assert view[gpu_job]["user"] == "root" and view[gpu_job]["gpus"][0]["slurm_index"] == 0


def test_cpuset_shrunk_and_restored_with_task_affinity(cluster: DevCluster) -> None:
    job_id, d, pids = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"
    before = {tid: _allowed(tid) for tid in pids}
    daemon = _daemon(cluster)
    save_limits(cluster.node_state_dir, {job_id: Limit(cores=1, reason="test")})
    report = daemon.tick()
    assert report.results[job_id].applied == ["cpuset 0"]
    assert (d / "cpuset.cpus").read_text().strip() == "0"
    assert (d / "step_batch" / "cpuset.cpus").read_text().strip() == "0"
    assert {_allowed(t) for t in pids} == {"0"}
    # Nothing changes on the next tick: only differences are written.
    assert daemon.tick().results[job_id].applied == []
    save_limits(cluster.node_state_dir, {})
    report = daemon.tick()
    assert report.results[job_id].applied == ["cpuset restored to 0-1"]
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"
    # Each task is back on the mask Slurm's task/affinity gave it, not the shrunk one.
    assert {t: _allowed(t) for t in pids} == before
    assert StateFile(cluster.node_state_dir).load().changes == {}


def test_cpu_quota_caps_a_busy_job_and_release_frees_it(cluster: DevCluster) -> None:
    job_id, d, pids = _start(cluster, ["-c1"], BUSY)
    daemon = _daemon(cluster)
    daemon.tick()
    save_limits(cluster.node_state_dir, {job_id: Limit(quota_cores=0.25)})
    assert daemon.tick().results[job_id].applied == ["cpu quota 0.25 cores"]
    ours = Path("/sys/fs/cgroup/cpu/coda") / f"job_{job_id}"
    assert (ours / "cpu.cfs_quota_us").read_text().strip() == "25000"
    assert (ours / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert set(pids) <= {int(p) for p in (ours / "tasks").read_text().split()}
    # Under the cap whatever else this machine runs (what it got before the cap, and gets
    # after the release, depends on that, so it is not asserted).
    capped = _cpu_rate(d, 2.0)
    assert capped < 0.4, capped
    save_limits(cluster.node_state_dir, {})
    assert daemon.tick().results[job_id].applied == ["cpu quota released"]
    assert not ours.exists()
    free = {_cpu_cgroup(p) for p in pids}
    assert free and not any(c.startswith("/coda") for c in free), free


def _node_cli(c: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coda_node.cli", *args, "--conf", str(c.coda_conf)],
        capture_output=True,
        text=True,
        timeout=60,
        env=c.env,
    )


def _daemon_process(c: DevCluster) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "coda_node.cli", "run", "--conf", str(c.coda_conf)],
        env=c.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_mid_limit_then_restore_puts_the_job_back(cluster: DevCluster) -> None:
    job_id, d, pids = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    limited = _node_cli(cluster, "limit", str(job_id), "--cores", "1", "--cpu-quota", "0.5")
    assert limited.returncode == 0, limited.stderr
    proc = _daemon_process(cluster)
    try:
        _wait(lambda: (d / "cpuset.cpus").read_text().strip() == "0", "the daemon to shrink")
        _wait(lambda: Path(f"/sys/fs/cgroup/cpu/coda/job_{job_id}").is_dir(), "the quota")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # The daemon died without cleaning up: the job is still slimmed...
    assert (d / "cpuset.cpus").read_text().strip() == "0"
    # ... and `coda-node restore` (what systemd's ExecStopPost runs) puts it back.
    out = _node_cli(cluster, "restore")
    assert out.returncode == 0, out.stderr
    assert f"restored 1 job(s) ({job_id})" in out.stdout
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"
    assert {_allowed(t) for t in pids} == {"0-1"}
    assert not Path(f"/sys/fs/cgroup/cpu/coda/job_{job_id}").exists()
    assert StateFile(cluster.node_state_dir).load().changes == {}


def test_restart_after_sigkill_reconciles_to_the_current_limits(cluster: DevCluster) -> None:
    job_id, d, _ = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    save_limits(cluster.node_state_dir, {job_id: Limit(cores=1)})
    proc = _daemon_process(cluster)
    try:
        _wait(lambda: (d / "cpuset.cpus").read_text().strip() == "0", "the daemon to shrink")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # The operator released the job while the daemon was down; a new daemon puts it back.
    save_limits(cluster.node_state_dir, {})
    daemon = _daemon(cluster)
    assert job_id in daemon.state.changes
    report = daemon.tick()
    assert report.results[job_id].applied == ["cpuset restored to 0-1"]
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"


def test_sigterm_restores_every_job(cluster: DevCluster) -> None:
    job_id, d, _ = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    save_limits(cluster.node_state_dir, {job_id: Limit(cpus=(1,))})
    proc = _daemon_process(cluster)
    try:
        _wait(lambda: (d / "cpuset.cpus").read_text().strip() == "1", "the daemon to shrink")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"
    assert f'job={job_id} action="cpuset restored to 0-1" reason="restore"' in err
    # The limit is the operator's and stays recorded; only the job was put back.
    assert load_limits(cluster.node_state_dir) == {job_id: Limit(cpus=(1,))}


def test_a_job_that_ends_while_limited_is_forgotten(cluster: DevCluster) -> None:
    job_id, _d, _ = _start(cluster, ["-c1"], BUSY)
    daemon = _daemon(cluster)
    save_limits(cluster.node_state_dir, {job_id: Limit(quota_cores=0.5)})
    daemon.tick()
    assert Path(f"/sys/fs/cgroup/cpu/coda/job_{job_id}").is_dir()
    cluster.run(["scancel", str(job_id)])
    _wait(lambda: _job_dir(job_id) is None, "the job's cgroup to go")
    report = daemon.tick()
    assert report.results[job_id].gone
    assert job_id not in daemon.state.changes
    assert not Path(f"/sys/fs/cgroup/cpu/coda/job_{job_id}").exists()


def test_status_cli_shows_the_jobs_squeue_shows(cluster: DevCluster) -> None:
    job_id, gpu_dir, _ = _start(cluster, ["--gpus=1", "-c1"], SLEEP)
    cpu_job, cpu_dir, _ = _start(cluster, ["-c1"], SLEEP)
    out = _node_cli(cluster, "run", "--once")
    assert out.returncode == 0, out.stderr
    status = _node_cli(cluster, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("JOBID"))
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [int(r[0]) for r in rows] == sorted(_squeue(cluster)) == [job_id, cpu_job]
    assert [r[2] for r in rows] == ["DNN", "CPU"]
    # --json: exactly the jobs squeue shows, with the cores their cgroups hold.
    as_json = _node_cli(cluster, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    jobs = {j["job_id"]: j for j in json.loads(as_json.stdout)["jobs"]}
    assert set(jobs) == _squeue(cluster)
    for jid, d in ((job_id, gpu_dir), (cpu_job, cpu_dir)):
        held = (d / "cpuset.cpus").read_text().strip()
        assert jobs[jid]["cpus_now"] == held
        assert jobs[jid]["cores_now"] == len(cgroups.parse_cpulist(held)) == 1


def test_observe_only_changes_nothing(cluster: DevCluster, tmp_path: Path) -> None:
    job_id, d, _ = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    conf = tmp_path / "coda.conf"
    conf.write_text(cluster.coda_conf.read_text() + "NodeEnforce=\n")
    (tmp_path / "slurm.conf").symlink_to(cluster.slurm_conf)
    (tmp_path / "gres.conf").symlink_to(cluster.slurm_conf.with_name("gres.conf"))
    save_limits(cluster.node_state_dir, {job_id: Limit(cores=1)})
    daemon = Daemon(load_config(conf))
    daemon.start()
    report = daemon.tick()
    assert report.results.get(job_id) is None or report.results[job_id].applied == []
    assert (d / "cpuset.cpus").read_text().strip() == "0-1"
