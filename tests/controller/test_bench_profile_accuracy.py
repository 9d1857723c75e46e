"""bench/bench_profile_accuracy.py records against today's simulator: the probes, the slow
intervals, a perfect-profiles run at the oracle's cores; and it fails loudly when a method
it hooks is gone."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from slurm_plugin.sim.engine import CODA_CONF, POLICIES, SimParams, simulate
from slurm_plugin.sim.profiling import OnlineProfiling
from slurm_plugin.sim.rates import Rates

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_profile_accuracy.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_profile_accuracy", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(bench: ModuleType) -> tuple[tuple, dict]:
    """Philly's first 60 jobs, as the bench's own ``philly --jobs 60`` runs them."""
    setup = bench._setup("philly", 60, 0.8, 0.0, 1)
    params = SimParams(coda_conf=tuple(CODA_CONF))
    return setup, bench.run_all(*setup, params)


def test_recorder_sees_probes_and_slow_intervals(runs: tuple[tuple, dict]) -> None:
    _, sims = runs
    coda = sims["coda"]
    assert coda.counters["probed_jobs"] > 0
    assert len(coda.probed) == coda.counters["probed_jobs"]
    assert sum(coda.slow_s.values()) > 0
    assert {state for state, _ in coda.seen.values()} >= {"none", "confident"}


def test_recorder_decides_nothing(runs: tuple[tuple, dict]) -> None:
    """The recorded coda run is the engine's own coda run, job for job."""
    (trace, nodes, wl, model), sims = runs
    plain = simulate(trace, nodes, wl, model, POLICIES["coda"], SimParams(coda_conf=CODA_CONF))
    np.testing.assert_array_equal(sims["coda"].end_s, plain.end_s)
    np.testing.assert_array_equal(sims["coda"].cores_per_node, plain.cores_per_node)


def test_perfect_profiles_get_the_sweet_spot_and_no_probes(runs: tuple[tuple, dict]) -> None:
    (trace, *_), sims = runs
    coda, oracle, perfect = sims["coda"], sims["oracle"], sims["perfect"]
    gpu = np.flatnonzero(trace.gpus > 0)
    assert perfect.counters["probed_jobs"] == 0 and not perfect.probed
    for j in gpu:
        gpn, k = perfect._gpn_nodes(j)
        want = min(max(1, math.ceil(perfect._theta(j, gpn, k))), perfect.nodes.max_cores)
        assert perfect.cores_per_node[j] == want == oracle.cores_per_node[j]
    assert not np.array_equal(perfect.cores_per_node[gpu], coda.cores_per_node[gpu])
    assert np.nanmean(perfect.end_s[gpu]) != np.nanmean(coda.end_s[gpu])


@pytest.mark.parametrize(
    ("room", "name"),
    [(OnlineProfiling, "_start_probe"), (OnlineProfiling, "coda_cores"), (Rates, "resolve")],
)
def test_a_hooked_method_gone_fails_loudly(
    bench: ModuleType, runs: tuple[tuple, dict], monkeypatch: pytest.MonkeyPatch, room, name
) -> None:
    setup, _ = runs
    monkeypatch.delattr(room, name)
    with pytest.raises(bench.HookMissing, match=f"{room.__qualname__}.{name}"):
        bench.check_hooks()
    with pytest.raises(bench.HookMissing, match="re-hook _Recorder"):
        bench._Recorder(*setup, POLICIES["coda"], SimParams(coda_conf=CODA_CONF), None)
