"""refit_profile over several probing runs: each run's samples are relative to that run's
own top, so runs on other allocations or GPU counts must be put on one scale.

The runs are what coda-node's own allocator publishes when ticked over a known curve
(``slurm_plugin.sim.profiling.probe_run``, the simulator's driver of
``coda_node.policy.allocator.Allocator``): a ``g``-GPU job with a sweet spot of ``θ`` cores per
GPU has its knee at ``g·θ`` node cores, as in the simulator.
"""

from __future__ import annotations

import pytest

from coda_common.model.curves import cores_for_fraction
from coda_common.model.fit import is_censored, refit_profile, run_labels
from coda_common.store.profiles import Profile, Sample
from coda_node.policy.allocator import ProbeParams
from slurm_plugin.sim.profiling import probe_run

SIG = "workload:1000:train"


def _run(theta_per_gpu: float, gpus: int, allocated_cores: int, seed: int) -> list[Sample]:
    pr = probe_run(
        theta_cores=theta_per_gpu * gpus,
        allocated_cores=allocated_cores,
        gpus=gpus,
        params=ProbeParams(),
        seed=seed,
    )
    assert pr.samples, "the allocator published nothing"
    return [Sample(float(c), float(y), gpus, 1) for c, y in pr.samples]


def _refit(samples: list[Sample]) -> Profile:
    profile = Profile(
        signature=SIG,
        workload="train",
        cpus_per_gpu=1,
        confidence=0.0,
        n_samples=len(samples),
        updated_unix_s=1_700_000_000.0,
        source="test",
        samples=tuple(samples),
    )
    return refit_profile(profile)


# (case, θ per GPU, runs as (GPUs, allocated cores) in publishing order)
_MIXED_RUNS = [
    # A run that saw the plateau, then one given too few cores (normalised to 100 at its
    # own top of 12 cores, where the job really runs at ~65 % of its plateau).
    ("wider run, then a narrower one", 19.0, [(1, 24), (1, 12)]),
    ("narrower run, then a wider one", 19.0, [(1, 12), (1, 24)]),
    # The same workload on 1 GPU with room, then on 8 GPUs with a node's share (12/GPU).
    ("1 GPU with room, then 8 GPUs at 12 per GPU", 19.0, [(1, 24), (8, 96)]),
    ("8 GPUs at 12 per GPU, then 1 GPU with room", 19.0, [(8, 96), (1, 24)]),
    ("4 GPUs with room, then 1 GPU with little", 10.0, [(4, 64), (1, 8), (4, 64)]),
]


@pytest.mark.parametrize(
    ("case", "theta_per_gpu", "runs"), _MIXED_RUNS, ids=[c[0] for c in _MIXED_RUNS]
)
def test_runs_on_other_allocations_give_the_sweet_spot_of_the_widest(
    case: str, theta_per_gpu: float, runs: list[tuple[int, int]]
) -> None:
    samples = [s for i, (g, alloc) in enumerate(runs) for s in _run(theta_per_gpu, g, alloc, i)]
    result = _refit(samples)
    widest = max(alloc / g for g, alloc in runs)
    want = cores_for_fraction(theta_per_gpu, max_cores=int(widest))
    assert result.fit is not None and "error" not in result.fit, result.fit
    assert not is_censored(result)
    assert result.confidence >= 0.8
    assert abs(result.cpus_per_gpu - want) <= 1, (case, result.cpus_per_gpu, want)


# (case, θ per GPU, runs): every run was given fewer cores than the job needs.
_HUNGRY_RUNS = [
    ("8 GPUs needing 200 cores, given 64", 25.0, [(8, 64)]),
    ("8 GPUs given 64, then 4 GPUs given 32", 25.0, [(8, 64), (4, 32)]),
    ("4 GPUs given 32, then 8 GPUs given 64", 25.0, [(4, 32), (8, 64)]),
    ("8 GPUs given 96, 1 GPU given 12, 4 GPUs given 48", 21.6, [(8, 96), (1, 12), (4, 48)]),
]


@pytest.mark.parametrize(
    ("case", "theta_per_gpu", "runs"), _HUNGRY_RUNS, ids=[c[0] for c in _HUNGRY_RUNS]
)
def test_cpu_hungry_runs_never_publish_a_sweet_spot_inside_their_allocation(
    case: str, theta_per_gpu: float, runs: list[tuple[int, int]]
) -> None:
    samples = [s for i, (g, alloc) in enumerate(runs) for s in _run(theta_per_gpu, g, alloc, i)]
    result = _refit(samples)
    top_per_gpu = max(alloc / g for g, alloc in runs)
    # Still rising at the top of every run: the profile is only a lower bound, and the hook
    # must ask for more than any run had (so coda-node probes a wider run next).
    assert is_censored(result), (case, result.fit)
    assert result.cpus_per_gpu > top_per_gpu, (case, result.cpus_per_gpu)


def _samples(cores: list[float], gpus: list[int] | int = 1) -> list[Sample]:
    gs = gpus if isinstance(gpus, list) else [gpus] * len(cores)
    return [Sample(c, 100.0, g, 1) for c, g in zip(cores, gs, strict=True)]


@pytest.mark.parametrize(
    ("cores", "gpus", "labels"),
    [
        # One allocator run: allocation, floor, design probes (each count one block).
        ([12, 12, 12, 1, 10, 10, 11, 11], 1, [0] * 8),
        # Hand-written samples without repeats, in any order: one run.
        ([2, 4, 8, 12, 16, 24], 1, [0] * 6),
        ([24, 12, 1], 1, [0] * 3),
        # A second run on the same allocation: its allocation block comes back.
        ([12, 12, 1, 10, 11, 12, 12, 1, 10], 1, [0] * 5 + [1] * 4),
        # A wider run: its floor block comes back, after its allocation block.
        ([8, 8, 1, 7, 24, 24, 1, 10, 16], 1, [0] * 4 + [1] * 5),
        # A narrower run, not above anything measured before: found at its floor block.
        ([18, 18, 1, 14, 15, 9, 9, 1, 5], 1, [0] * 5 + [1] * 4),
        # Another GPU count is another run.
        (
            [12, 1, 10, 96, 8, 30, 12, 1, 11],
            [1, 1, 1, 8, 8, 8, 1, 1, 1],
            [0] * 3 + [1] * 3 + [2] * 3,
        ),
    ],
)
def test_run_labels(cores: list[float], gpus: list[int] | int, labels: list[int]) -> None:
    assert run_labels(_samples([float(c) for c in cores], gpus)).tolist() == labels
