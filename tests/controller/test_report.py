"""``coda-slurm report``: the sums (multi-node jobs, duplicates, sizing sources, baselines,
window edges), the per-user mails under hostile names, the ``--json`` keys, damaged
summaries counted and skipped, the HTML page escaped, and the page as a real browser draws
it, its numbers the ``--json`` ones."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from coda_common.store.jobsummary import JobSummary
from coda_common.store.summaries import SummaryStore, day_of
from slurm_plugin.cli.main import main
from slurm_plugin.cli.report import mail_file_name
from slurm_plugin.cli.reporthtml import PLOT_ROWS, render_html
from slurm_plugin.cli.reporttext import fmt, fmt_pct
from slurm_plugin.cli.sitereport import (
    Baselines,
    Window,
    build_report,
    figures,
    parse_when,
    window_from,
)
from tests.conftest import require_browser

T0 = 1_765_100_000.0  # 2025-12-07 09:33 UTC
SINCE, UNTIL = "2025-12-01", "2025-12-08"
WINDOW = Window(parse_when(SINCE, 0), parse_when(UNTIL, 0))
REC = "coda:sig=workload:1000:resnet50;cpg={cpg};was={was};action={action};src={src};gpn=2;nodes=1"


def record(cpg: int = 8, was: str = "", action: str = "set", src: str = "profile") -> str:
    return REC.format(cpg=cpg, was=was, action=action, src=src)


def summary(**kw: Any) -> JobSummary:
    base: dict[str, Any] = dict(
        job_id=4711, node="gpu01", user="alice", uid=1000, account="vision", partition="gpu",
        kind="dnn", num_nodes=1, start_unix_s=T0, end_unix_s=T0 + 3600, sampled_s=3600.0,
        gpus=2, gpu_model="NVIDIA H100", cores_allocated=16, cores_mean=16.0,
        cpu_used_cores_mean=15.0, gpu_util_pct_mean=60.0, gpu_sampled_s=3600.0,
        gpu_wait_s=1800.0, idle_core_s=3600.0, probe_s=0.0, probes=0, slim_s=0.0,
        throttled_s=0.0, protected_s=0.0, profile_state="profiled", record=record(),
    )  # fmt: skip
    base.update(kw)
    return JobSummary(**base)


def report(summaries: list[JobSummary], baselines: Baselines | None = None) -> dict[str, Any]:
    jobs, cpu = figures(summaries, baselines or Baselines())
    return build_report(jobs, cpu, WINDOW, baselines or Baselines(), summaries_read=len(summaries))


def test_a_multi_node_job_is_one_job_with_its_nodes_summed() -> None:
    doc = report(
        [
            summary(node="gpu01", num_nodes=2, gpu_wait_s=900.0, idle_core_s=7200.0),
            summary(node="gpu02", num_nodes=2, gpus=4, gpu_wait_s=1800.0, idle_core_s=3600.0),
            summary(job_id=4712, user="bob", gpu_wait_s=0.0),
        ]
    )
    t = doc["totals"]
    assert t["jobs"] == 2 and doc["summaries"] == 3
    assert t["gpu_hours"] == 2 + 4 + 2  # GPUs x 1 h on each node
    assert t["gpu_hours_waiting"] == 2 * 0.25 + 4 * 0.5
    alice = doc["groups"]["user"][0]
    assert alice["name"] == "alice" and alice["jobs"] == 1
    assert alice["idle_core_hours"] == 3.0
    assert alice["waiting_share_pct"] == round(100 * 2.5 / 6, 1)
    # Defaults: the record's cpg=8 against no known baseline
    assert alice["jobs_baseline_unknown"] == 1 and alice["cores_added"] == 0


@pytest.mark.parametrize(
    ("rec", "key"),
    [
        (record(src="profile"), "jobs_from_profile"),
        (record(src="global"), "jobs_from_profile"),
        (record(src="prior:resnet50"), "jobs_from_prior"),
        (record(src="default", action="default"), "jobs_from_default"),
        (record(src="none", action="skip", cpg=""), "jobs_from_default"),  # type: ignore[arg-type]
        (None, "jobs_without_record"),
    ],
)
def test_what_sized_the_job(rec: str | None, key: str) -> None:
    t = report([summary(record=rec), summary(job_id=9, record=record(src="prior:bert"))])["totals"]
    sources = ("jobs_from_profile", "jobs_from_prior", "jobs_from_default", "jobs_without_record")
    expected = {k: (k == key) + (k == "jobs_from_prior") for k in sources}
    assert {k: t[k] for k in sources} == expected


SLURM_BASE = Baselines(partitions={"gpu": 4}, global_cpg=2, source="slurm.conf")


@pytest.mark.parametrize(
    ("rec", "partition", "baselines", "added", "returned", "unknown"),
    [
        # the user's own --cpus-per-gpu=4, coda set 8: 4 more per GPU x 2 GPUs
        (record(cpg=8, was="cpg:4", action="raise"), "gpu", Baselines(), 8, 0, 0),
        (record(cpg=2, was="cpg:6", action="lower"), "gpu", SLURM_BASE, 0, 8, 0),
        # --cpus-per-task=3 became cpt=6 while cpg=8: the baseline is 8 x 3 / 6 = 4 per GPU
        (record(cpg=8, was="cpt:3", action="replace") + ";cpt=6", "gpu", Baselines(), 8, 0, 0),
        # no request: the partition's DefCpuPerGPU=4, else the global 2, else unknown
        (record(cpg=8), "gpu", SLURM_BASE, 8, 0, 0),
        (record(cpg=1), "gpu", SLURM_BASE, 0, 6, 0),
        (record(cpg=8), "other", SLURM_BASE, 12, 0, 0),
        (record(cpg=8), "gpu", Baselines(), 0, 0, 1),
        # coda kept the user's request or only advised: nothing added, baseline not needed
        (record(cpg=8, was="cpg:4", action="keep"), "gpu", SLURM_BASE, 0, 0, 0),
        (record(cpg=8, action="advise") + ";would=set", "gpu", SLURM_BASE, 0, 0, 0),
    ],
)
def test_cores_added_and_returned_against_the_baseline(
    rec: str, partition: str, baselines: Baselines, added: int, returned: int, unknown: int
) -> None:
    t = report([summary(record=rec, partition=partition)], baselines)["totals"]
    assert (t["cores_added"], t["cores_returned"], t["jobs_baseline_unknown"]) == (
        added,
        returned,
        unknown,
    )
    assert t["core_hours_added"] == added and t["core_hours_returned"] == returned  # 1 h jobs


def test_window_edges_and_when() -> None:
    now = T0
    assert parse_when("now-7days", now) == now - 7 * 86400
    assert parse_when("now-36h", now) == now - 36 * 3600
    assert parse_when("2025-12-01", now) == 1_764_547_200.0
    assert parse_when("2025-12-01T01:00+01:00", now) == 1_764_547_200.0
    assert window_from(None, None, 1, now) == Window(now - 86400, now)
    assert window_from(None, None, None, now) == Window(now - 7 * 86400, now)
    for bad in (("2025-12-02", "2025-12-01", None), ("now-1d", None, 3.0)):
        with pytest.raises(ValueError):
            window_from(*bad, now)
    with pytest.raises(ValueError, match="unit"):
        parse_when("now-3fortnights", now)


def test_the_window_takes_jobs_that_ended_at_its_start_not_at_its_end(tmp_path: Path) -> None:
    since, until = WINDOW.since_unix_s, WINDOW.until_unix_s
    store = SummaryStore(tmp_path / "jobs")
    store.append(
        [
            summary(job_id=1, start_unix_s=since - 3600, end_unix_s=since),
            summary(job_id=2, start_unix_s=until - 3600, end_unix_s=until),
            summary(job_id=3, start_unix_s=since - 7200, end_unix_s=since - 1),
            summary(job_id=4, start_unix_s=until - 7200, end_unix_s=until - 1),
        ],
        "gpu01",
    )
    doc = run_json(tmp_path / "jobs")
    assert doc["totals"]["jobs"] == 2 and doc["summaries"] == 2
    assert doc["daily"][0] == {"day": "2025-12-01", "gpu_hours": 2.0, "gpu_hours_waiting": 1.0}
    assert doc["daily"][-1]["day"] == "2025-12-07" and len(doc["daily"]) == 7


def test_a_summary_written_twice_counts_once(tmp_path: Path) -> None:
    store = SummaryStore(tmp_path / "jobs")
    store.append([summary(gpu_wait_s=600.0)], "gpu01")
    store.append([summary(gpu_wait_s=1200.0)], "gpu01")  # the node restarted and wrote it again
    store.append([summary(node="gpu02", num_nodes=2)], "gpu02")
    t = run_json(tmp_path / "jobs")["totals"]
    assert (t["jobs"], t["gpu_hours"]) == (1, 4.0)
    assert t["gpu_hours_waiting"] == round(2 * (1200 + 1800) / 3600, 2)  # gpu01: its later copy


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str] | None = None) -> str:
    rc = main(args)
    assert rc == 0
    return capsys.readouterr().out if capsys else ""


def run_json(store: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [
            *_coda_slurm(), "report", "--json", "--store", str(store), "--since", SINCE,
            "--until", UNTIL, *extra,
        ],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(proc.stdout)


def _coda_slurm() -> list[str]:
    import sys

    return [sys.executable, "-m", "slurm_plugin.cli.main"]


def test_slurm_conf_default_cpus_per_gpu_is_the_baseline(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(
        "DefCpuPerGPU=3\nPartitionName=DEFAULT DefCpuPerGPU=5\n"
        "PartitionName=gpu Nodes=gpu01 DefCpuPerGPU=4\nPartitionName=long Nodes=gpu01\n"
        "PartitionName=cpu Nodes=cpu01 DefCpuPerGPU=1\n"
    )
    (tmp_path / "coda.conf").write_text(
        f"ProfileStore={tmp_path / 'profiles'}\nJobSummaryDir={tmp_path / 'jobs'}\n"
    )
    (tmp_path / "profiles").mkdir()
    SummaryStore(tmp_path / "jobs").append(
        [summary(job_id=1, record=record(cpg=8)), summary(job_id=2, partition="long")], "gpu01"
    )
    doc = run_json(tmp_path / "jobs", "--conf", str(tmp_path / "coda.conf"), "--by", "partition")
    assert doc["baseline"]["partitions"] == {"cpu": 1, "gpu": 4, "long": 5}
    assert doc["baseline"]["def_cpu_per_gpu"] == 3
    rows = {r["name"]: r for r in doc["groups"]["partition"]}
    assert rows["gpu"]["cores_added"] == (8 - 4) * 2
    assert rows["long"]["cores_added"] == (8 - 5) * 2
    assert doc["profiles_changed"] == {"read": True, "why": None, "count": 0, "profiles": []}


HOSTILE = (
    "../../etc/passwd",
    "..",
    ".bashrc",
    "a/b",
    "a_b",
    "<script>alert(1)</script>",
    "ünïcødé 名前",
    "x" * 256,
)


def test_per_user_mails_stay_in_their_folder_under_hostile_names(tmp_path: Path) -> None:
    out = tmp_path / "mail"
    out.mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    (out / "a_b.txt").symlink_to(tmp_path / "outside.txt")  # planted: replaced, not followed
    SummaryStore(tmp_path / "jobs").append(
        [summary(job_id=i + 1, user=u, gpu_wait_s=3000.0) for i, u in enumerate(HOSTILE)],
        "gpu01",
    )
    subprocess.run(
        [*_coda_slurm(), "report", "--store", str(tmp_path / "jobs"), "--since", SINCE,
         "--until", UNTIL, "--per-user", str(out)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    files = sorted(out.iterdir())
    assert len(files) == len(HOSTILE)
    assert (tmp_path / "outside.txt").read_text() == "keep"
    assert sorted(tmp_path.iterdir()) == [tmp_path / "jobs", out, tmp_path / "outside.txt"]
    for user in HOSTILE:
        name = mail_file_name(user)
        assert "/" not in name and not name.startswith(".") and len(name) <= 80
        path = out / name
        assert path.is_file() and not path.is_symlink()
        text = path.read_text()
        assert f"User: {user}\n" in text
        words = " ".join(text.split())
        assert "had GPUs waiting on their CPUs" in words
        assert "coda gives a workload more cores per GPU as it learns it" in words
    assert (out / "a_b.txt").read_text().startswith("Your GPU jobs")


def test_json_schema_keys(tmp_path: Path) -> None:
    SummaryStore(tmp_path / "jobs").append([summary()], "gpu01")
    doc = run_json(tmp_path / "jobs")
    assert doc["schema_version"] == 1
    assert set(doc) >= {
        "schema_version", "generated_unix_s", "window", "by", "summaries", "totals", "groups",
        "daily", "baseline", "profiles_changed", "problems",
    }  # fmt: skip
    assert set(doc["groups"]) == {"user", "account", "partition"}
    row_keys = {
        "name", "jobs", "cpu_jobs", "gpu_hours", "gpu_hours_waiting", "waiting_share_pct",
        "idle_core_hours", "cores_added", "cores_returned", "core_hours_added",
        "core_hours_returned", "jobs_gpus_waited", "jobs_baseline_unknown", "jobs_from_profile",
        "jobs_from_prior", "jobs_from_default", "jobs_without_record",
    }  # fmt: skip
    assert set(doc["totals"]) == row_keys
    assert all(set(r) == row_keys for rows in doc["groups"].values() for r in rows)
    assert set(doc["window"]) == {"since_unix_s", "until_unix_s", "since", "until", "days"}
    assert set(doc["problems"]) == {"count", "first"}


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


NUMBER = re.compile(r"\d+(?:\.\d+)?%?")


def test_every_number_in_the_text_is_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SummaryStore(tmp_path / "jobs").append(
        [summary(job_id=i, user=f"u{i % 3}", gpu_wait_s=100.0 * i) for i in range(1, 9)]
        + [summary(job_id=99, gpus=0, kind="cpu", gpu_sampled_s=0.0, gpu_wait_s=0.0)],
        "gpu01",
    )
    text = run_cli(["report", "--store", str(tmp_path / "jobs"), "--since", SINCE, "--until",
                    UNTIL], capsys)  # fmt: skip
    doc = run_json(tmp_path / "jobs")
    allowed: set[str] = set()
    for leaf in _leaves(doc):
        if isinstance(leaf, str):
            allowed |= set(NUMBER.findall(leaf))
        elif isinstance(leaf, int | float) and not isinstance(leaf, bool):
            allowed |= {fmt(leaf), fmt_pct(leaf), f"{leaf:g}", str(leaf)}
    found = NUMBER.findall(text)
    assert len(found) > 60
    assert [n for n in found if n not in allowed] == []
    table = text.split("\n\nUSER", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in table] == [r["name"] for r in doc["groups"]["user"]]
    assert doc["totals"]["cpu_jobs"] == 1 and doc["totals"]["jobs"] == 8


def test_damaged_summaries_are_counted_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SummaryStore(tmp_path / "jobs")
    [path] = store.append([summary(job_id=1), summary(job_id=2)], "gpu01")
    good = path.read_bytes().splitlines(keepends=True)
    bad_json = (
        dataclasses.replace(summary(job_id=3)).to_json_line().replace(b'"gpus":2', b'"gpus":-1')
    )
    path.write_bytes(good[0] + b"{not json\n" + bad_json + good[1] + b'{"format": "cut')
    (path.parent / "evil name.jsonl").write_bytes(good[0])
    doc = run_json(tmp_path / "jobs")
    assert doc["totals"]["jobs"] == 2
    assert doc["problems"]["count"] == 4
    assert any("gpus is -1" in p for p in doc["problems"]["first"])
    text = run_cli(["report", "--store", str(tmp_path / "jobs"), "--since", SINCE, "--until",
                    UNTIL], capsys)  # fmt: skip
    assert "Skipped:   4 summaries or files" in text
    assert f"{day_of(T0)}/gpu01.jsonl:2: not JSON" in text


EVIL_USER = "<script>alert('u')</script>"
EVIL_ACCOUNT = '"><img src=x onerror=alert(1)>'


def test_the_page_escapes_what_users_control() -> None:
    doc = report([summary(user=EVIL_USER, account=EVIL_ACCOUNT, partition="<b>p</b>")])
    for by in ("user", "account", "partition"):
        page = render_html({**doc, "by": by})
        assert "<script" not in page and "<img" not in page and "<b>" not in page
        assert "&lt;script&gt;" in page or by != "user"
    page = render_html(doc)
    assert "&lt;script&gt;alert(&#x27;u&#x27;)&lt;/script&gt;" in page
    assert "default-src 'none'" in page  # nothing loads, nothing runs


class _Dom(HTMLParser):
    """The parts of the dumped DOM the test reads."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[str, list[dict[str, str | None]]] = {}
        self.cells: list[tuple[str, str, str]] = []  # (table, data-key, text)
        self.scripts = 0
        self._table = ""
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or ""
        elif tag == "rect" and "bar" in (a.get("class") or "").split():
            kind = (a.get("class") or "").split()[1]
            self.bars.setdefault(kind, []).append(a)
        elif tag == "td" and a.get("data-key"):
            self._cell = a["data-key"]
        elif tag == "script":
            self.scripts += 1

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self.cells.append((self._table, self._cell, data))
            self._cell = None


def _png_rows(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG: a blank page has one scanline repeated."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            bpp = {2: 3, 6: 4}[body[9]]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * bpp + 1
    return width, height, len({raw[i : i + stride] for i in range(0, len(raw), stride)})


def test_the_page_in_a_real_browser_shows_the_json_numbers(tmp_path: Path) -> None:
    chromium = require_browser()
    summaries = [
        summary(job_id=i, user=f"user{i % 18}" if i % 7 else EVIL_USER,
                start_unix_s=T0 - i * 20000, end_unix_s=T0 - i * 20000 + 3600 * (1 + i % 4),
                gpu_wait_s=60.0 * i, sampled_s=3600.0, gpu_sampled_s=3600.0)
        for i in range(1, 25)
    ]  # fmt: skip
    SummaryStore(tmp_path / "jobs").append(summaries, "gpu01")
    (tmp_path / "jobs" / day_of(T0) / "gpu02.jsonl").write_bytes(b"damaged\n")
    page = tmp_path / "report.html"
    doc = run_json(tmp_path / "jobs", "--html", str(page))
    dom_text = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    dom = _Dom()
    dom.feed(dom_text)
    rows = doc["groups"]["user"]
    assert len(rows) == 17 > PLOT_ROWS and dom.scripts == 0
    shown = rows[:PLOT_ROWS]
    for kind, key in (("gpu-hours", "gpu_hours"), ("gpu-hours-waiting", "gpu_hours_waiting")):
        assert [(b["data-name"], b["data-value"]) for b in dom.bars[kind]] == [
            (r["name"], fmt(r[key])) for r in shown
        ]
        assert all(float(b["width"] or 0) >= 0 for b in dom.bars[kind])
    assert [(b["data-day"], b["data-value"]) for b in dom.bars["day-waiting"]] == [
        (d["day"], fmt(d["gpu_hours_waiting"])) for d in doc["daily"]
    ]
    totals = {k: v for table, k, v in dom.cells if table == "totals"}
    for key, text in totals.items():
        value = doc["totals"][key]
        assert text == (fmt_pct(value) if key == "waiting_share_pct" else fmt(value)), key
    assert float(totals["gpu_hours"]) == doc["totals"]["gpu_hours"] > 0
    table = [(k, v) for t, k, v in dom.cells if t == "groups"]
    assert len(table) == 13 * len(rows)
    assert EVIL_USER in dom_text.replace("&lt;", "<").replace("&gt;", ">")
    assert doc["problems"]["count"] == 1 and 'data-count="1"' in dom_text
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,1400",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    width, height, distinct = _png_rows(shot)
    assert (width, height) == (1000, 1400) and distinct > 100
