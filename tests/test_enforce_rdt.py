"""Memory-bandwidth limits through resctrl (Intel RDT MBA), on fixture trees.

The cgroup tree is Debian 12's Slurm 22.05 layout (tests/cgroup_fixtures.py); the resctrl
mount is a kernel-faithful fake (tests/resctrl_fixtures.py) that refuses what the kernel
refuses: CLOSIDs run out, exited tasks give ESRCH.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_node.cgroups import CgroupJob, discover_layout, list_jobs
from coda_node.enforce import Enforcer
from coda_node.policy import JobFacts, JobTarget, plan
from coda_node.state import JobChanges, Limit, NodeState
from tests import cgroup_fixtures, resctrl_fixtures

JOB_TIDS = {101: (1100, 1101, 1102, 1110, 1111, 1112), 202: (2200, 2201, 2202)}


class Node:
    def __init__(self, tmp: Path, variant: str = "full") -> None:
        self.cg = cgroup_fixtures.build_v1_debian(tmp)
        mounts = (tmp / "proc/self/mounts").read_text().splitlines()
        self.rdt = resctrl_fixtures.build(tmp, variant)
        resctrl_line = [
            x for x in (tmp / "proc/self/mounts").read_text().splitlines() if "resctrl" in x
        ]
        (tmp / "proc/self/mounts").write_text("\n".join(mounts + resctrl_line) + "\n")
        self.rdt.live_pids |= {t for tids in JOB_TIDS.values() for t in tids}
        self.state = NodeState()
        self.saved: list[dict[int, str | None]] = []
        self.enforcer = Enforcer(
            state=self.state,
            save=lambda: self.saved.append({j: c.rdt_group for j, c in self.state.changes.items()}),
            cpuset=None,
            quota=None,
            rdt=self.rdt.control(),
            root=self.cg.root,
            cgroup_version=1,
        )

    def jobs(self) -> dict[int, CgroupJob]:
        return list_jobs(discover_layout(self.cg.root))

    def tasks(self, group: str) -> set[int]:
        path = f"{group}/tasks" if group else "tasks"
        return {int(x) for x in self.rdt.text(path).split()}

    def new_writes(self, since: int) -> list[tuple[str, bytes]]:
        return self.rdt.writes[since:]


def test_a_limit_puts_the_jobs_threads_in_a_capped_group_and_release_undoes_it(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=55)})
    assert res[202].applied == ["memory bandwidth 50"]
    # 55 % rounds down to the 10 % step below: a job never gets more than it was given.
    assert ("coda_mb50/schemata", b"MB:0=50;1=50\n") in node.rdt.writes
    assert node.tasks("coda_mb50") == set(JOB_TIDS[202])
    assert node.state.changes[202].rdt_group == "coda_mb50"
    # Write-ahead: the group was on record before the first task moved.
    assert {202: "coda_mb50"} in node.saved
    before = len(node.rdt.writes)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=55)})
    assert res[202].applied == [] and node.new_writes(before) == []
    res = node.enforcer.reconcile(node.jobs(), {})
    assert res[202].applied == ["memory bandwidth released"]
    assert set(JOB_TIDS[202]) <= node.tasks("")
    assert not (node.rdt.path / "coda_mb50").exists()
    assert node.state.changes == {}


def test_jobs_capped_alike_share_one_group(tmp_path: Path) -> None:
    node = Node(tmp_path)
    targets = {101: JobTarget(mem_bw_pct=30), 202: JobTarget(mem_bw_pct=30)}
    node.enforcer.reconcile(node.jobs(), targets)
    assert node.enforcer.rdt is not None
    assert node.enforcer.rdt.list_coda_groups() == ["coda_mb30"]
    assert node.tasks("coda_mb30") == set(JOB_TIDS[101]) | set(JOB_TIDS[202])
    # Releasing one job keeps the group for the other.
    node.enforcer.reconcile(node.jobs(), {101: JobTarget(mem_bw_pct=30)})
    assert node.tasks("coda_mb30") == set(JOB_TIDS[101])


def test_a_thread_that_exited_is_not_an_error(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.rdt.exit_task(2201)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=20)})
    assert res[202].failed == []
    assert node.tasks("coda_mb20") == {2200, 2202}


def _fill_closids(node: Node, keep_free: int = 0) -> None:
    """Other software's groups take the CLOSIDs (MB has 8: the default group + 7)."""
    for i in range(7 - keep_free):
        node.rdt.mkdir(node.rdt.path / f"other{i}")


def test_out_of_closids_shares_a_stricter_group(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _fill_closids(node, keep_free=1)
    node.enforcer.reconcile(node.jobs(), {101: JobTarget(mem_bw_pct=30)})
    res = node.enforcer.reconcile(
        node.jobs(), {101: JobTarget(mem_bw_pct=30), 202: JobTarget(mem_bw_pct=50)}
    )
    assert res[202].failed == []
    assert node.state.changes[202].rdt_group == "coda_mb30"
    assert set(JOB_TIDS[202]) <= node.tasks("coda_mb30")


def test_out_of_closids_with_nothing_to_share_fails_that_job_only(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _fill_closids(node)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=50)})
    assert len(res[202].failed) == 1
    assert "no free CLOSID" in res[202].failed[0] and "Out of CLOSIDs" in res[202].failed[0]
    assert node.state.changes.get(202, JobChanges()).rdt_group is None
    assert node.enforcer.rdt is not None and node.enforcer.rdt.list_coda_groups() == []


def test_groups_left_by_a_crashed_daemon_are_removed(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.rdt.control().ensure_group("coda_mb20")  # made, never recorded: a crash in between
    node.enforcer.reconcile(node.jobs(), {})
    assert not (node.rdt.path / "coda_mb20").exists()


def test_a_job_that_ended_gives_its_group_back(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=40)})
    for tid in JOB_TIDS[202]:
        node.rdt.exit_task(tid)
    jobs = node.jobs()
    del jobs[202]
    res = node.enforcer.reconcile(jobs, {})
    assert res[202].gone and node.state.changes == {}
    assert not (node.rdt.path / "coda_mb40").exists()


def test_restore_all_releases_every_group(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.enforcer.reconcile(node.jobs(), {101: JobTarget(mem_bw_pct=10)})
    node.enforcer.restore_all(node.jobs())
    assert node.enforcer.rdt is not None and node.enforcer.rdt.list_coda_groups() == []
    assert set(JOB_TIDS[101]) <= node.tasks("")


@pytest.mark.parametrize(
    ("mba", "limit", "expect_pct", "problem"),
    [
        (None, Limit(mem_bw_pct=40), 40, None),
        ("resctrl not mounted", Limit(mem_bw_pct=40), None, "resctrl not mounted"),
        (None, Limit(mem_bw_pct=0), None, "more than 0"),
    ],
)
def test_plan_mem_bw(
    mba: str | None, limit: Limit, expect_pct: int | None, problem: str | None
) -> None:
    facts = {7: JobFacts(7, frozenset({0, 1}), is_dnn=False)}
    targets, problems = plan(facts, {7: limit}, mba=mba)
    assert (targets[7].mem_bw_pct if 7 in targets else None) == expect_pct
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0].message
