"""Shared fixtures. The ``cluster`` fixture is a real Slurm (munge, slurmctld, slurmd)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_plugin.devtools.cluster import DevCluster

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


def slurm_missing_reason() -> str | None:
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)}); run scripts/setup"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (mknod, SlurmUser=root)"
    return None


def require_slurm() -> None:
    reason = slurm_missing_reason()
    if reason is None:
        return
    # CI sets CODA_REQUIRE_SLURM=1: there a missing Slurm is a failure, not a skip.
    if os.environ.get("CODA_REQUIRE_SLURM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def browser_missing_reason() -> str | None:
    if shutil.which("chromium") is None:
        return "chromium not installed; run scripts/setup"
    return None


def require_browser() -> str:
    """The headless browser's path; skips (fails where CODA_REQUIRE_BROWSER=1) without it."""
    reason = browser_missing_reason()
    if reason is not None:
        # scripts/test sets CODA_REQUIRE_BROWSER=1: there a missing chromium is a failure.
        if os.environ.get("CODA_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return shutil.which("chromium") or "chromium"


class LogWatch:
    """Follow a log file from the moment the watch was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def text(self) -> str:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.offset)
            return f.read()

    def wait_for(self, pattern: str, timeout_s: float = 15.0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            m = regex.search(self.text())
            if m:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{pattern!r} not in {self.path} within {timeout_s} s:\n" + self.text()[-3000:]
                )
            time.sleep(0.1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One real Slurm cluster for the whole session, with job_submit/coda loaded."""
    require_slurm()
    yield from started(DevCluster(tmp_path_factory.mktemp("slurm")))


def started(c: DevCluster) -> Iterator[DevCluster]:
    """Start ``c``, yield it, stop it (also when starting fails half way)."""
    try:
        c.up()
    except Exception:
        c.down()
        raise
    try:
        yield c
    finally:
        c.down()


CANCEL_WAIT_S = 120.0
"""How long a test waits for cancelled jobs to leave the queue. A job leaves only when every
node's slurmd has killed its steps and reported back. Slurm 24.11 kept a two-node job whose
``srun`` step was cancelled 30 ms after it launched for 30 s on the loaded 2-vCPU machine (the
step on the second node ended only at its "Caught SIGPIPE" 30 s later); most jobs leave in
under 3 s."""


def cancel_all(c: DevCluster, *, wait: bool = True, timeout_s: float = CANCEL_WAIT_S) -> None:
    """Cancel every job on ``c``, whoever submitted it, and, with ``wait``, wait until the
    queue is empty, so the next test starts on idle nodes. Fails with each job's state and
    reason when the queue does not empty in ``timeout_s``."""
    ids = c.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
    if ids:
        c.run(["scancel", *ids], check=False)
    if not wait:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = c.run(["squeue", "-h", "-o", "%A %T %r %N"], check=False).stdout.strip()
        if not left:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"jobs still in the queue {timeout_s:.0f} s after scancel:\n{left}"
            )
        time.sleep(0.2)


@pytest.fixture
def ctld_log(cluster: DevCluster) -> LogWatch:
    return LogWatch(cluster.ctld_log)


def gres(text: str) -> str:
    """``text`` (written as Slurm 22.05 spells TRES: ``gres:gpu:6``) as this host's Slurm
    spells it: ``gres/gpu:6`` from 23.11 on."""
    from slurm_plugin.cli.sbatchopts import local_gres_separator

    if local_gres_separator() == ":":
        return text
    return re.sub(r"(^|,)gres:", r"\1gres/", text)
