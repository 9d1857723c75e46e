"""The README demo's node half runs end to end on a real, cgroup-confined Slurm."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import require_slurm
from tests.node.test_node_slurm import _cgroup_v1_reason

pytestmark = pytest.mark.slurm


def test_node_demo_slims_caps_and_restores() -> None:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_plugin.devtools.node_demo"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    # JOBID USER KIND GPUS ALLOC PRED NOW: the GPU job, 2 cores allocated and in force.
    assert re.search(r"^\s+1 root\s+DNN\s+0\s+2\s+\S+\s+2\s", out, re.M), out
    assert "job 1 cpuset.cpus is now 0 (Slurm allocated 0-1)" in out
    assert "job 1 cpuset.cpus is back to 0-1" in out
    # The cap is in the kernel, and the job runs under it. What the job used before the cap
    # depends on how busy this machine is, so only the bound is asserted.
    assert "CPU quota is now 0.30 cores (30000 us per 100000 us)" in out, out
    m = re.search(r"measured CPU use: ([0-9.]+) cores before, ([0-9.]+) cores after", out)
    assert m is not None, out
    assert float(m.group(2)) < 0.45
    # The daemon reached slurmctld: `coda-node status` lists Slurm commands as active.
    assert re.search(r"^active: .*Slurm commands", out, re.M), out
    assert "slurmctld unreachable" not in out
