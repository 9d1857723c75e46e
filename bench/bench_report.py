"""How long ``coda-slurm report --json`` takes over a large job summary store.

Writes ``--summaries`` synthetic summaries (default 100,000) into a temporary store, as
``--writers`` nodes would over ``--days`` days (one job in ten on two nodes, users,
accounts and partitions drawn at random, each source of sizing), then runs
``coda-slurm report --json --since ... --until ...`` over them ``--repeats`` times as a
separate process (start-up included) and prints the best wall time:

    .venv/bin/python bench/bench_report.py
    .venv/bin/python bench/bench_report.py --summaries 2000 --writers 8 --repeats 1 \
        --keep /tmp/site/jobs      # the admin guide's example store

The figure goes in docs/benchmarks.md ("Site report over 100,000 job summaries").
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coda_common.store.jobsummary import JobSummary  # noqa: E402
from coda_common.store.summaries import SummaryStore  # noqa: E402

T_END = 1_765_065_600.0  # 2025-12-07 00:00 UTC: the window's end
SOURCES = ("profile", "global", "prior:resnet50", "prior:bert", "default", "none")


def _record(rng: random.Random, gpn: int, nodes: int) -> str | None:
    if rng.random() < 0.05:
        return None
    src = rng.choice(SOURCES)
    was = rng.choice(("", "", "", "cpg:4", "cpg:16"))
    action = "keep" if was and rng.random() < 0.5 else "set"
    cpg = rng.choice((2, 4, 6, 8, 12, 16))
    return (
        f"coda:sig=workload:1000:w{rng.randrange(50)};cpg={cpg};was={was};action={action};"
        f"src={src};gpn={gpn};nodes={nodes}"
    )


def synthetic_job(rng: random.Random, job_id: int, days: int, writers: int) -> list[JobSummary]:
    """One job's summaries: one per node it ran on (one job in ten runs on two)."""
    nodes = 2 if rng.random() < 0.1 else 1
    gpus = rng.choice((1, 2, 4, 8))
    end = T_END - rng.uniform(0, days * 86400.0)
    run_s = rng.uniform(300, 12 * 3600)
    cores = gpus * rng.choice((2, 4, 8, 16))
    record = _record(rng, gpus, nodes)
    user = f"user{rng.randrange(200):03d}"
    first = rng.randrange(writers)
    out = []
    for n in range(nodes):
        sampled = run_s * 0.98
        gpu_sampled = sampled * rng.uniform(0.5, 1.0)
        out.append(
            JobSummary(
                job_id=job_id, node=f"gpu{(first + n) % writers + 1:03d}", user=user,
                uid=1000 + int(user[4:]), account=f"acct{int(user[4:]) % 20:02d}",
                partition=rng.choice(("gpu", "gpu", "gpu-long", "a100")), kind="dnn",
                num_nodes=nodes, start_unix_s=end - run_s, end_unix_s=end, sampled_s=sampled,
                gpus=gpus, gpu_model="NVIDIA A100", cores_allocated=cores,
                cores_mean=float(cores), cpu_used_cores_mean=cores * rng.uniform(0.1, 1.0),
                gpu_util_pct_mean=rng.uniform(20, 99), gpu_sampled_s=gpu_sampled,
                gpu_wait_s=gpu_sampled * rng.random() ** 3,
                idle_core_s=cores * sampled * rng.uniform(0, 0.8), probe_s=0.0, probes=0,
                slim_s=0.0, throttled_s=0.0, protected_s=0.0, profile_state="profiled",
                record=record,
            )
        )  # fmt: skip
    return out


def fill_store(root: Path, summaries: int, days: int, writers: int, seed: int = 7) -> int:
    """Write about ``summaries`` summaries into ``root``; returns how many."""
    rng = random.Random(seed)
    store = SummaryStore(root)
    by_writer: dict[str, list[JobSummary]] = {}
    written, job_id = 0, 1000
    while written < summaries:
        for s in synthetic_job(rng, job_id, days, writers):
            by_writer.setdefault(s.node, []).append(s)
            written += 1
        job_id += 1
    for writer, items in by_writer.items():
        store.append(items, writer)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summaries", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="Fill this directory and keep it.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp) / "jobs"
        t0 = time.perf_counter()
        n = fill_store(root, args.summaries, args.days, args.writers)
        print(f"wrote {n} summaries ({args.writers} writers, {args.days} days) to {root} "
              f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
        since = time.strftime("%Y-%m-%d", time.gmtime(T_END - args.days * 86400))
        until = time.strftime("%Y-%m-%d", time.gmtime(T_END))
        cmd = [str(ROOT / ".venv/bin/coda-slurm"), "report", "--json", "--store", str(root),
               "--since", since, "--until", until]  # fmt: skip
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            best = min(best, time.perf_counter() - t0)
        doc = json.loads(out)
        print(f"coda-slurm report --json over {doc['summaries']} summaries "
              f"({doc['totals']['jobs']} jobs): {best:.2f} s (best of {args.repeats})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
