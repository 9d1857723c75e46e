"""A pytest plugin the guard loads into SchedMD's ATF (``-p coda_schedmd_cleanup``): after
each test file, cancel every job left in the cluster and wait until the queue is empty.

The ATF cancels its jobs at the end of a test file in auto-config mode only; in
local-config it leaves them, which a real cluster absorbs but the dev cluster's one node
does not (test_hetjob's job, which can never start there, holds the node for every later
file).  This does what auto-config's teardown does, the same in every configuration.
Runs on Debian's python3 inside the ATF's session: standard library only.
"""

from __future__ import annotations

import getpass
import subprocess
import time

import pytest

QUEUE_EMPTY_TIMEOUT_S = 60.0


def _queue() -> list[str]:
    proc = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30, check=False
    )
    return proc.stdout.split()


def cancel_all_jobs() -> None:
    user = getpass.getuser()
    subprocess.run(["scancel", "-u", user], capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + QUEUE_EMPTY_TIMEOUT_S
    while _queue() and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    # After the last test of a file its module fixtures are torn down too.
    if nextitem is None or nextitem.module is not item.module:
        cancel_all_jobs()
