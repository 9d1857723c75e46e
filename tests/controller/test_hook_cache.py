"""The submit hook's decision memo: a repeated job gets exactly what decide() gives.

Driven through the same cffi struct double as tests/controller/test_hook.py.  Every case is
submitted twice: the first call decides (memo miss), the second reuses the memoised plan (hit); both
must write the same fields, say the same to the user and log the same line, and the plan
must be what decide() returns for the job read straight from job_desc.  A reload of the
profile store or of coda.conf must change the answer; a usage record the decision does not
read keeps the memo.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coda_common.config.codaconf import parse_config
from coda_common.store.profiles import Profile, ProfileStore, to_view
from coda_common.store.usage import CpuUsageRecord, UsageRecord
from slurm_plugin.decision.decide import decide as real_decide
from slurm_plugin.decision.decide import reads_usage, same_decisions
from slurm_plugin.hook import submit as hook
from tests.controller.test_hook import NO_VAL, FakeLib, ffi, field, make_desc, start_hook

WRITTEN = ("cpus_per_tres", "tres_per_node", "partition", "prefer", "admin_comment")


def _profile(name: str, cpus_per_gpu: int, confidence: float = 0.95) -> Profile:
    return Profile(
        signature=f"workload:*:{name}",
        workload=name,
        cpus_per_gpu=cpus_per_gpu,
        confidence=confidence,
        n_samples=8,
        updated_unix_s=time.time(),
        source="test",
    )


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLib]:
    store = ProfileStore(tmp_path / "profiles")
    store.ensure_root()
    store.write(_profile("resnet50", 6))
    store.write(_profile("weak", 3, confidence=0.2))
    yield from start_hook(
        tmp_path,
        monkeypatch,
        f"ProfileStore={store.root}\nHookStatsFile=\n"
        f"DecisionJournal={tmp_path / 'decisions.jsonl'}\nExcludePartitions=debug\n",
    )


class DecideSpy:
    """hook.decide, counting calls and keeping the arguments of the last one."""

    def __init__(self) -> None:
        self.calls = 0
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.args, self.kwargs = args, kwargs
        return real_decide(*args, **kwargs)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> DecideSpy:
    s = DecideSpy()
    monkeypatch.setattr(hook, "decide", s)
    return s


def _make(lib: FakeLib, case: dict[str, Any]) -> Any:
    strings = {k: v for k, v in case.items() if isinstance(v, str)}
    desc = make_desc(lib, **strings)
    for name, value in case.items():
        if isinstance(value, int) and name != "submit_uid":
            setattr(desc, name, value)
    return desc


def _submit(lib: FakeLib, case: dict[str, Any], err_first: str | None = None) -> tuple:
    """What a user and an admin see of one submission."""
    desc = _make(lib, case)
    err = ffi.new("char **")
    if err_first is not None:
        lib.coda_replace_str(err, err_first.encode())
    before = len(lib.lines)
    rc = hook.job_submit(desc, case.get("submit_uid", 1000), err)
    said = None if err[0] == ffi.NULL else ffi.string(err[0]).decode()
    fields = tuple(untokened(field(desc, name)) for name in WRITTEN)
    return rc, fields, desc.cpus_per_task, said, lib.lines[before:]


_TOKEN = re.compile(r";tok=[0-9a-f]{16}(?= |$)")


def untokened(text: str | None) -> str | None:
    """An admin comment with its record's token (one per submission) as ``;tok=T``; a record
    without its token fails the test."""
    if text is None or "coda:sig=" not in text:
        return text
    assert _TOKEN.search(text), text
    return _TOKEN.sub(";tok=T", text)


GPU = "gres:gpu:2"
CASES: list[dict[str, Any]] = [
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50"},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "admin_comment": "from-lua"},
    {"tres_per_job": "gres:gpu:3", "comment": "coda:workload=resnet50", "min_nodes": 2},
    {"tres_per_task": "gres:gpu:1", "comment": "coda:workload=resnet50", "ntasks_per_node": 2},
    {"tres_per_task": "gres:gpu:1", "comment": "coda:workload=resnet50", "num_tasks": 3},
    {"tres_per_socket": "gres:gpu:1", "comment": "coda:workload=resnet50"},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "cpus_per_tres": "gres:gpu:3"},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "cpus_per_task": 9},
    {"tres_per_node": GPU, "comment": "coda:workload=weak"},
    {"tres_per_node": GPU, "script": "#!/bin/sh\npython train.py\n", "name": "a"},
    {"tres_per_node": GPU, "script": "#!/bin/sh\npython train.py\n", "name": "b"},
    {"tres_per_node": GPU, "name": "interactive"},
    {"tres_per_node": GPU, "comment": "nightly; coda:off"},
    {"tres_per_node": GPU, "comment": "coda:bogus"},
    {"tres_per_node": "gres:gpu:x", "comment": "coda:workload=resnet50"},
    {"tres_per_node": "gres:license:1", "comment": "coda:workload=resnet50"},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "partition": "debug"},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "user_id": NO_VAL, "submit_uid": 7},
    {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "prefer": "nvme"},
    {"tres_per_node": GPU, "comment": "coda:workload=n\udcffx", "name": "j\udcfe"},
    {"num_tasks": 4, "comment": "coda:workload=resnet50"},
]

BATCH = {**CASES[0], "script": "#!/bin/sh\npython train.py\n"}
"""CASES[0] as sbatch sends it (a script): told the decision under the default UserMessage."""


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_memo_hit_gives_what_decide_gives(lib: FakeLib, spy: DecideSpy, case: dict) -> None:
    first = _submit(lib, case)
    if spy.calls == 0:
        # A CPU-only job stops before the decision (nothing to write or log at LogLevel=info).
        assert first == (0, (None,) * len(WRITTEN), 0xFFFE, None, [])
        return
    assert spy.calls == 1
    # The plan decide() produced is what decide() gives for the job read straight from job_desc.
    state = hook.current_state()
    (plan,) = state.memo.plans.values()
    fresh = hook.read_request(_make(lib, case), case.get("submit_uid", 1000))
    assert real_decide(fresh, *spy.args[1:], **spy.kwargs) == plan.decision
    second = _submit(lib, case)
    assert spy.calls == 1, "an identical job must be answered from the memo"
    assert second == first


def test_each_field_the_decision_reads_is_in_the_key(lib: FakeLib, spy: DecideSpy) -> None:
    # Every GPU case differs from the others in one field decide() reads, except case 1,
    # which differs from case 0 only in admin_comment (not read by the decision): one
    # decision each, and the same answers again from the memo.
    gpu_cases = CASES[:-1]
    answers = [_submit(lib, case) for case in gpu_cases]
    assert spy.calls == len(gpu_cases) - 1
    assert [_submit(lib, case) for case in gpu_cases] == answers
    assert spy.calls == len(gpu_cases) - 1


def test_user_message_of_an_earlier_plugin_is_kept_on_a_hit(lib: FakeLib) -> None:
    case = BATCH
    _submit(lib, case)
    rc, _fields, _cpt, said, _lines = _submit(lib, case, err_first="lua: hello")
    assert rc == 0 and said is not None
    first, second = said.split("\n")
    assert first == "lua: hello" and second.startswith(
        "coda (if Slurm accepts the job): --cpus-per-gpu=6"
    )


def test_store_reload_changes_the_answer(lib: FakeLib, tmp_path: Path) -> None:
    case = CASES[0]
    assert _submit(lib, case)[1][0] == "gres:gpu:6"
    assert _submit(lib, case)[1][0] == "gres:gpu:6"  # memoised
    ProfileStore(tmp_path / "profiles").write(_profile("resnet50", 4))
    hook.current_state().cache.refresh()
    assert _submit(lib, case)[1][0] == "gres:gpu:4"


def _usage(pcie_bytes_per_s: float) -> UsageRecord:
    return UsageRecord("A100", 0.9, 0.5, pcie_bytes_per_s, None, 60, time.time())


def _reload_tick() -> None:
    """What the reloader thread does every ReloadIntervalS: refresh, then its tick."""
    hook.current_state().cache.refresh()
    hook._on_reload_tick()


def test_a_usage_record_keeps_the_memo_and_a_new_fit_empties_it(
    lib: FakeLib, spy: DecideSpy, tmp_path: Path
) -> None:
    _ticks_by_hand_only()
    store = ProfileStore(tmp_path / "profiles")
    case = BATCH
    first = _submit(lib, case)
    # coda-node's usage flush rewrites the profile: a new snapshot, the same decisions.
    store.merge_usage("workload:*:resnet50", _usage(1e9))
    snapshot = hook.current_state().cache.snapshot()
    _reload_tick()
    assert hook.current_state().cache.snapshot() is not snapshot
    assert _submit(lib, case) == first
    assert spy.calls == 1
    # A new fit is read by the decision: decided again.
    store.write(_profile("resnet50", 4))
    _reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:4"
    assert spy.calls == 2


def _views(*profiles: Profile) -> dict[str, Any]:
    return {p.signature: to_view(p) for p in profiles}


SAME_DECISIONS: list[tuple[str, str, Any, bool]] = [
    # (coda.conf, what changes, the new profile or a dict of views, same decisions)
    ("", "a GPU usage record", "usage", True),
    ("", "a CPU usage record", "cpu_usage", True),
    ("PcieSpreadGres=pcie", "a GPU usage record", "usage", False),
    ("PreferGpuTypes=a100,v100", "a GPU usage record", "usage", False),
    ("MemBwSpreadGres=membw", "a CPU usage record", "cpu_usage", False),
    ("", "cores per GPU", "cpus_per_gpu", False),
    ("", "confidence", "confidence", False),
    ("", "samples", "n_samples", False),
    ("", "a profile added", "added", False),
    ("", "a profile removed", "removed", False),
]


@pytest.mark.parametrize(
    ("conf", "what", "change", "same"),
    SAME_DECISIONS,
    ids=[f"{c} {w}" for c, w, _, _ in SAME_DECISIONS],
)
def test_same_decisions_only_when_what_changed_is_never_read(
    conf: str, what: str, change: str, same: bool
) -> None:
    cfg, _ = parse_config(conf)
    base = _profile("resnet50", 6)
    other = _profile("bert", 5)
    old = _views(base, other)
    new = dict(old)
    view = old[base.signature]
    if change == "usage":
        new[base.signature] = dataclasses.replace(view, usage=(_usage(2e10),))
    elif change == "cpu_usage":
        new[base.signature] = dataclasses.replace(view, cpu_usage=CpuUsageRecord(9e9, 9, 1.0))
    elif change == "added":
        new.update(_views(_profile("gpt", 2)))
    elif change == "removed":
        del new[other.signature]
    else:
        new[base.signature] = dataclasses.replace(view, **{change: getattr(view, change) + 1})
    assert same_decisions(old, new, cfg) is same, what
    # Nothing changed: the same decisions, told only where no usage record is read.
    assert same_decisions(old, dict(old), cfg) is not reads_usage(cfg)


def test_conf_reload_changes_the_answer(lib: FakeLib, tmp_path: Path) -> None:
    case = BATCH
    assert _submit(lib, case)[1][0] == "gres:gpu:6"
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "MaxCpusPerGpu=3\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns + 1)
    rc, fields, _cpt, said, lines = _submit(lib, case)
    assert rc == 0
    assert fields[0] == "gres:gpu:3"
    assert said is not None and "capped at MaxCpusPerGpu=3" in said
    assert "cpg=3" in lines[-1][1]


def test_a_slurm_conf_edit_is_picked_up_at_the_next_reload_tick(
    lib: FakeLib, tmp_path: Path
) -> None:
    # scontrol reconfigure does not restart job_submit plugins: the hook watches slurm.conf.
    _ticks_by_hand_only()
    case = BATCH
    assert _submit(lib, case)[1][0] == "gres:gpu:6"
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("NodeName=n[1-2] CPUs=8 Gres=gpu:4\n")
    hook._on_reload_tick()
    rc, fields, _cpt, said, _lines = _submit(lib, case)
    assert rc == 0 and fields[0] == "gres:gpu:4"  # 2 GPUs of a node with 8 cores
    assert said is not None and "capped at 4: no node gives a job of 2 GPU(s) more per GPU" in said
    reloaded = f"reloaded {tmp_path / 'coda.conf'} ({slurm_conf} changed)"
    assert sum(reloaded in text for _, text in lib.lines) == 1
    hook._on_reload_tick()  # unchanged: no second reload
    assert _submit(lib, case)[1][0] == "gres:gpu:4"
    assert sum(reloaded in text for _, text in lib.lines) == 1


def _touch_later(path: Path) -> None:
    """Move ``path``'s mtime a second on: two writes in one clock tick share an mtime."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_an_edit_to_a_file_slurm_conf_includes_is_picked_up(lib: FakeLib, tmp_path: Path) -> None:
    """Sites keep their nodes in included files (``Include nodes.conf``, ``nodes.d/*.conf``):
    an edit there, or a file added to a globbed folder, reloads the node shapes."""
    _ticks_by_hand_only()
    case = CASES[0]
    slurm_conf = tmp_path / "slurm.conf"
    nodes = tmp_path / "nodes.conf"
    nodes.write_text("NodeName=n[1-2] CPUs=8 Gres=gpu:4\n")
    (tmp_path / "nodes.d").mkdir()
    slurm_conf.write_text("Include nodes.conf\nInclude nodes.d/*.conf\n")
    _touch_later(slurm_conf)
    hook._on_reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:4"  # 2 GPUs of a node with 8 cores
    before = len(lib.lines)

    nodes.write_text("NodeName=n[1-2] CPUs=16 Gres=gpu:4\n")
    _touch_later(nodes)
    hook._on_reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:6"  # 16 cores: the profile's 6 fit
    said = [text for _, text in lib.lines[before:] if text.startswith("reloaded ")]
    assert len(said) == 1 and f"reloaded {tmp_path / 'coda.conf'} ({nodes} changed)" in said[0]

    nodes.write_text("")  # the nodes move to a file of the globbed folder
    _touch_later(nodes)
    hook._on_reload_tick()
    (tmp_path / "nodes.d" / "a.conf").write_text("NodeName=n[1-2] CPUs=10 Gres=gpu:4\n")
    _touch_later(tmp_path / "nodes.d")
    hook._on_reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:5"  # 10 cores over 2 GPUs
    hook._on_reload_tick()  # nothing changed: no reload
    reloads = [text for _, text in lib.lines[before:] if text.startswith("reloaded ")]
    assert len(reloads) == 3


def test_an_included_file_that_is_missing_is_read_once_it_is_there(
    lib: FakeLib, tmp_path: Path
) -> None:
    """A missing Include target (a tool that rewrites it by delete and create, caught in
    between) leaves the hook without node shapes until the file is back, not until the
    next edit of slurm.conf."""
    _ticks_by_hand_only()
    case = CASES[0]
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("Include nodes.conf\n")
    _touch_later(slurm_conf)
    hook._on_reload_tick()
    assert any("Include nodes.conf: no such file" in text for _, text in lib.lines)
    (tmp_path / "nodes.conf").write_text("NodeName=n[1-2] CPUs=8 Gres=gpu:4\n")
    hook._on_reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:4"  # 2 GPUs of a node with 8 cores


def test_a_glob_with_a_wildcard_folder_watches_the_folder_above_it(
    lib: FakeLib, tmp_path: Path
) -> None:
    _ticks_by_hand_only()
    case = CASES[0]
    slurm_conf = tmp_path / "slurm.conf"
    (tmp_path / "conf.d").mkdir()
    slurm_conf.write_text("Include conf.d/*/nodes.conf\n")
    _touch_later(slurm_conf)
    hook._on_reload_tick()
    (tmp_path / "conf.d" / "rack1").mkdir()
    (tmp_path / "conf.d" / "rack1" / "nodes.conf").write_text("NodeName=n1 CPUs=8 Gres=gpu:4\n")
    _touch_later(tmp_path / "conf.d")
    hook._on_reload_tick()
    assert _submit(lib, case)[1][0] == "gres:gpu:4"


def test_memo_is_bounded(lib: FakeLib, spy: DecideSpy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook, "MEMO_MAX_ENTRIES", 3)
    jobs = [{"tres_per_node": GPU, "comment": f"coda:workload=w{i}"} for i in range(5)]
    for job in jobs:
        _submit(lib, job)
    assert len(hook.current_state().memo.plans) <= 3
    # Cleared, not wrong: the most recent job is still answered from the memo.
    calls = spy.calls
    assert _submit(lib, jobs[-1])[0] == 0
    assert spy.calls == calls


def test_a_script_over_the_byte_bound_is_decided_every_time(
    lib: FakeLib, spy: DecideSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hook, "MEMO_MAX_BYTES", 1000)
    big = {"tres_per_node": GPU, "script": "#!/bin/sh\n" + "true\n" * 400}
    first = _submit(lib, big)
    assert _submit(lib, big) == first
    assert spy.calls == 2
    assert hook.current_state().memo.plans == {}


def test_cpu_only_job_at_verbose_is_still_logged(lib: FakeLib, tmp_path: Path) -> None:
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "LogLevel=verbose\n")
    hook._reload_config(hook.current_state(), conf.stat().st_mtime_ns + 1)
    rc, fields, _cpt, said, lines = _submit(lib, {"num_tasks": 4, "name": "make"})
    assert (rc, fields, said) == (0, (None,) * len(WRITTEN), None)
    assert [m for _, m in lines] == ['job "make" uid=1000 action=skip: no GPUs requested']


def test_fail_open_on_a_memo_hit(lib: FakeLib, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[0]
    _submit(lib, case)

    def boom(*_a: object) -> None:
        raise RuntimeError("write failed")

    monkeypatch.setattr(hook, "_apply", boom)
    rc, fields, _cpt, said, lines = _submit(lib, case)
    assert (rc, fields, said) == (0, (None, GPU, None, None, None), None)  # as submitted
    assert [m for _, m in lines] == [
        'job "" uid=1000: RuntimeError: write failed; job passes unchanged'
    ]


def test_journal_entry_of_a_hit_matches_the_miss(lib: FakeLib, tmp_path: Path) -> None:
    import json

    case = {"tres_per_node": GPU, "comment": "coda:workload=resnet50", "name": "train"}
    _submit(lib, case)
    _submit(lib, case)
    hook.current_state().journal.flush()
    entries = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().split()]
    assert len(entries) == 2
    assert entries[0]["tok"] != entries[1]["tok"]  # one token per submission
    for e in entries:
        del e["t"], e["hook_us"], e["tok"]
    assert entries[0] == entries[1]
    assert entries[0]["uid"] == 1000 and entries[0]["job"] == "train"


def test_gres_counts_come_from_the_slurm_conf_slurmctld_started_with_and_never_per_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coda_common.store.profiles import CpuUsageRecord
    from slurm_plugin.config import nodecap

    calls: list[str] = []
    real = nodecap.gres_units_per_partition

    def counted(*args: Any) -> Any:
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(nodecap, "gres_units_per_partition", counted)
    store = ProfileStore(tmp_path / "profiles")
    store.ensure_root()
    store.merge_cpu_usage("workload:*:stream", CpuUsageRecord(5e9, 40, time.time()))
    conf = f"ProfileStore={store.root}\nHookStatsFile=\nMemBwSpreadGres=membw\n"
    job = {"comment": "coda:workload=stream", "cpus_per_task": 4}  # 20 GB/s
    with_membw = "NodeName=g1 CPUs=32 Gres=gpu:4,membw:{}\nPartitionName=gpu Nodes=g1 Default=YES\n"
    for lib in start_hook(tmp_path, monkeypatch, conf):
        _ticks_by_hand_only()
        assert calls == ["membw"]  # at load, off the hot path
        # start_hook's node has no membw: no GRES, a record only.
        rc, fields, *_ = _submit(lib, job)
        assert rc == 0 and fields[1] is None and "coda:sig=workload:1000:stream" in fields[4]
        # The GRES added to slurm.conf: slurmctld knows it only once restarted, so the
        # hook, reloaded, still asks for none.
        (tmp_path / "slurm.conf").write_text(with_membw.format(200))
        hook._on_reload_tick()
        assert _submit(lib, job)[1][1] is None
        # slurmctld restarted (and the plugin with it): now it asks.
        hook.plugin_fini()
        hook.bind(ffi, lib)
        assert hook.plugin_init() == 1
        _ticks_by_hand_only()
        hook.current_state().cache.refresh()
        n = len(calls)
        assert _submit(lib, job)[1][1] == "gres:membw:20"
        assert len(calls) == n  # no host list expanded for a job
        # A count lowered in slurm.conf is taken at once (a smaller request is always safe).
        (tmp_path / "slurm.conf").write_text(with_membw.format(10))
        hook._on_reload_tick()
        assert _submit(lib, job)[1][1] == "gres:membw:10"


def _ticks_by_hand_only() -> None:
    """Stop the hook's reloader thread: the test runs each reload tick itself (the thread
    would also see the edit and reload a second time)."""
    reloader = hook.current_state().reloader
    if reloader is not None:
        reloader.stop()


def test_a_profile_imported_as_a_prior_sizes_the_next_job_naming_it(
    lib: FakeLib, spy: DecideSpy, tmp_path: Path
) -> None:
    """A never-seen script that names a model: nothing until the site imports that model's
    profile, then the prior (the memo is renewed with the snapshot); the prior index is
    built on the reload tick, not under the job lock."""
    from slurm_plugin.decision import priors

    _ticks_by_hand_only()
    case = {"tres_per_node": GPU, "script": "#!/bin/sh\nsrun python train.py --arch AlexNet\n"}
    assert _submit(lib, case)[1][0] is None
    ProfileStore(tmp_path / "profiles").write(_profile("alexnet", 12, confidence=0.1))
    _reload_tick()
    memo = priors._index_memo
    assert memo is not None and memo[0] is hook.current_state().cache.snapshot()
    _rc, fields, _cpt, said, _lines = _submit(lib, case)
    assert fields[0] == "gres:gpu:12" and "src=prior:alexnet" in (fields[4] or "")
    assert said is not None and 'the job names "alexnet"' in said
