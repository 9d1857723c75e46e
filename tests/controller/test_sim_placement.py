"""The placement mechanisms in the simulator: hand-checkable scenarios, invariants,
and that the simulator asks the product's own decision code (slurm_plugin.reserve.plan,
slurm_plugin.decision.placement)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_plugin.cli.main import cli
from slurm_plugin.sim import mechanisms
from slurm_plugin.sim.engine import POLICIES, RunResult, SimParams, _Sim, simulate
from slurm_plugin.sim.mechanisms import PlacementModel, traits_for
from slurm_plugin.sim.report import render_table, summarise
from slurm_plugin.sim.traces import NodeSpec, Trace, synthetic, uniform_nodes
from slurm_plugin.sim.workloads import JobModel, Workloads, assign_workloads
from tests.controller.test_sim import make_trace

MODEL = JobModel()


def workloads(trace: Trace, theta_per_gpu: float = 4.0) -> Workloads:
    """Each named workload keeps its name's placement traits; θ fixed, no contention."""
    named = {n: (theta_per_gpu, (0.0, 0.0, 0.0)) for n in trace.workload_names}
    wl = assign_workloads(trace, MODEL, 1, named_classes=named)
    wl.cpu_bw_per_core[trace.gpus == 0] = 0.0
    return wl


def run(trace: Trace, nodes: list[NodeSpec], policy: str = "slurm", **kw: object) -> RunResult:
    params = SimParams(check=True, **kw)  # type: ignore[arg-type]
    return simulate(trace, nodes, workloads(trace), MODEL, POLICIES[policy], params)


# --- (a) reserve: spare cores for CPU jobs ----------------------------------------------------


def reserve_trace() -> Trace:
    # One node, 16 cores, 2 GPUs; reserve keeps 2 idle GPUs x 4 cores (ReserveCpusPerGpu's
    # fallback, DefCpuPerGPU=4), so MaxCPUsPerNode = 8. Two CPU jobs (8 and 4 cores) arrive
    # at t=0; a 2-GPU job asking 4 cores per GPU (8) at t=1.
    return make_trace(
        [(0, 1000, 0, 8, -1), (0, 500, 0, 4, -1), (1, 100, 2, 8, 0)], names=["googlenet"]
    )


def test_without_reserve_cpu_jobs_take_the_cores_the_gpu_job_needs() -> None:
    r = run(reserve_trace(), uniform_nodes(1, 16, 2))
    assert r.start_s.tolist() == [0, 0, 500]  # the GPU job waits for the 4-core CPU job
    assert r.end_s[2] == pytest.approx(600)


def test_with_reserve_the_gpu_job_starts_at_submission() -> None:
    r = run(reserve_trace(), uniform_nodes(1, 16, 2), reserve=True)
    # The 4-core CPU job would push CPU jobs past MaxCPUsPerNode=8: it waits, the GPU job
    # starts when submitted, and the CPU job starts when the 8-core one ends.
    assert r.start_s.tolist() == [0, 1000, 1]
    assert r.end_s[2] == pytest.approx(101)
    s = summarise(reserve_trace(), r)
    assert s.cpu_wait_mean_s == pytest.approx(500)  # (0 + 1000) / 2: the CPU jobs pay


def test_reserve_asks_the_product_for_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, float]] = []

    def no_cap(nodes, cpus_per_gpu, *, min_cpus=1):  # type: ignore[no-untyped-def]
        nodes = list(nodes)
        seen.append((len(nodes), cpus_per_gpu))
        return nodes[0].cpus  # lend every core: as if reserve were off

    monkeypatch.setattr(mechanisms, "spare_cpus_per_node", no_cap)
    r = run(reserve_trace(), uniform_nodes(1, 16, 2), reserve=True)
    assert r.start_s.tolist() == [0, 0, 500]
    assert seen and seen[0] == (1, 4.0)


def test_reserve_keeps_idle_gpus_cores_at_the_pending_jobs_cores_per_gpu() -> None:
    # One node, 32 cores, 4 GPUs. Job 0 holds 2 GPUs and 8 cores until t=1000; job 1 asks 4
    # GPUs at 6 cores per GPU and waits for it. The loop's pass at t=60 keeps 8 held + 2 idle
    # GPUs x 6 (the pending jobs' median) = 20 cores: MaxCPUsPerNode = 12, so a 14-core CPU
    # job at t=100 waits (without reserve it starts at once: it ends, by its time limit,
    # long before job 1 could start). Once job 1 runs (24 cores) only 8 are spare; it ends
    # at 2000 and the next pass (every 60 s from t=0: 2040) lends 32 - 4 x 4 = 16 cores.
    trace = make_trace(
        [(0, 1000, 2, 8, 0), (0, 1000, 4, 24, 0), (100, 50, 0, 14, -1)], names=["googlenet"]
    )
    plain = run(trace, uniform_nodes(1, 32, 4))
    assert plain.start_s.tolist() == [0, 1000, 100]
    r = run(trace, uniform_nodes(1, 32, 4), reserve=True)
    assert r.start_s.tolist() == [0, 1000, 2040]


def test_a_node_with_every_gpu_allocated_does_not_close_its_shape() -> None:
    # Two nodes of 16 cores and 2 GPUs; a GPU job holds all of node 0 from t=0. No GPU job
    # can start there, so it does not constrain MaxCPUsPerNode: node 1 lends 16 - 2 x 4 = 8
    # cores and a 4-core CPU job at t=100 starts when submitted.
    trace = make_trace([(0, 1000, 2, 16, 0), (100, 50, 0, 4, -1)], names=["googlenet"])
    nodes = uniform_nodes(2, 16, 2)
    assert run(trace, nodes).start_s.tolist() == [0, 100]
    assert run(trace, nodes, reserve=True).start_s.tolist() == [0, 100]


def test_one_tight_node_closes_its_whole_shape_unless_each_node_has_its_partition() -> None:
    # A 1-GPU job holds 14 of node 0's 16 cores; its idle GPU needs 4 more, so node 0 can
    # spare nothing and MaxCPUsPerNode, one number per partition, drops to ReserveMinCpus=1
    # from the pass at t=60. The 4-core CPU job at t=100 waits for the GPU job to end
    # (t=1000) and the next pass (t=1020), though node 1 is empty. With one spare partition
    # per node, node 1 lends 8 cores and the CPU job starts when submitted.
    trace = make_trace([(0, 1000, 1, 14, 0), (100, 50, 0, 4, -1)], names=["googlenet"])
    nodes = uniform_nodes(2, 16, 2)
    assert run(trace, nodes).start_s.tolist() == [0, 100]
    assert run(trace, nodes, reserve=True).start_s.tolist() == [0, 1020]
    per_node = run(trace, nodes, reserve=True, reserve_per_node=True)
    assert per_node.start_s.tolist() == [0, 100]
    assert per_node.nodes_used.tolist() == [1, 1]


# --- (b) PCIe spread ---------------------------------------------------------------------------


def pcie_trace() -> Trace:
    # Two AlexNet jobs (PCIe-heavy: CODA's 8-12 GB/s) of 2 GPUs and 8 cores, 1000 s each.
    return make_trace([(0, 1000, 2, 8, 0), (0, 1000, 2, 8, 0)], names=["alexnet"])


def test_two_pcie_heavy_jobs_on_one_node_slow_each_other() -> None:
    slow = MODEL.pcie_slowdown
    r = run(pcie_trace(), uniform_nodes(2, 32, 4), pcie_interference=True)
    assert r.start_s.tolist() == [0, 0]
    assert r.nodes_used.tolist() == [1, 1]
    assert r.end_s.tolist() == pytest.approx([1000 / (1 - slow)] * 2)
    # Without the interference model (today's tables) they run at full speed.
    plain = run(pcie_trace(), uniform_nodes(2, 32, 4))
    assert plain.end_s.tolist() == pytest.approx([1000, 1000])


def test_with_spread_they_land_on_different_nodes_and_are_not_slowed() -> None:
    r = run(pcie_trace(), uniform_nodes(2, 32, 4), pcie_interference=True, pcie_spread=True)
    assert r.start_s.tolist() == [0, 0]
    assert r.end_s.tolist() == pytest.approx([1000, 1000])
    # On one node the second waits for the first's pcie unit (Slurm's count-only GRES).
    one = run(pcie_trace(), uniform_nodes(1, 32, 4), pcie_interference=True, pcie_spread=True)
    assert one.start_s.tolist() == [0, 1000]
    assert one.end_s.tolist() == pytest.approx([1000, 2000])


def test_light_jobs_are_not_marked_and_share_a_node() -> None:
    trace = make_trace([(0, 1000, 2, 8, 0), (0, 1000, 2, 8, 0)], names=["bert"])
    r = run(trace, uniform_nodes(1, 32, 4), pcie_interference=True, pcie_spread=True)
    assert r.start_s.tolist() == [0, 0]
    assert r.end_s.tolist() == pytest.approx([1000, 1000])


def test_spread_asks_the_products_is_pcie_heavy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float | None, int, float]] = []

    def never(usage, gpus_per_node, *, threshold_bytes_per_s, min_gpus=2):  # type: ignore[no-untyped-def]
        calls.append((usage[0].pcie_bytes_per_s_per_gpu, gpus_per_node, threshold_bytes_per_s))
        return False

    monkeypatch.setattr(mechanisms, "is_pcie_heavy", never)
    r = run(pcie_trace(), uniform_nodes(2, 32, 4), pcie_interference=True, pcie_spread=True)
    # Nothing is marked: both jobs share the best-fit node and slow each other again.
    assert r.end_s.tolist() == pytest.approx([1000 / (1 - MODEL.pcie_slowdown)] * 2)
    assert calls == [
        (MODEL.pcie_heavy_bytes_per_s_per_gpu, 2, SimParams().pcie_threshold_bytes_per_s)
    ]


# --- (b2) memory-bandwidth spread -------------------------------------------------------------

MEM_BW = 10e9  # JobModel's memory-bound CPU job: 10 GB/s a core; a node delivers 200 GB/s


def membw_run(
    rows: list[tuple[float, float, int, int, int]],
    bw_per_core: list[float],
    nodes: list[NodeSpec],
    **kw: object,
) -> RunResult:
    trace = make_trace(rows, names=["googlenet"])
    wl = workloads(trace)
    wl.cpu_bw_per_core[:] = bw_per_core
    params = SimParams(check=True, **kw)  # type: ignore[arg-type]
    return simulate(trace, nodes, wl, MODEL, POLICIES["slurm"], params)


# Two memory-bound CPU jobs of 12 cores (120 GB/s each, 240 together: over one node's 200)
# and a compute-bound one of 24 at t=1 on two 24-core nodes: the third starts at once only if
# the first two share a node.
TWO_HEAVY = [(0, 1000, 0, 12, -1), (0, 1000, 0, 12, -1), (1, 100, 0, 24, -1)]
HEAVY_BW = [MEM_BW, MEM_BW, 0.5e9]
SHARED = [0, 0, 1]
SPREAD = [0, 0, 1000]


def test_memory_bound_cpu_jobs_share_a_node_without_the_spread() -> None:
    r = membw_run(TWO_HEAVY, HEAVY_BW, uniform_nodes(2, 24, 0))
    assert r.start_s.tolist() == SHARED  # best fit packs them


def test_with_the_spread_they_never_draw_more_than_a_node_delivers() -> None:
    r = membw_run(TWO_HEAVY, HEAVY_BW, uniform_nodes(2, 24, 0), membw_spread=True)
    assert r.start_s.tolist() == SPREAD
    assert r.counters["membw_marked_jobs"] == 2
    # On one node the second waits for the first's units (Slurm's count-only GRES).
    one = membw_run(TWO_HEAVY[:2], HEAVY_BW[:2], uniform_nodes(1, 24, 0), membw_spread=True)
    assert one.start_s.tolist() == [0, 1000]


def test_compute_bound_and_unmeasured_jobs_ask_for_nothing() -> None:
    nodes = uniform_nodes(2, 24, 0)
    light = membw_run(TWO_HEAVY, [0.5e9] * 3, nodes, membw_spread=True)
    assert light.start_s.tolist() == SHARED
    unknown = membw_run(TWO_HEAVY, HEAVY_BW, nodes, membw_spread=True, membw_known_fraction=0.0)
    assert unknown.start_s.tolist() == SHARED


def test_a_job_that_alone_fills_a_node_asks_for_all_of_it_and_still_runs() -> None:
    # 32 cores at 10 GB/s = 320 GB/s: more than a node has, which Slurm would refuse; it
    # asks for the node's 200 units, runs, and a second heavy job waits for them.
    rows = [(0, 1000, 0, 32, -1), (0, 1000, 0, 4, -1)]
    r = membw_run(rows, [MEM_BW, MEM_BW], uniform_nodes(1, 64, 0), membw_spread=True)
    assert r.start_s.tolist() == [0, 1000]
    assert r.end_s.tolist() == pytest.approx([1000, 2000])


def test_the_spread_asks_the_products_membw_units(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_plugin.decision import placement

    calls: list[tuple[float | None, int, int]] = []

    def nothing(bw, cores, *, heavy_bytes_per_s_per_core, unit_bytes_per_s, node_units):  # type: ignore[no-untyped-def]
        calls.append((bw, cores, node_units))
        return 0

    monkeypatch.setattr(placement, "membw_units", nothing)
    r = membw_run(TWO_HEAVY, HEAVY_BW, uniform_nodes(2, 24, 0), membw_spread=True)
    assert r.start_s.tolist() == SHARED
    assert (MEM_BW, 12, 200) in calls


# --- (c) GPU generation --prefer -----------------------------------------------------------------


def prefer_case(**kw: object) -> tuple[RunResult, Trace]:
    # A P100 node listed first and a V100 node, one GPU each. GoogLeNet (as ResNet-50: V100
    # time 0.66 of P100's) and AlexNet (as SSD: 0.98) arrive together, GoogLeNet first.
    trace = make_trace([(0, 1000, 1, 4, 0), (0, 1000, 1, 4, 1)], names=["googlenet", "alexnet"])
    nodes = [NodeSpec("p100", 16, 1, "P100"), NodeSpec("v100", 16, 1, "V100M32")]
    return run(trace, nodes, gpu_speed=True, **kw), trace


def test_without_prefer_the_sensitive_job_gets_the_old_gpu() -> None:
    r, _ = prefer_case()
    # Run times are V100 times; on the P100 GoogLeNet runs at 0.66 of that speed.
    assert r.end_s.tolist() == pytest.approx([1000 / 0.66, 1000])


def test_with_prefer_the_sensitive_job_gets_the_fast_gpu() -> None:
    r, trace = prefer_case(gpu_prefer=True)
    assert r.end_s.tolist() == pytest.approx([1000, 1000 / 0.98])
    base, _ = prefer_case()
    assert summarise(trace, r).dnn_jct_mean_s < summarise(trace, base).dnn_jct_mean_s


def test_prefer_asks_the_products_prefer_gpu_type(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []

    def p100_for_all(view, ranking, types, *, margin=0.05):  # type: ignore[no-untyped-def]
        asked.append((view.workload, tuple(types)))
        return ("P100", "test")

    monkeypatch.setattr(mechanisms, "prefer_gpu_type", p100_for_all)
    r, _ = prefer_case(gpu_prefer=True)
    # Both prefer the P100: GoogLeNet gets it, AlexNet falls back to the V100 (soft).
    assert r.end_s.tolist() == pytest.approx([1000 / 0.66, 1000])
    # PreferGpuTypes as an admin lists them: fastest first.
    fastest_first = ("V100M32", "P100")
    assert sorted(asked) == [("alexnet", fastest_first), ("googlenet", fastest_first)]


def test_generation_speeds_come_from_takayamas_table() -> None:
    trace = make_trace([(0, 1, 1, 4, 0), (0, 1, 1, 4, 1)], names=["googlenet", "wavenet"])
    wl = workloads(trace)
    assert traits_for(wl, 0).v100_time_ratio == 0.66
    pm = PlacementModel(
        wl,
        MODEL,
        ["P100", "T4", "V100M16", "G2", None],
        [2, 4, 4, 8, 8],
        pcie_threshold_bytes_per_s=4e9,
        prefer_margin=0.05,
    )
    assert pm.types == ["G2", "P100", "T4", "V100M16"]
    # PreferGpuTypes as an admin lists them: fastest first, bigger pools first among equals.
    assert pm.prefer_types == ["G2", "V100M16", "T4", "P100"]
    assert pm.speed[0].tolist() == pytest.approx([1.0, 0.66, 0.66, 1.0])
    assert pm.speed[1].tolist() == pytest.approx([1.0, 0.72, 0.72, 1.0])
    # What coda-node would have recorded: progress per GPU model, the class's traffic.
    usage = {u.gpu_model: u for u in pm.usage(0)}
    assert usage["P100"].iter_per_s_per_gpu == pytest.approx(0.66)
    assert usage["G2"].pcie_bytes_per_s_per_gpu == MODEL.pcie_light_bytes_per_s_per_gpu


# --- (d) invariants with every mechanism on ---------------------------------------------------


@pytest.mark.parametrize("policy", ["slurm", "coda", "even"])
def test_invariants_with_all_mechanisms_on(policy: str) -> None:
    trace = synthetic(1500, n_gpus=64, seed=3, gpus_per_node=4, cores_per_node=32)
    models = ["P100", "V100M32", "T4", "G2"]
    nodes = [
        NodeSpec(n.name, n.cores, n.gpus, models[i % len(models)])
        for i, n in enumerate(trace.node_specs or [])
    ]
    wl = assign_workloads(trace, MODEL, 3)
    everything = SimParams(
        check=True,
        reserve=True,
        pcie_interference=True,
        pcie_spread=True,
        gpu_speed=True,
        gpu_prefer=True,
    )
    r = simulate(trace, nodes, wl, MODEL, POLICIES[policy], everything)
    done = ~np.isnan(r.end_s)
    assert r.counters["finished"] == int(done.sum())
    assert int(done.sum()) + r.counters["rejected"] == len(trace)
    assert np.all(r.end_s[done] >= r.start_s[done])
    s = summarise(trace, r)
    assert 0 <= s.gpu_util_effective <= s.gpu_util_allocated <= 1 + 1e-9
    assert r.counters["reserve_updates"] > 0
    again = simulate(trace, nodes, wl, MODEL, POLICIES[policy], everything)
    assert np.array_equal(r.end_s, again.end_s, equal_nan=True)


def test_mechanisms_off_change_nothing() -> None:
    # The physical models on, no mechanism: the same run as a model-less cluster when
    # nothing is PCIe-heavy and every GPU is of the reference generation.
    trace = synthetic(800, n_gpus=32, seed=5)
    nodes = list(trace.node_specs or [])
    wl = assign_workloads(trace, MODEL, 5)
    plain = simulate(trace, nodes, wl, MODEL, POLICIES["coda"], SimParams())
    v100 = [NodeSpec(n.name, n.cores, n.gpus, "V100M32") for n in nodes]
    light = JobModel(pcie_heavy_bytes_per_s_per_gpu=MODEL.pcie_light_bytes_per_s_per_gpu)
    # Every class light, every GPU a V100: the models have nothing to act on.
    modelled = simulate(
        trace,
        v100,
        wl,
        light,
        POLICIES["coda"],
        SimParams(gpu_speed=True, pcie_spread=True),
    )
    assert np.array_equal(plain.start_s, modelled.start_s, equal_nan=True)
    assert np.allclose(plain.end_s, modelled.end_s, equal_nan=True)


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_placement_rows_ratios_and_json() -> None:
    runner = CliRunner()
    args = ["simulate", "synthetic:400,gpus=32", "--cpu-load", "0.3", "-p", "slurm"]
    res = runner.invoke(cli, [*args, "--placement", "pcie,reserve"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    names = [ln.split()[0] for ln in lines if ln.strip()]
    assert {"slurm", "slurm+reserve", "slurm+pcie"} <= set(names)
    assert "slurm+reserve/slurm" in names and "slurm+pcie/slurm" in names
    res = runner.invoke(cli, [*args, "--placement", "reserve", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # stderr may say where CPU jobs come from
    assert doc["placement"] == {
        "mechanisms": ["reserve"],
        "baseline_of": {"slurm+reserve": "slurm"},
    }
    assert [r["policy"] for r in doc["results"]] == ["slurm", "slurm+reserve"]
    bad = runner.invoke(cli, [*args, "--placement", "reserve,teleport"])
    assert bad.exit_code != 0
    assert "bad --placement" in bad.output
    assert "'teleport' is not one of reserve, reserve-node, pcie, membw, prefer" in bad.output
    for extra, why in (
        (["--membw-known", "0.5"], "--membw-known without --placement membw"),
        (["--placement", "membw", "--membw-known", "nan"], "bad --membw-known nan"),
        (["--placement", "membw", "--membw-known", "1.5"], "bad --membw-known 1.5"),
    ):
        res = runner.invoke(cli, [*args, *extra])
        assert res.exit_code != 0 and why in res.output, res.output


def test_render_table_ratios_to_each_rows_own_baseline() -> None:
    trace = pcie_trace()
    nodes = uniform_nodes(2, 32, 4)
    base = run(trace, nodes, pcie_interference=True)
    spread = run(trace, nodes, pcie_interference=True, pcie_spread=True)
    spread.policy = "slurm+pcie"
    text = render_table(
        [summarise(trace, base), summarise(trace, spread)],
        baseline_of={"slurm+pcie": "slurm"},
    )
    ratio = next(ln for ln in text.splitlines() if ln.startswith("slurm+pcie/slurm"))
    assert f"{1 - MODEL.pcie_slowdown:.2f}x" in ratio  # JCT mean: 1000 vs 1000 / 0.925


def test_placement_assumptions_are_named_parameters() -> None:
    m = JobModel().with_params(
        {
            "gpu_generations": "G2:P100,A10:V100",
            "pcie_domains_per_node": "2",
            "pcie_slowdown": "0.1",
        }
    )
    assert m.gpu_generations == (("G2", "P100"), ("A10", "V100"))
    assert m.pcie_domains_per_node == 2 and m.pcie_slowdown == 0.1
    with pytest.raises(ValueError, match="MODEL:GENERATION"):
        JobModel().with_params({"gpu_generations": "G2:H100"})
    with pytest.raises(ValueError, match="pcie_domains_per_node"):
        JobModel().with_params({"pcie_domains_per_node": "two"})


def test_two_pcie_domains_carry_two_heavy_jobs_without_slowdown() -> None:
    model = JobModel(pcie_domains_per_node=2)
    trace = pcie_trace()
    params = SimParams(check=True, pcie_interference=True)
    r = simulate(trace, uniform_nodes(1, 32, 4), workloads(trace), model, POLICIES["slurm"], params)
    assert r.end_s.tolist() == pytest.approx([1000, 1000])


def test_the_simulated_eliminator_prices_holds_as_coda_node_does_on_a_spread_node() -> None:
    """Every simulated node carries the GRES when the spread is on, so coda-node's default
    price there is the spread one; an explicit NodeThrottleGpuWorthCores holds either way."""
    trace = make_trace(TWO_HEAVY, names=["googlenet"])
    nodes = uniform_nodes(2, 24, 0)

    def price(**kw: object) -> float:
        params = SimParams(**kw)  # type: ignore[arg-type]
        sim = _Sim(trace, nodes, workloads(trace), MODEL, POLICIES["coda"], params, None)
        return sim.contention.gpu_worth_cores

    assert price() == 14.0
    assert price(membw_spread=True) == 10.0
    set_ = (*SimParams().coda_conf, "NodeThrottleGpuWorthCores=14")
    assert price(membw_spread=True, coda_conf=set_) == 14.0
