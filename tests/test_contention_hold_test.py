"""The eliminator's benefit test of a hold (``NodeThrottleMinGainPct``) and its quota ladder
(``NodeThrottleStepPct``), closed loop on the simulator's node model
(slurm_plugin.sim.shield): a hold that buys too little is given back whole, one that buys
enough is kept, and with the keys unset the eliminator does what it did without them."""

from __future__ import annotations

import dataclasses

import pytest

from coda_node.policy.contention import ContentionParams, params_from_config, quota_ladder
from slurm_plugin.config.codaconf import ConfigError, parse_config
from slurm_plugin.sim.shield import NodeMix, settle

GB = 1e9
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
    coarse = _params("NodeThrottleStepPct=", "NodeThrottleFloorPct=25", "NodeThrottleMinGainPct=0")
    assert coarse.quota_fractions == (0.75, 0.5, 0.25) == ContentionParams().quota_fractions
    assert coarse.min_gain_per_hold == 0.0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("NodeThrottleStepPct=0", "NodeThrottleStepPct must be more than 0 and at most 50"),
        ("NodeThrottleStepPct=60", "NodeThrottleStepPct must be more than 0 and at most 50"),
        ("NodeThrottleMinGainPct=101", "NodeThrottleMinGainPct must be 0..100"),
        ("NodeThrottleMinGainPct=much", "NodeThrottleMinGainPct must be a number"),
    ],
)
def test_bad_values_are_refused(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(line, source="test")
