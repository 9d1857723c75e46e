"""``coda-slurm status`` and the decision journal behind it.

Pure tests first (the journal writer, aggregation of a hand-made journal with known answers,
verdicts and rendering when things are missing), then the real thing: jobs submitted to the
local Slurm cluster, and ``coda-slurm status --json`` run as a subprocess must agree with
what slurmctld recorded in the jobs' AdminComments.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from coda_common.cli import run_cli
from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.cli import status as cli_status
from slurm_plugin.cli.main import cli as coda_slurm
from slurm_plugin.cli.status import collect_status, parse_since, render
from slurm_plugin.decision.decide import NO_VAL, JobRequest, ProfileView, decide, parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster
from slurm_plugin.hook import submit as hook
from slurm_plugin.hook.journal import (
    DecisionJournal,
    journal_entry,
    pending_entry,
    read_journal,
    reconcile,
    rotated_path,
    summarize_decisions,
)
from tests.conftest import LogWatch
from tests.controller.test_hook import FakeLib, ffi, field, lib, make_desc
from tests.controller.test_submit_slurm import coda_conf, put_profile, set_conf, wait_for_reload

__all__ = ["coda_conf", "lib"]  # fixtures: the in-process hook, the live cluster's coda.conf

NOW = 1_800_000_000.0
HOUR = 3600.0


class Logged:
    """A ``log(level, message)`` that remembers what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __call__(self, level: str, message: str) -> None:
        self.lines.append((level, message))


PROFILES = {
    "workload:*:resnet50": ProfileView("workload:*:resnet50", "resnet50", 6, 0.95, 8, None),
}


def decided(cfg: CodaConfig, **fields: Any) -> tuple[JobRequest, Any]:
    req = JobRequest(uid=1000, **fields)
    return req, decide(req, cfg, PROFILES, lambda _gpn: None)


def journal_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the journal writer -----------------------------------------------------------------------


def test_each_decision_is_one_line_with_cores_asked_and_given(tmp_path: Path) -> None:
    cfg = CodaConfig(user_value="lower")
    journal = DecisionJournal(tmp_path / "decisions.jsonl", 1 << 20, Logged())
    cases = [
        # set: nothing asked, 2 GPUs x 6 given
        dict(name="r50", tres_per_node="gres:gpu:2", comment="coda:workload=resnet50"),
        # lower: asked 16 per GPU on 2 GPUs, given 6 per GPU
        dict(
            name="big",
            tres_per_node="gres:gpu:2",
            cpus_per_tres="gres:gpu:16",
            comment="coda:workload=resnet50",
        ),
        # lower from --cpus-per-task 5 x 2 tasks on 1 GPU: asked 10 cores
        dict(
            name="cpt",
            tres_per_node="gres:gpu:1",
            cpus_per_task=5,
            ntasks_per_node=2,
            comment="coda:workload=resnet50",
        ),
        # unknown workload: skip, nothing given
        dict(name="new", tres_per_node="gres:gpu:1", script="#!/bin/sh\nnew\n"),
    ]
    for i, fields in enumerate(cases):
        req, decision = decided(cfg, job_name=fields.pop("name"), **fields)
        journal.record(pending_entry(NOW + i, NO_VAL, 1000, req, decision, 42_000, False))
    assert journal.flush() == 4
    lines = journal_lines(tmp_path / "decisions.jsonl")
    assert [e["job"] for e in lines] == ["r50", "big", "cpt", "new"]
    assert [e["action"] for e in lines] == ["set", "lower", "lower", "skip"]
    assert [(e["asked_cores"], e["given_cores"]) for e in lines] == [
        (None, 12),
        (32, 12),
        (10, 6),
        (None, None),
    ]
    assert lines[0]["profile"] == "workload:*:resnet50" and lines[0]["src"] == "global"
    assert lines[3]["profile"] is None and lines[3]["src"] == "none"
    # Slurm assigns the id after job_submit: NO_VAL is written as null, not as 4294967294.
    assert all(e["job_id"] is None and e["uid"] == 1000 for e in lines)
    assert all(e["hook_us"] == 42.0 and e["fail_open"] is False for e in lines)


def test_journal_rotates_at_the_size_limit_and_keeps_one_old_file(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    journal = DecisionJournal(path, 2000, Logged())
    req, decision = decided(CodaConfig(), tres_per_node="gres:gpu:1", comment="coda:workload=x")
    for i in range(60):
        journal.record(pending_entry(NOW + i, NO_VAL, 1000, req, decision, 1000, False))
        journal.flush()
    assert path.stat().st_size <= 2000
    assert rotated_path(path).stat().st_size <= 2000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decisions.jsonl", "decisions.jsonl.1"]
    read = read_journal(path, 0.0)
    times = [e["t"] for e in read.entries]
    # The newest entries survive, in order, without a gap between the two files.
    assert times[-1] == NOW + 59
    assert times == [NOW + i for i in range(60 - len(times), 60)]
    assert 8 < len(times) < 60 and read.malformed == 0


def test_journal_moved_away_by_logrotate_is_started_again(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    journal = DecisionJournal(path, 1 << 20, Logged())
    req, decision = decided(CodaConfig(), tres_per_node="gres:gpu:1", comment="coda:workload=x")
    journal.record(pending_entry(NOW, NO_VAL, 1000, req, decision, 1000, False))
    journal.flush()
    path.rename(tmp_path / "decisions.jsonl-20260101")
    journal.record(pending_entry(NOW + 1, NO_VAL, 1000, req, decision, 1000, False))
    journal.flush()
    assert [e["t"] for e in journal_lines(path)] == [NOW + 1]


def test_flusher_writes_within_about_a_second_and_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    journal = DecisionJournal(path, 1 << 20, Logged()).start()
    req, decision = decided(CodaConfig(), tres_per_node="gres:gpu:1", comment="coda:workload=x")
    t0 = time.monotonic()
    journal.record(pending_entry(NOW, NO_VAL, 1000, req, decision, 1000, False))
    while not (path.exists() and path.read_text()):
        assert time.monotonic() - t0 < 2.5, "not flushed within the flush interval"
        time.sleep(0.02)
    journal.record(pending_entry(NOW + 1, NO_VAL, 1000, req, decision, 1000, False))
    journal.stop()  # slurmctld shutting down: nothing pending is lost
    assert [e["t"] for e in journal_lines(path)] == [NOW, NOW + 1]


def submit_gpu_job(lib: FakeLib, **strings: str) -> tuple[int, Any]:
    desc = make_desc(lib, tres_per_node="gres:gpu:2", comment="coda:workload=resnet50", **strings)
    return hook.job_submit(desc, 1000, ffi.new("char **")), desc


def test_unwritable_journal_costs_one_log_line_and_no_job(lib: FakeLib, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "not-a-dir"
    not_a_dir.write_text("")
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + f"DecisionJournal={not_a_dir / 'decisions.jsonl'}\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns)
    state = hook.current_state()
    assert state.journal is not None
    for _ in range(3):
        rc, desc = submit_gpu_job(lib)
        assert rc == 0 and field(desc, "cpus_per_tres") == "gres:gpu:6"
        state.journal.flush()
    errors = [(level, m) for level, m in lib.lines if "cannot write DecisionJournal" in m]
    assert len(errors) == 1 and errors[0][0] == hook.LOG_ERROR
    assert "jobs are not affected" in errors[0][1]
    assert state.journal.dropped == 3
    hook._write_stats(state)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["journal"]["dropped"] == 3 and "Not a directory" in stats["journal"]["error"]
    # Fixed by the admin: the next flush writes again and says so once.
    not_a_dir.unlink()
    not_a_dir.mkdir()
    submit_gpu_job(lib)
    state.journal.flush()  # (or the flusher thread did it already)
    assert len(journal_lines(not_a_dir / "decisions.jsonl")) == 1
    assert any("writing again" in m for _level, m in lib.lines)


def test_fail_open_and_refusal_are_journaled(
    lib: FakeLib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, _ = submit_gpu_job(lib, name="bad", cpus_per_tres="gres:gpu:3")
    refused = make_desc(lib, tres_per_node="gres:gpu:1", comment="coda:workload=", name="r")
    assert hook.job_submit(refused, 1000, ffi.new("char **")) == -1

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("profile index exploded")

    monkeypatch.setattr(hook, "decide", boom)
    rc, desc = submit_gpu_job(lib, name="boom", cpus_per_tres="gres:gpu:3")
    assert rc == 0 and field(desc, "cpus_per_tres") == "gres:gpu:3"
    hook.current_state().journal.flush()
    first, reject, failed = journal_lines(tmp_path / "decisions.jsonl")
    assert first["action"] == "keep" and first["given_cores"] == 6
    assert reject["action"] == "reject" and reject["job"] == "r"
    assert failed["fail_open"] is True and failed["action"] is None
    assert failed["job"] == "boom" and "profile index exploded" in failed["error"]
    # The log line names the job first, as every decision's line does.
    assert any(m.startswith('job "boom" uid=1000: RuntimeError') for _l, m in lib.lines)


# -- reading and summing a journal ------------------------------------------------------------


def entry(t: float, action: str | None, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1,
        "t": t,
        "job_id": None,
        "job": "j",
        "uid": 1000,
        "sig": "workload:1000:resnet50",
        "profile": "workload:*:resnet50",
        "action": action,
        "would": None,
        "src": "global",
        "gpn": 1,
        "nodes": 1,
        "gpus": 1,
        "was": None,
        "cpg": 6,
        "asked_cores": None,
        "given_cores": None,
        "hook_us": 20.0,
        "fail_open": False,
    }
    base.update(fields)
    return base


# A day of decisions with known sums (written by hand, not by the writer).
HAND_MADE = [
    entry(NOW - 10 * HOUR, "set", gpus=2, gpn=2, given_cores=12),
    entry(NOW - 9 * HOUR, "lower", gpus=2, gpn=2, was="cpg:16", asked_cores=32, given_cores=12),
    entry(NOW - 8 * HOUR, "lower", cpg=3, was="cpt:8", asked_cores=8, given_cores=3),
    # UserValue=replace raising a starving job: 2 per GPU asked on 4 GPUs, 6 given.
    entry(NOW - 7 * HOUR, "replace", gpus=4, gpn=4, was="cpg:2", asked_cores=8, given_cores=24),
    entry(NOW - 6 * HOUR, "keep", gpus=2, gpn=2, was="cpg:2", asked_cores=4, given_cores=4),
    entry(NOW - 5 * HOUR, "skip", src="none", profile=None, cpg=None),
    entry(NOW - 4 * HOUR, "advise", would="lower", cpg=4, was="cpg:10", asked_cores=10),
    entry(NOW - 3 * HOUR, "set", fail_open=True, error="decision took 25.0 ms > HookBudgetMs=20"),
    entry(NOW - 2 * HOUR, "default", src="default", profile=None, cpg=2, given_cores=2),
    entry(NOW - 1 * HOUR, "reject", sig=None, profile=None, src=None, gpus=None, cpg=None),
]


def write_journal(path: Path, entries: list[dict[str, Any]], extra: list[str] = ()) -> None:
    lines = [json.dumps(e) for e in entries] + list(extra)
    path.write_text("\n".join(lines) + "\n")


def test_hand_made_journal_sums_to_the_known_answers(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    old = entry(NOW - 30 * HOUR, "lower", was="cpg:64", asked_cores=64, given_cores=6)
    write_journal(
        path,
        [old, *HAND_MADE],
        extra=["{not json", json.dumps(entry(NOW, "set", v=2)), '{"v": 1, "t": "soon"}'],
    )
    with path.open("a") as f:
        f.write('{"v": 1, "t": ')  # being written right now: neither read nor counted
    read = read_journal(path, NOW - 24 * HOUR)
    assert read.malformed == 2 and read.newer_format == 1
    assert read.oldest_unix_s == NOW - 30 * HOUR
    assert len(read.entries) == len(HAND_MADE)  # the 30 h old entry is outside the day
    s = summarize_decisions(read.entries)
    assert s["decisions"] == 10
    assert {a: v["jobs"] for a, v in s["by_action"].items()} == {
        "set": 1,
        "lower": 2,
        "replace": 1,
        "keep": 1,
        "skip": 1,
        "advise": 1,
        "default": 1,
        "reject": 1,
    }
    assert s["by_action"]["replace"]["gpus"] == 4
    assert s["by_src"] == {"default": 1, "global": 6, "none": 1}
    assert s["would"] == {"lower": 1}
    # asked: 32 + 8 + 8 + 4 + 10 on 2 + 1 + 4 + 2 + 1 GPUs; given: 12 + 3 + 24 + 4 + 10
    assert s["asked_vs_given"] == {
        "jobs": 5,
        "gpus": 10,
        "asked_cores": 62,
        "given_cores": 53,
        "asked_cores_per_gpu": 6.2,
        "given_cores_per_gpu": 5.3,
    }
    assert s["returned"] == {"jobs": 2, "cores": 25}  # never netted with the 16 added
    assert s["added"] == {"jobs": 1, "cores": 16}
    assert s["advise_would_return"] == {"jobs": 1, "cores": 6}
    assert s["no_user_value"]["jobs"] == 3 and s["no_user_value"]["given_cores"] == 14
    assert s["fail_open"]["jobs"] == 1 and "HookBudgetMs" in s["fail_open"]["last_error"]
    assert s["profiles_used"] == {"workload:*:resnet50": 6}


def test_journal_lines_from_the_writer_sum_like_hand_made_ones(tmp_path: Path) -> None:
    """journal_entry and summarize_decisions agree on what asked and given mean."""
    cfg = CodaConfig(user_value="replace")
    req, decision = decided(
        cfg,
        tres_per_node="gres:gpu:4",
        cpus_per_tres="gres:gpu:2",
        comment="coda:workload=resnet50",
    )
    line = journal_entry(*pending_entry(NOW, NO_VAL, 1000, req, decision, 1000, False))
    s = summarize_decisions([line])
    assert s["added"] == {"jobs": 1, "cores": 16} and s["returned"]["cores"] == 0


# -- which decisions Slurm kept ------------------------------------------------------------


@pytest.mark.parametrize(
    "age_s,in_slurm,asked,outcome",
    [
        (120.0, True, True, "kept"),
        (120.0, False, True, "refused"),  # slurmctld would still hold it: never created
        (30.0, False, True, "unchecked"),  # its submission may still be in flight
        (400.0, False, True, "unchecked"),  # older than MinJobAge: it may have ended and gone
        (400.0, True, True, "kept"),
        (120.0, False, False, "unchecked"),  # Slurm was not asked
    ],
)
def test_a_decision_counts_unless_slurm_surely_refused_its_submission(
    age_s: float, in_slurm: bool, asked: bool, outcome: str
) -> None:
    entries = [{"t": NOW - age_s, "tok": "00000000000000aa", "action": "set"}, {"t": NOW}]
    tokens = {"00000000000000aa"} if in_slurm else {"00000000000000bb"}
    got = reconcile(
        entries,
        tokens if asked else None,
        queried_unix_s=NOW,
        min_job_age_s=300.0,
        settle_s=60.0,
    )
    assert {"kept": got.kept, "refused": got.refused, "unchecked": got.unchecked} == {
        k: int(k == outcome) for k in ("kept", "refused", "unchecked")
    }
    # The entry without a token (a fail-open, a refused directive) is always counted.
    assert len(got.entries) == (1 if outcome == "refused" else 2)


def test_tokens_are_read_from_the_hook_record_of_each_job_only() -> None:
    doc = {
        "jobs": [
            {
                "job_id": 1,
                "admin_comment": "coda:sig=script:0:ab;cpg=;was=;action=skip;src=none"
                ";gpn=1;nodes=1;tok=00000000000000a1 coda: a note",
            },
            {"job_id": 2, "admin_comment": "from-lua"},
            {
                "job_id": 3,
                "admin_comment": "coda:sig=script:0:ab;cpg=;was=;action=skip;src=none"
                ";gpn=1;nodes=1",
            },
            {"job_id": 4},
        ]
    }
    assert cli_status.parse_slurm_tokens(json.dumps(doc)) == {"00000000000000a1"}
    with pytest.raises(ValueError):
        cli_status.parse_slurm_tokens("{}")
    assert cli_status.parse_min_job_age_s("MaxJobCount = 10000\nMinJobAge   = 300 sec\n") == 300


@pytest.mark.parametrize(
    ("private", "euid", "sees_all"),
    [
        ("none", 1000, True),
        ("jobs,usage", 0, True),
        ("jobs,usage", 64030, True),
        ("jobs,usage", 1000, False),
        ("all", 1000, False),
        ("usage", 1000, True),
    ],
)
def test_a_query_that_private_data_filters_is_not_taken_as_every_job(
    private: str, euid: int, sees_all: bool
) -> None:
    config = f"PrivateData             = {private}\nSlurmUser               = slurm(64030)\n"
    assert cli_status.sees_all_jobs(config, euid) is sees_all


@pytest.mark.parametrize(
    "text,seconds",
    [("1d", 86400), ("6h", 21600), ("30m", 1800), ("90s", 90), ("1.5h", 5400), ("2w", 1209600)],
)
def test_since_accepts_durations(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "d", "-1h", "0h", "1y", "1 day"])
def test_since_refuses_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


# -- the command, in process ------------------------------------------------------------------


class Result(NamedTuple):
    rc: int
    out: str
    err: str


def status_cli(*args: str) -> Result:
    runner = CliRunner()
    with runner.isolation() as (out, err, _mixed):
        rc = run_cli(coda_slurm, "coda-slurm", ["status", *args])
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(rc, out.getvalue().decode(), err.getvalue().decode())


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A controller's coda.conf with nothing written yet; squeue answers 'no jobs'."""
    (tmp_path / "profiles").mkdir(mode=0o755)
    (tmp_path / "slurm.conf").write_text(f"SlurmctldLogFile={tmp_path / 'ctld.log'}\n")
    conf = tmp_path / "coda.conf"
    conf.write_text(
        f"ProfileStore={tmp_path / 'profiles'}\nHookStatsFile={tmp_path / 'stats.json'}\n"
        f"DecisionJournal={tmp_path / 'decisions.jsonl'}\n"
    )
    monkeypatch.setattr(cli_status, "squeue_submit_times", lambda: [])
    return conf


def write_stats(path: Path, **fields: Any) -> None:
    now = time.time()
    stats = {
        "format": "coda-hook-stats",
        "format_version": 1,
        "pid": 4242,
        "started_unix_s": now - 2 * 86400,
        "written_unix_s": now - 1,
        "conf_loaded_unix_s": now - 2 * 86400,
        "store_refreshed_unix_s": now - 1,
        "store_error": None,
        "journal": {"path": "x", "written": 10, "dropped": 0, "pending": 0, "error": None},
        "calls": 120,
        "gpu_jobs": 10,
        "changed": 6,
        "rejected": 1,
        "fail_open": 0,
        "over_budget": 0,
        "last_call_unix_s": now - 60,
        "p50_us": 180.0,
        "p99_us": 420.0,
        "max_us": 900.0,
    }
    stats.update(fields)
    path.write_text(json.dumps(stats))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("written_unix_s", "yesterday"),
        ("written_unix_s", float("nan")),
        ("started_unix_s", 1e308),
        ("calls", [1]),
        ("fail_open", "many"),
        ("p99_us", float("inf")),
        ("store_error", {"a": 1}),
        ("journal", [1]),
        ("journal", {"written": "x"}),
    ],
)
def test_a_damaged_stats_file_is_named_unreadable_not_a_traceback(
    site: Path, field: str, value: object
) -> None:
    write_stats(site.parent / "stats.json", **{field: value})
    for args in ((), ("--json",)):
        r = status_cli("--conf", str(site), *args)
        assert r.rc == 0, r.err
    assert f"not a hook stats file: {field}" in status_cli("--conf", str(site)).out


def test_a_huge_stats_file_is_named_unreadable_unread(site: Path) -> None:
    stats = site.parent / "stats.json"
    with stats.open("wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB of zeros
    hook_stats = cli_status.read_hook_stats(stats, NOW, 5.0)
    assert hook_stats["state"] == "unreadable"
    assert hook_stats["error"] == "8,589,934,592 bytes, more than 1,048,576: not a hook stats file"


def test_fresh_install_says_what_is_missing_in_plain_words(site: Path) -> None:
    r = status_cli("--conf", str(site))
    assert r.rc == 0, r.err
    stats = site.parent / "stats.json"
    assert (
        f"the hook has not written stats at {stats}: is JobSubmitPlugins=coda set and "
        "slurmctld restarted?" in r.out
    )
    assert f"Journal  {site.parent / 'decisions.jsonl'}: not written yet" in r.out
    assert "Store    " in r.out and ": 0 profiles" in r.out
    assert "no profiles yet" in r.out
    assert "Profiles (0)\n  none" in r.out
    assert "no GPU job decided" in r.out


def test_missing_stats_while_jobs_are_submitted_says_so(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_status, "squeue_submit_times", lambda: [time.time() - 60] * 3)
    out = status_cli("--conf", str(site)).out
    assert "squeue shows 3 job(s) submitted since" in out


def test_a_deeply_nested_journal_line_or_stats_file_is_unreadable_not_a_traceback(
    tmp_path: Path,
) -> None:
    deep = "[" * 100_000  # a damaged file: json's decoder runs out of stack on it
    path = tmp_path / "decisions.jsonl"
    write_journal(path, [entry(NOW, "set", gpus=1)], extra=[deep])
    read = read_journal(path, NOW - HOUR)
    assert read.malformed == 1 and len(read.entries) == 1
    stats = tmp_path / "stats.json"
    stats.write_text(deep)
    hook_stats = cli_status.read_hook_stats(stats, NOW, 5.0)
    assert hook_stats["state"] == "unreadable"
    assert "nested too deeply" in hook_stats["error"]


def test_status_sums_the_window_and_json_has_the_same_numbers(site: Path) -> None:
    now = time.time()
    shifted = [{**e, "t": e["t"] - NOW + now} for e in HAND_MADE]
    write_journal(site.parent / "decisions.jsonl", shifted, extra=["garbage"])
    write_stats(site.parent / "stats.json")
    ProfileStore(site.parent / "profiles").write(
        Profile(
            signature="workload:*:resnet50",
            workload="resnet50",
            cpus_per_gpu=6,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=now - 3 * HOUR,
            source="test",
        )
    )
    text = status_cli("--conf", str(site)).out
    assert "returned to the cluster: 25 cores from 2 jobs" in text
    assert "added to starving jobs: 16 cores for 1 job" in text
    assert "asked 62 cores (6.2/GPU), given 53 (5.3/GPU)" in text
    assert re.search(r"lower\s+lowered the user's value\s+2\s+3", text), text
    assert re.search(r"workload:\*:resnet50\s+6\s+0\.95\s+8\s+3h ago\s+6", text), text
    assert "1 unreadable line(s)" in text
    doc = json.loads(status_cli("--conf", str(site), "--json").out)
    assert doc["schema_version"] == 1
    assert doc["decisions"]["returned"] == {"jobs": 2, "cores": 25}
    assert doc["decisions"]["added"] == {"jobs": 1, "cores": 16}
    assert doc["profiles"][0]["jobs"] == 6 and doc["journal"]["malformed"] == 1
    assert doc["hook"]["state"] == "ok" and doc["hook"]["stats"]["p99_us"] == 420.0
    # --since 3.5h keeps the last three entries only (fail-open, default, reject).
    recent = json.loads(status_cli("--conf", str(site), "--json", "--since", "3.5h").out)
    assert recent["decisions"]["decisions"] == 3
    assert recent["decisions"]["returned"]["cores"] == 0


def test_problems_each_get_a_verdict_that_says_where_to_look(site: Path) -> None:
    tmp = site.parent
    write_stats(
        tmp / "stats.json",
        fail_open=2,
        over_budget=1,
        p99_us=15_000.0,
        store_error="cannot list profile store /x: Permission denied; keeping the last 3",
        journal={"path": "/j", "written": 0, "dropped": 5, "pending": 0, "error": "No space"},
    )
    (tmp / "profiles" / "bad.json").write_text("{}")  # not a profile file name: ignored
    fail = dict(fail_open=True, error="RuntimeError: profile index exploded")
    write_journal(tmp / "decisions.jsonl", [entry(time.time() - 60, None, **fail)])
    doc = json.loads(status_cli("--conf", str(site), "--json").out)
    messages = {v["message"]: v["level"] for v in doc["verdicts"]}
    text = "\n".join(messages)
    assert "2 job(s) passed unchanged after a hook failure" in text
    assert f"grep 'job passes unchanged' {tmp / 'ctld.log'}" in text
    assert "last: RuntimeError: profile index exploded" in text
    assert "p99 in-hook time 15.0 ms is over half of HookBudgetMs=20" in text
    assert "the hook cannot read the profile store: cannot list" in text
    assert "the hook cannot write /j: No space (5 decision(s) not journaled)" in text
    assert "ok" not in messages.values()


def test_stale_stats_and_unreadable_store(site: Path) -> None:
    tmp = site.parent
    write_stats(tmp / "stats.json", written_unix_s=time.time() - 2 * HOUR)
    site.write_text(site.read_text() + f"ProfileStore={tmp / 'stats.json'}\n")
    out = status_cli("--conf", str(site)).out
    assert "the hook last wrote" in out and "2h ago" in out
    assert "slurmctld is stopped or job_submit/coda is not loaded" in out
    assert "cannot read the profile store" in out


def test_rotated_journal_that_does_not_cover_the_window_says_raise_the_limit(
    site: Path,
) -> None:
    tmp = site.parent
    write_stats(tmp / "stats.json")
    now = time.time()
    write_journal(tmp / "decisions.jsonl.1", [entry(now - 5 * HOUR, "set", gpus=1)])
    write_journal(tmp / "decisions.jsonl", [entry(now - HOUR, "set", gpus=1)])
    out = status_cli("--conf", str(site)).out
    assert "the journal reaches back only 5h, not 1d" in out and "JournalMaxBytes" in out
    assert "2 decisions in the last 1d" in out


def test_a_journal_file_far_past_journal_max_bytes_is_read_from_its_end_only(site: Path) -> None:
    tmp = site.parent
    site.write_text(site.read_text() + "JournalMaxBytes=65536\n")
    write_stats(tmp / "stats.json")
    path = tmp / "decisions.jsonl"
    with path.open("wb") as f:
        f.truncate(1 << 30)  # a damaged file: 1 GiB of zeros (sparse), then one entry
        f.seek(1 << 30)
        f.write(("\n" + json.dumps(entry(time.time() - 60, "set", gpus=1)) + "\n").encode())
    read = read_journal(path, 0.0, max_file_bytes=2 * 65536)
    assert len(read.entries) == 1 and read.malformed == 0
    assert read.unread_bytes == (1 << 30) + 1  # the zeros and the newline that ends them
    out = status_cli("--conf", str(site)).out
    assert "1 decisions in the last 1d" in out
    assert re.search(
        r"1,073,741,825 bytes at the start of \S*decisions\.jsonl \(or its \.1\) not", out
    )
    assert "twice JournalMaxBytes=65536" in out


def test_advise_mode_says_what_enforce_would_have_returned(site: Path) -> None:
    tmp = site.parent
    site.write_text(site.read_text() + "Mode=advise\n")
    write_stats(tmp / "stats.json")
    write_journal(
        tmp / "decisions.jsonl",
        [entry(time.time() - 60, "advise", would="lower", cpg=4, was="cpg:10", asked_cores=10)],
    )
    out = status_cli("--conf", str(site)).out
    assert "Mode=enforce would have returned 6 core(s) from 1 job(s)" in out
    assert "nothing needs attention" in out


def test_render_without_anything_configured() -> None:
    cfg, _ = parse_config("HookStatsFile=\nDecisionJournal=\nProfileStore=/nonexistent\n")
    doc = collect_status(cfg, Path("/etc/slurm/coda.conf"), 86400.0, NOW)
    text = render(doc)
    assert "Hook     no stats (HookStatsFile is empty)" in text
    assert "Journal  off (DecisionJournal is empty)" in text
    assert "Store    /nonexistent: unreadable (No such file or directory)" in text


def test_bad_arguments_are_refused_by_the_cli(site: Path, tmp_path: Path) -> None:
    r = status_cli("--conf", str(site), "--since", "yesterday")
    assert r.rc == 2 and "--since" in r.err
    r = status_cli("--conf", str(tmp_path / "nope.conf"))
    assert r.rc == 1 and r.err.startswith(f"coda-slurm: cannot load {tmp_path / 'nope.conf'}")


# -- the real thing: a local Slurm cluster ----------------------------------------------------


@pytest.fixture
def cancel_jobs(cluster: DevCluster) -> Iterator[None]:
    yield
    cluster.run(["scancel", "--user=root"], check=False)


def gpus_of(record: dict[str, str]) -> int:
    return int(record["gpn"]) * int(record["nodes"])


@pytest.mark.slurm
def test_status_agrees_with_the_jobs_admin_comments(
    cluster: DevCluster,
    coda_conf: Path,
    ctld_log: LogWatch,
    tmp_path: Path,
    cancel_jobs: None,
) -> None:
    journal = tmp_path / "decisions.jsonl"
    put_profile(cluster, "workload:*:statnet", 6)
    set_conf(cluster, ctld_log, f"UserValue=lower\nDecisionJournal={journal}")
    wait_for_reload(cluster)
    jobs = {
        "st-set": ["--gpus-per-node=2", "--comment=coda:workload=statnet"],
        "st-lower": ["--gpus-per-node=2", "--cpus-per-gpu=10", "--comment=coda:workload=statnet"],
        "st-lower-cpt": [
            "--gpus-per-node=1",
            "--cpus-per-task=8",
            "--comment=coda:workload=statnet",
        ],
        "st-keep": ["--gpus-per-node=1", "--cpus-per-gpu=3", "--comment=coda:workload=statnet"],
        "st-unknown": ["--gpus-per-node=1"],
    }
    ids: dict[str, int] = {}
    records: dict[str, dict[str, str]] = {}
    given_per_gpu: dict[str, int | None] = {}
    given_per_task: dict[str, int] = {}
    for name, args in jobs.items():
        job_id, _said = cluster.sbatch(["--hold", "-J", name, *args], f"#!/bin/sh\n# {name}\n")
        fields = cluster.show_job(job_id)
        ids[name] = job_id
        records[name] = parse_admin_record(fields["AdminComment"])
        tres = fields.get("CpusPerTres") or ""
        given_per_gpu[name] = int(tres.rsplit(":", 1)[1]) if tres else None
        given_per_task[name] = int(fields["CPUs/Task"])
    cluster.sbatch(["--hold", "-J", "st-cpu", "--ntasks=2"], "#!/bin/sh\ntrue\n")

    deadline = time.monotonic() + 5
    while len(journal.read_text().splitlines() if journal.exists() else []) < len(jobs):
        assert time.monotonic() < deadline, "the hook did not journal the jobs within 5 s"
        time.sleep(0.1)
    wait_for_reload(cluster)  # stats written after the submissions
    proc = cluster.run(
        [
            str(Path(sys.executable).with_name("coda-slurm")),
            "status",
            "--json",
            "--conf",
            str(cluster.coda_conf),
        ]
    )
    doc = json.loads(proc.stdout)

    # What slurmctld holds, summed the way an admin would by hand.
    actions = Counter(r["action"] for r in records.values())
    assert actions == {"set": 1, "lower": 2, "keep": 1, "skip": 1}
    asked = given = returned = 0
    for name, r in records.items():
        if not r["was"]:
            continue
        kind, number = r["was"].split(":")
        asked_job = int(number) * (gpus_of(r) if kind == "cpg" else 1)  # 1 task per job here
        # A --cpus-per-task request is rewritten per task (CPUs/Task), one task per job here.
        per_gpu = given_per_gpu[name]
        given_job = per_gpu * gpus_of(r) if kind == "cpg" and per_gpu else given_per_task[name]
        asked += asked_job
        given += given_job
        returned += max(asked_job - given_job, 0)
    assert (asked, given, returned) == (2 * 10 + 8 + 3, 2 * 6 + 6 + 3, 8 + 2)

    dec = doc["decisions"]
    assert {a: v["jobs"] for a, v in dec["by_action"].items()} == dict(actions)
    assert dec["by_src"] == dict(Counter(r["src"] for r in records.values()))
    assert dec["asked_vs_given"]["asked_cores"] == asked
    assert dec["asked_vs_given"]["given_cores"] == given
    assert dec["returned"] == {"jobs": 2, "cores": returned}
    assert dec["added"] == {"jobs": 0, "cores": 0}
    assert dec["no_user_value"] == {
        "jobs": 2,
        "given_jobs": 1,
        "gpus": 2,
        "given_cores": 12,
        "given_cores_per_gpu": 6.0,
    }
    assert next(p for p in doc["profiles"] if p["signature"] == "workload:*:statnet")["jobs"] == 4
    hook_stats = doc["hook"]["stats"]
    assert doc["hook"]["state"] == "ok" and hook_stats["calls"] >= len(jobs) + 1
    assert hook_stats["p99_us"] > 0 and hook_stats["journal"]["error"] is None
    # (Earlier tests on this session's cluster leave fail-opens and broken profiles: warnings.)
    assert not [v for v in doc["verdicts"] if v["level"] == "error"], doc["verdicts"]

    # Slurm 22.05 assigns the job id after job_submit: the journal says so rather than guess.
    entries = journal_lines(journal)
    assert [e["job"] for e in entries] == list(jobs)
    assert all(e["job_id"] is None for e in entries)
    # slurmctld's log: one line per decision, the job's identity first, and slurmctld's own
    # "_slurm_rpc_submit_batch_job: JobId=N" right after it for a lone submission.
    log = ctld_log.text().splitlines()
    for name, job_id in ids.items():
        mine = [i for i, line in enumerate(log) if f'job_submit/coda: job "{name}" uid=0 ' in line]
        assert len(mine) == 1, (name, mine)
        rpc = next(line for line in log[mine[0] + 1 :] if "_slurm_rpc_submit_batch_job" in line)
        assert f"JobId={job_id} " in rpc
    assert not any('job "st-cpu"' in line for line in log)  # CPU-only: no decision, no line


def test_status_as_a_subprocess_without_a_cluster_says_slurmctld_is_missing(
    tmp_path: Path,
) -> None:
    """The installed entry point, on a controller where the plugin never ran."""
    (tmp_path / "profiles").mkdir(mode=0o755)
    conf = tmp_path / "coda.conf"
    conf.write_text(
        f"ProfileStore={tmp_path / 'profiles'}\nHookStatsFile={tmp_path / 'stats.json'}\n"
        f"DecisionJournal={tmp_path / 'd.jsonl'}\n"
    )
    # An squeue that cannot reach slurmctld (the real one retries for ~9 s before saying so).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("coda-slurm")), "status", "--conf", str(conf)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "is JobSubmitPlugins=coda set and slurmctld restarted?" in proc.stdout
    assert (
        "could not ask squeue about recent submissions: slurm_load_jobs error: Unable to "
        "contact slurm controller; is slurmctld running?" in proc.stdout
    )


def test_an_unreadable_journal_is_not_read_as_no_decisions(site: Path) -> None:
    # As a user who may not read the journal: the hook's own counters say 22 GPU jobs, and
    # the Jobs section must not say that none was decided.
    tmp = site.parent
    write_stats(tmp / "stats.json", gpu_jobs=22)
    (tmp / "decisions.jsonl").mkdir()
    out = status_cli("--conf", str(site)).out
    assert "no GPU job decided" not in out
    assert "not known: the decision journal is unreadable" in out


def test_a_fifo_where_the_journal_belongs_is_unreadable_not_a_hang(site: Path) -> None:
    tmp = site.parent
    write_stats(tmp / "stats.json", gpu_jobs=22)
    os.mkfifo(tmp / "decisions.jsonl")  # no writer: a blocking open would wait for ever
    out = subprocess.run(
        [sys.executable, "-m", "slurm_plugin.cli.main", "status", "--conf", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "not known: the decision journal is unreadable" in out
    assert "not a regular file" in out


def test_the_priors_are_summed_into_one_source_naming_the_most_used() -> None:
    from slurm_plugin.cli.status import _sources_line

    by_src = {"default": 3, "prior:alexnet": 4, "prior:bert": 1, "profile": 9}
    assert _sources_line(by_src) == "default 3, profile 9, prior 5 (alexnet 4, bert 1)"
    many = {f"prior:m{i}": 1 for i in range(7)}
    assert _sources_line(many).endswith("m4 1, 2 more)")


def test_a_prior_is_counted_as_the_global_profile_it_names() -> None:
    from slurm_plugin.hook.journal import _profile_of

    assert _profile_of("prior:alexnet", "script:1000:0123456789abcdef") == "workload:*:alexnet"
    assert _profile_of("default", "script:1000:0123456789abcdef") is None
