"""The monitor's per-tick counter reads (resctrl.MbmCounters: paths joined once, os.open /
os.read) read what read_mbm reads, and the paths kept between ticks never go stale: a
group removed and made again, a job moved to another control group, a domain missing.

The cost itself is measured in bench/bench_node_tick.py, not here (docs/benchmarks.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from coda_node.enforce.mongroups import JobMonitor
from coda_node.system.resctrl import MbmCounters, MbmReading, discover, read_mbm
from tests.node import resctrl_fixtures
from tests.node.resctrl_fixtures import FakeResctrl
from tests.node.test_mbm import JOBS, Rig

U64_MAX = 2**64 - 1

# (domain 0, domain 1) file contents as the kernel may show them; None: the file is absent.
CONTENTS = [
    ("0\n", "123456789\n"),
    (f"{U64_MAX}\n", "1\n"),
    ("Unavailable\n", "Error\n"),  # fs/resctrl/ctrlmondata.c, rdtgroup_mondata_show
    ("Unassigned\n", "42\n"),  # mbm_event mode, no counter assigned
    ("", " 7 \n"),  # empty; stray whitespace
    ("12abc\n", "-\n"),  # not a number
    (None, "5\n"),  # event file missing
]

GROUPS = [("", None), ("coda_mb50", None), ("", "coda_j1"), ("coda_mb50", "coda_j2")]

EVENT_SETS = [
    ("mbm_total_bytes",),
    ("mbm_local_bytes",),
    ("mbm_total_bytes", "mbm_local_bytes", "llc_occupancy"),
]


def _group_dir(fake: FakeResctrl, ctrl: str, mon: str | None) -> Path:
    d = fake.path / ctrl if ctrl else fake.path
    return d / "mon_groups" / mon if mon else d


@pytest.mark.parametrize("events", EVENT_SETS)
def test_counters_read_exactly_what_read_mbm_reads(tmp_path: Path, events: tuple[str, ...]) -> None:
    fake = resctrl_fixtures.build(tmp_path, "full")
    control = fake.control()
    control.ensure_group("coda_mb50")
    control.ensure_mon_group("", "coda_j1")
    control.ensure_mon_group("coda_mb50", "coda_j2")
    info = control.info
    for ctrl, mon in GROUPS:
        counters = MbmCounters(fake.root, info, ctrl, mon, events=events)
        gdir = _group_dir(fake, ctrl, mon)
        for k, pair in enumerate(CONTENTS):
            for domain, text in enumerate(pair):
                for event in resctrl_fixtures.ALL_EVENTS:
                    f = gdir / "mon_data" / f"mon_L3_{domain:02d}" / event
                    if text is None:
                        f.unlink(missing_ok=True)
                    else:
                        f.write_text(text)
            t_s = 100.0 + k
            new = counters.read(t_s)
            old = read_mbm(fake.root, info, ctrl, mon, clock=lambda t=t_s: t, events=events)
            assert new == old, (ctrl, mon, pair)
            assert len(new) == 2 and all(r.group_ino == gdir.stat().st_ino for r in new)
    # A value the test can see, not just "both sides agree": the last table row, domain 1.
    last = MbmCounters(fake.root, info, "", "coda_j1", events=("mbm_total_bytes",)).read(9.0)
    assert last == (
        MbmReading("mon_groups/coda_j1", 0, None, None, None, 9.0, last[0].group_ino),
        MbmReading("mon_groups/coda_j1", 1, 5, None, None, 9.0, last[0].group_ino),
    )


def test_counters_of_a_group_that_is_not_there_read_as_nothing(tmp_path: Path) -> None:
    fake = resctrl_fixtures.build(tmp_path, "full")
    info = fake.control().info
    counters = MbmCounters(fake.root, info, "", "coda_j9", events=("mbm_total_bytes",))
    assert counters.read(1.0) == () == read_mbm(fake.root, info, "", "coda_j9", clock=lambda: 1.0)
    # Made after the paths were joined: read from then on.
    fake.control().ensure_mon_group("", "coda_j9")
    fake.set_counter("mon_groups/coda_j9", 1, "mbm_total_bytes", 64)
    assert [r.mbm_total_bytes for r in counters.read(2.0)] == [0, 64]


def test_counters_on_a_node_without_monitoring_read_as_nothing(tmp_path: Path) -> None:
    fake = resctrl_fixtures.build(tmp_path, "cat_only")
    info = discover(fake.root)
    counters = MbmCounters(fake.root, info, events=("mbm_total_bytes",))
    assert counters.read(1.0) == () == read_mbm(fake.root, info, clock=lambda: 1.0)


def test_a_group_removed_and_made_again_behind_the_monitors_back_gives_no_false_rate(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.add_bytes("mon_groups/coda_j1", 1_000, 1_000)
    rig.monitor.sample(1.0)
    assert rig.monitor.rate(1) == 2_000.0
    gdir = rig.fake.path / "mon_groups/coda_j1"
    # Keep the old directory's inode allocated while the new one is made, as kernfs never
    # hands a just-freed inode number to the next group; ext4 would.
    held = os.open(gdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rig.fake.rmdir(gdir)
        rig.fake.mkdir(gdir)
    finally:
        os.close(held)
    # The new RMID's counters are above the old one's (it was another group's before):
    # read across the two groups, this would be a rate of ~2e6 bytes/s, not "unknown".
    for domain in (0, 1):
        rig.fake.set_counter("mon_groups/coda_j1", domain, "mbm_total_bytes", 1_000_000)
    rig.monitor.sample(2.0)
    assert rig.monitor.rate(1) is None
    assert rig.monitor.rate(2) == 0.0
    # The same paths read the new group from now on.
    rig.add_bytes("mon_groups/coda_j1", 300, 200)
    rig.monitor.sample(3.0)
    assert rig.monitor.rate(1) == 500.0


def test_a_group_removed_behind_the_monitors_back_is_made_again_and_read(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.monitor.sample(1.0)
    rig.fake.rmdir(rig.fake.path / "mon_groups/coda_j2")
    rig.monitor.sample(2.0)
    assert rig.monitor.rate(2) is None
    rig.sync(2.5)  # sees the group gone: makes it again, moves the threads in, reads it
    assert rig.tasks("mon_groups/coda_j2") == set(JOBS[2])
    rig.add_bytes("mon_groups/coda_j2", 40, 60)
    rig.monitor.sample(3.5)
    assert rig.monitor.rate(2) == 100.0


def test_a_moved_job_is_read_under_its_new_parent_not_the_old_path(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.monitor.sample(1.0)
    rig.throttle(3, "coda_mb30")
    rig.sync(1.5)
    # A directory left at the old path with counters running (another tool's, or ours
    # if a kept path were used): the monitor must not read it.
    rig.control.ensure_mon_group("", "coda_j3")
    rig.add_bytes("mon_groups/coda_j3", 9_999, 9_999)
    rig.add_bytes("coda_mb30/mon_groups/coda_j3", 10, 20)
    rig.monitor.sample(2.5)
    assert rig.monitor.rate(3) == 30.0
    assert rig.monitor.monitored()[3] == "coda_mb30/mon_groups/coda_j3"


def test_a_missing_domain_gives_no_rate_rather_than_half_of_one(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.sync(0.0)
    rig.monitor.sample(1.0)
    mon_l3_01 = rig.fake.path / "mon_groups/coda_j1/mon_data/mon_L3_01"
    saved = {f.name: f.read_text() for f in mon_l3_01.iterdir()}
    # The kernel removes mon_L3_<id> when the domain's last CPU goes offline.
    shutil.rmtree(mon_l3_01)
    now = int(rig.fake.text("mon_groups/coda_j1/mon_data/mon_L3_00/mbm_total_bytes"))
    rig.fake.set_counter("mon_groups/coda_j1", 0, "mbm_total_bytes", now + 800)
    rig.monitor.sample(2.0)
    assert rig.monitor.rate(1) is None  # not 800 B/s: domain 1's traffic is unknown
    events = ("mbm_total_bytes",)
    new = MbmCounters(rig.fake.root, rig.monitor.info, "", "coda_j1", events=events).read(2.0)
    assert [r.mbm_total_bytes for r in new] == [now + 800, None]
    assert new == read_mbm(
        rig.fake.root, rig.monitor.info, "", "coda_j1", clock=lambda: 2.0, events=events
    )
    # Back online: the first reading is the new base, the next a rate again.
    mon_l3_01.mkdir()
    for name, text in saved.items():
        (mon_l3_01 / name).write_text(text)
    rig.monitor.sample(3.0)
    assert rig.monitor.rate(1) is None
    rig.add_bytes("mon_groups/coda_j1", 100, 50)
    rig.monitor.sample(4.0)
    assert rig.monitor.rate(1) == 150.0


def test_monitor_started_on_a_one_domain_node_reads_one_domain(tmp_path: Path) -> None:
    fake = resctrl_fixtures.build(tmp_path, "full", domains=(0,))
    monitor = JobMonitor(fake.root, fake.control())
    fake.live_pids.add(5001)
    fake.write(fake.path / "tasks", b"5001\n")
    monitor.sync(0.0, [1], lambda j: "", lambda j: [5001])
    fake.set_counter("mon_groups/coda_j1", 0, "mbm_total_bytes", 640)
    monitor.sample(2.0)
    assert monitor.rate(1) == 320.0
