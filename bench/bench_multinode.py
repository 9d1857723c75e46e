"""The hook's multi-node rule on three traces: ``MultiNodeGpuCap`` and coda-node's measurement.

A job spread over several nodes gets, without a measured figure, ``ceil(cpus_per_gpu *
min(gpus_per_node, MultiNodeGpuCap) / gpus_per_node)`` cores per GPU from its workload's
single-node profile; with ``--multi-node-measured`` each node of a multi-node job writes
its job summary when the job ends and its per-node figure is merged into the job's profile
as coda-node merges it (p90 of the last 16, a starved p90 a floor), which the hook gives
the workload's later multi-node jobs with ``MultiNodeMinSamples`` and ``MultiNodeMargin``
(:meth:`slurm_plugin.sim.profiling.OnlineProfiling.multi_node_ended`). Each row is one
``coda-slurm simulate TRACE -p coda --json`` run per seed: ``cap 2`` (coda.conf's
default), ``cap 8`` (``--coda-conf MultiNodeGpuCap=8``) and ``cap 2, measured`` (with
``--multi-node-measured``), against one ``-p oracle`` run of the same trace and seed:

    .venv/bin/python bench/bench_multinode.py                    # seeds 1,2,3, all traces
    .venv/bin/python bench/bench_multinode.py --trace muri --seeds 1
    .venv/bin/python bench/bench_multinode.py --trace muri --param multi_node_cores_per_gpu=64

The table gives per trace and variant: mean DNN JCT over the oracle's (the mean over the
seeds, each seed's figure in brackets), the same against the default (cap 2, nothing
measured) seed by seed, p99 JCT over the oracle's, GPU busy, mean CPU-job wait and mean
CPU-job stretch (means over the seeds), and how many per-node figures were merged. The
simulations run in this checkout's Python (``python -m slurm_plugin.cli.main``),
``--workers`` at a time (default 2); ``--param`` is a job-model assumption for every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRACES: dict[str, tuple[str, ...]] = {
    "philly": ("philly", "--jobs", "5000", "--load", "0.8", "--cpu-load", "0.3"),
    "muri": ("muri", "--load", "0.8", "--cpu-load", "0.3"),
    "alibaba": ("alibaba", "--load", "0.8"),
}
"""Each trace's arguments: the first 5,000 jobs of Philly, Muri and Alibaba whole."""


@dataclass(frozen=True)
class Variant:
    label: str
    cap: int
    measured: bool


VARIANTS = (
    Variant("cap 2", 2, False),
    Variant("cap 8", 8, False),
    Variant("cap 2, measured", 2, True),
)
TODAY = "cap 2"
"""The reference row: coda.conf's MultiNodeGpuCap=2, nothing measured."""


def simulate(
    args: tuple[str, ...], policy: str, seed: int, v: Variant | None, params: tuple[str, ...]
) -> dict[str, float]:
    argv = [sys.executable, "-m", "slurm_plugin.cli.main", "simulate", *args]
    argv += ["--seed", str(seed), "-p", policy, "--json"]
    for item in params:
        argv += ["--param", item]
    if v is not None:
        argv += ["--coda-conf", f"MultiNodeGpuCap={v.cap}"]
        if v.measured:
            argv.append("--multi-node-measured")
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout)["results"][-1]


def run(
    traces: list[str], seeds: list[int], workers: int, params: tuple[str, ...] = ()
) -> list[dict[str, object]]:
    jobs: list[tuple[str, int, Variant | None]] = []
    for trace in traces:
        for seed in seeds:
            jobs.append((trace, seed, None))
            jobs += [(trace, seed, v) for v in VARIANTS]

    def one(job: tuple[str, int, Variant | None]) -> dict[str, float]:
        trace, seed, v = job
        return simulate(TRACES[trace], "oracle" if v is None else "coda", seed, v, params)

    with ThreadPoolExecutor(workers) as pool:
        got = list(pool.map(one, jobs))
    rows: list[dict[str, object]] = []
    for (trace, seed, v), r in zip(jobs, got, strict=True):
        counters = r.get("counters", {})
        rows.append(
            {
                "trace": trace,
                "seed": seed,
                "params": list(params),
                "variant": "oracle" if v is None else v.label,
                "jct_mean_h": r["dnn_jct_mean_s"] / 3600.0,
                "jct_p99_h": r["dnn_jct_p99_s"] / 3600.0,
                "gpu_busy": r["gpu_busy"],
                "cpu_wait_min": r["cpu_wait_mean_s"] / 60.0,
                "cpu_stretch": r["cpu_stretch_mean"],
                "multi_node_figures": counters.get("multi_node_figures", 0),  # type: ignore[union-attr]
            }
        )
    return rows


def _f(row: dict[str, object], key: str) -> float:
    return float(row[key])  # type: ignore[arg-type]


def _ratios(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.3f}x ({' '.join(f'{x:.3f}' for x in xs)})"


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| trace | variant | mean JCT / oracle | mean JCT / cap 2 | p99 JCT / oracle "
        "| GPU busy | CPU wait | CPU stretch | figures |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    traces = list(dict.fromkeys(str(r["trace"]) for r in rows))
    for trace in traces:
        mine = [r for r in rows if r["trace"] == trace]
        seeds = list(dict.fromkeys(int(r["seed"]) for r in mine))  # type: ignore[call-overload]
        at = {(str(r["variant"]), int(r["seed"])): r for r in mine}  # type: ignore[call-overload]
        for label in dict.fromkeys(str(r["variant"]) for r in mine):
            per = [at[(label, s)] for s in seeds]
            oracle = [at[("oracle", s)] for s in seeds]
            today = [at[(TODAY, s)] for s in seeds]
            mean = [
                _f(r, "jct_mean_h") / _f(o, "jct_mean_h") for r, o in zip(per, oracle, strict=True)
            ]
            vs = [
                _f(r, "jct_mean_h") / _f(t, "jct_mean_h") for r, t in zip(per, today, strict=True)
            ]
            p99 = [
                _f(r, "jct_p99_h") / _f(o, "jct_p99_h") for r, o in zip(per, oracle, strict=True)
            ]
            n = len(seeds)
            lines.append(
                f"| {trace} | {label} | {_ratios(mean)} "
                f"| {'-' if label == 'oracle' else _ratios(vs)} "
                f"| {sum(p99) / n:.3f}x "
                f"| {sum(_f(r, 'gpu_busy') for r in per) / n:.1%} "
                f"| {sum(_f(r, 'cpu_wait_min') for r in per) / n:.1f} min "
                f"| {sum(_f(r, 'cpu_stretch') for r in per) / n:.3f} "
                f"| {sum(int(_f(r, 'multi_node_figures')) for r in per)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--param", action="append", default=[], help="a job-model NAME=VALUE for every run"
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--from", dest="source", type=Path, help="rows from an earlier --json")
    a = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    traces = a.trace or list(TRACES)
    if a.source:
        rows = json.loads(a.source.read_text())
        traces = list(dict.fromkeys(str(r["trace"]) for r in rows))
        seeds = list(dict.fromkeys(int(r["seed"]) for r in rows))
    else:
        rows = run(traces, seeds, a.workers, tuple(a.param))
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    sizes = "; ".join(f"{t}: {' '.join(TRACES[t])}" for t in traces)
    params = "".join(f" --param {p}" for p in rows[0].get("params", ())) if rows else ""
    print(f"coda-slurm simulate{params}, seeds {','.join(map(str, seeds))} ({sizes})")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
