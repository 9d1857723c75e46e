"""A multi-node job whose profile holds a measured multi-node figure: ceil(figure x (1 +
MultiNodeMargin)) within the usual bounds once MultiNodeMinSamples figures are in, the
MultiNodeGpuCap rule otherwise; single-node jobs never read the figure."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig
from coda_common.slurm.adminrecord import parse_admin_record
from coda_common.store.multinode import MultiNodeMeasure
from coda_common.store.profiles import to_view
from slurm_plugin.decision.decide import (
    JobRequest,
    ProfileView,
    decide,
    measured_multi_node_cpus_per_gpu,
    predict_cpus_per_gpu,
)
from tests.common.test_store import make_profile

UID = 1000


def _view(
    name: str,
    cpg: int = 6,
    conf: float = 0.93,
    figure: float | None = None,
    runs: int = 0,
    mn: int | None = None,
    uid: str = "1000",
) -> ProfileView:
    return ProfileView(
        f"workload:{uid}:{name}",
        name,
        cpg,
        conf,
        12 if conf else 0,
        mn,
        multi_node_measured_cores_per_gpu=figure,
        multi_node_runs=runs,
    )


PROFILES = {
    v.signature: v
    for v in (
        _view("plain"),  # no figure: the cap rule
        _view("measured", figure=4.5, runs=3),  # ceil(4.5 x 1.1) = 5
        _view("few", figure=4.5, runs=1),  # below MultiNodeMinSamples=2
        _view("hungry", figure=30.0, runs=4),  # above MaxCpusPerGpu / the node cap
        _view("idle", figure=0.2, runs=4),  # below MinCpusPerGpu
        _view("admin", figure=4.5, runs=4, mn=9),  # multi_node_cpus_per_gpu wins
        _view("mnonly", cpg=1, conf=0.0, figure=3.0, runs=2),  # placeholder profile
        _view("mnonly-few", cpg=1, conf=0.0, figure=3.0, runs=1),
        _view("sharedmn", cpg=1, conf=0.0, figure=7.0, runs=5, uid="*"),
    )
}


def _job(name: str, nodes: int | None, gpus: int = 4) -> JobRequest:
    fields: dict[str, Any] = {
        "uid": UID,
        "job_name": "train",
        "tres_per_node": f"gres:gpu:{gpus}",
        "comment": f"coda:workload={name}",
        "script": "#!/bin/bash\npython train.py\n",
    }
    if nodes is not None:
        fields["min_nodes"] = nodes
    return JobRequest(**fields)


def _cfg(**fields: Any) -> CodaConfig:
    return dataclasses.replace(CodaConfig(), **fields)


def _cap16(gpus_per_node: int) -> int | None:
    return 16


@pytest.mark.parametrize(
    ("name", "nodes", "config", "cpg", "src", "mn"),
    [
        ("plain", 2, _cfg(), 3, "profile", None),  # ceil(6 x 2 / 4)
        ("measured", 2, _cfg(), 5, "profile", "3"),
        ("measured", 2, _cfg(multi_node_margin=0.0), 5, "profile", "3"),  # ceil(4.5)
        ("measured", 2, _cfg(multi_node_margin=0.5), 7, "profile", "3"),  # ceil(6.75)
        ("measured", 2, _cfg(multi_node_min_samples=4), 3, "profile", None),
        ("measured", 1, _cfg(), 6, "profile", None),  # single node: the figure is not read
        ("measured", None, _cfg(), 6, "profile", None),
        ("few", 2, _cfg(), 3, "profile", None),
        ("few", 2, _cfg(multi_node_min_samples=1), 5, "profile", "1"),
        ("hungry", 2, _cfg(), 16, "profile", "4"),  # the node cap
        ("hungry", 2, _cfg(max_cpus_per_gpu=12), 12, "profile", "4"),
        ("idle", 2, _cfg(min_cpus_per_gpu=2), 2, "profile", "4"),
        ("admin", 2, _cfg(), 9, "profile", None),
        ("mnonly", 4, _cfg(), 4, "profile", "2"),  # ceil(3 x 1.1), confidence 0 or not
        ("sharedmn", 2, _cfg(), 8, "global", "5"),
    ],
)
def test_multi_node_decision(
    name: str, nodes: int | None, config: CodaConfig, cpg: int, src: str, mn: str | None
) -> None:
    d = decide(_job(name, nodes), config, PROFILES, _cap16)
    assert d.action == "set", d.log_msg
    assert d.cpus_per_tres == f"gres:gpu:{cpg}"
    record = parse_admin_record(d.admin_comment)
    assert record["src"] == src and record.get("mn") == mn
    measured = mn is not None
    assert (f"measured on {mn} nodes of multi-node runs" in (d.user_msg or "")) is measured
    assert (f" mn={mn}: measured multi-node figure" in d.log_msg) is measured


@pytest.mark.parametrize("name", ["mnonly", "mnonly-few"])
def test_a_profile_with_only_a_multi_node_figure_leaves_single_node_jobs_unprofiled(
    name: str,
) -> None:
    d = decide(_job(name, 1), _cfg(), PROFILES, _cap16)
    assert d.action == "skip" or parse_admin_record(d.admin_comment)["src"] == "none"
    assert "mn" not in parse_admin_record(d.admin_comment)


def test_too_few_figures_and_no_confidence_is_no_profile() -> None:
    d = decide(_job("mnonly-few", 2), _cfg(), PROFILES, _cap16)
    assert parse_admin_record(d.admin_comment)["src"] == "none"


@pytest.mark.parametrize(
    ("figure", "runs", "min_samples", "margin", "expected"),
    [
        (None, 0, 2, 0.1, None),
        (4.0, 1, 2, 0.1, None),
        (4.0, 2, 2, 0.1, 5),  # ceil(4.4)
        (5.0, 2, 2, 0.2, 6),  # 5 x 1.2 is 6.000000000000001 in floats: still 6
        (0.0, 9, 2, 0.1, 1),  # at least 1
        (4.0, 9, None, 0.1, None),  # the plain rule asks for no measured figure
    ],
)
def test_measured_multi_node_cpus_per_gpu(
    figure: float | None, runs: int, min_samples: int | None, margin: float, expected: int | None
) -> None:
    view = _view("w", figure=figure, runs=runs)
    assert measured_multi_node_cpus_per_gpu(view, min_samples, margin) == expected


def test_predict_cpus_per_gpu_without_the_new_arguments_keeps_the_cap_rule() -> None:
    view = _view("w", cpg=6, figure=2.0, runs=10)
    assert predict_cpus_per_gpu(view, 4, 2, 2) == 3
    assert predict_cpus_per_gpu(view, 4, 2, 2, 2, 0.1) == 3  # ceil(2.2)
    assert predict_cpus_per_gpu(view, 4, 1, 2, 2, 0.1) == 6


@pytest.mark.parametrize(
    ("figures", "starved", "cpg"),
    [
        ((3.0, 3.0), (False, False), 4),  # used 3 with cores to spare: ceil(3 x 1.1)
        ((3.0, 3.0), (True, True), 7),  # used all 3 it had: ceil(min(2 x 3, 10) x 1.1)
        ((6.0, 6.0), (True, True), 11),  # ... at most the single-node 10: ceil(10 x 1.1)
        ((3.0, 3.0, 8.0, 8.0), (True, True, False, False), 9),  # then its demand: ceil(8.8)
    ],
)
def test_a_starved_figure_asks_the_next_run_to_look_higher(
    figures: tuple[float, ...], starved: tuple[bool, ...], cpg: int
) -> None:
    # The profile a store would hand the hook: a single-node figure of 10 cores per GPU and
    # per-node figures merged from job summaries, starved or not.
    measure = MultiNodeMeasure(figures, len(figures), 1_700_000_000.0, starved)
    profile = make_profile("workload:1000:wide", cpus_per_gpu=10, multi_node=measure)
    views = {profile.signature: to_view(profile)}
    d = decide(_job("wide", 2), _cfg(), views, _cap16)
    assert d.cpus_per_tres == f"gres:gpu:{cpg}", d.log_msg
