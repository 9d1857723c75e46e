"""The eliminator's benefit test of a hold (``NodeThrottleMinGainPct``) and its quota ladder
(``NodeThrottleStepPct``), closed loop on the simulator's node model
(slurm_plugin.sim.shield): a hold that buys too little is given back whole, one that buys
enough is kept, and with the keys unset the eliminator does what it did without them."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from coda_common.config.codaconf import CodaConfig, load_config, parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import (
    NodeShape,
    PartitionShape,
    read_slurm_conf,
    spread_partitions,
)
from coda_node.daemon.adaptive import AdaptiveLoop, contention_params, training_gpus
from coda_node.policy.contention import (
    ContentionParams,
    CpuJob,
    DnnJob,
    Eliminator,
    gpu_worth_cores,
    params_from_config,
    quota_ladder,
    throttle_share,
)
from coda_node.policy.observe import Progress
from coda_node.system.paths import SystemRoot
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


# -- the price's default: 14, or 10 on a node whose memory-bound CPU jobs are spread ---------

SLURM_CONF = """\
NodeName=DEFAULT CPUs=96 RealMemory=500000
NodeName=gpu[01-02] Gres=gpu:8,membw:200
NodeName=gpu03 Gres=gpu:8
NodeName=gpu04 Gres=gpu:8,membw:200
PartitionName=spread Nodes=gpu[01-02]
PartitionName=all Nodes=gpu[01-04] Default=YES
"""


def _node_conf(tmp_path: Path, *lines: str, slurm_conf: str | None = SLURM_CONF) -> CodaConfig:
    if slurm_conf is not None:
        (tmp_path / "slurm.conf").write_text(slurm_conf)
    coda = tmp_path / "coda.conf"
    coda.write_text("\n".join(lines) + "\n")
    return load_config(coda)


def test_the_price_is_14_and_10_where_the_hook_spreads_memory_bound_cpu_jobs() -> None:
    cfg, _ = parse_config("", source="test")
    assert cfg.node_throttle_gpu_worth_cores is None
    assert gpu_worth_cores(cfg) == 14.0
    assert gpu_worth_cores(cfg, membw_spread=True) == 10.0
    assert params_from_config(cfg, membw_spread=True).gpu_worth_cores == 10.0
    # An admin's value holds either way, 0 (no price test) included.
    for value in (0.0, 20.0):
        set_, _ = parse_config(f"NodeThrottleGpuWorthCores={value:g}", source="test")
        assert gpu_worth_cores(set_) == gpu_worth_cores(set_, membw_spread=True) == value


@pytest.mark.parametrize(
    ("node", "lines", "price"),
    [
        ("gpu02", ("MemBwSpreadGres=membw",), 10.0),  # partition spread: membw on every node
        ("gpu03", ("MemBwSpreadGres=membw",), 14.0),  # gpu03 has no membw: CPU jobs packed
        # gpu04 has membw, but its only partition has a node without it: the hook asks for
        # none there (Slurm would refuse the job), so its CPU jobs are packed.
        ("gpu04", ("MemBwSpreadGres=membw",), 14.0),
        ("gpu02", ("MemBwSpreadGres=membw", "ExcludePartitions=spread"), 14.0),
        ("gpu09", ("MemBwSpreadGres=membw",), 14.0),  # not in slurm.conf at all
        ("gpu02", (), 14.0),  # the hook does not spread: the GRES alone means nothing
        ("gpu02", ("MemBwSpreadGres=pcie",), 14.0),  # another GRES name
        ("gpu02", ("MemBwSpreadGres=membw", "NodeThrottleGpuWorthCores=14"), 14.0),
    ],
)
def test_coda_node_takes_the_spread_price_only_where_slurm_conf_gives_its_node_the_gres(
    tmp_path: Path, node: str, lines: tuple[str, ...], price: float
) -> None:
    cfg = _node_conf(tmp_path, *lines)
    loop = AdaptiveLoop(
        dataclasses.replace(cfg, profile_store=tmp_path / "store"),
        SystemRoot(tmp_path),
        node_name=node,
        mba=False,
    )
    assert loop.eliminator.params.gpu_worth_cores == price
    assert loop.hold_price.startswith(f"a hold priced at {price:g} cores a GPU")


def test_an_unreadable_slurm_conf_keeps_the_packed_price_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _node_conf(tmp_path, "MemBwSpreadGres=membw", slurm_conf=None)  # no slurm.conf
    with caplog.at_level(logging.INFO, logger="coda-node"):
        params, said = contention_params(cfg, "gpu02")
    assert params.gpu_worth_cores == 14.0
    assert said == (
        "a hold priced at 14 cores a GPU, CPU jobs taken as not spread: "
        f"{tmp_path / 'slurm.conf'} unreadable"
    )
    assert "cannot read" in caplog.text and "slurm.conf" in caplog.text
    assert "price of a hold: 14 cores per GPU" in caplog.text
    (tmp_path / "slurm.conf").write_text("NodeName=gpu[02 Gres=membw:200\n")  # damaged
    assert contention_params(cfg, "gpu02")[0].gpu_worth_cores == 14.0


def test_spread_partitions_are_those_of_the_node_the_hook_asks_for_the_gres_in() -> None:
    nodes = (
        NodeShape("cpu[001-100]", 64, 0, 100),
        NodeShape("gpu[01-04,07]", 96, 8, 5, gres=(("membw", 200), ("pcie", 2))),
    )
    parts = (
        PartitionShape("gpu", "gpu[01-04,07]", None),
        PartitionShape("all", "ALL", None),  # cpu nodes lack membw: none asked for
        PartitionShape("some", "gpu[01-02]", None),
        PartitionShape("sets", "gpunodes", None),  # a NodeSet: not known, so none asked for
    )
    assert spread_partitions("gpu07", nodes, parts, "membw") == ("gpu",)
    assert spread_partitions("gpu02", nodes, parts, "membw") == ("gpu", "some")
    assert spread_partitions("gpu02", nodes, parts, "membw", ("gpu",)) == ("some",)
    assert spread_partitions("gpu02", nodes, parts, "pcie") == ("gpu", "some")
    assert spread_partitions("cpu042", nodes, parts, "membw") == ()
    assert spread_partitions("gpu05", nodes, parts, "membw") == ()
    every = (PartitionShape("every", "ALL", None),)
    assert spread_partitions("gpu03", nodes[1:], every, "membw") == ("every",)


def test_a_symlink_loop_at_slurm_conf_is_an_unreadable_slurm_conf(tmp_path: Path) -> None:
    cfg = _node_conf(tmp_path, "MemBwSpreadGres=membw", slurm_conf=None)
    (tmp_path / "slurm.conf").symlink_to(tmp_path / "slurm.conf")
    params, said = contention_params(cfg, "gpu02")
    assert params.gpu_worth_cores == 14.0 and said.endswith("slurm.conf unreadable")
    with pytest.raises(ConfigError):
        read_slurm_conf(tmp_path / "slurm.conf")


def test_an_admin_price_of_0_says_holds_are_not_priced(tmp_path: Path) -> None:
    cfg = _node_conf(tmp_path, "NodeThrottleGpuWorthCores=0")
    assert contention_params(cfg, "gpu02") == (params_from_config(cfg), "holds not priced")
