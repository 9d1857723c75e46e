"""Training progress files: coda-node creates and reads them, jobs write them (real files)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coda_node import progress_client
from coda_node.progress_client import Progress, track
from coda_node.system.paths import SystemRoot
from coda_node.system.progress import ProgressFiles, ProgressReading, parse_progress

NOBODY = 65534
CLIENT_DIR = Path(progress_client.__file__).resolve().parent

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def files(tmp_path: Path) -> ProgressFiles:
    return ProgressFiles(SystemRoot(tmp_path))


@pytest.fixture(autouse=True)
def no_slurm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "CODA_PROGRESS_FILE", "CODA_PROGRESS_DIR", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)


def write(path: Path, data: bytes) -> None:
    """Rewrite in place, keeping the owner (as a job's own write would)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@needs_root
def test_ensure_creates_a_root_owned_0755_directory_and_a_0644_file_owned_by_the_job(
    tmp_path: Path, files: ProgressFiles
) -> None:
    old_umask = os.umask(0o077)
    try:
        path = files.ensure(7, NOBODY, NOBODY)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "run/coda-node").st_mode) == 0o755
    assert path == tmp_path / "run/coda-node/progress/job_7" == files.path_for(7)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert (st.st_uid, st.st_gid, st.st_size) == (NOBODY, NOBODY, 0)
    d = os.stat(path.parent)
    assert stat.S_IMODE(d.st_mode) == 0o755 and d.st_uid == 0
    # Idempotent: an existing good file (with the job's data) is kept as is.
    write(path, b"12 train\n")
    assert files.ensure(7, NOBODY, NOBODY) == path
    assert path.read_bytes() == b"12 train\n"


@needs_root
def test_ensure_repairs_a_writable_directory(tmp_path: Path, files: ProgressFiles) -> None:
    files.directory.mkdir(parents=True)
    os.chmod(files.directory, 0o1777)
    assert files.ensure(1, NOBODY) is not None
    assert stat.S_IMODE(os.stat(files.directory).st_mode) == 0o755


def test_client_and_reader_round_trip_with_phase(files: ProgressFiles) -> None:
    path = files.ensure(11, os.getuid())
    assert path is not None
    p = Progress(path, min_interval_s=0)
    for _ in range(5):
        p.step()
    r = files.read(11)
    assert r is not None and (r.iterations, r.phase) == (5.0, None)
    assert abs(r.written_unix_s - time.time()) < 60
    p.set_phase("VAL")
    r = files.read(11)
    assert r is not None and (r.iterations, r.phase) == (5.0, "val")
    assert len(path.read_bytes()) == 64
    for _ in track(range(3), phase="train", progress=p):
        pass
    assert files.read(11) == ProgressReading(8.0, "train", os.stat(path).st_mtime)
    assert p.iterations == 8


def test_writes_are_throttled_to_min_interval(files: ProgressFiles) -> None:
    path = files.ensure(3, os.getuid())
    slow = Progress(path, min_interval_s=3600)
    slow.step()  # the first step is written at once
    for _ in range(99):
        slow.step()
    r = files.read(3)
    assert r is not None and r.iterations == 1
    slow.flush()
    r = files.read(3)
    assert r is not None and r.iterations == 100

    fast = Progress(path, min_interval_s=0.05)
    fast.step()
    fast.step()
    r = files.read(3)
    assert r is not None and r.iterations == 1
    time.sleep(0.06)
    fast.step()
    r = files.read(3)
    assert r is not None and r.iterations == 3


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"12",  # torn: no newline yet
        b"12 train",
        b"   \n",
        b"abc\n",
        b"-1\n",
        b"nan\n",
        b"inf\n",
        b"1e999\n",
        b"0x10\n",
        b"1_000\n",
        b"12 train extra\n",
        b"12 tr@in\n",
        b"12 " + b"a" * 17 + b"\n",
        b"\xff\xfe\n",
        b"\x00" * 64,
    ],
)
def test_garbage_torn_or_empty_content_reads_as_none(files: ProgressFiles, data: bytes) -> None:
    path = files.ensure(5, os.getuid())
    assert path is not None
    write(path, data)
    assert files.read(5) is None


@pytest.mark.parametrize(
    ("data", "iterations", "phase"),
    [
        (b"12\n", 12.0, None),
        (b"12.5 Checkpoint\n", 12.5, "checkpoint"),
        (b"1e3 val\n", 1000.0, "val"),
        (b"  7   train  \nlonger old tail\n", 7.0, "train"),
        (b"3 train\n" + b" " * 56, 3.0, "train"),
    ],
)
def test_valid_lines(data: bytes, iterations: float, phase: str | None) -> None:
    assert parse_progress(data, 1.0) == ProgressReading(iterations, phase, 1.0)


@needs_root
def test_a_planted_symlink_is_replaced_by_ensure_and_never_followed_by_read(
    tmp_path: Path, files: ProgressFiles
) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"99 train\n")
    os.chown(target, NOBODY, NOBODY)
    files.directory.mkdir(parents=True)
    job = files.path_for(9)
    job.symlink_to(target)

    assert files.ensure(9, NOBODY) == job
    assert not job.is_symlink() and job.read_bytes() == b""
    assert target.read_bytes() == b"99 train\n" and os.stat(target).st_uid == NOBODY

    job.unlink()
    job.symlink_to(target)  # as if swapped after ensure
    assert files.read(9) is None


@needs_root
def test_a_file_owned_by_another_uid_is_rejected(
    files: ProgressFiles, caplog: pytest.LogCaptureFixture
) -> None:
    path = files.ensure(4, NOBODY)
    assert path is not None
    write(path, b"10 train\n")
    assert files.read(4) is not None
    os.chown(path, 1234, 1234)
    with caplog.at_level(logging.WARNING, logger="coda-node"):
        assert files.read(4) is None
        assert files.read(4) is None
    assert len(caplog.records) == 1  # logged once per job
    # ensure puts a good (empty) file back for the job's owner.
    assert files.ensure(4, NOBODY) == path and os.stat(path).st_uid == NOBODY


def test_read_needs_ensure_in_this_process(tmp_path: Path, files: ProgressFiles) -> None:
    path = files.ensure(6, os.getuid())
    assert path is not None
    write(path, b"10 train\n")
    assert ProgressFiles(SystemRoot(tmp_path)).read(6) is None
    assert files.read(6) is not None
    assert files.read(12345) is None


def test_forget_removes_only_ended_jobs(files: ProgressFiles) -> None:
    for job in (1, 2, 3):
        assert files.ensure(job, os.getuid()) is not None
    (files.directory / "unrelated").write_text("x")
    assert files.forget({2}) == 2
    assert sorted(p.name for p in files.directory.iterdir()) == ["job_2", "unrelated"]
    assert files.read(1) is None
    assert files.forget([2]) == 0


def test_forget_without_a_directory(files: ProgressFiles) -> None:
    assert files.forget(()) == 0


def test_ensure_failure_is_logged_once_and_gives_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "run").write_text("not a directory")
    files = ProgressFiles(SystemRoot(tmp_path))
    with caplog.at_level(logging.WARNING, logger="coda-node"):
        assert files.ensure(1, os.getuid()) is None
        assert files.ensure(1, os.getuid()) is None
    assert len(caplog.records) == 1
    assert files.read(1) is None


def test_client_is_a_no_op_without_slurm_job_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODA_PROGRESS_DIR", str(tmp_path))
    p = Progress()
    assert not p.active
    for _ in track(range(4), progress=p):
        pass
    p.set_phase("val")
    p.flush()
    assert p.iterations == 4 and list(tmp_path.iterdir()) == []


def test_client_path_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODA_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    assert Progress().path == str(tmp_path / "job_4711")
    monkeypatch.setenv("CODA_PROGRESS_FILE", str(tmp_path / "explicit"))
    assert Progress().path == str(tmp_path / "explicit")
    monkeypatch.setenv("LOCAL_RANK", "3")  # only node-local rank 0 reports
    assert not Progress().active
    assert Progress(tmp_path / "given").path == str(tmp_path / "given")


def test_client_never_creates_the_file_and_tolerates_it_appearing_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_client, "RETRY_S", 0.1)
    path = tmp_path / "job_8"
    p = Progress(path, min_interval_s=0)
    p.step()
    p.set_phase("train")
    assert not path.exists()
    path.touch()
    p.step()  # still in the retry pause: not written
    assert path.read_bytes() == b""
    time.sleep(0.12)
    p.step()
    assert path.read_bytes().startswith(b"3 train\n") and path.stat().st_size == 64


def test_client_never_raises_on_unwritable_file(tmp_path: Path) -> None:
    d = tmp_path / "a_directory"
    d.mkdir()
    p = Progress(d, min_interval_s=0)
    p.step()
    p.set_phase("val")
    p.flush()
    assert p.iterations == 1


def test_bad_phase_name_fails_at_the_call() -> None:
    with pytest.raises(ValueError):
        track([], phase="fine tune")
    with pytest.raises(ValueError):
        Progress().set_phase("x" * 17)


def test_the_client_is_stdlib_only(tmp_path: Path) -> None:
    """-I -S: no site-packages, no coda package: only the one file and the stdlib."""
    out = tmp_path / "job_1"
    out.touch()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from progress_client import Progress, track; "
        "p = Progress(sys.argv[2], min_interval_s=0); "
        "[None for _ in track(range(5), progress=p)]; "
        "assert 'coda_node' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(CLIENT_DIR), str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert parse_progress(out.read_bytes(), 0.0) == ProgressReading(5.0, "train", 0.0)
