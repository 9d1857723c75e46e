"""Simulator scale: events per second and peak memory at 1k, 10k and 100k GPUs.

Each configuration runs in its own process (peak RSS is per process), on a synthetic trace
(:func:`slurm_plugin.sim.traces.synthetic`: 70 % GPU jobs of 1-32 GPUs, 30 % CPU jobs,
offered GPU load 0.9) on 96-core 8-GPU nodes.

    .venv/bin/python bench/bench_simulate.py                 # the table in docs/benchmarks.md
    .venv/bin/python bench/bench_simulate.py --gpus 10000 --jobs 1000000 --policy slurm
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(gpus: int, jobs: int, policy: str, seed: int) -> dict[str, float]:
    from slurm_plugin.sim.engine import POLICIES, SimParams, simulate
    from slurm_plugin.sim.traces import synthetic
    from slurm_plugin.sim.workloads import JobModel, assign_workloads

    t0 = time.perf_counter()
    trace = synthetic(jobs, n_gpus=gpus, seed=seed)
    model = JobModel()
    wl = assign_workloads(trace, model, seed)
    load_s = time.perf_counter() - t0
    r = simulate(trace, list(trace.node_specs or []), wl, model, POLICIES[policy], SimParams())
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "gpus": gpus,
        "jobs": jobs,
        "policy": policy,
        "events": r.events,
        "sim_s": round(r.wall_s, 2),
        "setup_s": round(load_s, 2),
        "us_per_event": round(1e6 * r.wall_s / max(r.events, 1), 1),
        "peak_rss_mib": round(rss_kib / 1024, 1),
        "finished": r.counters["finished"],
        "shield_settles": r.counters.get("shield_settles", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int)
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one(a.gpus, a.jobs, a.policy, a.seed)))
        return
    if a.gpus:
        configs = [
            (a.gpus, a.jobs or 100 * a.gpus, p)
            for p in ([a.policy] if a.policy else ["slurm", "coda"])
        ]
    else:
        configs = [
            (g, n, p)
            for g, n in ((1_000, 10_000), (10_000, 100_000), (100_000, 1_000_000))
            for p in ("slurm", "coda")
        ]
    print(
        f"{'GPUs':>8} {'jobs':>10} {'policy':>7} {'events':>10} {'sim s':>8} "
        f"{'µs/event':>9} {'peak MiB':>9}"
    )
    for gpus, jobs, policy in configs:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "--gpus",
                str(gpus),
                "--jobs",
                str(jobs),
                "--policy",
                policy,
                "--seed",
                str(a.seed),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout)
        print(
            f"{row['gpus']:>8,} {row['jobs']:>10,} {row['policy']:>7} {row['events']:>10,} "
            f"{row['sim_s']:>8.1f} {row['us_per_event']:>9.1f} {row['peak_rss_mib']:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
