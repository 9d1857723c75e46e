"""The measured multi-node figure: the merge rule, starved figures as floors, its place in
the profile file (``multi_node``, version 5; version 6 with ``starved``), older files
without it, and what the hook's view carries."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from coda_common.store.multinode import (
    MAX_MULTI_NODE_FIGURES,
    MultiNodeMeasure,
    merge_figure,
    quantile,
    summary_figure,
)
from coda_common.store.multinode_merge import summary_starved
from coda_common.store.profiles import (
    FORMAT_VERSION,
    Profile,
    ProfileFormatError,
    ProfileStore,
    read_profile_file,
    to_view,
)
from tests.common.test_job_summaries import summary as job_summary
from tests.common.test_store import SIG, make_profile

T0 = 1_700_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    return ProfileStore(ProfileStore(tmp_path / "profiles").ensure_root())


def _measure(
    *figures: float, n: int | None = None, starved: tuple[bool, ...] = ()
) -> MultiNodeMeasure:
    return MultiNodeMeasure(tuple(figures), len(figures) if n is None else n, T0, starved)


S, U = True, False
"""A figure starved (the job used what it had there) or not."""


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ((3.0,), 0.9, 3.0),
        ((1.0, 2.0), 0.9, 2.0),
        ((5.0, 1.0, 3.0), 0.5, 3.0),
        (tuple(float(v) for v in range(1, 11)), 0.9, 9.0),  # one high outlier of 10 is left out
        (tuple(float(v) for v in range(1, 17)), 0.9, 15.0),
        ((0.0, 6.0, 6.0, 6.0), 0.9, 6.0),  # one idle node does not pull it down
    ],
)
def test_quantile_nearest_rank(values: tuple[float, ...], q: float, expected: float) -> None:
    assert quantile(values, q) == expected


@pytest.mark.parametrize(
    ("current", "figure", "kept", "count"),
    [
        (None, 4.0, (4.0,), 1),
        (_measure(1.0, 2.0), 3.0, (1.0, 2.0, 3.0), 3),
        (_measure(*[1.0] * MAX_MULTI_NODE_FIGURES), 9.0, (*[1.0] * 15, 9.0), 17),
        (_measure(2.0, n=40), 0.0, (2.0, 0.0), 41),
    ],
)
def test_merge_figure_keeps_a_bounded_history(
    current: MultiNodeMeasure | None, figure: float, kept: tuple[float, ...], count: int
) -> None:
    merged = merge_figure(current, figure, T0 + 5)
    assert merged.figures_cores_per_gpu == kept
    assert merged.n_figures == count and merged.updated_unix_s == T0 + 5


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_merge_figure_refuses_non_figures(bad: float) -> None:
    with pytest.raises(ValueError, match="multi-node figure"):
        merge_figure(None, bad, T0)


@pytest.mark.parametrize(
    ("num_nodes", "gpus", "used", "expected"),
    [
        (2, 4, 10.0, 2.5),
        (1, 4, 10.0, None),  # single node: the probes measure that
        (2, 0, 10.0, None),  # a CPU job
        (2, 4, None, None),  # no sampled CPU reading
        (4, 8, 0.0, 0.0),
        (2, 4, math.nan, None),
    ],
)
def test_summary_figure(
    num_nodes: int, gpus: int, used: float | None, expected: float | None
) -> None:
    assert summary_figure(num_nodes, gpus, used) == expected


def test_profile_round_trip_with_multi_node(store: ProfileStore) -> None:
    p = make_profile(multi_node=_measure(2.0, 6.0, 5.5, n=7))
    store.write(p)
    back = read_profile_file(store.path_for(SIG), store.trusted_uids)
    assert back == p
    on_disk = json.loads(store.path_for(SIG).read_bytes())
    # No starved figure kept: version 5, which the coda before starved flags reads.
    assert on_disk["format_version"] == 5 and FORMAT_VERSION == 6
    assert on_disk["multi_node"] == {
        "figures_cores_per_gpu": [2.0, 6.0, 5.5],
        "n_figures": 7,
        "updated_unix_s": T0,
    }
    view = to_view(back)
    assert view.multi_node_measured_cores_per_gpu == 6.0 and view.multi_node_runs == 7


def test_version_4_file_reads_with_no_multi_node(store: ProfileStore) -> None:
    # A profile without a figure is written as version 4, which coda before the figure reads.
    d = make_profile().to_json_dict()
    assert d["format_version"] == 4 and "multi_node" not in d
    path = store.path_for(SIG)
    path.write_text(json.dumps(d))
    p = read_profile_file(path, store.trusted_uids)
    assert p.multi_node is None and p.cpus_per_gpu == 8
    view = to_view(p)
    assert view.multi_node_measured_cores_per_gpu is None and view.multi_node_runs == 0
    d["multi_node"] = None  # a version 4 file with the key is not something any coda wrote
    with pytest.raises(ProfileFormatError, match=r"unknown key\(s\) multi_node"):
        Profile.from_json_dict(d, "f.json")


def test_profile_round_trip_with_starved_figures(store: ProfileStore) -> None:
    p = make_profile(multi_node=_measure(2.0, 2.0, 1.5, starved=(S, S, U)))
    store.write(p)
    back = read_profile_file(store.path_for(SIG), store.trusted_uids)
    assert back == p
    on_disk = json.loads(store.path_for(SIG).read_bytes())
    assert on_disk["format_version"] == FORMAT_VERSION == 6
    assert on_disk["multi_node"]["starved"] == [True, True, False]
    # 2.0 is a floor (no figure at or above it had cores to spare): twice it, at most the
    # single-node 8.
    assert to_view(back).multi_node_measured_cores_per_gpu == 4.0


def test_a_version_5_file_reads_as_not_starved(store: ProfileStore) -> None:
    d = make_profile(multi_node=_measure(3.0, 3.0)).to_json_dict()
    assert d["format_version"] == 5 and "starved" not in d["multi_node"]
    p = Profile.from_json_dict(d, "f.json")
    assert p.multi_node is not None and p.multi_node.starved == ()
    assert not p.multi_node.is_floor
    d["multi_node"]["starved"] = [False, False]  # only version 6 has the key
    with pytest.raises(ProfileFormatError, match=r"unknown key\(s\) starved"):
        Profile.from_json_dict(d, "f.json")


@pytest.mark.parametrize(
    "flags",
    [[True], [True, "yes"], [1, 0], None, [False, True, False]],
)
def test_bad_starved_flags_are_refused(flags: object) -> None:
    d = make_profile(multi_node=_measure(3.0, 3.0, starved=(S, U))).to_json_dict()
    assert d["format_version"] == 6
    d["multi_node"]["starved"] = flags
    with pytest.raises(ProfileFormatError, match="starved must be a list of 2 booleans"):
        Profile.from_json_dict(d, "f.json")


@pytest.mark.parametrize(
    ("fields", "starved"),
    [
        ({"gpu_wait_s": 1800.0}, True),  # GPUs waited on the CPUs half the time
        ({"gpu_wait_s": 720.0}, True),  # a fifth of it (WAIT_SHARE_YES)
        ({"gpu_wait_s": 700.0}, False),
        # All 16 cores busy with the GPUs busy too: the demand met exactly, not a floor.
        ({"gpu_wait_s": 0.0, "cpu_used_cores_mean": 16.0}, False),
        # No GPU reading (no NVML): cores used against cores it could run on, 90 %.
        ({"gpu_sampled_s": 0.0, "gpu_wait_s": 0.0, "cpu_used_cores_mean": 14.4}, True),
        ({"gpu_sampled_s": 0.0, "gpu_wait_s": 0.0, "cpu_used_cores_mean": 14.3}, False),
        ({"gpu_sampled_s": 0.0, "gpu_wait_s": 0.0, "cores_mean": 0.0}, False),
        ({"cpu_used_cores_mean": None}, False),  # no CPU reading: no figure either
    ],
)
def test_summary_starved(fields: dict[str, object], starved: bool) -> None:
    s = job_summary(num_nodes=2, **fields)
    assert summary_starved(s) is starved


@pytest.mark.parametrize(
    ("measure", "single", "floor", "published"),
    [
        (_measure(3.0, 3.0), 10, False, 3.0),  # nothing starved: the p90
        (_measure(3.0, 3.0, starved=(S, S)), 10, True, 6.0),  # a floor: twice it
        (_measure(3.0, 3.0, starved=(S, S)), 5, True, 5.0),  # ... at most the single-node
        (_measure(3.0, 3.0, starved=(S, S)), 3, True, 6.0),  # a bound not above it: twice
        (_measure(3.0, 3.0, starved=(S, S)), None, True, 6.0),  # no single-node figure
        # The next run, given more, used 5 with cores to spare: its demand, not a floor.
        (_measure(3.0, 3.0, 5.0, 5.0, starved=(S, S, U, U)), 10, False, 5.0),
        # A run given exactly its demand reads starved; one with cores to spare at the
        # same figure says it is the demand.
        (_measure(2.0, 2.0, 2.0, 2.0, starved=(S, S, U, U)), 4, False, 2.0),
        # Starved again above what a run with spare cores measured: a floor again.
        (_measure(2.0, 2.0, 4.0, 4.0, starved=(U, U, S, S)), 10, True, 8.0),
        # One starved node of ten above the p90 does not set it.
        (_measure(*[2.0] * 9, 6.0, starved=(*[U] * 9, S)), 10, False, 2.0),
    ],
)
def test_a_starved_quantile_is_a_floor(
    measure: MultiNodeMeasure, single: int | None, floor: bool, published: float
) -> None:
    assert measure.is_floor is floor
    assert measure.published_cores_per_gpu(single) == published


def test_merge_figure_keeps_starved_flags_with_their_figures() -> None:
    m = merge_figure(None, 2.0, T0)
    assert m.starved == ()  # none starved: no flags kept
    m = merge_figure(m, 3.0, T0, starved=True)
    assert m.starved == (False, True)
    full = _measure(*[1.0] * MAX_MULTI_NODE_FIGURES, starved=(S, *[U] * 15))
    assert merge_figure(full, 1.0, T0).starved == ()  # the starved one went out
    with pytest.raises(ValueError, match="1 starved flags for 2"):
        _measure(1.0, 2.0, starved=(S,))


def test_a_placeholder_profile_bounds_no_floor(store: ProfileStore) -> None:
    store.merge_multi_node("workload:1000:bigtrain", 3.0, T0, starved=True)
    p = store.merge_multi_node("workload:1000:bigtrain", 3.0, T0, starved=True)
    assert p.confidence == 0.0 and p.cpus_per_gpu == 1
    assert to_view(p).multi_node_measured_cores_per_gpu == 6.0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([], "must be an object or null"),
        ({"figures_cores_per_gpu": [], "n_figures": 0, "updated_unix_s": T0}, "list of 1 to 16"),
        ({"figures_cores_per_gpu": [-1.0], "n_figures": 1, "updated_unix_s": T0}, r"\[0\]"),
        ({"figures_cores_per_gpu": [1.0, 2.0], "n_figures": 1, "updated_unix_s": T0}, "n_figures"),
        ({"figures_cores_per_gpu": [1.0]}, "missing key"),
        ({"figures_cores_per_gpu": [1.0] * 17, "n_figures": 17, "updated_unix_s": T0}, "1 to 16"),
    ],
)
def test_bad_multi_node_values_are_refused(value: object, problem: str) -> None:
    d = make_profile().to_json_dict() | {"format_version": 5}
    d["multi_node"] = value
    with pytest.raises(ProfileFormatError, match=problem):
        Profile.from_json_dict(d, "f.json")


def test_merge_multi_node_into_an_existing_profile(store: ProfileStore) -> None:
    store.write(make_profile())
    store.merge_multi_node(SIG, 3.0, T0 + 10)
    p = store.merge_multi_node(SIG, 5.0, T0 + 20)
    assert p.multi_node == MultiNodeMeasure((3.0, 5.0), 2, T0 + 20)
    # The single-node prediction and its date are left alone.
    assert (p.cpus_per_gpu, p.confidence, p.updated_unix_s) == (8, 0.9, T0)
    assert store.read(SIG) == p


def test_merge_multi_node_creates_a_profile_that_predicts_nothing_single_node(
    store: ProfileStore,
) -> None:
    p = store.merge_multi_node("workload:1000:bigtrain", 6.5, T0)
    assert (p.confidence, p.n_samples, p.source, p.workload) == (0.0, 0, "multi-node", "bigtrain")
    assert p.multi_node == MultiNodeMeasure((6.5,), 1, T0)


def test_a_later_single_node_merge_keeps_the_figures(store: ProfileStore) -> None:
    store.merge_multi_node(SIG, 4.0, T0)
    p = store.merge_samples(
        SIG,
        make_profile().samples,
        refit=lambda c: dataclasses.replace(c, cpus_per_gpu=6, confidence=0.9),
        source="coda-node:gpu01",
        now_unix_s=T0 + 50,
    )
    assert p.multi_node == MultiNodeMeasure((4.0,), 1, T0)
    assert (p.cpus_per_gpu, p.confidence) == (6, 0.9)
