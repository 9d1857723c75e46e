"""GPU sharing in the simulator: the time-slicing model by hand, the
placements ``share`` and ``share-any`` on hand-checkable scenarios, the invariants, and that
the simulator asks the product's own ``shareable_workloads``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_plugin.cli.main import cli
from slurm_plugin.sim import mechanisms
from slurm_plugin.sim.cluster import busy_window
from slurm_plugin.sim.engine import POLICIES, RunResult, SimParams, simulate
from slurm_plugin.sim.mechanisms import ShareModel, shared_iteration_s
from slurm_plugin.sim.report import summarise
from slurm_plugin.sim.traces import NodeSpec, Trace, synthetic, uniform_nodes
from slurm_plugin.sim.workloads import JobModel, Workloads, assign_workloads
from tests.controller.test_sim import make_trace

EPS = JobModel().share_switch_overhead  # 0.05


# --- the ground truth: two jobs time-slicing one GPU ---------------------------------------


def shared(u_a: float, t_a: float, u_b: float, t_b: float) -> tuple[float, float]:
    """Iteration times together of two jobs given as (GPU busy share, iteration) alone."""
    s = 1.0 + EPS
    return shared_iteration_s(u_a * t_a * s, (1 - u_a) * t_a, u_b * t_b * s, (1 - u_b) * t_b)


def test_two_saturating_jobs_take_turns_and_pay_the_switches() -> None:
    # Always on the GPU: each waits out the other's whole iteration, ~2 (1 + ε) slower.
    assert shared(1.0, 1.0, 1.0, 1.0) == pytest.approx((2 * (1 + EPS), 2 * (1 + EPS)))
    assert shared(1.0, 3.0, 1.0, 3.0) == pytest.approx((6 * (1 + EPS), 6 * (1 + EPS)))


def test_two_half_busy_jobs_of_equal_iterations_interleave() -> None:
    # a on the GPU [0, .525]; b waits, runs [.525, 1.05]; a asks again at 1.025, waits
    # .025 for b, and so on: each iteration takes 2 x 0.525 = 1.05, near full speed.
    assert shared(0.5, 1.0, 0.5, 1.0) == pytest.approx((1.05, 1.05))


def test_light_jobs_only_pay_the_switch_overhead() -> None:
    # GPU phases of 0.21 fit in the other's private 0.8: no waiting, T' = T + ε g.
    assert shared(0.2, 1.0, 0.2, 1.0) == pytest.approx((1 + EPS * 0.2, 1 + EPS * 0.2))


def test_a_short_iteration_waits_out_a_long_ones_gpu_phase() -> None:
    # a: T 1, b: T 10, both half busy. b holds the GPU 5.25 at a time, once per 10.25:
    # a gets 5 iterations of 1.025 between two of b's phases, so 10.25 / 5 = 2.05 each;
    # b waits for a's phase of .525 minus the .4 of slack it had: 10.25.
    ta, tb = shared(0.5, 1.0, 0.5, 10.0)
    assert ta == pytest.approx(2.05)
    assert tb == pytest.approx(10.25)
    # The order the two are given in does not matter beyond the first grant.
    assert shared(0.5, 10.0, 0.5, 1.0) == pytest.approx((10.25, 2.05))


def test_incommensurate_iterations_stay_within_the_bounds() -> None:
    # Never faster than alone plus the overhead, never slower than waiting out the other's
    # GPU phase every iteration.
    ta, tb = shared(0.3, 1.0, 0.4, float(np.pi))
    assert 1 + EPS * 0.3 - 1e-9 <= ta <= 1 + 0.4 * np.pi * (1 + EPS) + 0.3 * (1 + EPS)
    assert np.pi * (1 + EPS * 0.4) - 1e-9 <= tb <= np.pi + 0.3 * (1 + EPS) * 2


def test_bad_phases_are_refused() -> None:
    with pytest.raises(ValueError, match="gpu_a_s"):
        shared_iteration_s(-1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="some time"):
        shared_iteration_s(0.0, 0.0, 1.0, 1.0)


# --- what the simulator assumes per workload -------------------------------------------------


def class_workloads(trace: Trace, theta_per_gpu: float = 4.0) -> Workloads:
    """Each named workload keeps its name (its model's M), θ fixed, no contention."""
    named = {n: (theta_per_gpu, (0.0, 0.0, 0.0)) for n in trace.workload_names}
    wl = assign_workloads(trace, JobModel(), 1, named_classes=named)
    wl.cpu_bw_per_core[trace.gpus == 0] = 0.0
    return wl


def test_share_model_takes_muris_stage_times_and_the_class_assumption() -> None:
    trace = make_trace([(0, 1, 8, 8, 0), (0, 1, 1, 4, 1)], names=["resnet18", "googlenet"])
    wl = class_workloads(trace)
    model = JobModel(share_gpu_busy=0.9)
    # Muri's medians for resnet18 on 8 GPUs: data 784, GPU 117, communication 77 ms.
    sm = ShareModel(wl, model, {("resnet18", 8): (784.0, 117.0, 77.0)}, margin=0.05, advised=True)
    u, t = sm.plateau(0, 8)
    assert u == pytest.approx(117 / 194) and t == pytest.approx(0.194)
    # A size it has no stages for takes the nearest measured one.
    assert sm.plateau(0, 4) == pytest.approx((117 / 194, 0.194))
    # Below its sweet spot the same GPU work is spread over a longer iteration.
    assert sm.alone(0, 8, 0.5) == pytest.approx((117 / 194 / 2, 0.388))
    # A class workload: the assumed busy share, and its model's M for the memory share.
    assert sm.plateau(1, 1) == (0.9, 1.0)
    cand = sm.candidate(1, 1, 1.0)
    assert (cand.workload, cand.gpu_util) == ("googlenet", 0.9)
    assert cand.gpu_mem_bw_util == pytest.approx(0.9 * 0.55)
    # Rate factors are T / T' of the time-slicing model, in the order asked.
    fa, fb = sm.rate_factors((0.5, 1.0), (0.5, 10.0))
    assert (fa, fb) == pytest.approx((1 / 2.05, 10 / 10.25))
    assert sm.rate_factors((0.5, 10.0), (0.5, 1.0)) == pytest.approx((fb, fa))


def test_share_assumptions_are_named_parameters() -> None:
    m = JobModel().with_params(
        {
            "share_switch_overhead": "0.1",
            "share_gpu_busy": "0.6",
            "share_mem_weight": "VGG16:0.1,newnet:0.9",
        }
    )
    assert m.share_switch_overhead == 0.1 and m.share_gpu_busy == 0.6
    weights = dict(m.share_mem_weight)
    assert weights["vgg16"] == 0.1 and weights["newnet"] == 0.9
    assert weights["googlenet"] == 0.55  # the others keep the table's value
    with pytest.raises(ValueError, match="MODEL:M"):
        JobModel().with_params({"share_mem_weight": "vgg16"})
    trace = make_trace([(0, 1, 1, 4, 0)], names=["vgg16"])
    with pytest.raises(ValueError, match="share_gpu_busy"):
        ShareModel(
            class_workloads(trace), JobModel(share_gpu_busy=0.0), {}, margin=0.05, advised=True
        )


# --- placement: hand-checked scenarios ---------------------------------------------------------


def pair_trace(names: tuple[str, str] = ("googlenet", "googlenet")) -> Trace:
    # One 1-GPU job at t=0 and one at t=100, 4 cores each (their sweet spot), 1000 s alone.
    idx = [0, 0] if names[0] == names[1] else [0, 1]
    return make_trace(
        [(0, 1000, 1, 4, idx[0]), (100, 1000, 1, 4, idx[1])],
        names=list(dict.fromkeys(names)),
    )


def run(
    trace: Trace, model: JobModel, nodes: list[NodeSpec] | None = None, **kw: object
) -> RunResult:
    params = SimParams(check=True, **kw)  # type: ignore[arg-type]
    nodes = nodes or uniform_nodes(1, 16, 1)
    return simulate(trace, nodes, class_workloads(trace), model, POLICIES["slurm"], params)


HALF_BUSY = JobModel(share_gpu_busy=0.5)
"""GPU busy half the time at the sweet spot: googlenet beside itself is predicted to gain
2 / (1 + 0.25 + 0.275^2) = 1.51 (M 0.55)."""


def test_without_sharing_the_second_job_waits() -> None:
    r = run(pair_trace(), HALF_BUSY)
    assert r.start_s.tolist() == [0, 1000]
    assert r.end_s.tolist() == pytest.approx([1000, 2000])


def test_the_second_job_starts_at_once_by_sharing() -> None:
    trace = pair_trace()
    r = run(trace, HALF_BUSY, gpu_share="advised")
    assert r.start_s.tolist() == [0, 100]
    # From t=100 both iterate 1.05x slower (interleaved half-busy jobs): job 0's last 900
    # s of work take 945 s, ending at 1045. Job 1 has done 945 / 1.05 = 900 s of work by
    # then and runs its last 100 alone: 1145. Its JCT is 1045 s instead of 1900.
    assert r.end_s.tolist() == pytest.approx([1045, 1145])
    s = summarise(trace, r)
    assert s.dnn_jct_mean_s == pytest.approx((1045 + 1045) / 2)
    assert r.counters["share_jobs"] == 2
    assert r.counters["share_gpu_s"] == 945
    assert r.counters["share_slowdown_x1000"] == 1050
    # One GPU, counted once while shared; both jobs' progress counts as effective work.
    # A CPU job submitted at t=1000 stretches the measuring window to [w0, 1000]: job 0
    # alone until 100, then 900 s of two jobs at 1 / 1.05 each.
    cpu = make_trace(
        [(0, 1000, 1, 4, 0), (100, 1000, 1, 4, 0), (1000, 10, 0, 1, -1)], names=["googlenet"]
    )
    w0, w1 = busy_window(cpu)
    assert w0 < 100 and w1 == 1000
    s = summarise(cpu, run(cpu, HALF_BUSY, gpu_share="advised"))
    assert s.gpu_util_allocated == pytest.approx(1.0)
    assert s.gpu_util_effective == pytest.approx((100 - w0 + 900 * 2 / 1.05) / (1000 - w0))


def test_advice_refuses_a_pair_predicted_to_lose_blind_sharing_takes_it() -> None:
    model = JobModel()  # GPU-bound at the sweet spot: beside itself 2 / (1 + 1 + .3) < 1
    advised = run(pair_trace(), model, gpu_share="advised")
    assert advised.start_s.tolist() == [0, 1000]
    assert advised.counters["share_jobs"] == 0
    assert advised.counters["share_eligible_jobs"] == 0
    blind = run(pair_trace(), model, gpu_share="any")
    assert blind.start_s.tolist() == [0, 100]
    # Both always on the GPU: 2.1x slower together. Job 0's last 900 s take 1890 (ends
    # 1990); job 1 has done 900 s by then and ends 100 s later. Both end later than
    # without sharing (1000 and 2000): sharing saturated GPUs loses.
    assert blind.end_s.tolist() == pytest.approx([1990, 2090])
    assert blind.counters["share_slowdown_x1000"] == 2100


def test_jobs_below_their_sweet_spot_are_advised_to_share() -> None:
    # GPU-bound at θ = 16 cores, but given 4: throughput 0.3 ln 4 / ln 16 + 0.7 x 4 / 16
    # = 0.325, so the GPU is busy 32.5 % of a (longer) iteration and the predictor says
    # two of them gain: 2 / (1 + .106 + .032) = 1.76.
    trace = pair_trace()
    r = simulate(
        trace,
        uniform_nodes(1, 32, 1),
        class_workloads(trace, theta_per_gpu=16.0),
        JobModel(),
        POLICIES["slurm"],
        SimParams(check=True, gpu_share="advised"),
    )
    assert r.start_s.tolist() == [0, 100]
    assert r.counters["share_jobs"] == 2


def test_the_simulator_asks_the_products_shareable_workloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, float, float, float]] = []

    def nobody(cands, *, margin):  # type: ignore[no-untyped-def]
        asked.extend((c.workload, c.gpu_util, c.gpu_mem_bw_util, margin) for c in cands)
        return []

    monkeypatch.setattr(mechanisms, "shareable_workloads", nobody)
    r = run(pair_trace(), HALF_BUSY, gpu_share="advised")
    assert r.start_s.tolist() == [0, 1000]  # the half-busy pair no longer shares
    assert asked == [("googlenet", 0.5, pytest.approx(0.5 * 0.55), 0.05)]

    def everybody(cands, *, margin):  # type: ignore[no-untyped-def]
        return [c.workload for c in cands]

    monkeypatch.setattr(mechanisms, "shareable_workloads", everybody)
    r = run(pair_trace(), JobModel(), gpu_share="advised")
    assert r.end_s.tolist() == pytest.approx([1990, 2090])  # the losing pair now shares


@pytest.mark.parametrize("names", [("vgg16", "alexnet"), ("alexnet", "vgg16")])
def test_both_jobs_must_be_named(names: tuple[str, str]) -> None:
    # GPU busy 95 %: vgg16 (M 0) beside itself gains 2 / (1 + .9025) = 1.051, alexnet
    # (M 1) loses, 2 / (1 + 2 x .9025) = 0.71. Neither may join the other.
    model = JobModel(share_gpu_busy=0.95, share_mem_weight=(("alexnet", 1.0), ("vgg16", 0.0)))
    r = run(pair_trace(names), model, gpu_share="advised")
    assert r.start_s.tolist() == [0, 1000]
    assert r.counters["share_eligible_jobs"] == 1


def test_at_most_two_jobs_per_gpu_and_only_equal_gpu_counts() -> None:
    # One node, 2 GPUs, 32 cores, GPU-bound jobs (2.1x slower shared). Job 0 takes one
    # GPU, job 1 the other; job 2 shares job 0's (t=10), job 3 job 1's (t=20). Job 4 finds
    # both GPUs held twice and waits. Job 0 ends at 10 + 990 x 2.1 = 2089; job 2 keeps the
    # GPU and job 4 joins it at once (10 s of job 2 left: it ends 2110; job 4 then runs its
    # last 90 s alone, 2200). Job 3 ends 20 + 2100 = 2120; job 1 has 980 s left then
    # (3100). Job 5 (2 GPUs) shares with no 1-GPU job: it waits for both GPUs, 3100.
    trace = make_trace(
        [
            (0, 1000, 1, 4, 0),
            (0, 2000, 1, 4, 0),
            (10, 1000, 1, 4, 0),
            (20, 1000, 1, 4, 0),
            (30, 100, 1, 4, 0),
            (40, 100, 2, 8, 0),
        ],
        names=["googlenet"],
    )
    r = run(trace, JobModel(), uniform_nodes(1, 32, 2), gpu_share="any")
    assert r.start_s.tolist() == pytest.approx([0, 0, 10, 20, 2089, 3100])
    assert r.end_s.tolist() == pytest.approx([2089, 3100, 2110, 2120, 2200, 3200])
    assert r.counters["share_jobs"] == 5


def test_multi_node_jobs_never_share() -> None:
    trace = make_trace([(0, 1000, 2, 4, 0), (100, 1000, 2, 4, 0)], names=["googlenet"])
    nodes = uniform_nodes(2, 16, 1)  # 2-GPU jobs span both nodes
    r = run(trace, HALF_BUSY, nodes, gpu_share="any")
    assert r.start_s.tolist() == [0, 1000]
    assert r.counters["share_jobs"] == 0


# --- invariants --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["slurm", "coda", "even"])
@pytest.mark.parametrize("mode", ["advised", "any"])
def test_invariants_with_sharing_on(policy: str, mode: str) -> None:
    trace = synthetic(1500, n_gpus=64, seed=3, gpus_per_node=4, cores_per_node=32)
    nodes = list(trace.node_specs or [])
    model = JobModel()
    wl = assign_workloads(trace, model, 3)
    params = SimParams(check=True, gpu_share=mode, reserve=True, pcie_interference=True)
    r = simulate(trace, nodes, wl, model, POLICIES[policy], params)
    done = ~np.isnan(r.end_s)
    assert r.counters["finished"] == int(done.sum())
    assert int(done.sum()) + r.counters["rejected"] == len(trace)
    assert np.all(r.end_s[done] >= r.start_s[done])
    s = summarise(trace, r)
    # A shared GPU counts once as allocated; both jobs' progress counts as effective.
    assert 0 <= s.gpu_util_allocated <= 1 + 1e-9
    assert 0 <= s.gpu_util_effective <= 2 * s.gpu_util_allocated + 1e-9
    if policy == "even":
        # A node's cores are split over its GPUs: a held GPU leaves no cores for a second
        # job (cores are not shared), so nothing shares.
        assert r.counters["share_jobs"] == 0
    elif mode == "any" or policy == "slurm":
        assert r.counters["share_jobs"] > 0
    if r.counters["share_jobs"]:
        assert 1000 <= r.counters["share_slowdown_x1000"] <= 2 * (1 + EPS) * 1000 + 1
    again = simulate(trace, nodes, wl, model, POLICIES[policy], params)
    assert np.array_equal(r.end_s, again.end_s, equal_nan=True)
    assert r.counters == again.counters


def test_sharing_off_changes_nothing() -> None:
    trace = synthetic(600, n_gpus=32, seed=5)
    nodes = list(trace.node_specs or [])
    wl = assign_workloads(trace, JobModel(), 5)
    plain = simulate(trace, nodes, wl, JobModel(), POLICIES["coda"], SimParams())
    other = JobModel(share_gpu_busy=0.3, share_switch_overhead=0.5)
    off = simulate(trace, nodes, wl, other, POLICIES["coda"], SimParams(share_margin=0.9))
    assert np.array_equal(plain.end_s, off.end_s, equal_nan=True)
    assert not any(k.startswith("share") for k in off.counters)


# --- the CLI -------------------------------------------------------------------------------


def test_cli_share_rows_and_counters() -> None:
    runner = CliRunner()
    args = ["simulate", "synthetic:400,gpus=32", "-p", "slurm", "--placement", "share-any,share"]
    res = runner.invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["placement"]["baseline_of"] == {
        "slurm+share": "slurm",
        "slurm+share-any": "slurm",
    }
    rows = {r["policy"]: r for r in doc["results"]}
    assert list(rows) == ["slurm", "slurm+share", "slurm+share-any"]
    assert "share_jobs" not in rows["slurm"]["counters"]
    for name in ("slurm+share", "slurm+share-any"):
        assert {"share_jobs", "share_gpu_s", "share_slowdown_x1000"} <= set(rows[name]["counters"])
    assert rows["slurm+share-any"]["counters"]["share_jobs"] > 0
    text = runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "slurm+share-any/slurm" in text.output
