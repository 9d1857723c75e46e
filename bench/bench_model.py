"""Benchmark of the CPU-demand model: how good are its answers after a few probes?

Run: ``.venv/bin/python bench/bench_model.py [--seed N] [--trials N]``

For each box size (24 cores as on the SoCC'18 P100 VM, then 32 and 64) and each case, the
probing loop asks :func:`coda_common.model.fit.next_probe` where to measure, "measures" a
synthetic curve with multiplicative noise, and after 3, 4, 5 and 8 probes fits the curve.
The loop stops early when ``next_probe`` returns ``None``; the budgets share one probe
sequence per case (``next_probe`` is deterministic), so the columns differ only in how many
probes were allowed.

Cases:

* ``reference``: the eight SoCC'18 workloads (knee at the published core count, poster
  shape with a 30 % log share, hard knee), noise drawn from 0-10 %.
* ``random``: knee uniform in 1..24 cores, noise 0-10 %, log share 0-60 %, knee softness
  0-0.1 (a rounded knee the model does not describe exactly).

Columns: ``refused`` is the fraction where ``fit_curve`` raised or reported confidence
below ``--confident-at`` (default 0.8, the submit hook's MinConfidence and coda-node's
min_confidence); the remaining columns are over the answered cases: ``>=95 %`` is the
fraction whose recommended cores reach at least 95 % of the true best throughput on the
box, ``over`` is cores above the true sweet spot (fewest cores reaching 95 %), mean and
95th percentile, ``under`` the fraction below it; ``>=95 % all`` uses every fit that did not
raise, ignoring confidence, to show what the refusal buys.

Then: calibration (reported confidence against the share of answers that reach 95 %, for
the 8-probe fits above and for random probe sets), the twelve model classes
(:data:`coda_common.model.curves.MODEL_CLASSES`) from 4 fixed probes at 1, 3, 6 and 12 cores and
from full grids, probe placement, and the time of a fit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from coda_common.model.curves import (
    MODEL_CLASSES,
    REFERENCE_WORKLOADS,
    cores_for_fraction,
    noisy_samples,
    throughput_curve,
)
from coda_common.model.fit import ModelError, fit_curve, next_probe

BUDGETS = (3, 4, 5, 8)
BOX_CORES = (24, 32, 64)
PLATEAU_FRACTION = 0.95
# Fractions to aim at when fitting the 8-probe samples, to show what a safety margin buys
# against the 95 % target (the probes themselves are chosen for 95 %).
AIM_FRACTIONS = (0.95, 0.97, 0.98, 0.99)
CONFIDENCE_BANDS = (
    (0.0, 0.5),
    (0.5, 0.7),
    (0.7, 0.8),
    (0.8, 0.9),
    (0.9, 0.95),
    (0.95, 0.99),
    (0.99, 1.01),
)
# The model classes' curves: the poster's predictor with no, some and much log term, each
# with a hard knee and with the random scenario's rounder knees.
CLASS_SHAPES = tuple((share, soft) for share in (0.0, 0.3, 0.6) for soft in (0.0, 0.05, 0.1))
CLASS_DESIGNS = (
    ("4 samples 1, 3, 6, 12 (12-core box)", 12, (1, 3, 6, 12)),
    ("every count 1-12 (12-core box)", 12, tuple(range(1, 13))),
    ("every count 1-24 (24-core box)", 24, tuple(range(1, 25))),
)
CLASS_NOISE_REL = 0.03
CLASS_NOISE_DRAWS = 10


@dataclass(frozen=True, slots=True)
class Case:
    knee_cores: float
    noise_rel: float
    log_share: float
    softness: float


@dataclass(slots=True)
class Tally:
    total: int = 0
    refused: int = 0
    hits_answered: int = 0
    hits90_answered: int = 0
    achieved: list[float] = field(default_factory=list)
    hits_all: int = 0
    fitted: int = 0
    under: int = 0
    over_cores: list[int] = field(default_factory=list)
    probes_used: list[int] = field(default_factory=list)
    # (confidence, the answer reaches 95 % of the best throughput) for calibration.
    calibration: list[tuple[float, bool]] = field(default_factory=list)


def cases(scenario: str, rng: np.random.Generator, trials: int) -> list[Case]:
    if scenario == "reference":
        per_workload = max(1, -(-trials // len(REFERENCE_WORKLOADS)))
        return [
            Case(float(w.sweet_spot_cores), float(rng.uniform(0.0, 0.10)), 0.3, 0.0)
            for w in REFERENCE_WORKLOADS
            for _ in range(per_workload)
        ]
    return [
        Case(
            float(rng.uniform(1.0, 24.0)),
            float(rng.uniform(0.0, 0.10)),
            float(rng.uniform(0.0, 0.6)),
            float(rng.uniform(0.0, 0.1)),
        )
        for _ in range(trials)
    ]


def run_case(
    case: Case,
    box_cores: int,
    rng: np.random.Generator,
    confident_at: float,
    tallies: dict[int, Tally],
    aims: dict[float, list[tuple[float, int]]],
) -> None:
    ks = np.arange(1, box_cores + 1, dtype=float)
    curve_kw = {"log_share": case.log_share, "softness": case.softness}
    true_curve = throughput_curve(case.knee_cores, ks, **curve_kw)
    true_peak = float(true_curve.max())
    true_sweet = cores_for_fraction(
        case.knee_cores, max_cores=box_cores, fraction=PLATEAU_FRACTION, **curve_kw
    )
    samples: list[tuple[float, float]] = []
    for budget in BUDGETS:
        while len(samples) < budget:
            probe = next_probe(
                samples,
                max_cores=box_cores,
                plateau_fraction=PLATEAU_FRACTION,
                confident_at=confident_at,
            )
            if probe is None:
                break
            measured = noisy_samples(
                rng, case.knee_cores, np.array([probe]), case.noise_rel, **curve_kw
            )
            samples.append((float(probe), float(measured[0])))
        tally: Tally = tallies[budget]
        tally.total += 1
        tally.probes_used.append(len(samples))
        try:
            fit = fit_curve([s[0] for s in samples], [s[1] for s in samples])
        except ModelError:
            tally.refused += 1
            continue
        rec = fit.sweet_spot_cores
        hit = true_curve[min(rec, box_cores) - 1] >= PLATEAU_FRACTION * true_peak - 1e-9
        tally.fitted += 1
        tally.hits_all += hit
        tally.calibration.append((fit.confidence, bool(hit)))
        if fit.confidence < confident_at:
            tally.refused += 1
            continue
        if budget == BUDGETS[-1]:
            for aim in AIM_FRACTIONS:
                aimed = fit_curve(
                    [s[0] for s in samples], [s[1] for s in samples], plateau_fraction=aim
                ).sweet_spot_cores
                achieved = float(true_curve[min(aimed, box_cores) - 1] / true_peak)
                aims[aim].append((achieved, max(0, aimed - true_sweet)))
        tally.hits_answered += hit
        tally.hits90_answered += true_curve[min(rec, box_cores) - 1] >= 0.90 * true_peak - 1e-9
        tally.achieved.append(float(true_curve[min(rec, box_cores) - 1] / true_peak))
        tally.under += rec < true_sweet
        tally.over_cores.append(max(0, rec - true_sweet))


def compare_designs(rng: np.random.Generator, trials: int, box_cores: int = 24) -> list[str]:
    """Adaptive probing vs fixed grids of the same size, no early stop, random curves."""
    budgets = (4, 5, 6, 8)
    # results[design][budget] = list of (reached 95 %, |error| in cores)
    results: dict[str, dict[int, list[tuple[bool, int]]]] = {
        d: {b: [] for b in budgets} for d in ("adaptive", "geometric", "linear")
    }
    ks = np.arange(1, box_cores + 1, dtype=float)
    for case in cases("random", rng, trials):
        curve_kw = {"log_share": case.log_share, "softness": case.softness}
        true_curve = throughput_curve(case.knee_cores, ks, **curve_kw)
        true_sweet = cores_for_fraction(case.knee_cores, max_cores=box_cores, **curve_kw)
        # One noise draw per core count and case, shared by all designs.
        measured = noisy_samples(rng, case.knee_cores, ks, case.noise_rel, **curve_kw)
        adaptive: list[tuple[float, float]] = []
        for budget in budgets:
            while len(adaptive) < budget:
                probe = next_probe(adaptive, max_cores=box_cores, confident_at=1.1)
                if probe is None:
                    break
                adaptive.append((float(probe), float(measured[probe - 1])))
            grids = {
                "adaptive": [int(c) for c, _ in adaptive],
                "geometric": np.unique(np.round(np.geomspace(1, box_cores, budget))).tolist(),
                "linear": np.unique(np.round(np.linspace(1, box_cores, budget))).tolist(),
            }
            for design, probes in grids.items():
                idx = [int(c) - 1 for c in probes]
                try:
                    fit = fit_curve(ks[idx], measured[idx])
                except ModelError:
                    continue
                rec = fit.sweet_spot_cores
                hit = bool(true_curve[rec - 1] >= PLATEAU_FRACTION * true_curve.max() - 1e-9)
                results[design][budget].append((hit, abs(rec - true_sweet)))
    lines = [
        "| design | probes | >=95 % | exact | mean abs error (cores) |",
        "|---|---:|---:|---:|---:|",
    ]
    for design, by_budget in results.items():
        for budget, rows in by_budget.items():
            hits = sum(h for h, _ in rows)
            errors = np.array([e for _, e in rows], dtype=float)
            lines.append(
                f"| {design} | {budget} | {pct(hits, len(rows))} | "
                f"{pct(int((errors == 0).sum()), len(rows))} | {errors.mean():.2f} |"
            )
    return lines


def random_probe_calibration(rng: np.random.Generator, trials: int) -> list[tuple[float, bool]]:
    """(confidence, reached 95 %) of fits to random probe sets: 3-8 probes at random counts
    of a 12-, 24- or 32-core box (both ends always), random curves as in the ``random``
    scenario but knees log-uniform up to 1.2x the box. Spreads the reported confidence
    wider than adaptive probing does."""
    rows = []
    for _ in range(trials):
        box = int(rng.choice([12, 24, 32]))
        knee = float(np.exp(rng.uniform(0.0, np.log(1.2 * box))))
        share, soft, noise = rng.uniform(0, 0.6), rng.uniform(0, 0.1), rng.uniform(0, 0.1)
        middle = rng.choice(np.arange(2, box), size=int(rng.integers(1, 7)), replace=False)
        c = np.sort(np.concatenate([[1, box], middle])).astype(float)
        y = noisy_samples(rng, knee, c, noise, log_share=share, softness=soft)
        try:
            fit = fit_curve(c, y)
        except ModelError:
            continue
        ks = np.arange(1.0, box + 1.0)
        curve = throughput_curve(knee, ks, log_share=share, softness=soft)
        rows.append((fit.confidence, bool(curve[fit.sweet_spot_cores - 1] >= 0.95 * curve[-1])))
    return rows


def calibration_table(rows: list[tuple[float, bool]]) -> list[str]:
    conf = np.array([c for c, _ in rows])
    hit = np.array([h for _, h in rows], dtype=bool)
    lines = [
        "| confidence | fits | mean confidence | reached 95 % |",
        "|---|---:|---:|---:|",
    ]
    for lo, hi in CONFIDENCE_BANDS:
        sel = (conf >= lo) & (conf < hi)
        n = int(sel.sum())
        mean = f"{conf[sel].mean():.2f}" if n else "–"
        lines.append(
            f"| {lo:.2f}–{min(hi, 1.0):.2f} | {n} | {mean} | {pct(int(hit[sel].sum()), n)} |"
        )
    lines.append(f"| all | {len(rows)} | {conf.mean():.2f} | {pct(int(hit.sum()), len(rows))} |")
    return lines


def class_case(
    knee: float, share: float, soft: float, box: int, probes: tuple[int, ...], y: np.ndarray
) -> tuple[bool, int]:
    """(passes, cores over the true 95 % point) for one fit: passing reaches 93 % of the best
    throughput on the box without asking for more than the true 95 % point plus max(1 core,
    20 %)."""
    ks = np.arange(1.0, box + 1.0)
    curve = throughput_curve(knee, ks, log_share=share, softness=soft)
    truth = int(ks[np.argmax(curve >= PLATEAU_FRACTION * curve.max() - 1e-12)])
    try:
        k = fit_curve(np.asarray(probes, dtype=float), y).sweet_spot_cores
    except ModelError:
        return False, 0
    reach = curve[k - 1] >= 0.93 * curve.max() - 1e-9
    return bool(reach and k <= truth + max(1.0, 0.2 * truth)), k - truth


def class_table(rng: np.random.Generator) -> list[str]:
    """Per model class and design: the shapes passing without noise, and the share of
    noisy cases passing (with the mean cores over the true 95 % point); last row, the
    classes passing every shape without noise / 90 % of the noisy cases."""
    header = ["| class | knee |"] + [f" {name} | 3 % noise |" for name, _, _ in CLASS_DESIGNS]
    lines = ["".join(header), "|---|---:|" + "---:|---:|" * len(CLASS_DESIGNS)]
    passing_clean = [0] * len(CLASS_DESIGNS)
    passing_noisy = [0] * len(CLASS_DESIGNS)
    for name, _, knee, _ in MODEL_CLASSES:
        cells = [f"| {name} | {knee:g} |"]
        for d, (_, box, probes) in enumerate(CLASS_DESIGNS):
            c = np.asarray(probes, dtype=float)
            clean = [
                class_case(
                    knee,
                    share,
                    soft,
                    box,
                    probes,
                    throughput_curve(knee, c, log_share=share, softness=soft),
                )[0]
                for share, soft in CLASS_SHAPES
            ]
            noisy = [
                class_case(
                    knee,
                    share,
                    soft,
                    box,
                    probes,
                    noisy_samples(rng, knee, c, CLASS_NOISE_REL, log_share=share, softness=soft),
                )
                for share, soft in CLASS_SHAPES
                for _ in range(CLASS_NOISE_DRAWS)
            ]
            ok = sum(p for p, _ in noisy)
            over = np.mean([o for _, o in noisy])
            passing_clean[d] += all(clean)
            passing_noisy[d] += ok >= 0.9 * len(noisy)
            cells.append(f" {sum(clean)}/{len(clean)} | {pct(ok, len(noisy))} ({over:+.1f}) |")
        lines.append("".join(cells))
    summary = ["| classes passing | |"] + [
        f" **{a}/12** | **{b}/12** |" for a, b in zip(passing_clean, passing_noisy, strict=True)
    ]
    lines.append("".join(summary))
    return lines


def pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:.0f} %" if den else "–"


def time_fit(rng: np.random.Generator, n_samples: int, repeats: int = 300) -> float:
    """Median wall time of one fit_curve call on ``n_samples`` noisy probes, in µs."""
    ks = np.unique(np.round(np.geomspace(1, 24, n_samples))).astype(float)
    while ks.size < n_samples:
        ks = np.union1d(ks, [float(rng.integers(1, 25))])
    y = noisy_samples(rng, 11.0, ks, 0.03)
    fit_curve(ks, y)  # warm-up (imports, caches)
    times_us = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit_curve(ks, y)
        times_us.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times_us)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="seed of the noise and random curves")
    ap.add_argument("--trials", type=int, default=200, help="cases per scenario and box size")
    ap.add_argument("--confident-at", type=float, default=0.8, help="refuse below this")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    out = sys.stdout
    out.write(
        f"Seed {args.seed}, {args.trials} cases per scenario and box, "
        f"plateau fraction {PLATEAU_FRACTION}, refuse below confidence {args.confident_at}.\n\n"
    )
    out.write(
        "| scenario | box cores | probes (max) | probes used (mean) | refused | >=95 % | >=90 % "
        "| thr p5 | over mean | over p95 | under | >=95 % all |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    calibration: list[tuple[float, bool]] = []
    aims: dict[tuple[str, int], dict[float, list[tuple[float, int]]]] = {}
    for scenario in ("reference", "random"):
        for box_cores in BOX_CORES:
            tallies = {b: Tally() for b in BUDGETS}
            aim = aims.setdefault((scenario, box_cores), {a: [] for a in AIM_FRACTIONS})
            for case in cases(scenario, rng, args.trials):
                run_case(case, box_cores, rng, args.confident_at, tallies, aim)
            for budget in BUDGETS:
                t = tallies[budget]
                answered = t.total - t.refused
                over = np.asarray(t.over_cores, dtype=float)
                over_mean = f"{over.mean():.2f}" if over.size else "–"
                over_p95 = f"{np.percentile(over, 95):.1f}" if over.size else "–"
                thr_p5 = f"{np.percentile(t.achieved, 5):.2f}" if t.achieved else "–"
                out.write(
                    f"| {scenario} | {box_cores} | {budget} | {np.mean(t.probes_used):.1f} | "
                    f"{pct(t.refused, t.total)} | {pct(t.hits_answered, answered)} | "
                    f"{pct(t.hits90_answered, answered)} | {thr_p5} | {over_mean} | "
                    f"{over_p95} | {pct(t.under, answered)} | {pct(t.hits_all, t.fitted)} |\n"
                )
            calibration.extend(tallies[BUDGETS[-1]].calibration)
            out.flush()

    out.write(
        f"\nAiming higher ({BUDGETS[-1]} probes chosen for {PLATEAU_FRACTION}, answered cases, "
        "sweet spot refitted at the given plateau fraction, judged against the 95 % target).\n\n"
        "| scenario | box cores | aim | >=95 % | thr p5 | over mean | over p95 |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
    )
    for (scenario, box_cores), by_aim in aims.items():
        for aim_fraction, rows in by_aim.items():
            if not rows:
                continue
            achieved = np.array([a for a, _ in rows])
            over = np.array([o for _, o in rows], dtype=float)
            hits = int((achieved >= PLATEAU_FRACTION - 1e-9).sum())
            out.write(
                f"| {scenario} | {box_cores} | {aim_fraction:.2f} | {pct(hits, len(rows))} | "
                f"{np.percentile(achieved, 5):.2f} | {over.mean():.2f} | "
                f"{np.percentile(over, 95):.1f} |\n"
            )

    out.write(
        f"\nCalibration ({BUDGETS[-1]}-probe fits above, all scenarios and boxes): share of "
        "answers that reach 95 % of the best throughput on the box, by reported confidence.\n\n"
    )
    out.write("\n".join(calibration_table(calibration)) + "\n")
    out.write(
        f"\nCalibration on random probe sets ({5 * args.trials} random curves, 3-8 probes at "
        "random counts including both ends of a 12-, 24- or 32-core box).\n\n"
    )
    out.write("\n".join(calibration_table(random_probe_calibration(rng, 5 * args.trials))) + "\n")
    out.write(
        "\nModel classes (the SoCC'18 table's eight and four CODA characterises, knees of the "
        "latter assumed; curves.MODEL_CLASSES), each on 9 curve shapes (log share 0, 0.3, 0.6; "
        "softness 0, 0.05, 0.1). A case passes when the answer reaches 93 % of the best "
        "throughput on the box without asking for more than the true 95 % point plus max(1 "
        f"core, 20 %). Cells: shapes passing without noise; share of cases passing with "
        f"{CLASS_NOISE_REL:.0%} noise ({CLASS_NOISE_DRAWS} draws per shape) and the mean cores "
        "over the true 95 % point. A class passes a design when every shape passes without "
        "noise (90 % of the cases with noise).\n\n"
    )
    out.write("\n".join(class_table(rng)) + "\n")
    out.flush()

    out.write(
        "\nProbe placement (random scenario, 24-core box, no early stop, the same noisy "
        "measurements for every design; geometric and linear grids span 1..24).\n\n"
    )
    out.write("\n".join(compare_designs(rng, args.trials)) + "\n")

    out.write("\n| fit_curve, samples | median µs |\n|---:|---:|\n")
    for n in (4, 10, 24):
        out.write(f"| {n} | {time_fit(rng, n):.0f} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
