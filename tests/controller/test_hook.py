"""The hook's C boundary, in process: a cffi struct with job_desc's field names.

The real struct layout is only known inside slurmctld (tests/controller/test_submit_slurm.py
covers that); here we drive slurm_plugin.hook.submit through the same ffi calls it makes
there, to reach the paths a real job cannot trigger on demand: an exception inside
the decision, and the exact bytes written into each field.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cffi
import pytest

from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.decision.tres import with_task_cpus
from slurm_plugin.hook import submit as hook

NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE

ffi = cffi.FFI()
ffi.cdef("""
typedef struct {
    char *admin_comment; char *comment; char *cpus_per_tres; uint16_t cpus_per_task;
    uint32_t job_id; char *job_id_str; uint32_t max_nodes; uint32_t min_cpus;
    uint32_t min_nodes; char *name;
    uint32_t num_tasks; uint16_t ntasks_per_node; char *partition; uint16_t pn_min_cpus;
    uint16_t sockets_per_node;
    char *prefer; char *script;
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

    def coda_job_id(self, desc: Any) -> int:
        return desc.job_id

    def coda_set_cpus_per_task(self, desc: Any, now: int) -> None:
        # What job_submit_coda.c does (tests/controller/test_hook_compiled.py runs the real one).
        cpt = desc.cpus_per_task
        if cpt == 0 or cpt >= NO_VAL16 or now == 0 or now >= NO_VAL16:
            return
        if desc.pn_min_cpus == cpt:
            desc.pn_min_cpus = now
        if desc.min_cpus != NO_VAL and desc.min_cpus >= cpt and desc.min_cpus % cpt == 0:
            desc.min_cpus = desc.min_cpus // cpt * now
        if desc.tres_per_task != ffi.NULL:
            rewritten = with_task_cpus(ffi.string(desc.tres_per_task).decode(), now)
            self.coda_replace_str(ffi.addressof(desc, "tres_per_task"), rewritten.encode())
        desc.cpus_per_task = now

    def coda_rescale_min_cpus(self, desc: Any, was: int, now: int) -> None:
        m = desc.min_cpus
        if was and now and m != NO_VAL and m >= was and m % was == 0:
            desc.min_cpus = m // was * now


BATCH_SCRIPT = "#!/bin/sh\npython train.py\n"
"""A script: what makes a submission sbatch's (the user is told the decision by default)."""


def make_desc(lib: FakeLib, **strings: str) -> Any:
    desc = ffi.new("job_desc_msg_t *")
    desc.cpus_per_task = NO_VAL16
    desc.min_nodes = desc.max_nodes = desc.num_tasks = desc.job_id = desc.min_cpus = NO_VAL
    desc.ntasks_per_node = desc.pn_min_cpus = desc.sockets_per_node = NO_VAL16
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
    yield from start_hook(
        tmp_path,
        monkeypatch,
        f"ProfileStore={store}\nHookStatsFile={tmp_path / 'stats.json'}\n"
        f"DecisionJournal={tmp_path / 'decisions.jsonl'}\n",
    )


def start_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coda_conf: str
) -> Iterator[FakeLib]:
    """The hook started on a FakeLib with ``coda_conf`` and a one-node slurm.conf (32 CPUs,
    4 GPUs) in ``tmp_path``; stopped when the generator is closed."""
    conf = tmp_path / "coda.conf"
    if "HookBudgetMs" not in coda_conf:
        # A decision slowed by a loaded machine is still the decision these tests compare;
        # what the budget does is tests/controller/test_submit_slurm.py's to show.
        coda_conf += "HookBudgetMs=2000\n"
    conf.write_text(coda_conf)
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


def test_a_retired_key_is_warned_about_once_in_slurmctlds_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "coda.conf"
    (tmp_path / "profiles").mkdir(mode=0o755)
    started = start_hook(
        tmp_path,
        monkeypatch,
        f"ProfileStore={tmp_path / 'profiles'}\nHookFastPath=yes\n"
        "HookStatsFile=\nDecisionJournal=\n",
    )
    fake = next(started)
    try:
        said = [line for _, line in fake.lines if "HookFastPath" in line]
        assert said == [
            f"warning: {conf}:2: HookFastPath no longer has an effect (every GPU job is "
            "decided by the hook's Python side); the line is ignored"
        ]
        # An edit reloads coda.conf; the line is not said again.
        conf.write_text(conf.read_text() + "Mode=advise\n")
        os.utime(conf, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        hook._on_reload_tick()
        state = hook.current_state()
        assert state is not None and state.cfg.mode == "advise"
        assert [line for _, line in fake.lines if "HookFastPath" in line] == said
    finally:
        started.close()


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
    # The record, which ends with the decision's token, then the user's line.
    admin = field(desc, "admin_comment")
    assert admin.startswith("from-lua coda:sig=workload:1000:resnet50;"), admin
    assert re.search(
        r';tok=[0-9a-f]{16} coda: --cpus-per-gpu=6 for workload "resnet50" \(shared profile, '
        r"8 samples, confidence 0.95\)$",
        admin,
    ), admin
    assert (
        ffi.string(err[0])
        .decode()
        .startswith("coda (if Slurm accepts the job): --cpus-per-gpu=6 for workload")
    )


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


def test_a_slow_signature_ignore_pattern_lets_the_job_pass_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An admin's pattern that is quadratic on a long word without an X: a script of such
    # lines makes it give up within its budget, and the job passes as submitted.
    (tmp_path / "profiles").mkdir()
    gen = start_hook(
        tmp_path,
        monkeypatch,
        f"ProfileStore={tmp_path / 'profiles'}\nHookStatsFile=\nSignatureIgnore=[^\\s]++X\n",
    )
    lib = next(gen)
    try:
        script = "#!/bin/sh\n" + ("a" * 1000 + "\n") * 200
        desc = make_desc(lib, tres_per_node="gres:gpu:2", script=script, cpus_per_tres="gres:gpu:3")
        err = ffi.new("char **")
        before = len(lib.lines)
        assert hook.job_submit(desc, 1000, err) == 0
        assert field(desc, "cpus_per_tres") == "gres:gpu:3" and desc.admin_comment == ffi.NULL
        (line,) = [m for _, m in lib.lines[before:]]
        assert "SignatureIgnoreTimeout: SignatureIgnore patterns took over 5 ms" in line
        assert line.endswith("; job passes unchanged")
    finally:
        gen.close()


def test_cpu_only_job_is_left_alone_silently(lib: FakeLib) -> None:
    desc = make_desc(lib, comment="coda:workload=resnet50")
    desc.num_tasks = 4
    err = ffi.new("char **")
    before = len(lib.lines)
    assert hook.job_submit(desc, 1000, err) == 0
    assert desc.cpus_per_tres == ffi.NULL and desc.admin_comment == ffi.NULL
    assert lib.lines[before:] == []


def test_replace_rewrites_cpus_per_task_per_task(lib: FakeLib, tmp_path: Path) -> None:
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "UserValue=replace\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns)
    # -n2 -c9 --gpus-per-node=2 (24.11's spelling): 6 per GPU x 2 GPUs over 2 tasks.
    desc = make_desc(
        lib, tres_per_node="gres/gpu:2", tres_per_task="cpu=9", comment="coda:workload=resnet50"
    )
    desc.cpus_per_task = 9
    desc.num_tasks = 2
    desc.pn_min_cpus = 9
    desc.min_cpus = 18
    hook.job_submit(desc, 1000, ffi.new("char **"))
    assert field(desc, "cpus_per_tres") is None
    assert (desc.cpus_per_task, desc.pn_min_cpus, desc.min_cpus) == (6, 6, 12)
    assert field(desc, "tres_per_task") == "cpu=6"
    assert ";cpt=6" in (field(desc, "admin_comment") or "")


def test_modify_rejects_only_invalid_directives(lib: FakeLib) -> None:
    ok = make_desc(lib, comment="coda:workload=resnet50")
    bad = make_desc(lib, comment="coda:workload=")
    assert hook.job_modify(ok, 1000, ffi.new("char **")) == 0
    err = ffi.new("char **")
    assert hook.job_modify(bad, 1000, err) == -1
    assert "coda:" in ffi.string(err[0]).decode()


def test_modify_queues_an_update_of_the_jobs_shape(
    lib: FakeLib, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[int] = []

    class Worker:
        def notice(self, job_id: int) -> bool:
            queued.append(job_id)
            return True

        def stop(self) -> None:
            pass

    monkeypatch.setattr(hook, "_modify", Worker())
    err = ffi.new("char **")
    assert hook.job_modify(make_desc(lib, job_id_str="41", tres_per_node="gres:gpu:4"), 0, err) == 0
    assert hook.job_modify(make_desc(lib, job_id_str="42", partition="gpu_b"), 0, err) == 0
    # Cores in the update, an array task, nothing of the shape: not queued.
    both = make_desc(lib, job_id_str="43", tres_per_node="gres:gpu:4", cpus_per_tres="gres:gpu:2")
    assert hook.job_modify(both, 0, err) == 0
    task = make_desc(lib, job_id_str="44_1", tres_per_node="gres:gpu:4")
    assert hook.job_modify(task, 0, err) == 0
    assert hook.job_modify(make_desc(lib, job_id_str="45", comment="hello"), 0, err) == 0
    assert queued == [41, 42]
    assert not [line for level, line in lib.lines if level == 0]  # no error logged


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
    # The plugin's own reloader thread also writes stats: look while no write is in flight.
    with hook._stats_lock:
        assert not list(tmp_path.glob(".stats.json.*")), "temporary files left behind"


# -------------------------------------------------------------------------------- placement


def _placement_setup(tmp_path: Path, *, features: str = "a100,v100") -> None:
    """Profiles with usage records, the three placement switches on, and a reload."""
    from coda_common.store.profiles import UsageRecord

    def usage(model: str, iters: float, pcie: float | None = None) -> UsageRecord:
        return UsageRecord(model, 0.9, 0.4, pcie, iters, 10, time.time())

    store = ProfileStore(tmp_path / "profiles")
    # a100 over v100: resnet50 2.5x (PCIe-heavy), gpt 1.67x, bert 1.25x.
    for name, a100, v100, pcie in (
        ("resnet50", 10.0, 4.0, 6e9),
        ("gpt", 10.0, 6.0, None),
        ("bert", 10.0, 8.0, None),
    ):
        store.write(
            Profile(
                signature=f"workload:*:{name}",
                workload=name,
                cpus_per_gpu=6,
                confidence=0.95,
                n_samples=8,
                updated_unix_s=time.time(),
                source="test",
                usage=(usage("a100", a100, pcie), usage("v100", v100)),
            )
        )
    feature = f" Feature={features}" if features else ""
    (tmp_path / "slurm.conf").write_text(
        f"NodeName=g1 CPUs=32 Gres=gpu:4,pcie:1{feature}\nPartitionName=gpu Nodes=g1\n"
    )
    conf = tmp_path / "coda.conf"
    conf.write_text(
        conf.read_text() + "PcieSpreadGres=pcie PreferGpuTypes=a100,v100\n"
        "CpuJobPartitions=batch,gpu_spare\n"
    )
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns)
    hook.current_state().cache.refresh()


def test_placement_fields_are_written(lib: FakeLib, tmp_path: Path) -> None:
    _placement_setup(tmp_path)
    desc = make_desc(
        lib, tres_per_node="gres:gpu:2", comment="coda:workload=resnet50", script=BATCH_SCRIPT
    )
    err = ffi.new("char **")
    assert hook.job_submit(desc, 1000, err) == 0
    assert field(desc, "tres_per_node") == "gres:gpu:2,gres:pcie:1"
    assert field(desc, "prefer") == "a100"
    assert field(desc, "partition") is None
    assert re.search(r";pcie=1;prefer=a100;tok=[0-9a-f]{16} coda: ", field(desc, "admin_comment"))
    said = ffi.string(err[0]).decode()
    assert "\n" not in said and "gres:pcie:1 per node" in said and "--prefer=a100" in said
    assert " pcie=1 prefer=a100:" in lib.lines[-1][1]

    # bert gains little from the a100: steered to the v100; light PCIe: no GRES.
    desc = make_desc(lib, tres_per_node="gres:gpu:2", comment="coda:workload=bert")
    hook.job_submit(desc, 1000, ffi.new("char **"))
    assert (field(desc, "tres_per_node"), field(desc, "prefer")) == ("gres:gpu:2", "v100")

    # The user's own --prefer is theirs.
    desc = make_desc(
        lib, tres_per_node="gres:gpu:2", comment="coda:workload=resnet50", prefer="nvme"
    )
    hook.job_submit(desc, 1000, ffi.new("char **"))
    assert field(desc, "prefer") == "nvme"
    assert field(desc, "tres_per_node") == "gres:gpu:2,gres:pcie:1"


def test_cpu_only_job_is_routed_but_not_counted(lib: FakeLib, tmp_path: Path) -> None:
    _placement_setup(tmp_path)
    state = hook.current_state()
    gpu_jobs = state.stats.gpu_jobs
    desc = make_desc(lib, script="#!/bin/sh\nmake -j4\n")
    desc.num_tasks = 4
    err = ffi.new("char **")
    assert hook.job_submit(desc, 1000, err) == 0
    assert field(desc, "partition") == "batch,gpu_spare"
    assert desc.admin_comment == ffi.NULL and desc.tres_per_node == ffi.NULL
    assert "CPU-only job offered partitions batch,gpu_spare" in ffi.string(err[0]).decode()
    assert "action=skip part=batch,gpu_spare" in lib.lines[-1][1]
    assert state.stats.gpu_jobs == gpu_jobs

    mine = make_desc(lib, partition="debug")
    hook.job_submit(mine, 1000, ffi.new("char **"))
    assert field(mine, "partition") == "debug"


def test_prefer_feature_no_node_has_is_never_set(lib: FakeLib, tmp_path: Path) -> None:
    # Slurm refuses a job preferring a feature no node has: the hook must not cause that.
    before = len(lib.lines)
    _placement_setup(tmp_path, features="")
    errors = [m for level, m in lib.lines[before:] if level == 0]
    assert any("no node in" in m and "feature 'a100'" in m for m in errors), errors
    desc = make_desc(lib, tres_per_node="gres:gpu:2", comment="coda:workload=resnet50")
    hook.job_submit(desc, 1000, ffi.new("char **"))
    assert field(desc, "prefer") is None
    assert field(desc, "tres_per_node") == "gres:gpu:2,gres:pcie:1"
    assert " no-feature=a100" in lib.lines[-1][1]


def test_advise_mode_logs_the_route_at_verbose_and_changes_nothing(
    lib: FakeLib, tmp_path: Path
) -> None:
    _placement_setup(tmp_path)
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "Mode=advise LogLevel=verbose\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns + 1)
    desc = make_desc(lib)
    desc.num_tasks = 2
    err = ffi.new("char **")
    before = len(lib.lines)
    assert hook.job_submit(desc, 1000, err) == 0
    assert desc.partition == ffi.NULL and err[0] == ffi.NULL
    assert any(
        "would route to partitions batch,gpu_spare (advise mode)" in m
        for _, m in lib.lines[before:]
    )
