"""coda_node.system.resctrl against fixture trees laid out like the kernel's resctrl mount."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import shutil
from pathlib import Path

import pytest

from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import (
    MBA_MAX_MBPS,
    NOT_MOUNTED,
    AssignResult,
    CacheAllocInfo,
    MbmRate,
    MbmReading,
    MemBwAllocInfo,
    OutOfClosids,
    OutOfIds,
    OutOfRmids,
    ResctrlControl,
    ResctrlError,
    Write,
    discover,
    group_mem_bw_bytes_per_s,
    l3_mask,
    mb_percent_steps,
    mb_value,
    parse_schemata,
    read_mbm,
    validate_l3_mask,
)
from tests.node.resctrl_fixtures import VARIANTS, FakeResctrl, build

# -- discovery ---------------------------------------------------------------------------

NO_MB = "no memory-bandwidth allocation (info/MB missing"
NO_L3_MON = "no memory-bandwidth monitoring (info/L3_MON missing"
NO_MBM = "L3_MON lists neither mbm_total_bytes nor mbm_local_bytes"
CDP = "split into L3CODE/L3DATA (resctrl mounted with -o cdp)"

# variant: (l3, mb, mba_mbps, mbm, num_closids, l3_reason, mb_reason, mbm_reason)
DISCOVERY = {
    "full": (True, True, False, True, 8, None, None, None),
    "nomb": (True, False, False, True, 16, None, NO_MB, None),
    "nombm": (True, True, False, False, 8, None, None, NO_MBM),
    "mba_mbps": (True, True, True, True, 8, None, None, None),
    "cat_only": (True, False, False, False, 16, None, NO_MB, NO_L3_MON),
    "cdp": (False, True, False, True, 8, CDP, None, None),
}


def _has(reason: str | None, expected: str | None) -> bool:
    if expected is None:
        return reason is None
    return reason is not None and expected in reason


@pytest.mark.parametrize("variant", sorted(DISCOVERY))
def test_discover_variants(tmp_path: Path, variant: str) -> None:
    fake = build(tmp_path, variant)
    info = discover(fake.root)
    l3, mb, mbps, mbm, closids, l3_reason, mb_reason, mbm_reason = DISCOVERY[variant]
    assert info.usable and info.mounted and info.reason is None
    assert info.mount_point == "/sys/fs/resctrl"
    assert (info.l3 is not None, info.mb is not None, info.mbm) == (l3, mb, mbm)
    assert info.num_closids == closids
    assert info.max_ctrl_groups == closids - 1
    assert _has(info.l3_reason, l3_reason), info.l3_reason
    assert _has(info.mb_reason, mb_reason), info.mb_reason
    assert _has(info.mbm_reason, mbm_reason), info.mbm_reason
    if info.l3 is not None:
        assert info.l3 == CacheAllocInfo(0xFFFFF, 1, 16, 0, False, (0, 1))
        assert info.l3.cbm_bits == 20
    if info.mb is not None:
        assert info.mb == MemBwAllocInfo(10, 10, 8, True, mbps, "max", (0, 1))
    if variant in ("full", "nomb", "mba_mbps", "cdp"):
        assert info.mon is not None
        assert info.mon.num_rmids == 224
        assert info.mon.mon_features == ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
        assert info.mon.domain_ids == (0, 1)


def test_every_fixture_variant_is_covered() -> None:
    assert set(DISCOVERY) | {"unmounted"} == set(VARIANTS)


def test_discover_not_mounted(tmp_path: Path) -> None:
    fake = build(tmp_path, "unmounted")
    info = discover(fake.root)
    assert not info.mounted and not info.usable and not info.can_allocate
    assert info.reason == NOT_MOUNTED
    assert info.reason == "resctrl not mounted (Intel RDT absent or not enabled)"
    assert read_mbm(fake.root, info) == ()
    with pytest.raises(ResctrlError, match="resctrl not usable: resctrl not mounted"):
        ResctrlControl(fake.root, info)


def test_discover_mounted_without_info_dir(tmp_path: Path) -> None:
    fake = build(tmp_path, "full")
    shutil.rmtree(fake.path / "info")
    info = discover(fake.root)
    assert info.mounted and not info.usable
    assert info.reason == "resctrl is mounted at /sys/fs/resctrl but has no info/ directory"


def test_discover_unreadable_value_is_a_state(tmp_path: Path) -> None:
    fake = build(tmp_path, "full")
    (fake.path / "info/MB/bandwidth_gran").write_text("ten\n")
    info = discover(fake.root)
    assert info.usable and info.l3 is not None and info.mb is None
    assert info.mb_reason is not None and info.mb_reason.startswith("cannot read info/MB")


def test_discover_without_proc_mounts(tmp_path: Path) -> None:
    info = discover(SystemRoot(tmp_path))
    assert not info.mounted
    assert info.reason is not None and info.reason.startswith("cannot read /proc/self/mounts")


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "L3:0=fffff;1=fffff\nMB:0=100;1=100\n",
            {"L3": {0: 0xFFFFF, 1: 0xFFFFF}, "MB": {0: 100, 1: 100}},
        ),
        (
            "L3:0=00ff0;1=fffff\nMB:0= 50;1=100\n",
            {"L3": {0: 0xFF0, 1: 0xFFFFF}, "MB": {0: 50, 1: 100}},
        ),
        (
            "L3CODE:0=fffff\n    MB:0=4294967295\n",
            {"L3CODE": {0: 0xFFFFF}, "MB": {0: MBA_MAX_MBPS}},
        ),
        ("L3:uninitialized\nMB:2=20;\n", {"MB": {2: 20}}),
        ("", {}),
    ],
)
def test_parse_schemata(text: str, expected: dict[str, dict[int, int]]) -> None:
    assert parse_schemata(text) == expected


# -- pure helpers ------------------------------------------------------------------------

PERCENT = MemBwAllocInfo(10, 10, 8, True, False, "max", (0, 1))
MBPS = dataclasses.replace(PERCENT, mba_mbps=True)
L3 = CacheAllocInfo(0xFFFFF, 1, 16, 0, False, (0, 1))


@pytest.mark.parametrize(
    "mb,requested,expected",
    [
        (PERCENT, 55, 50),
        (PERCENT, 3, 10),
        (PERCENT, 0, 10),
        (PERCENT, 130, 100),
        (PERCENT, 100, 100),
        (PERCENT, 10, 10),
        (PERCENT, 19, 10),
        (MBPS, 1500, 1500),
        (MBPS, 0, 1),
        (MBPS, 2**40, MBA_MAX_MBPS),
    ],
)
def test_mb_value_rounds_down_and_clamps(mb: MemBwAllocInfo, requested: int, expected: int) -> None:
    assert mb_value(requested, mb) == expected


def test_mb_percent_steps() -> None:
    assert mb_percent_steps(PERCENT) == [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]
    coarse = dataclasses.replace(PERCENT, bandwidth_gran=20, min_bandwidth=20)
    assert mb_percent_steps(coarse) == [100, 80, 60, 40, 20]


@pytest.mark.parametrize(
    "mask,l3,error",
    [
        (0xFF0, L3, None),
        (0xFFFFF, L3, None),
        (0x1, L3, None),
        (0xF0F, L3, "not contiguous"),
        (0x5, L3, "not contiguous"),
        (0xF0F, dataclasses.replace(L3, sparse_masks=True), None),
        (0x1, dataclasses.replace(L3, min_cbm_bits=2), "needs at least 2"),
        (0x3, dataclasses.replace(L3, min_cbm_bits=2), None),
        (0x100000, L3, "outside cbm_mask 0xfffff"),
        (0x1FFFFF, L3, "outside cbm_mask"),
        (0, L3, "empty"),
    ],
)
def test_validate_l3_mask(mask: int, l3: CacheAllocInfo, error: str | None) -> None:
    if error is None:
        validate_l3_mask(mask, l3)
    else:
        with pytest.raises(ValueError, match=error):
            validate_l3_mask(mask, l3)


@pytest.mark.parametrize(
    "ways,from_high,expected",
    [
        (4, True, 0xF0000),
        (4, False, 0xF),
        (20, True, 0xFFFFF),
        (1, True, 0x80000),
        (8, False, 0xFF),
    ],
)
def test_l3_mask(ways: int, from_high: bool, expected: int) -> None:
    assert l3_mask(ways, L3, from_high=from_high) == expected


@pytest.mark.parametrize("ways", [0, 21])
def test_l3_mask_out_of_range(ways: int) -> None:
    with pytest.raises(ValueError, match=r"allows 1\.\.20"):
        l3_mask(ways, L3)


# -- control: schemata -------------------------------------------------------------------


@pytest.fixture
def full(tmp_path: Path) -> FakeResctrl:
    return build(tmp_path, "full")


def test_set_schemata_writes_exact_bytes_once(full: FakeResctrl) -> None:
    ctl = full.control()
    group = ctl.ensure_group("coda_j1")
    assert group == full.path / "coda_j1"
    writes = ctl.set_schemata("coda_j1", mb={0: 55, 1: 55}, l3={0: 0xFF0, 1: 0xFF0})
    assert writes == (
        Write(group / "schemata", b"MB:0=50;1=50\n"),
        Write(group / "schemata", b"L3:0=ff0;1=ff0\n"),
    )
    assert full.writes == [
        ("coda_j1/schemata", b"MB:0=50;1=50\n"),
        ("coda_j1/schemata", b"L3:0=ff0;1=ff0\n"),
    ]
    # The kernel shows the values padded; reading them back must still compare equal.
    assert full.text("coda_j1/schemata") == "L3:0=00ff0;1=00ff0\nMB:0= 50;1= 50\n"
    assert list(ctl.recent_writes) == list(writes)

    assert ctl.set_schemata("coda_j1", mb={0: 50, 1: 59}, l3={0: 0xFF0, 1: 0xFF0}) == ()
    assert len(full.writes) == 2

    assert ctl.set_schemata("coda_j1", mb={0: 50, 1: 30}) == (
        Write(group / "schemata", b"MB:1=30\n"),
    )
    assert full.text("coda_j1/schemata") == "L3:0=00ff0;1=00ff0\nMB:0= 50;1= 30\n"
    assert full.text("schemata") == "L3:0=fffff;1=fffff\nMB:0=100;1=100\n"  # root untouched


def test_set_schemata_mba_mbps(tmp_path: Path) -> None:
    fake = build(tmp_path, "mba_mbps")
    ctl = fake.control()
    ctl.ensure_group("coda_j1")
    assert fake.text("coda_j1/schemata").endswith("MB:0=4294967295;1=4294967295\n")
    ctl.set_schemata("coda_j1", mb={0: 1500, 1: 1500})
    assert fake.writes == [("coda_j1/schemata", b"MB:0=1500;1=1500\n")]
    assert ctl.set_schemata("coda_j1", mb={0: 1500, 1: 1500}) == ()


def test_set_schemata_with_cdp_sets_mb_and_refuses_l3(tmp_path: Path) -> None:
    fake = build(tmp_path, "cdp")
    ctl = fake.control()
    ctl.ensure_group("coda_j1")
    ctl.set_schemata("coda_j1", mb={0: 40, 1: 40})
    assert fake.text("coda_j1/schemata").endswith("    MB:0= 40;1= 40\n")
    with pytest.raises(ResctrlError, match="L3CODE/L3DATA"):
        ctl.set_schemata("coda_j1", l3={0: 0xFF})


@pytest.mark.parametrize(
    "mb,l3,error",
    [
        ({0: 50}, {0: 0xF0F}, "not contiguous"),
        ({0: 50}, {0: 0x100000}, "outside cbm_mask"),
        ({0: 50, 2: 50}, None, r"MB domain\(s\) \[2\] do not exist here; domains are \[0, 1\]"),
        (None, {7: 0xFF}, r"L3 domain\(s\) \[7\]"),
    ],
)
def test_set_schemata_validates_before_writing(
    full: FakeResctrl, mb: dict[int, int] | None, l3: dict[int, int] | None, error: str
) -> None:
    ctl = full.control()
    ctl.ensure_group("coda_j1")
    with pytest.raises(ValueError, match=error):
        ctl.set_schemata("coda_j1", mb=mb, l3=l3)
    assert full.writes == []


def test_set_schemata_without_mb_says_why(tmp_path: Path) -> None:
    fake = build(tmp_path, "nomb")
    ctl = fake.control()
    ctl.ensure_group("coda_j1")
    with pytest.raises(ResctrlError, match="cannot set MB for coda_j1: no memory-bandwidth"):
        ctl.set_schemata("coda_j1", mb={0: 50})


def test_set_schemata_on_missing_group(full: FakeResctrl) -> None:
    with pytest.raises(ResctrlError, match="resctrl group coda_gone does not exist") as exc:
        full.control().set_schemata("coda_gone", mb={0: 50})
    assert exc.value.errno_code == errno.ENOENT


def test_kernel_rejection_carries_last_cmd_status(full: FakeResctrl) -> None:
    # Discovery from another CPU model (5 % steps) lets 5 % through our own checks; the
    # kernel here says no, and the error must carry its words.
    info = discover(full.root)
    assert info.mb is not None
    other_cpu = dataclasses.replace(info.mb, min_bandwidth=5, bandwidth_gran=5)
    stale = dataclasses.replace(info, mb=other_cpu)
    ctl = full.control(stale)
    ctl.ensure_group("coda_j1")
    with pytest.raises(ResctrlError) as exc:
        ctl.set_schemata("coda_j1", mb={0: 5})
    err = exc.value
    assert str(err) == (
        f"writing b'MB:0=5\\n' to {full.path}/coda_j1/schemata failed: EINVAL "
        "(Invalid argument); kernel: MB value 5 out of range [10,100]"
    )
    assert err.errno_code == errno.EINVAL
    assert err.last_cmd_status == "MB value 5 out of range [10,100]"
    assert err.path == full.path / "coda_j1/schemata"
    assert list(ctl.recent_writes) == []  # refused writes are not recorded as written


# -- control: groups ---------------------------------------------------------------------


def test_out_of_closids(full: FakeResctrl) -> None:
    ctl = full.control()
    assert ctl.info.max_ctrl_groups == 7  # MB has 8 CLOSIDs, CLOSID 0 is the default group
    for i in range(7):
        ctl.ensure_group(f"coda_j{i}")
    ctl.ensure_group("coda_j0")  # already there: fine, no CLOSID used
    with pytest.raises(OutOfClosids) as exc:
        ctl.ensure_group("coda_j7")
    assert isinstance(exc.value, OutOfIds)
    assert exc.value.errno_code == errno.ENOSPC
    assert "ENOSPC" in str(exc.value) and "kernel: Out of CLOSIDs" in str(exc.value)
    assert not (full.path / "coda_j7").exists()
    assert ctl.remove_group("coda_j0")
    ctl.ensure_group("coda_j7")


def test_out_of_rmids(tmp_path: Path) -> None:
    fake = build(tmp_path, "full", num_rmids=3)  # RMID 0 is the default group's
    ctl = fake.control()
    ctl.ensure_group("coda_j1")
    assert ctl.ensure_mon_group("coda_j1", "coda_m1") == fake.path / "coda_j1/mon_groups/coda_m1"
    with pytest.raises(OutOfRmids, match="kernel: Out of RMIDs"):
        ctl.ensure_mon_group("", "coda_m2")
    with pytest.raises(OutOfRmids, match="kernel: Out of RMIDs"):
        ctl.ensure_group("coda_j2")  # CLOSIDs are left, RMIDs are not
    assert ctl.remove_mon_group("coda_j1", "coda_m1")
    assert not ctl.remove_mon_group("coda_j1", "coda_m1")
    ctl.ensure_mon_group("", "coda_m2")
    assert ctl.list_coda_mon_groups() == ["coda_m2"]


def test_mon_group_needs_monitoring(tmp_path: Path) -> None:
    fake = build(tmp_path, "cat_only")
    ctl = fake.control()
    ctl.ensure_group("coda_j1")
    with pytest.raises(ResctrlError, match="info/L3_MON missing"):
        ctl.ensure_mon_group("coda_j1", "coda_m1")


@pytest.mark.parametrize("name", ["job1", "coda_", "coda_a/b", "coda_a b", "info", ""])
def test_group_names_are_checked(full: FakeResctrl, name: str) -> None:
    ctl = full.control()
    with pytest.raises(ValueError, match="must start with 'coda_'"):
        ctl.ensure_group(name)
    with pytest.raises(ValueError, match="must start with 'coda_'"):
        ctl.remove_group(name)


def test_crash_cleanup_lists_and_removes_only_coda_groups(full: FakeResctrl) -> None:
    ctl = full.control()
    full.mkdir(full.path / "batch_other")  # someone else's group
    for name in ("coda_b", "coda_a"):
        ctl.ensure_group(name)
    ctl.assign_tasks("coda_a", [1000])
    ctl.ensure_mon_group("coda_a", "coda_m1")
    ctl.ensure_mon_group("", "coda_m9")
    assert ctl.list_coda_groups() == ["coda_a", "coda_b"]
    assert ctl.list_coda_mon_groups("coda_a") == ["coda_m1"]
    assert ctl.list_coda_mon_groups() == ["coda_m9"]

    assert [ctl.remove_group(g) for g in ctl.list_coda_groups()] == [True, True]
    assert ctl.remove_mon_group("", "coda_m9")
    assert ctl.list_coda_groups() == [] and ctl.list_coda_mon_groups() == []
    assert (full.path / "batch_other").is_dir()
    assert 1000 in ctl.read_tasks("")  # rmdir moved the task back to the default group
    assert not ctl.remove_group("coda_a")  # already gone: fine


# -- control: tasks ----------------------------------------------------------------------


def test_assign_tasks_counts_exited_tasks(full: FakeResctrl) -> None:
    ctl = full.control()
    ctl.ensure_group("coda_j1")
    full.exit_task(1002)
    result = ctl.assign_tasks("coda_j1", [1000, 1001, 1002, 1000])
    assert result == AssignResult(moved=2, gone=1, already=0)
    assert full.writes == [
        ("coda_j1/tasks", b"1000\n"),
        ("coda_j1/tasks", b"1001\n"),
        ("coda_j1/tasks", b"1002\n"),
    ]
    assert full.text("coda_j1/tasks") == "1000\n1001\n"
    assert ctl.read_tasks("") == {1, 2, 812, 4242}

    assert ctl.assign_tasks("coda_j1", [1000, 1001]) == AssignResult(0, 0, 2)
    assert len(full.writes) == 3


def test_release_tasks_moves_only_members_back(full: FakeResctrl) -> None:
    ctl = full.control()
    ctl.ensure_group("coda_j1")
    ctl.assign_tasks("coda_j1", [1000, 1001])
    full.writes.clear()
    assert ctl.release_tasks("coda_j1", [1000, 4242]) == AssignResult(moved=1, gone=0, already=1)
    assert full.writes == [("tasks", b"1000\n")]
    assert ctl.read_tasks("coda_j1") == {1001}
    assert 1000 in ctl.read_tasks("")


def test_assign_mon_tasks_follows_the_parent_rule(full: FakeResctrl) -> None:
    ctl = full.control()
    ctl.ensure_group("coda_j1")
    ctl.ensure_mon_group("coda_j1", "coda_m1")
    ctl.assign_tasks("coda_j1", [1000])
    assert ctl.assign_mon_tasks("coda_j1", "coda_m1", [1000]) == AssignResult(1, 0, 0)
    assert ctl.read_tasks("coda_j1", "coda_m1") == {1000}
    with pytest.raises(ResctrlError, match="kernel: Can't move task to different control group"):
        ctl.assign_mon_tasks("coda_j1", "coda_m1", [4242])


def test_other_task_errors_are_raised(full: FakeResctrl) -> None:
    def refuse(path: Path, data: bytes) -> None:
        (full.path / "info/last_cmd_status").write_text("No permission to move task 1000\n")
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))

    ctl = ResctrlControl(full.root, discover(full.root), mkdir=full.mkdir, write=refuse)
    ctl.ensure_group("coda_j1")
    with pytest.raises(ResctrlError, match=r"EPERM .*kernel: No permission to move task 1000"):
        ctl.assign_tasks("coda_j1", [1000])


def test_locked_holds_the_resctrl_flock(full: FakeResctrl) -> None:
    ctl = full.control()
    fd = os.open(full.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with ctl.locked(), pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    finally:
        os.close(fd)


# -- monitoring --------------------------------------------------------------------------


def test_read_mbm_per_domain(full: FakeResctrl) -> None:
    ctl = full.control()
    ctl.ensure_group("coda_j1")
    full.set_counter("coda_j1", 0, "mbm_total_bytes", 123_456_789)
    full.set_counter("coda_j1", 0, "mbm_local_bytes", 100_000_000)
    full.set_counter("coda_j1", 0, "llc_occupancy", 3_145_728)
    full.set_counter("coda_j1", 1, "mbm_total_bytes", "Unavailable")
    full.set_counter("coda_j1", 1, "mbm_local_bytes", "Error")
    clock = iter([10.0, 10.5])
    readings = read_mbm(full.root, ctl.info, "coda_j1", clock=lambda: next(clock))
    ino = (full.path / "coda_j1").stat().st_ino
    assert readings == (
        MbmReading("coda_j1", 0, 123_456_789, 100_000_000, 3_145_728, 10.0, ino),
        MbmReading("coda_j1", 1, None, None, 0, 10.5, ino),
    )


def test_read_mbm_mon_group_and_missing_group(full: FakeResctrl) -> None:
    ctl = full.control()
    ctl.ensure_mon_group("", "coda_m1")
    full.set_counter("mon_groups/coda_m1", 1, "mbm_total_bytes", 42)
    readings = read_mbm(full.root, ctl.info, "", "coda_m1", clock=lambda: 1.0)
    assert [(r.group, r.domain_id, r.mbm_total_bytes) for r in readings] == [
        ("mon_groups/coda_m1", 0, 0),
        ("mon_groups/coda_m1", 1, 42),
    ]
    assert read_mbm(full.root, ctl.info, "coda_gone") == ()


def test_read_mbm_without_mbm_events(tmp_path: Path) -> None:
    fake = build(tmp_path, "nombm")
    info = discover(fake.root)
    (reading, _) = read_mbm(fake.root, info, clock=lambda: 1.0)
    assert (reading.mbm_total_bytes, reading.mbm_local_bytes, reading.llc_occupancy_bytes) == (
        None,
        None,
        0,
    )


def _r(
    total: int | None, local: int | None, t_s: float, ino: int | None = 7, domain: int = 0
) -> MbmReading:
    return MbmReading("coda_j1", domain, total, local, None, t_s, ino)


@pytest.mark.parametrize(
    "prev,cur,expected",
    [
        # steady: 2 GB in 2 s
        (_r(1_000, 500, 10.0), _r(2_000_001_000, 1_000_000_500, 12.0), (1e9, 5e8)),
        # total reset (RMID re-used / counters cleared): unknown, not negative or huge
        (_r(9_000_000, 500, 10.0), _r(1_000, 600, 11.0), (None, 100.0)),
        # the kernel said "Unavailable" on one side
        (_r(None, 500, 10.0), _r(1_000, 700, 11.0), (None, 200.0)),
        (_r(1_000, 500, 10.0), _r(None, None, 11.0), (None, None)),
        # no change is a real zero
        (_r(1_000, 500, 10.0), _r(1_000, 500, 11.0), (0.0, 0.0)),
    ],
)
def test_mbm_rate(
    prev: MbmReading, cur: MbmReading, expected: tuple[float | None, float | None]
) -> None:
    rate = MbmRate.between(prev, cur)
    assert rate is not None
    assert (rate.mbm_total_bytes_per_s, rate.mbm_local_bytes_per_s) == expected
    assert rate.interval_s == cur.monotonic_s - prev.monotonic_s


@pytest.mark.parametrize(
    "prev,cur",
    [
        (_r(1_000, 500, 10.0, ino=7), _r(5_000_000, 900, 11.0, ino=8)),  # group re-created
        (_r(1_000, 500, 10.0), _r(2_000, 600, 10.0)),  # no time passed
        (_r(1_000, 500, 11.0), _r(2_000, 600, 10.0)),  # out of order
    ],
)
def test_mbm_rate_not_comparable(prev: MbmReading, cur: MbmReading) -> None:
    assert MbmRate.between(prev, cur) is None


def test_mbm_rate_refuses_different_counters() -> None:
    with pytest.raises(ValueError, match="different counters"):
        MbmRate.between(_r(1, 1, 1.0, domain=0), _r(2, 2, 2.0, domain=1))


def test_group_mem_bw_sums_domains() -> None:
    prev = [_r(0, 0, 10.0, domain=0), _r(0, 0, 10.0, domain=1)]
    cur = [_r(3_000, 1_000, 11.0, domain=0), _r(1_000, 1_000, 11.0, domain=1)]
    assert group_mem_bw_bytes_per_s(prev, cur) == 4_000.0
    assert group_mem_bw_bytes_per_s(prev, cur, local=True) == 2_000.0
    reset = [cur[0], _r(None, 0, 11.0, domain=1)]
    assert group_mem_bw_bytes_per_s(prev, reset) is None  # a partial sum would look like a drop
    assert group_mem_bw_bytes_per_s(prev[:1], cur) is None
    assert group_mem_bw_bytes_per_s(prev, []) is None


# -- real hardware -----------------------------------------------------------------------


@pytest.mark.rdt
def test_discover_real_resctrl() -> None:
    root = SystemRoot(Path("/"))
    info = discover(root)
    if not info.mounted:
        pytest.skip("resctrl not mounted here")
    assert info.usable, info.reason
    assert info.l3 is not None or info.mb is not None or info.mon is not None
    if info.can_allocate:
        assert info.num_closids >= 2
    if info.mb is not None:
        assert mb_percent_steps(info.mb)[0] == 100
    if info.mbm:
        readings = read_mbm(root, info)
        assert readings and all(r.group == "" for r in readings)
