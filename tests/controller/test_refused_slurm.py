"""Submissions slurmctld refuses after job_submit/coda has decided them.

slurmctld runs the job_submit plugins before it validates the rest of a submission (an
array larger than ``MaxArraySize`` is refused afterwards), and sbatch prints the plugin's
line for a refused submission as an error. The hook's decision for such a submission must
neither be counted as a job by ``coda-slurm status`` nor read as the reason it failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_plugin.cli import status as cli_status
from slurm_plugin.cli.main import cli as coda_slurm
from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster
from tests.conftest import LogWatch, gres
from tests.controller.test_submit_slurm import (
    SCRIPT,
    coda_conf,
    put_profile,
    set_conf,
    wait_for_reload,
)

__all__ = ["coda_conf"]  # fixture

pytestmark = pytest.mark.slurm

BAD_ARRAY = "--array=0-100000"  # over MaxArraySize (1001): refused after job_submit


@pytest.fixture(autouse=True)
def _cancel_jobs(cluster: DevCluster) -> Iterator[None]:
    yield
    cluster.run(["scancel", "--user=root"], check=False)


def journal_entries(path: Path, job_name: str, count: int) -> list[dict[str, object]]:
    """The journal's entries for ``job_name`` once there are ``count`` (flushed each second)."""
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        mine = [e for e in map(json.loads, lines) if e.get("job") == job_name]
        if len(mine) >= count or time.monotonic() > deadline:
            return mine
        time.sleep(0.2)


def test_refused_submissions_are_not_counted_and_coda_does_not_read_as_their_error(
    cluster: DevCluster,
    coda_conf: Path,
    ctld_log: LogWatch,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = tmp_path / "decisions.jsonl"
    set_conf(cluster, ctld_log, f"DecisionJournal={journal}")
    put_profile(cluster, "workload:*:refused", 6)
    wait_for_reload(cluster)
    args = ["--hold", "--gpus-per-node=1", "--comment=coda:workload=refused", "-J", "refusal"]
    path = cluster.root / "tmp" / "refusal.sh"
    path.write_text(SCRIPT)

    for _ in range(10):
        proc = cluster.run(["sbatch", *args, BAD_ARRAY, str(path)], check=False)
        assert proc.returncode != 0, proc.stdout
        lines = proc.stderr.strip().splitlines()
        # Slurm's reason is the last line; coda's line says it applies to an accepted job.
        assert lines[-1].startswith("sbatch: error: Batch job submission failed: "), lines
        coda = [line for line in lines if "coda" in line]
        assert coda and all("coda (if Slurm accepts the job): " in line for line in coda), lines
    job_id, said = cluster.sbatch(args, SCRIPT)
    assert said.strip() == (
        'sbatch: coda (if Slurm accepts the job): --cpus-per-gpu=6 for workload "refused" '
        "(shared profile, 8 samples, confidence 0.95)"
    )
    fields = cluster.show_job(job_id)
    assert fields.get("CpusPerTres") == gres("gres:gpu:6")
    # The record carries the token status matches against Slurm's own job records.
    assert len(parse_admin_record(fields["AdminComment"])["tok"]) == 16
    assert len(journal_entries(journal, "refusal", 11)) == 11  # the hook decided 11 times

    # Every sbatch above has returned: nothing is in flight, no need to wait for stragglers.
    monkeypatch.setattr(cli_status, "SETTLE_S", 0.0, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm_conf))
    result = CliRunner().invoke(coda_slurm, ["status", "--json", "--conf", str(coda_conf)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["decisions"]["by_action"]["set"] == {"jobs": 1, "gpus": 1}
    slurm = doc["slurm"]
    assert (slurm["kept"], slurm["refused"], slurm["unchecked"]) == (1, 10, 0), slurm

    text = CliRunner().invoke(coda_slurm, ["status", "--conf", str(coda_conf)]).output
    assert "10 decisions were for submissions Slurm refused after the hook" in text, text
