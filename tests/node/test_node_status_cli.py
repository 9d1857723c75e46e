"""`coda-node status` as an admin runs it: against states recorded from the fixture daemon
and hand-written ones, in-process (click's CliRunner), as a subprocess, as a non-root user,
and on a terminal (a pty for the raw bytes, tmux for the screen a person sees).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from coda_node.cli import cli
from coda_node.enforce.state import (
    FORMAT,
    STATE_FILE,
    VIEW_FILE,
    VIEW_FORMAT,
    VIEW_FORMAT_VERSION,
    Limit,
)
from tests.node.node_fixtures import FakeNode, build_node

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCHEMA = json.loads((DOCS / "status.schema.json").read_text())
CODA_NODE = str(Path(sys.executable).with_name("coda-node"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Fixture jobs (build_node): 5001 a DNN job on 2 GPUs, 5002 a CPU job, 5003 a DNN job, ...
DNN, CPU, DNN2 = 5001, 5002, 5003


def _recorded(tmp_path: Path, **build: Any) -> FakeNode:
    """A fixture node whose daemon ticked twice: job 5001 kept on 4 of its cores and job
    5002 capped at 2.5 cores by admin limits, so the state has changes and events."""
    node = build_node(tmp_path, **build)
    daemon = node.daemon()
    daemon.tick()
    if DNN in node.jobs and CPU in node.jobs:
        node.set_limits(
            {
                DNN: Limit(cores=4, reason="admin: pinned for a test"),
                CPU: Limit(quota_cores=2.5, reason="admin: noisy ETL"),
            }
        )
    daemon.tick()
    return node


def _status(conf: Path, *args: str, columns: int = 200, **env: str) -> Result:
    return CliRunner().invoke(
        cli, ["status", "--conf", str(conf), *args], env={"COLUMNS": str(columns), **env}
    )


def _rows(text: str) -> dict[int, list[str]]:
    """Job rows of the screen (the lines under the JOBID header): job id -> its cells."""
    lines = ANSI.sub("", text).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("JOBID"))
    out = {}
    for line in lines[start + 1 :]:
        if not line.strip() or not line.split()[0].isdigit():
            break
        out[int(line.split()[0])] = line.split()
    return out


def _cell(text: str, job_id: int, column: str) -> str:
    """One cell of a job's row, by its header (columns left of PROGRESS, whose cells have
    no blanks)."""
    lines = ANSI.sub("", text).splitlines()
    header = next(line for line in lines if line.startswith("JOBID")).split()
    return _rows(text)[job_id][header.index(column)]


def _hand_written(
    tmp: Path,
    view: dict[str, Any] | None,
    *,
    age_s: float = 0.0,
    interval_s: float = 1.0,
    format_version: int = VIEW_FORMAT_VERSION,
    in_state_file: bool = False,
) -> Path:
    """coda.conf and a view file holding ``view``, written ``age_s`` ago; with
    ``in_state_file``, a state file holding it instead, as coda-node wrote it before the
    view had its own file."""
    state_dir, run_dir = tmp / "state", tmp / "run"
    state_dir.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    if view is not None:
        head = {"format_version": format_version, "written_unix_s": time.time() - age_s}
        if in_state_file:
            doc = {"format": FORMAT, **head, "changes": {}, "view": view}
            (state_dir / STATE_FILE).write_text(json.dumps(doc))
        else:
            doc = {"format": VIEW_FORMAT, **head, "view": view}
            (run_dir / VIEW_FILE).write_text(json.dumps(doc))
    conf = tmp / "coda.conf"
    conf.write_text(
        f"NodeStateDir={state_dir}\nNodeRuntimeDir={run_dir}\nNodeIntervalS={interval_s:g}\n"
    )
    return conf


def _minimal_view(**daemon: Any) -> dict[str, Any]:
    return {
        "daemon": {
            "running": True,
            "node_name": "gpu07",
            "version": "0.1.0",
            "pid": 42,
            "enforce": ["cpuset", "quota"],
            "profiling": "on",
            "contention": "on",
            "counters": {"ticks_total": 9, "tick_errors_total": 0, "events_total": {}},
            **daemon,
        },
        "node": {"cpus_online": 4, "gpus": [], "mem_bw": [], "capabilities": [], "errors": []},
        "jobs": [
            {
                "job_id": 77,
                "user": "erin",
                "kind": "cpu",
                "gpus": [],
                "cpus_allocated": "0-1",
                "cpus_now": "0-1",
                "cpu_rate_cores": 1.9,
                "mem_bw_bytes_per_s": None,
                "quota_cores": None,
                "limit": None,
                "target_reason": None,
                "hook_record": None,
                "last_failed": [],
                "progress": None,
                "profiling": None,
                "contention": None,
            }
        ],
        "events": [],
    }


# --------------------------------------------------------------------------------------------
# The screen, from the fixture daemon's state


def test_wide_screen_shows_the_node_every_job_and_why(tmp_path: Path) -> None:
    node = _recorded(tmp_path, jobs=6)
    result = _status(node.coda_conf, columns=200)
    assert result.exit_code == 0, result.output
    text = result.output
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 200
    head = lines[0]
    assert head.startswith("node gpu01 | coda-node 0.1.0 running (pid ")
    assert "every 5 s" in head and "64 cores, 8 GPUs, cgroup v1" in head
    assert "enforcing cpuset,quota,rdt" in head
    # Capabilities: what works and, for what does not, why (RDT rows grouped by reason).
    assert "active: cpuset control, CPU quota, Slurm job cgroups, GPUs (NVML)" in text
    assert (
        "unavailable: memory-bandwidth control, cache allocation, memory-bandwidth monitoring: "
        "resctrl not mounted" in text
    )
    # GPUs: NVML index 2 is /dev/nvidia0 (Slurm's GPU 0), held by job 5001; 30 % busy.
    gpu2 = next(line.split() for line in lines if line.split()[:2] == ["2", "A100-SXM4-80GB"])
    assert gpu2[2:4] == ["30%", "3/80GiB"] and gpu2[-1] == str(DNN)

    rows = _rows(text)
    assert sorted(rows) == sorted(node.jobs)
    # JOBID USER KIND GPUS ALLOC PRED NOW CPU PROGRESS...: allocated 17 cores for 2 GPUs,
    # the hook predicted 8 per GPU, the admin limit holds it on 4.
    assert rows[DNN][:7] == ["5001", "alice", "DNN", "0-1", "17", "16", "4"]
    assert "known" in rows[DNN]
    assert " ".join(rows[DNN]).endswith("cpuset: admin: pinned for a test")
    # The CPU job: 5 cores, no prediction, 2.5 cores' quota in force, marked limited.
    assert rows[CPU][:7] == ["5002", "bob", "CPU", "-", "5", "-", "2.5q"]
    assert "limit" in rows[CPU]
    assert rows[DNN2][:7] == ["5003", "carol", "DNN", "2", "16", "16", "16"]
    events = text.split("recent events:\n", 1)[1].splitlines()
    assert [e.split()[1:3] for e in events] == [["job", str(DNN)], ["job", str(CPU)]]
    assert events[1].endswith("cpu quota 2.5 cores: admin: noisy ETL")


@pytest.mark.parametrize("columns", [80, 60])
def test_narrow_terminals_drop_columns_instead_of_wrapping(tmp_path: Path, columns: int) -> None:
    node = _recorded(tmp_path, jobs=6)
    result = _status(node.coda_conf, columns=columns)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= columns
    header = next(line for line in lines if line.startswith("JOBID"))
    for kept in ("JOBID", "KIND", "ALLOC", "NOW", "PROFILE", "LAST DECISION"):
        assert kept in header, header
    for dropped in ("CPU ", "MEMBW"):
        assert dropped not in header
    # The last decision keeps a third of the width; user and GPUs make room for it.
    assert "GPUS" not in header and "USER" not in header
    assert ("PROGRESS" in header) == (columns == 80)
    rows = _rows(result.output)
    assert sorted(rows) == sorted(node.jobs)  # one line per job, nothing wrapped
    if columns == 80:
        assert rows[CPU][:5] == ["5002", "CPU", "5", "-", "2.5q"]
    else:
        assert rows[CPU][:4] == ["5002", "CPU", "5", "2.5q"]  # no room for PRED
    decision = next(line for line in lines if line.lstrip().startswith("5002 "))
    assert "quota: admin: noisy ETL" in decision


def test_a_node_without_gpus(tmp_path: Path) -> None:
    node = _recorded(tmp_path, gpus=0, jobs=4)
    result = _status(node.coda_conf)
    assert result.exit_code == 0, result.output
    assert "0 GPUs" in result.output.splitlines()[0]
    assert "unavailable: GPUs (NVML): NVML ready, driver 550.54.15, 0 GPUs" in result.output
    assert "GPUs: none (GPUs (NVML) unavailable, above)" in result.output
    rows = _rows(result.output)
    assert sorted(rows) == sorted(node.jobs)
    assert {r[2] for r in rows.values()} == {"CPU"} and {r[3] for r in rows.values()} == {"-"}


def test_64_jobs_each_on_one_line(tmp_path: Path) -> None:
    node = _recorded(tmp_path, cpus=128, jobs=64)
    for columns in (200, 80):
        result = _status(node.coda_conf, columns=columns)
        assert result.exit_code == 0, result.output
        assert list(_rows(result.output)) == sorted(node.jobs)
        assert len(node.jobs) == 64
        assert max(len(line) for line in result.output.splitlines()) <= columns


def test_json_is_the_same_facts_and_follows_the_documented_schema(tmp_path: Path) -> None:
    node = _recorded(tmp_path, jobs=6)
    result = _status(node.coda_conf, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema_version"] == 1 and doc["daemon"]["status"] == "running"
    assert doc["missing"] == [] and doc["problems"] == []
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert sorted(jobs) == sorted(node.jobs)
    dnn, cpu = jobs[DNN], jobs[CPU]
    assert (dnn["cores_allocated"], dnn["cores_predicted"], dnn["cores_now"]) == (17, 16, 4)
    assert dnn["gpus"] == [0, 1] and dnn["profile_state"] == "known" and dnn["kind"] == "dnn"
    assert dnn["last_decision"]["action"] == "cpuset"
    assert (cpu["cores_in_force"], cpu["quota_cores"], cpu["throttle_level"]) == (2.5, 2.5, 0)
    assert cpu["limit"]["reason"] == "admin: noisy ETL"
    assert doc["node"]["cores"] == 64 and len(doc["node"]["gpus"]) == 8
    assert doc["daemon"]["events_total"] == {"cpuset": 1, "quota": 1}
    assert doc["daemon"]["ticks_total"] == 2
    # The screen says the same.
    screen = _rows(_status(node.coda_conf).output)
    assert screen[DNN][4:7] == ["17", "16", "4"] and screen[CPU][6] == "2.5q"


def test_subprocess_prints_what_the_in_process_cli_prints(tmp_path: Path) -> None:
    node = _recorded(tmp_path, jobs=4)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR",)}
    proc = subprocess.run(
        [CODA_NODE, "status", "--conf", str(node.coda_conf)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout  # a pipe: no colour
    in_process = _status(node.coda_conf, columns=120).output
    strip = re.compile(r"last tick \d+ s ago|\(pid \d+\)")
    assert strip.sub("", proc.stdout) == strip.sub("", in_process)
    proc = subprocess.run(
        [CODA_NODE, "status", "--json", "--conf", str(node.coda_conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    jsonschema.validate(json.loads(proc.stdout), SCHEMA)


# --------------------------------------------------------------------------------------------
# A daemon that is down, stale, stopped or of another version


def test_no_view_file_says_the_daemon_is_not_running(tmp_path: Path) -> None:
    conf = _hand_written(tmp_path, None)
    path = tmp_path / "run" / VIEW_FILE
    result = _status(conf)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"coda-node: coda-node daemon is not running on this node (no view at {path})\n"
    )
    result = _status(conf, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["daemon"]["status"] == "absent" and doc["jobs"] == []


def test_a_stale_view_says_the_daemon_seems_stopped(tmp_path: Path) -> None:
    conf = _hand_written(tmp_path, _minimal_view(interval_s=5.0), age_s=100)
    path = tmp_path / "run" / VIEW_FILE
    result = _status(conf)
    assert result.exit_code == 1, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith(
        f"! view at {path} is 100 s old: the daemon seems stopped (last tick at "
    )
    assert first.endswith("; it ticks every 5 s)")
    assert _rows(result.stdout)[77][:3] == ["77", "erin", "CPU"]  # the last view still shown
    doc = json.loads(_status(conf, "--json").stdout)
    assert doc["daemon"]["status"] == "stale" and doc["state"]["stale_after_s"] == 15.0


def test_staleness_uses_the_interval_the_daemon_wrote(tmp_path: Path) -> None:
    # coda.conf says 1 s, but the daemon ticks every 60 s: 100 s is not stale yet.
    conf = _hand_written(tmp_path, _minimal_view(interval_s=60.0), age_s=100, interval_s=1)
    result = _status(conf)
    assert result.exit_code == 0, result.output
    assert "every 60 s" in result.stdout and "!" not in result.stdout
    # A view without the interval falls back to coda.conf's.
    conf = _hand_written(tmp_path / "old", _minimal_view(), age_s=10, interval_s=2)
    result = _status(conf)
    assert result.exit_code == 1 and "is 10 s old" in result.stdout


def test_a_daemon_that_stopped_cleanly(tmp_path: Path) -> None:
    conf = _hand_written(tmp_path, _minimal_view(running=False, interval_s=1.0))
    result = _status(conf)
    assert result.exit_code == 1
    assert "! the daemon stopped (it put every job back) at " in result.stdout
    assert "coda-node 0.1.0 stopped (pid 42)" in result.stdout


def test_a_state_from_another_version_is_shown_as_far_as_it_goes(tmp_path: Path) -> None:
    view = _minimal_view(interval_s=1.0)
    del view["jobs"][0]["cpus_now"], view["jobs"][0]["profiling"], view["node"]["cpus_online"]
    view["jobs"][0]["user"] = {"name": "erin"}  # a shape this version does not know
    conf = _hand_written(tmp_path, view, format_version=VIEW_FORMAT_VERSION + 1)
    result = _status(conf)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    out = result.stdout
    assert "! view format 2 (this coda-node reads 1): shown as far as it goes" in out
    assert (
        "! state from another coda-node version: no jobs[].cpus_now, "
        "jobs[].profiling, jobs[].user, node.cpus_online" in out
    )
    assert _rows(out)[77][:3] == ["77", "?", "CPU"]
    doc = json.loads(_status(conf, "--json").stdout)
    jsonschema.validate(doc, SCHEMA)
    assert "jobs[].cpus_now" in doc["missing"] and doc["jobs"][0]["cores_now"] is None


def test_a_file_that_is_not_a_view_file(tmp_path: Path) -> None:
    conf = _hand_written(tmp_path, None)
    (tmp_path / "run" / VIEW_FILE).write_text("{not json")
    result = _status(conf)
    assert result.exit_code == 1
    assert "is not a coda-node view file" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("where", ["view file", "state file"])
def test_a_file_with_bytes_that_are_not_utf8(tmp_path: Path, where: str) -> None:
    conf = _hand_written(tmp_path, None)
    if where == "view file":
        (tmp_path / "run" / VIEW_FILE).write_bytes(b'{"format": "\xff\xfe"}')
    else:  # no view file: status reads the state file of an older daemon
        (tmp_path / "state" / STATE_FILE).write_bytes(b"\xff\xfe{")
    result = _status(conf)
    assert result.exit_code == 1
    assert "is not a coda-node" in result.stderr and "Traceback" not in result.output


def test_the_view_in_the_state_file_of_a_daemon_not_yet_restarted_after_an_upgrade(
    tmp_path: Path,
) -> None:
    """An older coda-node kept its view in state.json. Until the daemon is restarted on
    the new version there is no view file, and status shows the old daemon's view from the
    state file; once a view file is there, it is what status reads."""
    conf = _hand_written(tmp_path, _minimal_view(interval_s=1.0), in_state_file=True)
    state = tmp_path / "state" / STATE_FILE
    result = _status(conf)
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout)[77][:3] == ["77", "erin", "CPU"]
    doc = json.loads(_status(conf, "--json").stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["daemon"]["status"] == "running" and doc["state"]["path"] == str(state)
    assert doc["problems"] == []
    # Stale in the state file is stale too.
    conf = _hand_written(tmp_path, _minimal_view(interval_s=1.0), age_s=60, in_state_file=True)
    assert f"! view at {state} is 60 s old" in _status(conf).stdout
    # The new daemon's first tick writes the view file: status reads it, not the old view.
    newer = _minimal_view(interval_s=1.0)
    newer["daemon"]["pid"] = 4242
    _hand_written(tmp_path, newer)
    doc = json.loads(_status(conf, "--json").stdout)
    assert doc["daemon"]["pid"] == 4242 and doc["state"]["path"] == str(
        tmp_path / "run" / VIEW_FILE
    )


# --------------------------------------------------------------------------------------------
# A non-root admin


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    """A directory user nobody can reach (pytest's tmp_path is root's, mode 0700)."""
    if os.geteuid() != 0:
        pytest.skip("switching to user nobody needs root")
    path = Path(tempfile.mkdtemp(prefix="coda-status-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_a_non_root_user_reads_a_readable_state_and_is_told_what_to_do_otherwise(
    world_readable_tmp: Path,
) -> None:
    conf = _hand_written(world_readable_tmp, _minimal_view(interval_s=1.0))
    state = world_readable_tmp / "run" / VIEW_FILE
    (world_readable_tmp / "run").chmod(0o755)
    state.chmod(0o644)

    def as_nobody() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CODA_NODE, "status", "--conf", str(conf)],
            capture_output=True,
            text=True,
            timeout=60,
            user="nobody",
            env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},
        )

    proc = as_nobody()
    assert proc.returncode == 0, proc.stderr
    assert _rows(proc.stdout)[77][:3] == ["77", "erin", "CPU"]
    state.chmod(0o600)
    proc = as_nobody()
    assert proc.returncode == 1
    assert proc.stderr == (
        f"coda-node: cannot read {state} (permission denied): run as root, or make the "
        "view file readable (chmod a+r)\n"
    )


# --------------------------------------------------------------------------------------------
# Options


def test_colour_follows_the_option_and_no_color(tmp_path: Path) -> None:
    node = _recorded(tmp_path, jobs=4)
    always = _status(node.coda_conf, "--color=always").output
    row = next(line for line in always.splitlines() if ANSI.sub("", line).startswith(" 5002"))
    assert row.startswith("\x1b[33m")  # the limited CPU job, yellow
    assert "\x1b[" not in _status(node.coda_conf, "--color=never").output
    assert "\x1b[" not in _status(node.coda_conf).output  # auto, and not a terminal


@pytest.mark.parametrize(
    "args",
    [
        ["--color=rainbow"],
        ["--json", "--watch"],
        ["--watch", "0"],
        ["--watch", "nan"],
        ["--watch", "inf"],
        ["--watch", "1e10"],
        ["--bogus"],
    ],
    ids=[
        "bad-colour",
        "json-and-watch",
        "watch-0",
        "watch-nan",
        "watch-inf",
        "watch-longer-than-an-hour",
        "unknown-option",
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    conf = _hand_written(tmp_path, _minimal_view(interval_s=1.0))
    proc = subprocess.run(
        [CODA_NODE, "status", "--conf", str(conf), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Usage:" in proc.stderr and "Traceback" not in proc.stderr


def test_watch_on_a_pipe_prints_frames_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    conf = _hand_written(tmp_path, _minimal_view(interval_s=60.0))
    proc = subprocess.Popen(
        [CODA_NODE, "status", "--conf", str(conf), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    frames = out.split("\n\nevery 0.2 s: coda-node status")
    assert len(frames) >= 3, out
    assert all(" 77 erin " in f for f in frames)
    assert "\x1b[" not in out and err == ""


# --------------------------------------------------------------------------------------------
# On a terminal


def _pty_session(argv: list[str], env: dict[str, str], columns: int, lines: int) -> tuple[int, int]:
    """``argv`` on a new pseudo-terminal of that size: (pid, master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: size its terminal, then become coda-node
        try:
            import fcntl
            import termios

            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    return pid, fd


def _read_until(fd: int, pred: Callable[[bytes], bool], timeout_s: float) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not pred(out):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    return out


def _terminal_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color"}


def test_on_a_terminal_watch_redraws_in_place_with_colour_and_ctrl_c_restores_the_cursor(
    tmp_path: Path,
) -> None:
    node = _recorded(tmp_path, jobs=6)
    pid, fd = _pty_session(
        [CODA_NODE, "status", "--conf", str(node.coda_conf), "--watch", "0.2"],
        _terminal_env(),
        columns=90,
        lines=60,
    )
    try:
        out = _read_until(fd, lambda b: b.count(b"\x1b[H\x1b[2J") >= 3, 20)
        assert out.startswith(b"\x1b[?25l")  # cursor hidden while drawing
        frames = out.split(b"\x1b[H\x1b[2J")[1:]
        assert len(frames) >= 3
        screen = frames[1].decode()
        assert screen.startswith("every 0.2 s: coda-node status")
        # The terminal's own width (TIOCGWINSZ), and colour because it is a terminal.
        assert max(len(ANSI.sub("", line)) for line in screen.splitlines()) <= 90
        assert "\x1b[33m" in screen  # the limited jobs
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline
        rest = _read_until(fd, lambda b: b"\x1b[?25h" in b, 10)
        assert rest.endswith(b"\x1b[?25h") or b"\x1b[?25h" in rest
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_no_color_on_a_terminal(tmp_path: Path) -> None:
    node = _recorded(tmp_path, jobs=4)
    pid, fd = _pty_session(
        [CODA_NODE, "status", "--conf", str(node.coda_conf)],
        {**_terminal_env(), "NO_COLOR": "1"},
        columns=100,
        lines=50,
    )
    try:
        out = _read_until(fd, lambda b: b"recent events:" in b and b.endswith(b"\n"), 20)
        out += _read_until(fd, lambda b: False, 1)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"\x1b[" not in out and b" 5002 bob " in out


def _tmux(sock: Path, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=True, timeout=20
    ).stdout


def test_what_a_person_sees_in_tmux_while_watching(tmp_path: Path) -> None:
    """tmux renders the escape codes into a screen; capture-pane returns what is on it."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux not installed")
    node = _recorded(tmp_path, jobs=6)
    sock = tmp_path / "tmux.sock"
    rc_file = tmp_path / "rc"
    # bash runs it and records how it ended: it goes on after a child that handled Ctrl-C
    # and dies with one that did not (tmux 3.3a's own #{pane_dead_status} is unreliable).
    cmd = f"bash -c '{CODA_NODE} status --conf {node.coda_conf} --watch 0.3; echo $? > {rc_file}'"
    subprocess.run(
        [
            *("tmux", "-S", str(sock), "-f", "/dev/null", "new-session", "-d", "-s", "coda"),
            *("-x", "100", "-y", "45", cmd),
        ],
        check=True,
        env=_terminal_env(),
        timeout=20,
    )
    try:

        def screen() -> list[str]:
            return _tmux(sock, "capture-pane", "-p", "-t", "coda").splitlines()

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("recent events:" in s for s in screen()):
            time.sleep(0.2)
        seen = screen()
        # Redrawn in place: one title, at the top, however many frames were drawn.
        assert seen[0].startswith("every 0.3 s: coda-node status")
        assert sum("coda-node status" in line for line in seen) == 1
        assert seen[2].startswith("node gpu01 | coda-node 0.1.0 running")
        assert sorted(_rows("\n".join(seen))) == sorted(node.jobs)
        assert max(len(line) for line in seen) <= 100
        # The daemon ticks again (job 5002 released): the next frame shows it, in place.
        node.set_limits({DNN: Limit(cores=4, reason="admin: pinned for a test")})
        daemon = node.daemon()
        daemon.tick()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any("cpu quota released" in s for s in screen()):
            time.sleep(0.2)
        seen = screen()
        assert any("job 5002  cpu quota released" in line for line in seen), seen
        assert _cell("\n".join(seen), CPU, "NOW") == "5"
        _tmux(sock, "send-keys", "-t", "coda", "C-c")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (rc_file.exists() and rc_file.read_text()):
            time.sleep(0.1)
        assert rc_file.read_text() == "0\n"  # Ctrl-C ended it cleanly, exit status 0
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], check=False, timeout=20)
