"""The what-if simulator: hand-checkable scenarios, invariants, and the shared policy code."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from coda_common.model.curves import cores_for_fraction, throughput_at
from coda_common.model.fit import is_censored
from coda_node.policy.contention import (
    ContentionParams,
    CpuJob,
    DnnJob,
    Eliminator,
    quota_ladder,
)
from coda_node.policy.observe import Progress
from slurm_plugin.cli.main import cli
from slurm_plugin.decision.decide import JobRequest, decide
from slurm_plugin.sim import engine
from slurm_plugin.sim.cluster import add_cpu_jobs, size_for_load
from slurm_plugin.sim.engine import POLICIES, SimParams, simulate
from slurm_plugin.sim.report import render_table, summarise
from slurm_plugin.sim.shield import NodeMix, settle, slowdowns
from slurm_plugin.sim.traces import NodeSpec, Trace, synthetic, uniform_nodes
from slurm_plugin.sim.workloads import JobModel, Workloads, assign_workloads

MODEL = JobModel()
CHECK = SimParams(check=True)
REPLACE_ONLY = ("UserValue=replace",)
"""The coda policy's hook without DefaultCpusPerGpu=share: a GPU job without a profile keeps
the cores its user asked (so a hand-made node mix stays as written)."""
UNPRICED = (*REPLACE_ONLY, "NodeThrottleGpuWorthCores=0")
"""... and every hold kept whatever it costs: a one-GPU job beside a 16-core job is not worth
the cores at coda.conf's price (that test is in test_contention_hold_test.py)."""


def make_trace(
    rows: list[tuple[float, float, int, int]] | list[tuple[float, float, int, int, int]],
    names: list[str] | None = None,
) -> Trace:
    """Jobs as (submit_s, duration_s, gpus, cpus[, workload index or -1]); without the
    index, GPU jobs get workload 0 ("w")."""
    gpus = np.array([r[2] for r in rows], dtype=np.int32)
    workload = [r[4] if len(r) > 4 else (0 if r[2] > 0 else -1) for r in rows]  # type: ignore[misc]
    t = Trace(
        name="hand",
        submit_s=np.array([r[0] for r in rows], dtype=float),
        duration_s=np.array([r[1] for r in rows], dtype=float),
        gpus=gpus,
        cpus=np.array([r[3] for r in rows], dtype=np.int32),
        nodes=np.ones(len(rows), dtype=np.int32),
        workload=np.array(workload, dtype=np.int32),
        workload_names=names or ["w"],
        gpu_model=np.full(len(rows), -1, dtype=np.int16),
        gpu_model_names=[],
        node_specs=None,
        source="test",
        notes=[],
    )
    t.validate()
    return t


def workloads_for(
    trace: Trace, theta: float, sensitivity: float = 0.0, bw_per_core: float = 10e9
) -> Workloads:
    wl = assign_workloads(
        trace,
        MODEL,
        1,
        named_classes={"w": (theta, (sensitivity,) * 3)},
    )
    wl.cpu_bw_per_core[trace.gpus == 0] = bw_per_core
    return wl


def run(trace: Trace, nodes: list[NodeSpec], wl: Workloads, policy: str, **kw: object):
    params = SimParams(check=True, **kw)  # type: ignore[arg-type]
    return simulate(trace, nodes, wl, MODEL, POLICIES[policy], params)


# --- hand-checkable scenarios ---------------------------------------------------------------


def test_two_jobs_one_gpu_the_second_waits_for_the_first() -> None:
    trace = make_trace([(0, 100, 1, 4), (10, 100, 1, 4)])
    wl = workloads_for(trace, theta=4)
    r = run(trace, uniform_nodes(1, 8, 1), wl, "slurm")
    assert r.start_s.tolist() == [0, 100]
    assert r.end_s.tolist() == pytest.approx([100, 200])
    s = summarise(trace, r)
    assert s.dnn_jct_mean_s == pytest.approx((100 + 190) / 2)
    assert s.finished == 2 and s.unfinished == 0


def test_starved_job_runs_at_its_curve_and_the_oracle_feeds_it() -> None:
    # θ = 4 cores; the user asked 4 (so the trace ran at full speed: work = 100 s).
    trace = make_trace([(0, 100, 1, 4)])
    wl = workloads_for(trace, theta=4)
    nodes = uniform_nodes(1, 16, 1)
    fixed = run(trace, nodes, wl, "fixed", fixed_cpus_per_gpu=2)
    rate = throughput_at(4, 2)  # 0.3*ln2/ln4 + 0.7*2/4 = 0.5
    assert rate == pytest.approx(0.5)
    assert fixed.end_s[0] == pytest.approx(100 / rate)
    assert fixed.cores_per_node[0] == 2
    oracle = run(trace, nodes, wl, "oracle")
    assert oracle.end_s[0] == pytest.approx(100)
    even = run(trace, nodes, wl, "even")
    assert even.cores_per_node[0] == 16  # one GPU: the whole node's cores


def test_a_cpu_job_backfills_beside_a_waiting_gpu_job_only_if_it_does_not_delay_it() -> None:
    # One node, 2 GPUs, 8 cores. Job 0 holds both GPUs and 4 cores, with a time limit of
    # 2 x 1000 s: job 1 (2 GPUs, 4 cores) is planned to start at t=2000 at the latest. A
    # CPU job of 4 cores whose limit ends before then may use the 4 free cores now (the
    # 100 s one at once, the 900 s one when the first is done); one whose limit ends after
    # (1000 s from t=4: 2004) would hold the cores job 1 needs, and must wait.
    trace = make_trace(
        [(0, 1000, 2, 4), (1, 500, 2, 4), (2, 100, 0, 4), (3, 900, 0, 4), (4, 1000, 0, 4)]
    )
    wl = workloads_for(trace, theta=1)
    r = run(trace, uniform_nodes(1, 8, 2), wl, "slurm")
    assert r.start_s[2] == 2  # backfilled at once
    assert r.start_s[3] == 102  # backfilled: ends by its limit (102 + 1800) before 2000
    assert r.start_s[1] == 1000  # the GPU job is not delayed
    assert r.start_s[4] >= 1000  # the one that would have delayed it waited
    # Without the GPU job waiting, the long CPU job starts at once.
    alone = make_trace([(0, 1000, 2, 4), (3, 800, 0, 4)])
    r2 = run(alone, uniform_nodes(1, 8, 2), workloads_for(alone, theta=1), "slurm")
    assert r2.start_s[1] == 3


def test_a_contention_episode_that_throttling_fixes() -> None:
    # A bandwidth-sensitive DNN job (slowdown 0.5 at full pressure) runs alone for 100 s,
    # then a memory-bound CPU job takes 16 cores (16 x 10 GB/s of a 200 GB/s node: 0.8).
    trace = make_trace([(0, 10_000, 1, 8), (100, 5000, 0, 16)])
    wl = workloads_for(trace, theta=8, sensitivity=0.5)
    nodes = uniform_nodes(1, 32, 1)
    raw = 0.5 * 0.8**MODEL.pressure_exponent
    assert 0.15 < raw < 0.25

    slurm = run(trace, nodes, wl, "slurm")
    cpu_end_slurm = 100 + 5000
    assert slurm.end_s[1] == pytest.approx(cpu_end_slurm)
    # 100 s at full speed, then slowed until the CPU job leaves, then full speed again.
    done_while_slowed = 5000 * (1 - raw)
    assert slurm.end_s[0] == pytest.approx(100 + 5000 + (10_000 - 100 - done_while_slowed))

    coda = run(trace, nodes, wl, "coda", coda_conf=UNPRICED)
    # The eliminator throttles the CPU job: the DNN job finishes sooner, the CPU job later.
    assert coda.end_s[0] < slurm.end_s[0] - 300
    assert coda.end_s[1] > cpu_end_slurm
    s = summarise(trace, coda)
    assert s.cpu_stretch_mean > 1.0
    # One CPU job: every form of its stretch is the same number.
    assert s.cpu_work_stretch == pytest.approx(s.cpu_stretch_mean)
    assert s.cpu_stretch_p50 == pytest.approx(s.cpu_stretch_mean)
    assert coda.counters["shield_settles"] >= 1


def test_a_dnn_job_that_never_had_a_quiet_period_is_shielded_after_a_baseline_probe() -> None:
    # The CPU job was there first: the eliminator has no baseline to compare with until its
    # baseline probe measures one (NodeBaselineProbeAfterS); then it throttles as usual.
    # Without the probe, coda-node (and hence the simulation of it) never throttles.
    trace = make_trace([(0, 5000, 0, 16), (100, 10_000, 1, 8)])
    wl = workloads_for(trace, theta=8, sensitivity=0.5)
    nodes = uniform_nodes(1, 32, 1)
    slurm = run(trace, nodes, wl, "slurm")
    off = run(
        trace,
        nodes,
        wl,
        "coda",
        contention=ContentionParams(baseline_probe_after_s=0.0),
        coda_conf=UNPRICED,
    )
    assert off.end_s[0] == pytest.approx(5000)
    assert off.counters["shield_settles"] == 0
    probed = run(trace, nodes, wl, "coda", coda_conf=UNPRICED)
    assert probed.counters["shield_settles"] >= 1
    # The CPU job is throttled: it ends later, and the DNN job sooner than without the probe.
    assert probed.end_s[0] > off.end_s[0] + 100
    assert probed.end_s[1] < off.end_s[1] - 100
    assert probed.end_s[1] < slurm.end_s[1]


def test_a_job_no_node_can_hold_is_rejected_not_queued_forever() -> None:
    trace = make_trace([(0, 100, 16, 8), (1, 100, 1, 4)])
    r = run(trace, uniform_nodes(1, 8, 8), workloads_for(trace, theta=2), "slurm")
    # 16 GPUs need two 8-GPU nodes and there is one: Slurm would refuse it at submission.
    assert r.counters["rejected"] == 1
    assert np.isnan(r.start_s[0])
    assert r.end_s[1] == pytest.approx(101)  # it blocks no one
    assert summarise(trace, r).rejected == 1


def test_the_oracle_gives_a_job_beyond_every_node_it_fits_the_most_it_can_have() -> None:
    # A 4-GPU job whose sweet spot is 48 cores: the 4-GPU node has 32, the node with 64 has
    # one GPU. The oracle gives it the 32 it can have and it runs, never a request no node
    # could hold, which Slurm would refuse and so take out of everyone's queue.
    trace = make_trace([(0, 100, 4, 4), (1, 100, 1, 4)])
    wl = workloads_for(trace, theta=12)
    nodes = [NodeSpec("g4", 32, 4, None), NodeSpec("c64", 64, 1, None)]
    r = run(trace, nodes, wl, "oracle")
    assert r.counters["rejected"] == 0
    assert r.cores_per_node.tolist() == [32, 12]
    assert not np.isnan(r.end_s).any()


def test_multi_node_job_spreads_gpus_evenly() -> None:
    trace = make_trace([(0, 100, 16, 32)])
    r = run(trace, uniform_nodes(2, 32, 8), workloads_for(trace, theta=2), "slurm")
    assert r.nodes_used[0] == 2
    assert r.cores_per_node[0] == 16  # 2 per GPU asked, 8 GPUs on each node


# --- invariants on every run -------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_runs() -> tuple[Trace, list[NodeSpec], Workloads, dict[str, engine.RunResult]]:
    trace = synthetic(600, n_gpus=64, seed=3, load=1.2)
    nodes = list(trace.node_specs or [])
    wl = assign_workloads(trace, MODEL, 3)
    runs = {name: simulate(trace, nodes, wl, MODEL, pol, CHECK) for name, pol in POLICIES.items()}
    return trace, nodes, wl, runs


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_job_finishes_once_and_utilisation_is_a_fraction(
    synthetic_runs: tuple[Trace, list[NodeSpec], Workloads, dict[str, engine.RunResult]],
    policy: str,
) -> None:
    trace, _nodes, _wl, runs = synthetic_runs
    r = runs[policy]
    assert r.counters["finished"] + r.counters["rejected"] == len(trace)
    done = ~np.isnan(r.end_s)
    assert int(done.sum()) == r.counters["finished"]
    assert np.all(r.start_s[done] >= trace.submit_s[done])
    assert np.all(r.end_s[done] >= r.start_s[done])
    width = np.diff(r.bin_edges_s)
    alloc = r.alloc_gpu_s / (r.total_gpus * width)
    eff = r.effective_gpu_s / (r.total_gpus * width)
    assert np.all(alloc >= -1e-9) and np.all(alloc <= 1 + 1e-9)
    assert np.all(eff >= -1e-9) and np.all(eff <= alloc + 1e-9)
    cores = r.busy_core_s / (r.total_cores * width)
    assert np.all(cores <= 1 + 1e-9)
    s = summarise(trace, r)
    assert 0.0 <= s.gpu_busy <= 1.0 + 1e-9
    assert s.gpu_busy == pytest.approx(s.gpu_util_effective / s.gpu_util_allocated)
    # A CPU job never runs faster than in the trace (its share of its cores is at most 1).
    assert 1.0 - 1e-9 <= s.cpu_stretch_p50 <= s.cpu_stretch_p99
    assert s.cpu_work_stretch >= 1.0 - 1e-9


def test_same_seed_same_results_other_seed_other_results(
    synthetic_runs: tuple[Trace, list[NodeSpec], Workloads, dict[str, engine.RunResult]],
) -> None:
    trace, nodes, wl, runs = synthetic_runs
    again = simulate(trace, nodes, wl, MODEL, POLICIES["coda"], CHECK)
    assert np.array_equal(again.end_s, runs["coda"].end_s, equal_nan=True)
    assert np.array_equal(again.cores_per_node, runs["coda"].cores_per_node)
    other = assign_workloads(trace, MODEL, 4)
    moved = simulate(trace, nodes, other, MODEL, POLICIES["coda"], CHECK)
    assert not np.array_equal(moved.end_s, runs["coda"].end_s, equal_nan=True)


def test_the_oracle_bounds_the_other_policies_jct(
    synthetic_runs: tuple[Trace, list[NodeSpec], Workloads, dict[str, engine.RunResult]],
) -> None:
    trace, _nodes, _wl, runs = synthetic_runs
    rows = {p: summarise(trace, r) for p, r in runs.items()}
    for p in ("slurm", "fixed", "even", "coda"):
        assert rows["oracle"].dnn_jct_mean_s <= rows[p].dnn_jct_mean_s
    table = render_table(list(rows.values()))
    assert "coda/slurm" in table and "oracle" in table


# --- the simulator runs the product's own policy code ---------------------------------------


@pytest.mark.parametrize(
    ("coda_conf", "first_cores"),
    [
        # The user asked 2 of the 6 cores it needs and the hook keeps that until there is a
        # profile: the first profiles are censored (still rising at the top of what the job
        # had), the hook gives more room each time, and it settles near 6.
        (REPLACE_ONLY, 2),
        # DefaultCpusPerGpu=share + UnprofiledUserValue=raise: the first run gets the node's
        # 24 cores, so it is not starved and coda-node probes it from above its sweet spot.
        (engine.CODA_CONF, 24),
    ],
)
def test_coda_cores_are_what_the_submit_hook_decides_from_the_published_profile(
    coda_conf: tuple[str, ...], first_cores: int
) -> None:
    # One workload, recurring: runs are probed until the profile settles, later runs get
    # the hook's answer from it and are left alone.
    rows = [(i * 4000.0, 3000.0, 1, 2) for i in range(8)]
    trace = make_trace(rows)
    wl = workloads_for(trace, theta=6)
    params = SimParams(check=True, coda_conf=coda_conf)
    sim = engine._Sim(trace, uniform_nodes(1, 24, 1), wl, MODEL, POLICIES["coda"], params, None)
    sim.run()
    profile = sim.profiles["workload:1000:w"]
    assert not is_censored(profile) and profile.confidence >= 0.8
    view = sim.views["workload:1000:w"]
    req = JobRequest(
        uid=1000,
        job_name="w",
        tres_per_node="gres:gpu:1",
        cpus_per_tres="gres:gpu:2",
        min_nodes=1,
        comment="coda:workload=w",
    )
    d = decide(req, sim.cfg, sim.views, sim.node_cap, node_share=sim.node_share)
    assert d.cpus_per_tres == f"gres:gpu:{view.cpus_per_gpu}"
    assert sim.cores_per_node[-1] == view.cpus_per_gpu
    assert sim.counters["probed_jobs"] < len(rows)  # the last runs were not probed
    assert sim.cores_per_node[0] == first_cores
    assert abs(view.cpus_per_gpu - cores_for_fraction(6, max_cores=24)) <= 1


def test_a_job_still_warming_up_does_not_hold_the_nodes_probe_slot() -> None:
    # Job 0 (200 s, shorter than coda-node's warm-up) starts first; job 1 (an hour) starts
    # a minute later on the same node. coda-node probes only after a job's warm-up, one job
    # at a time: job 0 ends before it would be probed, so job 1 is probed and publishes.
    rows = [(0.0, 200.0, 1, 12, 0), (60.0, 3600.0, 1, 12, 1)]  # 12: the node's share
    trace = make_trace(rows, names=["short", "long"])
    wl = assign_workloads(
        trace, MODEL, 1, named_classes={n: (6.0, (0.0,) * 3) for n in ("short", "long")}
    )
    sim = engine._Sim(trace, uniform_nodes(1, 24, 2), wl, MODEL, POLICIES["coda"], CHECK, None)
    sim.run()
    assert sim.counters["probed_jobs"] == 1
    assert set(sim.profiles) == {"workload:1001:long"}
    # The short job lost no work to probes it never ran: it took its trace time.
    assert sim.end_s[0] - sim.start_s[0] == pytest.approx(200.0, rel=0.01)


def _two_jobs_on_one_node(second_s: float) -> engine._Sim:
    """Jobs 0 (long) and 1 (``second_s``), two workloads that need 6 cores, started
    together on one node with the node's share of 12 cores each."""
    rows = [(0.0, 20000.0, 1, 12, 0), (0.0, second_s, 1, 12, 1)]
    trace = make_trace(rows, names=["a", "b"])
    wl = assign_workloads(trace, MODEL, 1, named_classes={n: (6.0, (0.0,) * 3) for n in ("a", "b")})
    sim = engine._Sim(trace, uniform_nodes(1, 24, 2), wl, MODEL, POLICIES["coda"], CHECK, None)
    sim.run()
    return sim


def test_a_job_waits_for_the_nodes_probe_slot_and_is_probed_when_it_frees() -> None:
    # coda-node probes one job of a node at a time: job 1's warm-up ends while job 0 holds
    # the slot, so it waits, and the allocator gives it the slot when job 0's probes are
    # done. Its probes then run as they would have from the end of its warm-up.
    sim = _two_jobs_on_one_node(20000.0)
    assert sim.counters["probe_slot_busy"] == 1 and sim.counters["probe_slot_waited"] == 1
    assert sim.counters["probed_jobs"] == 2
    first = sim.probe_memo[(0, 12, 1)]
    second = sim.probe_memo[(1, 12, 1)]
    assert sim.profiles["workload:1000:a"].updated_unix_s == pytest.approx(first.done_after_s)
    second_done_s = first.done_after_s + (second.done_after_s - engine.WARMUP_S)
    assert sim.profiles["workload:1001:b"].updated_unix_s == pytest.approx(second_done_s)


def test_a_job_that_ends_while_it_waits_for_the_probe_slot_is_not_probed() -> None:
    # Job 1 ends after its warm-up but long before job 0's probes are done.
    sim = _two_jobs_on_one_node(engine.WARMUP_S + 60.0)
    assert sim.probe_memo[(0, 12, 1)].done_after_s > engine.WARMUP_S + 120.0
    assert sim.counters["probe_slot_busy"] == 1 and sim.counters["probe_slot_waited"] == 0
    assert sim.counters["probed_jobs"] == 1
    assert set(sim.profiles) == {"workload:1000:a"}
    # It lost no work to probes it never ran.
    assert sim.end_s[1] - sim.start_s[1] == pytest.approx(engine.WARMUP_S + 60.0, rel=0.01)


def test_a_job_that_ends_mid_probe_publishes_what_it_measured() -> None:
    # A run that ends after its allocation and a probe below it were measured but before
    # the allocator is done publishes those samples (coda_node.policy.allocator.ended_publication):
    # the workload's profile exists after it, unconfident, and the next run is probed again.
    probe = engine.probe_run(
        theta_cores=6.0, allocated_cores=24, gpus=1, params=SimParams().probe, seed=1
    )
    assert probe.partial, "a probe run that never measured two core counts"
    first_s, first = probe.partial[0]
    assert first_s < probe.done_after_s and len({c for c, _ in first}) >= 2
    # The job's run is its trace time at its 24 cores plus the work its probes cost.
    ends_s = (first_s + probe.done_after_s) / 2
    rows = [(0.0, ends_s - probe.lost_work_s, 1, 24, 0)]
    trace = make_trace(rows)
    wl = workloads_for(trace, theta=6)
    sim = engine._Sim(trace, uniform_nodes(1, 24, 1), wl, MODEL, POLICIES["coda"], CHECK, None)
    sim.run()
    assert sim.counters["profiles_published_ended"] == 1
    prof = sim.profiles["workload:1000:w"]
    assert prof.samples[0].cores == 24 and {s.run for s in prof.samples} == {"sim:0"}
    assert sim.end_s[0] == pytest.approx(ends_s, abs=1.0)
    [*_, (_, published)] = [x for x in probe.partial if x[0] <= ends_s]
    assert [s.cores for s in prof.samples] == [float(c) for c, _ in published]
    assert len(published) < len(probe.samples)  # fewer than a finished run publishes


def test_the_share_lifts_first_runs_and_shortens_them() -> None:
    # Eight different workloads, each run once, each needing 6 cores, users asking 2: the
    # hook knows none of them, so only UnprofiledUserValue=raise changes their cores.
    rows = [(i * 10.0, 3000.0, 1, 2, i) for i in range(8)]
    trace = make_trace(rows, names=[f"w{i}" for i in range(8)])
    wl = assign_workloads(
        trace, MODEL, 1, named_classes={f"w{i}": (6.0, (0.0,) * 3) for i in range(8)}
    )
    nodes = uniform_nodes(2, 32, 4)
    kept = run(trace, nodes, wl, "coda", coda_conf=REPLACE_ONLY)
    lifted = run(trace, nodes, wl, "coda")
    assert kept.cores_per_node.tolist() == [2] * 8
    assert lifted.cores_per_node.tolist() == [8] * 8  # 32 cores / 4 GPUs
    # The trace's runs were on the 2 cores the users asked; at 8 (past the sweet spot of 6)
    # the same work takes throughput_at(6, 2) of the time (the one job probed on each node
    # loses ~5 % to its probes).
    assert (kept.end_s - kept.start_s) == pytest.approx(3000.0 * np.ones(8), rel=0.05)
    expected = 3000.0 * throughput_at(6, 2)
    assert (lifted.end_s - lifted.start_s) == pytest.approx(expected * np.ones(8), rel=0.1)
    assert expected < 0.7 * 3000.0


def test_settle_is_the_daemons_eliminator_ticked() -> None:
    mix = NodeMix(dnn=((0.5, True),), cpu=((16, 10e9),), node_bw_bytes_per_s=200e9, exponent=4.2)
    got = settle(mix, ContentionParams())
    assert got.cpu_share[0] < 1.0
    assert got.dnn_slowdown[0] <= ContentionParams().trigger_slowdown + 1e-9
    # The daemon's own eliminator, driven by hand with the same readings, takes the same
    # first step.
    elim = Eliminator(ContentionParams(), quota=True)
    for k in range(5):
        elim.step(2.0 * k, {0: DnnJob(0, frozenset({0}), _train(100.0))}, {})
    slow = slowdowns(mix, [1.0])[0]
    for now in (10.0, 12.0):  # the rate is smoothed over two ticks
        out = elim.step(
            now,
            {0: DnnJob(0, frozenset({0}), _train(100 * (1 - slow)))},
            {1: CpuJob(1, frozenset({0}), 16, 16.0, None)},
        )
    assert out.throttles[1].quota_cores == pytest.approx(16 * ContentionParams().quota_fractions[0])
    # A trigger the slowdown never reaches: the same code does nothing.
    idle = settle(mix, ContentionParams(trigger_slowdown=0.9))
    assert idle.cpu_share == (1.0,) and idle.events == 0


def _train(rate: float) -> Progress:
    return Progress(rate=rate, source="gpu_util", phase="train", age_s=1e6, level=rate)


# --- inputs and the command --------------------------------------------------------------


def test_cluster_sized_for_load_and_cpu_jobs_mixed_in() -> None:
    trace = synthetic(2000, n_gpus=64, seed=1, load=0.5, cpu_job_fraction=0.0)
    trace.node_specs = None
    nodes = size_for_load(trace, 0.5, shape=(64, 8))
    assert 40 <= sum(n.gpus for n in nodes) <= 96
    mixed = add_cpu_jobs(trace, nodes, 0.3, seed=1)
    cpu = mixed.gpus == 0
    assert cpu.sum() > 0 and (mixed.gpus > 0).sum() == len(trace)
    assert np.all(np.diff(mixed.submit_s) >= 0)
    offered = float(np.sum(mixed.cpus[cpu] * mixed.duration_s[cpu]))
    span = float(mixed.submit_s[-1] - mixed.submit_s[0])
    load = offered / (sum(n.cores for n in nodes) * span)
    assert 0.15 < load < 0.6


def test_model_parameters_are_named_and_checked() -> None:
    m = JobModel().with_params({"pressure_exponent": "2", "class_weights": "1,0,0,0,0,0,0,0"})
    assert m.pressure_exponent == 2.0 and m.class_weights[0] == 1.0
    with pytest.raises(ValueError, match="unknown simulator parameter 'nope'"):
        JobModel().with_params({"nope": "1"})
    with pytest.raises(ValueError, match="pressure_exponent"):
        JobModel().with_params({"pressure_exponent": "high"})


def test_cli_table_json_and_errors() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["simulate", "synthetic:300,gpus=32", "-p", "slurm", "-p", "coda"])
    assert res.exit_code == 0, res.output
    assert "coda/slurm" in res.output and "µs per event" in res.output
    res = runner.invoke(cli, ["simulate", "synthetic:300,gpus=32", "--json", "-p", "oracle"])
    data = json.loads(res.output)
    assert data["schema_version"] == 1
    assert [r["policy"] for r in data["results"]] == ["oracle"]
    assert data["model"]["pressure_exponent"] == MODEL.pressure_exponent
    bad = runner.invoke(cli, ["simulate", "synthetic:300", "--param", "nope=1"])
    assert bad.exit_code != 0 and "unknown simulator parameter" in bad.output
    missing = runner.invoke(cli, ["simulate", "sacct:/nonexistent/file.txt"])
    assert missing.exit_code != 0 and "cannot load trace" in missing.output


def test_cli_coda_conf_overrides_the_coda_policys_hook_settings() -> None:
    runner = CliRunner()
    args = ["simulate", "synthetic:300,gpus=32", "--json", "-p", "coda"]
    default = json.loads(runner.invoke(cli, args).output)
    assert default["coda_conf"] == list(engine.CODA_CONF)
    plain = runner.invoke(
        cli, [*args, "--coda-conf", "defaultcpuspergpu=", "--coda-conf", "UnprofiledUserValue=keep"]
    )
    data = json.loads(plain.output)
    # A key given again replaces the default, whatever its case.
    assert data["coda_conf"] == [
        "UserValue=replace",
        "DefaultCpusPerGpu=",
        "UnprofiledUserValue=keep",
    ]
    # Unprofiled first runs keep their users' values: fewer cores are added, JCT is longer.
    assert data["results"][0]["dnn_jct_mean_s"] > default["results"][0]["dnn_jct_mean_s"]
    bad = runner.invoke(
        cli,
        [*args, "--coda-conf", "UnprofiledUserValue=raise", "--coda-conf", "DefaultCpusPerGpu="],
    )
    assert bad.exit_code != 0 and "UnprofiledUserValue=raise needs DefaultCpusPerGpu" in bad.output
    shapeless = runner.invoke(cli, [*args, "--coda-conf", "Bogus"])
    assert shapeless.exit_code != 0 and "is not KEY=VALUE" in shapeless.output


def test_cli_on_an_sacct_export_as_a_subprocess(tmp_path: Path) -> None:
    lines = ["JobID|JobName|User|Partition|Submit|Start|End|State|NNodes|AllocTRES|ReqTRES"]
    for i in range(40):
        start = f"2024-03-01T{10 + i // 10:02d}:{(i % 10) * 5:02d}:00"
        end = f"2024-03-01T{12 + i // 10:02d}:{(i % 10) * 5:02d}:00"
        gpus = "gres/gpu=1," if i % 3 else ""
        lines.append(
            f"{100 + i}|train{i % 4}|alice|gpu|{start}|{start}|{end}|COMPLETED|1|"
            f"billing=4,cpu=4,{gpus}mem=16G,node=1|cpu=4,{gpus}node=1"
        )
    export = tmp_path / "sacct.txt"
    export.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_plugin.cli.main",
            "simulate",
            f"sacct:{export}",
            "--nodes",
            "2:16:2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["jobs"] == 40 and data["gpus"] == 4
    assert {r["policy"] for r in data["results"]} == set(POLICIES)
    for r in data["results"]:
        assert r["finished"] == 40
        assert 0 <= r["gpu_util_allocated"] <= 1


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = CliRunner().invoke(
        cli, ["simulate", "synthetic:200,gpus=32", "-p", "slurm", "--plot", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    for name in ("utilisation.png", "jct_cdf.png"):
        p = tmp_path / name
        assert p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG"


def test_scalar_curve_is_the_vector_curve() -> None:
    from coda_common.model.curves import throughput_curve

    for theta in (1.0, 1.5, 3.0, 8.0, 19.3):
        for cores in (0.5, 1.0, 2.0, 7.9, 8.0, 30.0):
            want = float(throughput_curve(theta, np.array([cores]))[0])
            assert throughput_at(theta, cores) == pytest.approx(max(want, 0.0), abs=1e-12)


def _random_mix(rng: np.random.Generator) -> NodeMix:
    dnn = tuple(
        (float(rng.choice([0.05, 0.12, 0.2, 0.35, 0.5])), bool(rng.random() < 0.7))
        for _ in range(int(rng.integers(1, 4)))
    )
    cpu = tuple(
        (int(rng.choice([1, 2, 4, 8, 16, 32])), float(rng.choice([0.3e9, 2e9, 6e9])))
        for _ in range(int(rng.integers(1, 6)))
    )
    return NodeMix(
        dnn=dnn,
        cpu=cpu,
        node_bw_bytes_per_s=float(rng.choice([100e9, 200e9])),
        exponent=float(rng.choice([2.0, 4.2])),
        rdt=bool(rng.random() < 0.3),
    )


def _random_params(rng: np.random.Generator) -> ContentionParams:
    floor = float(rng.choice([0.1, 0.25]))
    return ContentionParams(
        trigger_slowdown=float(rng.choice([0.05, 0.1])),
        floor_fraction=floor,
        quota_fractions=quota_ladder(0.1, floor) if rng.random() < 0.5 else (0.75, 0.5, 0.25),
        release_hold_s=float(rng.choice([10.0, 30.0])),
        min_effect_per_core=float(rng.choice([0.0, 0.05])),
        min_gain_per_hold=float(rng.choice([0.0, 0.2])),
        baseline_probe_after_s=float(rng.choice([0.0, 60.0])),
    )


def test_settle_counts_the_ticks_it_skips_exactly_as_running_them() -> None:
    """Skipping the ticks in which the eliminator only repeats itself changes nothing a
    simulation reads, to the bit: shares, slowdowns, the transient, the events."""
    rng = np.random.default_rng(11)
    acted_any = False
    for _ in range(400):
        mix, params = _random_mix(rng), _random_params(rng)
        fast = settle(mix, params, settle_s=900.0)
        slow = settle(mix, params, settle_s=900.0, every_tick=True)
        assert fast == slow, (mix, params)
        acted_any |= fast.events > 0
    assert acted_any  # not only mixes the eliminator leaves alone


def test_settle_skips_most_ticks_of_a_hold() -> None:
    mix = NodeMix(
        dnn=((0.5, True), (0.2, True)),
        cpu=((32, 6e9), (16, 2e9)),
        node_bw_bytes_per_s=200e9,
        exponent=4.2,
    )
    params = ContentionParams(quota_fractions=quota_ladder(0.1, 0.1), floor_fraction=0.1)
    steps: list[float] = []

    class Counting(Eliminator):
        def step(self, now_s, dnn, cpu):  # type: ignore[no-untyped-def]
            steps.append(now_s)
            return super().step(now_s, dnn, cpu)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("slurm_plugin.sim.shield.Eliminator", Counting)
        fast = settle(mix, params)
        run_fast = len(steps)
        steps.clear()
        slow = settle(mix, params, every_tick=True)
        run_slow = len(steps)
    assert fast == slow and fast.events > 0
    assert run_fast < run_slow / 2


HUGE_JOB_HEADER = "JobID|JobName|Submit|Start|End|AllocTRES"


@pytest.mark.parametrize(
    ("job", "nodes_spec"),
    [
        # One job of 100 million GPUs: the sized cluster would hold it.
        (
            "1|a|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|gres/gpu=100000000",
            None,
        ),
        # One job of 8,000 years: the sized cluster would carry its load in one second.
        ("1|a|2024-03-01T10:00:00|2024-03-01T10:00:00|9999-12-31T00:00:00|gres/gpu=1", None),
        (
            "1|a|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|gres/gpu=1",
            "99999999:96:8",
        ),
    ],
)
def test_a_cluster_beyond_the_simulators_size_is_refused_at_once(
    tmp_path: Path, job: str, nodes_spec: str | None
) -> None:
    export = tmp_path / "sacct.txt"
    export.write_text(f"{HUGE_JOB_HEADER}\n{job}\n")
    args = ["simulate", f"sacct:{export}", "-p", "slurm"]
    if nodes_spec:
        args += ["--nodes", nodes_spec]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit)
    assert (
        "at most 200,000 nodes" in res.output or "more than the simulator's 200,000" in res.output
    )


def test_a_trace_offering_an_infinite_load_is_refused_at_once(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    # 10 GPUs for 1e308 s: GPU-seconds past the largest float.
    trace.write_text("timestamp,duration,num_gpus\n2017-10-09 07:01:55,1e308,10\n")
    res = CliRunner().invoke(cli, ["simulate", f"philly:{trace}", "-p", "slurm"])
    assert res.exit_code == 1, res.output
    assert "would need inf nodes, more than the simulator's 200,000" in res.output


@pytest.mark.parametrize(
    "param",
    [
        "time_limit_factor=nan",
        "pressure_exponent=inf",
        "log_share=-1",
        "sweet_spot_jitter=1e6",
        "node_mem_bw_bytes_per_s=0",
        "node_mem_bw_bytes_per_s=1e308",
        "share_gpu_busy=0",
        "share_switch_overhead=2",
        "share_mem_weight=vgg16:nan",
    ],
)
def test_a_param_the_model_cannot_run_with_is_refused_before_the_run(param: str) -> None:
    res = CliRunner().invoke(
        cli,
        [
            "simulate",
            "synthetic:50",
            "--cpu-load",
            "0.3",
            "--placement",
            "membw,share",
            "--param",
            param,
        ],
    )
    assert res.exit_code == 1, res.output
    assert f"bad --param (simulator parameter {param}" in res.output.replace("'", "")


@pytest.mark.parametrize(
    ("option", "value"), [("--load", "nan"), ("--cpu-load", "nan"), ("--seed", "-1")]
)
def test_an_option_value_out_of_range_is_a_usage_error(option: str, value: str) -> None:
    res = CliRunner().invoke(cli, ["simulate", "synthetic:50", "-p", "slurm", option, value])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{option}'" in res.output


# --- multi-node jobs' CPU use, measured ------------------------------------------------------


def _multi_node_runs(measured: bool) -> engine.RunResult:
    # A one-GPU run of workload "w" is probed (a confident single-node profile, about 2
    # cores per GPU), then three 16-GPU runs of it on 8-GPU nodes, one after the other.
    # Across nodes the job uses min(θ, 2) = 1.5 cores per GPU; MultiNodeGpuCap=2 gives it
    # ceil(2 x 2 / 8) = 1 per GPU, 8 cores a node.
    trace = make_trace(
        [
            (0, 20_000, 1, 8),
            (20_000, 5_000, 16, 16),
            (40_000, 5_000, 16, 16),
            (60_000, 5_000, 16, 16),
        ]
    )
    wl = workloads_for(trace, theta=1.5)
    return run(
        trace,
        uniform_nodes(3, 32, 8),
        wl,
        "coda",
        coda_conf=REPLACE_ONLY,
        multi_node_measured=measured,
    )


def test_a_starved_multi_node_run_gets_the_next_run_more_cores() -> None:
    rule = _multi_node_runs(measured=False)
    assert rule.cores_per_node[1:].tolist() == [8, 8, 8]  # the rule alone: starved each time
    assert rule.counters["multi_node_measured"] == 0
    got = _multi_node_runs(measured=True)
    # The first run used all 8 of its cores on both nodes and its GPUs waited on them: two
    # starved per-node figures of 1 core per GPU (MultiNodeMinSamples=2), a floor, so the
    # hook gives twice it (within the single-node figure) plus the margin: ceil(2 x 1.1) =
    # 3 per GPU (24 a node). There the job uses 12 with its GPUs busy: its demand, 1.5,
    # gives ceil(1.65) = 2 (16 a node).
    assert got.cores_per_node[1:].tolist() == [8, 24, 16]
    assert got.counters["multi_node_measured"] == 3
    assert got.counters["multi_node_figures"] == 6
    assert got.end_s[3] - got.start_s[3] < rule.end_s[3] - rule.start_s[3]


def test_multi_node_figures_count_only_with_min_samples() -> None:
    # MultiNodeMinSamples=3: the first run's two per-node figures are not enough, the
    # second run still gets the rule's cores.
    rows = [(0, 20_000, 1, 8)] + [(20_000.0 * k, 5_000, 16, 16) for k in range(1, 4)]
    trace = make_trace(rows)
    got = run(
        trace,
        uniform_nodes(3, 32, 8),
        workloads_for(trace, theta=1.5),
        "coda",
        coda_conf=(*REPLACE_ONLY, "MultiNodeMinSamples=3"),
        multi_node_measured=True,
    )
    assert got.cores_per_node[1:].tolist() == [8, 8, 24]


def test_a_multi_node_job_shorter_than_a_tick_gives_no_figure() -> None:
    # NodeIntervalS=1: coda-node sees a job of half a second in one tick at most.
    trace = make_trace([(0, 20_000, 1, 8), (20_000, 0.5, 16, 16), (40_000, 5_000, 16, 16)])
    got = run(
        trace,
        uniform_nodes(3, 32, 8),
        workloads_for(trace, theta=1.5),
        "coda",
        coda_conf=REPLACE_ONLY,
        multi_node_measured=True,
    )
    # Only the second run gives figures (two, when it ends): the third job would get them.
    assert got.counters["multi_node_measured"] == 1
    assert got.counters["multi_node_figures"] == 2
    assert got.cores_per_node[1:].tolist() == [8, 8]


def test_cli_multi_node_measured_is_said_in_the_report() -> None:
    runner = CliRunner()
    args = ["simulate", "synthetic:300,gpus=32", "-p", "coda"]
    assert json.loads(runner.invoke(cli, [*args, "--json"]).output)["multi_node_measured"] is False
    res = runner.invoke(cli, [*args, "--multi-node-measured"])
    assert res.exit_code == 0, res.output
    assert "multi-node jobs' per-node figures merged into their profiles" in res.output
    data = json.loads(runner.invoke(cli, [*args, "--multi-node-measured", "--json"]).output)
    assert data["multi_node_measured"] is True


def test_a_multi_node_demand_met_exactly_settles_above_it() -> None:
    # θ = 4 per GPU: across nodes the job uses exactly 2 per GPU. The rule gives it 2 (the
    # single-node fit is above 4 per GPU: ceil(cpg x 2 / 8) = 2), which it uses whole with
    # its GPUs busy: its demand, not a floor. The hook then gives ceil(2 x 1.1) = 3 per
    # GPU, where the job measures 2 again: it stays at 3, the margin's one core over it.
    rows = [(0, 20_000, 1, 8)] + [(20_000.0 * k, 5_000, 16, 16) for k in range(1, 6)]
    trace = make_trace(rows)
    got = run(
        trace,
        uniform_nodes(3, 64, 8),
        workloads_for(trace, theta=4),
        "coda",
        coda_conf=REPLACE_ONLY,
        multi_node_measured=True,
    )
    assert got.cores_per_node[1:].tolist() == [16, 24, 24, 24, 24]
    assert got.counters["multi_node_figures"] == 10


def test_a_starved_floor_reaches_the_demand_in_runs_not_cores() -> None:
    # Across nodes this workload needs what it needs on one node, 10 cores per GPU (80 a
    # node of 8 GPUs). The rule gives ceil(10 x 2 / 8) = 3 per GPU; each starved run's
    # figure is a floor, so the next run is given twice it plus the margin, at most the
    # single-node figure plus the margin: 3 -> ceil(6 x 1.1) = 7 -> 12 (what the 96-core
    # node holds), where its GPUs are busy and it measures its demand, 10: ceil(11) = 11
    # from then on. The margin alone would take a run per core.
    rows = [(0, 20_000, 1, 8)] + [(20_000.0 * k, 5_000, 16, 16) for k in range(1, 6)]
    trace = make_trace(rows)
    model = dataclasses.replace(MODEL, multi_node_cores_per_gpu=64.0)
    got = simulate(
        trace,
        uniform_nodes(3, 96, 8),
        workloads_for(trace, theta=10),
        model,
        POLICIES["coda"],
        SimParams(check=True, coda_conf=REPLACE_ONLY, multi_node_measured=True),
    )
    assert (got.cores_per_node[1:] // 8).tolist() == [3, 7, 12, 11, 11]
