"""``coda-slurm job`` for ended jobs: where the hook's decision comes from (admin comment,
coda-node's job summary, the decision journal) and the verdict from the job summaries."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from coda_common.store.jobsummary import JobSummary
from coda_common.store.summaries import SummaryStore
from slurm_plugin.cli.jobdecision import choose_decision, from_journal_entry, match_journal
from slurm_plugin.cli.jobreport import SACCT_FIELDS, build_report, parse_structured, render
from slurm_plugin.slurm.scontrol import parse_scontrol_line

TOKEN = "18ef12c8290510a9"
RECORD = f"coda:sig=workload:1000:r50;cpg=8;was=;action=set;src=profile;gpn=2;nodes=1;tok={TOKEN}"
JS1 = "JS1:eyJncHVzIjoxfQ=="
SUBMIT_S = 1_765_100_000.0

SUMMARY = JobSummary(
    job_id=7,
    node="gpu01",
    user="alice",
    uid=1000,
    account="vision",
    partition="gpu",
    kind="dnn",
    num_nodes=1,
    start_unix_s=SUBMIT_S + 5,
    end_unix_s=SUBMIT_S + 3605,
    sampled_s=3600.0,
    gpus=2,
    gpu_model="NVIDIA H100 80GB HBM3",
    cores_allocated=16,
    cores_mean=14.0,
    cpu_used_cores_mean=13.5,
    gpu_util_pct_mean=61.0,
    gpu_sampled_s=3600.0,
    gpu_wait_s=1800.0,
    idle_core_s=9000.0,
    probe_s=600.0,
    probes=1,
    slim_s=900.0,
    throttled_s=0.0,
    protected_s=240.0,
    profile_state="profiled",
    record=RECORD,
)


def entry(**kw: Any) -> dict[str, Any]:
    e = {
        "v": 1,
        "t": SUBMIT_S + 0.4,
        "job_id": None,
        "job": "train",
        "uid": 1000,
        "sig": "workload:1000:r50",
        "action": "set",
        "would": None,
        "src": "profile",
        "gpn": 2,
        "nodes": 1,
        "was": "",
        "cpg": 8,
        "tok": TOKEN,
    }
    e.update(kw)
    return e


@pytest.mark.parametrize(
    ("entries", "token", "found", "how"),
    [
        ([entry(), entry(tok="1" * 16)], TOKEN, 0, "token"),
        ([entry(tok="1" * 16)], None, 0, "name and submit time"),
        ([entry(t=SUBMIT_S + 5)], None, None, "no journal entry"),
        ([entry(uid=1001)], None, None, "no journal entry"),
        ([entry(job="train2")], None, None, "no journal entry"),
        ([entry(), entry(tok="1" * 16, t=SUBMIT_S - 1)], None, None, "ambiguous: 2"),
        # A token no entry holds: the name and time decide, and only alone.
        ([entry(tok="1" * 16)], "2" * 16, 0, "name and submit time"),
    ],
)
def test_a_journal_entry_is_taken_only_when_exactly_one_matches(
    entries: list[dict[str, Any]], token: str | None, found: int | None, how: str
) -> None:
    got, why = match_journal(
        entries, token=token, uid=1000, job_name="train", submit_unix_s=SUBMIT_S
    )
    assert got is (None if found is None else entries[found])
    assert why.startswith(how)


def test_a_name_match_is_refused_when_slurm_holds_a_namesake_submitted_beside_it() -> None:
    # A job the hook journaled nothing for (coda:off) submitted beside one it decided.
    got, why = match_journal(
        [entry()], token=None, uid=1000, job_name="train", submit_unix_s=SUBMIT_S, namesakes=2
    )
    assert got is None and why.startswith("ambiguous: 2 jobs of its user and name")
    assert (
        match_journal(
            [entry()], token=TOKEN, uid=1000, job_name="train", submit_unix_s=SUBMIT_S, namesakes=2
        )[1]
        == "token"
    )


def test_a_long_name_matches_the_journals_first_128_characters() -> None:
    name = "n" * 300
    e = entry(job=name[:128], tok=None)
    assert match_journal([e], token=None, uid=1000, job_name=name, submit_unix_s=SUBMIT_S)[0] is e


@pytest.mark.parametrize(
    ("admin_comment", "summaries", "journal", "source"),
    [
        (f"site:lua {RECORD}", [SUMMARY], None, "admin_comment"),
        (JS1, [SUMMARY], None, "summary"),
        (JS1, [dataclasses.replace(SUMMARY, record=None)], (entry(), "token"), "journal"),
        (JS1, [], (None, "ambiguous: 2 journal entries"), None),
        ("", [], None, None),
    ],
)
def test_the_decision_comes_from_the_first_place_that_holds_it(
    admin_comment: str, summaries: list[JobSummary], journal: Any, source: str | None
) -> None:
    coda, where = choose_decision(admin_comment, summaries, journal)
    assert where["source"] == source
    if source is None:
        assert coda is None
        return
    assert coda is not None
    assert (coda["action"], coda["cpus_per_gpu"], coda["token"]) == ("set", 8, TOKEN)
    if source != "admin_comment":
        assert "JS1:" in where["why"]  # what the admin comment holds instead, shown


def test_a_hostile_journal_entry_makes_no_record() -> None:
    assert from_journal_entry(entry(sig="a b;c=d", action="set")) is not None
    coda = from_journal_entry(entry(src="x;action=keep", cpg="8 9"))
    assert coda is not None and coda["source"] == "" and coda["cpus_per_gpu"] is None
    assert from_journal_entry(entry(action=None)) is None  # a fail-open entry decides nothing


def _ended_job() -> Any:
    values = dict.fromkeys(SACCT_FIELDS, "")
    values.update(
        JobIDRaw="7",
        JobID="7",
        State="COMPLETED",
        User="alice",
        UID="1000",
        NNodes="1",
        NodeList="gpu01",
        ElapsedRaw="3600",
        AllocCPUS="16",
        ReqTRES="billing=1,cpu=1,gres/gpu=2,node=1",
        AllocTRES="billing=16,cpu=16,gres/gpu=2,node=1",
        TotalCPU="13:30:00",
    )
    return parse_structured("|".join(values[f] for f in SACCT_FIELDS) + "\n", 7)


def test_an_ended_jobs_report_gives_the_verdict_and_each_nodes_summary() -> None:
    report = build_report(7, _ended_job(), "train", JS1, summaries=[SUMMARY])
    assert report["gpus_waiting_on_cpu"]["verdict"] == "yes"
    assert report["gpus_waiting_on_cpu"]["share"] == pytest.approx(0.5)
    assert report["coda_source"]["source"] == "summary"
    assert report["summaries"][0]["node"] == "gpu01"
    assert report["summaries"][0]["protected_s"] == 240.0
    assert report["schema_version"] == 1
    json.dumps(report)
    text = render(report)
    assert "CODA decided         8 cores per GPU (set, from the user's own profile)" in text
    assert "from coda-node's job summary: the job's AdminComment holds no coda record" in text
    assert (
        "coda-node            gpu01: GPUs 61% busy, used 13.5 of 14.0 cores it had "
        "(16 allocated), 2.50 idle core-hours; probed 1x (600 s), slimmed 900 s, "
        "throttled 0 s, protected 240 s"
    ) in text
    assert "GPUs waiting on CPU  yes: GPUs 61% busy on average; for 50% of the run" in text


def test_summaries_written_as_a_node_writes_them_are_found(tmp_path: Path) -> None:
    store = SummaryStore(tmp_path / "jobs")
    store.append([SUMMARY], "gpu01")
    found = store.find_job(7, around_s=SUMMARY.end_unix_s)
    assert found == [SUMMARY]


FORGED = RECORD.replace("cpg=8", "cpg=1").replace(TOKEN, "0" * 16)


@pytest.mark.parametrize(
    ("tokens", "cpg", "why"),
    [
        ({TOKEN}, 8, "the decision journal holds this one's token"),
        ({TOKEN, "0" * 16}, None, "ambiguous: the job's AdminComment holds 2 coda records"),
        (set(), None, "the journal confirms none of them alone"),
        (None, None, "ambiguous: the job's AdminComment holds 2 coda records"),
    ],
)
def test_a_forged_record_beside_codas_is_told_apart_only_by_the_journal(
    tokens: set[str] | None, cpg: int | None, why: str
) -> None:
    # A site plugin that copies users' text into the admin comment, before coda's record.
    comment = f"{FORGED} {RECORD}"
    coda, where = choose_decision(comment, [SUMMARY], None, tokens)
    assert (coda or {}).get("cpus_per_gpu") == cpg
    assert why in where["why"]
    assert where["source"] == ("admin_comment" if cpg else None)


@pytest.mark.parametrize(
    ("line", "admin"),
    [
        (f"JobId=1 AdminComment=site:lua {RECORD} OverSubscribe=OK", f"site:lua {RECORD}"),
        (f"JobId=1 AdminComment={RECORD} coda: --cpus-per-gpu=8 Partition=gpu", None),
        ("JobId=1 AdminComment=a b=c Partition=gpu", "a b=c"),
    ],
)
def test_scontrol_reads_an_admin_comment_that_holds_several_words(
    line: str, admin: str | None
) -> None:
    # What an admin sees with lua,coda: the site's comment, then coda's record after a blank.
    fields = parse_scontrol_line(line)
    assert fields["AdminComment"] == (admin or line.split("AdminComment=")[1].rsplit(" ", 1)[0])
    assert fields["JobId"] == "1" and len(fields) == 3


def _fake_sacct(monkeypatch: pytest.MonkeyPatch, beside: str | Exception) -> None:
    """sacct for job 7 (submitted at SUBMIT_S, named "train", its AdminComment replaced by
    jobstats; job 9 is also "train", others are "other"); ``beside``: what the query for
    jobs submitted beside it returns."""
    import datetime as dt

    from slurm_plugin.cli import jobreport

    submit = dt.datetime.fromtimestamp(SUBMIT_S).strftime("%Y-%m-%dT%H:%M:%S")
    values = dict.fromkeys(SACCT_FIELDS, "")
    values.update(JobIDRaw="7", JobID="7", State="COMPLETED", UID="1000", Submit=submit)
    values.update(End="Unknown", ElapsedRaw="10", AllocCPUS="4")

    def run(args: list[str], env: Any = None) -> str:
        fmt = next(a for a in args if a.startswith("--format="))
        if fmt == "--format=JobName":
            return "train\n" if args[args.index("-j") + 1] in ("7", "9") else "other\n"
        if fmt == "--format=AdminComment":
            return JS1 + "\n"
        if fmt == "--format=JobIDRaw,JobID,Submit":
            if isinstance(beside, Exception):
                raise beside
            return beside
        return "|".join(values[f] for f in SACCT_FIELDS) + "\n"

    monkeypatch.setattr(jobreport, "run_sacct", run)


@pytest.mark.parametrize(
    ("beside", "source", "why"),
    [
        ("7|7|{t}\n8|8|{t}\n", "journal", "matched by name and submit time"),  # 8 is "other"
        ("7|7|{t}\n", "journal", "matched by name and submit time"),
        ("7|7|{t}\n9|9|{t}\n", None, "ambiguous: 2 jobs of its user and name"),  # 9: "train"
        (RuntimeError, None, "ambiguous: sacct did not say which jobs share its name"),
    ],
)
def test_the_report_takes_the_journal_entry_only_after_asking_sacct_for_namesakes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, beside: Any, source: str | None, why: str
) -> None:
    import datetime as dt

    from slurm_plugin.cli.jobreport import ReportError, fetch_report

    t = dt.datetime.fromtimestamp(SUBMIT_S).strftime("%Y-%m-%dT%H:%M:%S")
    _fake_sacct(
        monkeypatch,
        ReportError("sacct failed", "-S") if beside is RuntimeError else beside.format(t=t),
    )
    journal = tmp_path / "decisions.jsonl"
    journal.write_text(json.dumps(entry()) + "\n")
    report = fetch_report(7, journal_path=journal, summary_store=SummaryStore(tmp_path / "no"))
    assert report["coda_source"]["source"] == source, report["coda_source"]
    assert report["coda_source"]["why"].endswith(why) or why in report["coda_source"]["why"]


def test_the_report_reads_every_controllers_journal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a backup controller the job's entry is in the journal of the one in control."""
    import datetime as dt

    from slurm_plugin.cli.jobreport import fetch_report

    t = dt.datetime.fromtimestamp(SUBMIT_S).strftime("%Y-%m-%dT%H:%M:%S")
    _fake_sacct(monkeypatch, f"7|7|{t}\n")
    primary, backup = tmp_path / "decisions.ctl1.jsonl", tmp_path / "decisions.ctl2.jsonl"
    backup.write_text(json.dumps(entry()) + "\n")
    report = fetch_report(
        7, journal_path=[primary, backup], summary_store=SummaryStore(tmp_path / "no")
    )
    assert report["coda_source"]["source"] == "journal", report["coda_source"]
    report = fetch_report(7, journal_path=[primary], summary_store=SummaryStore(tmp_path / "no"))
    assert report["coda_source"]["source"] is None
    assert f"no journal at {primary}" in report["coda_source"]["why"]
