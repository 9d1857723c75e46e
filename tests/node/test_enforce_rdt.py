"""Memory-bandwidth limits through resctrl (Intel RDT MBA), on fixture trees.

The cgroup tree is Debian 12's Slurm 22.05 layout (tests/node/cgroup_fixtures.py); the resctrl
mount is a kernel-faithful fake (tests/node/resctrl_fixtures.py) that refuses what the kernel
refuses: CLOSIDs run out, exited tasks give ESRCH.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_node.enforce.enforcer import Enforcer
from coda_node.enforce.state import JobChanges, Limit, NodeState
from coda_node.policy.targets import JobFacts, JobTarget, plan
from coda_node.system.cgroups import CgroupJob, discover_layout, list_jobs
from coda_node.system.resctrl import parse_schemata
from tests.node import cgroup_fixtures, resctrl_fixtures

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


# -- L3 cache ways (CAT) ---------------------------------------------------------------------


def _schemata_writes(node: Node, since: int = 0) -> list[tuple[str, bytes]]:
    return [(p, d) for p, d in node.new_writes(since) if p.endswith("/schemata")]


def _group_of(node: Node, job_id: int) -> str | None:
    return node.state.changes.get(job_id, JobChanges()).rdt_group


@pytest.mark.parametrize("variant", ["full", "cat_only", "nomb"])
def test_an_l3_limit_writes_the_low_ways_and_nothing_else(tmp_path: Path, variant: str) -> None:
    node = Node(tmp_path, variant)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=5)})
    assert res[202].failed == []
    assert res[202].applied == ["L3 cache 5 of 20 ways"]
    # The low 5 of 20 ways: DDIO's ways at the top stay the DNN job's input traffic's.
    assert _schemata_writes(node) == [("coda_l3w5/schemata", b"L3:0=1f;1=1f\n")]
    assert parse_schemata(node.rdt.text("coda_l3w5/schemata"))["L3"] == {0: 0x1F, 1: 0x1F}
    if variant == "full":  # MB is not limited: the new group's 100 %
        assert parse_schemata(node.rdt.text("coda_l3w5/schemata"))["MB"] == {0: 100, 1: 100}
    assert node.tasks("coda_l3w5") == set(JOB_TIDS[202])
    assert _group_of(node, 202) == "coda_l3w5"
    before = len(node.rdt.writes)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=5)})
    assert res[202].applied == [] and node.new_writes(before) == []
    res = node.enforcer.reconcile(node.jobs(), {})
    assert res[202].applied == ["L3 cache ways released"]
    assert set(JOB_TIDS[202]) <= node.tasks("")
    assert node.enforcer.rdt is not None and node.enforcer.rdt.list_coda_groups() == []


def test_mb_and_l3_limits_share_one_group(tmp_path: Path) -> None:
    node = Node(tmp_path, "full")
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=30, l3_ways=5)})
    assert res[202].applied == ["memory bandwidth 30", "L3 cache 5 of 20 ways"]
    assert _schemata_writes(node) == [
        ("coda_mb30_l3w5/schemata", b"MB:0=30;1=30\n"),
        ("coda_mb30_l3w5/schemata", b"L3:0=1f;1=1f\n"),
    ]
    assert node.tasks("coda_mb30_l3w5") == set(JOB_TIDS[202])
    assert {202: "coda_mb30_l3w5"} in node.saved  # on record before the tasks moved


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        (JobTarget(mem_bw_pct=30), "no MB resource"),
        (JobTarget(mem_bw_pct=30, l3_ways=5), "no MB resource"),
    ],
)
def test_an_mb_limit_on_a_cat_only_node_fails_that_job_only(
    tmp_path: Path, target: JobTarget, problem: str
) -> None:
    node = Node(tmp_path, "cat_only")
    res = node.enforcer.reconcile(node.jobs(), {101: JobTarget(l3_ways=10), 202: target})
    assert len(res[202].failed) == 1 and problem in res[202].failed[0]
    assert res[101].failed == [] and _group_of(node, 101) == "coda_l3w10"
    assert _group_of(node, 202) is None


def test_an_l3_limit_without_cat_fails_that_job_only(tmp_path: Path) -> None:
    node = Node(tmp_path, "cdp")  # L3CODE/L3DATA: coda-node manages unified L3 masks only
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=5)})
    assert len(res[202].failed) == 1 and "no L3 cache allocation" in res[202].failed[0]
    assert "L3CODE/L3DATA" in res[202].failed[0]


def test_a_job_moves_between_classes_step_by_step(tmp_path: Path) -> None:
    """The eliminator's ladder as the enforcer sees it: MB, then fewer ways, then back."""
    node = Node(tmp_path, "full")
    steps = [
        (JobTarget(mem_bw_pct=10), "coda_mb10", ["memory bandwidth 10"]),
        (JobTarget(mem_bw_pct=10, l3_ways=10), "coda_mb10_l3w10", ["L3 cache 10 of 20 ways"]),
        (JobTarget(mem_bw_pct=10, l3_ways=5), "coda_mb10_l3w5", ["L3 cache 5 of 20 ways"]),
        (JobTarget(mem_bw_pct=10, l3_ways=10), "coda_mb10_l3w10", ["L3 cache 10 of 20 ways"]),
        (JobTarget(mem_bw_pct=10), "coda_mb10", ["L3 cache ways released"]),
        (JobTarget(l3_ways=2), "coda_l3w2", ["L3 cache 2 of 20 ways", "memory bandwidth released"]),
        (JobTarget(), None, ["L3 cache ways released"]),
    ]
    assert node.enforcer.rdt is not None
    for target, group, applied in steps:
        res = node.enforcer.reconcile(node.jobs(), {202: target})
        assert res[202].failed == [] and res[202].applied == applied, target
        assert _group_of(node, 202) == group
        assert node.enforcer.rdt.list_coda_groups() == ([group] if group else [])
        if group:
            assert node.tasks(group) == set(JOB_TIDS[202])
    assert set(JOB_TIDS[202]) <= node.tasks("")
    l3 = parse_schemata(node.rdt.text("schemata"))["L3"]
    assert l3 == {0: 0xFFFFF, 1: 0xFFFFF}  # the default group was never touched


def test_a_group_named_by_the_previous_version_keeps_working(tmp_path: Path) -> None:
    node = Node(tmp_path, "full")
    # The state file of the previous version: job 202 in coda_mb30, made by that version.
    ctl = node.rdt.control()
    ctl.ensure_group("coda_mb30")
    ctl.set_schemata("coda_mb30", mb={0: 30, 1: 30})
    ctl.assign_tasks("coda_mb30", JOB_TIDS[202])
    node.state.job(202).rdt_group = "coda_mb30"
    before = len(node.rdt.writes)
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=30)})
    assert res[202].applied == [] and node.new_writes(before) == []
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(mem_bw_pct=30, l3_ways=5)})
    assert res[202].applied == ["L3 cache 5 of 20 ways"]
    assert node.enforcer.rdt is not None
    assert node.enforcer.rdt.list_coda_groups() == ["coda_mb30_l3w5"]


def _fill(node: Node, groups: tuple[str, ...], keep_free: int = 0) -> None:
    """``groups`` made by coda (unrecorded: as if for jobs not on this list), the other
    CLOSIDs taken by other software, ``keep_free`` left."""
    ctl = node.rdt.control()
    for g in groups:
        ctl.ensure_group(g)
    closids = node.rdt.num_closids - 1  # CLOSID 0 is the default group's
    for i in range(closids - len(groups) - keep_free):
        node.rdt.mkdir(node.rdt.path / f"other{i}")


@pytest.mark.parametrize(
    ("existing", "target", "shared"),
    [
        # Stricter on every resource the target limits; the closest one wins, and one that
        # limits nothing else beats one that also limits the other resource.
        (("coda_mb10_l3w2", "coda_l3w2"), JobTarget(l3_ways=5), "coda_l3w2"),
        (("coda_mb10_l3w2",), JobTarget(l3_ways=5), "coda_mb10_l3w2"),
        (("coda_l3w2", "coda_l3w4", "coda_l3w10"), JobTarget(l3_ways=5), "coda_l3w4"),
        (("coda_mb10", "coda_mb10_l3w2"), JobTarget(mem_bw_pct=50), "coda_mb10"),
        # Strict enough on both: the smallest MB gap first, then the smallest gap in ways.
        (
            ("coda_mb30_l3w2", "coda_mb10_l3w5"),
            JobTarget(mem_bw_pct=30, l3_ways=5),
            "coda_mb30_l3w2",
        ),
        (
            ("coda_mb30_l3w4", "coda_mb30_l3w2", "coda_mb10_l3w2"),
            JobTarget(mem_bw_pct=30, l3_ways=5),
            "coda_mb30_l3w4",
        ),
        (
            ("coda_mb20_l3w4", "coda_mb10_l3w2"),
            JobTarget(mem_bw_pct=30, l3_ways=5),
            "coda_mb20_l3w4",
        ),
        # Never looser: a group that leaves a limited resource alone, or allows more.
        (("coda_l3w10",), JobTarget(l3_ways=5), None),
        (("coda_l3w2",), JobTarget(mem_bw_pct=30), None),
        (("coda_mb10",), JobTarget(mem_bw_pct=10, l3_ways=5), None),
        (("coda_mb50_l3w2",), JobTarget(mem_bw_pct=30, l3_ways=5), None),
    ],
)
def test_out_of_closids_shares_a_group_at_least_as_strict(
    tmp_path: Path, existing: tuple[str, ...], target: JobTarget, shared: str | None
) -> None:
    node = Node(tmp_path, "full")
    _fill(node, existing)
    res = node.enforcer.reconcile(node.jobs(), {202: target})
    if shared is None:
        assert len(res[202].failed) == 1 and "no free CLOSID" in res[202].failed[0]
        assert "no stricter coda group to share" in res[202].failed[0]
        assert _group_of(node, 202) is None
        assert node.enforcer.rdt is not None
        for group in node.enforcer.rdt.list_coda_groups():
            assert not node.tasks(group) & set(JOB_TIDS[202]), group
        return
    assert res[202].failed == []
    assert _group_of(node, 202) == shared
    assert node.tasks(shared) == set(JOB_TIDS[202])
    # A shared group's schemata is its own class's: nothing was written to it.
    assert _schemata_writes(node) == []


def test_a_job_sharing_a_stricter_group_stays_there_while_closids_are_short(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, "full")
    _fill(node, (), keep_free=1)
    targets = {101: JobTarget(mem_bw_pct=10, l3_ways=2), 202: JobTarget(l3_ways=5)}
    res = node.enforcer.reconcile(node.jobs(), targets)
    assert _group_of(node, 101) == _group_of(node, 202) == "coda_mb10_l3w2"
    assert res[202].applied == ["memory bandwidth 10", "L3 cache 2 of 20 ways"]
    for _ in range(3):  # tick after tick: nothing moves, nothing is logged again
        before = len(node.rdt.writes)
        res = node.enforcer.reconcile(node.jobs(), targets)
        assert res[202].applied == [] and res[202].failed == []
        assert node.new_writes(before) == []
    assert node.tasks("coda_mb10_l3w2") == set(JOB_TIDS[101]) | set(JOB_TIDS[202])
    # Job 101 released: its group is job 202's alone and looser than nothing it needs; the
    # job keeps it (stricter) until a CLOSID frees up for its own class.
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=5)})
    assert _group_of(node, 202) == "coda_mb10_l3w2" and res[202].applied == []


def test_out_of_closids_a_job_gives_back_its_own_looser_group(tmp_path: Path) -> None:
    """Job 202 alone in coda_l3w10 wants 5 ways; no CLOSID is free and no group is strict
    enough: its own group goes, and its CLOSID makes the new one."""
    node = Node(tmp_path, "cat_only")
    _fill(node, (), keep_free=1)
    node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=10)})
    assert _group_of(node, 202) == "coda_l3w10"
    res = node.enforcer.reconcile(node.jobs(), {202: JobTarget(l3_ways=5)})
    assert res[202].failed == []
    assert res[202].applied == ["L3 cache ways released", "L3 cache 5 of 20 ways"]
    assert _group_of(node, 202) == "coda_l3w5"
    assert node.enforcer.rdt is not None
    assert node.enforcer.rdt.list_coda_groups() == ["coda_l3w5"]
    assert node.tasks("coda_l3w5") == set(JOB_TIDS[202])


def test_out_of_closids_a_group_another_job_uses_is_kept(tmp_path: Path) -> None:
    node = Node(tmp_path, "cat_only")
    _fill(node, (), keep_free=1)
    node.enforcer.reconcile(node.jobs(), {101: JobTarget(l3_ways=10), 202: JobTarget(l3_ways=10)})
    res = node.enforcer.reconcile(
        node.jobs(), {101: JobTarget(l3_ways=10), 202: JobTarget(l3_ways=5)}
    )
    assert len(res[202].failed) == 1 and "no free CLOSID" in res[202].failed[0]
    # Never looser, and never at job 101's expense: 202 stays limited where it was.
    assert node.tasks("coda_l3w10") == set(JOB_TIDS[101]) | set(JOB_TIDS[202])
    assert _group_of(node, 202) == "coda_l3w10"


def test_restore_all_leaves_no_coda_group(tmp_path: Path) -> None:
    node = Node(tmp_path, "full")
    node.enforcer.reconcile(
        node.jobs(), {101: JobTarget(mem_bw_pct=10, l3_ways=2), 202: JobTarget(l3_ways=5)}
    )
    assert node.enforcer.rdt is not None
    assert node.enforcer.rdt.list_coda_groups() == ["coda_l3w5", "coda_mb10_l3w2"]
    res = node.enforcer.restore_all(node.jobs())
    assert res[101].applied == ["memory bandwidth released", "L3 cache ways released"]
    assert res[202].applied == ["L3 cache ways released"]
    assert node.enforcer.rdt.list_coda_groups() == []
    assert set(JOB_TIDS[101]) | set(JOB_TIDS[202]) <= node.tasks("")
    assert node.state.changes == {}
