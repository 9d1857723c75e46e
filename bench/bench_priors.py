"""What priors from names cost a never-seen GPU job in job_submit/coda, side by side.

Loads the plugin's compiled cffi module in process as ``bench/bench_hook_inprocess.py``
does (10,000 users' own profiles, 64 several-word global ones, the starter table and, with
``--global-names N``, N more global ones; journal on, ``DefaultCpusPerGpu=4``)
and submits never-seen batch jobs (a new job name each time: every one misses the decision
memo and is decided), cold (caches evicted, 8 ms between calls), with
``PriorsFromNames=no`` and ``yes`` alternating round by round, for three scripts:

* a 1 KiB training script that names no model (the scan finds nothing);
* the same script with ``--arch alexnet`` (the prior raises the job to 19 per GPU);
* 64 KiB of words that each start a several-word profile name (the most a scan can read
  and check).

A second table times the scan alone (``scan_text`` + ``match``) on scripts of 1 KiB to
100 MiB: its work stops growing at the 64 KiB it reads.

    .venv/bin/python bench/bench_priors.py [--calls 200] [--rounds 4] [--global-names N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_hook_inprocess import Harness, evict

from coda_common.model.starter import STARTER_CONFIDENCE, STARTER_TABLE
from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.decision import priors

TRAIN = (
    "#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH --gpus-per-node=1\n#SBATCH --time=24:00:00\n"
    "#SBATCH --output=logs/%x-%j.out\nset -euo pipefail\nmodule load cuda/12.4 python/3.11\n"
    "source $HOME/venvs/torch/bin/activate\nexport OMP_NUM_THREADS=1\n"
    "export DATA=/scratch/$USER/imagenet\ncd $HOME/projects/vision\n"
    "echo started on $(hostname) at $(date)\n"
    + "# "
    + "notes about this run, kept in the script for the record. " * 8
    + "\n"
    "srun python train.py {arch}--epochs 90 --batch-size 256 --lr 0.1 --workers 8 "
    "--data $DATA --checkpoint-dir $SCRATCH/ckpt/$SLURM_JOB_ID\n"
    "echo done at $(date)\n"
)
SCRIPTS = {
    "1 KiB script, no model named": TRAIN.format(arch=""),
    "1 KiB script, --arch alexnet": TRAIN.format(arch="--arch alexnet "),
    "64 KiB of phrase first words": "#!/bin/sh\n" + ("wfirst " * 9400) + "\n",
}
EXPECT = {  # cpus_per_tres written, by (config, script)
    ("no", "1 KiB script, --arch alexnet"): b"gres:gpu:4",
    ("yes", "1 KiB script, --arch alexnet"): b"gres:gpu:19",
}


def build_store(root: Path, n: int, n_global: int) -> ProfileStore:
    """``n`` users' own profiles, the starter table, 64 several-word global names (the
    hostile script repeats their first word) and ``n_global`` more global names."""
    store = ProfileStore(root / "profiles")
    store.ensure_root()
    now = time.time()
    profiles = [
        Profile(f"workload:{1000 + i % 50}:w{i}", f"w{i}", 6, 0.95, 8, now, "bench")
        for i in range(n)
    ]
    profiles += [
        Profile(f"workload:*:g{i}", f"g{i}", 6, 0.95, 8, now, "bench") for i in range(n_global)
    ]
    profiles += [
        Profile(f"workload:*:wfirst-x{i}", f"wfirst-x{i}", 6, 0.95, 8, now, "bench")
        for i in range(64)
    ]
    profiles += [
        Profile(f"workload:*:{name}", name, e.cores_per_gpu, STARTER_CONFIDENCE, 0, now, "starter")
        for e in STARTER_TABLE
        for name in (e.name, *e.spellings)
    ]
    for p in profiles:
        store.write(p)
    return store


def cold_miss(h: Harness, script: str, tag: str, calls: int, expect: bytes | None) -> list[float]:
    submit = h.submit_fn()
    out = []
    for i in range(calls):
        desc = h.desc(tres_per_job="gres:gpu:1", script=script, name=f"new-{tag}-{i}.sh")
        err = h.ffi.new("char **")
        evict()
        t0 = time.perf_counter_ns()
        submit(desc, 0, err)
        out.append((time.perf_counter_ns() - t0) / 1000)
        got = h.ffi.string(desc.cpus_per_tres) if desc.cpus_per_tres != h.ffi.NULL else None
        if expect is not None:
            assert got == expect, (tag, got)
    return out


def scan_alone(index: priors.PriorIndex, script: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        index.match(priors.scan_text("job.sh", script, None))
        best = min(best, (time.perf_counter_ns() - t0) / 1000)
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profiles", type=int, default=10_000, help="users' own profiles")
    parser.add_argument(
        "--global-names", type=int, default=0, help="more global profiles (priors) besides"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="coda-bench-priors-"))
    h = Harness("compiled", root)
    store = build_store(root, args.profiles, args.global_names)
    (root / "slurm.conf").write_text("NodeName=g1 CPUs=32 Gres=gpu:4\nPartitionName=p Nodes=g1\n")
    os.environ["CODA_CONF"] = str(root / "coda.conf")
    times: dict[tuple[str, str], list[float]] = {}
    rounds: dict[tuple[str, str], list[float]] = {}
    for rnd in range(args.rounds):
        for config in ("no", "yes") if rnd % 2 == 0 else ("yes", "no"):
            (root / "coda.conf").write_text(
                f"ProfileStore={store.root}\nHookStatsFile=\nDefaultCpusPerGpu=4\n"
                f"DecisionJournal={root / 'decisions.jsonl'}\nPriorsFromNames={config}\n"
            )
            assert h.init() == 1
            for label, script in SCRIPTS.items():
                t = cold_miss(
                    h, script, f"{rnd}{config}{len(label)}", args.calls, EXPECT.get((config, label))
                )
                times.setdefault((label, config), []).extend(t)
                rounds.setdefault((label, config), []).append(statistics.median(t))
            h.fini()
    out = (
        f"never-seen GPU jobs, cold, {args.rounds} rounds x {args.calls} calls, "
        f"{args.profiles:,} users' profiles, {args.global_names + 64:,} global ones and the "
        "starter table\n"
        "| script | PriorsFromNames=no p50 µs | yes p50 µs | yes / no "
        "| p50 of each round, no; yes |\n"
        "|---|--:|--:|--:|---|\n"
    )
    for label in SCRIPTS:
        no, yes = times[(label, "no")], times[(label, "yes")]
        per_round = "; ".join(
            ", ".join(f"{v:.0f}" for v in rounds[(label, c)]) for c in ("no", "yes")
        )
        out += (
            f"| {label} | {statistics.median(no):.1f} | {statistics.median(yes):.1f} | "
            f"{statistics.median(yes) / statistics.median(no):.3f} | {per_round} |\n"
        )
    index = priors.PriorIndex(
        {
            p.workload: _view(p)
            for _, p in store.iter_profiles()
            if isinstance(p, Profile) and p.signature.startswith("workload:*:")
        }
    )
    out += "\n| script the scan reads | best of 5, µs |\n|---|--:|\n"
    for size in (1 << 10, 64 << 10, 1 << 20, 100 << 20):
        script = ("wfirst " * (size // 7 + 1))[:size]
        out += (
            f"| {size >> 10:,} KiB of phrase first words | {scan_alone(index, script, 5):.0f} |\n"
        )
    sys.stdout.write(out)
    return 0


def _view(p: Profile) -> Any:
    from coda_common.store.profiles import to_view

    return to_view(p)


if __name__ == "__main__":
    raise SystemExit(main())
