"""The compiled plugin's one submit path: C hands every job to Python, Python decides
(or finds the plan in its decision memo) and writes the job through the C helpers; a
repeated job gets exactly what the first one got.

These tests run the compiled plugin module in this process through its real entry
points (``init``, ``job_submit``, ``fini``), with a stand-in for the few slurmctld
functions it needs (tests/controller/compiled_hook.py).  Calls that reach Python are counted by
wrapping ``hook.job_submit``; decisions, by wrapping ``hook.decide`` (a memo hit makes
none).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from coda_common.store.profiles import ProfileStore
from slurm_plugin.hook import submit as hook
from tests.controller import compiled_hook
from tests.controller.test_hook_cache import CASES, WRITTEN, DecideSpy, _profile, untokened

# The plugin module is built against this machine's slurm.h: the version matrix runs these
# on every Slurm (tests/matrix.py).
pytestmark = pytest.mark.compiled

GPU = "gres:gpu:2"
BASE: dict[str, Any] = {
    "tres_per_node": GPU,
    "comment": "coda:workload=resnet50",
    "script": "#!/bin/sh\n#SBATCH -N 1\npython train.py --epochs 90\n",
    "name": "train.sh",
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    try:
        return compiled_hook.load(tmp_path_factory.mktemp("standin"))
    except compiled_hook.Unavailable as exc:
        if os.environ.get("CODA_REQUIRE_SLURM") == "1":  # CI builds the plugin: never skip
            raise
        pytest.skip(str(exc))


@dataclass
class Plugin:
    ffi: Any
    lib: Any
    root: Path
    log: Path
    python_calls: list[int] = field(default_factory=lambda: [0])
    decided: DecideSpy = field(default_factory=DecideSpy)

    def desc(self, case: dict[str, Any]) -> Any:
        fields = {k: v for k, v in case.items() if k != "submit_uid"}
        return compiled_hook.new_desc(self.ffi, self.lib, **fields)

    def submit(self, case: dict[str, Any], err_first: str | None = None) -> tuple:
        """What a user and an admin see of one submission (as in
        tests/controller/test_hook_cache.py)."""
        ffi = self.ffi
        desc = self.desc(case)
        err = compiled_hook.new_err(ffi, self.lib, err_first)
        before = self.lines()
        rc = self.lib.job_submit(desc, case.get("submit_uid", 1000), err)
        said = None if err[0] == ffi.NULL else ffi.string(err[0]).decode("utf-8", "replace")
        fields = tuple(
            None
            if getattr(desc, name) == ffi.NULL
            else untokened(ffi.string(getattr(desc, name)).decode("utf-8", "replace"))
            for name in WRITTEN
        )
        return rc, fields, desc.cpus_per_task, said, self.lines()[len(before) :]

    def lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    @property
    def calls(self) -> int:
        return self.python_calls[0]

    @property
    def decisions(self) -> int:
        return self.decided.calls


@contextlib.contextmanager
def _started(
    compiled: tuple[Any, Any], root: Path, monkeypatch: pytest.MonkeyPatch, extra: str = ""
) -> Iterator[Plugin]:
    ffi, lib = compiled
    store = ProfileStore(root / "profiles")
    store.ensure_root()
    store.write(_profile("resnet50", 6))
    store.write(_profile("weak", 3, confidence=0.2))
    conf = root / "coda.conf"
    conf.write_text(
        f"ProfileStore={store.root}\nHookStatsFile={root / 'stats.json'}\n"
        f"DecisionJournal={root / 'decisions.jsonl'}\nExcludePartitions=debug\n"
        f"ReloadIntervalS=3600\n{extra}"
    )
    if "HookBudgetMs" not in extra:
        # A decision slowed by a loaded machine is still the decision these tests compare.
        conf.write_text(conf.read_text() + "HookBudgetMs=2000\n")
    (root / "slurm.conf").write_text("NodeName=g1 CPUs=32 Gres=gpu:4\nPartitionName=gpu Nodes=g1\n")
    monkeypatch.setenv("CODA_CONF", str(conf))
    log = root / "slurmctld.log"
    monkeypatch.setenv("CODA_STANDIN_LOG", str(log))
    plugin = Plugin(ffi, lib, root, log)
    real = hook.job_submit

    def counting(desc: Any, submit_uid: int, err_msg: Any) -> int:
        plugin.python_calls[0] += 1
        return real(desc, submit_uid, err_msg)

    monkeypatch.setattr(hook, "job_submit", counting)
    monkeypatch.setattr(hook, "decide", plugin.decided)
    compiled_hook.start(ffi, lib)
    # The reloader thread ticks once at start (then every 3600 s). Wait for that first tick
    # to end (it writes the stats file last), so the tests' own ticks are the only ones,
    # however late the thread runs.
    stats = root / "stats.json"
    deadline_s = time.monotonic() + 60.0
    while not stats.exists() and time.monotonic() < deadline_s:
        time.sleep(0.005)
    assert stats.exists(), "the reloader's first tick did not run within 60 s"
    try:
        yield plugin
    finally:
        lib.fini()


@pytest.fixture
def plugin(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Plugin]:
    with _started(compiled, tmp_path, monkeypatch) as started:
        yield started


def _reload_tick() -> None:
    """What the reloader thread does every ReloadIntervalS (3600 s here: done by hand)."""
    state = hook.current_state()
    assert state is not None
    state.cache.refresh()
    hook._on_reload_tick()


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_a_repeated_job_gets_what_the_first_one_got(plugin: Plugin, case: dict) -> None:
    first = plugin.submit(case)
    rejected = first[0] != 0
    gpu = any(k.startswith("tres_per_") for k in case)
    # Every job enters Python; a job asking for no GPU stops there before the decision.
    assert (plugin.calls, plugin.decisions) == (1, 1 if gpu else 0)
    second = plugin.submit(case)
    assert second == first
    # The repeat is answered from the memo (a rejected job's plan is kept as well).
    assert (plugin.calls, plugin.decisions) == (2, 1 if gpu else 0), rejected


def test_a_memo_hit_keeps_what_an_earlier_plugin_wrote(plugin: Plugin) -> None:
    case = {**CASES[0], "script": BASE["script"], "admin_comment": "from-lua"}
    plugin.submit(case)
    rc, fields, _cpt, said, _lines = plugin.submit(case, err_first="lua: hello")
    assert plugin.decisions == 1 and rc == 0
    assert fields[WRITTEN.index("admin_comment")].startswith("from-lua coda:sig=")
    assert said is not None
    first, second = said.split("\n")
    assert first == "lua: hello" and second.startswith(
        "coda (if Slurm accepts the job): --cpus-per-gpu=6"
    )


@pytest.mark.parametrize(
    ("setting", "batch_told", "interactive_told"),
    [("", True, False), ("UserMessage=all\n", True, True), ("UserMessage=none\n", False, False)],
    ids=["default", "all", "none"],
)
def test_user_message_decides_who_sees_the_line_decided_or_from_the_memo(
    compiled: tuple[Any, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    batch_told: bool,
    interactive_told: bool,
) -> None:
    """sbatch sends a script, srun and salloc none. UserMessage decides which of them print
    coda's line, when the job is decided and when its plan comes from the memo; the
    decision is in the admin comment and slurmctld's log for all of them."""
    interactive = {k: v for k, v in BASE.items() if k != "script"}
    with _started(compiled, tmp_path, monkeypatch, setting) as plugin:
        for case, told in ((BASE, batch_told), (interactive, interactive_told)):
            for answer in ("decided", "memo"):
                decisions = plugin.decisions
                rc, fields, _cpt, said, lines = plugin.submit(case)
                assert plugin.decisions == decisions + (answer == "decided")
                assert rc == 0 and fields[0] == "gres:gpu:6", answer
                what = ("interactive" if case is interactive else "batch", answer)
                if told:
                    assert said is not None and said.startswith(hook.IF_ACCEPTED), what
                else:
                    assert said is None, what
                note = fields[WRITTEN.index("admin_comment")]
                assert note is not None and "coda: --cpus-per-gpu=6" in note, what
                assert any("action=set cpg=6" in line for line in lines), what


# One field of BASE changed at a time: each is a job the memo has not seen.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("user_id", {"user_id": 1001}),
    ("submit_uid", {"user_id": 0xFFFFFFFE, "submit_uid": 1002}),
    ("cpus_per_task", {"cpus_per_task": 4}),
    ("min_nodes", {"min_nodes": 1}),
    ("num_tasks", {"num_tasks": 2}),
    ("ntasks_per_node", {"ntasks_per_node": 2}),
    ("name", {"name": "train2.sh"}),
    ("partition", {"partition": "gpu"}),
    ("tres_per_node", {"tres_per_node": "gres:gpu:1"}),
    ("tres_per_job", {"tres_per_job": "gres:gpu:1"}),
    ("tres_per_task", {"tres_per_task": "gres:gpu:1"}),
    ("tres_per_socket", {"tres_per_socket": "gres:gpu:1"}),
    ("cpus_per_tres", {"cpus_per_tres": "gres:gpu:3"}),
    ("comment", {"comment": "coda:workload=weak"}),
    # the same length, one byte different in the middle: a different signature
    ("script", {"script": BASE["script"].replace("90", "91")}),
    ("prefer", {"prefer": "nvme"}),
    ("empty prefer", {"prefer": ""}),
]


def test_every_field_the_decision_reads_is_in_the_memo_key(plugin: Plugin) -> None:
    base = plugin.submit(BASE)
    assert plugin.decisions == 1
    for label, change in VARIANTS:
        before = plugin.decisions
        answer = plugin.submit({**BASE, **change})
        assert plugin.decisions == before + 1, f"{label}: answered from another job's plan"
        again = plugin.submit({**BASE, **change})
        assert again == answer, label
        assert plugin.decisions == before + 1, label
    # And the first job is still answered as it was.
    decisions = plugin.decisions
    assert plugin.submit(BASE) == base
    assert plugin.decisions == decisions


def test_a_script_changed_in_the_middle_gets_its_own_signature(plugin: Plugin) -> None:
    a = plugin.submit({**BASE, "comment": ""})
    b = plugin.submit({**BASE, "comment": "", "script": BASE["script"].replace("90", "91")})
    assert plugin.decisions == 2
    sig_a = a[1][WRITTEN.index("admin_comment")].split()[0]
    sig_b = b[1][WRITTEN.index("admin_comment")].split()[0]
    assert sig_a != sig_b


def test_a_store_change_empties_the_memo(plugin: Plugin, tmp_path: Path) -> None:
    assert plugin.submit(BASE)[1][0] == "gres:gpu:6"
    assert plugin.submit(BASE)[1][0] == "gres:gpu:6"
    assert plugin.decisions == 1
    ProfileStore(tmp_path / "profiles").write(_profile("resnet50", 4))
    _reload_tick()
    assert plugin.submit(BASE)[1][0] == "gres:gpu:4"
    assert plugin.decisions == 2
    assert plugin.submit(BASE)[1][0] == "gres:gpu:4"
    assert plugin.decisions == 2


def test_a_conf_change_empties_the_memo(plugin: Plugin, tmp_path: Path) -> None:
    assert plugin.submit(BASE)[1][0] == "gres:gpu:6"
    assert plugin.submit(BASE)[1][0] == "gres:gpu:6"
    conf = tmp_path / "coda.conf"
    conf.write_text(conf.read_text() + "MaxCpusPerGpu=3\n")
    os.utime(conf, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    _reload_tick()
    rc, fields, _cpt, said, _lines = plugin.submit(BASE)
    assert rc == 0 and fields[0] == "gres:gpu:3"
    assert said is not None and "capped at MaxCpusPerGpu=3" in said
    assert plugin.decisions == 2
    assert plugin.submit(BASE)[1][0] == "gres:gpu:3"
    assert plugin.decisions == 2


def test_repeated_jobs_are_counted_and_journaled(plugin: Plugin, tmp_path: Path) -> None:
    for job_id in (11, 12, 13):
        assert plugin.submit({**BASE, "job_id": job_id})[1][0] == "gres:gpu:6"
    plugin.submit({"num_tasks": 4})  # a CPU job: counted as a call, not a decision
    assert plugin.decisions == 1
    stats = hook.current_state().stats
    assert (stats.calls, stats.gpu_jobs, stats.changed) == (4, 3, 3)
    assert len(stats.durations_ns) == 4 and all(d > 0 for d in stats.durations_ns)
    hook._on_reload_tick()  # writes the stats file
    written = json.loads((tmp_path / "stats.json").read_text())
    assert (written["calls"], written["gpu_jobs"], written["changed"]) == (4, 3, 3)
    plugin.lib.fini()  # flushes the journal
    entries = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [e["job_id"] for e in entries] == [11, 12, 13]
    assert {e["action"] for e in entries} == {"set"}
    assert {e["cpg"] for e in entries} == {6}
    assert len({e["tok"] for e in entries}) == 3
    assert all(e["hook_us"] > 0 and e["fail_open"] is False for e in entries)
    compiled_hook.start(plugin.ffi, plugin.lib)  # the fixture's fini() needs a live plugin


@pytest.mark.parametrize("value", ["yes", "no"])
def test_a_conf_that_still_sets_hook_fast_path_loads_and_changes_nothing(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "old").mkdir()
    with _started(compiled, tmp_path / "plain", monkeypatch) as plugin:
        plain = [plugin.submit(BASE)[:4] for _ in range(2)]
    with _started(compiled, tmp_path / "old", monkeypatch, f"HookFastPath={value}\n") as plugin:
        assert [plugin.submit(BASE)[:4] for _ in range(2)] == plain
        said = [line for line in plugin.lines() if "HookFastPath" in line]
        assert len(said) == 1 and "no longer has an effect" in said[0], said


def test_a_cpu_jobs_skip_is_logged_every_time_at_verbose(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _started(compiled, tmp_path, monkeypatch, "LogLevel=verbose\n") as plugin:
        cpu = {"num_tasks": 4, "name": "cpu.sh"}
        first = plugin.submit(cpu)
        assert plugin.decisions == 1
        assert any("skip" in line for line in first[4]), first[4]
        # From the second time on the memo answers it, with the same verbose line.
        assert plugin.submit(cpu) == first
        assert plugin.decisions == 1


# What sbatch of each Slurm release sends for `-n2 -c 9 --gpus-per-task=1`.
MINUS_C_JOBS = {
    "22.05": {"tres_per_task": "gres:gpu:1", "tres_per_task_written": "gres:gpu:1"},
    "24.11": {"tres_per_task": "cpu=9,gres/gpu=1", "tres_per_task_written": "cpu=6,gres/gpu=1"},
}


@pytest.mark.parametrize("release", sorted(MINUS_C_JOBS))
def test_replacing_minus_c_moves_all_sbatch_derived_from_it(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    """UserValue=replace: -c 9 becomes the profile's 6 per GPU x 2 GPUs over 2 tasks, and
    everything sbatch derived from -c follows (coda_set_cpus_per_task), decided or from
    the memo."""
    form = MINUS_C_JOBS[release]
    job = {
        **BASE,
        "tres_per_node": None,
        "tres_per_task": form["tres_per_task"],
        "cpus_per_task": 9,
        "pn_min_cpus": 9,  # sbatch raises --mincpus to -c
        "min_cpus": 18,  # tasks x -c
        "num_tasks": 2,
    }
    job = {k: v for k, v in job.items() if v is not None}
    with _started(compiled, tmp_path, monkeypatch, "UserValue=replace\n") as plugin:
        for answer in ("decided", "memo"):
            decisions = plugin.decisions
            desc = plugin.desc(job)
            err = compiled_hook.new_err(plugin.ffi, plugin.lib)
            assert plugin.lib.job_submit(desc, 1000, err) == 0
            assert (plugin.decisions > decisions) == (answer == "decided")
            ffi = plugin.ffi
            assert desc.cpus_per_tres == ffi.NULL
            assert (desc.cpus_per_task, desc.pn_min_cpus, desc.min_cpus) == (6, 6, 12)
            written = ffi.string(desc.tres_per_task).decode()
            assert written == form["tres_per_task_written"]
            assert "--cpus-per-task=6" in ffi.string(err[0]).decode()


def test_a_larger_mincpus_of_the_users_own_is_kept(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = {**BASE, "cpus_per_task": 9, "pn_min_cpus": 14, "min_cpus": 9}
    with _started(compiled, tmp_path, monkeypatch, "UserValue=replace\n") as plugin:
        desc = plugin.desc(job)
        assert plugin.lib.job_submit(desc, 1000, compiled_hook.new_err(plugin.ffi, plugin.lib)) == 0
        assert desc.cpus_per_task == 12  # 6 per GPU x 2 GPUs, one task
        assert desc.pn_min_cpus == 14


def test_a_hostile_tres_per_task_is_rewritten_within_its_buffer(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``cpu=`` item grows to the new count; the C side sizes its buffer for that."""
    hostile = ",".join(["cpu=1"] * 400 + ["gres/gpu=1"])
    job = {**BASE, "tres_per_task": hostile, "cpus_per_task": 1}
    del job["tres_per_node"]
    with _started(compiled, tmp_path, monkeypatch, "UserValue=replace\n") as plugin:
        for _ in ("decided", "memo"):
            desc = plugin.desc(job)
            err = compiled_hook.new_err(plugin.ffi, plugin.lib)
            assert plugin.lib.job_submit(desc, 1000, err) == 0
            written = plugin.ffi.string(desc.tres_per_task).decode()
            assert written == ",".join(["cpu=6"] * 400 + ["gres/gpu=1"])


@pytest.mark.parametrize("user_value", ["replace", "lower"])
def test_a_rewritten_cpus_per_gpu_rescales_the_min_cpus_sbatch_sent(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_value: str
) -> None:
    """sbatch 24.11 sends min_cpus = --cpus-per-gpu x GPUs; lowered to the profile's 6 per
    GPU, the job must ask for 6 x 2 (coda_rescale_min_cpus), decided or from the memo."""
    job = {**BASE, "tres_per_node": "gres/gpu:2", "cpus_per_tres": "gres/gpu:9", "min_cpus": 18}
    with _started(compiled, tmp_path, monkeypatch, f"UserValue={user_value}\n") as plugin:
        for answer in ("decided", "memo"):
            decisions = plugin.decisions
            desc = plugin.desc(job)
            assert (
                plugin.lib.job_submit(desc, 1000, compiled_hook.new_err(plugin.ffi, plugin.lib))
                == 0
            )
            assert (plugin.decisions > decisions) == (answer == "decided")
            assert plugin.ffi.string(desc.cpus_per_tres) == b"gres/gpu:6"
            assert desc.min_cpus == 12


def test_gpus_per_socket_pass_as_submitted_decided_or_from_the_memo(
    compiled: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--gpus-per-socket: the GPU count follows the sockets Slurm picks; nothing written."""
    base = {k: v for k, v in BASE.items() if k != "tres_per_node"}
    base["tres_per_socket"] = "gres:gpu:1"
    with _started(compiled, tmp_path, monkeypatch) as plugin:
        for sockets in (None, 1, 2):
            job = base if sockets is None else {**base, "sockets_per_node": sockets}
            first = plugin.submit(job)
            again = plugin.submit(job)
            assert first[:4] == again[:4]
            assert first[0] == 0 and first[1][0] is None  # no cpus_per_tres
