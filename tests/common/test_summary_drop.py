"""Job summaries through the drop directory (ProfilePublish=munge): the node's payload,
bounded and validated on collect, appended by the collector as writer ``collector``.
munge's answer is a stand-in, as in tests/common/test_dropbox.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coda_common.publish.dropbox import (
    MAX_DROP_FILE_BYTES,
    MAX_DROP_SUMMARIES,
    Collector,
    HostFilter,
    SummaryDrop,
)
from coda_common.store.profiles import ProfileStore
from coda_common.store.summaries import ScanProblems, SummaryStore
from tests.common.test_dropbox import NOW_S, FakeMunge, _put
from tests.common.test_job_summaries import summary as _summary


def summary(**kw: object):
    """A summary of a job that ended just before the collector's clock (an older one would
    be pruned by its pass)."""
    return _summary(**{"start_unix_s": NOW_S - 3600, "end_unix_s": NOW_S - 60, **kw})


def _cred(payload: bytes, uid: int = 0, host: str = "10.0.0.5") -> bytes:
    return f"{uid}|{host}|{int(NOW_S)}|".encode() + payload


def _payload(**change: object) -> bytes:
    d = json.loads(SummaryDrop("gpu01", NOW_S, (summary(),)).to_json_bytes())
    d.update(change)
    return json.dumps(d).encode()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Collector, Path, list[str], SummaryStore]:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir(mode=0o1777)
    lines: list[str] = []
    summaries = SummaryStore(tmp_path / "jobs")
    collector = Collector(
        drop_dir,
        ProfileStore(tmp_path / "store"),
        tmp_path / "sock",
        accept_uids=[0],
        hosts=HostFilter(["10.0.0.0/24"]),
        log=lambda level, msg: lines.append(f"{level}: {msg}"),
        decode=FakeMunge(),
        clock=lambda: NOW_S,
        summaries=summaries,
    )
    return collector, drop_dir, lines, summaries


def _stored(store: SummaryStore) -> list:
    problems = ScanProblems()
    found = list(store.scan(problems=problems))
    assert problems.count == 0, problems.kept
    return found


def test_a_summary_drop_is_appended_by_the_collector(setup) -> None:
    collector, drop_dir, lines, store = setup
    many = tuple(summary(job_id=100 + k) for k in range(MAX_DROP_SUMMARIES))
    payload = SummaryDrop("gpu01", NOW_S, many).to_json_bytes()
    path = _put(drop_dir, _cred(payload))
    assert path.stat().st_size < MAX_DROP_FILE_BYTES // 2  # a full drop, with room to spare
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.summaries, stats.samples) == (1, 0, 32, 0)
    assert not path.exists()
    assert sorted(_stored(store), key=lambda s: s.job_id) == list(many)
    assert [p.name for p in store.root.glob("*/*.jsonl")] == ["collector.jsonl"]
    assert lines[0].startswith("info: drop ") and "from node gpu01 appended" in lines[0]


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (_payload(format_version=2), "summary payload format_version '2' is not 1"),
        (_payload(extra=1), "summary payload keys are not"),
        (_payload(node="gpu01;rm"), "is not a Slurm node name"),
        (_payload(summaries=[]), "summaries must be a list of 1 to 32"),
        (
            _payload(summaries=[summary(job_id=k + 1).to_json_dict() for k in range(33)]),
            "summaries must be a list of 1 to 32",
        ),
        (
            _payload(summaries=[summary(node="gpu02").to_json_dict()]),
            "summaries[0] is of node 'gpu02', not 'gpu01'",
        ),
        (
            _payload(summaries=[{**summary().to_json_dict(), "user": "eve\nroot"}]),
            "summaries[0]: user is not a printable name",
        ),
        (
            _payload(summaries=[{**summary().to_json_dict(), "gpu_wait_s": 1e9}]),
            "summaries[0]: gpu_wait_s is more than sampled_s",
        ),
        (_payload(made_unix_s=-1), "made_unix_s '-1' is not a time"),
    ],
)
def test_a_summary_drop_that_is_not_valid_is_refused_whole(setup, payload: bytes, why: str) -> None:
    collector, drop_dir, lines, store = setup
    path = _put(drop_dir, _cred(payload))
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.summaries) == (0, 1, 0)
    assert len(lines) == 1 and why in lines[0] and "nothing merged" in lines[0], lines
    assert not path.exists() and _stored(store) == []


def test_summaries_made_by_a_user_are_refused(setup) -> None:
    collector, drop_dir, lines, store = setup
    _put(drop_dir, _cred(_payload(), uid=1000))
    assert collector.collect().refused == 1
    assert "made by uid 1000" in lines[0] and _stored(store) == []


def test_a_collector_without_a_summary_store_refuses_summary_drops(setup, tmp_path: Path) -> None:
    collector, drop_dir, lines, _store = setup
    collector.summaries = None
    _put(drop_dir, _cred(_payload()))
    assert collector.collect().refused == 1
    assert "keeps no job summaries" in lines[0]


MN_RECORD = "coda:sig=workload:1000:llm;cpg=4;was=;action=set;src=profile;gpn=4;nodes=2"


def test_the_collector_merges_the_multi_node_figures_of_a_summary_drop(
    setup, tmp_path: Path
) -> None:
    collector, drop_dir, lines, _store = setup
    nodes = (
        summary(
            job_id=7,
            num_nodes=2,
            gpus=4,
            cpu_used_cores_mean=10.0,
            gpu_wait_s=0.0,
            record=MN_RECORD,
        ),
        summary(job_id=8, num_nodes=2, gpus=4, cpu_used_cores_mean=22.0, record=MN_RECORD),
        summary(job_id=9),  # one node: no figure
        summary(job_id=10, num_nodes=2, gpus=4, cpu_used_cores_mean=None, record=MN_RECORD),
        summary(  # another user's key: no figure
            job_id=11,
            num_nodes=2,
            gpus=4,
            record=MN_RECORD.replace("1000", "1001"),
        ),
    )
    _put(drop_dir, _cred(SummaryDrop("gpu01", NOW_S, nodes).to_json_bytes()))
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.summaries) == (1, 0, 5)
    profile = ProfileStore(tmp_path / "store").read("workload:1000:llm")
    assert profile is not None and profile.multi_node is not None
    assert profile.multi_node.figures_cores_per_gpu == (2.5, 5.5)
    # Job 8's GPUs waited on its CPUs half the time: starved, a floor of its demand.
    assert profile.multi_node.starved == (False, True) and profile.multi_node.is_floor
    assert profile.multi_node.n_figures == 2 and profile.multi_node.updated_unix_s == NOW_S
    # Created for the figure: no single-node prediction comes of it.
    assert (profile.confidence, profile.n_samples, profile.source) == (0.0, 0, "multi-node")
    assert ProfileStore(tmp_path / "store").read("workload:1001:llm") is None
    (line,) = lines
    assert "multi-node figure 2.50 cores/GPU of workload:1000:llm from node gpu01 merged" in line
    assert "figure 5.50 cores/GPU (starved) of workload:1000:llm" in line
    assert "5.50 cores/GPU (p90, a floor) from 2 per-node figures" in line


def test_a_figure_that_cannot_be_merged_is_said_and_the_drop_accepted(
    setup, tmp_path: Path
) -> None:
    collector, drop_dir, lines, store = setup
    bad = ProfileStore(tmp_path / "store")
    bad.ensure_root()
    bad.path_for("workload:1000:llm").write_text("{not json")
    s = summary(job_id=7, num_nodes=2, gpus=4, cpu_used_cores_mean=10.0, record=MN_RECORD)
    _put(drop_dir, _cred(SummaryDrop("gpu01", NOW_S, (s,)).to_json_bytes()))
    stats = collector.collect()
    assert (stats.accepted, stats.refused) == (1, 0)
    assert _stored(store) == [s]
    assert "not merged" in lines[0] and "not valid JSON" in lines[0]
