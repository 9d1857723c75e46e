"""Jobs submitted by the clients users really use, on the real dev cluster.

dask-jobqueue writes the scheduler's address and the worker's name into every job script
and always sends ``--cpus-per-task``; submitit writes ``%j`` or ``%A_%a`` into its paths and
reads only sbatch's standard output. Two submissions from the same client code must be one
workload (the second right-sized from the profile the first one's record names), and coda's
line must be where such users see it: ``scontrol show job``, after the record in
``AdminComment``. The dask workers never connect to a scheduler: their jobs are held.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, parse_scontrol_line
from tests.conftest import LogWatch, gres
from tests.controller.test_submit_slurm import coda_conf, put_profile, set_conf, wait_for_reload

__all__ = ["coda_conf"]  # fixture

pytestmark = pytest.mark.slurm

dask_jobqueue = pytest.importorskip("dask_jobqueue", reason="pip install '.[test]'")
submitit = pytest.importorskip("submitit", reason="pip install '.[test]'")
Status = pytest.importorskip("distributed.core").Status


@pytest.fixture(autouse=True)
def _slurm_env(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The clients run sbatch themselves, with this process's environment.
    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm_conf))
    yield
    cluster.run(["scancel", "--user=root"], check=False)


def admin_comment(cluster: DevCluster, job_id: int | str) -> str:
    """The job's ``AdminComment`` as ``scontrol show job`` shows it to a user."""
    out = cluster.run(["scontrol", "show", "job", str(job_id)]).stdout
    for line in out.splitlines():
        if line.strip().startswith("AdminComment="):
            return line.strip().removeprefix("AdminComment=")
    raise AssertionError(f"no AdminComment for job {job_id}:\n{out}")


def dask_worker_job(tmp_path: Path) -> tuple[dict[str, str], str]:
    """Start a SLURMCluster with one GPU worker (held), as a user's notebook would; return
    its job's fields and the script dask-jobqueue wrote."""
    cluster = dask_jobqueue.SLURMCluster(
        cores=4,
        processes=1,
        memory="1GB",
        walltime="00:10:00",
        job_extra_directives=["--gpus-per-node=1", "--hold"],
        scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
        log_directory=str(tmp_path),
    )
    jobs: list[Any] = []
    try:
        cluster.scale(1)
        deadline = time.monotonic() + 60
        while True:
            jobs = list(cluster.workers.values())
            if jobs and getattr(jobs[0], "job_id", None):
                break
            assert time.monotonic() < deadline, "dask-jobqueue submitted no job"
            time.sleep(0.2)
        job_id = jobs[0].job_id
        return {"JobId": job_id, **_fields(job_id)}, jobs[0].job_script()
    finally:
        for job in jobs:  # a worker that never connected: dask-jobqueue scancels its job
            cluster.sync(job.close)
            job.status = Status.closed  # Job.close() leaves it "running"; close() checks
        cluster.close()


def _fields(job_id: str) -> dict[str, str]:
    """``scontrol -o show job`` of a job a client submitted (its record is the first word of
    AdminComment there; coda's line for the user follows it)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", str(job_id)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
    ).stdout
    return parse_scontrol_line(out.strip())


def test_dask_workers_of_two_clusters_are_one_workload_and_the_second_is_right_sized(
    cluster: DevCluster, coda_conf: Path, ctld_log: LogWatch, tmp_path: Path
) -> None:
    set_conf(cluster, ctld_log, "UserValue=lower")
    first, script_a = dask_worker_job(tmp_path / "a")
    record = parse_admin_record(first["AdminComment"])
    assert record["sig"].startswith("script:0:") and record["was"] == "cpt:4"
    assert record["action"] in ("skip", "keep")  # nothing learned yet

    # coda-node learns 2 cores per GPU for that key; a new cluster (another scheduler
    # port, other worker names) is the same workload and gets them.
    put_profile(cluster, record["sig"], 2)
    wait_for_reload(cluster, min_profiles=1)
    second, script_b = dask_worker_job(tmp_path / "b")
    assert script_a != script_b  # dask-jobqueue wrote another address and name
    again = parse_admin_record(second["AdminComment"])
    assert again["sig"] == record["sig"]
    # dask-jobqueue asks per task (-c 4, one task, one GPU): lowered per task.
    assert (again["action"], again["cpg"], again["cpt"]) == ("lower", "2", "2")
    assert second["CPUs/Task"] == "2" and not second.get("CpusPerTres")
    # dask-jobqueue never shows sbatch's stderr: the line is in scontrol show job.
    assert admin_comment(cluster, second["JobId"]).endswith(
        'coda: --cpus-per-task=2 for workload "dask-worker" (lowers --cpus-per-task=4; '
        "profile, 8 samples, confidence 0.95)"
    )


def test_submitit_jobs_of_one_function_are_one_workload_and_the_advice_is_in_scontrol(
    cluster: DevCluster, coda_conf: Path, tmp_path: Path
) -> None:
    def executor() -> Any:
        ex = submitit.AutoExecutor(folder=tmp_path / "logs" / "%j", cluster="slurm")
        ex.update_parameters(
            timeout_min=10, slurm_gpus_per_node=1, slurm_additional_parameters={"hold": True}
        )
        return ex

    first = executor().submit(sum, [1, 2])
    record = parse_admin_record(admin_comment(cluster, first.job_id))
    assert record["sig"].startswith("script:0:") and record["action"] == "skip"

    put_profile(cluster, record["sig"], 3)
    wait_for_reload(cluster, min_profiles=1)
    # The same function again, now as an array (map_array: %A_%a in its paths).
    tasks = executor().map_array(sum, [[1], [2]])
    array_id = tasks[0].job_id.split("_")[0]
    fields = _fields(tasks[0].job_id)
    again = parse_admin_record(fields["AdminComment"])
    assert again["sig"] == record["sig"]
    assert (again["action"], again["cpg"]) == ("set", "3")
    assert fields.get("CpusPerTres") == gres("gres:gpu:3")
    # submitit reads only sbatch's stdout; scontrol show job says what coda did.
    assert admin_comment(cluster, array_id).endswith(
        'coda: --cpus-per-gpu=3 for workload "submitit" (profile, 8 samples, confidence 0.95)'
    )
