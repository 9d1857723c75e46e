"""`coda-node status` rendering of hand-written daemon views: the adaptive loop's per-job
state (progress, profiling, throttles), views from older daemons, and the width rules."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from coda_node.status.document import build_status, event_action
from coda_node.status.text import bytes_rate, fit, render

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _view(jobs: list[dict], events: list[dict] | None = None) -> dict:
    return {
        "daemon": {
            "running": True,
            "node_name": "gpu01",
            "version": "0.1.0",
            "pid": 1,
            "interval_s": 1.0,
            "enforce": ["cpuset", "quota"],
            "profiling": "on",
            "contention": "NodeEnforce includes neither quota nor a usable rdt",
            "counters": {"ticks_total": 3, "tick_errors_total": 0, "events_total": {}},
        },
        "node": {"cpus_online": 8, "gpus": [], "mem_bw": [], "capabilities": [], "errors": []},
        "jobs": jobs,
        "events": events
        if events is not None
        else [
            {
                "unix_s": time.time(),
                "job_id": 7,
                "what": "throttle",
                "reason": "CPU capped at 1 of 2 cores",
            }
        ],
    }


def _job(job_id: int, **extra: object) -> dict:
    base: dict[str, Any] = {
        "job_id": job_id,
        "user": "alice",
        "kind": "dnn",
        "gpus": [{"slurm_index": 0, "nvml_index": 0, "util_pct": 50.0}],
        "cpus_allocated": "0-3",
        "cpus_now": "0",
        "cpu_rate_cores": 0.5,
        "mem_bw_bytes_per_s": None,
        "quota_cores": None,
        "limit": None,
        "target_reason": "probe: 1 cores",
        "hook_record": {"cpg": "2", "gpn": "1", "sig": "workload:1001:x", "src": "none"},
        "progress": None,
        "profiling": None,
        "contention": None,
        "last_failed": [],
    }
    base.update(extra)
    return base


def _doc(view: dict, **kw: Any) -> dict:
    args: dict[str, Any] = {
        "state_path": "/var/lib/coda-node/state.json",
        "written_unix_s": time.time(),
        "format_version": 1,
        "now_unix_s": time.time(),
        "interval_s": 1.0,
    }
    args.update(kw)
    return build_status(view, **args)


def _row(text: str, job_id: int) -> str:
    return next(line for line in text.splitlines() if line.lstrip().startswith(f"{job_id} "))


def test_progress_profile_and_throttle_columns_say_what_the_loop_is_doing() -> None:
    text = render(
        _doc(
            _view(
                [
                    _job(
                        5,
                        progress={"phase": "train", "rate": 97.4, "source": "iterations"},
                        profiling={"state": "probing", "cores_now": 1, "probes": 1},
                        profile_state="probing",
                    ),
                    _job(
                        6,
                        cpus_now="0-3",
                        progress={"phase": "val", "rate": 12.0, "source": "gpu_util"},
                        profiling={"state": "done", "sweet_spot_cores": 3, "probes": 4},
                        profile_state="confident",
                        target_reason=None,
                    ),
                    _job(
                        7,
                        kind="cpu",
                        gpus=[],
                        hook_record=None,
                        cpus_allocated="4-5",
                        cpus_now="4-5",
                        quota_cores=1.0,
                        contention={"mechanism": "quota", "level": 2, "quota_cores": 1.0},
                    ),
                ]
            )
        ),
        width=200,
    )
    assert "profiling: on | contention: NodeEnforce includes neither quota" in text
    row5 = _row(text, 5).split()
    assert row5[:8] == ["5", "alice", "DNN", "0", "4", "2", "1", "0.5"]
    assert "97.4/s train" in _row(text, 5) and "probing 1c" in _row(text, 5)
    assert "probe: probe: 1 cores" not in _row(text, 5)
    assert "target: probe: 1 cores" in _row(text, 5)  # the standing reason, no event yet
    row6 = _row(text, 6)
    assert "12% val" in row6 and "confident 3c" in row6
    row7 = _row(text, 7)
    # 2 cores allocated, no prediction (CPU job), quota 1 core in force, throttle level 2.
    assert row7.split()[:7] == ["7", "alice", "CPU", "-", "2", "-", "1q"]
    assert "2 quota" in row7 and "throttle: CPU capped at 1 of 2 cores" in row7


def test_a_state_view_from_before_the_loop_renders_and_names_what_is_missing() -> None:
    old = _job(5)
    for key in ("progress", "profiling", "contention"):
        del old[key]
    view = _view([old])
    del view["daemon"]["profiling"], view["daemon"]["contention"], view["daemon"]["counters"]
    doc = _doc(view)
    text = render(doc, width=200)
    assert doc["missing"] == [
        "daemon.contention",
        "daemon.counters",
        "daemon.profiling",
        "jobs[].contention",
        "jobs[].profiling",
        "jobs[].progress",
    ]
    assert "profiling: ? | contention: ?" in text
    assert "state from another coda-node version: no daemon.contention" in text
    assert _row(text, 5).split()[:3] == ["5", "alice", "DNN"]


def test_fields_of_the_wrong_type_are_reported_not_raised() -> None:
    """A view from some other version: numbers where strings were, a job without an id."""
    bad = _job(5, cpus_now=7, gpus="0", user=["x"], quota_cores="half")
    view = _view([bad, {"user": "no id"}], events=[{"job_id": 5}, "junk"])
    view["node"] = {"cpus_online": "eight", "gpus": [{"no": "index"}], "capabilities": 3}
    doc = _doc(view, format_version=2)
    text = render(doc, width=120)
    assert [j["job_id"] for j in doc["jobs"]] == [5]
    assert {"jobs[].cpus_now", "jobs[].gpus", "jobs[].user", "node.cpus_online"} <= set(
        doc["missing"]
    )
    assert "view format 2 (this coda-node reads 1): shown as far as it goes" in text
    assert _row(text, 5).split()[:3] == ["5", "?", "DNN"]


@pytest.mark.parametrize("width", [200, 100, 80, 60, 40])
def test_no_line_is_wider_than_the_terminal_and_every_job_keeps_one_row(width: int) -> None:
    jobs = [
        _job(
            1000 + i,
            user="a-very-long-user-name",
            target_reason="memory bandwidth capped at MB 70%: a long reason " * 3,
        )
        for i in range(12)
    ]
    text = render(_doc(_view(jobs)), width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    header = next(line for line in lines if line.lstrip().startswith("JOBID"))
    # The job table runs from its header to the next blank line (events below it start
    # with a time of day, which at 10 o'clock also starts with "10").
    table = lines[lines.index(header) + 1 :]
    rows = table[: table.index("")] if "" in table else table
    assert [int(r.split()[0]) for r in rows] == [1000 + i for i in range(12)]
    # The columns an admin needs first survive at every width.
    for col in ("JOBID", "KIND", "ALLOC", "NOW"):
        assert col in header or width < 60, (col, header)
    if width <= 80:
        assert "CPU " not in header and "MEMBW" not in header
    if width >= 200:
        for col in ("USER", "GPUS", "PRED", "CPU", "PROGRESS", "MEMBW", "THR", "PROFILE"):
            assert col in header


def test_colour_marks_throttled_probing_and_failed_rows_only_when_asked() -> None:
    jobs = [
        _job(1, profile_state="probing", profiling={"state": "probing", "cores_now": 2}),
        _job(2, kind="cpu", gpus=[], contention={"level": 1, "mechanism": "mba"}),
        _job(3, last_failed=["cpuset: /sys/fs/cgroup/...: Permission denied"]),
        _job(4, target_reason=None),
    ]
    doc = _doc(_view(jobs))
    plain = render(doc, width=160, color=False)
    assert "\x1b[" not in plain
    coloured = render(doc, width=160, color=True)
    rows = {ANSI.sub("", line).split()[0]: line for line in coloured.splitlines() if line.strip()}
    assert rows["1"].startswith("\x1b[36m")  # probing: cyan
    assert rows["2"].startswith("\x1b[33m")  # throttled: yellow
    assert rows["3"].startswith("\x1b[31m") and "failed: cpuset" in rows["3"]  # red
    assert "\x1b[" not in rows["4"]


def test_watch_screens_keep_failed_throttled_and_probing_jobs_when_rows_run_out() -> None:
    jobs = [_job(100 + i, target_reason=None) for i in range(40)]
    jobs[30] = _job(130, kind="cpu", gpus=[], contention={"level": 3, "mechanism": "quota"})
    doc = _doc(_view(jobs))
    text = render(doc, width=120, max_job_rows=5)
    rows = [line.split()[0] for line in text.splitlines() if line[:6].strip().isdigit()]
    assert "130" in rows and len(rows) == 5
    assert rows == sorted(rows)  # shown in job-id order
    assert "... and 35 more jobs" in text


def test_helpers() -> None:
    assert fit("abcdefgh", 5) == "ab..." and fit("abc", 5) == "abc" and fit("abc", 2) == "ab"
    assert bytes_rate(None) == "-" and bytes_rate(12.3e9) == "12.3GB/s"
    assert bytes_rate(512_000) == "512kB/s" and bytes_rate(3) == "3B/s"
    assert [
        event_action(w)
        for w in (
            "cpuset 0-3",
            "cpuset restored to 0-7",
            "cpu quota 2.5 cores",
            "cpu quota released",
            "memory bandwidth 70",
            "memory bandwidth released",
            "failed: cpuset: EBUSY",
            "throttle",
            "probe-done",
            "something else entirely",
        )
    ] == [
        "cpuset",
        "cpuset-restore",
        "quota",
        "quota-release",
        "mem-bw",
        "mem-bw-release",
        "failed",
        "throttle",
        "probe-done",
        "other",
    ]


@pytest.mark.parametrize(
    ("contention", "cell"),
    [
        ({"level": 3, "mechanism": "mba", "mem_bw_pct": 30}, "3 mba"),
        ({"level": 5, "mechanism": "mba+quota", "mem_bw_pct": 10, "quota_cores": 4.0}, "5 mba+q"),
        ({"level": 2, "mechanism": "l3", "l3_ways": 5, "l3_ways_total": 20}, "2 l3 L3 5/20 ways"),
        (
            {"level": 11, "mechanism": "mba+l3+quota", "l3_ways": 2, "l3_ways_total": 20},
            "11 mba+l3+q L3 2/20 ways",
        ),
        ({"level": 1, "mechanism": "l3", "l3_ways": 10}, "1 l3 L3 10/? ways"),  # an older view
    ],
)
def test_throttle_column_shows_the_mechanism_and_the_l3_ways(
    contention: dict[str, object], cell: str
) -> None:
    doc = _doc(_view([_job(9, kind="cpu", gpus=[], contention=contention)]))
    lines = render(doc, width=200).splitlines()
    header = next(line for line in lines if line.startswith("JOBID") or " JOBID " in line)
    row = next(line for line in lines if line.split()[:1] == ["9"])
    start = header.index("THR")
    assert row[start:].startswith(cell + " ")
    assert event_action("L3 cache 5 of 20 ways") == "l3"
    assert event_action("L3 cache ways released") == "l3-release"


HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\nsecond line\rX\u202etxt\x00\t"


@pytest.mark.parametrize("color", [False, True])
def test_control_characters_in_any_text_never_reach_the_terminal(color: bool) -> None:
    """A limit's reason (``coda-node limit --reason``), a user name, a node name: what the
    screen shows of them has no escape sequence, bell, line break or bidi override, and
    each job keeps its one row."""
    jobs = [
        _job(5, user="mal\x1b[31mlory", target_reason=HOSTILE),
        _job(6, last_failed=[f"cpuset: {HOSTILE}"]),
        _job(7),
    ]
    view = _view(
        jobs, [{"unix_s": time.time(), "job_id": 5, "what": "throttle", "reason": HOSTILE}]
    )
    view["daemon"]["node_name"] = "gpu\x1b[2J01"
    view["node"]["errors"] = [f"probe: {HOSTILE}"]
    text = render(_doc(view), width=200, color=color)
    shown = ANSI.sub("", text) if color else text
    assert not [c for c in shown if not c.isprintable() and c != "\n"]
    assert [line.split()[0] for line in shown.splitlines() if re.match(r"\s*[567] ", line)] == [
        "5",
        "6",
        "7",
    ]
    assert "evil?[2J?]0;pwned??second line?X?txt??" in _row(shown, 5)


@pytest.mark.parametrize("written_unix_s", [time.time(), 1e300, -1e300])
def test_a_damaged_view_renders_with_what_it_holds(written_unix_s: float) -> None:
    """A view whose job's GPUs are ``true`` and whose times are beyond any calendar (a
    damaged file, a hand edit): ``coda-node status`` shows the rest instead of a
    traceback."""
    view = _view(
        [_job(5, gpus=True), _job(6)],
        events=[{"unix_s": 1e300, "job_id": 5, "what": "throttle", "reason": "r"}],
    )
    view["daemon"]["running"] = False
    text = render(_doc(view, written_unix_s=written_unix_s), width=120)
    assert _row(text, 6).split()[:3] == ["6", "alice", "DNN"]
    assert "??  job 5  throttle: r" in text
