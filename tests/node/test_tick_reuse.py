"""What a steady tick does not read or encode again, and that what it keeps never hides a change:
the operator's limits file (parsed again only when its stat changes), the state file's records
of changes (encoded again only when one changes, in place too), and the bandwidth monitor's
thread re-read (the parent group's tasks read only when a thread is not yet in the job's group)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from coda_node.enforce import state
from coda_node.enforce.state import (
    LIMITS_FILE,
    JobChanges,
    Limit,
    LimitsFile,
    NodeState,
    StateError,
    StateFile,
    save_limits,
)
from tests.node.node_fixtures import build_node, mknod_reason
from tests.node.test_mbm import JOBS, Rig


def _settled_clock() -> float:
    """A clock for which every file written in the test is older than LIMITS_SETTLED_S."""
    return time.time() + 10 * state.LIMITS_SETTLED_S


def _age(path: Path, seconds: float) -> None:
    """Set the file's mtime ``seconds`` into the past (its ctime becomes now)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


# -- the limits file -------------------------------------------------------------------------


def test_a_settled_limits_file_is_parsed_once_while_its_stat_stays(tmp_path: Path) -> None:
    save_limits(tmp_path, {7: Limit(cores=2, reason="op")})
    limits = LimitsFile(tmp_path, clock=_settled_clock)
    seen = [limits.load() for _ in range(5)]
    assert seen == [{7: Limit(cores=2, reason="op")}] * 5
    assert limits.reads == 1
    # Each caller gets its own dict: one that changes it changes nothing kept.
    seen[0][8] = Limit(cores=1)
    assert limits.load() == {7: Limit(cores=2, reason="op")}


def test_a_young_limits_file_is_read_every_time(tmp_path: Path) -> None:
    save_limits(tmp_path, {7: Limit(cores=2)})
    limits = LimitsFile(tmp_path)  # the real clock: the file was written just now
    for _ in range(3):
        assert limits.load() == {7: Limit(cores=2)}
    assert limits.reads == 3


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({7: Limit(cores=2)}, {7: Limit(cores=3)}),  # the same size
        ({7: Limit(cores=2)}, {}),  # released
        ({7: Limit(cores=2)}, {7: Limit(cores=2), 9: Limit(quota_cores=0.5)}),
    ],
)
def test_a_rewrite_of_a_kept_limits_file_is_seen_at_the_next_load(
    tmp_path: Path, before: dict[int, Limit], after: dict[int, Limit]
) -> None:
    save_limits(tmp_path, before)
    _age(tmp_path / LIMITS_FILE, 60)
    limits = LimitsFile(tmp_path, clock=_settled_clock)
    assert limits.load() == before
    assert limits.load() == before
    assert limits.reads == 1
    save_limits(tmp_path, after)  # what `coda-node limit` / `release` do
    assert limits.load() == after
    assert limits.reads == 2


def test_a_removed_or_broken_limits_file_is_never_served_from_what_was_kept(
    tmp_path: Path,
) -> None:
    save_limits(tmp_path, {7: Limit(cores=2)})
    limits = LimitsFile(tmp_path, clock=_settled_clock)
    assert limits.load() == {7: Limit(cores=2)}
    (tmp_path / LIMITS_FILE).unlink()
    assert limits.load() == {}
    (tmp_path / LIMITS_FILE).write_text("{not json")
    for _ in range(2):
        with pytest.raises(StateError, match="limits ignored"):
            limits.load()


@pytest.mark.skipif(mknod_reason() is not None, reason=str(mknod_reason()))
def test_the_daemon_parses_a_settled_limits_file_once_and_applies_a_new_limit_next_tick(
    tmp_path: Path,
) -> None:
    node = build_node(tmp_path, version=1, cpus=64, gpus=8, jobs=32)
    daemon = node.daemon()
    daemon.limits_file = LimitsFile(node.state_dir, clock=_settled_clock)
    cpu_job = sorted(j for j, job in node.jobs.items() if job.kind == "cpu")[0]
    node.set_limits({cpu_job: Limit(quota_cores=0.5, reason="op")})
    for _ in range(5):
        daemon.tick()
    assert daemon.limits_file.reads == 1
    assert daemon.state.changes[cpu_job].quota_applied == 0.5
    node.set_limits({cpu_job: Limit(quota_cores=0.25, reason="op")})
    daemon.tick()
    assert daemon.limits_file.reads == 2
    assert daemon.state.changes[cpu_job].quota_applied == 0.25


# -- the state file's records of changes -----------------------------------------------------


def _records_encoded(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every value the state file's encoder is handed that holds records of changes."""
    seen: list[object] = []
    inner = state._encode_state

    def encode(value: object) -> str:
        if isinstance(value, dict) and ("changes" in value or "5001" in value):
            seen.append(value)
        return inner(value)

    monkeypatch.setattr(state, "_encode_state", encode)
    return seen


def test_unchanged_records_are_not_encoded_again_and_the_file_still_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = _records_encoded(monkeypatch)
    st = NodeState()
    st.job(5001).quota_original, st.job(5001).quota_applied = None, 0.5
    st.job(5001).quota_active = True
    st.view = {"jobs": [], "sampled_unix_s": 1.0}
    sf = StateFile(tmp_path)
    sf.save(st)
    assert len(encoded) == 1
    for tick in range(3):
        st.view = {"jobs": [{"job_id": 5001}], "sampled_unix_s": 2.0 + tick}
        sf.save(st, durable=False)
    assert len(encoded) == 1
    back = StateFile(tmp_path).load()
    assert back.changes[5001].quota_applied == 0.5 and back.changes[5001].quota_active
    assert back.view["sampled_unix_s"] == 4.0


def test_a_record_changed_in_place_is_saved(tmp_path: Path) -> None:
    """The enforcer adds a new step's original cpuset to the job's record in place
    (enforce.py, ``cpuset_original["cpus"].setdefault``) and saves it before it shrinks the
    step: that save must hold it, or a crash would leave the step shrunk for good."""
    st = NodeState()
    st.job(5001).cpuset_original = {
        "job_id": 5001,
        "cpus": {".": "0-3", "step_0": "0-3"},
        "affinity": {},
    }
    sf = StateFile(tmp_path)
    sf.save(st)
    original = st.changes[5001].cpuset_original
    assert original is not None
    original["cpus"].setdefault("step_1", "0-3")
    original["affinity"].setdefault("4242", "0-3")
    sf.save(st)
    back = StateFile(tmp_path).load().changes[5001].cpuset_original
    assert back == {
        "job_id": 5001,
        "cpus": {".": "0-3", "step_0": "0-3", "step_1": "0-3"},
        "affinity": {"4242": "0-3"},
    }
    st.changes[5001] = JobChanges()  # restored: the record goes
    sf.save(st)
    assert StateFile(tmp_path).load().changes == {}


# -- the bandwidth monitor's thread re-read --------------------------------------------------


def _parent_reads(rig: Rig) -> list[str]:
    """Counts the monitor's reads of a control group's own tasks file (not a MON group's)."""
    calls: list[str] = []
    inner = rig.control.read_tasks

    def read_tasks(ctrl_group: str, mon_group: str | None = None) -> set[int]:
        if mon_group is None:
            calls.append(ctrl_group)
        return inner(ctrl_group, mon_group)

    rig.control.read_tasks = read_tasks  # type: ignore[method-assign]
    return calls


def test_a_re_read_with_every_thread_in_its_group_does_not_read_the_parents_tasks(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, sync_every_s=5.0)
    rig.sync(0.0)
    parent_reads = _parent_reads(rig)
    for t in range(1, 16):  # every job's threads re-read three times
        rig.sync(float(t))
    assert parent_reads == []
    for job_id, tids in JOBS.items():
        assert rig.tasks(f"mon_groups/coda_j{job_id}") == set(tids)


def test_a_new_thread_is_still_moved_in_at_the_jobs_next_re_read(tmp_path: Path) -> None:
    rig = Rig(tmp_path, sync_every_s=5.0)
    rig.sync(0.0)
    parent_reads = _parent_reads(rig)
    rig.threads[2].append(6003)
    rig.spawn(6003)  # in the default group, as every new task starts
    rig.threads[3].append(7002)  # listed by the job's cgroup, but moved elsewhere since
    for t in range(1, 6):
        rig.sync(float(t))
    assert rig.tasks("mon_groups/coda_j2") == {6001, 6002, 6003}
    assert rig.tasks("mon_groups/coda_j3") == {7001}
    assert rig.tasks("mon_groups/coda_j1") == set(JOBS[1])
    assert parent_reads == ["", ""]  # once for each of the two jobs' re-read
    assert rig.monitor.unmonitored == {}


# -- the record of changes and the view ------------------------------------------------------


def test_steady_ticks_rewrite_the_view_and_leave_the_record_of_changes_on_disk_alone(
    tmp_path: Path,
) -> None:
    """The view (for coda-node status) changes every tick and goes to NodeRuntimeDir; the
    record of what the daemon changed goes to disk only when that changes, so a steady
    tick writes nothing to state.json."""
    reason = mknod_reason()
    if reason is not None:
        pytest.skip(reason)
    node = build_node(tmp_path, jobs=8)
    daemon = node.daemon()
    daemon.tick()
    cpu_job = next(j for j, job in node.jobs.items() if not job.gpus)
    node.set_limits({cpu_job: Limit(quota_cores=0.5, reason="test")})
    daemon.tick()
    assert node.journal, "the limit was applied"
    record = node.state_file.stat()
    views = []
    for _ in range(3):
        daemon.tick()
        views.append(node.view()["sampled_unix_s"])
        assert node.state_file.stat().st_ino == record.st_ino  # not replaced
    assert views == sorted(set(views))  # a new view every tick
    on_disk = StateFile(node.state_dir).load()
    assert on_disk.changes[cpu_job].quota_active and on_disk.view == {}
    node.set_limits({})
    daemon.tick()
    assert node.state_file.stat().st_ino != record.st_ino
    assert StateFile(node.state_dir).load().changes == {}


def test_the_write_ahead_is_fsynced_after_a_tick_wrote_the_same_record_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's save writes the record without fsync when a prune changed it; the next
    change's write-ahead must not take that copy for a durable one."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    st = NodeState()
    st.job(5001).quota_active, st.job(5001).quota_applied = True, 0.5
    sf = StateFile(tmp_path, tmp_path / "run")
    sf.save(st, durable=False)
    assert synced == [] and sf.view_path.exists()
    sf.view_path.unlink()
    sf.save(st, view=False)  # the write-ahead: the same record, now fsynced
    assert len(synced) == 2 and not sf.view_path.exists()  # the file, then its directory
    sf.save(st, view=False)  # on disk and synced already: nothing to write
    assert len(synced) == 2


def _write(path: Path, doc: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_the_view_of_an_older_coda_node_in_the_state_file_is_read_where_it_is_the_newer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade: the last run kept its view in state.json, and a restart goes on from
    it. Where both files hold a view the newer is read (a downgrade and back); a view file
    that cannot be read is logged and the state file's view used, never fatal."""
    sf = StateFile(tmp_path / "state", tmp_path / "run")
    old = {"jobs": [{"job_id": 7, "kind": "dnn"}], "sampled_unix_s": 100.0}
    record = {"format": state.FORMAT, "format_version": state.FORMAT_VERSION, "changes": {}}
    _write(sf.path, {**record, "written_unix_s": 100.0, "view": old})
    assert sf.load().view == old
    new = {"jobs": [], "sampled_unix_s": 200.0}
    view_file = {"format": state.VIEW_FORMAT, "format_version": state.VIEW_FORMAT_VERSION}
    _write(sf.view_path, {**view_file, "written_unix_s": 200.0, "view": new})
    assert sf.load().view == new
    _write(sf.path, {**record, "written_unix_s": 300.0, "view": old})
    assert sf.load().view == old
    sf.view_path.write_text("{half a fi")
    assert sf.load().view == old
    assert f"cannot use {sf.view_path}" in caplog.text
    sf.path.unlink()
    assert sf.load().view == {}
