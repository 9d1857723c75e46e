"""The enforcement mechanisms are listed once (coda_node.enforce.mechanisms): a mechanism
registered from here alone is asked for by ``coda-node limit``, planned, applied with its
record written ahead, kept in the state file across a reload, put back, and shown by
``coda-node status`` and ``coda-node check``; and the state file keeps the format every
coda-node reads."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
from click.testing import CliRunner

from coda_common.config.codaconf import ConfigError, parse_config
from coda_node.cli import cli
from coda_node.enforce import mechanisms
from coda_node.enforce.enforcer import Enforcer
from coda_node.enforce.mechanisms.base import JobResult, JobStep, Mechanism, Record
from coda_node.enforce.state import (
    STATE_FILE,
    JobChanges,
    Limit,
    NodeState,
    StateFile,
    load_limits,
    save_limits,
)
from coda_node.policy.targets import JobFacts, JobTarget, plan
from coda_node.status.document import event_action, load_status, write_actions
from coda_node.status.text import YELLOW, Paint, event_lines, render
from coda_node.system.capability import Capability
from coda_node.system.cgroups import CgroupJob, CgroupLayout
from coda_node.system.paths import SystemRoot

JOB = 4242
SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "status.schema.json"


class PowerFiles:
    """A toy power-cap control: one file per capped job under ``dir``, its watts."""

    def __init__(self, directory: Path, state_file: Path) -> None:
        self.dir = directory
        self.state_file = state_file
        self.on_disk_before_write: list[dict[str, Any]] = []

    def set_cap(self, job_id: int, watts: int) -> None:
        # What the state file held when the cap was written: the write-ahead.
        self.on_disk_before_write.append(json.loads(self.state_file.read_text()))
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / f"job_{job_id}").write_text(f"{watts}\n")

    def clear(self, job_id: int) -> None:
        (self.dir / f"job_{job_id}").unlink()


@dataclass(slots=True)
class PowercapRecord(Record):
    powercap_w: int | None = None

    def is_empty(self) -> bool:
        return self.powercap_w is None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PowercapRecord:
        watts = d.get("powercap_w")
        if watts is not None and not isinstance(watts, int):
            raise ValueError(f"powercap_w is {watts!r}, not watts")
        return cls(powercap_w=watts)


class Powercap(Mechanism):
    name = "powercap"
    record = PowercapRecord
    events = (("power cap released", "powercap-release"), ("power cap ", "powercap"))
    limit_options = (
        click.Option(
            ["--power-cap", "power_cap_w"],
            type=click.IntRange(min=1),
            metavar="WATTS",
            help="Cap the job's power draw at WATTS.",
        ),
    )
    writer: PowerFiles | None

    def apply(
        self, step: JobStep, cg: CgroupJob, target: JobTarget, rec: PowercapRecord, r: JobResult
    ) -> None:
        if self.writer is None:
            return
        watts = target.extra_for(self.name)
        if watts is not None and rec.powercap_w != watts:
            rec.powercap_w = watts
            step.write_ahead()
            self.writer.set_cap(cg.job_id, watts)
            r.applied.append(f"power cap {watts} W")
        elif watts is None and rec.powercap_w is not None:
            self.writer.clear(cg.job_id)
            rec.powercap_w = None
            step.save()
            r.applied.append("power cap released")

    @classmethod
    def probe(cls, root: SystemRoot) -> list[Capability]:
        return [Capability("power cap", True, "toy power-cap files")]


@pytest.fixture
def powercap() -> Iterator[type[Powercap]]:
    mechanisms.register(Powercap)
    try:
        yield Powercap
    finally:
        mechanisms.unregister(Powercap.name)


def _job(job_id: int = JOB) -> CgroupJob:
    return CgroupJob(
        job_id=job_id,
        uid=1000,
        path=Path(f"/job_{job_id}"),
        cpus=frozenset({0, 1}),
        mems="0",
        steps=(),
        pids=(),
    )


def _enforcer(state: NodeState, files: StateFile, power: PowerFiles) -> Enforcer:
    return Enforcer(
        state=state,
        save=lambda: files.save(state, view=False),
        cpuset=None,
        quota=None,
        writers={"powercap": power},
    )


def test_the_built_in_mechanisms_are_listed_once_in_order() -> None:
    assert mechanisms.names() == ("cpuset", "quota", "rdt")
    # coda.conf is also read without coda-node (the controller): its own list of the
    # names NodeEnforce accepts is the registry's built-ins.
    alone = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from coda_common.config import codaconf; "
            "print(','.join(codaconf._NODE_MECHANISMS), 'coda_node' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert alone.stdout.split() == [",".join(mechanisms.names()), "False"]
    with pytest.raises(ConfigError, match=r"unknown mechanism 'powercap' \(choose from "):
        parse_config("NodeEnforce=cpuset,powercap\n", "coda.conf")


def test_a_toy_mechanism_is_planned_applied_recorded_restored_and_shown(
    tmp_path: Path, powercap: type[Powercap]
) -> None:
    assert mechanisms.names() == ("cpuset", "quota", "rdt", "powercap")
    cfg, _ = parse_config("NodeEnforce=cpuset,powercap\n", "coda.conf")
    assert cfg.node_enforce == ("cpuset", "powercap")

    facts = {JOB: JobFacts(job_id=JOB, allocated_cpus=frozenset({0, 1}), is_dnn=False)}
    limit = Limit(extra=(("powercap", 150),), reason="cool it")
    assert Limit.from_dict(json.loads(json.dumps(limit.to_dict()))) == limit
    targets, problems = plan(facts, {JOB: limit})
    assert problems == [] and targets[JOB].extra_for("powercap") == 150

    files = StateFile(tmp_path / "state")
    power = PowerFiles(tmp_path / "power", files.path)
    state = NodeState()
    enforcer = _enforcer(state, files, power)
    assert [m.name for m in enforcer.steps] == ["cpuset", "quota", "rdt", "powercap"]
    results = enforcer.reconcile({JOB: _job()}, targets)
    assert results[JOB].applied == ["power cap 150 W"] and results[JOB].failed == []
    assert (tmp_path / "power" / f"job_{JOB}").read_text() == "150\n"
    # On disk, fsynced, before the cap was written; beside the other mechanisms' keys.
    record = power.on_disk_before_write[0]["changes"][str(JOB)]
    assert record["powercap_w"] == 150
    assert {"cpuset_original", "quota_active", "rdt_group"} <= set(record)

    # A later tick with the same target writes nothing.
    assert enforcer.reconcile({JOB: _job()}, targets)[JOB].applied == []

    reloaded = StateFile(tmp_path / "state").load()
    assert reloaded.changes[JOB].powercap_w == 150
    assert reloaded.changes[JOB] == state.changes[JOB]

    back = _enforcer(reloaded, files, power).restore_all({JOB: _job()})
    assert back[JOB].applied == ["power cap released"]
    assert not (tmp_path / "power" / f"job_{JOB}").exists()
    assert reloaded.changes == {}
    assert json.loads(files.path.read_text())["changes"] == {}

    assert event_action("power cap 150 W") == "powercap"
    assert event_action("power cap released") == "powercap-release"
    assert {"powercap", "powercap-release", "cpuset"} <= write_actions()
    checked = CliRunner().invoke(cli, ["check", "--root", str(tmp_path), "--json"])
    rows = [c["name"] for c in json.loads(checked.output)]
    assert "power cap" in rows
    # Not through a job's cgroups: after the Slurm tree and the other mechanisms' rows.
    assert rows[:3] == ["cpuset control", "CPU quota", "Slurm job cgroups"]
    assert rows.index("memory-bandwidth monitoring") + 1 == rows.index("power cap")


def test_the_daemon_applies_a_registered_mechanism_and_status_shows_it(
    tmp_path: Path, powercap: type[Powercap]
) -> None:
    """A whole daemon on a fixture node: NodeEnforce names the toy, an admin limit asks for
    it, the daemon opens its writer, applies it on a tick, ``coda-node status`` shows the
    write, and a restore puts it back."""
    from tests.node.node_fixtures import build_node

    power_dir = tmp_path / "power"
    node_holder: list[Any] = []

    class Opened(Powercap):
        @classmethod
        def open(cls, root: SystemRoot, layout: CgroupLayout) -> Any:
            return PowerFiles(power_dir, node_holder[0].state_file)

    mechanisms.unregister(Powercap.name)
    mechanisms.register(Opened)
    node = build_node(tmp_path, jobs=2, enforce="cpuset,quota,rdt,powercap")
    node_holder.append(node)
    job_id = min(node.jobs)
    save_limits(node.state_dir, {job_id: Limit(extra=(("powercap", 150),), reason="cool it")})
    daemon = node.daemon()
    try:
        daemon.tick()
        assert (power_dir / f"job_{job_id}").read_text() == "150\n"
        on_disk = json.loads(node.state_file.read_text())["changes"][str(job_id)]
        assert on_disk["powercap_w"] == 150
        doc = load_status(node.view_file, interval_s=node.cfg.node_interval_s)
        shown = [e for e in doc["events"] if e["action"] == "powercap"]
        assert [(e["job_id"], e["what"]) for e in shown] == [(job_id, "power cap 150 W")]
        job = next(j for j in doc["jobs"] if j["job_id"] == job_id)
        assert job["limit"]["extra"] == {"powercap": 150}
        assert job["limit"]["reason"] == "cool it"
        jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
        assert "power cap 150 W" in render(doc, width=160)
        assert "power cap" in [c["name"] for c in doc["node"]["capabilities"]]
        assert daemon.restore()[job_id].applied == ["power cap released"]
        assert not (power_dir / f"job_{job_id}").exists()
    finally:
        daemon.close_counters()


def test_coda_node_limit_takes_the_options_of_a_registered_mechanism(
    tmp_path: Path, powercap: type[Powercap]
) -> None:
    """The toy declares ``--power-cap`` in this file alone, after coda_node.cli was
    imported: the command lists it, records its limit for the policy, and forgets it once
    the toy is unregistered."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    conf = tmp_path / "coda.conf"
    conf.write_text(f"NodeStateDir={state_dir}\nNodeRuntimeDir={tmp_path / 'run'}\n")
    runner = CliRunner()

    def limit(*args: str) -> Any:
        return runner.invoke(cli, ["limit", "--conf", str(conf), *args], prog_name="coda-node")

    shown = runner.invoke(cli, ["limit", "--help"], prog_name="coda-node")
    assert "--power-cap WATTS" in shown.output and "Cap the job's power draw" in shown.output
    assert shown.output.index("--mem-bw") < shown.output.index("--power-cap")
    assert shown.output.index("--power-cap") < shown.output.index("--reason")

    done = limit(str(JOB), "--power-cap", "200", "--cpu-quota", "1.5")
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"job {JOB}: limit recorded")
    recorded = load_limits(state_dir)[JOB]
    assert recorded == Limit(quota_cores=1.5, reason="admin limit", extra=(("powercap", 200),))
    facts = {JOB: JobFacts(job_id=JOB, allocated_cpus=frozenset({0, 1, 2, 3}), is_dnn=False)}
    targets, problems = plan(facts, {JOB: recorded})
    assert problems == [] and targets[JOB].extra_for("powercap") == 200
    assert targets[JOB].quota_cores == 1.5

    nothing = limit(str(JOB))
    assert nothing.exit_code == 1
    assert "give --cores, --cpus, --cpu-quota, --mem-bw or --power-cap" in nothing.output
    assert "0 is not in the range x>=1" in limit(str(JOB), "--power-cap", "0").output

    mechanisms.unregister(Powercap.name)
    try:
        assert "--power-cap" not in runner.invoke(cli, ["limit", "--help"]).output
        assert "No such option '--power-cap'" in limit(str(JOB), "--power-cap", "200").output
        assert "give --cores, --cpus, --cpu-quota or --mem-bw)" in limit(str(JOB)).output
    finally:
        mechanisms.register(Powercap)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cpus", "0-4000000000"], "bad CPU list '0-4000000000'"),
        (["--cpus", "3-1"], "runs backwards"),
        (["--cpus", "0-1", "--cores", "2"], "give --cores or --cpus, not both"),
        (["--cores", "0"], "0 is not in the range x>=1"),
        (["--cpu-quota", "nan"], "--cpu-quota nan: not a number of cores"),
        (["--cpu-quota", "inf"], "--cpu-quota inf: not a number of cores"),
    ],
)
def test_coda_node_limit_refuses_a_bad_limit_and_keeps_the_others(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """A limit that is no limit (a CPU range that would take all memory to build, one that
    runs backwards, two ways of naming the cores) is refused with why; the limits already
    recorded stay as they were."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    conf = tmp_path / "coda.conf"
    conf.write_text(f"NodeStateDir={state_dir}\nNodeRuntimeDir={tmp_path / 'run'}\n")
    save_limits(state_dir, {JOB: Limit(cores=2, reason="kept")})
    before = (state_dir / "limits.json").read_bytes()
    done = CliRunner().invoke(
        cli, ["limit", "--conf", str(conf), str(JOB + 1), *args], prog_name="coda-node"
    )
    assert done.exit_code != 0
    assert said in done.output
    assert "Traceback" not in done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert (state_dir / "limits.json").read_bytes() == before


def test_the_status_screen_paints_a_registered_mechanisms_limits_as_it_paints_the_built_ins(
    powercap: type[Powercap],
) -> None:
    def painted(what: str) -> bool:
        event = {"unix_s": 0, "job_id": JOB, "what": what, "reason": "r"}
        line = event_lines([{**event, "action": event_action(what)}], 160, Paint(True))[0]
        assert line.startswith(f"\x1b[{YELLOW}m") or not line.startswith("\x1b"), line
        return line.startswith("\x1b")

    assert painted("power cap 200 W") and painted("cpu quota 2 cores")
    assert painted("memory bandwidth 30") and painted("L3 cache 5 of 20 ways")
    assert not painted("power cap released") and not painted("cpu quota released")
    # A cpuset is where a job runs, not a throttle; nor is its restore.
    assert not painted("cpuset 0-3") and not painted("cpuset restored to 0-7")
    mechanisms.unregister(Powercap.name)
    try:
        assert not painted("power cap 200 W")
    finally:
        mechanisms.register(Powercap)


def test_registering_twice_or_a_taken_key_is_refused(powercap: type[Powercap]) -> None:
    with pytest.raises(ValueError, match="already registered"):
        mechanisms.register(Powercap)

    class Shadow(Powercap):
        name = "shadow"

    with pytest.raises(ValueError, match="powercap_w"):
        mechanisms.register(Shadow)

    @dataclass(slots=True)
    class EchoRecord(Record):
        echo_w: int | None = None

    class Echo(Powercap):
        name = "echo"
        record = EchoRecord

    with pytest.raises(ValueError, match="limit options --power-cap, power_cap_w"):
        mechanisms.register(Echo)
    assert mechanisms.names()[-1] == "powercap"


def test_the_daemon_opens_a_registered_mechanism(tmp_path: Path, powercap: type[Powercap]) -> None:
    from coda_node.daemon.wiring import make_enforcer

    opened: list[Path] = []

    class Opened(Powercap):
        @classmethod
        def open(cls, root: SystemRoot, layout: CgroupLayout) -> Any:
            opened.append(root.path("/"))
            return PowerFiles(tmp_path, tmp_path / STATE_FILE)

    mechanisms.unregister(Powercap.name)
    mechanisms.register(Opened)
    cfg, _ = parse_config("NodeEnforce=powercap\n", "coda.conf")
    layout = CgroupLayout(
        root=SystemRoot(tmp_path),
        version=1,
        cpuset_mount=None,
        cpu_mount=None,
        cpuacct_mount=None,
        freezer_mount=None,
        unified_mount=None,
        slurm_dirs=(tmp_path,),
        reason=None,
    )
    enforcer = make_enforcer(
        cfg,
        SystemRoot(tmp_path),
        layout,
        NodeState(),
        lambda: None,
        make_cpuset=lambda _layout: None,  # type: ignore[arg-type,return-value]
        make_quota=lambda _layout: None,  # type: ignore[arg-type,return-value]
        rdt=lambda: None,
    )
    assert [m.writer is not None for m in enforcer.steps] == [False, False, False, True]
    assert enforcer.mechanisms == {"powercap"} and opened


OLD_STATE = {
    "format": "coda-node-state",
    "format_version": 1,
    "pid": 4711,
    "written_unix_s": 1700000000.0,
    "changes": {
        "101": {
            "cpuset_original": {
                "job_id": 101,
                "cpus": {".": "0-3", "step_0": "0-3"},
                "affinity": {"5001": "0-3"},
            },
            "cpuset_applied": [0, 1],
            "allocated_cpus": [0, 1, 2, 3],
            "quota_original": None,
            "quota_applied": 1.5,
            "quota_active": True,
            "rdt_group": "coda_mb30",
            "rdt_mon_group": None,
        },
        "102": {
            "cpuset_original": None,
            "cpuset_applied": None,
            "allocated_cpus": None,
            "quota_original": None,
            "quota_applied": None,
            "quota_active": False,
            "rdt_group": "coda_l3w5",
            "rdt_mon_group": None,
        },
    },
}
"""A state file as coda-node wrote it with one flat record per job (every field of every
mechanism in one object)."""


def test_a_state_file_in_the_flat_format_loads_and_is_written_back_the_same(
    tmp_path: Path,
) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps(OLD_STATE))
    files = StateFile(tmp_path)
    state = files.load()
    ch = state.changes[101]
    assert ch.cpuset_original is not None and ch.cpuset_original["cpus"]["step_0"] == "0-3"
    assert ch.cpuset_applied == [0, 1] and ch.allocated_cpus == [0, 1, 2, 3]
    assert ch.quota_active and ch.quota_applied == 1.5 and ch.quota_original is None
    assert ch.rdt_group == "coda_mb30" and ch.record("rdt").rdt_group == "coda_mb30"
    assert ch.recorded_cpus() == frozenset({0, 1, 2, 3})
    assert state.changes[102].rdt_group == "coda_l3w5" and not state.changes[102].quota_active
    # Written back: the same keys in the same order, the same values.
    files.save(state, view=False)
    written = json.loads((tmp_path / STATE_FILE).read_text())["changes"]
    assert written == OLD_STATE["changes"]
    for job_id, record in written.items():
        assert list(record) == list(OLD_STATE["changes"][job_id])  # type: ignore[index]


def test_a_record_with_a_bad_field_of_one_mechanism_is_refused() -> None:
    with pytest.raises(ValueError, match="quota_active is str"):
        JobChanges.from_dict({"quota_active": "yes"})
    with pytest.raises(ValueError, match="a record is a JSON object"):
        JobChanges.from_dict([])
    with pytest.raises(AttributeError, match="no enforcement mechanism records"):
        JobChanges().no_such_field  # noqa: B018
