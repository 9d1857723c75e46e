"""What the model's confidence is worth: the twelve model classes from fixed probes, and
predicted confidence against the rate achieved on random synthetic curves.

The same checks, larger, are tables in docs/model.md (``bench/bench_model.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from coda_common.model.curves import MODEL_CLASSES, throughput_curve
from coda_common.model.fit import ModelError, fit_curve

# The poster's predictor with no, some and much log term, each with a hard knee and with
# the benchmark's rounder knees.
SHAPES = [(share, soft) for share in (0.0, 0.3, 0.6) for soft in (0.0, 0.05, 0.1)]


def _passes(knee: float, share: float, soft: float, box: int, probes: list[int]) -> bool:
    """The answer reaches 93 % of the best throughput on the box without asking for more
    than the true 95 % point plus max(1 core, 20 %)."""
    ks = np.arange(1, box + 1, dtype=float)
    curve = throughput_curve(knee, ks, log_share=share, softness=soft)
    truth = int(ks[np.argmax(curve >= 0.95 * curve.max() - 1e-12)])
    c = np.asarray(probes, dtype=float)
    fit = fit_curve(c, throughput_curve(knee, c, log_share=share, softness=soft))
    k = fit.sweet_spot_cores
    return bool(curve[k - 1] >= 0.93 * curve.max() - 1e-9 and k <= truth + max(1, 0.2 * truth))


@pytest.mark.parametrize(
    ("box", "probes", "classes_needed"),
    [(12, [1, 3, 6, 12], 10), (12, list(range(1, 13)), 12), (24, list(range(1, 25)), 12)],
    ids=["4-samples", "grid-12", "grid-24"],
)
def test_model_classes_reach_the_plateau_without_over_asking(
    box: int, probes: list[int], classes_needed: int
) -> None:
    passing = [
        name
        for name, _, knee, _ in MODEL_CLASSES
        if all(_passes(knee, share, soft, box, probes) for share, soft in SHAPES)
    ]
    assert len(MODEL_CLASSES) == 12
    assert len(passing) >= classes_needed, sorted({n for n, *_ in MODEL_CLASSES} - set(passing))


def test_confidence_is_calibrated_on_random_curves() -> None:
    """300 random curves (knee log-uniform up to 1.2x the box, log share 0-0.6, softness
    0-0.1, noise 0-10 %), 3-8 probes at random counts including both ends: in every band
    of reported confidence with 25 fits or more, the share whose answer reaches 95 % of
    the plateau is at least the band's mean confidence less 0.08; overall it is between
    the mean confidence less 0.05 and the mean confidence plus 0.1 (the prior allows
    rounder knees than these curves have, which makes the model a little cautious)."""
    rng = np.random.default_rng(11)
    rows: list[tuple[float, bool]] = []
    for _ in range(300):
        box = int(rng.choice([12, 24, 32]))
        knee = float(np.exp(rng.uniform(0.0, np.log(1.2 * box))))
        share, soft, noise = rng.uniform(0, 0.6), rng.uniform(0, 0.1), rng.uniform(0, 0.1)
        middle = rng.choice(np.arange(2, box), size=int(rng.integers(1, 7)), replace=False)
        c = np.sort(np.concatenate([[1, box], middle])).astype(float)
        y = throughput_curve(knee, c, log_share=share, softness=soft)
        y = np.maximum(y * (1.0 + noise * rng.standard_normal(c.size)), 0.0)
        try:
            fit = fit_curve(c, y)
        except ModelError:
            continue
        curve = throughput_curve(knee, np.arange(1, box + 1.0), log_share=share, softness=soft)
        rows.append((fit.confidence, bool(curve[fit.sweet_spot_cores - 1] >= 0.95 * curve[-1])))
    conf = np.array([r[0] for r in rows])
    hit = np.array([r[1] for r in rows])
    assert len(rows) >= 250
    for lo, hi in ((0.0, 0.8), (0.8, 0.9), (0.9, 0.99), (0.99, 1.01)):
        band = (conf >= lo) & (conf < hi)
        if band.sum() >= 25:
            assert hit[band].mean() >= conf[band].mean() - 0.08, (lo, hi, band.sum())
    assert conf.mean() - 0.05 <= hit.mean() <= conf.mean() + 0.1
