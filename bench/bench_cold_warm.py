"""CODA against the oracle on a cold and a warm profile store, with and without a starter table.

Per trace and seed, one child process builds the run as ``coda-slurm simulate TRACE ARGS
--seed SEED`` does (the CLI's own helpers: trace, cluster, CPU jobs, workloads) and replays
it under:

* ``slurm``: the users' requests;
* ``coda``: the coda policy as ``coda-slurm simulate -p coda`` runs it, an empty store;
* ``coda+table``: the same with the starter table imported (``--starter-table``: each
  model's class sweet spot, a prior for the jobs whose script names their model);
* ``coda+table±30%``: the table with every figure 30 % off, up or down by a fair coin per
  model and seed (``--starter-table-error 0.3``);
* ``perfect``: ``coda`` with every GPU job given its true sweet spot and no probing, the
  eliminator as in ``coda`` (what perfect profiles could give);
* ``oracle``: each job's true sweet spot, no contention.

Each measure is given over the whole trace (the report's own: GPU busy from the
utilisation bins) and over its second half (GPU jobs from the middle GPU submission on,
CPU jobs submitted from then; GPU busy per job:
:func:`slurm_plugin.sim.report.jobs_summary`), as the mean over the seeds with the lowest
and highest seed's figure in brackets: mean and p99 DNN JCT over the oracle's of the same
seed, GPU busy in points against the oracle's, mean CPU wait and CPU stretch. The lines
after the table check the targets the starter table is held to.

    .venv/bin/python bench/bench_cold_warm.py                      # the docs/evaluation.md table
    .venv/bin/python bench/bench_cold_warm.py --trace muri --seeds 1,2
    .venv/bin/python bench/bench_cold_warm.py --json > runs.json   # every run's figures
    .venv/bin/python bench/bench_cold_warm.py --from runs.json     # the table again

Runs ``--workers`` children at a time (default 2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

TRACES: dict[str, tuple[str, ...]] = {
    "philly": ("philly", "--jobs", "5000", "--load", "0.8", "--cpu-load", "0.3"),
    "muri": ("muri", "--load", "0.8", "--cpu-load", "0.3"),
    "alibaba": ("alibaba", "--load", "0.8"),
}
"""Each trace's ``coda-slurm simulate`` arguments: docs/evaluation.md's loads, Philly cut to
its first 5,000 jobs."""

VARIANTS = ("slurm", "coda", "coda+table", "coda+table±30%", "perfect", "oracle")
ERROR = 0.3
"""The starter table's error in ``coda+table±30%``."""


def _child(
    trace_name: str,
    seed: int,
    conf: tuple[str, ...],
    param: tuple[str, ...],
    multi_node_measured: bool = False,
) -> list[dict[str, Any]]:
    """Every variant's summary for one trace and seed (run in its own process)."""
    from slurm_plugin.cli import simulate as cli
    from slurm_plugin.sim.engine import POLICIES, SimParams, _Sim
    from slurm_plugin.sim.report import summarise
    from slurm_plugin.sim.workloads import assign_workloads, starter_table

    args = TRACES[trace_name]
    spec = args[0]
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    trace = cli._loaded_trace(spec, int(opts["--jobs"]) if "--jobs" in opts else None)
    nodes = cli._cluster(trace, None, float(opts["--load"]), "96:8")
    cpu_load = float(opts.get("--cpu-load", 0.0))
    if cpu_load > 0:
        trace = cli._with_cpu_jobs(trace, nodes, cpu_load, seed)
    model = cli._job_model(param)
    named, stage_ms = cli._muri_inputs(trace, spec, model, [])
    wl = assign_workloads(trace, model, seed, named_classes=named)
    base: SimParams = cli._base_params(
        False, cli._checked_coda_conf(conf), stage_ms, None, multi_node_measured
    )

    class Perfect(_Sim):
        """``coda`` with each GPU job's true sweet spot: what perfect profiles give."""

        def _cores(self, j: int, gpn: int, k: int) -> int:
            return self._best_cores(j, gpn, k)

    out = []
    for variant in VARIANTS:
        params, policy, engine = base, POLICIES.get(variant, POLICIES["coda"]), _Sim
        if variant == "coda+table":
            params = replace(base, starter_table=tuple(starter_table(wl, 0.0, seed).items()))
        elif variant == "coda+table±30%":
            params = replace(base, starter_table=tuple(starter_table(wl, ERROR, seed).items()))
        elif variant == "perfect":
            policy, engine = replace(POLICIES["coda"], name="perfect", profile=False), Perfect
        t0 = time.perf_counter()
        sim = engine(trace, nodes, wl, model, policy, params, None)
        sim.run()
        r = sim.result(time.perf_counter() - t0)
        r.policy = variant
        s = summarise(trace, r).as_dict()
        s.pop("counters")
        out.append({"trace": trace_name, "seed": seed, "variant": variant, **s})
    return out


def run(
    traces: list[str],
    seeds: list[int],
    workers: int,
    conf: tuple[str, ...] = (),
    param: tuple[str, ...] = (),
    multi_node_measured: bool = False,
) -> list[dict[str, Any]]:
    def one(job: tuple[str, int]) -> list[dict[str, Any]]:
        trace, seed = job
        argv = [sys.executable, __file__, "--child", trace, "--seeds", str(seed)]
        if multi_node_measured:
            argv.append("--multi-node-measured")
        for item in conf:
            argv += ["--coda-conf", item]
        for item in param:
            argv += ["--param", item]
        proc = subprocess.run(argv, capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    jobs = [(t, sd) for t in traces for sd in seeds]
    with ThreadPoolExecutor(workers) as pool:
        return [row for rows in pool.map(one, jobs) for row in rows]


_MEASURES: tuple[tuple[str, str], ...] = (
    ("jct_mean", "mean JCT / oracle"),
    ("jct_p99", "p99 JCT / oracle"),
    ("busy", "GPU busy − oracle"),
    ("cpu_wait", "CPU wait (min)"),
    ("cpu_stretch", "CPU stretch"),
)


def _figures(r: dict[str, Any], oracle: dict[str, Any], part: str) -> dict[str, float]:
    """One run's figures over ``part`` (``whole`` or ``second half``) against the oracle."""
    if part == "whole":
        s, o = r, oracle
    else:
        s, o = r["second_half"], oracle["second_half"]
    return {
        "jct_mean": s["dnn_jct_mean_s"] / o["dnn_jct_mean_s"],
        "jct_p99": s["dnn_jct_p99_s"] / o["dnn_jct_p99_s"],
        "busy": 100.0 * (s["gpu_busy"] - o["gpu_busy"]),
        "cpu_wait": s["cpu_wait_mean_s"] / 60.0,
        "cpu_stretch": s["cpu_stretch_mean"],
    }


def _cell(key: str, values: list[float]) -> str:
    fmt = {
        "jct_mean": "{:.3f}",
        "jct_p99": "{:.3f}",
        "busy": "{:+.1f}",
        "cpu_wait": "{:.2f}",
        "cpu_stretch": "{:.3f}",
    }[key]
    mean = sum(values) / len(values)
    if len(values) == 1:
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def figures(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """(trace, part, variant) -> measure -> the per-seed figures, in seed order."""
    oracle = {(r["trace"], r["seed"]): r for r in rows if r["variant"] == "oracle"}
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in sorted(rows, key=lambda r: r["seed"]):
        o = oracle[(r["trace"], r["seed"])]
        for part in ("whole", "second half"):
            got = _figures(r, o, part)
            cell = out.setdefault((r["trace"], part, r["variant"]), {})
            for k, v in got.items():
                cell.setdefault(k, []).append(v)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    figs = figures(rows)
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    lines = [
        "| trace | part | policy | " + " | ".join(h for _, h in _MEASURES) + " |",
        "|---|---|---|" + "--:|" * len(_MEASURES),
    ]
    for trace in traces:
        for part in ("whole", "second half"):
            for variant in VARIANTS:
                f = figs.get((trace, part, variant))
                if f is None:
                    continue
                cells = " | ".join(_cell(k, f[k]) for k, _ in _MEASURES)
                lines.append(f"| {trace} | {part} | {variant} | {cells} |")
    return "\n".join(lines)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Whether each target the starter table is held to is met, in words."""
    figs = figures(rows)
    out = []

    def get(trace: str, part: str, variant: str, key: str) -> float | None:
        f = figs.get((trace, part, variant))
        return _mean(f[key]) if f else None

    def say(ok: bool, text: str) -> None:
        out.append(f"{'met' if ok else 'NOT met'}: {text}")

    m = get("philly", "whole", "coda+table", "jct_mean")
    if m is not None:
        say(m <= 1.03, f"philly, table: mean JCT {m:.3f}x the oracle's (at most 1.03)")
        err = get("philly", "whole", "coda+table±30%", "jct_mean")
        none = get("philly", "whole", "coda", "jct_mean")
        if err is not None and none is not None:
            say(err < none, f"philly, table ±30 %: {err:.3f}x, below no table's {none:.3f}x")
    for trace in ("philly", "muri"):
        m = get(trace, "second half", "coda+table", "jct_mean")
        b = get(trace, "second half", "coda+table", "busy")
        if m is not None and b is not None:
            say(m <= 1.05, f"{trace}, second half, table: mean JCT {m:.3f}x the oracle's (<= 1.05)")
            say(b >= -3.0, f"{trace}, second half, table: GPU busy {b:+.1f} points (within 3)")
    f = figs.get(("alibaba", "second half", "coda+table"))
    p = figs.get(("alibaba", "second half", "perfect"))
    if f and p:
        ratio = _mean([a / b for a, b in zip(f["jct_mean"], p["jct_mean"], strict=True)])
        say(
            ratio <= 1.05, f"alibaba, second half, table: mean JCT {ratio:.3f}x perfect's (<= 1.05)"
        )
    for trace in dict.fromkeys(r["trace"] for r in rows):
        for key, name in (("cpu_wait", "CPU wait"), ("cpu_stretch", "CPU stretch")):
            c = figs.get((trace, "whole", "coda"))
            t = figs.get((trace, "whole", "coda+table"))
            if c and t:
                say(
                    _mean(t[key]) <= max(c[key]),
                    f"{trace}, table: {name} {_mean(t[key]):.3f} against no table's seeds "
                    f"({min(c[key]):.3f}–{max(c[key]):.3f})",
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--coda-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a coda.conf setting for every coda run (coda-slurm simulate --coda-conf)",
    )
    ap.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a simulator assumption for every run (coda-slurm simulate --param)",
    )
    ap.add_argument(
        "--multi-node-measured",
        action="store_true",
        help="multi-node jobs' per-node figures merged into their profiles in every coda run "
        "(coda-slurm simulate --multi-node-measured)",
    )
    ap.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    ap.add_argument("--from", dest="source", type=Path, help="runs from an earlier --json")
    ap.add_argument("--child", metavar="TRACE", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    if a.child:
        got = _child(a.child, seeds[0], tuple(a.coda_conf), tuple(a.param), a.multi_node_measured)
        print(json.dumps(got, default=str))
        return 0
    t0 = time.perf_counter()
    traces = a.trace or list(TRACES)
    if a.source:
        rows = json.loads(a.source.read_text())
        traces = list(dict.fromkeys(r["trace"] for r in rows))
        seeds = sorted({int(r["seed"]) for r in rows})
    else:
        rows = run(
            traces, seeds, a.workers, tuple(a.coda_conf), tuple(a.param), a.multi_node_measured
        )
    if a.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    sizes = "; ".join(f"{t}: {' '.join(TRACES[t])}" for t in traces)
    conf = "".join(f" --coda-conf {c}" for c in a.coda_conf)
    conf += "".join(f" --param {p}" for p in a.param)
    conf += " --multi-node-measured" if a.multi_node_measured else ""
    print(f"coda-slurm simulate{conf}, seeds {','.join(map(str, seeds))} ({sizes})")
    print(table(rows))
    print()
    for line in targets(rows):
        print(line)
    print(f"\n{len(rows)} runs in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
