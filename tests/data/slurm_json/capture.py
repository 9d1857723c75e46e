"""Capture the JSON fixtures in this folder from a real Slurm (run as root).

    .venv/bin/python tests/data/slurm_json/capture.py tests/data/slurm_json

starts a private dev cluster whose node declares 2 sockets x 8 cores x 2 threads, submits
a hostile GPU job as ``nobody`` (job name and comment full of `` Key=Value`` text, a
newline, a non-UTF-8 byte), a root GPU job the submit hook records, a CPU job and a pending
job, and writes what coda-node reads: ``<release>-squeue.json`` (``squeue --json``),
``<release>-node.json`` (the node's record) and ``<release>-scontrol.txt`` (``scontrol
-d -o show job``, for the CPU ids Slurm prints). Inside ``tests/slurm-root run SUITE`` it
captures that suite's Slurm; without the plugin built there, pass ``--no-plugin`` and the
hook's record is written with ``scontrol update`` instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import slurm_plugin.devtools.cluster as devcluster

HOSTILE_NAME = b"evil\xff UserId=0(root) JobState=RUNNING AdminComment=coda:sig=workload:*:x"
HOSTILE_COMMENT = (
    "x AdminComment=coda:sig=workload:*:shared;cpg=1;was=;action=set;src=global;gpn=1;"
    "nodes=1 UserId=root(0) JobState=RUNNING\nNodes=gpu01 CPU_IDs=0-31 Mem=0 GRES=gpu:a100:4"
    "(IDX:0-3) Partition=root==x"
)
ROOT_RECORD = "coda:sig=workload:0:resnet;cpg=4;was=;action=set;src=profile;gpn=1;nodes=1"


def main(out: Path, plugin: bool) -> None:
    if not plugin:
        devcluster.install_plugin = lambda *_a, **_k: None  # type: ignore[assignment]
    root = Path("/tmp/coda-capture-cluster")
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    os.chmod(root, 0o755)
    # 2 sockets x 8 cores x 2 threads: the CPU ids Slurm prints differ from the kernel's.
    node = devcluster.NodeSpec(cpus=32, sockets=2, threads_per_core=2)
    c = devcluster.DevCluster(root, node=node, job_submit_plugins="coda" if plugin else "")
    c.up()
    try:
        os.chmod(root / "tmp", 0o777)
        script = root / "tmp" / "job.sh"
        script.write_text("#!/bin/bash\nsleep 600\n")
        script.chmod(0o755)

        def run(argv: list, user: str | None = None) -> bytes:
            if user:
                argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={c.slurm_conf}", *argv]
            p = subprocess.run(argv, env=c.env, capture_output=True, cwd=root / "tmp")
            if p.returncode:
                raise SystemExit(f"{argv} exited {p.returncode}: {p.stderr!r}")
            return p.stdout

        def sbatch(args: list, user: str | None = None) -> int:
            out_ = run(["sbatch", "--parsable", *args, str(script)], user)
            return int(out_.split(b";")[0])

        hostile = sbatch(
            [
                "--gpus-per-node=2",
                "-c",
                "2",
                b"--job-name=" + HOSTILE_NAME,
                f"--comment={HOSTILE_COMMENT}",
            ],
            "nobody",
        )
        gpu = sbatch(["--gpus-per-node=1", "-c", "3", "--comment=coda:workload=resnet"])
        cpu = sbatch(["-n", "3"])
        sbatch(["--begin=now+1hour"])
        if not plugin:
            run(["scontrol", "update", f"job={gpu}", f"AdminComment={ROOT_RECORD}"])
        for _ in range(120):
            states = run(["squeue", "-h", "-o", "%i %T"]).decode()
            if states.count("RUNNING") >= 3:
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"jobs did not start:\n{states}")
        version = run(["scontrol", "--version"]).decode().split()[-1]
        release = ".".join(version.split(".")[:2])
        (out / f"{release}-squeue.json").write_bytes(run(["squeue", "--json"]))
        node = subprocess.run(
            ["scontrol", "show", "node", devcluster.NODE_NAME, "--json"],
            env=c.env,
            capture_output=True,
        )
        node_json = node.stdout if node.returncode == 0 else run(["sinfo", "--json"])
        (out / f"{release}-node.json").write_bytes(node_json)
        text = b"".join(
            run(["scontrol", "-d", "-o", "show", "job", str(j)]) for j in (hostile, gpu, cpu)
        )
        (out / f"{release}-scontrol.txt").write_bytes(text)
        print(f"captured Slurm {version}: jobs {hostile} (hostile), {gpu} (GPU), {cpu} (CPU)")
    finally:
        c.down()


if __name__ == "__main__":
    main(Path(sys.argv[1]), plugin="--no-plugin" not in sys.argv[2:])
