"""Job summaries: the record, its rule for GPUs waiting on CPUs, and the store's hostile-input
handling (damaged, huge, foreign and newer lines are named and skipped)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from coda_common.config.codaconf import parse_config
from coda_common.store.jobsummary import (
    JobSummary,
    SummaryFormatError,
    clean_text,
    gpus_waiting,
    summary_from_json_line,
    wait_verdict,
)
from coda_common.store.summaries import (
    MAX_LINE_BYTES,
    PRUNE_EVERY_S,
    PRUNE_STAMP,
    ScanProblems,
    SummaryStore,
    day_of,
)

T0 = 1_765_100_000.0  # 2025-12-07 09:33 UTC


def summary(**kw: object) -> JobSummary:
    base = dict(
        job_id=4711,
        node="gpu01",
        user="alice",
        uid=1000,
        account="vision",
        partition="gpu",
        kind="dnn",
        num_nodes=1,
        start_unix_s=T0,
        end_unix_s=T0 + 3600,
        sampled_s=3600.0,
        gpus=2,
        gpu_model="NVIDIA H100",
        cores_allocated=16,
        cores_mean=16.0,
        cpu_used_cores_mean=15.0,
        gpu_util_pct_mean=60.0,
        gpu_sampled_s=3600.0,
        gpu_wait_s=1800.0,
        idle_core_s=3600.0,
        probe_s=0.0,
        probes=0,
        slim_s=0.0,
        throttled_s=0.0,
        protected_s=0.0,
        profile_state="profiled",
        record="coda:sig=workload:1000:resnet50;cpg=8;was=;action=set;src=profile;gpn=2;nodes=1",
    )
    base.update(kw)
    return JobSummary(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpu", "used", "cores", "want"),
    [
        (50.0, 7.5, 8, True),  # starved: GPUs idle, cores saturated
        (50.0, 2.0, 8, False),  # GPUs idle for another reason
        (95.0, 8.0, 8, False),  # GPUs busy
        (None, 8.0, 8, None),  # no NVML
        (50.0, None, 8, None),
        (50.0, 8.0, 0, None),
    ],
)
def test_gpus_waiting_rule(gpu: float | None, used: float | None, cores: int, want: bool | None):
    assert gpus_waiting(gpu, used, cores) is want


def test_round_trip_and_verdict():
    s = summary()
    assert summary_from_json_line(s.to_json_line()) == s
    v = wait_verdict([s])
    assert v["verdict"] == "yes" and v["share"] == pytest.approx(0.5)
    assert "50%" in v["why"]
    quiet = summary(gpu_wait_s=60.0)
    assert wait_verdict([quiet])["verdict"] == "no"
    assert wait_verdict([summary(gpu_sampled_s=0.0, gpu_wait_s=0.0)])["verdict"] == "unknown"
    assert s.decision is not None and s.decision["cpg"] == "8"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"format_version": 2}, "newer than this coda reads"),
        ({"job_id": -1}, "job_id"),
        ({"gpu_wait_s": 1e9}, "gpu_wait_s"),
        ({"user": "a\nb"}, "user"),
        ({"cores_mean": float("nan")}, "cores_mean"),
        ({"record": "coda:sig=x;cpg=1"}, "record"),
        ({"format": "other"}, "format"),
        ({"end_unix_s": T0 - 10}, "before"),
    ],
)
def test_bad_lines_are_named(change: dict[str, object], words: str):
    d = summary().to_json_dict()
    d.update(change)
    with pytest.raises(SummaryFormatError, match=words):
        summary_from_json_line(json.dumps(d).encode())


def test_store_append_scan_skips_damage(tmp_path: Path):
    store = SummaryStore(tmp_path / "jobs")
    a, b = summary(job_id=1), summary(job_id=2, end_unix_s=T0 + 86400 * 2)
    store.append([a, b], "gpu01")
    day = store.root / day_of(a.end_unix_s)
    with open(day / "gpu01.jsonl", "ab") as f:
        f.write(b"{not json\n")
        f.write(b"x" * (MAX_LINE_BYTES * 3) + b"\n")
        newer = a.to_json_dict() | {"format_version": 9, "job_id": 3}
        f.write(json.dumps(newer).encode() + b"\n")
        f.write(summary(job_id=4).to_json_line())
        f.write(b'{"format": "coda-job-summary", "job_')  # a write cut short
    (day / "notes.txt").write_text("hello")
    problems = ScanProblems()
    got = sorted(s.job_id for s in store.scan(problems=problems))
    assert got == [1, 2, 4]
    text = "\n".join(problems.kept)
    assert problems.count == 5
    assert "not JSON" in text and "over" in text and "newer" in text and "cut short" in text
    assert "notes.txt" in text
    assert [s.job_id for s in store.find_job(2, around_s=b.end_unix_s)] == [2]
    assert [s.job_id for s in store.scan(since_s=T0 + 86400)] == [2]


def test_store_refuses_foreign_and_linked_files(tmp_path: Path):
    store = SummaryStore(tmp_path / "jobs")
    store.append([summary(job_id=1)], "gpu01")
    day = store.root / day_of(T0 + 3600)
    os.chmod(day / "gpu01.jsonl", 0o666)
    (day / "gpu02.jsonl").symlink_to(day / "gpu01.jsonl")
    problems = ScanProblems()
    assert list(store.scan(problems=problems)) == []
    text = "\n".join(problems.kept)
    assert "group/other-writable" in text and "symbolic link" in text
    with pytest.raises(ValueError, match="writer name"):
        store.append([summary()], "../etc")


def test_prune_by_age_then_size(tmp_path: Path):
    store = SummaryStore(tmp_path / "jobs", retention_days=10, max_bytes=1 << 20)
    now = T0 + 30 * 86400
    for age_days in (40, 20, 5, 1, 0):
        store.append([summary(end_unix_s=now - age_days * 86400, start_unix_s=T0)], "n1")
    removed = store.prune(now)
    assert sorted(removed) == [day_of(now - 40 * 86400), day_of(now - 20 * 86400)]
    store.max_bytes = 1
    store.prune(now)
    assert store.days() == [day_of(now)]  # the current day stays whatever its size


def test_config_keys_and_default_dir():
    cfg, _ = parse_config("ProfileStore=/srv/coda/profiles\n")
    assert cfg.summary_dir == Path("/srv/coda/profiles/jobs")
    cfg, _ = parse_config("JobSummaryDir=/srv/jobs\nJobSummaryRetentionDays=7\n")
    assert cfg.summary_dir == Path("/srv/jobs") and cfg.job_summary_retention_days == 7
    with pytest.raises(Exception, match="JobSummaryMaxMiB"):
        parse_config("JobSummaryMaxMiB=0\n")


def test_dataclass_fields_match_json():
    keys = set(summary().to_json_dict()) - {"format", "format_version"}
    assert keys == {f.name for f in dataclasses.fields(JobSummary)}


def test_prune_if_due_runs_at_most_hourly_for_every_writer(tmp_path: Path):
    root = tmp_path / "jobs"
    assert SummaryStore(root).prune_if_due(T0) is None  # no store yet: nothing to prune
    old = summary(end_unix_s=T0 - 200 * 86400, start_unix_s=T0 - 200 * 86400 - 10)
    SummaryStore(root).append([old, summary()], writer="gpu01")
    node, collector = SummaryStore(root, retention_days=90), SummaryStore(root, retention_days=90)
    assert node.prune_if_due(T0) == [day_of(old.end_unix_s)]
    assert (root / PRUNE_STAMP).stat().st_mtime == T0
    # Another writer sharing the directory, within the hour: not due.
    SummaryStore(root).append([old], writer="gpu02")
    assert collector.prune_if_due(T0 + PRUNE_EVERY_S - 1) is None
    assert collector.prune_if_due(T0 + PRUNE_EVERY_S) == [day_of(old.end_unix_s)]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("alice", "alice"),
        ("", None),
        (None, None),
        (7, None),
        ("eve\nroot", None),
        ("\x1b[31m", None),
        ("x" * 256, "x" * 256),
        ("x" * 257, None),
    ],
)
def test_clean_text_keeps_only_what_a_summary_holds(value: object, want: str | None):
    assert clean_text(value) == want
