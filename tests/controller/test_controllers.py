"""Several SlurmctldHost: which controller this is, the files each controller's hook writes,
and ``coda-slurm status`` reading them all, per host, without mixing or losing entries."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from coda_common.config.codaconf import parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurmctld_hosts, slurmctld_host_names
from slurm_plugin.cli import status as cli_status
from slurm_plugin.cli.status import collect_status, render
from slurm_plugin.config.controllers import Controllers, host_file, this_controller
from slurm_plugin.hook import submit as hook
from tests.controller.test_hook import FakeLib, field, lib  # noqa: F401 (a fixture)
from tests.controller.test_slurm_status import (
    entry,
    journal_lines,
    status_cli,
    submit_gpu_job,
    write_journal,
    write_stats,
)


@pytest.mark.parametrize(
    ("path", "host", "several", "expected"),
    [
        ("/var/lib/coda/decisions.jsonl", "ctl1", False, "/var/lib/coda/decisions.jsonl"),
        ("/var/lib/coda/decisions.jsonl", "ctl1", True, "/var/lib/coda/decisions.ctl1.jsonl"),
        ("/var/lib/coda/hook-stats.json", "ctl2", True, "/var/lib/coda/hook-stats.ctl2.json"),
        ("/shared/coda/%h/decisions.jsonl", "ctl2", False, "/shared/coda/ctl2/decisions.jsonl"),
        ("/shared/coda/stats-%h.json", "ctl1", True, "/shared/coda/stats-ctl1.json"),
        ("/var/lib/coda/journal", "ctl1", True, "/var/lib/coda/journal.ctl1"),
        ("/var/lib/coda/.journal", "ctl1", True, "/var/lib/coda/.journal.ctl1"),
        # slurm.conf's names land in a file name: never a path of their own.
        ("/var/lib/coda/%h.json", "../etc", True, "/var/lib/coda/.._etc.json"),
        ("/var/lib/coda/%h.json", "..", True, "/var/lib/coda/_...json"),
    ],
)
def test_each_controller_has_files_of_its_own(
    path: str, host: str, several: bool, expected: str
) -> None:
    assert host_file(Path(path), host, several=several) == Path(expected)


def test_the_controller_is_the_entry_the_host_name_matches_short_or_long() -> None:
    hosts = ("ctl1", "ctl2.example.org")
    assert this_controller(hosts, "ctl1", "ctl1.example.org") == "ctl1"
    assert this_controller(hosts, "ctl2", "ctl2.example.org") == "ctl2.example.org"
    assert this_controller(hosts, "login1", "login1.example.org") == "login1"
    assert this_controller((), "ctl1", "ctl1") == "ctl1"


def test_slurmctld_hosts_are_read_in_order_with_includes(tmp_path: Path) -> None:
    (tmp_path / "ctld.conf").write_text("SlurmctldHost=ctl2(10.0.0.3)\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=x\nSlurmctldHost=ctl1(10.0.0.2)\nInclude ctld.conf\n"
        "NodeName=gpu01 SlurmctldHost=not-a-controller\n"
    )
    assert read_slurmctld_hosts(conf) == ("ctl1", "ctl2")
    old = [("controlmachine", "a"), ("backupcontroller", "b")]
    assert slurmctld_host_names(old) == ("a", "b")
    assert slurmctld_host_names([("clustername", "x")]) == ()
    (tmp_path / "loop.conf").write_text("Include loop.conf\n")
    with pytest.raises(ConfigError):
        read_slurmctld_hosts(tmp_path / "loop.conf")


def test_every_controllers_files_are_listed_by_host() -> None:
    two = Controllers(("ctl1", "ctl2"), "login1")
    assert two.files(Path("/s/d.jsonl")) == {
        "ctl1": Path("/s/d.ctl1.jsonl"),
        "ctl2": Path("/s/d.ctl2.jsonl"),
    }
    assert two.file_of(Path("/s/d.jsonl"), "ctl2") == Path("/s/d.ctl2.jsonl")
    one = Controllers(("ctl1",), "ctl1")
    assert one.files(Path("/s/d.jsonl")) == {"ctl1": Path("/s/d.jsonl")}
    assert one.files(Path("/s/%h.jsonl")) == {"ctl1": Path("/s/ctl1.jsonl")}
    assert one.files(None) == {} and one.file_of(None) is None


@pytest.fixture
def two_controllers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site with a primary and a backup controller, its files on shared storage."""
    (tmp_path / "profiles").mkdir(mode=0o755)
    (tmp_path / "slurm.conf").write_text(
        "SlurmctldHost=ctl1(10.0.0.2)\nSlurmctldHost=ctl2(10.0.0.3)\n"
        f"SlurmctldLogFile={tmp_path / 'ctld.log'}\n"
    )
    conf = tmp_path / "coda.conf"
    conf.write_text(
        f"ProfileStore={tmp_path / 'profiles'}\nHookStatsFile={tmp_path / 'stats.json'}\n"
        f"DecisionJournal={tmp_path / 'decisions.jsonl'}\n"
    )
    monkeypatch.setattr(cli_status, "squeue_submit_times", lambda: [])
    return conf


def test_status_shows_each_controller_and_sums_their_decisions(two_controllers: Path) -> None:
    tmp, now = two_controllers.parent, time.time()
    # The primary decided three jobs and died an hour ago; the backup decided two since.
    write_stats(tmp / "stats.ctl1.json", host="ctl1", calls=3, written_unix_s=now - 3600)
    write_stats(tmp / "stats.ctl2.json", host="ctl2", calls=2, last_call_unix_s=now - 5)
    write_journal(tmp / "decisions.ctl1.jsonl", [entry(now - 4000 + i, "set") for i in range(3)])
    write_journal(tmp / "decisions.ctl2.jsonl", [entry(now - 60 + i, "lower") for i in range(2)])
    cfg, _ = parse_config(two_controllers.read_text())
    doc = collect_status(cfg, two_controllers, 86400.0, now)
    by_host = {c["host"]: c for c in doc["controllers"]}
    assert list(by_host) == ["ctl1", "ctl2"]
    assert (by_host["ctl1"]["decisions"], by_host["ctl2"]["decisions"]) == (3, 2)
    assert by_host["ctl1"]["hook"]["state"] == "stale" and by_host["ctl2"]["hook"]["state"] == "ok"
    assert doc["hook"]["stats"]["host"] == "ctl2"  # the one in control
    assert doc["decisions"]["by_action"] == {
        "lower": {"jobs": 2, "gpus": 2},
        "set": {"jobs": 3, "gpus": 3},
    }
    assert doc["journal"]["files"] == [
        str(tmp / "decisions.ctl1.jsonl"),
        str(tmp / "decisions.ctl2.jsonl"),
    ]
    text = render(doc)
    assert "Hook     ctl1 (primary): 3 calls since" in text
    assert "Hook     ctl2 (backup): 2 calls since" in text
    assert f"Journal  ctl1 (primary): {tmp / 'decisions.ctl1.jsonl'}: 3 decisions" in text
    assert f"Journal  ctl2 (backup): {tmp / 'decisions.ctl2.jsonl'}: 2 decisions" in text
    warn = [v for v in doc["verdicts"] if v["level"] == "warn"]
    assert len(warn) == 1 and warn[0]["message"].startswith("ctl1 (primary): hook stats at ")
    assert "scontrol ping" in warn[0]["message"]


def test_a_controller_whose_files_this_host_cannot_see_is_named(two_controllers: Path) -> None:
    tmp = two_controllers.parent
    write_stats(tmp / "stats.ctl1.json", host="ctl1")
    write_journal(tmp / "decisions.ctl1.jsonl", [entry(time.time() - 60, "set")])
    result = status_cli("--conf", str(two_controllers))
    assert result.rc == 0, result.err
    assert f"Hook     ctl2 (backup): no stats at {tmp / 'stats.ctl2.json'} (missing)" in result.out
    assert f"Journal  ctl2 (backup): {tmp / 'decisions.ctl2.jsonl'}: not written yet" in (
        result.out
    )
    assert "ctl2 (backup): no hook stats at" in result.out
    doc = json.loads(status_cli("--conf", str(two_controllers), "--json").out)
    assert doc["decisions"]["decisions"] == 1 and doc["controllers_error"] is None


def test_one_controller_keeps_its_files_as_configured(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("SlurmctldHost=ctl1\n")
    conf = tmp_path / "coda.conf"
    conf.write_text(f"ProfileStore={tmp_path}\nDecisionJournal={tmp_path / 'd.jsonl'}\n")
    write_journal(tmp_path / "d.jsonl", [entry(time.time() - 60, "set")])
    cfg, _ = parse_config(conf.read_text())
    doc = collect_status(cfg, conf, 86400.0, time.time())
    assert [c["journal"]["path"] for c in doc["controllers"]] == [str(tmp_path / "d.jsonl")]
    assert "Journal  " + str(tmp_path / "d.jsonl") + ": 1 decisions" in render(doc)


def test_the_hook_of_each_controller_writes_files_of_its_own(
    lib: FakeLib,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "ctl2.example.org")
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text(
        "SlurmctldHost=ctl1(10.0.0.2)\nSlurmctldHost=ctl2(10.0.0.3)\n" + slurm_conf.read_text()
    )
    hook._reload_config(hook.current_state(), (tmp_path / "coda.conf").stat().st_mtime_ns)
    state = hook.current_state()
    assert state.journal_path == tmp_path / "decisions.ctl2.jsonl"
    rc, desc = submit_gpu_job(lib)
    assert rc == 0 and field(desc, "cpus_per_tres") == "gres:gpu:6"
    state.journal.flush()
    hook._write_stats(state)
    assert [e["cpg"] for e in journal_lines(tmp_path / "decisions.ctl2.jsonl")] == [6]
    assert not (tmp_path / "decisions.jsonl").exists()
    stats = json.loads((tmp_path / "stats.ctl2.json").read_text())
    assert stats["host"] == "ctl2" and stats["controllers"] == ["ctl1", "ctl2"]
    assert stats["calls"] == 1 and stats["journal"]["path"] == str(
        tmp_path / "decisions.ctl2.jsonl"
    )
