"""A backup controller takes over: two real slurmctlds (``SlurmctldHost`` twice, each in its
own network and UTS namespace, one StateSaveLocation, one coda.conf and profile store).

The primary is killed (SIGKILL); the backup, whose job_submit/coda was loaded when it
started on standby and is never started again, takes over after SlurmctldTimeout and
rewrites a GPU job as the primary did. ``coda-slurm status`` shows each controller's hook
and journal by host. ``scontrol reconfigure`` on the backup in control (a new slurmctld
process from Slurm 23.11 on) keeps rewriting; the primary restarted takes control back and
rewrites too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coda_common.slurm.adminrecord import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, DevClusterError
from tests.conftest import gres, require_slurm, started
from tests.controller.test_submit_slurm import put_profile

pytestmark = pytest.mark.slurm

CODA_SLURM = [sys.executable, "-m", "slurm_plugin.cli.main"]
CTLD_TIMEOUT_S = 5
"""SlurmctldTimeout: the backup takes over this long after the primary fell silent."""
WAIT_S = 180.0
"""How long a step waits on this loaded 2-vCPU machine (a takeover takes about 6 s)."""
GPU_JOB = ["--hold", "--gpus-per-node=2", "--comment=coda:workload=resnet50"]


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[DevCluster]:
    require_slurm()
    yield from started(DevCluster(tmp_path / "ha", controllers=2, ctld_timeout_s=CTLD_TIMEOUT_S))


def _stats(c: DevCluster, host: str) -> dict:
    try:
        return json.loads(c.root.joinpath(f"hook-stats.{host}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _journal_tokens(c: DevCluster, host: str) -> list[str]:
    path = c.root / f"decisions.{host}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["tok"] for line in path.read_text().splitlines() if line]


def _submit(c: DevCluster) -> tuple[str, str]:
    """Submit the GPU job until a controller takes it; its CpusPerTres and token."""
    deadline = time.monotonic() + WAIT_S
    while True:
        # sbatch tries each SlurmctldHost; a backup still standing by answers "in standby".
        try:
            job_id, _ = c.sbatch(GPU_JOB, "#!/bin/sh\nsleep 300\n")
            break
        except (DevClusterError, subprocess.TimeoutExpired):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    fields = c.show_job(job_id)
    return fields.get("CpusPerTres", ""), parse_admin_record(fields["AdminComment"])["tok"]


def _decided_by(c: DevCluster, token: str) -> str:
    """The controller whose journal holds ``token`` (the hook flushes it within 1 s)."""
    found: list[str] = []

    def journaled() -> bool:
        found[:] = [h for h in c.controller_names if token in _journal_tokens(c, h)]
        return bool(found)

    _wait(journaled, f"decision {token} in a journal", timeout_s=30)
    assert len(found) == 1, found
    return found[0]


def _status(c: DevCluster) -> tuple[dict, str]:
    def run(*extra: str) -> str:
        proc = subprocess.run(
            [*CODA_SLURM, "status", "--conf", str(c.coda_conf), *extra],
            env=c.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    return json.loads(run("--json")), run()


def test_the_backup_takes_over_and_rewrites_as_the_primary_did(ha: DevCluster) -> None:
    c = ha
    put_profile(c, "workload:*:resnet50", 6)
    # Both hooks, the standby backup's too, read the store.
    for host in ("ctl1", "ctl2"):
        _wait(lambda h=host: _stats(c, h).get("profiles", 0) >= 1, f"{host}'s hook to load")
    assert _stats(c, "ctl2")["host"] == "ctl2" and _stats(c, "ctl2")["calls"] == 0

    primary_cpt, tok1 = _submit(c)
    assert primary_cpt == gres("gres:gpu:6")
    assert _decided_by(c, tok1) == "ctl1"

    c.kill_controller("ctl1")
    backup_cpt, tok2 = _submit(c)
    assert backup_cpt == primary_cpt
    assert _decided_by(c, tok2) == "ctl2"

    _wait(lambda: _stats(c, "ctl2").get("calls") == 1, "ctl2's hook to count the call")
    doc, text = _status(c)
    by_host = {h["host"]: h for h in doc["controllers"]}
    assert [h["host"] for h in doc["controllers"]] == ["ctl1", "ctl2"]
    assert by_host["ctl1"]["role"] == "primary" and by_host["ctl2"]["role"] == "backup"
    assert by_host["ctl1"]["decisions"] == 1 and by_host["ctl2"]["decisions"] == 1
    assert by_host["ctl2"]["journal"]["path"] == str(c.root / "decisions.ctl2.jsonl")
    assert doc["hook"]["stats"]["host"] == "ctl2"  # the hook in control
    assert doc["decisions"]["decisions"] == 2
    assert doc["decisions"]["by_action"]["set"]["jobs"] == 2
    assert "Hook     ctl1 (primary): 1 calls" in text
    assert "Hook     ctl2 (backup): 1 calls" in text
    assert f"Journal  ctl2 (backup): {c.root / 'decisions.ctl2.jsonl'}: 1 decisions" in text

    # scontrol reconfigure on the backup in control (from 23.11: a new slurmctld process).
    c.run(["scontrol", "reconfigure"], timeout_s=120)
    _wait(lambda: c.controller_states().get("ctl2") == "UP", "ctl2 to answer again")
    cpt, tok3 = _submit(c)
    assert cpt == primary_cpt and _decided_by(c, tok3) == "ctl2"

    # The primary comes back and takes control: the backup hands it over.
    c.start_controller("ctl1")
    _wait(lambda: c.controller_states().get("ctl1") == "UP", "ctl1 to answer")
    cpt, tok4 = _submit(c)
    assert cpt == primary_cpt and _decided_by(c, tok4) == "ctl1"
    assert set(c.controller_pids()) == {"ctl1", "ctl2"}  # the backup stands by again

    doc, _ = _status(c)
    by_host = {h["host"]: h for h in doc["controllers"]}
    assert by_host["ctl1"]["decisions"] == 2 and by_host["ctl2"]["decisions"] == 2
    assert doc["decisions"]["decisions"] == 4
