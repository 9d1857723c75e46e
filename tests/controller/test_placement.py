"""Placement decisions (slurm_plugin.decision.placement) and how decide() applies them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.store.usage import UsageRecord
from slurm_plugin.decision import placement
from slurm_plugin.decision.decide import (
    Decision,
    JobRequest,
    ProfileView,
    decide,
    parse_admin_record,
)
from slurm_plugin.decision.placement import (
    GpuRanking,
    gpu_ranking,
    is_pcie_heavy,
    prefer_gpu_type,
    ranking_for,
    route_cpu_job,
    workload_speedup,
)

UID = 1000
GB = 1e9


def use(
    model: str | None,
    iters: float | None = None,
    pcie: float | None = None,
    *,
    util: float = 0.9,
    mem_bw: float = 0.4,
    ticks: int = 10,
) -> UsageRecord:
    return UsageRecord(model, util, mem_bw, pcie, iters, ticks, 1_700_000_000.0)


def view(name: str, *usage: UsageRecord, key: str | None = None, cpg: int = 6) -> ProfileView:
    return ProfileView(key or f"workload:*:{name}", name, cpg, 0.95, 12, None, tuple(usage))


# -------------------------------------------------------------------------------- PCIe


@pytest.mark.parametrize(
    ("usage", "gpn", "heavy"),
    [
        # CODA's AlexNet/ResNet50: 8-12 GB/s in the one-node-two-GPU case.
        ((use("a100", pcie=4 * GB),), 2, True),  # 4 GB/s x 2 GPUs reaches 8 GB/s
        ((use("a100", pcie=3.9 * GB),), 2, False),
        ((use("a100", pcie=12 * GB),), 1, False),  # one GPU: never heavy
        ((use("a100", pcie=2 * GB),), 4, True),
        ((use("a100", pcie=None),), 8, False),  # not measured
        ((), 4, False),  # no usage at all
        # The largest measurement counts: the job may land on either model.
        ((use("a100", pcie=1 * GB), use("v100", pcie=5 * GB)), 2, True),
        ((use("a100", pcie=None), use("v100", pcie=0.4 * GB)), 8, False),  # NLP: < 1 GB/s
    ],
)
def test_is_pcie_heavy(usage: tuple[UsageRecord, ...], gpn: int, heavy: bool) -> None:
    assert is_pcie_heavy(usage, gpn, threshold_bytes_per_s=8 * GB) is heavy


def test_is_pcie_heavy_min_gpus() -> None:
    usage = (use("a100", pcie=9 * GB),)
    assert is_pcie_heavy(usage, 1, threshold_bytes_per_s=8 * GB, min_gpus=1)
    assert not is_pcie_heavy(usage, 2, threshold_bytes_per_s=8 * GB, min_gpus=3)


MEMBW = dict(heavy_bytes_per_s_per_core=2 * GB, unit_bytes_per_s=1 * GB, node_units=200)


@pytest.mark.parametrize(
    ("bw", "cores", "units"),
    [
        (10 * GB, 12, 120),  # STREAM-like: its bandwidth, in GB/s
        (2.5 * GB, 3, 8),  # 7.5 GB/s rounds up
        (2 * GB, 1, 2),  # at the threshold
        (1.9 * GB, 64, 0),  # compute-bound: whatever its size, nothing
        (None, 12, 0),  # never measured
        (float("nan"), 12, 0),
        (10 * GB, 32, 200),  # more than a node has: all of it, never more
        (10 * GB, 0, 0),
    ],
)
def test_membw_units(bw: float | None, cores: int, units: int) -> None:
    assert placement.membw_units(bw, cores, **MEMBW) == units  # type: ignore[arg-type]


def test_membw_units_refuses_a_zero_unit() -> None:
    with pytest.raises(ValueError, match="unit_bytes_per_s"):
        placement.membw_units(10 * GB, 4, **{**MEMBW, "unit_bytes_per_s": 0})  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- ranking

# Speedup a100 over v100: resnet50 2.5, gpt 1.667, bert 1.25 -> cluster median 1.667.
RESNET = view("resnet50", use("a100", 10.0, 6 * GB), use("v100", 4.0, 5 * GB))
GPT = view("gpt", use("A100", 10.0), use("V100", 6.0))  # NVML spelling: case ignored
BERT = view("bert", use("a100", 10.0, 0.5 * GB), use("v100", 8.0))
ONE_MODEL = view("alexnet", use("a100", 50.0, 10 * GB))
PROXY_ONLY = view("proxy", use("a100", None), use("v100", None))
H100_TOO = view("llm", use("h100", 30.0), use("a100", 10.0), use("v100", 5.0))
VIEWS = (RESNET, GPT, BERT, ONE_MODEL, PROXY_ONLY)
TYPES = ("h100", "a100", "v100")


def test_gpu_ranking_is_the_median_per_pair() -> None:
    ranking = gpu_ranking(VIEWS)
    assert set(ranking.speedup) == {("a100", "v100"), ("v100", "a100")}
    assert ranking.speedup[("a100", "v100")] == pytest.approx(10.0 / 6.0)
    assert ranking.speedup[("v100", "a100")] == pytest.approx(0.6)  # median of 0.4, 0.6, 0.8
    three = gpu_ranking((*VIEWS, H100_TOO))
    assert three.speedup[("h100", "v100")] == pytest.approx(6.0)
    assert three.speedup[("a100", "v100")] == pytest.approx((10.0 / 6.0 + 2.0) / 2)


def test_gpu_ranking_of_nothing_measured() -> None:
    assert gpu_ranking([ONE_MODEL, PROXY_ONLY]).speedup == {}
    assert gpu_ranking([]).speedup == {}


@pytest.mark.parametrize(
    ("v", "fast", "slow", "expected"),
    [
        (RESNET, "a100", "v100", 2.5),
        (RESNET, "V100", "A100", 0.4),
        (GPT, "a100", "v100", 10.0 / 6.0),
        (RESNET, "h100", "v100", None),  # h100 not measured
        (PROXY_ONLY, "a100", "v100", None),  # proxy only: no exact progress
        (view("zero", use("a100", 5.0), use("v100", 0.0)), "a100", "v100", None),
    ],
)
def test_workload_speedup(v: ProfileView, fast: str, slow: str, expected: float | None) -> None:
    got = workload_speedup(v, fast, slow)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("v", "types", "margin", "expected"),
    [
        (RESNET, TYPES, 0.05, "a100"),  # 2.5 > 1.667 * 1.05: gains most, newer GPU
        (BERT, TYPES, 0.05, "v100"),  # 1.25 < 1.667 * 0.95: leave the a100s to others
        (GPT, TYPES, 0.05, None),  # the median itself
        (RESNET, TYPES, 0.6, None),  # 2.5 < 1.667 * 1.6: within the margin
        (BERT, TYPES, 0.3, None),  # 1.25 > 1.667 * 0.7
        (ONE_MODEL, TYPES, 0.05, None),  # one model measured: no pair
        (PROXY_ONLY, TYPES, 0.05, None),
        (None, TYPES, 0.05, None),  # unknown workload
        (RESNET, ("h100", "v100"), 0.05, None),  # only v100 of these measured
        (RESNET, ("A100", "V100"), 0.05, "a100"),  # admin's spelling does not matter
        # Only the configured types count: v100 unlisted leaves one measured type.
        (RESNET, ("h100", "a100"), 0.05, None),
    ],
)
def test_prefer_gpu_type(
    v: ProfileView | None, types: tuple[str, ...], margin: float, expected: str | None
) -> None:
    got = prefer_gpu_type(v, gpu_ranking(VIEWS), types, margin=margin)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got[0] == expected


def test_prefer_gpu_type_reason_and_extremes() -> None:
    ranking = gpu_ranking(VIEWS)
    got = prefer_gpu_type(RESNET, ranking, TYPES)
    assert got == (
        "a100",
        "gains more than most from a100 (2.50x faster on a100 than on v100, cluster median 1.67x)",
    )
    got = prefer_gpu_type(BERT, ranking, TYPES)
    assert got is not None and got[1].startswith("gains less than most from a100 (1.25x")
    # Three measured types: fastest vs slowest measured (h100 vs v100); no cluster median
    # for that pair without other such workloads.
    assert prefer_gpu_type(H100_TOO, ranking, TYPES) is None
    both = gpu_ranking((*VIEWS, H100_TOO, view("slowllm", use("h100", 12.0), use("v100", 4.0))))
    assert prefer_gpu_type(H100_TOO, both, TYPES) == (
        "h100",
        "gains more than most from h100 (6.00x faster on h100 than on v100, cluster median 4.50x)",
    )
    assert prefer_gpu_type(RESNET, GpuRanking({}), TYPES) is None


def test_ranking_is_computed_once_per_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = placement.gpu_ranking

    def counting(views: Any) -> GpuRanking:
        calls.append(1)
        return real(views)

    monkeypatch.setattr(placement, "gpu_ranking", counting)
    snap = {v.signature: v for v in VIEWS}
    first = ranking_for(snap)
    assert ranking_for(snap) is first and len(calls) == 1
    newer = dict(snap)  # a refresh replaces the mapping
    assert ranking_for(newer).speedup == first.speedup and len(calls) == 2


# -------------------------------------------------------------------------------- CPU routing


@pytest.mark.parametrize(
    ("partition", "route", "expected"),
    [
        (None, ("batch", "gpu_spare"), "batch,gpu_spare"),
        ("", ("batch", "gpu_spare"), "batch,gpu_spare"),
        ("batch", ("batch", "gpu_spare"), None),  # the user's choice stays
        ("debug", ("batch", "gpu_spare"), None),
        (None, (), None),  # off
        (None, ("gpu_spare",), "gpu_spare"),
    ],
)
def test_route_cpu_job(partition: str | None, route: tuple[str, ...], expected: str | None) -> None:
    assert route_cpu_job(partition, route) == expected


# -------------------------------------------------------------------------------- decide()

PROFILES: dict[str, ProfileView] = {
    v.signature: v
    for v in (
        RESNET,
        GPT,
        BERT,
        ONE_MODEL,
        PROXY_ONLY,
        # The user's own profile of gpt, measured PCIe-heavy: it wins over the shared one.
        view("gpt", use("a100", 10.0, 9 * GB), key=f"workload:{UID}:gpt"),
        view("plain", cpg=4),  # no usage records (a version 1 profile)
    )
}

PLACE = {
    "pcie_spread_gres": "pcie",
    "prefer_gpu_types": TYPES,
    "prefer_gpu_features": (("a100", "gpu_a100"),),
    "cpu_job_partitions": ("batch", "gpu_spare"),
}


def job(workload: str | None = "resnet50", **fields: Any) -> JobRequest:
    base: dict[str, Any] = {
        "uid": UID,
        "job_name": "train",
        "tres_per_node": "gres:gpu:2",
        "comment": f"coda:workload={workload}" if workload else None,
        "script": "#!/bin/sh\npython train.py\n",
    }
    base.update(fields)
    return JobRequest(**base)


def decide_with(req: JobRequest, **conf: Any) -> Decision:
    return decide(req, dataclasses.replace(CodaConfig(), **conf), PROFILES, lambda gpn: None)


# (job, config, tres_per_node, prefer, admin placement fields)
_TABLE: list[tuple[str, JobRequest, dict[str, Any], str | None, str | None, dict[str, str]]] = [
    ("all off (default)", job(), {}, None, None, {}),
    (
        "heavy resnet50, 2 GPUs: pcie unit and prefer (mapped feature)",
        job(),
        PLACE,
        "gres:gpu:2,gres:pcie:1",
        "gpu_a100",
        {"pcie": "1", "prefer": "gpu_a100"},
    ),
    (
        "one GPU is never PCIe-heavy",
        job(tres_per_node="gres:gpu:1"),
        PLACE,
        None,
        "gpu_a100",
        {"prefer": "gpu_a100"},
    ),
    (
        "GPUs via --gpus: tres_per_node was empty",
        job(tres_per_node=None, tres_per_job="gres:gpu:4"),
        PLACE,
        "gres:pcie:1",
        "gpu_a100",
        {"pcie": "1", "prefer": "gpu_a100"},
    ),
    (
        "already asked for the GRES: left alone",
        job(tres_per_node="gres:gpu:2,gres:pcie:1"),
        PLACE,
        None,
        "gpu_a100",
        {"prefer": "gpu_a100"},
    ),
    (
        "typed GPU request: no prefer",
        job(tres_per_node="gres:gpu:a100:2"),
        PLACE,
        "gres:gpu:a100:2,gres:pcie:1",
        None,
        {"pcie": "1"},
    ),
    (
        "typed via --gpus: no prefer",
        job(tres_per_node=None, tres_per_job="gres:gpu:v100:1"),
        PLACE,
        None,
        None,
        {},
    ),
    (
        "user's own --prefer: kept",
        job(prefer="fast_nvme"),
        PLACE,
        "gres:gpu:2,gres:pcie:1",
        None,
        {"pcie": "1"},
    ),
    (
        "PcieSpreadGres only",
        job(),
        {"pcie_spread_gres": "pcie"},
        "gres:gpu:2,gres:pcie:1",
        None,
        {"pcie": "1"},
    ),
    (
        "PreferGpuTypes only, feature = type name",
        job("bert"),
        {"prefer_gpu_types": TYPES},
        None,
        "v100",
        {"prefer": "v100"},
    ),
    (
        "bert: light PCIe, prefers the older GPU",
        job("bert"),
        PLACE,
        None,
        "v100",
        {"prefer": "v100"},
    ),
    (
        "gpt: the user's own heavy profile wins; no pair measured in it",
        job("gpt"),
        PLACE,
        "gres:gpu:2,gres:pcie:1",
        None,
        {"pcie": "1"},
    ),
    ("no usage records: nothing", job("plain"), PLACE, None, None, {}),
    ("unknown workload: nothing", job("nosuch"), PLACE, None, None, {}),
    (
        "threshold raised above the measurement",
        job(),
        {**PLACE, "pcie_heavy_bytes_per_s": 20 * GB},
        None,
        "gpu_a100",
        {"prefer": "gpu_a100"},
    ),
]


@pytest.mark.parametrize(
    ("req", "conf", "tres", "prefer", "fields"),
    [row[1:] for row in _TABLE],
    ids=[row[0] for row in _TABLE],
)
def test_decide_placement_table(
    req: JobRequest,
    conf: dict[str, Any],
    tres: str | None,
    prefer: str | None,
    fields: dict[str, str],
) -> None:
    d = decide_with(req, **conf)
    assert (d.tres_per_node, d.prefer, d.partition) == (tres, prefer, None)
    assert d.admin_comment is not None
    record = parse_admin_record(d.admin_comment)
    assert {k: record[k] for k in ("pcie", "prefer") if k in record} == fields
    # The CPU decision is the same as without placement.
    plain = decide_with(req)
    assert (d.action, d.cpus_per_tres, record["cpg"]) == (
        plain.action,
        plain.cpus_per_tres,
        parse_admin_record(plain.admin_comment or "")["cpg"],
    )
    for key, value in fields.items():
        assert f" {key}={value}" in d.log_msg
    if fields:
        assert d.user_msg is not None and "\n" not in d.user_msg
    if "pcie" in fields:
        assert "gres:pcie:1 per node (PCIe-heavy workload" in (d.user_msg or "")
    if "prefer" in fields:
        assert f"--prefer={fields['prefer']} (the workload gains" in (d.user_msg or "")


def test_user_message_joins_cpu_and_placement() -> None:
    d = decide_with(job(), **PLACE)
    assert d.user_msg == (
        'coda: --cpus-per-gpu=6 for workload "resnet50" (shared profile, 12 samples, '
        "confidence 0.95); gres:pcie:1 per node (PCIe-heavy workload: one per PCIe domain); "
        "--prefer=gpu_a100 (the workload gains more than most from a100 (2.50x faster on "
        "a100 than on v100, cluster median 1.67x))"
    )


@pytest.mark.parametrize(
    ("req", "conf", "why"),
    [
        (job(comment="coda:off"), PLACE, "coda:off opts out"),
        (job(partition="debug"), {**PLACE, "partitions": ("gpu",)}, "partition not managed"),
        (job(), {**PLACE, "mode": "off"}, "Mode=off"),
        (job(tres_per_node="gres:gpu:x:y:z"), PLACE, "malformed TRES fails open"),
    ],
)
def test_placement_never_touches_unmanaged_jobs(
    req: JobRequest, conf: dict[str, Any], why: str
) -> None:
    d = decide_with(req, **conf)
    assert (d.tres_per_node, d.prefer, d.partition) == (None, None, None), why


def test_advise_mode_logs_what_it_would_place() -> None:
    d = decide_with(job(), **{**PLACE, "mode": "advise"})
    assert (d.tres_per_node, d.prefer, d.cpus_per_tres) == (None, None, None)
    assert " would-pcie=1 would-prefer=gpu_a100" in d.log_msg
    record = parse_admin_record(d.admin_comment or "")
    assert "pcie" not in record and "prefer" not in record
    assert "pcie" not in (d.user_msg or "")


@pytest.mark.parametrize(
    ("req", "conf", "partition"),
    [
        (job(None, tres_per_node=None), PLACE, "batch,gpu_spare"),
        (job(None, tres_per_node=None, cpus_per_task=4), PLACE, "batch,gpu_spare"),
        (job(None, tres_per_node=None, partition="batch"), PLACE, None),  # user's choice
        (job(None, tres_per_node=None), {}, None),  # off by default
        (job(None, tres_per_node=None, comment="coda:off"), PLACE, None),  # opt-out
        (job(None, tres_per_node=None, comment="coda:bogus"), PLACE, None),  # not refused
        (job(None, tres_per_node=None), {**PLACE, "mode": "advise"}, None),
        (job(None, tres_per_node=None), {**PLACE, "mode": "off"}, None),
        (job(None, tres_per_node="gres:pcie:1"), PLACE, "batch,gpu_spare"),  # still CPU-only
        (job(None), PLACE, None),  # a GPU job is not routed
    ],
)
def test_cpu_job_routing(req: JobRequest, conf: dict[str, Any], partition: str | None) -> None:
    d = decide_with(req, **conf)
    assert d.partition == partition
    if req.tres_per_node != "gres:gpu:2":
        assert d.action == "skip" and d.admin_comment is None
    if partition is not None:
        assert f"part={partition}" in d.log_msg
        assert d.user_msg == (
            f"coda: CPU-only job offered partitions {partition} (it starts in whichever can "
            "run it first; coda:off in --comment opts out)"
        )


def test_advise_routing_says_what_it_would_do() -> None:
    d = decide_with(job(None, tres_per_node=None), **{**PLACE, "mode": "advise"})
    assert "would route to partitions batch,gpu_spare (advise mode)" in d.log_msg


# -------------------------------------------------------------------------------- coda.conf


def test_placement_keys_parse() -> None:
    config, warnings = parse_config(
        "PcieSpreadGres=pcie PcieHeavyBytesPerS=1.2e10\n"
        "PreferGpuTypes=H100,a100,v100 PreferGpuFeatures=h100:gpu_h100,A100:gpu_a100\n"
        "CpuJobPartitions=batch,gpu_spare\n"
    )
    assert warnings == []
    assert config.pcie_spread_gres == "pcie"
    assert config.pcie_heavy_bytes_per_s == 1.2e10
    assert config.prefer_gpu_types == ("h100", "a100", "v100")
    assert config.prefer_gpu_features == (("h100", "gpu_h100"), ("a100", "gpu_a100"))
    assert config.cpu_job_partitions == ("batch", "gpu_spare")
    default = CodaConfig()
    assert (default.pcie_spread_gres, default.prefer_gpu_types, default.cpu_job_partitions) == (
        None,
        (),
        (),
    )
    assert default.pcie_heavy_bytes_per_s == 8e9


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("PcieSpreadGres=gpu", "other than gpu"),
        ("PcieSpreadGres=pcie:2", "must be a GRES name"),
        ("PcieHeavyBytesPerS=0", "PcieHeavyBytesPerS must be greater than 0"),
        ("PcieHeavyBytesPerS=8GB", "PcieHeavyBytesPerS must be a number"),
        ("PreferGpuTypes=a100", "needs at least two GPU types"),
        ("PreferGpuTypes=a100,v1|00", "is not a GPU type name"),
        ("PreferGpuTypes=a100,v100 PreferGpuFeatures=a100", "expected type:feature"),
        ("PreferGpuTypes=a100,v100 PreferGpuFeatures=a100:x&y", "not a node feature name"),
        ("PreferGpuTypes=a100,v100 PreferGpuFeatures=h100:gpu_h100", "not in PreferGpuTypes"),
        ("PreferGpuFeatures=h100:gpu_h100", "not in PreferGpuTypes (empty)"),
    ],
)
def test_placement_keys_rejected(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert needle in str(info.value)
    assert str(info.value).startswith("coda.conf:1: ")


@pytest.mark.parametrize(
    ("features", "prefer", "log"),
    [
        (None, "gpu_a100", " prefer=gpu_a100"),  # not checked (tools, tests)
        (frozenset({"gpu_a100", "nvme"}), "gpu_a100", " prefer=gpu_a100"),
        # Slurm refuses a job preferring a feature no node has: never set one.
        (frozenset({"nvme"}), None, " no-feature=gpu_a100"),
        (frozenset(), None, " no-feature=gpu_a100"),
    ],
)
def test_prefer_only_names_a_feature_some_node_has(
    features: frozenset[str] | None, prefer: str | None, log: str
) -> None:
    config = dataclasses.replace(CodaConfig(), **PLACE)
    d = decide(job(), config, PROFILES, lambda gpn: None, node_features=features)
    assert d.prefer == prefer
    assert log in d.log_msg
    assert d.tres_per_node == "gres:gpu:2,gres:pcie:1"  # the PCIe unit does not depend on it
    record = parse_admin_record(d.admin_comment or "")
    assert record.get("prefer") == prefer


def test_the_pcie_unit_is_spelled_as_the_jobs_own_request() -> None:
    # Slurm 24.11 sends gres/gpu:2 and refuses gres:pcie:1 beside it.
    d = decide_with(job(tres_per_node="gres/gpu:2"), **PLACE)
    assert d.tres_per_node == "gres/gpu:2,gres/pcie:1"
    d = decide_with(job(tres_per_node=None, tres_per_job="gres/gpu:4"), **PLACE)
    assert d.tres_per_node == "gres/pcie:1"
