"""coda_node.system.cgroups against fixture trees laid out like Slurm's, plus one real v1
cpuset test."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coda_node.system import cgroups
from coda_node.system.cgroups import (
    CgroupJob,
    CgroupLayout,
    CgroupStep,
    CpuQuotaWriter,
    CpusetWriter,
    EnforceError,
    JobGone,
    cpu_usage_ns,
    discover_layout,
    format_cpulist,
    list_jobs,
    parse_cpulist,
)
from coda_node.system.paths import SystemRoot
from tests.node.cgroup_fixtures import (
    V2_SCOPE,
    CgroupFixture,
    build_no_slurm,
    build_v1_debian,
    build_v1_multi_slurmd,
    build_v2,
    v1_cpuset,
)

CLK_TCK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------------------------
# cpulists


@pytest.mark.parametrize(
    "text,cpus,canonical",
    [
        ("", set(), ""),
        ("\n", set(), ""),
        ("0", {0}, "0"),
        ("0-1\n", {0, 1}, "0-1"),
        ("0-3,8", {0, 1, 2, 3, 8}, "0-3,8"),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"),
        ("8,0-3", {0, 1, 2, 3, 8}, "0-3,8"),  # unsorted input
        ("2,0,1", {0, 1, 2}, "0-2"),
        ("0-3,4-5", set(range(6)), "0-5"),  # adjacent ranges merge
        ("1,1,1-2", {1, 2}, "1-2"),  # duplicates
        ("5-5", {5}, "5"),
        ("0-127", set(range(128)), "0-127"),
    ],
)
def test_cpulist_round_trip(text: str, cpus: set[int], canonical: str) -> None:
    assert parse_cpulist(text) == cpus
    assert format_cpulist(parse_cpulist(text)) == canonical
    assert parse_cpulist(canonical) == cpus


@pytest.mark.parametrize(
    "bad", ["3-1", "a", "1,,2", "-1", "1-", "1 - 2", "0x3", "1:2", "1;2", "0-4000000000", "70000"]
)
def test_cpulist_rejects_what_the_kernel_never_prints(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


# --------------------------------------------------------------------------------------------
# Layout discovery

CG = "/sys/fs/cgroup"


@pytest.mark.parametrize(
    "build,version,mounts,slurm_dirs,reason",
    [
        (
            build_v1_debian,
            1,
            {
                "cpuset": f"{CG}/cpuset",
                "cpu": f"{CG}/cpu,cpuacct",
                "cpuacct": f"{CG}/cpu,cpuacct",
                "freezer": f"{CG}/freezer",
                "unified": f"{CG}/unified",
            },
            [f"{CG}/cpuset/slurm"],
            None,
        ),
        (
            build_v1_multi_slurmd,
            1,
            {
                "cpuset": f"{CG}/cpuset",
                "cpu": f"{CG}/cpu",
                "cpuacct": f"{CG}/cpuacct",
                "freezer": f"{CG}/freezer",
                "unified": f"{CG}/unified",
            },
            [f"{CG}/cpuset/slurm_gpu01"],
            None,
        ),
        (
            build_v2,
            2,
            {"cpuset": None, "cpu": None, "cpuacct": None, "freezer": None, "unified": CG},
            [f"{CG}/{V2_SCOPE}"],
            None,
        ),
        (
            lambda base: build_no_slurm(base, "v1"),
            1,
            {
                "cpuset": f"{CG}/cpuset",
                "cpu": f"{CG}/cpu",
                "cpuacct": f"{CG}/cpuacct",
                "freezer": f"{CG}/freezer",
                "unified": f"{CG}/unified",
            },
            [],
            f"no slurm*/ directory in {{base}}{CG}/cpuset; "
            f"no system.slice/*slurmstepd.scope in {{base}}{CG}/unified",
        ),
        (
            lambda base: build_no_slurm(base, "v1-freezer-only"),
            1,
            {
                "cpuset": f"{CG}/cpuset",
                "cpu": f"{CG}/cpu",
                "cpuacct": f"{CG}/cpuacct",
                "freezer": f"{CG}/freezer",
                "unified": f"{CG}/unified",
            },
            [],
            f"no slurm*/ directory in {{base}}{CG}/cpuset; Slurm's tree is in the freezer "
            "hierarchy only (ConstrainCores=no in cgroup.conf?); "
            f"no system.slice/*slurmstepd.scope in {{base}}{CG}/unified",
        ),
        (
            lambda base: build_no_slurm(base, "v2"),
            2,
            {"cpuset": None, "cpu": None, "cpuacct": None, "freezer": None, "unified": CG},
            [],
            f"no cgroup v1 cpuset mounted; no system.slice/*slurmstepd.scope in {{base}}{CG}",
        ),
        (
            lambda base: build_no_slurm(base, "none"),
            None,
            {"cpuset": None, "cpu": None, "cpuacct": None, "freezer": None, "unified": None},
            [],
            "no cgroup filesystem in /proc/self/mounts",
        ),
    ],
    ids=[
        "v1-debian",
        "v1-multi-slurmd",
        "v2",
        "v1-no-slurm",
        "v1-freezer-only",
        "v2-no-slurm",
        "no-cgroups",
    ],
)
def test_discover_layout(
    tmp_path: Path,
    build: Callable[[Path], CgroupFixture],
    version: int | None,
    mounts: dict[str, str | None],
    slurm_dirs: list[str],
    reason: str | None,
) -> None:
    fx = build(tmp_path)
    layout = discover_layout(fx.root)

    def host(path: Path | None) -> str | None:
        return None if path is None else fx.rel(path)

    assert layout.version == version
    assert {
        "cpuset": host(layout.cpuset_mount),
        "cpu": host(layout.cpu_mount),
        "cpuacct": host(layout.cpuacct_mount),
        "freezer": host(layout.freezer_mount),
        "unified": host(layout.unified_mount),
    } == mounts
    assert [fx.rel(d) for d in layout.slurm_dirs] == slurm_dirs
    assert layout.has_slurm == bool(slurm_dirs)
    assert layout.reason == (None if reason is None else reason.format(base=tmp_path))


def test_v1_slurm_tree_wins_over_a_cgroup2_with_a_scope(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    (fx.cg("unified/system.slice/slurmstepd.scope")).mkdir(parents=True)
    layout = discover_layout(fx.root)
    assert layout.version == 1
    assert [fx.rel(d) for d in layout.slurm_dirs] == [f"{CG}/cpuset/slurm"]


def test_mount_points_with_escaped_spaces(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mounts").write_text(
        "cgroup /sys/fs/cgroup/my\\040cpuset cgroup rw,cpuset 0 0\n"
    )
    (tmp_path / "sys/fs/cgroup/my cpuset/slurm").mkdir(parents=True)
    layout = discover_layout(SystemRoot(tmp_path))
    assert layout.cpuset_mount == tmp_path / "sys/fs/cgroup/my cpuset"
    assert layout.slurm_dirs == (tmp_path / "sys/fs/cgroup/my cpuset/slurm",)


# --------------------------------------------------------------------------------------------
# Job discovery


def _summary(fx: CgroupFixture, jobs: dict[int, CgroupJob]) -> dict[int, tuple[object, ...]]:
    def step(s: CgroupStep) -> tuple[object, ...]:
        return (s.name, fx.rel(s.path), format_cpulist(s.cpus), s.pids)

    return {
        job_id: (
            job.uid,
            fx.rel(job.path),
            format_cpulist(job.cpus),
            job.mems,
            [step(s) for s in job.steps],
            job.pids,
        )
        for job_id, job in jobs.items()
    }


J101 = f"{CG}/cpuset/slurm/uid_1000/job_101"
J202 = f"{CG}/cpuset/slurm/uid_1001/job_202"
J7 = f"{CG}/cpuset/slurm_gpu01/uid_0/job_7"
SCOPE = f"{CG}/{V2_SCOPE}"


@pytest.mark.parametrize(
    "build,expected",
    [
        (
            build_v1_debian,
            {
                101: (
                    1000,
                    J101,
                    "0-3,8-11",
                    "0",
                    [
                        ("0", f"{J101}/step_0", "0-3,8-11", (1110, 1111, 1112)),
                        ("batch", f"{J101}/step_batch", "0-3,8-11", (1101, 1102)),
                        ("extern", f"{J101}/step_extern", "0-3,8-11", (1100,)),
                    ],
                    (1100, 1101, 1102, 1110, 1111, 1112),
                ),
                202: (
                    1001,
                    J202,
                    "4-7",
                    "0",
                    [
                        ("batch", f"{J202}/step_batch", "4-7", (2201, 2202)),
                        ("extern", f"{J202}/step_extern", "4-7", (2200,)),
                    ],
                    (2200, 2201, 2202),
                ),
            },
        ),
        (
            build_v1_multi_slurmd,
            {
                7: (
                    0,
                    J7,
                    "0-1",
                    "0",
                    [
                        ("0+1", f"{J7}/step_0+1", "1", (701,)),
                        ("extern", f"{J7}/step_extern", "0-1", (700,)),
                    ],
                    (700, 701),
                )
            },
        ),
        (
            build_v2,
            {
                301: (
                    None,
                    f"{SCOPE}/job_301",
                    "0-3",
                    "0",  # cpuset.mems is empty: the effective list is shown
                    [
                        ("0", f"{SCOPE}/job_301/step_0", "0-1", (3030, 3031, 3032)),
                        ("batch", f"{SCOPE}/job_301/step_batch", "0-3", (3020, 3021)),
                        ("extern", f"{SCOPE}/job_301/step_extern", "0-3", (3010, 3011)),
                    ],
                    (3010, 3011, 3020, 3021, 3030, 3031, 3032),
                ),
                302: (
                    None,
                    f"{SCOPE}/job_302",
                    "0-7",  # empty cpuset.cpus: inherited, read from cpuset.cpus.effective
                    "0",
                    [("batch", f"{SCOPE}/job_302/step_batch", "0-7", (3121,))],
                    (3121,),
                ),
            },
        ),
        (lambda base: build_no_slurm(base, "v1"), {}),
        (lambda base: build_no_slurm(base, "none"), {}),
    ],
    ids=["v1-debian", "v1-multi-slurmd", "v2", "v1-no-slurm", "no-cgroups"],
)
def test_list_jobs(
    tmp_path: Path,
    build: Callable[[Path], CgroupFixture],
    expected: dict[int, tuple[object, ...]],
) -> None:
    fx = build(tmp_path)
    assert _summary(fx, list_jobs(discover_layout(fx.root))) == expected


def test_job_that_ends_between_listing_and_reading_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx = build_v1_debian(tmp_path)
    layout = discover_layout(fx.root)
    real = cgroups._subdirs

    def list_then_job_ends(where: str | Path) -> list[str]:
        names = real(where)
        path = Path(where)
        if path.name == "uid_1001":
            shutil.rmtree(path / "job_202")  # slurmd removed it right after we listed it
        return names

    monkeypatch.setattr(cgroups, "_subdirs", list_then_job_ends)
    assert sorted(list_jobs(layout)) == [101]


def test_step_that_ends_mid_walk_is_left_out_of_its_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx = build_v1_debian(tmp_path)
    layout = discover_layout(fx.root)
    real = cgroups._subdirs

    def list_then_step_ends(where: str | Path) -> list[str]:
        names = real(where)
        path = Path(where)
        if path.name == "job_101" and (path / "step_batch").exists():
            shutil.rmtree(path / "step_batch")
        return names

    monkeypatch.setattr(cgroups, "_subdirs", list_then_step_ends)
    job = list_jobs(layout)[101]
    assert [s.name for s in job.steps] == ["0", "extern"]
    assert job.pids == (1100, 1110, 1111, 1112)


def test_cached_listing_sees_a_step_that_replaced_another_under_the_same_link_count(
    tmp_path: Path,
) -> None:
    # srun in a loop: step 0 ends and step 1 starts between two ticks. The job directory
    # keeps its subdirectory count (st_nlink), so the cache alone cannot tell; step 0's
    # files failing to read must make the job be listed afresh in the same pass.
    fx = build_v1_debian(tmp_path)
    layout = discover_layout(fx.root)
    cache = cgroups.SubdirCache()
    uncached = _summary(fx, list_jobs(layout))
    assert _summary(fx, list_jobs(layout, cache=cache)) == uncached
    job = fx.root.path("/sys/fs/cgroup/cpuset/slurm/uid_1000/job_101")
    nlink = os.stat(job).st_nlink
    shutil.rmtree(job / "step_0")
    v1_cpuset(job / "step_1", "0-3,8-11", tasks=(1120,))
    assert os.stat(job).st_nlink == nlink
    again = list_jobs(layout, cache=cache)[101]
    assert [s.name for s in again.steps] == ["1", "batch", "extern"]
    assert again.pids == (1100, 1101, 1102, 1120)
    assert _summary(fx, list_jobs(layout, cache=cache)) == _summary(fx, list_jobs(layout))


def test_cached_listing_sees_new_directories_at_once_and_a_new_job_always(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout = discover_layout(fx.root)
    cache = cgroups.SubdirCache()
    list_jobs(layout, cache=cache)
    job = fx.root.path("/sys/fs/cgroup/cpuset/slurm/uid_1000/job_101")
    v1_cpuset(job / "step_0/task_1", "8-9", tasks=(1113,))  # a task started in step 0
    v1_cpuset(job / "step_2", "0-3,8-11", tasks=(1130,))
    uid = fx.root.path("/sys/fs/cgroup/cpuset/slurm/uid_1000")
    v1_cpuset(uid / "job_103", "12-13")  # a new job of the same user
    jobs = list_jobs(layout, cache=cache)
    assert 1113 in jobs[101].pids and "2" in {s.name for s in jobs[101].steps}
    assert sorted(jobs) == [101, 103, 202]
    assert _summary(fx, jobs) == _summary(fx, list_jobs(layout))


# --------------------------------------------------------------------------------------------
# CPU time


def _drop_thread(fx: CgroupFixture, tid: int) -> None:
    shutil.rmtree(fx.base / f"proc/{tid}")


@pytest.mark.parametrize(
    "build,job_id,gone,expected_ns",
    [
        (build_v1_debian, 101, (), 123_456_789_000),  # cpuacct.usage of the job
        # no cpuacct tree for 202: /proc, per thread: (1+2) + (300+100) + (200+0) ticks
        (build_v1_debian, 202, (), 603 * 1_000_000_000 // CLK_TCK),
        (build_v1_debian, 202, (2201,), 203 * 1_000_000_000 // CLK_TCK),
        (build_v1_debian, 202, (2200, 2201, 2202), None),
        (build_v1_multi_slurmd, 7, (), 42_000),  # cpuacct mounted on its own
        (build_v2, 301, (), 5_000_000_000),  # cpu.stat usage_usec
        (build_v2, 302, (), 0),
    ],
)
def test_cpu_usage_ns(
    tmp_path: Path,
    build: Callable[[Path], CgroupFixture],
    job_id: int,
    gone: tuple[int, ...],
    expected_ns: int | None,
) -> None:
    fx = build(tmp_path)
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[job_id]
    for tid in gone:
        _drop_thread(fx, tid)
    assert cpu_usage_ns(layout, job) == expected_ns


# --------------------------------------------------------------------------------------------
# Cpuset enforcement


class FakeAffinity:
    """sched_{get,set}affinity over a dict; threads in ``gone`` have exited."""

    def __init__(self, masks: dict[int, set[int]], gone: set[int] | None = None) -> None:
        self.masks = masks
        self.gone = gone or set()
        self.calls: list[tuple[int, str]] = []

    def get(self, tid: int) -> set[int]:
        if tid in self.gone:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        return self.masks[tid]

    def set(self, tid: int, cpus: frozenset[int]) -> None:
        self.calls.append((tid, format_cpulist(cpus)))
        if tid in self.gone:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        self.masks[tid] = set(cpus)


def _v1_job(fx: CgroupFixture, job_id: int = 101) -> tuple[CgroupLayout, CgroupJob]:
    layout = discover_layout(fx.root)
    return layout, list_jobs(layout)[job_id]


def _cpuset_writer(
    fx: CgroupFixture, layout: CgroupLayout, affinity: FakeAffinity | None = None
) -> tuple[CpusetWriter, list[tuple[Path, bytes]]]:
    journal: list[tuple[Path, bytes]] = []
    affinity = affinity or FakeAffinity({})
    writer = CpusetWriter(
        layout,
        journal=journal,
        write_file=fx.kernel.write_file,
        get_affinity=affinity.get,
        set_affinity=affinity.set,
    )
    return writer, journal


JOB101 = "cpuset/slurm/uid_1000/job_101"


@pytest.mark.parametrize(
    "cpus,expected",
    [
        # children first; task_0 (2-3) already fits and is not written
        (
            {2, 3, 8, 9},
            [
                (f"{JOB101}/step_extern/cpuset.cpus", b"2-3,8-9"),
                (f"{JOB101}/step_batch/cpuset.cpus", b"2-3,8-9"),
                (f"{JOB101}/step_0/cpuset.cpus", b"2-3,8-9"),
                (f"{JOB101}/cpuset.cpus", b"2-3,8-9"),
            ],
        ),
        # task_0 (2-3) keeps nothing of {8, 9}: it gets its parent's new CPUs
        (
            {8, 9},
            [
                (f"{JOB101}/step_0/task_0/cpuset.cpus", b"8-9"),
                (f"{JOB101}/step_extern/cpuset.cpus", b"8-9"),
                (f"{JOB101}/step_batch/cpuset.cpus", b"8-9"),
                (f"{JOB101}/step_0/cpuset.cpus", b"8-9"),
                (f"{JOB101}/cpuset.cpus", b"8-9"),
            ],
        ),
        (
            {3},
            [
                (f"{JOB101}/step_0/task_0/cpuset.cpus", b"3"),
                (f"{JOB101}/step_extern/cpuset.cpus", b"3"),
                (f"{JOB101}/step_batch/cpuset.cpus", b"3"),
                (f"{JOB101}/step_0/cpuset.cpus", b"3"),
                (f"{JOB101}/cpuset.cpus", b"3"),
            ],
        ),
        ({0, 1, 2, 3, 8, 9, 10, 11}, []),  # the whole allocation: nothing to do
    ],
)
def test_shrink_v1_writes_children_first(
    tmp_path: Path, cpus: set[int], expected: list[tuple[str, bytes]]
) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx)
    writer, journal = _cpuset_writer(fx, layout)
    assert writer.shrink(job, cpus) == len(expected)
    assert fx.journal(journal) == expected
    after = list_jobs(layout)[101]
    assert after.cpus == frozenset(cpus)
    # A second identical shrink finds every file as wanted and writes nothing.
    assert writer.shrink(after, cpus) == 0
    assert len(journal) == len(expected)


def test_fake_kernel_refuses_the_wrong_order(tmp_path: Path) -> None:
    """The fixture's kernel is strict, so the order tests above can fail."""
    fx = build_v1_debian(tmp_path)
    with pytest.raises(OSError) as parent_first:
        fx.kernel.write_file(fx.cg(f"{JOB101}/cpuset.cpus"), b"8-9")
    assert parent_first.value.errno == errno.EBUSY
    with pytest.raises(OSError) as child_beyond_parent:
        fx.kernel.write_file(fx.cg(f"{JOB101}/step_0/cpuset.cpus"), b"0-4")
    assert child_beyond_parent.value.errno == errno.EACCES


@pytest.mark.parametrize(
    "cpus,message",
    [
        ({0, 4}, "CPUs 4 are outside its allocation 0-3,8-11"),
        ({12, 13, 14}, "CPUs 12-14 are outside its allocation 0-3,8-11"),
        (set(), "cannot shrink to no CPUs"),
    ],
)
def test_shrink_outside_the_allocation_is_refused(
    tmp_path: Path, cpus: set[int], message: str
) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx)
    writer, journal = _cpuset_writer(fx, layout)
    with pytest.raises(ValueError, match=message):
        writer.shrink(job, cpus)
    assert journal == []


def test_shrink_again_from_the_snapshot_does_not_compound(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx)
    writer, journal = _cpuset_writer(fx, layout, FakeAffinity({tid: {0} for tid in range(2000)}))
    snap = writer.snapshot(job)
    writer.shrink(job, {8, 9}, snap)
    job = list_jobs(layout)[101]
    # Without the snapshot the allocation is what the files say now.
    with pytest.raises(ValueError, match="outside its allocation 8-9"):
        writer.shrink(job, {2, 3, 8})
    del journal[:]
    writer.shrink(job, {2, 3, 8}, snap)
    # Gains parents first (keeping 9 while a child still holds it), then losses children first;
    # task_0 goes back to Slurm's 2-3, not to what {8, 9} left it.
    assert fx.journal(journal) == [
        (f"{JOB101}/cpuset.cpus", b"2-3,8-9"),
        (f"{JOB101}/step_0/cpuset.cpus", b"2-3,8-9"),
        (f"{JOB101}/step_batch/cpuset.cpus", b"2-3,8"),
        (f"{JOB101}/step_extern/cpuset.cpus", b"2-3,8"),
        (f"{JOB101}/step_0/task_0/cpuset.cpus", b"2-3"),
        (f"{JOB101}/step_0/cpuset.cpus", b"2-3,8"),
        (f"{JOB101}/cpuset.cpus", b"2-3,8"),
    ]


def test_snapshot_then_restore_v1(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx)
    full = set(range(4)) | set(range(8, 12))
    affinity = FakeAffinity(
        {1100: full, 1101: full, 1102: full, 1110: full, 1111: {2}, 1112: {2, 3}},
    )
    writer, journal = _cpuset_writer(fx, layout, affinity)
    snap = writer.snapshot(job)
    assert snap.job_id == 101
    assert snap.cpus == {
        ".": "0-3,8-11",
        "step_0": "0-3,8-11",
        "step_0/task_0": "2-3",
        "step_batch": "0-3,8-11",
        "step_extern": "0-3,8-11",
    }
    assert snap.affinity == {tid: frozenset(mask) for tid, mask in affinity.masks.items()}

    writer.shrink(job, {8, 9})
    del journal[:]
    # Since the shrink: thread 1113 started in task_0, and 1101 exits during the restore.
    tasks = fx.cg(f"{JOB101}/step_0/task_0/tasks")
    tasks.write_text(tasks.read_text() + "1113\n")
    affinity.gone.add(1101)

    assert writer.restore(list_jobs(layout)[101], snap) == 5
    assert fx.journal(journal) == [
        (f"{JOB101}/cpuset.cpus", b"0-3,8-11"),
        (f"{JOB101}/step_0/cpuset.cpus", b"0-3,8-11"),
        (f"{JOB101}/step_batch/cpuset.cpus", b"0-3,8-11"),
        (f"{JOB101}/step_extern/cpuset.cpus", b"0-3,8-11"),
        (f"{JOB101}/step_0/task_0/cpuset.cpus", b"2-3"),
    ]
    assert affinity.calls == [
        (1110, "0-3,8-11"),
        (1101, "0-3,8-11"),  # exited: skipped
        (1102, "0-3,8-11"),
        (1100, "0-3,8-11"),
        (1111, "2"),  # its own explicit mask
        (1112, "2-3"),
        (1113, "2-3"),  # new since the snapshot: its cpuset's CPUs
    ]
    assert {rel: fx.read(f"{JOB101}/{rel}/cpuset.cpus") for rel in snap.cpus} == {
        rel: text + "\n" for rel, text in snap.cpus.items()
    }
    del journal[:]
    assert writer.restore(list_jobs(layout)[101], snap) == 0
    assert journal == []


def test_shrink_and_restore_v2(tmp_path: Path) -> None:
    fx = build_v2(tmp_path)
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[301]
    tids = (3010, 3011, 3020, 3021, 3022, 3030, 3031, 3032)
    affinity = FakeAffinity({tid: {0} for tid in tids})
    writer, journal = _cpuset_writer(fx, layout, affinity)
    snap = writer.snapshot(job)
    assert 3022 in snap.affinity  # a second thread, from cgroup.threads
    j = f"{V2_SCOPE}/job_301"
    writer.shrink(job, {1, 2})
    # The job and each step's user/ level hold CPUs; the empty (inheriting) step, slurm/
    # and task_*/ directories are left alone. Children first: the kernel takes either order.
    assert fx.journal(journal) == [
        (f"{j}/step_extern/user/cpuset.cpus", b"1-2"),
        (f"{j}/step_batch/user/cpuset.cpus", b"1-2"),
        (f"{j}/step_0/user/cpuset.cpus", b"1"),
        (f"{j}/cpuset.cpus", b"1-2"),
    ]
    del journal[:]
    writer.restore(list_jobs(layout)[301], snap)
    assert fx.journal(journal) == [
        (f"{j}/cpuset.cpus", b"0-3"),
        (f"{j}/step_0/user/cpuset.cpus", b"0-1"),
        (f"{j}/step_batch/user/cpuset.cpus", b"0-3"),
        (f"{j}/step_extern/user/cpuset.cpus", b"0-3"),
    ]
    # Threads in inheriting directories get the nearest ancestor's CPUs ∩ their own mask.
    assert sorted(affinity.calls) == [
        (3010, "0"),
        (3011, "0"),
        (3020, "0"),
        (3021, "0"),
        (3022, "0"),
        (3030, "0"),
        (3031, "0"),
        (3032, "0"),
    ]


def test_empty_cpulist_is_written_as_a_newline(tmp_path: Path) -> None:
    """v2 job 302 inherits its CPUs (empty cpuset.cpus); restoring writes "\\n", not b""."""
    fx = build_v2(tmp_path)
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[302]
    writer, journal = _cpuset_writer(fx, layout, FakeAffinity({3121: {4, 5, 6, 7}}))
    snap = writer.snapshot(job)
    writer.shrink(job, {4})
    writer.restore(list_jobs(layout)[302], snap)
    j = f"{V2_SCOPE}/job_302"
    assert fx.journal(journal) == [(f"{j}/cpuset.cpus", b"4"), (f"{j}/cpuset.cpus", b"\n")]


@pytest.mark.parametrize("how", ["job dir removed", "removed between read and write"])
def test_job_gone_before_write(tmp_path: Path, how: str) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx, 202)
    writer, _ = _cpuset_writer(fx, layout)
    if how == "job dir removed":
        shutil.rmtree(fx.cg("cpuset/slurm/uid_1001/job_202"))
    else:
        fx.kernel.fail[fx.cg("cpuset/slurm/uid_1001/job_202/step_batch/cpuset.cpus")] = errno.ENOENT
    with pytest.raises(JobGone) as gone:
        writer.shrink(job, {4})
    assert gone.value.job_id == 202
    if how == "job dir removed":
        with pytest.raises(JobGone):
            writer.snapshot(job)


def test_v2_job_without_the_cpuset_controller(tmp_path: Path) -> None:
    """ConstrainCores=no on v2: no cpuset files. Listed with no CPUs; shrinking says why."""
    fx = build_v2(tmp_path)
    j302 = fx.cg(f"{V2_SCOPE}/job_302")
    for path in sorted(j302.rglob("cpuset.*")):
        path.unlink()
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[302]
    assert (job.cpus, job.mems, job.pids) == (frozenset(), "", (3121,))
    writer, journal = _cpuset_writer(fx, layout)
    with pytest.raises(EnforceError, match="cpuset controller is not enabled") as err:
        writer.shrink(job, {0})
    assert err.value.path == j302 / "cpuset.cpus"
    assert journal == []


def test_permission_denied_names_the_file(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx, 202)
    writer, _ = _cpuset_writer(fx, layout)
    path = fx.cg("cpuset/slurm/uid_1001/job_202/step_extern/cpuset.cpus")
    fx.kernel.fail[path] = errno.EACCES
    with pytest.raises(EnforceError) as err:
        writer.shrink(job, {4})
    assert err.value.path == path
    assert err.value.errno == errno.EACCES
    assert str(path) in str(err.value) and "Permission denied" in str(err.value)


# --------------------------------------------------------------------------------------------
# CPU quota


def _quota_writer(
    fx: CgroupFixture, layout: CgroupLayout
) -> tuple[CpuQuotaWriter, list[tuple[Path, bytes]]]:
    journal: list[tuple[Path, bytes]] = []
    writer = CpuQuotaWriter(
        layout,
        journal=journal,
        write_file=fx.kernel.write_file,
        mkdir=fx.kernel.mkdir,
        rmdir=fx.kernel.rmdir,
    )
    return writer, journal


def test_quota_v2(tmp_path: Path) -> None:
    """The cpu controller is enabled down to every job: only the job's cpu.max is written."""
    fx = build_v2(tmp_path)
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[301]
    writer, journal = _quota_writer(fx, layout)
    assert writer.read_quota(job) is None  # "max 100000"
    assert writer.set_quota(job, 1.5) == 1
    j = f"{V2_SCOPE}/job_301"
    assert fx.journal(journal) == [(f"{j}/cpu.max", b"150000 100000")]
    assert writer.enabled_cpu_controller == ()
    assert writer.read_quota(job) == 1.5
    assert writer.set_quota(job, 1.5) == 0
    del journal[:]
    assert writer.set_quota(job, None) == 1
    assert fx.journal(journal) == [(f"{j}/cpu.max", b"max 100000")]
    assert writer.read_quota(job) is None


def test_quota_v2_enables_the_cpu_controller_where_it_is_off(tmp_path: Path) -> None:
    fx = build_v2(tmp_path, cpu_delegated=False)
    layout = discover_layout(fx.root)
    job = list_jobs(layout)[301]
    writer, journal = _quota_writer(fx, layout)
    assert writer.read_quota(job) is None  # no cpu controller above the job yet
    assert writer.set_quota(job, 1.5) == 3
    j = f"{V2_SCOPE}/job_301"
    assert fx.journal(journal) == [
        # the root already delegates cpu; system.slice and the scope do not
        ("system.slice/cgroup.subtree_control", b"+cpu"),
        (f"{V2_SCOPE}/cgroup.subtree_control", b"+cpu"),
        (f"{j}/cpu.max", b"150000 100000"),
    ]
    assert [fx.rel(p) for p in writer.enabled_cpu_controller] == [
        f"{CG}/system.slice",
        f"{CG}/{V2_SCOPE}",
    ]
    assert writer.read_quota(job) == 1.5


def test_quota_none_on_v2_without_cpu_controller_writes_nothing(tmp_path: Path) -> None:
    fx = build_v2(tmp_path, cpu_delegated=False)
    layout = discover_layout(fx.root)
    writer, journal = _quota_writer(fx, layout)
    assert writer.set_quota(list_jobs(layout)[302], None) == 0
    assert journal == []


@pytest.mark.parametrize("quota_cores", [0.0, -1.0, float("nan"), float("inf"), 0.005])
def test_quota_rejects_impossible_values(tmp_path: Path, quota_cores: float) -> None:
    fx = build_v2(tmp_path)
    layout = discover_layout(fx.root)
    writer, journal = _quota_writer(fx, layout)
    with pytest.raises(ValueError):
        writer.set_quota(list_jobs(layout)[301], quota_cores)
    assert journal == []


def _tasks(fx: CgroupFixture, rel: str) -> list[int]:
    return [int(t) for t in fx.read(rel).split()]


def test_quota_v1_in_the_daemons_own_dir(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx, 202)
    writer, journal = _quota_writer(fx, layout)
    coda = "cpu,cpuacct/coda/job_202"
    assert writer.coda_dirs() == []
    assert writer.set_quota(job, 2.0) == 4
    # The new cgroup already has the default period; only the quota and the moves are written.
    assert fx.journal(journal) == [
        (f"{coda}/cpu.cfs_quota_us", b"200000"),
        (f"{coda}/tasks", b"2200"),
        (f"{coda}/tasks", b"2201"),
        (f"{coda}/tasks", b"2202"),
    ]
    assert _tasks(fx, f"{coda}/tasks") == [2200, 2201, 2202]
    assert _tasks(fx, "cpu,cpuacct/system.slice/slurmd.service/tasks") == []
    assert writer.read_quota(job) == 2.0
    assert writer.coda_dirs() == [202]

    # A new step's thread (2203) starts outside; a thread that exits before its move is skipped.
    fx.cg("cpuset/slurm/uid_1001/job_202/step_0").mkdir()
    fx.cg("cpuset/slurm/uid_1001/job_202/step_0/cpuset.cpus").write_text("4-7\n")
    fx.cg("cpuset/slurm/uid_1001/job_202/step_0/tasks").write_text("2203\n2204\n")
    (fx.base / "proc/2203").mkdir()
    (fx.base / "proc/2203/cgroup").write_text("4:cpu,cpuacct:/system.slice/slurmd.service\n")
    del journal[:]
    assert writer.set_quota(list_jobs(layout)[202], 2.0) == 1
    assert fx.journal(journal) == [(f"{coda}/tasks", b"2203")]

    del journal[:]
    assert writer.set_quota(job, None) == 4
    # Every thread goes back where /proc/<tid>/cgroup said it was; then the dir is removed.
    assert fx.journal(journal) == [
        ("cpu,cpuacct/system.slice/slurmd.service/tasks", b"2200"),
        ("cpu,cpuacct/system.slice/slurmd.service/tasks", b"2201"),
        ("cpu,cpuacct/tasks", b"2202"),
        ("cpu,cpuacct/system.slice/slurmd.service/tasks", b"2203"),
    ]
    assert _tasks(fx, "cpu,cpuacct/system.slice/slurmd.service/tasks") == [2200, 2201, 2203]
    assert _tasks(fx, "cpu,cpuacct/tasks") == [1, 2202]
    assert not fx.cg(coda).exists()
    assert writer.coda_dirs() == []
    assert writer.read_quota(job) is None


def test_quota_v1_crash_cleanup_sends_tasks_to_the_root(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx, 202)
    first, _ = _quota_writer(fx, layout)
    first.set_quota(job, 1.0)
    after_restart, journal = _quota_writer(fx, layout)  # the origins are forgotten
    assert after_restart.coda_dirs() == [202]
    assert after_restart.release(202) == 3
    assert fx.journal(journal) == [
        ("cpu,cpuacct/tasks", b"2200"),
        ("cpu,cpuacct/tasks", b"2201"),
        ("cpu,cpuacct/tasks", b"2202"),
    ]
    assert after_restart.coda_dirs() == []


def test_quota_v1_on_slurms_cpuacct_dir_when_co_mounted(tmp_path: Path) -> None:
    """cpu,cpuacct co-mounted: Slurm made job 101's directory there; no tasks are moved."""
    fx = build_v1_debian(tmp_path)
    layout, job = _v1_job(fx, 101)
    fx.cg("cpu,cpuacct/slurm/uid_1000/job_101/cpu.cfs_period_us").write_text("50000\n")
    writer, journal = _quota_writer(fx, layout)
    j = "cpu,cpuacct/slurm/uid_1000/job_101"
    assert writer.set_quota(job, 0.5) == 2
    assert fx.journal(journal) == [  # period first: the quota is read against it
        (f"{j}/cpu.cfs_period_us", b"100000"),
        (f"{j}/cpu.cfs_quota_us", b"50000"),
    ]
    assert writer.read_quota(job) == 0.5
    del journal[:]
    assert writer.set_quota(job, None) == 1
    assert fx.journal(journal) == [(f"{j}/cpu.cfs_quota_us", b"-1")]
    assert writer.coda_dirs() == []
    assert fx.cg(j).is_dir()


def test_quota_v1_multi_slurmd_uses_the_coda_dir(tmp_path: Path) -> None:
    fx = build_v1_multi_slurmd(tmp_path)
    layout, job = _v1_job(fx, 7)
    writer, journal = _quota_writer(fx, layout)
    writer.set_quota(job, 0.25)
    assert fx.journal(journal) == [
        ("cpu/coda/job_7/cpu.cfs_quota_us", b"25000"),
        ("cpu/coda/job_7/tasks", b"700"),
        ("cpu/coda/job_7/tasks", b"701"),
    ]


def test_quota_permission_denied_names_the_file(tmp_path: Path) -> None:
    fx = build_v2(tmp_path, cpu_delegated=False)
    layout = discover_layout(fx.root)
    writer, _ = _quota_writer(fx, layout)
    path = fx.cg("system.slice/cgroup.subtree_control")
    fx.kernel.fail[path] = errno.EACCES
    with pytest.raises(EnforceError) as err:
        writer.set_quota(list_jobs(layout)[301], 1.0)
    assert (err.value.path, err.value.errno) == (path, errno.EACCES)
    assert str(path) in str(err.value)


# --------------------------------------------------------------------------------------------
# Real kernel: v1 cpuset ordering


def _real_cpuset_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create cpuset cgroups"
    layout = discover_layout(SystemRoot())
    if layout.cpuset_mount != Path("/sys/fs/cgroup/cpuset"):
        return "/sys/fs/cgroup/cpuset is not a cgroup v1 cpuset mount"
    if len(parse_cpulist(Path("/sys/fs/cgroup/cpuset/cpuset.cpus").read_text())) < 2:
        return "needs at least 2 CPUs in the root cpuset"
    return None


def _cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


@pytest.fixture
def real_job_cgroup() -> Iterator[tuple[CgroupJob, subprocess.Popen[bytes]]]:
    """coda-test-<pid>/job_1/step_0 in the real cpuset hierarchy with a ``sleep`` in step_0."""
    top = Path(f"/sys/fs/cgroup/cpuset/coda-test-{os.getpid()}")
    dirs = [top, top / "job_1", top / "job_1/step_0"]
    cpus = parse_cpulist(Path("/sys/fs/cgroup/cpuset/cpuset.cpus").read_text())
    two = frozenset(sorted(cpus)[:2])
    child: subprocess.Popen[bytes] | None = None
    try:
        for d in dirs:
            d.mkdir()
            # A new v1 cpuset starts with no CPUs and no memory nodes; mems before any task.
            (d / "cpuset.mems").write_text((d.parent / "cpuset.mems").read_text())
            (d / "cpuset.cpus").write_text(format_cpulist(two))
        child = subprocess.Popen(["sleep", "30"])
        (dirs[2] / "tasks").write_text(str(child.pid))
        step = CgroupStep(1, "0", dirs[2], two, (child.pid,))
        yield CgroupJob(1, None, dirs[1], two, "0", (step,), (child.pid,)), child
    finally:
        if child is not None:
            child.kill()
            child.wait()
        for d in reversed(dirs):
            for _ in range(50):  # the killed task leaves the cgroup asynchronously
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    time.sleep(0.05)


@pytest.mark.skipif(_real_cpuset_missing() is not None, reason=str(_real_cpuset_missing()))
def test_real_v1_cpuset_shrink_and_restore(
    real_job_cgroup: tuple[CgroupJob, subprocess.Popen[bytes]],
) -> None:
    job, child = real_job_cgroup
    lo, hi = sorted(job.cpus)
    layout = dataclasses.replace(discover_layout(SystemRoot()), version=1)
    journal: list[tuple[Path, bytes]] = []
    writer = CpusetWriter(layout, journal=journal)
    snap = writer.snapshot(job)
    assert snap.cpus == {".": format_cpulist(job.cpus), "step_0": format_cpulist(job.cpus)}

    # The rule the writer follows, on the real kernel: a parent cannot drop a child's CPUs.
    with pytest.raises(OSError) as parent_first:
        cgroups.write_cgroup_file(job.path / "cpuset.cpus", str(lo).encode())
    assert parent_first.value.errno == errno.EBUSY

    writer.shrink(job, {lo})
    assert [p.name for p, _ in journal] == ["cpuset.cpus", "cpuset.cpus"]
    assert [p.parent for p, _ in journal] == [job.path / "step_0", job.path]
    assert _cpus_allowed(child.pid) == str(lo)

    # ... and a child cannot get CPUs its parent lacks.
    with pytest.raises(OSError) as child_first:
        cgroups.write_cgroup_file(
            job.path / "step_0/cpuset.cpus", format_cpulist(job.cpus).encode()
        )
    assert child_first.value.errno == errno.EACCES

    # The task pins itself to what it sees while shrunk (as an OpenMP runtime would): widening
    # the cpuset alone leaves it there; restore puts back the mask from the snapshot.
    os.sched_setaffinity(child.pid, {lo})
    del journal[:]
    writer.restore(job, snap)
    assert [p.parent for p, _ in journal] == [job.path, job.path / "step_0"]
    assert _cpus_allowed(child.pid) == format_cpulist({lo, hi})
    assert writer.shrink(job, job.cpus) == 0


@pytest.mark.skipif(_real_cpuset_missing() is not None, reason=str(_real_cpuset_missing()))
def test_real_cgroupfs_link_count_lets_the_cache_see_a_new_step(
    real_job_cgroup: tuple[CgroupJob, subprocess.Popen[bytes]],
) -> None:
    # SubdirCache trusts kernfs's st_nlink (2 + subdirectories) to skip listing a job's
    # directories; on the real cgroupfs a step made or removed must change it.
    job, _ = real_job_cgroup
    cache = cgroups.SubdirCache()
    where = str(job.path)
    assert cache.subdirs(where) == ["step_0"]
    step_1 = job.path / "step_1"
    step_1.mkdir()
    try:
        assert cache.subdirs(where) == ["step_0", "step_1"]
    finally:
        step_1.rmdir()
    assert cache.subdirs(where) == ["step_0"]
