"""The simulator's warm-store measures, scripts that name their model, and the starter table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from coda_common.model.curves import throughput_at
from slurm_plugin.cli.main import cli
from slurm_plugin.sim.engine import POLICIES, SimParams, simulate
from slurm_plugin.sim.report import jobs_summary, second_half, summarise
from slurm_plugin.sim.traces import Trace, uniform_nodes
from slurm_plugin.sim.workloads import CLASSES, JobModel, assign_workloads, starter_table
from tests.controller.test_sim import make_trace

MODEL = JobModel()


# --- the second half of the submissions --------------------------------------------------


def test_the_second_half_is_the_later_gpu_submissions_and_the_cpu_jobs_from_then() -> None:
    # Five GPU jobs (the later half of an odd count: the last three) and CPU jobs around
    # the third GPU submission (t=20).
    trace = make_trace(
        [
            (0, 100, 1, 4, 0),
            (5, 100, 0, 2, -1),
            (10, 100, 1, 4, 0),
            (19, 100, 0, 2, -1),
            (20, 100, 1, 4, 0),
            (20, 100, 0, 2, -1),
            (30, 100, 1, 4, 0),
            (40, 100, 1, 4, 0),
            (50, 100, 0, 2, -1),
        ],
        ["w"],
    )
    gpu, cpu, from_s = second_half(trace)
    assert np.flatnonzero(gpu).tolist() == [4, 6, 7]
    assert np.flatnonzero(cpu).tolist() == [5, 8]
    assert from_s == 20


def test_second_half_figures_are_over_those_jobs_only() -> None:
    # One 1-GPU node, θ = 4: the slurm policy runs the jobs one after another at their
    # users' 4 cores, each 100 s; JCTs 100, 190, 280, 370.
    trace = make_trace(
        [(0, 100, 1, 4, 0), (10, 100, 1, 4, 0), (20, 100, 1, 4, 0), (30, 100, 1, 4, 0)], ["w"]
    )
    wl = assign_workloads(trace, MODEL, 1, named_classes={"w": (4.0, (0.0,) * 3)})
    r = simulate(trace, uniform_nodes(1, 8, 1), wl, MODEL, POLICIES["slurm"], SimParams(check=True))
    half = summarise(trace, r).second_half
    assert half["gpu_jobs"] == 2 and half["from_submit_s"] == 20
    assert half["dnn_jct_mean_s"] == pytest.approx((280 + 370) / 2)
    assert half["dnn_wait_mean_s"] == pytest.approx((180 + 270) / 2)
    assert half["gpu_busy"] == pytest.approx(1.0)


def test_gpu_busy_per_job_is_the_work_over_the_gpu_time_held() -> None:
    # θ = 8 but the user asked 4, so the trace's run did 100 s at rate r(4); the fixed
    # policy at 2 cores runs at r(2): busy = r(2) ... counted over the work the job brought,
    # which is 100 s at r(4): busy = work / run time = r(2).
    trace = make_trace([(0, 100, 1, 4, 0), (1, 100, 1, 4, 0)], ["w"])
    wl = assign_workloads(trace, MODEL, 1, named_classes={"w": (8.0, (0.0,) * 3)})
    params = SimParams(check=True, fixed_cpus_per_gpu=2)
    r = simulate(trace, uniform_nodes(1, 16, 2), wl, MODEL, POLICIES["fixed"], params)
    both = jobs_summary(trace, r, trace.gpus > 0, np.zeros(len(trace), dtype=bool))
    assert both["gpu_busy"] == pytest.approx(throughput_at(8, 2))
    oracle = simulate(trace, uniform_nodes(1, 16, 2), wl, MODEL, POLICIES["oracle"], params)
    assert summarise(trace, oracle).second_half["gpu_busy"] == pytest.approx(1.0)


# --- scripts that name their model, the starter table ------------------------------------------


def _philly_like(n: int = 400) -> Trace:
    """GPU jobs the trace does not name (as Philly's)."""
    return make_trace([(float(i), 100.0, 1, 4, -1) for i in range(n)], [])


def test_a_synthetic_workloads_script_names_its_class_and_its_identity_is_its_own() -> None:
    trace = _philly_like()
    wl = assign_workloads(trace, MODEL, 1)
    for wid in range(len(wl.names)):
        model = CLASSES[int(wl.klass[wid])].name.lower()
        assert wl.models[wid] == model
        assert f"--arch {model}\n" in wl.script(wid)
        assert wl.label(wid) == wl.names[wid]  # its own name, not the model's
    none = assign_workloads(trace, MODEL.with_params({"script_names_model": "0"}), 1)
    assert not any("--arch" in none.script(w) for w in range(len(none.names)))
    # The same draws: raising the share only adds workloads that name their model.
    half = assign_workloads(trace, MODEL.with_params({"script_names_model": "0.5"}), 1)
    some = assign_workloads(trace, MODEL.with_params({"script_names_model": "0.7"}), 1)
    assert 0 < half.names_model.sum() < some.names_model.sum() < len(wl.names)
    assert np.all(some.names_model[half.names_model])


def test_a_workload_named_after_its_model_gets_a_name_of_its_own_when_it_does_not_name_it() -> None:
    trace = make_trace([(0.0, 100.0, 1, 4, 0), (1.0, 100.0, 1, 4, 1)], ["resnet18", "bert"])
    named = {"resnet18": (6.0, (0.0,) * 3), "bert": (1.0, (0.0,) * 3)}
    yes = assign_workloads(trace, MODEL, 1, named_classes=named)
    assert [yes.label(w) for w in (0, 1)] == ["resnet18", "bert"]
    assert yes.model_cores_per_gpu == {"resnet18": 6.0, "bert": 1.0}
    no = assign_workloads(
        trace, MODEL.with_params({"script_names_model": "0"}), 1, named_classes=named
    )
    assert [no.label(w) for w in (0, 1)] == ["job-0", "job-1"]
    assert "resnet18" not in no.script(0)


def test_the_starter_table_has_each_classes_sweet_spot_and_its_error_is_up_or_down() -> None:
    wl = assign_workloads(_philly_like(), MODEL, 1)
    exact = starter_table(wl, 0.0, 1)
    base = {c.name.lower(): c.cores_per_gpu for c in CLASSES}
    assert exact == {m: max(1, math.ceil(base[m])) for m in exact}
    assert len(exact) == len(CLASSES)
    off = starter_table(wl, 0.3, 1)
    for m, cores in off.items():
        assert cores in (math.ceil(base[m] * 1.3 - 1e-9), max(1, math.ceil(base[m] * 0.7 - 1e-9)))
    assert off == starter_table(wl, 0.3, 1)  # the same seed, the same table
    assert any(
        starter_table(wl, 0.3, seed) != off for seed in range(2, 6)
    )  # another seed, other coins
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="share from 0 to below 1"):
            starter_table(wl, bad, 1)


# --- the command line --------------------------------------------------------------------


ARGS = ["simulate", "synthetic:300,gpus=32", "-p", "coda"]


def test_cli_json_has_the_second_half_and_the_starter_table() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, [*ARGS, "--json", "--starter-table"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["starter_table"]) == {c.name.lower() for c in CLASSES}
    half = data["results"][0]["second_half"]
    assert half["gpu_jobs"] == (data["gpu_jobs"] + 1) // 2
    assert 0 < half["gpu_busy"] <= 1 and half["dnn_jct_mean_s"] > 0
    text = runner.invoke(cli, [*ARGS, "--second-half", "--starter-table"]).output
    assert "second half: GPU jobs from submission" in text
    assert "coda policy's starter table (confidence 0.1): alexnet:19" in text
    plain = runner.invoke(cli, ARGS).output
    assert "second half" not in plain and "starter table" not in plain


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--param", "script_names_model=nan"], "expected a finite number"),
        (["--param", "script_names_model=-0.1"], "expected a finite number, 0 or more"),
        (["--param", "script_names_model=1.5"], "a share within 0..1"),
        (["--starter-table", "--starter-table-error", "nan"], "a share from 0 to below 1"),
        (["--starter-table", "--starter-table-error", "-0.1"], "a share from 0 to below 1"),
        (["--starter-table", "--starter-table-error", "1"], "a share from 0 to below 1"),
        (["--starter-table-error", "0.3"], "--starter-table-error without --starter-table"),
    ],
)
def test_cli_refuses_bad_shares(extra: list[str], says: str) -> None:
    res = CliRunner().invoke(cli, [*ARGS, *extra])
    assert res.exit_code != 0
    assert says in res.output


# --- the hook's prior in a run -------------------------------------------------------------


def _first_run(klass: str, share_of: float, table: bool) -> tuple[int, int]:
    """(cores, probed jobs) of a lone 1-GPU job of ``klass`` asking 2 cores, on a 24-core
    4-GPU node (the node's share: 6 a GPU), with or without the starter table."""
    weights = ",".join("1" if c.name == klass else "0" for c in CLASSES)
    model = MODEL.with_params({"class_weights": weights, "script_names_model": str(share_of)})
    trace = make_trace([(0.0, 20000.0, 1, 2, -1)], [])
    wl = assign_workloads(trace, model, 1)
    params = SimParams(check=True)
    if table:
        params = SimParams(check=True, starter_table=tuple(starter_table(wl, 0.0, 1).items()))
    r = simulate(trace, uniform_nodes(1, 24, 4), wl, model, POLICIES["coda"], params)
    return int(r.cores_per_node[0]), r.counters["probed_jobs"]


def test_a_named_first_run_gets_the_priors_cores_and_is_still_profiled() -> None:
    assert _first_run("Alexnet", 1.0, table=False) == (6, 1)  # the node's share
    assert _first_run("Alexnet", 1.0, table=True) == (19, 1)  # AlexNet's 19, profiled all the same
    assert _first_run("Alexnet", 0.0, table=True) == (6, 1)  # its script names no model


def test_a_prior_below_the_default_never_lowers_it() -> None:
    # LanguageModel's figure is 1 core a GPU: the first run keeps the node's share.
    assert (
        _first_run("LanguageModel", 1.0, table=True)[0]
        == _first_run("LanguageModel", 1.0, table=False)[0]
        == 6
    )
