"""Tests for estimate_sweet_spot (fit or table) and refit_profile (merge_samples' refit)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from coda_common.model.curves import cores_for_fraction, noisy_samples, throughput_curve
from coda_common.model.fit import (
    InconsistentSamples,
    InsufficientSamples,
    SweetSpot,
    estimate_sweet_spot,
    fit_curve,
    is_censored,
    refit_profile,
)
from coda_common.store.profiles import Profile, ProfileStore, Sample

SIG = "workload:1000:train"


def _flatten(table: dict[int, list[float]]) -> tuple[list[float], list[float]]:
    cores = [float(k) for k, ys in table.items() for _ in ys]
    throughput = [float(y) for ys in table.values() for y in ys]
    return cores, throughput


def _profile(samples: tuple[Sample, ...], cpus_per_gpu: int = 7) -> Profile:
    return Profile(
        signature=SIG,
        workload="train",
        cpus_per_gpu=cpus_per_gpu,
        confidence=0.5,
        n_samples=len(samples),
        updated_unix_s=1_700_000_000.0,
        source="test",
        samples=samples,
    )


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    # ensure_root makes the root 0755 and owned by the test user, as readers require.
    return ProfileStore(ProfileStore(tmp_path / "profiles").ensure_root())


# --- estimate_sweet_spot: table ----------------------------------------------------------


def test_table_flat_curve_with_replicates_picks_fewest_cores() -> None:
    spot = estimate_sweet_spot(*_flatten({2: [100, 101, 99], 1: [99, 100, 98]}))
    assert spot.method == "table"
    assert spot.cores == 1
    assert spot.confidence > 0.9
    assert spot.fit is None
    assert spot.plateau_throughput == pytest.approx(100.0)


def test_table_rising_curve_picks_the_plateau_count() -> None:
    spot = estimate_sweet_spot(*_flatten({2: [100, 100, 100], 1: [50, 52, 51]}))
    assert spot.method == "table"
    assert spot.cores == 2
    assert spot.confidence > 0.9


def test_table_without_replicates_uses_the_noise_floor() -> None:
    spot = estimate_sweet_spot([1.0, 2.0], [100.0, 100.0])
    assert spot.method == "table"
    assert spot.cores == 1
    assert 0.0 < spot.confidence <= 1.0
    # 3 % floor: P(N(100, 3) >= 95) = Phi(5/3).
    assert spot.confidence == pytest.approx(0.9522, abs=1e-3)


def test_table_confidence_drops_when_the_choice_is_close() -> None:
    clear = estimate_sweet_spot(*_flatten({1: [99, 99, 99], 2: [100, 100, 100]}))
    close = estimate_sweet_spot(*_flatten({1: [95.5, 95.5], 2: [100, 100]}))
    assert clear.cores == close.cores == 1
    assert close.confidence < clear.confidence


def test_table_covers_the_explicit_range_only() -> None:
    # Counts 1 and 2 measured but the range is 1..3: not exhaustive, too few for a fit.
    with pytest.raises(InsufficientSamples):
        estimate_sweet_spot([1.0, 2.0], [50.0, 100.0], min_cores=1, max_cores=3)
    # Two counts that are not adjacent cannot be read off a table either.
    with pytest.raises(InsufficientSamples):
        estimate_sweet_spot([1.0, 4.0], [50.0, 100.0])


def test_insufficient_samples() -> None:
    with pytest.raises(InsufficientSamples):
        estimate_sweet_spot([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(InsufficientSamples):
        estimate_sweet_spot([1.0, 2.0], [0.0, 0.0])


def test_inconsistent_samples_propagate() -> None:
    cores = [1.0, 2.0, 4.0, 8.0, 16.0] * 2
    falling = [100.0, 80.0, 60.0, 40.0, 20.0] * 2
    with pytest.raises(InconsistentSamples):
        estimate_sweet_spot(cores, falling)


# --- estimate_sweet_spot: fit ------------------------------------------------------------


def test_fit_method_matches_fit_curve_on_a_24_core_curve() -> None:
    cores = np.array([1, 2, 4, 6, 8, 12, 16, 24], dtype=float)
    y = noisy_samples(7, 11.0, cores, 0.02, peak=250.0)
    spot = estimate_sweet_spot(cores, y)
    fit = fit_curve(cores, y)
    assert spot.method == "fit"
    assert spot.fit == fit
    assert spot.cores == fit.sweet_spot_cores
    assert spot.confidence == fit.confidence
    assert spot.plateau_throughput == fit.plateau_throughput


def test_three_exhaustive_counts_use_the_fit() -> None:
    spot = estimate_sweet_spot([1.0, 2.0, 3.0] * 2, [40.0, 80.0, 100.0, 41.0, 79.0, 101.0])
    assert spot.method == "fit"


def test_to_dict_is_plain_json() -> None:
    cores = np.array([1, 2, 4, 8, 16, 24], dtype=float)
    for spot in (
        estimate_sweet_spot([1.0, 2.0], [50.0, 100.0]),
        estimate_sweet_spot(cores, noisy_samples(1, 6.0, cores, 0.01)),
    ):
        d = spot.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False)) == d
        assert isinstance(d["cores"], int)
        assert (d["fit"] is None) == (spot.method == "table")
    assert isinstance(spot, SweetSpot)


# --- refit_profile -----------------------------------------------------------------------


def test_refit_on_merge_table(store: ProfileStore) -> None:
    samples = [
        Sample(cores=c, throughput=y, gpus=1, nodes=1)
        for c, y in ((1.0, 50.0), (1.0, 52.0), (2.0, 100.0), (2.0, 100.0), (3.0, 101.0))
    ]
    result = store.merge_samples(SIG, samples, refit=refit_profile)
    assert result.cpus_per_gpu == 2
    assert result.confidence > 0.9
    assert result.fit is not None
    assert result.fit["sweet_spot_cores_per_gpu"] == 2
    assert result.fit["n_used"] == 5
    assert not is_censored(result)
    assert store.read(SIG) == result


def test_refit_still_rising_at_the_top_is_censored_and_asks_for_more(store: ProfileStore) -> None:
    # A job given 2 cores doubled its rate from 1 to 2: its demand may well be above 2.
    samples = [
        Sample(cores=c, throughput=y, gpus=1, nodes=1)
        for c, y in ((2.0, 100.0), (2.0, 101.0), (1.0, 50.0), (1.0, 52.0))
    ]
    result = store.merge_samples(SIG, samples, refit=refit_profile)
    assert is_censored(result)
    assert result.fit is not None and result.fit["measured_top_cores_per_gpu"] == 2
    assert result.cpus_per_gpu == 3  # room for the next run to show where it flattens


def test_refit_drops_a_censored_run_once_a_wider_run_measures_above_it(
    store: ProfileStore,
) -> None:
    # Run 1 had 8 cores of a job whose true knee is 19: normalised to 100 at 8.
    theta = 19.0
    run1 = [
        (8, 100.0),
        (8, 100.0),
        (
            1,
            100
            * throughput_curve(theta, np.array([1.0]))[0]
            / throughput_curve(theta, np.array([8.0]))[0],
        ),
        (7, 92.0),
    ]
    first = store.merge_samples(
        SIG, [Sample(float(c), y, 1, 1) for c, y in run1], refit=refit_profile
    )
    assert is_censored(first) and first.cpus_per_gpu == 12
    # Run 2 was given 24 cores: its samples are relative to the real plateau.
    cores = np.array([24, 24, 1, 10, 16, 19, 20], dtype=float)
    y = 100 * throughput_curve(theta, cores)
    second = store.merge_samples(
        SIG,
        [Sample(c, t, 1, 1) for c, t in zip(cores.tolist(), y.tolist(), strict=True)],
        refit=refit_profile,
    )
    assert not is_censored(second)
    assert len(second.samples) == len(cores)  # run 1's samples are gone
    assert second.n_samples == len(run1) + len(cores)
    assert abs(second.cpus_per_gpu - cores_for_fraction(theta, max_cores=24)) <= 1


def test_refit_on_merge_fit_uses_single_node_per_gpu_samples(store: ProfileStore) -> None:
    cores = np.array([1, 2, 4, 6, 8, 12, 16, 24], dtype=float)
    y = noisy_samples(3, 8.0, cores, 0.02, peak=400.0)
    # Two GPUs per probe: 2x the cores and 2x the throughput say the same per GPU.
    two_gpu = [
        Sample(cores=2 * c, throughput=2 * t, gpus=2, nodes=1, gpu_model="H100")
        for c, t in zip(cores.tolist(), y.tolist(), strict=True)
    ]
    multi_node = Sample(cores=2.0, throughput=1.0, gpus=8, nodes=2)  # ignored
    # One run's samples, published together (as coda-node does), and a multi-node one.
    store.merge_samples(SIG, [multi_node], refit=refit_profile)
    result = store.merge_samples(SIG, two_gpu, refit=refit_profile)

    # Fitted in the 2-GPU job's own units (the curve is not scale-free), answered per GPU.
    fit = fit_curve(2 * cores, 2 * y, unit_cores=2)
    assert result.n_samples == 9
    assert result.fit is not None
    assert result.fit["method"] == "fit"
    assert result.fit["fit_gpus"] == 2
    assert result.fit["n_used"] == 8
    assert result.fit["sweet_spot_cores_per_gpu"] == -(-fit.sweet_spot_cores // 2)
    assert result.fit["p0"] == pytest.approx(fit.p0)
    assert result.fit["plateau_throughput"] == pytest.approx(fit.plateau_throughput / 2)
    assert result.cpus_per_gpu == -(-fit.sweet_spot_cores // 2)
    # Answered to a core per GPU (2 node cores), which an odd count rounds up per GPU.
    truth = cores_for_fraction(8.0, max_cores=24)
    assert truth <= result.cpus_per_gpu <= truth + 2
    assert result.confidence == pytest.approx(fit.confidence)
    assert result.validated() == result


def test_refit_of_an_8_gpu_job_finds_its_knee() -> None:
    # 8 GPUs needing 4 cores each: probes at 8..48 node cores. Per GPU (1..6 cores) the
    # log-plus-linear fit is biased; in the job's own units it is not.
    node_cores = np.array([48, 48, 48, 8, 16, 24, 28, 32, 36, 40], dtype=float)
    y = 100 * throughput_curve(32.0, node_cores)
    samples = tuple(
        Sample(cores=c, throughput=t, gpus=8, nodes=1)
        for c, t in zip(node_cores.tolist(), y.tolist(), strict=True)
    )
    result = refit_profile(_profile(samples))
    want = cores_for_fraction(32.0, max_cores=48)
    assert abs(result.cpus_per_gpu * 8 - want) <= 8
    assert not is_censored(result)


def test_multi_gpu_counts_per_gpu() -> None:
    # cores=4 on 2 GPUs is 2 per GPU; cores=2 on 2 GPUs is 1 per GPU.
    samples = (
        Sample(cores=4.0, throughput=200.0, gpus=2, nodes=1),
        Sample(cores=4.0, throughput=202.0, gpus=2, nodes=1),
        Sample(cores=2.0, throughput=100.0, gpus=2, nodes=1),
        Sample(cores=2.0, throughput=98.0, gpus=2, nodes=1),
    )
    result = refit_profile(_profile(samples))
    assert result.fit is not None
    assert result.fit["method"] == "table"
    assert result.fit["sweet_spot_cores_per_gpu"] == 2
    # Still doubling at the top: 2 per GPU is only a lower bound; the hook asks for 3.
    assert result.fit["measured_top_cores_per_gpu"] == 2
    assert result.cpus_per_gpu == 3
    assert result.fit["plateau_throughput"] == pytest.approx(100.5)


@pytest.mark.parametrize(
    "samples",
    [
        (),
        (Sample(cores=4.0, throughput=10.0, gpus=1, nodes=1),),
        (Sample(cores=4.0, throughput=10.0, gpus=4, nodes=2),) * 3,
        (
            Sample(cores=1.0, throughput=0.0, gpus=1, nodes=1),
            Sample(cores=2.0, throughput=0.0, gpus=1, nodes=1),
        ),
        (  # zero cores pass the store's checks but not the model's
            Sample(cores=0.0, throughput=5.0, gpus=1, nodes=1),
            Sample(cores=2.0, throughput=9.0, gpus=1, nodes=1),
        ),
        tuple(  # falling throughput: InconsistentSamples
            Sample(cores=c, throughput=120.0 - 5.0 * c, gpus=1, nodes=1)
            for c in (1.0, 2.0, 4.0, 8.0, 16.0, 1.0, 2.0, 4.0, 8.0, 16.0)
        ),
    ],
)
def test_refit_never_raises(samples: tuple[Sample, ...]) -> None:
    profile = _profile(samples, cpus_per_gpu=7)
    result = refit_profile(profile)
    assert result.cpus_per_gpu == 7
    assert result.confidence == 0.0
    assert result.fit is not None
    assert set(result.fit) == {"error"}
    assert isinstance(result.fit["error"], str) and result.fit["error"]
    assert result.validated() == result
    assert dataclasses.replace(result, confidence=0.5, fit=None) == profile


def test_refit_error_is_stored_by_merge(store: ProfileStore) -> None:
    one = [Sample(cores=4.0, throughput=10.0, gpus=1, nodes=1)]
    result = store.merge_samples(SIG, one, refit=refit_profile)
    assert result.confidence == 0.0
    assert result.cpus_per_gpu == 1  # the placeholder's
    assert result.fit is not None and "error" in result.fit
    stored = store.read(SIG)
    assert stored is not None and stored.samples == tuple(one)
