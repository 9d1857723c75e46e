"""SIGKILL coda-node at random points on the confined dev cluster, many times, and count the
jobs it leaves wrong.

    sudo .venv/bin/python bench/bench_fault_injection.py [--kills 150] [--seed 1] [--dir DIR]

Starts the dev cluster with real cgroups (``DevCluster(cgroups=True)``: proctrack/cgroup,
task/cgroup, ConstrainCores on this host's CPUs; one such cluster per host, so this waits
while another holds the slot), two jobs sharing every CPU (a GPU job and a CPU job), and
the real ``coda-node run`` as a process with NodeIntervalS=0.2. Then ``--kills`` rounds of
tests/node/node_faults.py: new admin limits of mixed kinds (``--cores``, ``--cpus``,
``--cpu-quota``, cores and quota together, releases), SIGKILL at a random moment or a few
milliseconds into the daemon's cgroup writes, sometimes ``coda-node restore`` (systemd's
``ExecStopPost``), a damaged state file or a release while the daemon is down, and a new
daemon. After each restart every job must hold what its current limit says (or Slurm's
allocation: cpuset, every step's cpuset, every thread's affinity, no quota) within 15 s.

Prints the kills, the wrong states (each one named), how many kills landed mid-change (a
job neither as it was nor as the new limits want), and the time from a new daemon's start
until it had put right every job it found wrong (Python's start-up included). Exits 1 when
any job was left wrong.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.node.node_faults import fault_cluster, injector


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=150)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="cluster directory (default: temp)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_fault_injection: needs root (real cgroups, SlurmUser=root)", file=sys.stderr)
        return 2
    root = args.dir or Path(tempfile.mkdtemp(prefix="coda-faults-"))
    slurm = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip()
    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"{slurm}, load average {os.getloadavg()[0]:.2f} at start"
    )
    cluster = fault_cluster(root)
    started = time.monotonic()
    cluster.up()
    try:
        with injector(cluster, seed=args.seed) as inj:
            outcome = inj.run(args.kills)
    finally:
        cluster.down()
    print(outcome.summary())
    for line in outcome.wrong:
        print(f"  wrong: {line}")
    print(
        f"{time.monotonic() - started:.0f} s in all; seed {args.seed}; "
        f"load average {os.getloadavg()[0]:.2f} at the end; daemon logs in {root / 'log'}"
    )
    return 1 if outcome.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
