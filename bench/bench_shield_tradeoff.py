"""The contention eliminator's trade-off: DNN mean-JCT gain against the CPU jobs' stretch.

Each point is one ``coda-slurm simulate TRACE -p coda --json`` run with the eliminator's
coda.conf keys set (``--coda-conf``, read by the simulated coda-node as by the real one),
against one ``-p slurm`` run of the same trace: the gain is slurm's DNN mean JCT minus
coda's, the cost the CPU jobs' total run time over their run time in the trace
(``cpu_work_stretch``), with the median and p99 of the per-job stretch. Two victim rules:
*CPU use* (the biggest CPU user is stepped down to the floor, ``NodeThrottleMinEffectPct=0``)
and *effect* (a job held at its floor must cut the DNN job's slowdown per core held back,
or it is given back and, if that changes nothing, left alone), each at several floors
(``NodeThrottleFloorPct``) on the 75/50/25 % quota steps with every hold kept
(``NodeThrottleStepPct=``, ``NodeThrottleMinGainPct=0``); *hold test*: the effect rule at a
10 % floor on quota steps of 10 % whose holds must buy ``NodeThrottleMinGainPct`` points of
DNN slowdown per CPU job held back (at 20); *price*: the hold test at 20 whose holds must
also give back GPU time worth the cores they hold back at ``NodeThrottleGpuWorthCores`` cores
per GPU, priced again after every step (the defaults at 14); *membw placement*: the price
rule with memory-bound CPU jobs spread by their memory bandwidth (``--placement membw``,
every CPU job's bandwidth known), which costs them queue time rather than run time (the
tables' CPU wait); ``off`` is ``NodeContention=no``. Every row but *price*, *membw
placement* and *trigger* sets ``NodeThrottleGpuWorthCores=0``. *trigger* (run only when
``--rule trigger`` asks for it) is the price rule with the eliminator acting at another
slowdown (``NodeContentionTriggerPct``) and releasing at another
(``NodeContentionReleasePct``).

    .venv/bin/python bench/bench_shield_tradeoff.py        # table, docs/shield-tradeoff.svg
    .venv/bin/python bench/bench_shield_tradeoff.py --trace muri --no-plot
    .venv/bin/python bench/bench_shield_tradeoff.py --seeds 1,2,3,4 --rule off \
        --rule "hold test" --rule price --no-plot            # the mean over four seeds

Runs ``--workers`` simulations at a time (default 2). The traces are cut to stay within
minutes on a 2-core machine (see TRACES); the table states each run's size. With several
``--seeds`` each seed's gain is taken against that seed's deepest shield (*cpu use* at a
10 % floor, always run) and the table gives the mean over the seeds, each seed's figure
beside it.
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
SVG = ROOT / "docs" / "shield-tradeoff.svg"

TRACES: dict[str, tuple[str, ...]] = {
    "muri": ("muri", "--load", "0.8", "--cpu-load", "0.3"),
    "philly": ("philly", "--jobs", "2000", "--load", "0.8", "--cpu-load", "0.3"),
    "alibaba": ("alibaba", "--load", "0.8"),
}
"""Each trace's arguments: Muri and Alibaba whole, the first 2,000 jobs of Philly."""


@dataclass(frozen=True)
class Variant:
    label: str
    rule: str
    """``off``, ``cpu use``, ``effect`` or ``hold test``."""
    floor_pct: float
    conf: tuple[str, ...]
    mark: float = 0.0
    """The number the plot writes beside the point: the floor, or for the hold test its
    NodeThrottleMinGainPct."""
    args: tuple[str, ...] = ()
    """More ``coda-slurm simulate`` arguments (a placement mechanism: its run is the last
    result)."""
    on_request: bool = False
    """Run only when ``--rule`` names its rule (not part of the default table and plot)."""


def variants() -> list[Variant]:
    out = [Variant("off", "off", 100.0, ("NodeContention=no",))]
    for rule, effect in (("cpu use", "0"), ("effect", "5")):
        for floor in (10, 25, 35, 50):
            out.append(
                Variant(
                    f"{rule}, floor {floor} %",
                    rule,
                    float(floor),
                    (
                        f"NodeThrottleFloorPct={floor}",
                        f"NodeThrottleMinEffectPct={effect}",
                        "NodeThrottleStepPct=",
                        "NodeThrottleMinGainPct=0",
                        "NodeThrottleGpuWorthCores=0",
                    ),
                )
            )
    # The benefit test of a hold (NodeThrottleMinGainPct) on a finer ladder, at the floor and
    # victim rule of the reference row.
    for gain in (10, 20, 30):
        out.append(
            Variant(
                f"hold test {gain}, floor 10 %",
                "hold test",
                10.0,
                (
                    "NodeThrottleFloorPct=10",
                    "NodeThrottleMinEffectPct=5",
                    "NodeThrottleStepPct=10",
                    f"NodeThrottleMinGainPct={gain}",
                    "NodeThrottleGpuWorthCores=0",
                ),
                float(gain),
            )
        )
    # The price of a hold (NodeThrottleGpuWorthCores) on top of the hold test at 20.
    for price in (10, 14, 20):
        out.append(
            Variant(
                f"price {price}, hold test 20, floor 10 %",
                "price",
                10.0,
                _priced(price),
                float(price),
            )
        )
    # The same with memory-bound CPU jobs spread by their bandwidth instead of packed.
    for price in (10, 14):
        out.append(
            Variant(
                f"membw placement, price {price}",
                "membw placement",
                10.0,
                _priced(price),
                float(price),
                ("--placement", "membw"),
            )
        )
    # The price rule with the eliminator's trigger and release moved (NodeContentionTriggerPct,
    # NodeContentionReleasePct): whether acting sooner or later reaches the target on Muri.
    for trigger, release in ((4, 2), (5, 2), (7, 3), (15, 5), (20, 10)):
        for price in (10, 14):
            out.append(
                Variant(
                    f"trigger {trigger} %, release {release} %, price {price}",
                    "trigger",
                    10.0,
                    (
                        *_priced(price),
                        f"NodeContentionTriggerPct={trigger}",
                        f"NodeContentionReleasePct={release}",
                    ),
                    float(trigger),
                    on_request=True,
                )
            )
    return out


def _priced(price: float) -> tuple[str, ...]:
    """The price rule's keys: the hold test at 20 on 10 % steps to a 10 % floor, holds priced
    at ``price`` cores a GPU."""
    return (
        "NodeThrottleFloorPct=10",
        "NodeThrottleMinEffectPct=5",
        "NodeThrottleStepPct=10",
        "NodeThrottleMinGainPct=20",
        f"NodeThrottleGpuWorthCores={price:g}",
    )


DEEPEST = "cpu use, floor 10 %"
"""The reference row: every hold kept, down to a 10 % floor."""


def simulate(
    args: tuple[str, ...], policy: str, conf: tuple[str, ...], seed: int = 1
) -> dict[str, float]:
    """The last result of one run: the policy's, or with ``--placement`` in ``args`` the
    policy's with that mechanism on."""
    exe = str(Path(sys.executable).with_name("coda-slurm"))
    argv = [exe, "simulate", *args, "--seed", str(seed), "-p", policy, "--json"]
    for item in conf:
        argv += ["--coda-conf", item]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    doc = json.loads(proc.stdout)
    return doc["results"][-1]


def run(
    traces: list[str], workers: int, seeds: list[int] | None = None, rules: list[str] | None = None
) -> list[dict[str, object]]:
    seeds = seeds or [1]
    chosen = [
        v
        for v in variants()
        if (v.rule in rules if rules else not v.on_request) or v.label == DEEPEST
    ]
    jobs: list[tuple[str, int, str, Variant | None]] = []
    for trace in traces:
        for seed in seeds:
            jobs.append((trace, seed, "slurm", None))
            jobs += [(trace, seed, "coda", v) for v in chosen]

    def one(job: tuple[str, int, str, Variant | None]) -> dict[str, float]:
        trace, seed, policy, v = job
        if v is None:
            return simulate(TRACES[trace], policy, (), seed)
        return simulate((*TRACES[trace], *v.args), policy, v.conf, seed)

    with ThreadPoolExecutor(workers) as pool:
        got = list(pool.map(one, jobs))
    base = {(t, sd): r for (t, sd, pol, _), r in zip(jobs, got, strict=True) if pol == "slurm"}
    rows: list[dict[str, object]] = []
    for (trace, seed, _, v), r in zip(jobs, got, strict=True):
        if v is None:
            continue
        b = base[(trace, seed)]
        rows.append(
            {
                "trace": trace,
                "seed": seed,
                "variant": v.label,
                "rule": v.rule,
                "floor_pct": v.floor_pct,
                "mark": v.mark or v.floor_pct,
                "gain_h": (b["dnn_jct_mean_s"] - r["dnn_jct_mean_s"]) / 3600.0,
                "slurm_jct_h": b["dnn_jct_mean_s"] / 3600.0,
                "work_stretch": r["cpu_work_stretch"],
                "stretch_p50": r["cpu_stretch_p50"],
                "stretch_p99": r["cpu_stretch_p99"],
                "cpu_wait_min": r["cpu_wait_mean_s"] / 60.0,
            }
        )
    return rows


def _by_trace(rows: list[dict[str, object]]) -> list[tuple[str, list[dict[str, object]]]]:
    """Each trace's rows, in the order the traces first appear."""
    traces = dict.fromkeys(str(r["trace"]) for r in rows)
    return [(t, [r for r in rows if r["trace"] == t]) for t in traces]


def seeds_table(rows: list[dict[str, object]]) -> str:
    """The mean over the seeds of each rule's share of its seed's deepest gain and of its CPU
    work stretch, each seed's figure in brackets."""
    lines = [
        "| trace | rule | DNN mean JCT gain, of the deepest shield's | CPU work stretch "
        "| highest median stretch | mean CPU wait |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for trace, mine in _by_trace(rows):
        seeds = list(dict.fromkeys(int(r["seed"]) for r in mine))  # type: ignore[call-overload]
        deepest = {
            int(r["seed"]): float(r["gain_h"])  # type: ignore[call-overload, arg-type]
            for r in mine
            if r["variant"] == DEEPEST
        }
        for label in dict.fromkeys(str(r["variant"]) for r in mine):
            if label == DEEPEST:
                continue
            by_seed = {int(r["seed"]): r for r in mine if r["variant"] == label}  # type: ignore[call-overload]
            kept = [float(by_seed[sd]["gain_h"]) / deepest[sd] for sd in seeds]  # type: ignore[arg-type]
            stretch = [float(by_seed[sd]["work_stretch"]) - 1 for sd in seeds]  # type: ignore[arg-type]
            p50 = max(float(by_seed[sd]["stretch_p50"]) for sd in seeds)  # type: ignore[arg-type]
            wait = [float(by_seed[sd].get("cpu_wait_min", 0.0)) for sd in seeds]  # type: ignore[arg-type]
            lines.append(
                f"| {trace} | {label} | {sum(kept) / len(kept):.0%} "
                f"({' '.join(f'{k:.0%}' for k in kept)}) "
                f"| {sum(stretch) / len(stretch):+.1%} "
                f"({' '.join(f'{x:+.1%}' for x in stretch)}) | {p50:.2f} "
                f"| {sum(wait) / len(wait):.1f} min |"
            )
    return "\n".join(lines)


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| trace | rule | DNN mean JCT gain | of the deepest shield's | CPU work stretch "
        "| median stretch | p99 stretch | mean CPU wait |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for trace, mine in _by_trace(rows):
        deepest = next(float(r["gain_h"]) for r in mine if r["variant"] == DEEPEST)  # type: ignore[arg-type]
        for r in mine:
            gain = float(r["gain_h"])  # type: ignore[arg-type]
            share = f"{gain / deepest:.0%}" if deepest > 0 else "-"
            lines.append(
                f"| {trace} | {r['variant']} | {gain:.2f} h | {share} "
                f"| {float(r['work_stretch']) - 1:+.1%} | {float(r['stretch_p50']):.2f} "  # type: ignore[arg-type]
                f"| {float(r['stretch_p99']):.2f} "  # type: ignore[arg-type]
                f"| {float(r.get('cpu_wait_min', 0.0)):.1f} min |"  # type: ignore[arg-type]
            )
    return "\n".join(lines)


def plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "coda"  # the same SVG for the same numbers
    traces = _by_trace(rows)
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.6), squeeze=False)
    for ax, (trace, mine) in zip(axes[0], traces, strict=True):
        for rule, style in (
            ("cpu use", "o--"),
            ("effect", "s-"),
            ("hold test", "^-."),
            ("price", "D-"),
            ("membw placement", "P-"),
        ):
            pts = [
                (float(r["work_stretch"]) - 1, float(r["gain_h"]), float(r["mark"]))  # type: ignore[arg-type]
                for r in sorted(mine, key=lambda r: float(r["mark"]))  # type: ignore[arg-type]
                if r["rule"] == rule
            ]
            ax.plot([100 * x for x, _, _ in pts], [y for _, y, _ in pts], style, label=rule)
            for x, y, floor in pts:
                ax.annotate(
                    f"{floor:g}",
                    (100 * x, y),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        off = [r for r in mine if r["rule"] == "off"]
        if off:
            ax.plot([0.0], [float(off[0]["gain_h"])], "kx", label="off")  # type: ignore[arg-type]
        ax.axvline(5.0, color="grey", lw=0.8, ls=":")
        ax.set_ylim(bottom=0.0)
        ax.set_title(trace)
        ax.set_xlabel("CPU work stretch (%)")
        ax.set_ylabel("DNN mean JCT gain over slurm (h)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(
        title="victims by (floor %; hold test: min gain; price: cores a GPU)",
        fontsize=8,
        title_fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--svg", type=Path, default=SVG)
    ap.add_argument("--json", action="store_true", help="print the points as JSON")
    ap.add_argument("--from", dest="source", type=Path, help="points from an earlier --json")
    ap.add_argument(
        "--seeds", default="1", help="comma-separated seeds; several: the mean over them"
    )
    ap.add_argument(
        "--rule",
        action="append",
        default=[],
        choices=sorted({v.rule for v in variants()}),
        help="only these rules (and the deepest shield they are measured against)",
    )
    a = ap.parse_args(argv)
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {a.seeds!r}")
    if a.source:
        rows = json.loads(a.source.read_text())
        a.trace = list(dict.fromkeys(str(r["trace"]) for r in rows))
        seeds = list(dict.fromkeys(int(r.get("seed", 1)) for r in rows))
    else:
        rows = run(a.trace or list(TRACES), a.workers, seeds, a.rule)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        sizes = "; ".join(f"{t}: {' '.join(TRACES[t])}" for t in (a.trace or list(TRACES)))
        if len(seeds) > 1:
            print(f"coda-slurm simulate, seeds {','.join(map(str, seeds))} ({sizes})")
            print(seeds_table(rows))
        else:
            print(f"coda-slurm simulate, seed {seeds[0]} ({sizes})")
            print(table(rows))
    if not a.no_plot and len(seeds) == 1:
        plot(rows, a.svg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
