"""What is left of a warm store's gap to perfect profiles: which jobs' cores it is in.

Per seed, one child process replays a trace as ``bench/bench_cold_warm.py`` builds it, under
``coda`` with the starter table (``coda+table``) and three variants of it that give some
GPU jobs their sweet spot instead of what the hook decided (the most a node that can hold
the job has, when the sweet spot is beyond it, as the oracle gives):

* ``profiles exact``: the jobs the hook sized from their workload's own profile
  (``src=profile``);
* ``first runs exact``: the jobs it sized without one (``src=prior:NAME``, ``default``,
  ``none``: a workload's runs before coda-node publishes its profile);
* ``perfect``: every GPU job, without probing (``bench_cold_warm.py``'s ``perfect``).

It prints, per seed, the second half's mean DNN JCT in hours (GPU jobs from the middle GPU
submission on, as ``bench_cold_warm.py``'s second half) and the share of those jobs each
source sized. Where ``first runs exact`` closes the gap, the first runs' cores are what is
left; where ``profiles exact`` does, the profiles' figures are.

    .venv/bin/python bench/bench_first_runs.py                 # alibaba, seeds 1,2,3
    .venv/bin/python bench/bench_first_runs.py --trace philly --seeds 1

Runs ``--workers`` children at a time (default 2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_cold_warm import TRACES

VARIANTS = ("coda+table", "profiles exact", "first runs exact", "perfect")
FIRST_RUN_SOURCES = frozenset({"prior", "default", "none"})


def _child(trace_name: str, seed: int) -> dict[str, Any]:
    import numpy as np

    from coda_common.slurm.adminrecord import parse_admin_record
    from slurm_plugin.cli import simulate as cli
    from slurm_plugin.sim import profiling
    from slurm_plugin.sim.engine import POLICIES, _Sim
    from slurm_plugin.sim.workloads import assign_workloads, starter_table

    args = TRACES[trace_name]
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    trace = cli._loaded_trace(args[0], int(opts["--jobs"]) if "--jobs" in opts else None)
    nodes = cli._cluster(trace, None, float(opts["--load"]), "96:8")
    if float(opts.get("--cpu-load", 0.0)) > 0:
        trace = cli._with_cpu_jobs(trace, nodes, float(opts["--cpu-load"]), seed)
    model = cli._job_model(())
    named, stage_ms = cli._muri_inputs(trace, args[0], model, [])
    wl = assign_workloads(trace, model, seed, named_classes=named)
    base = cli._base_params(False, cli._checked_coda_conf(()), stage_ms, None)
    params = replace(base, starter_table=tuple(starter_table(wl, 0.0, seed).items()))

    # The source of each decision the hook makes, by the request it was made for (the
    # simulator decides once per workload, GPU shape and user value).
    sources: dict[tuple[int, str | None, int, str | None], str] = {}
    decide = profiling.decide

    def recording(req: Any, *a: Any, **kw: Any) -> Any:
        d = decide(req, *a, **kw)
        src = parse_admin_record(d.admin_comment or "").get("src", "none")
        sources[(req.uid, req.tres_per_node, req.min_nodes, req.cpus_per_tres)] = src
        return d

    profiling.decide = recording

    class Variant(_Sim):
        exact: frozenset[str] | None = frozenset()
        """The sources whose jobs get their sweet spot; None: every GPU job."""
        seen: dict[int, str]

        def _cores(self, j: int, gpn: int, k: int) -> int:
            given = super()._cores(j, gpn, k)
            user = int(self.wl.user_cpus_per_gpu[j])
            wid = int(self.wl.workload[j])
            src = sources.get((1000 + wid, f"gres:gpu:{gpn}", k, f"gres:gpu:{user}"), "none")
            src = src.split(":", 1)[0]
            self.seen[j] = src
            if self.exact is None or src in self.exact:
                return self._best_cores(j, gpn, k)
            return given

    gpu = np.flatnonzero(trace.gpus > 0)
    order = gpu[np.argsort(trace.submit_s[gpu], kind="stable")]
    half = order[len(order) // 2 :]
    out: dict[str, Any] = {"trace": trace_name, "seed": seed}
    for variant in VARIANTS:
        policy = POLICIES["coda"]
        exact: frozenset[str] | None = frozenset()
        if variant == "profiles exact":
            exact = frozenset({"profile"})
        elif variant == "first runs exact":
            exact = FIRST_RUN_SOURCES
        elif variant == "perfect":
            policy = replace(POLICIES["coda"], name="perfect", profile=False)
            exact = None
        sim = type("Run", (Variant,), {"exact": exact})(
            trace, nodes, wl, model, policy, params, None
        )
        sim.seen = {}
        sim.run()
        jct_s = sim.end_s[half] - trace.submit_s[half]
        out[variant] = float(np.nanmean(jct_s)) / 3600
        if variant == "coda+table":
            counts = Counter(sim.seen.get(int(j), "none") for j in half)
            out["sources"] = {k: v / len(half) for k, v in sorted(counts.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", choices=sorted(TRACES), default="alibaba")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    if a.child:
        print(json.dumps(_child(a.trace, seeds[0])))
        return 0

    def one(seed: int) -> dict[str, Any]:
        argv = [sys.executable, __file__, "--child", "--trace", a.trace, "--seeds", str(seed)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    with ThreadPoolExecutor(a.workers) as pool:
        rows = list(pool.map(one, seeds))
    print(f"{a.trace} ({' '.join(TRACES[a.trace])}), second half, mean DNN JCT in hours")
    print("| seed | " + " | ".join(VARIANTS) + " | sized by (coda+table) |")
    print("|--:|" + "--:|" * len(VARIANTS) + "---|")
    for r in rows:
        shares = ", ".join(f"{k} {v:.1%}" for k, v in r["sources"].items())
        cells = " | ".join(f"{r[v]:.2f}" for v in VARIANTS)
        print(f"| {r['seed']} | {cells} | {shares} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
