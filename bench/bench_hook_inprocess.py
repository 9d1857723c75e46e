"""In-process cost of slurm_plugin.hook.job_submit(): hot loop vs one call every 8 ms.

Drives the hook through the same cffi calls it makes inside slurmctld (the struct double
from tests/test_hook.py), to separate the Python work from slurmctld's own costs.

    .venv/bin/python bench/bench_hook_inprocess.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm_plugin import hook
from slurm_plugin.store import Profile, ProfileStore
from tests.test_hook import FakeLib, ffi, make_desc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profiles", type=int, default=10_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="coda-bench-"))
    store = ProfileStore(root / "profiles")
    store.ensure_root()
    now = time.time()
    for i in range(args.profiles):
        name = "resnet50" if i == 0 else f"w{i}"
        store.write(
            Profile(
                signature=f"workload:*:{name}",
                workload=name,
                cpus_per_gpu=6,
                confidence=0.95,
                n_samples=8,
                updated_unix_s=now,
                source="bench",
            )
        )
    # The decision journal is on, as in production (a local file, flushed once a second).
    (root / "coda.conf").write_text(
        f"ProfileStore={store.root}\nHookStatsFile=\nDecisionJournal={root / 'decisions.jsonl'}\n"
    )
    (root / "slurm.conf").write_text("NodeName=g1 CPUs=32 Gres=gpu:4\n")
    os.environ["CODA_CONF"] = str(root / "coda.conf")
    lib = FakeLib()
    hook.bind(ffi, lib)
    assert hook.plugin_init() == 1

    def one() -> float:
        desc = make_desc(
            lib,
            tres_per_job="gres:gpu:1",
            comment="coda:workload=resnet50",
            script="#!/bin/sh\nsleep 300\n",
            name="job.sh",
        )
        err = ffi.new("char **")
        t0 = time.perf_counter_ns()
        hook.job_submit(desc, 0, err)
        return (time.perf_counter_ns() - t0) / 1000

    hot = [one() for _ in range(args.calls)]
    cold = []
    for _ in range(args.calls // 10):
        junk = bytearray(8_000_000)  # evict caches, as slurmctld's own work does
        sum(junk[::4096])
        time.sleep(0.008)
        cold.append(one())
    hook.plugin_fini()
    q = statistics.quantiles
    print(
        f"| call pattern | calls | p50 µs | p99 µs |\n|---|--:|--:|--:|\n"
        f"| back to back (hot) | {len(hot)} | {statistics.median(hot):.1f} | "
        f"{q(hot, n=100)[98]:.1f} |\n"
        f"| one every 8 ms, caches evicted (cold) | {len(cold)} | "
        f"{statistics.median(cold):.1f} | {q(cold, n=100)[98]:.1f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
