"""Slurm accounting on the dev cluster: slurmdbd on a private MariaDB, the hook's record in
``sacct``, a real ``sacct -P`` export replayed by the simulator, and ``coda-slurm job``.

One cluster for the module; its jobs are submitted together and finish within seconds."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from slurm_plugin.cli.jobreport import parse_duration_s
from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.accounting import DevAccounting, missing_tools
from slurm_plugin.devtools.cluster import DevCluster
from slurm_plugin.sim.traces import SACCT_COMMAND, load_trace
from tests.conftest import require_slurm, started
from tests.node.test_node_slurm import _cgroup_v1_reason, _wait

pytestmark = pytest.mark.slurm

CODA_SLURM = [sys.executable, "-m", "slurm_plugin.cli.main"]
DEFAULT_CPG = 3
HOSTILE_NAME = "evil|name\nline2|\udcffend"
"""A name with the delimiter, a line break and a byte that is not UTF-8 (sbatch gets the raw
byte: Python passes a lone surrogate escape as that byte)."""

SLEEP = "#!/bin/sh\nsleep 2\n"
BURN = "#!/bin/sh\ntimeout 2 sh -c 'while :; do :; done' || true\n"


def _require_accounting() -> None:
    require_slurm()
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (mariadb-server, slurmdbd); run scripts/setup"
        )


class Jobs:
    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.default, _ = cluster.sbatch(["--gpus=2", "-J", "train"], SLEEP)
        self.keep, _ = cluster.sbatch(["--gpus=1", "--cpus-per-gpu=2", "-J", HOSTILE_NAME], BURN)
        self.cpu, _ = cluster.sbatch(["-n", "1", "-J", "cpu-only"], SLEEP)
        self.ids = (self.default, self.keep, self.cpu)

    def sacct(self, *args: str) -> str:
        return self.cluster.run(["sacct", *args]).stdout

    def field(self, job_id: int, name: str) -> str:
        """One field of the job's allocation line (the whole output: it may hold '|')."""
        return self.sacct("-n", "-P", "-X", "-j", str(job_id), f"--format={name}")[:-1]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    _require_accounting()
    cluster = DevCluster(
        tmp_path_factory.mktemp("acct"),
        accounting=True,
        coda_conf_extra=f"DefaultCpusPerGpu={DEFAULT_CPG}\n",
    )
    for c in started(cluster):
        j = Jobs(c)
        ids = ",".join(map(str, j.ids))
        deadline = time.monotonic() + 60
        # slurmctld sends the end of a job, and of its batch step (its CPU time), to slurmdbd
        # after they end: wait for both of every job.
        wanted = {str(i) for i in j.ids} | {f"{i}.batch" for i in j.ids}
        while True:
            lines = j.sacct("-n", "-P", "-j", ids, "--format=JobID,End").split()
            ended = {line.split("|")[0] for line in lines if not line.endswith("|Unknown")}
            if wanted <= ended:
                break
            assert time.monotonic() < deadline, f"jobs not finished in sacct: {lines}"
            time.sleep(0.5)
        yield j


def test_gpus_are_accounted_as_tres(jobs: Jobs) -> None:
    tres = jobs.field(jobs.default, "AllocTRES").split(",")
    assert "gres/gpu=2" in tres
    assert f"cpu={2 * DEFAULT_CPG}" in tres  # the hook's DefaultCpusPerGpu, as Slurm applied it
    assert not any(t.startswith("gres/gpu") for t in jobs.field(jobs.cpu, "AllocTRES").split(","))


def test_the_hooks_record_is_in_sacct_admin_comment(jobs: Jobs) -> None:
    comment = jobs.field(jobs.default, "AdminComment")
    record = parse_admin_record(comment)
    assert (record["action"], record["cpg"], record["src"]) == (
        "default",
        str(DEFAULT_CPG),
        "default",
    )
    assert comment == jobs.cluster.show_job(jobs.default)["AdminComment"]  # as slurmctld has it
    kept = parse_admin_record(jobs.field(jobs.keep, "AdminComment"))
    assert (kept["action"], kept["was"]) == ("keep", "cpg:2")
    assert jobs.field(jobs.cpu, "AdminComment") == ""  # a CPU-only job gets no record


def test_simulate_replays_a_real_sacct_export(jobs: Jobs, tmp_path: Path) -> None:
    argv = shlex.split(SACCT_COMMAND.replace("<date>", "now-1hours", 1).replace("<date>", "now", 1))
    export = tmp_path / "sacct.txt"
    # The export an admin makes (every job of the window), bytes as sacct wrote them.
    export.write_bytes(
        subprocess.run(
            argv, env=jobs.cluster.env, capture_output=True, timeout=30, check=True
        ).stdout
    )
    assert "\nline2" in export.read_text()  # the hostile name is in the export as sacct wrote it

    trace = load_trace(f"sacct:{export}")
    # The database's own view: one allocation line per job, no free text in it.
    rows = [
        line.split("|")
        for line in jobs.sacct(
            "-n",
            "-P",
            "-X",
            "-j",
            ",".join(map(str, jobs.ids)),
            "--format=Submit,ElapsedRaw,AllocTRES",
        ).splitlines()
    ]
    submit = sorted(datetime.fromisoformat(r[0]).timestamp() for r in rows)
    assert len(trace.submit_s) == len(jobs.ids)
    assert sorted(trace.gpus.tolist()) == [0, 1, 2]
    assert sorted(trace.cpus.tolist()) == sorted(
        int(next(t for t in r[2].split(",") if t.startswith("cpu="))[4:]) for r in rows
    )
    assert sorted(trace.duration_s.tolist()) == sorted(float(r[1]) for r in rows)
    assert trace.submit_s.tolist() == [s - submit[0] for s in submit]
    assert any(name.endswith("/cpu-only") for name in trace.workload_names)

    out = subprocess.run(
        [*CODA_SLURM, "simulate", f"sacct:{export}", "-p", "slurm", "-p", "coda", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert (doc["jobs"], doc["gpu_jobs"], doc["cpu_jobs"]) == (3, 2, 1)


def _report(jobs: Jobs, job_id: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CODA_SLURM, "job", str(job_id), *extra],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=60,
        env=jobs.cluster.env,
        check=True,
    )


def test_job_report_matches_sacct(jobs: Jobs) -> None:
    report = json.loads(_report(jobs, jobs.default, "--json").stdout)
    assert report["coda"]["action"] == "default"
    assert report["coda"]["cpus_per_gpu"] == DEFAULT_CPG
    comment = jobs.field(jobs.default, "AdminComment")
    assert report["admin_comment"] == comment
    assert report["coda"]["record"] == comment.split()[0]
    assert report["allocated"]["gpus"] == 2
    assert report["allocated"]["cores"] == int(jobs.field(jobs.default, "AllocCPUS"))
    assert report["elapsed_s"] == int(jobs.field(jobs.default, "ElapsedRaw"))
    assert report["state"] == "COMPLETED"
    assert report["name"] == "train"
    # No NVML on the dev cluster, and coda-node keeps no samples of a finished job.
    assert report["gpus_waiting_on_cpu"]["verdict"] == "unknown"

    text = _report(jobs, jobs.default).stdout
    assert (
        f"CODA decided         {DEFAULT_CPG} cores per GPU (default, from DefaultCpusPerGpu)"
        in text
    )
    assert "GPUs waiting on CPU  unknown: no GPU samples" in text


def test_job_report_of_a_job_with_a_hostile_name(jobs: Jobs) -> None:
    report = json.loads(_report(jobs, jobs.keep, "--json").stdout)
    assert report["name"].startswith("evil|name\nline2|") and report["name"].endswith("end")
    assert (report["coda"]["action"], report["coda"]["user_request"]) == ("keep", "cpg:2")
    assert report["allocated"]["cores"] == 2
    # The job's line without -X: sacct sums its steps' CPU time into it (with -X it is 0).
    lines = jobs.sacct("-n", "-P", "-j", str(jobs.keep), "--format=JobID,TotalCPU").split()
    used = parse_duration_s(dict(line.split("|") for line in lines)[str(jobs.keep)])
    assert used and report["used"]["cpu_s"] == pytest.approx(used)
    assert report["used"]["cpu_efficiency_pct"] == pytest.approx(
        100 * used / (2 * int(jobs.field(jobs.keep, "ElapsedRaw")))
    )
    lines = _report(jobs, jobs.keep).stdout.splitlines()
    job_line = next(line for line in lines if line.startswith("Job "))
    assert "evil|name\\nline2|" in job_line  # one line, the break shown, not printed
    assert any(line.endswith("; the user asked 2 cores per GPU") for line in lines)
    assert len(lines) == 10 + (report["coda"]["message"] is not None)


def test_job_report_of_a_running_job_shows_what_coda_node_recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    _require_accounting()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    cluster = DevCluster(
        tmp_path_factory.mktemp("acct-cg"),
        cgroups=True,
        accounting=True,
        coda_conf_extra="DefaultCpusPerGpu=1\n",
    )
    for c in started(cluster):
        job_id, _ = c.sbatch(["--gpus=1", "-J", "running"], "#!/bin/sh\nsleep 120\n")
        _wait(lambda c=c, j=job_id: c.show_job(j)["JobState"] == "RUNNING", "the job to run")
        # slurmdbd records the start a moment after slurmctld (the report reads accounting).
        _wait(
            lambda c=c, j=job_id: (
                c.run(["sacct", "-n", "-X", "-j", str(j), "--format=State"]).stdout.split()[:1]
                == ["RUNNING"]
            ),
            "accounting to record the start",
        )
        node = [sys.executable, "-m", "coda_node.cli"]
        once = subprocess.run(
            [*node, "run", "--once", "--conf", str(c.coda_conf)],
            capture_output=True,
            text=True,
            timeout=60,
            env=c.env,
        )
        assert once.returncode == 0, once.stderr
        status = subprocess.run(
            [*node, "status", "--json", "--conf", str(c.coda_conf)],
            capture_output=True,
            text=True,
            timeout=60,
            env=c.env,
        )
        seen = next(j for j in json.loads(status.stdout)["jobs"] if j["job_id"] == job_id)

        report = json.loads(
            subprocess.run(
                [*CODA_SLURM, "job", str(job_id), "--json", "--conf", str(c.coda_conf)],
                capture_output=True,
                text=True,
                timeout=60,
                env=c.env,
                check=True,
            ).stdout
        )
        assert report["state"] == "RUNNING"
        samples = report["node_samples"]
        assert samples is not None
        assert samples["cores_allocated"] == seen["cores_allocated"] == report["allocated"]["cores"]
        assert samples["cores_in_force"] == seen["cores_in_force"]
        assert samples["profile_state"] == seen["profile_state"]
        # Fake GPUs: coda-node read no utilisation, and the report says so.
        assert seen["gpu_util_pct"] is None
        assert report["gpus_waiting_on_cpu"]["verdict"] == "unknown"
        assert "no GPU utilisation" in report["gpus_waiting_on_cpu"]["why"]


def _processes_under(path: Path) -> list[int]:
    """Live processes whose command line or environment names ``path`` (our mariadbd's
    datadir; our slurmdbd has the cluster's SLURM_CONF)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdecimal():
            try:
                text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if str(path).encode() in text and state != "Z":
                found.append(int(entry.name))
    return found


def _named(pids: list[int], comm: str) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                out.append(pid)
        except OSError:
            continue
    return out


def test_up_ends_what_a_crashed_run_left_and_down_stops_everything(tmp_path: Path) -> None:
    _require_accounting()
    cluster = DevCluster(tmp_path / "c", accounting=True)
    acct = DevAccounting(cluster.root, cluster.etc, cluster.munge_socket)
    for c in started(cluster):
        old = acct.status()
        assert old == {"mariadbd": True, "slurmdbd": True}
        old_pids = _named(_processes_under(acct.datadir), "mariadbd") + _named(
            _processes_under(cluster.root), "slurmdbd"
        )
        assert len(old_pids) == 2
        # As the next `up` after a run whose tool died: the daemons it left are ended first.
        acct.start(c.env)
        assert acct.status() == {"mariadbd": True, "slurmdbd": True}
        assert not set(old_pids) & set(_processes_under(cluster.root))
        listed = c.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"]).stdout
        assert listed.split() == ["coda-dev"]
    assert acct.status() == {}
    assert _named(_processes_under(cluster.root), "mariadbd") == []
    assert _named(_processes_under(cluster.root), "slurmdbd") == []
