"""No tick does all the periodic work at once (the < 5 ms tick target holds at p99 too).

A settled limited job costs no cgroup reads on most ticks; at least once every
VERIFY_EVERY_TICKS ticks the enforcer reads its cgroup files in full (its whole cpuset
tree, its quota files), and the sampler reads its directories afresh instead of serving
what it kept. Both are per job, each job on its own tick of the period, so that a node with
many limited jobs spreads that work over the period instead of doing it for all of them on
one tick (which would make every 10th tick the slow one). These tests count what the code really
reads, through a wrapper of the one function cgroup files are read with.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_node.daemon.service import Daemon
from coda_node.enforce.enforcer import VERIFY_EVERY_TICKS
from coda_node.enforce.state import Limit
from coda_node.system import cgroups
from tests.node.node_fixtures import FakeNode, build_node


class _Reads:
    """Every path ``cgroups._read_file`` is asked for, from the tick that ``clear``s on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        inner = cgroups._read_file

        def read(path: str | os.PathLike[str]) -> str:
            self.paths.append(os.fspath(path))
            return inner(path)

        monkeypatch.setattr(cgroups, "_read_file", read)

    def clear(self) -> None:
        self.paths = []


def _limits(node: FakeNode, ids: list[int]) -> dict[int, Limit]:
    """A cpuset limit on each GPU job of ``ids``, a CPU quota on each CPU job."""
    return {
        j: Limit(cores=2) if node.jobs[j].kind == "dnn" else Limit(quota_cores=0.5) for j in ids
    }


def _full_check_reads(node: FakeNode, job_id: int) -> str:
    """A file only the enforcer's full check reads: a task directory's cpuset (below what
    the sampler reads) for a cpuset limit; the quota file in coda's cpu cgroup for a quota."""
    if node.jobs[job_id].kind == "dnn":
        path = node.job_dir(job_id) / "step_0/task_0/cpuset.cpus"
    else:
        path = node.quota_file(job_id)
    assert path.is_file(), path
    return os.fspath(path)


def _fresh_read_reads(node: FakeNode, job_id: int) -> str:
    """A file the sampler reads only when it reads the job afresh: the job's mems, kept
    while its directory stays."""
    path = node.job_dir(job_id) / "cpuset.mems"
    assert path.is_file(), path
    return os.fspath(path)


def _steady_ticks(daemon: Daemon, node: FakeNode, reads: _Reads) -> Iterator[list[str]]:
    """VERIFY_EVERY_TICKS ticks that write nothing; each tick's reads."""
    for _ in range(VERIFY_EVERY_TICKS):
        writes = len(node.journal)
        reads.clear()
        report = daemon.tick()
        assert len(node.journal) == writes, "a steady tick wrote"
        assert not any(r.applied or r.failed for r in report.results.values())
        yield reads.paths


# Job ids alike modulo the period (5001, 5011, ...): spreading by job id alone would put
# them all on one tick. And the benchmark's 16 (tests/../bench/bench_node_tick.py).
ALIKE = [5001, 5011, 5021, 5031, 5002, 5012, 5022, 5032]
BENCH = list(range(5001, 5017))


@pytest.mark.parametrize("ids", [ALIKE, BENCH], ids=["ids-alike-mod-period", "bench-16"])
def test_each_settled_job_is_checked_and_read_afresh_once_a_period_never_all_on_one_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ids: list[int]
) -> None:
    node = build_node(tmp_path)
    limits = _limits(node, ids)
    assert {node.jobs[j].kind for j in ids} == {"dnn", "cpu"}
    node.set_limits(limits)
    daemon = node.daemon()
    for _ in range(2 * VERIFY_EVERY_TICKS):  # applied, then settled for a whole period
        daemon.tick()
    reads = _Reads(monkeypatch)
    checks = {j: 0 for j in ids}
    fresh = {j: 0 for j in ids}
    most = math.ceil(len(ids) / VERIFY_EVERY_TICKS) + 1
    for tick, paths in enumerate(_steady_ticks(daemon, node, reads)):
        read = set(paths)
        checked = [j for j in ids if _full_check_reads(node, j) in read]
        afresh = [j for j in ids if _fresh_read_reads(node, j) in read]
        assert len(checked) <= most, f"tick {tick} checked {checked} in full"
        assert len(afresh) <= most, f"tick {tick} read {afresh} afresh"
        for j in checked:
            checks[j] += 1
        for j in afresh:
            fresh[j] += 1
    assert checks == dict.fromkeys(ids, 1), "each job checked in full once a period"
    assert fresh == dict.fromkeys(ids, 1), "each job read afresh once a period"


def test_the_period_holds_for_jobs_limited_on_different_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Limits come and go one by one: a job limited later, or one settled again after a
    # release and a new limit, is still checked once a period, and the load stays even.
    node = build_node(tmp_path)
    ids = BENCH
    daemon = node.daemon()
    for k in range(len(ids)):
        node.set_limits(_limits(node, ids[: k + 1]))
        daemon.tick()
    node.set_limits(_limits(node, ids[2:]))  # two released ...
    for _ in range(3):
        daemon.tick()
    node.set_limits(_limits(node, ids))  # ... and limited again
    for _ in range(2 * VERIFY_EVERY_TICKS):
        daemon.tick()
    reads = _Reads(monkeypatch)
    checks = dict.fromkeys(ids, 0)
    most = math.ceil(len(ids) / VERIFY_EVERY_TICKS) + 1
    for paths in _steady_ticks(daemon, node, reads):
        checked = [j for j in ids if _full_check_reads(node, j) in set(paths)]
        assert len(checked) <= most, checked
        for j in checked:
            checks[j] += 1
    assert checks == dict.fromkeys(ids, 1)


def test_a_cached_listing_reads_each_job_afresh_once_a_period_spread_over_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # list_jobs on its own (the sampler's call): every job's directories through one
    # SubdirCache; a step's cpuset rewritten in place shows within refresh_every passes.
    node = build_node(tmp_path)
    layout = node.daemon(start=False).layout
    cache = cgroups.SubdirCache(refresh_every=VERIFY_EVERY_TICKS)
    for _ in range(VERIFY_EVERY_TICKS):
        cgroups.list_jobs(layout, detail=lambda _j: "steps", cache=cache)
    batch = node.job_dir(5001) / "step_batch/cpuset.cpus"
    batch.write_text("1\n")
    reads = _Reads(monkeypatch)
    fresh = dict.fromkeys(node.jobs, 0)
    seen_at: int | None = None
    for n in range(VERIFY_EVERY_TICKS):
        reads.clear()
        jobs = cgroups.list_jobs(layout, detail=lambda _j: "steps", cache=cache)
        afresh = [j for j in node.jobs if _fresh_read_reads(node, j) in set(reads.paths)]
        assert len(afresh) <= math.ceil(len(node.jobs) / VERIFY_EVERY_TICKS), afresh
        for j in afresh:
            fresh[j] += 1
        steps = {s.name: s.cpus for s in jobs[5001].steps}
        if steps["batch"] == frozenset({1}) and seen_at is None:
            seen_at = n
    assert fresh == dict.fromkeys(node.jobs, 1)
    assert seen_at is not None, f"the rewritten step cpuset not seen in {VERIFY_EVERY_TICKS}"


@pytest.mark.parametrize("version", [1, 2])
def test_job_tasks_are_the_tasks_read_job_reads_and_none_once_the_job_ended(
    tmp_path: Path, version: int
) -> None:
    # The bandwidth monitor re-reads a job's threads with job_tasks (tasks files only)
    # where it read the whole tree before: it must get the same tasks, a new step's too.
    node = build_node(tmp_path, version=version)  # type: ignore[arg-type]
    layout = node.daemon(start=False).layout
    listed = cgroups.list_jobs(layout, detail=lambda _j: "cpus")
    tid = node.start_step(5002, "1")
    for cg in listed.values():
        full = cgroups.read_job(layout, cg)
        assert full is not None
        assert cgroups.job_tasks(layout, cg) == full.pids
    assert tid in (cgroups.job_tasks(layout, listed[5002]) or ())
    node.remove_job(5004)
    assert cgroups.job_tasks(layout, listed[5004]) is None
