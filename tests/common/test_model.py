"""Tests for the CPU-demand model, the reference curves and ``model fit``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import numpy as np
import pytest

from coda_common.cli import run_cli
from coda_common.model.curves import (
    REFERENCE_WORKLOADS,
    cores_for_fraction,
    noisy_samples,
    throughput_curve,
)
from coda_common.model.fit import (
    Fit,
    InconsistentSamples,
    InsufficientSamples,
    ModelError,
    cpus_per_gpu_for_request,
    fit_curve,
    next_probe,
    normalise_samples,
)
from slurm_plugin.cli.model import model

P100_BOX_CORES = 24
ALL_CORES = np.arange(1, P100_BOX_CORES + 1, dtype=float)
WORKLOAD_IDS = [w.name for w in REFERENCE_WORKLOADS]


# --- reference table ---------------------------------------------------------------------


def test_reference_table_matches_socc18_poster() -> None:
    table = {w.name: (w.category, w.sweet_spot_cores) for w in REFERENCE_WORKLOADS}
    assert table == {
        "Lenet": ("CV", 20),
        "Alexnet": ("CV", 19),
        "Overfeat": ("CV", 22),
        "Googlenet": ("CV", 11),
        "LanguageModel": ("NLP", 1),
        "Bi-Att-Flow": ("NLP", 8),
        "DeepSpeech": ("Speech", 3),
        "Wavenet": ("Speech", 3),
    }
    assert all("SoCC'18" in w.source and w.host_cores == 24 for w in REFERENCE_WORKLOADS)


def test_throughput_curve_reaches_peak_at_the_knee_and_not_before() -> None:
    y = throughput_curve(11, ALL_CORES, peak=200.0)
    assert y[10] == pytest.approx(200.0)  # 11 cores
    assert np.all(y[11:] == pytest.approx(200.0))
    assert y[9] < 200.0
    assert np.all(np.diff(y) >= 0.0)


def test_soft_knee_reaches_plateau_gradually() -> None:
    y = throughput_curve(11, ALL_CORES, softness=0.1)
    assert y[10] == pytest.approx(2**-0.1, rel=1e-3)
    assert np.all(np.diff(y) > 0.0)
    assert cores_for_fraction(11, max_cores=24, softness=0.1) > cores_for_fraction(11, max_cores=24)


def test_noisy_samples_are_reproducible_from_a_seed() -> None:
    a = noisy_samples(7, 8, ALL_CORES, 0.05)
    b = noisy_samples(np.random.default_rng(7), 8, ALL_CORES, 0.05)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, throughput_curve(8, ALL_CORES))
    assert np.allclose(a / throughput_curve(8, ALL_CORES), 1.0, atol=0.25)


# --- fit_curve ---------------------------------------------------------------------------


@pytest.mark.parametrize("workload", REFERENCE_WORKLOADS, ids=WORKLOAD_IDS)
def test_fit_recovers_reference_sweet_spot_without_noise(workload) -> None:
    y = throughput_curve(workload.sweet_spot_cores, ALL_CORES, peak=500.0)
    fit = fit_curve(ALL_CORES, y)
    truth = cores_for_fraction(workload.sweet_spot_cores, max_cores=P100_BOX_CORES)
    # Alexnet's 95 % point reaches 95.8 %: a margin the assumed 3 % probe noise cannot
    # confirm, so the answer is the next core, on the plateau.
    assert truth <= fit.sweet_spot_cores <= truth + (workload.name == "Alexnet")
    assert fit.theta_cores == pytest.approx(workload.sweet_spot_cores, abs=0.05)
    assert fit.plateau_throughput == pytest.approx(500.0, rel=1e-4)
    assert fit.confidence > 0.99
    assert fit.rmse_rel < 1e-6


@pytest.mark.parametrize("workload", REFERENCE_WORKLOADS, ids=WORKLOAD_IDS)
def test_fit_with_5pct_noise_reaches_the_target_as_often_as_it_claims(workload) -> None:
    """All 24 core counts probed once with 5 % noise, 40 noise draws per workload.

    Achieved with seeds 0-39: the answer reaches 95 % of the plateau in 39 or 40 draws of
    40, with a mean confidence of 0.87-0.99 (never above the rate achieved: calibrated or
    cautious). The price is cores: on average 0.2-0.6 above the true 95 % point for knees
    up to 11 cores, about 2 (10 %) for Lenet, Alexnet and Overfeat, whose 95 % points
    reach 95.8-96 % (less than the noise can confirm) and whose plateaus have three to
    five probes.
    """
    truth = cores_for_fraction(workload.sweet_spot_cores, max_cores=P100_BOX_CORES)
    curve = throughput_curve(workload.sweet_spot_cores, ALL_CORES)
    hits, over, confidences = [], [], []
    for seed in range(40):
        y = noisy_samples(seed, workload.sweet_spot_cores, ALL_CORES, 0.05, peak=80.0)
        fit = fit_curve(ALL_CORES, y)
        hits.append(curve[fit.sweet_spot_cores - 1] >= 0.95 - 1e-9)
        over.append(fit.sweet_spot_cores - truth)
        confidences.append(fit.confidence)
        assert 0.01 < fit.rmse_rel < 0.1
    assert np.mean(hits) >= 0.95
    assert 0.8 <= np.mean(confidences) <= np.mean(hits) + 0.05
    assert np.mean(over) <= max(1.0, 0.12 * truth)
    assert max(over) <= max(2, round(0.2 * truth) + 1)


def test_fit_with_sparse_probes_finds_knee_between_them() -> None:
    cores = [1, 4, 8, 16, 24]
    y = throughput_curve(11, np.asarray(cores, dtype=float))
    fit = fit_curve(cores, y)
    assert fit.theta_cores == pytest.approx(11.0, abs=0.05)
    # Three rising probes place the knee between 8 and 16 well enough not to ask for 16;
    # a rounder knee would fit them too, which costs a core.
    truth = cores_for_fraction(11, max_cores=24)
    assert truth <= fit.sweet_spot_cores <= truth + 1
    assert fit.confidence >= 0.8
    assert fit.n_samples == 5 and fit.distinct_cores == 5


def test_a_knee_between_two_probes_is_not_claimed() -> None:
    # 1 core at 30 %, then 3, 6 and 12 cores at the plateau: a knee at 1.1 cores fits
    # exactly, and so does one at 2.9 cores, with which 2 cores give two thirds of the
    # plateau. Nothing was measured between 1 and 3 cores: the answer is the measured 3.
    fit = fit_curve([1, 3, 6, 12], [0.3, 1.0, 1.0, 1.0])
    assert fit.theta_cores < 1.5
    assert fit.sweet_spot_cores == 3
    assert fit.confidence >= 0.9
    late_knee = throughput_curve(2.9, np.array([1.0, 2.0, 3.0]), log_share=0.0)
    assert late_knee[1] < 0.7
    # Whatever the knee between 1 and 3 cores, 3 cores reach the plateau.
    for knee in (1.2, 2.0, 2.9):
        samples = throughput_curve(knee, np.array([1.0, 3.0, 6.0, 12.0]), log_share=0.0)
        fit = fit_curve([1, 3, 6, 12], samples)
        achieved = throughput_curve(knee, np.array([float(fit.sweet_spot_cores)]), log_share=0.0)
        assert achieved[0] >= 0.95


def test_flat_curve_needs_the_smallest_probe() -> None:
    fit = fit_curve([1, 2, 8, 24], [100.0, 100.0, 100.0, 100.0])
    assert fit.sweet_spot_cores == 1
    assert fit.confidence > 0.9
    # Never extrapolates below the smallest probed count.
    assert fit_curve([4, 8, 24], [100.0, 100.0, 100.0]).sweet_spot_cores == 4


def test_curve_still_rising_at_the_largest_probe_uses_the_probed_range() -> None:
    cores = np.array([1.0, 4.0, 8.0, 12.0])
    fit = fit_curve(cores, throughput_curve(20, cores))
    assert fit.theta_cores == pytest.approx(12.0)
    assert fit.sweet_spot_cores == 12


def test_plateau_fraction_moves_the_sweet_spot() -> None:
    y = throughput_curve(20, ALL_CORES, log_share=0.0)  # linear rise: S(C) = C / 20
    assert fit_curve(ALL_CORES, y, plateau_fraction=1.0).sweet_spot_cores == 20
    assert fit_curve(ALL_CORES, y, plateau_fraction=0.95).sweet_spot_cores == 19
    assert fit_curve(ALL_CORES, y, plateau_fraction=0.5).sweet_spot_cores == 10


def test_predict_matches_the_piecewise_form() -> None:
    fit = fit_curve(ALL_CORES, throughput_curve(8, ALL_CORES, peak=10.0))
    assert isinstance(fit.predict(3.0), float)
    expected = fit.p0 * np.log(3.0) + fit.p1 * 3.0
    assert fit.predict(3.0) == pytest.approx(expected)
    assert fit.predict(np.array([8.5, 20.0])) == pytest.approx([fit.p2, fit.p2])
    assert fit.predict(ALL_CORES) == pytest.approx(throughput_curve(8, ALL_CORES, peak=10.0))


def test_to_dict_round_trips_through_json() -> None:
    fit = fit_curve([1, 4, 11, 24], throughput_curve(11, np.array([1.0, 4.0, 11.0, 24.0])))
    data = json.loads(json.dumps(fit.to_dict()))
    assert Fit(**data) == fit
    assert set(data) >= {"p0", "p1", "p2", "theta_cores", "sweet_spot_cores", "confidence"}


@pytest.mark.parametrize(
    ("cores", "throughput"),
    [
        ([], []),
        ([4, 24], [50.0, 100.0]),
        ([1, 24, 24, 1], [10.0, 100.0, 101.0, 11.0]),  # four samples, two core counts
        ([8, 8, 8, 8, 8], [1.0, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_too_few_samples_or_core_counts_are_refused(cores, throughput) -> None:
    with pytest.raises(InsufficientSamples):
        fit_curve(cores, throughput)


def test_min_distinct_cores_is_enforced() -> None:
    cores = [1, 8, 24]
    y = throughput_curve(8, np.asarray(cores, dtype=float))
    assert fit_curve(cores, y).distinct_cores == 3
    with pytest.raises(InsufficientSamples):
        fit_curve(cores, y, min_distinct_cores=4)


@pytest.mark.parametrize("seed", range(5))
def test_pure_noise_is_refused_or_untrusted(seed) -> None:
    rng = np.random.default_rng(seed)
    y = rng.uniform(0.0, 1.0, size=12)
    cores = np.arange(1, 13, dtype=float)
    try:
        fit = fit_curve(cores, y)
    except InconsistentSamples:
        return
    assert fit.confidence < 0.5


@pytest.mark.parametrize(
    "throughput",
    [
        100.0 / ALL_CORES,  # every core added costs throughput
        100.0 - 2.0 * ALL_CORES,  # linear decline to half
    ],
)
def test_falling_curves_are_refused(throughput) -> None:
    with pytest.raises(InconsistentSamples, match="falls"):
        fit_curve(ALL_CORES, throughput)


def test_slight_sag_after_the_knee_is_tolerated() -> None:
    y = throughput_curve(8, ALL_CORES) * (1.0 - 0.002 * np.maximum(ALL_CORES - 8.0, 0.0))
    assert abs(fit_curve(ALL_CORES, y).sweet_spot_cores - 8) <= 1


@pytest.mark.parametrize(
    ("cores", "throughput", "match"),
    [
        ([1, 2, 0], [1.0, 2.0, 3.0], "positive"),
        ([1, 2, 3], [1.0, -2.0, 3.0], "negative"),
        ([1, 2, 3], [1.0, float("nan"), 3.0], "NaN"),
        ([1, 2, 3], [1.0, 2.0], "3 core counts but 2"),
    ],
)
def test_invalid_values_are_model_errors(cores, throughput, match) -> None:
    with pytest.raises(ModelError, match=match):
        fit_curve(cores, throughput)


def test_all_zero_throughput_is_inconsistent() -> None:
    with pytest.raises(InconsistentSamples, match="zero"):
        fit_curve([1, 2, 3], [0.0, 0.0, 0.0])


def test_noise_costs_cores_or_confidence() -> None:
    cores = np.array([1.0, 4.0, 8.0, 12.0, 16.0, 24.0])
    clean = fit_curve(cores, throughput_curve(11, cores))
    noisy = [fit_curve(cores, noisy_samples(s, 11, cores, 0.08)) for s in range(10)]
    assert clean.sweet_spot_cores == cores_for_fraction(11, max_cores=24)
    assert clean.confidence > 0.85
    assert np.mean([f.confidence for f in noisy]) < clean.confidence
    assert np.mean([f.sweet_spot_cores for f in noisy]) > clean.sweet_spot_cores + 1


def test_confidence_is_low_when_the_knee_is_between_far_apart_probes() -> None:
    # Knee at 11, probes at 1, 16 and 24: one rising probe, so any knee from ~2 to 15
    # explains the data exactly. Below the default MinConfidence: not used, probed again.
    cores = np.array([1.0, 16.0, 24.0])
    one_rising = fit_curve(cores, throughput_curve(11, cores))
    assert one_rising.confidence < 0.7
    assert one_rising.sweet_spot_cores < 16
    # Two rising probes pin the hard-knee curve down, not a rounder one: surer, still low.
    cores = np.array([1.0, 2.0, 24.0])
    two_rising = fit_curve(cores, throughput_curve(11, cores))
    truth = cores_for_fraction(11, max_cores=24)
    assert truth <= two_rising.sweet_spot_cores <= truth + 1
    assert one_rising.confidence < two_rising.confidence < 0.8


# --- normalise_samples -------------------------------------------------------------------


def test_normalise_samples_divides_by_gpus() -> None:
    cores, thr = normalise_samples([(8, 400.0, 2), (3, 90.0, 1), (16, 1200.0, 4)])
    assert cores.tolist() == [4.0, 3.0, 4.0]
    assert thr.tolist() == [200.0, 90.0, 300.0]


@pytest.mark.parametrize("gpus", [0, -1, 1.5])
def test_normalise_samples_rejects_bad_gpu_counts(gpus) -> None:
    with pytest.raises(ModelError, match="GPU count"):
        normalise_samples([(8, 400.0, gpus)])


# --- next_probe --------------------------------------------------------------------------


def _profile(
    knee_cores: float, *, max_cores: int, noise_rel: float, budget: int, seed: int = 0
) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    samples: list[tuple[float, float]] = []
    while len(samples) < budget:
        probe = next_probe(samples, max_cores=max_cores)
        if probe is None:
            break
        assert 1 <= probe <= max_cores
        assert probe not in [s[0] for s in samples]
        y = noisy_samples(rng, knee_cores, np.array([float(probe)]), noise_rel)
        samples.append((float(probe), float(y[0])))
    return samples


def test_next_probe_starts_with_max_then_min() -> None:
    assert next_probe([], max_cores=24) == 24
    assert next_probe([(24, 100.0)], max_cores=24) == 1
    assert next_probe([(24, 100.0)], max_cores=24, min_cores=2) == 2


@pytest.mark.parametrize(("at_one_core", "knee_bound"), [(10.0, 10), (4.0, 24), (50.0, 2)])
def test_next_probe_looks_inside_the_feasible_knee_range(at_one_core, knee_bound) -> None:
    # With P0, P1 >= 0 the knee is at most P2 / S(1) cores (all-linear rise): probing beyond
    # that bound would only measure the plateau again.
    probe = next_probe([(24, 100.0), (1, at_one_core)], max_cores=24)
    assert probe is not None and 1 < probe <= knee_bound


@pytest.mark.parametrize("workload", REFERENCE_WORKLOADS, ids=WORKLOAD_IDS)
def test_next_probe_converges_on_clean_reference_curves(workload) -> None:
    # Lenet and Alexnet (knees at 20 and 19 of 24 cores) take 6 probes, the others 3-5.
    # Knees near the box's top answer a core or two above the 95 % point (see the 5 % test).
    samples = _profile(workload.sweet_spot_cores, max_cores=24, noise_rel=0.0, budget=8)
    assert len(samples) <= 6
    assert next_probe(samples, max_cores=24) is None
    fit = fit_curve([s[0] for s in samples], [s[1] for s in samples])
    assert fit.confidence >= 0.9
    truth = cores_for_fraction(workload.sweet_spot_cores, max_cores=24)
    assert truth <= fit.sweet_spot_cores <= truth + max(1, math.ceil(0.1 * truth))


@pytest.mark.parametrize("workload", REFERENCE_WORKLOADS, ids=WORKLOAD_IDS)
def test_next_probe_with_2pct_noise_reaches_the_target_within_10_percent(workload) -> None:
    samples = _profile(workload.sweet_spot_cores, max_cores=24, noise_rel=0.02, budget=8)
    fit = fit_curve([s[0] for s in samples], [s[1] for s in samples])
    truth = cores_for_fraction(workload.sweet_spot_cores, max_cores=24)
    assert truth <= fit.sweet_spot_cores <= truth + max(1, math.ceil(0.1 * truth))


def test_next_probe_is_deterministic() -> None:
    a = _profile(13.0, max_cores=32, noise_rel=0.03, budget=8, seed=4)
    b = _profile(13.0, max_cores=32, noise_rel=0.03, budget=8, seed=4)
    assert a == b
    assert next_probe(a[:3], max_cores=32) == next_probe(list(a[:3]), max_cores=32)


def test_next_probe_returns_none_when_every_core_count_was_tried() -> None:
    samples = [(float(c), float(v)) for c, v in zip(range(1, 5), [5.0, 1.0, 9.0, 2.0], strict=True)]
    assert next_probe(samples, max_cores=4, confident_at=1.0) is None


def test_next_probe_rejects_bad_range() -> None:
    with pytest.raises(ModelError):
        next_probe([], max_cores=4, min_cores=5)


# --- cpus_per_gpu_for_request ------------------------------------------------------------


@pytest.mark.parametrize(
    ("sweet", "gpus_per_node", "nodes", "measured", "expected"),
    [
        (6, 1, 1, None, 6),  # one GPU: the sweet spot itself
        (6, 4, 1, None, 6),  # one node: linear in GPUs, per-GPU value unchanged
        (6, 8, 1, 2, 6),  # measured multi-node value is ignored on one node
        (6, 4, 2, None, 3),  # 1N2G cap: 6*2 cores per node over 4 GPUs
        (6, 2, 4, None, 6),  # two GPUs per node: the cap does not bind
        (5, 8, 2, None, 2),  # 5*2 = 10 cores over 8 GPUs, rounded up
        (1, 8, 3, None, 1),  # never below one core
        (6, 4, 2, 1, 1),  # measured multi-node demand wins
        (20, 4, 2, 7, 7),
    ],
)
def test_cpus_per_gpu_for_request(sweet, gpus_per_node, nodes, measured, expected) -> None:
    got = cpus_per_gpu_for_request(
        sweet, gpus_per_node=gpus_per_node, nodes=nodes, multi_node_cpus_per_gpu=measured
    )
    assert got == expected


def test_cpus_per_gpu_multi_node_cap_is_configurable() -> None:
    assert cpus_per_gpu_for_request(6, gpus_per_node=4, nodes=2, multi_node_gpu_cap=4) == 6
    assert cpus_per_gpu_for_request(6, gpus_per_node=4, nodes=2, multi_node_gpu_cap=1) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus_per_node": 0, "nodes": 1},
        {"gpus_per_node": 4, "nodes": 0},
        {"gpus_per_node": 4, "nodes": 2, "multi_node_cpus_per_gpu": 0},
    ],
)
def test_cpus_per_gpu_rejects_bad_requests(kwargs) -> None:
    with pytest.raises(ValueError):
        cpus_per_gpu_for_request(4, **kwargs)


# --- CLI ---------------------------------------------------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    group = click.Group(name="coda-slurm")
    group.add_command(model)
    rc = run_cli(group, "coda-slurm", argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _write_csv(path: Path, cores, throughput, gpus=None) -> Path:
    header = "cores,throughput" + (",gpus" if gpus is not None else "")
    lines = [header]
    for i, (c, y) in enumerate(zip(cores, throughput, strict=True)):
        lines.append(f"{c},{y}" + (f",{gpus[i]}" if gpus is not None else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def googlenet_csv(tmp_path: Path) -> Path:
    cores = np.array([1.0, 4.0, 8.0, 12.0, 16.0, 24.0])
    return _write_csv(tmp_path / "s.csv", cores.astype(int), throughput_curve(11, cores, peak=300))


def test_cli_fit_text(googlenet_csv: Path, capsys) -> None:
    rc, out, err = _cli(["model", "fit", str(googlenet_csv)], capsys)
    assert rc == 0, err
    assert "sweet spot" in out and "11 cores" in out
    assert "knee θ" in out and "11.00" in out
    assert "confidence" in out and "R²" in out and "RMSE" in out


def test_cli_fit_json(googlenet_csv: Path, capsys) -> None:
    rc, out, _ = _cli(["model", "fit", str(googlenet_csv), "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["sweet_spot_cores"] == 11
    assert data["theta_cores"] == pytest.approx(11.0, abs=0.05)
    assert data["p2"] == pytest.approx(300.0)
    assert data["per_gpu"] is False
    assert {"p0", "p1", "confidence", "r2", "rmse_rel", "n_samples"} <= set(data)


H200 = Path(__file__).parents[1] / "data" / "h200"


@pytest.mark.parametrize(
    ("curve", "sweet_spot_cores"),
    [("resnet50-decoded", 4), ("lm", 1)],
)
def test_cli_fit_on_curves_measured_on_a_real_gpu(
    curve: str, sweet_spot_cores: int, capsys
) -> None:
    # PyTorch training on an H200 at 1-16 pinned cores (bench/bench_gpu_cores.py): the
    # fit must land where the measured throughput first reaches 95 % of its top.
    rc, out, err = _cli(["model", "fit", str(H200 / f"{curve}.csv"), "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    assert data["sweet_spot_cores"] == sweet_spot_cores
    assert data["still_rising"] is False


def test_cli_fit_says_when_a_measured_curve_is_still_rising_at_the_top(capsys) -> None:
    # ResNet-50 fed JPEGs on an H200: 12 cores give 89 % of what 16 give, so the plateau
    # was never measured and "15 cores" is a floor, not an answer.
    path = H200 / "resnet50-jpeg.csv"
    rc, out, _ = _cli(["model", "fit", str(path)], capsys)
    assert rc == 0
    assert "still rising" in out and "may be above 16 cores" in out
    rc, out, _ = _cli(["model", "fit", str(path), "--json"], capsys)
    data = json.loads(out)
    assert data["still_rising"] is True and data["measured_top_cores"] == 16


def test_cli_fit_rising_test_uses_per_gpu_counts_and_means(tmp_path: Path, capsys) -> None:
    # Repeated samples are averaged per count; with a gpus column the counts are per GPU.
    flat = _write_csv(tmp_path / "flat.csv", [2, 4, 8, 8], [50, 98, 100, 92])
    rc, out, _ = _cli(["model", "fit", str(flat), "--json"], capsys)
    assert rc == 0 and json.loads(out)["still_rising"] is False
    rising = _write_csv(tmp_path / "r.csv", [2, 4, 8, 16], [50, 80, 90, 100], gpus=[2] * 4)
    rc, out, _ = _cli(["model", "fit", str(rising)], capsys)
    assert rc == 0 and "may be above 8 cores per GPU" in out


def test_cli_plateau_fraction(tmp_path: Path, capsys) -> None:
    cores = np.arange(1, 25)
    path = _write_csv(tmp_path / "s.csv", cores, throughput_curve(20, cores, log_share=0.0))
    rc, out, _ = _cli(["model", "fit", str(path), "--json", "--plateau-fraction", "0.5"], capsys)
    assert rc == 0
    assert json.loads(out)["sweet_spot_cores"] == 10


def test_cli_gpus_column_normalises_per_gpu(tmp_path: Path, capsys) -> None:
    # Two-GPU probes: 2x the cores and 2x the throughput of the one-GPU curve.
    cores = np.array([1.0, 4.0, 8.0, 12.0, 16.0, 24.0])
    y = throughput_curve(8, cores, peak=100)
    path = _write_csv(tmp_path / "s.csv", (2 * cores).astype(int), 2 * y, gpus=[2] * 6)
    rc, out, _ = _cli(["model", "fit", str(path), "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["per_gpu"] is True
    assert data["sweet_spot_cores"] == cores_for_fraction(8, max_cores=24)
    assert data["p2"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("", "empty file"),
        ("cpus,speed\n1,2\n", "line 1: header has no cores, throughput column"),
        ("cores,throughput\n1,10\n2,abc\n4,30\n", "line 3: throughput is not a number (got 'abc')"),
        ("cores,throughput\n1,10\n\n4\n", "line 4: no throughput value"),
        ("cores,throughput,gpus\n2,10,0\n", "line 2: gpus must be a positive integer"),
        ("cores,throughput\n1,10\n24,40\n", "cannot fit"),
        ("cores,throughput\n1,100\n8,50\n24,5\n16,10\n", "throughput falls"),
    ],
)
def test_cli_fit_errors(tmp_path: Path, capsys, content: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    rc, out, err = _cli(["model", "fit", str(path)], capsys)
    assert rc == 1
    assert out == ""
    assert err.startswith("coda-slurm: ")
    assert needle in err


def test_cli_fit_insufficient_samples_says_why(tmp_path: Path, capsys) -> None:
    path = _write_csv(tmp_path / "s.csv", [1, 24], [10, 40])
    rc, _, err = _cli(["model", "fit", str(path)], capsys)
    assert rc == 1
    assert f"cannot fit {path}" in err and "2 distinct core counts" in err


def test_cli_fit_missing_file(tmp_path: Path, capsys) -> None:
    rc, _, err = _cli(["model", "fit", str(tmp_path / "nope.csv")], capsys)
    assert rc == 1
    assert "cannot read" in err and "No such file" in err


def test_cli_fit_a_field_past_the_csv_limit_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "s.csv"
    path.write_text('cores,throughput\n1,"' + "x" * 200_000 + '"\n')
    rc, _, err = _cli(["model", "fit", str(path)], capsys)
    assert rc == 1
    assert f"cannot read {path}" in err and "field larger than field limit" in err
