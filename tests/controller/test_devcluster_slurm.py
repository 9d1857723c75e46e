"""``scripts/dev-cluster`` as an admin uses it: ``down`` leaves no job behind, and ``up
--cgroups`` gives a confined cluster to try coda-node on real jobs from the command line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_plugin.devtools.cluster import CGROUP_SLOT, DevCluster
from tests.conftest import require_slurm
from tests.node.test_node_slurm import _cgroup_v1_reason, _wait

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = [sys.executable, "-m", "slurm_plugin.devtools.cluster"]
CODA_NODE = [sys.executable, "-m", "coda_node.cli"]

# A job whose script, its child and a grandchild that left the script's process group all
# sleep; each writes its pid where the test can find it.
FORKING = """#!/bin/bash
echo $$ >> {pids}
sleep 600 &
echo $! >> {pids}
setsid bash -c 'echo $$ >> {pids}; exec sleep 600' &
wait
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stepds(script_pids: list[int]) -> set[int]:
    """The slurmstepds among the parents of these processes."""
    out = set()
    for pid in script_pids:
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if cmdline.startswith(b"slurmstepd") and _alive(ppid):
            out.add(ppid)
    return out


def test_down_ends_the_running_jobs_of_a_cluster_without_cgroups(tmp_path: Path) -> None:
    require_slurm()
    cluster = DevCluster(tmp_path / "cluster")
    pids_file = tmp_path / "pids"
    try:
        cluster.up()
        for _ in range(2):
            cluster.sbatch(["-c1"], FORKING.format(pids=pids_file))
        _wait(
            lambda: pids_file.exists() and len(pids_file.read_text().split()) == 6,
            "both jobs and their children to start",
        )
        # Of the jobs' processes, only the batch scripts are slurmstepd's children.
        stepds = _stepds([int(p) for p in pids_file.read_text().split()])
        assert len(stepds) == 2
    finally:
        cluster.down()
    pids = [int(p) for p in pids_file.read_text().split()]
    assert [p for p in [*stepds, *pids] if _alive(p)] == []


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def test_up_with_cgroups_lets_an_admin_limit_a_real_job_with_coda_node(tmp_path: Path) -> None:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "confined"
    up = _cli(*DEV_CLUSTER, "up", "--cgroups", "--dir", str(root))
    daemon: subprocess.Popen[str] | None = None
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(re.findall(r"^export (\w+)=(\S+)$", up.stdout, re.M))
        assert set(exports) == {"SLURM_CONF", "CODA_CONF"}
        assert f"{os.cpu_count()} CPUs" in up.stderr and "coda-node limit" in up.stderr
        env = {**os.environ, **exports}
        status = _cli(*DEV_CLUSTER, "status", "--dir", str(root))
        assert "confined" in status.stdout and f"export CODA_CONF={exports['CODA_CONF']}" in (
            status.stdout
        )
        script = root / "tmp" / "sleep.sh"
        script.write_text("#!/bin/bash\nsleep 600\n")
        out = f"--output={root / 'tmp' / 'slurm-%j.out'}"  # not in the repo (the cwd)
        job = _cli("sbatch", "--parsable", "-c2", "--gpus=1", out, str(script), env=env)
        assert job.returncode == 0, job.stderr
        job_id = int(job.stdout.split(";")[0])

        def cpuset() -> str | None:
            hits = list(Path("/sys/fs/cgroup/cpuset").glob(f"slurm*/uid_0/job_{job_id}"))
            return (hits[0] / "cpuset.cpus").read_text().strip() if hits else None

        _wait(lambda: cpuset() == "0-1", "the job to run in its cgroup")
        daemon = subprocess.Popen(
            [*CODA_NODE, "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert _cli(*CODA_NODE, "limit", str(job_id), "--cores", "1", env=env).returncode == 0
        _wait(lambda: cpuset() == "0", "coda-node to keep the job on one core")
        shown = _cli(*CODA_NODE, "status", env=env)
        assert shown.returncode == 0, shown.stderr
        assert re.search(rf"^\s*{job_id} root DNN .* 2 +- +1 ", shown.stdout, re.M), shown.stdout
        assert _cli(*CODA_NODE, "release", str(job_id), env=env).returncode == 0
        _wait(lambda: cpuset() == "0-1", "the job's cores back")
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=20)
        down = _cli(*DEV_CLUSTER, "down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    assert not list(Path("/sys/fs/cgroup/cpuset").glob("slurm_gpu01"))
    time.sleep(0.1)
    assert not CGROUP_SLOT.exists() or str(root) not in CGROUP_SLOT.read_text()
