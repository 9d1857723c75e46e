"""The hook's C boundary, in process: a cffi struct with job_desc's field names.

The real struct layout is only known inside slurmctld (tests/test_submit_slurm.py
covers that); here we drive slurm_plugin.hook through the same ffi calls it makes
there, to reach the paths a real job cannot trigger on demand: an exception inside
the decision, and the exact bytes written into each field.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cffi
import pytest

from slurm_plugin import hook
from slurm_plugin.store import Profile, ProfileStore

NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE

ffi = cffi.FFI()
ffi.cdef("""
typedef struct {
    char *admin_comment; char *comment; char *cpus_per_tres; uint16_t cpus_per_task;
    uint32_t job_id; uint32_t max_nodes; uint32_t min_nodes; char *name;
    uint32_t num_tasks; uint16_t ntasks_per_node; char *partition; char *script;
    char *tres_per_job; char *tres_per_node; char *tres_per_socket; char *tres_per_task;
    uint32_t user_id;
} job_desc_msg_t;
""")


class FakeLib:
    """The C helpers of job_submit_coda.c, with Python-owned memory."""

    NO_VAL = NO_VAL
    NO_VAL16 = NO_VAL16
    SLURM_SUCCESS = 0
    SLURM_ERROR = -1

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.keep: list[Any] = []

    def coda_log(self, level: int, msg: bytes) -> None:
        self.lines.append((level, msg.decode()))

    def coda_replace_str(self, slot: Any, value: bytes | None) -> None:
        if value is None:
            slot[0] = ffi.NULL
            return
        buf = ffi.new("char[]", value)
        self.keep.append(buf)
        slot[0] = buf


def make_desc(lib: FakeLib, **strings: str) -> Any:
    desc = ffi.new("job_desc_msg_t *")
    desc.cpus_per_task = NO_VAL16
    desc.min_nodes = desc.max_nodes = desc.num_tasks = desc.job_id = NO_VAL
    desc.ntasks_per_node = NO_VAL16
    desc.user_id = 1000
    for name, value in strings.items():
        buf = ffi.new("char[]", value.encode("utf-8", "surrogateescape"))
        lib.keep.append(buf)
        setattr(desc, name, buf)
    return desc


def field(desc: Any, name: str) -> str | None:
    ptr = getattr(desc, name)
    return None if ptr == ffi.NULL else ffi.string(ptr).decode()


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLib]:
    store = tmp_path / "profiles"
    store.mkdir(mode=0o755)
    ProfileStore(store).write(
        Profile(
            signature="workload:*:resnet50",
            workload="resnet50",
            cpus_per_gpu=6,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=time.time(),
            source="test",
        )
    )
    conf = tmp_path / "coda.conf"
    conf.write_text(
        f"ProfileStore={store}\nHookStatsFile={tmp_path / 'stats.json'}\n"
        f"DecisionJournal={tmp_path / 'decisions.jsonl'}\n"
    )
    (tmp_path / "slurm.conf").write_text(
        "NodeName=g1 CPUs=32 Gres=gpu:4\nPartitionName=gpu Nodes=g1\n"
    )
    monkeypatch.setenv("CODA_CONF", str(conf))
    fake = FakeLib()
    hook.bind(ffi, fake)
    assert hook.plugin_init() == 1
    try:
        yield fake
    finally:
        hook.plugin_fini()


def test_rewrites_fields_with_slurm_allocator(lib: FakeLib) -> None:
    desc = make_desc(
        lib,
        tres_per_node="gres:gpu:2",
        comment="coda:workload=resnet50",
        script="#!/bin/sh\ntrue\n",
        admin_comment="from-lua",
    )
    err = ffi.new("char **")
    assert hook.job_submit(desc, 1000, err) == 0
    assert field(desc, "cpus_per_tres") == "gres:gpu:6"
    assert field(desc, "admin_comment").startswith("from-lua coda:sig=workload:1000:resnet50")
    assert ffi.string(err[0]).decode().startswith("coda: --cpus-per-gpu=6")


def test_appends_to_a_message_from_an_earlier_plugin(lib: FakeLib) -> None:
    desc = make_desc(lib, tres_per_node="gres:gpu:1", comment="coda:workload=resnet50")
    err = ffi.new("char **")
    lib.coda_replace_str(err, b"lua: hello")
    hook.job_submit(desc, 1000, err)
    assert ffi.string(err[0]).decode().split("\n")[0] == "lua: hello"


def test_exception_in_decision_fails_open_with_one_line(
    lib: FakeLib, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("profile index exploded")

    monkeypatch.setattr(hook, "decide", boom)
    desc = make_desc(
        lib,
        tres_per_node="gres:gpu:2",
        comment="coda:workload=resnet50",
        cpus_per_tres="gres:gpu:3",
    )
    err = ffi.new("char **")
    before = len(lib.lines)
    assert hook.job_submit(desc, 1000, err) == 0
    assert field(desc, "cpus_per_tres") == "gres:gpu:3"  # exactly as submitted
    assert err[0] == ffi.NULL
    new = lib.lines[before:]
    assert len(new) == 1 and "profile index exploded" in new[0][1]
    assert "job passes unchanged" in new[0][1]
    assert hook.current_state().stats.fail_open == 1


def test_cpu_only_job_is_left_alone_silently(lib: FakeLib) -> None:
    desc = make_desc(lib, comment="coda:workload=resnet50")
    desc.num_tasks = 4
    err = ffi.new("char **")
    before = len(lib.lines)
    assert hook.job_submit(desc, 1000, err) == 0
    assert desc.cpus_per_tres == ffi.NULL and desc.admin_comment == ffi.NULL
    assert lib.lines[before:] == []


def test_replace_clears_cpus_per_task(lib: FakeLib, tmp_path: Path) -> None:
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "UserValue=replace\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns)
    desc = make_desc(lib, tres_per_node="gres:gpu:1", comment="coda:workload=resnet50")
    desc.cpus_per_task = 9
    hook.job_submit(desc, 1000, ffi.new("char **"))
    assert field(desc, "cpus_per_tres") == "gres:gpu:6"
    assert desc.cpus_per_task == NO_VAL16


def test_modify_rejects_only_invalid_directives(lib: FakeLib) -> None:
    ok = make_desc(lib, comment="coda:workload=resnet50")
    bad = make_desc(lib, comment="coda:workload=")
    assert hook.job_modify(ok, 1000, ffi.new("char **")) == 0
    err = ffi.new("char **")
    assert hook.job_modify(bad, 1000, err) == -1
    assert "coda:" in ffi.string(err[0]).decode()


def test_stats_file_reports_counters(lib: FakeLib, tmp_path: Path) -> None:
    import json

    for _ in range(3):
        desc = make_desc(lib, tres_per_node="gres:gpu:1", comment="coda:workload=resnet50")
        hook.job_submit(desc, 1000, ffi.new("char **"))
    hook._write_stats(hook.current_state())
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["calls"] == 3 and stats["changed"] == 3 and stats["profiles"] == 1
    assert stats["p50_us"] > 0


def test_stats_file_stays_whole_under_concurrent_writers(lib: FakeLib, tmp_path: Path) -> None:
    """The reloader thread and plugin_fini may write at once; readers see one document."""
    import json
    import threading

    state = hook.current_state()
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            hook._write_stats(state)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(200):
            path = tmp_path / "stats.json"
            if path.exists():
                assert json.loads(path.read_text())["format"] == "coda-hook-stats"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not list(tmp_path.glob(".stats.json.*")), "temporary files left behind"
