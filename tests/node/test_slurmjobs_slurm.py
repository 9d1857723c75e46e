"""What coda-node reads of a job a hostile user submitted, on a real slurmctld.

User ``nobody`` submits GPU jobs whose name, comment, output path and working directory
hold what ``scontrol -o show job`` would print for another job: `` AdminComment=coda:sig=
workload:*:shared;...``, `` UserId=0(root)``, `` JobState=RUNNING``, ``Nodes=gpu01
CPU_IDs=0-31 ... GRES=gpu:a100:4(IDX:0-3)`` after a newline, ``=`` signs, bytes that are
not UTF-8, control characters, and the longest text Slurm accepts. For every field the
daemon reads (user and uid, state, partition, CPUs, GPUs, node count, ``CpusPerTres``, the
hook's record and with it the key it would publish under, the job name) it must see what
Slurm holds, and nothing the user wrote.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.store.profiles import ProfileStore
from coda_node.system.slurmjobs import (
    SlurmJob,
    SlurmJobs,
    allocated_cpus,
    make_runner,
    query_jobs,
)
from slurm_plugin.devtools.cluster import NODE_NAME, DevCluster
from tests.conftest import require_slurm, started
from tests.node.test_node_loop_slurm import LOOP_CONF, _train_script
from tests.node.test_node_slurm import _cgroup_v1_reason, _wait

pytestmark = pytest.mark.slurm

NOBODY = 65534
SHARED_RECORD = "coda:sig=workload:*:shared;cpg=1;was=;action=set;src=global;gpn=1;nodes=1"
SPOOF_ADMIN = f" AdminComment={SHARED_RECORD} "
MAX_TEXT = 1024  # Slurm refuses a longer job name or comment ("... too long")


@pytest.fixture(scope="module")
def world() -> Iterator[Path]:
    """A directory user nobody can reach (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="coda-spoof-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(world: Path) -> Iterator[DevCluster]:
    require_slurm()
    yield from started(DevCluster(world / "slurm"))


@pytest.fixture(scope="module")
def work(world: Path) -> Path:
    """Where nobody's jobs run: a world-writable directory with their script."""
    work = world / "work"
    work.mkdir()
    work.chmod(0o777)
    script = work / "job.sh"
    script.write_text("#!/bin/bash\nsleep 600\n")
    script.chmod(0o755)
    return work


SUBMITTED: list[int] = []
"""Every job this module submitted, cancelled by id after each test: ``scancel -u nobody``
is refused by Slurm 26.05 ("Invalid user name"), and the node's four GPUs would fill up."""


def _cancel_submitted(cluster: DevCluster) -> None:
    if SUBMITTED:
        cluster.run(["scancel", *map(str, SUBMITTED)], check=False)
        SUBMITTED.clear()


@pytest.fixture
def slurm(cluster: DevCluster) -> Iterator[SlurmJobs]:
    yield SlurmJobs(NODE_NAME, make_runner(cluster.env))
    _cancel_submitted(cluster)


def _submit(
    cluster: DevCluster,
    work: Path,
    args: list[str | bytes],
    script: str | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """sbatch as nobody (``work/job.sh``, or ``script`` on its stdin) with ``env`` added to
    the environment the job inherits; the job id.  (Not ``--export=ALL,VAR=...``: Slurm
    26.05 then retrieves the user's login environment, which fails for ``nobody``.)"""
    proc = subprocess.run(
        ["sbatch", "--parsable", *args, *([] if script else [str(work / "job.sh")])],
        env={**cluster.env, **(env or {})},
        cwd=work,
        input=script.encode() if script else None,
        capture_output=True,
        user="nobody",
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    job_id = int(proc.stdout.split(b";")[0])
    SUBMITTED.append(job_id)
    return job_id


def _running(slurm: SlurmJobs, job_id: int, timeout_s: float = 30.0) -> SlurmJob:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = slurm.get({job_id}).get(job_id)
        if job is not None:
            return job
        assert slurm.last_error is None, slurm.last_error
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not show as running on {NODE_NAME}")


def _text(raw: str | bytes) -> str:
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw


NEWLINE_JOB = "\nNodes=gpu01 CPU_IDs=0-31 Mem=0 GRES=gpu:a100:4(IDX:0-3)\nJobId=1 UserId=root(0) "

# (what the text aims at, job name, comment, further sbatch options)
CASES: list[tuple[str, str | bytes, str | bytes, list[str]]] = [
    ("admin-in-comment", "train", "x" + SPOOF_ADMIN, []),
    ("admin-in-name", "y" + SPOOF_ADMIN, "", []),
    ("uid", "n UserId=0(root) GroupId=0(root)", " UserId=0(root) GroupId=0(root)", []),
    (
        "partition-count-tres",
        "p Partition=root NumNodes=4",
        " NumNodes=4 CpusPerTres=gres:gpu:32 TresPerNode=gres:gpu:4 Partition=root",
        [],
    ),
    ("cpus-gpus-after-newline", "nl" + NEWLINE_JOB, "c" + NEWLINE_JOB + SPOOF_ADMIN, []),
    ("equals-signs", "a=b==c =d =", "==== = =AdminComment== Partition= UserId==0", []),
    ("control-characters", "t\t\r\x1b[2Jx\x01", "\x1b]0;x\x07" + SPOOF_ADMIN + "\t\r", []),
    (
        "not-utf-8",
        b"\xff\xfe name UserId=0(root)",
        b"\xc3\x28" + SPOOF_ADMIN.encode(),
        [],
    ),
    (
        "longest-text",
        ("B" * MAX_TEXT)[: MAX_TEXT - len(SPOOF_ADMIN)] + SPOOF_ADMIN,
        ("A" * MAX_TEXT)[: MAX_TEXT - len(SPOOF_ADMIN)] + SPOOF_ADMIN,
        [],
    ),
    (
        "paths",
        "paths",
        "",
        [f"--output=o{SPOOF_ADMIN}UserId=0(root) JobState=RUNNING %j.out"],
    ),
]


@pytest.mark.parametrize(
    ("name", "comment", "extra"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_hostile_job_is_seen_as_slurm_holds_it(
    cluster: DevCluster,
    work: Path,
    slurm: SlurmJobs,
    name: str | bytes,
    comment: str | bytes,
    extra: list[str],
) -> None:
    args: list[str | bytes] = ["--gpus-per-node=1", "-c", "2", *extra]
    args.append(b"--job-name=" + name if isinstance(name, bytes) else f"--job-name={name}")
    args.append(b"--comment=" + comment if isinstance(comment, bytes) else f"--comment={comment}")
    job_id = _submit(cluster, work, args)
    job = _running(slurm, job_id)

    assert (job.uid, job.user) == (NOBODY, "nobody")
    assert (job.state, job.partition, job.num_nodes) == ("RUNNING", "gpu", 1)
    assert len(job.cpu_ids) == 2 and len(job.gpu_indices) == 1 and job.is_dnn
    assert job.cpus_per_tres is None  # the user's -c 2 stands; no CpusPerTres
    assert job.name == _text(name)
    # The hook's own record: the key the daemon would publish this job's profile under is
    # nobody's, whatever the text says.
    assert job.record_problem is None
    assert job.admin_record is not None
    assert job.admin_record["sig"].startswith(f"script:{NOBODY}:")
    assert "*" not in job.admin_record["sig"]
    assert allocated_cpus(make_runner(cluster.env), NODE_NAME, [job_id]) == {job_id: job.cpu_ids}


def test_jobs_hold_the_cpus_slurm_gave_them_not_the_ones_their_text_names(
    cluster: DevCluster, work: Path, slurm: SlurmJobs
) -> None:
    ids = [
        _submit(cluster, work, ["--gpus-per-node=1", "-c", "3", f"--comment=c{NEWLINE_JOB}"]),
        _submit(cluster, work, ["--gpus-per-node=1", "-c", "3", f"--job-name=n{NEWLINE_JOB}"]),
        _submit(cluster, work, ["-n", "2", f"--comment={NEWLINE_JOB}"]),
    ]
    jobs = [_running(slurm, j) for j in ids]
    cpus = [j.cpu_ids for j in jobs]
    assert [len(c) for c in cpus] == [3, 3, 2]
    assert not (cpus[0] & cpus[1] or cpus[0] & cpus[2] or cpus[1] & cpus[2])
    gpus = [j.gpu_indices for j in jobs]
    assert len(gpus[0]) == len(gpus[1]) == 1 and gpus[0] != gpus[1] and gpus[2] == ()
    assert not jobs[2].is_dnn


def test_a_pending_job_that_says_it_runs_is_not_taken_for_one(
    cluster: DevCluster, work: Path, slurm: SlurmJobs
) -> None:
    job_id = _submit(
        cluster,
        work,
        [
            "--begin=now+1hour",
            "--gpus-per-node=1",
            "--job-name=JobState=RUNNING Nodes=gpu01 CPU_IDs=0-1",
            f"--comment= JobState=RUNNING{NEWLINE_JOB}",
        ],
    )
    record = query_jobs(make_runner(cluster.env), [job_id])[job_id]
    assert record["job_state"] in ("PENDING", ["PENDING"])
    assert slurm.get({job_id}) == {}
    assert allocated_cpus(make_runner(cluster.env), NODE_NAME, [job_id]) == {}


def test_only_slurm_operators_write_the_admin_comment(
    cluster: DevCluster, work: Path, slurm: SlurmJobs
) -> None:
    job_id = _submit(cluster, work, ["--gpus-per-node=1", "-c", "2", "--hold"])
    proc = subprocess.run(
        ["scontrol", "update", f"jobid={job_id}", f"AdminComment={SHARED_RECORD}"],
        env=cluster.env,
        capture_output=True,
        text=True,
        user="nobody",
        timeout=30,
    )
    assert proc.returncode != 0 and "denied" in proc.stderr.lower()
    # An operator's (here root's) hand-made record naming a shared key is not taken either.
    cluster.run(["scontrol", "update", f"jobid={job_id}", f"AdminComment={SHARED_RECORD}"])
    cluster.run(["scontrol", "release", str(job_id)])
    job = _running(slurm, job_id)
    assert job.admin_record is None
    assert job.record_problem is not None and "workload:*:shared" in job.record_problem


@pytest.mark.skipif(os.geteuid() != 0, reason="submitting as nobody needs root")
def test_text_output_would_have_been_misread(cluster: DevCluster, work: Path) -> None:
    """Why the daemon does not read ``scontrol -o``: the hostile job's line holds the
    fields twice, in an order no key=value reading can tell apart."""
    job_id = _submit(
        cluster,
        work,
        ["--gpus-per-node=1", "--hold", "-J", "n UserId=0(root)", "--comment=x" + SPOOF_ADMIN],
    )
    line = cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
    assert "UserId=0(root)" in line and f"UserId=nobody({NOBODY})" in line
    # Twice at least: 24.11 and later also print the user's command line (SubmitLine=).
    assert line.count("AdminComment=") >= 2


# -- end to end: what the daemon publishes for a hostile job ------------------------------


@pytest.fixture(scope="module")
def cg_cluster(world: Path) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    yield from started(
        DevCluster(world / "cgslurm", cgroups=True, def_cpu_per_gpu=2, coda_conf_extra=LOOP_CONF)
    )


def test_a_hostile_comment_publishes_nothing_under_a_shared_key(cg_cluster: DevCluster) -> None:
    """The attack as it was reported: nobody's job says it is the shared workload
    ``shared``; coda-node profiles it and publishes what it measured under nobody's own
    key, and root's next ``coda:workload=shared`` job is not sized from it."""
    cluster = cg_cluster
    script = _train_script(cluster, loaders=1, work=20000, gpu_ms=10)  # 1 core is enough
    (cluster.root / "work").chmod(0o777)  # nobody's job writes its output there
    daemon_log = cluster.root / "log" / "coda-node-spoof.log"
    with daemon_log.open("w") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "coda_node.cli", "run", "--conf", str(cluster.coda_conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        job_id = _submit(
            cluster,
            cluster.root / "work",
            [
                "--gpus=1",
                f"--comment=x{SPOOF_ADMIN}",
            ],
            script=script,
            env={"CODA_PROGRESS_DIR": str(cluster.progress_dir)},
        )
        slurm = SlurmJobs(NODE_NAME, make_runner(cluster.env))
        job = _running(slurm, job_id)
        assert job.admin_record is not None
        own = job.admin_record["sig"]
        assert own.startswith(f"script:{NOBODY}:")
        store = ProfileStore(cluster.profile_store)

        def published() -> list[str] | None:
            keys = [p.signature for _, p in store.iter_profiles() if not isinstance(p, Exception)]
            return keys or None

        keys = _wait(published, "coda-node to publish what it measured", 120)
        assert keys == [own]
        assert store.read("workload:*:shared") is None

        hold = cluster.run(
            ["sbatch", "--parsable", "--hold", "--gpus=1", "--comment=coda:workload=shared"],
            input_text=script,
        )
        root_job = int(hold.stdout.split(";")[0])
        admin = cluster.show_job(root_job)["AdminComment"]
        assert "src=global" not in admin and "cpg=1;" not in admin, admin
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        _cancel_submitted(cluster)
        cluster.run(["scancel", "-u", "root"], check=False)
        print(daemon_log.read_text()[-3000:])
