"""The measured multi-node figure: the merge rule, its place in the profile file (version 5,
``multi_node``), older files without it, and what the hook's view carries."""

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
from coda_common.store.profiles import (
    FORMAT_VERSION,
    Profile,
    ProfileFormatError,
    ProfileStore,
    read_profile_file,
    to_view,
)
from tests.common.test_store import SIG, make_profile

T0 = 1_700_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    return ProfileStore(ProfileStore(tmp_path / "profiles").ensure_root())


def _measure(*figures: float, n: int | None = None) -> MultiNodeMeasure:
    return MultiNodeMeasure(tuple(figures), len(figures) if n is None else n, T0)


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
    assert on_disk["format_version"] == FORMAT_VERSION == 5
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
