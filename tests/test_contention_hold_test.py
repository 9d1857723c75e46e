"""The eliminator's benefit test of a hold (``NodeThrottleMinGainPct``) and its quota ladder
(``NodeThrottleStepPct``), closed loop on the simulator's node model
(slurm_plugin.sim.shield): a hold that buys too little is given back whole, one that buys
enough is kept, and with the keys unset the eliminator does what it did without them."""

from __future__ import annotations

import dataclasses

import pytest

from coda_node.daemon.adaptive import training_gpus
from coda_node.policy.contention import (
    ContentionParams,
    CpuJob,
    DnnJob,
    Eliminator,
    params_from_config,
    quota_ladder,
    throttle_share,
)
from coda_node.policy.observe import Progress
from slurm_plugin.config.codaconf import ConfigError, parse_config
from slurm_plugin.sim.shield import NodeMix, settle, slowdowns

GB = 1e9
SOCKET = frozenset({0})
BASE = ContentionParams(floor_fraction=0.1, min_effect_per_core=0.0)

# A DNN job 50 % slower at full pressure beside one 32-core memory-bound job: holding that
# one job back takes the DNN job from 50 % to under the trigger.
CHEAP = NodeMix(
    dnn=((0.5, True),), cpu=((32, 10 * GB),), node_bw_bytes_per_s=200 * GB, exponent=4.2
)
# A less sensitive DNN job beside three memory-bound jobs and a compute-bound one: curing it
# takes three jobs down to their floor, for about 26 points of slowdown.
DEAR = NodeMix(
    dnn=((0.3, True),),
    cpu=((16, 10 * GB), (16, 10 * GB), (16, 10 * GB), (8, 0.5 * GB)),
    node_bw_bytes_per_s=200 * GB,
    exponent=4.2,
)


def _p(**kw: object) -> ContentionParams:
    return dataclasses.replace(BASE, **kw)  # type: ignore[arg-type]


def test_by_default_there_is_no_test() -> None:
    assert ContentionParams().min_gain_per_hold == 0.0
    for mix in (CHEAP, DEAR):
        assert min(settle(mix, _p()).cpu_share) < 1.0


def test_a_hold_that_buys_too_little_is_given_back() -> None:
    dear = settle(DEAR, _p(min_gain_per_hold=0.2))
    assert dear.cpu_share == (1.0,) * 4
    assert dear.dnn_slowdown[0] == pytest.approx(0.3)
    cheap = settle(CHEAP, _p(min_gain_per_hold=0.2))
    assert cheap.cpu_share[0] < 0.5
    assert cheap.dnn_slowdown[0] < BASE.trigger_slowdown


def test_a_low_threshold_keeps_the_hold() -> None:
    assert settle(DEAR, _p(min_gain_per_hold=0.05)) == settle(DEAR, _p())


def test_the_ladder() -> None:
    assert quota_ladder(0.1, 0.1) == (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
    assert quota_ladder(0.25, 0.25) == (0.75, 0.5)
    assert quota_ladder(0.5, 0.1) == (0.5,)


def _params(*lines: str) -> ContentionParams:
    cfg, _ = parse_config("\n".join(lines), source="test")
    return params_from_config(cfg)


def test_coda_conf_keys() -> None:
    default = _params()
    assert default.quota_fractions == quota_ladder(0.1, 0.1)
    assert default.floor_fraction == pytest.approx(0.1)
    assert default.min_gain_per_hold == pytest.approx(0.2)
    assert default.gpu_worth_cores == pytest.approx(14.0)
    coarse = _params(
        "NodeThrottleStepPct=",
        "NodeThrottleFloorPct=25",
        "NodeThrottleMinGainPct=0",
        "NodeThrottleGpuWorthCores=0",
    )
    assert coarse.quota_fractions == (0.75, 0.5, 0.25) == ContentionParams().quota_fractions
    assert coarse.min_gain_per_hold == 0.0
    assert coarse.gpu_worth_cores == 0.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("NodeThrottleStepPct=0", "NodeThrottleStepPct must be more than 0 and at most 50"),
        ("NodeThrottleStepPct=60", "NodeThrottleStepPct must be more than 0 and at most 50"),
        ("NodeThrottleMinGainPct=101", "NodeThrottleMinGainPct must be 0..100"),
        ("NodeThrottleMinGainPct=much", "NodeThrottleMinGainPct must be a number"),
        ("NodeThrottleGpuWorthCores=20000", "NodeThrottleGpuWorthCores must be 0..10000"),
        ("NodeThrottleGpuWorthCores=lots", "NodeThrottleGpuWorthCores must be a number"),
    ],
)
def test_bad_values_are_refused(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(line, source="test")


# -- the price of a hold (NodeThrottleGpuWorthCores) ---------------------------------------

LADDER = _p(quota_fractions=quota_ladder(0.1, 0.1))


def test_a_hold_that_costs_more_cores_than_its_gpus_are_worth_is_given_back() -> None:
    """CHEAP's one 32-core job held back for a one-GPU job costs ~19 cores for ~0.42 GPUs:
    at 14 cores a GPU it is given back. For an 8-GPU job the same hold is worth it."""
    priced = dataclasses.replace(LADDER, gpu_worth_cores=14.0)
    one_gpu = settle(dataclasses.replace(CHEAP, dnn_gpus=(1,)), priced)
    assert one_gpu.cpu_share == (1.0,)
    assert one_gpu.dnn_slowdown[0] == pytest.approx(0.5)
    eight_gpus = settle(dataclasses.replace(CHEAP, dnn_gpus=(8,)), priced)
    assert eight_gpus.cpu_share[0] < 0.5
    assert eight_gpus.dnn_slowdown[0] < BASE.trigger_slowdown
    # Without the test the GPUs make no difference.
    assert settle(dataclasses.replace(CHEAP, dnn_gpus=(1,)), LADDER) == eight_gpus


def _drive(params: ContentionParams, phases: list[tuple[tuple[tuple[int, float], ...], int]]):
    """One DNN job (2 GPUs, 50 % slower at full pressure) beside the CPU jobs of each phase in
    turn, closed loop on the simulator's node model. Returns the shares at the end of each
    phase and the eliminator's events."""
    elim = Eliminator(params, quota=True)
    now_s = 0.0

    def job(rate: float) -> dict[int, DnnJob]:
        prog = Progress(rate=rate, source="gpu_util", phase="train", age_s=0.0, level=rate)
        return {0: DnnJob(0, SOCKET, prog, gpus=2)}

    for _ in range(params.baseline_min_ticks):
        elim.step(now_s, job(100.0), {})
        now_s += 2.0
    shares: dict[int, float] = {}
    ends: list[list[float]] = []
    events = []
    for cpu, ticks in phases:
        mix = NodeMix(dnn=((0.5, True),), cpu=cpu, node_bw_bytes_per_s=200 * GB, exponent=4.2)
        for _ in range(ticks):
            q = [shares.get(1 + j, 1.0) for j in range(len(cpu))]
            slow = slowdowns(mix, q)
            jobs = {1 + j: CpuJob(1 + j, SOCKET, c, c * q[j], None) for j, (c, _) in enumerate(cpu)}
            out = elim.step(now_s, job(100.0 * (1.0 - slow[0])), jobs)
            now_s += 2.0
            events += out.events
            shares = {
                j: throttle_share(t, jobs[j].allocated_cores) for j, t in out.throttles.items()
            }
        ends.append([round(shares.get(1 + j, 1.0), 6) for j in range(len(cpu))])
    return ends, events


def test_a_hold_is_priced_again_when_it_grows() -> None:
    """A 16-core job held to 60 % for a 2-GPU job is worth it (6.4 cores for ~0.8 GPUs). Then
    a 32-core memory-bound job starts beside them: the hold grows to ~40 cores for under a
    GPU, and is given back whole once priced again. Priced once, it would have stayed."""
    first = ((16, 14 * GB),)
    then = ((16, 14 * GB), (32, 10 * GB))
    priced = dataclasses.replace(LADDER, gpu_worth_cores=14.0)
    ends, events = _drive(priced, [(first, 300), (then, 300)])
    assert ends[0][0] < 1.0
    assert ends[1] == [1.0, 1.0]
    given_back = [e for e in events if e.action == "release"]
    assert {e.job_id for e in given_back} == {1, 2}
    assert all("GPUs to job 0" in e.rule and "cores" in e.rule for e in given_back)
    # Without the price the grown hold is kept.
    ends, _ = _drive(LADDER, [(first, 300), (then, 300)])
    assert ends[0][0] < 1.0 and max(ends[1]) < 1.0


def test_a_multi_node_job_is_priced_with_all_its_gpus() -> None:
    assert training_gpus(2, 4) == 8
    assert training_gpus(8, 1) == 8
    assert training_gpus(0, 1) == 1  # a GPU job whose GPUs are not known here: one
