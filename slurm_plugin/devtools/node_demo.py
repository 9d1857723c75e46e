"""The node half of the README demo: coda-node on real, cgroup-confined Slurm jobs.

A private one-node cluster with ``ConstrainCores=yes`` (this host's real CPUs), a GPU job
and a CPU-bound job; the daemon lists them with their cores, GPUs and CPU use, caps the
CPU job's CPU time and slims the GPU job's cpuset, and puts both back.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from coda_common.config.codaconf import load_config
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import Limit, save_limits
from coda_node.status.document import load_status
from coda_node.status.text import render
from slurm_plugin.devtools.cluster import DevCluster


def _cgroup_v1_missing() -> str | None:
    mounts = Path("/proc/self/mounts").read_text()
    if " /sys/fs/cgroup/cpuset cgroup " not in mounts:
        return "no cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset"
    return None


def _wait_running(cluster: DevCluster, job_id: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cluster.show_job(job_id).get("JobState") == "RUNNING":
            time.sleep(0.5)  # the batch step's cgroup is made just after RUNNING
            return
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} did not start")


def run() -> int:
    out = sys.stdout.write
    missing = _cgroup_v1_missing()
    if missing:
        out(f"\n(node demo skipped: {missing})\n")
        return 0
    root = Path(tempfile.mkdtemp(prefix="coda-node-demo-"))
    cluster = DevCluster(root, cgroups=True)
    out(
        "\nThe node side: coda-node on real jobs confined by Slurm's cgroups "
        f"(ConstrainCores=yes), in {root}\n"
    )
    cluster.up()
    try:
        gpu_job, _ = cluster.sbatch(["--gpus=1", "-c2", "-J", "train"], "#!/bin/sh\nsleep 120\n")
        _wait_running(cluster, gpu_job)
        daemon = Daemon(load_config(cluster.coda_conf))
        daemon.start()
        daemon.tick()
        time.sleep(1.0)
        daemon.tick()
        out("\n$ coda-node status\n")
        doc = load_status(daemon.state_file.view_path, interval_s=1.0)
        out(render(doc, width=100) + "\n")

        out(f"\n$ coda-node limit {gpu_job} --cores 1      # slim the GPU job to one core\n")
        save_limits(cluster.node_state_dir, {gpu_job: Limit(cores=1, reason="demo")})
        daemon.tick()
        cpus = _job_cpus(gpu_job)
        out(f"  job {gpu_job} cpuset.cpus is now {cpus} (Slurm allocated 0-1)\n")

        out(f"\n$ coda-node release {gpu_job}\n")
        save_limits(cluster.node_state_dir, {})
        daemon.tick()
        out(f"  job {gpu_job} cpuset.cpus is back to {_job_cpus(gpu_job)}\n")
        cluster.run(["scancel", str(gpu_job)], check=False)
        time.sleep(1.0)

        busy, _ = cluster.sbatch(["-c1", "-J", "etl"], "#!/bin/bash\nwhile :; do :; done\n")
        _wait_running(cluster, busy)
        daemon.tick()
        time.sleep(1.5)
        before = daemon.tick().snapshot.jobs[busy].cpu_rate_cores or 0.0
        out(f"\n$ coda-node limit {busy} --cpu-quota 0.3   # cap a CPU-bound job\n")
        save_limits(cluster.node_state_dir, {busy: Limit(quota_cores=0.3, reason="demo")})
        daemon.tick()
        out(f"  job {busy} CPU quota is now {_job_quota(busy)}\n")
        time.sleep(2.0)
        after = daemon.tick().snapshot.jobs[busy].cpu_rate_cores or 0.0
        out(f"  measured CPU use: {before:.2f} cores before, {after:.2f} cores after\n")
        out("\n$ coda-node restore       # what systemd runs after the daemon stops\n")
        results = daemon.restore()
        out(f"  restored jobs: {', '.join(str(j) for j in results) or 'none'}\n")
        time.sleep(1.5)
        cluster.run(["scancel", str(busy)], check=False)
    finally:
        cluster.down()
    return 0


def _job_quota(job_id: int) -> str:
    """The CFS quota over the period of the job's cpu cgroup, in cores: coda-node's own
    ``coda/job_<id>`` on cgroup v1, or Slurm's directory where cpu is co-mounted."""
    cpu = Path("/sys/fs/cgroup/cpu")
    for d in [cpu / "coda" / f"job_{job_id}", *cpu.glob(f"slurm*/uid_*/job_{job_id}")]:
        try:
            quota_us = int((d / "cpu.cfs_quota_us").read_text())
            period_us = int((d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota_us > 0:
            return f"{quota_us / period_us:.2f} cores ({quota_us} us per {period_us} us)"
    return "none"


def _job_cpus(job_id: int) -> str:
    hits = list(Path("/sys/fs/cgroup/cpuset").glob(f"slurm*/uid_*/job_{job_id}/cpuset.cpus"))
    return hits[0].read_text().strip() if hits else "?"


if __name__ == "__main__":
    raise SystemExit(run())
