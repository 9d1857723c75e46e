"""The closed loop on a real Slurm cluster with real cgroups: coda-node (the real CLI, as a
process) profiles an unknown workload online and publishes its profile, the submit hook
right-sizes the next submission from it; and a CPU job that crowds a DNN job is throttled
through the CPU quota fallback and released when it goes quiet.

The "DNN jobs" are Python programs that report their iterations with the shipped
stdlib-only client (copied next to them, as the user guide says). There is no GPU here:
the jobs hold fake GPUs (Slurm GRES over character devices), so progress comes from the
opt-in signal. Contention is real but of another kind than on a GPU node: the CPU job is
placed on the same cores (an ``OverSubscribe=FORCE`` partition) and takes CPU time, where
on a GPU node it would take memory bandwidth; the daemon's reaction is the same.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import coda_node.progress_client
from coda_common.config.codaconf import load_config
from coda_common.store.profiles import ProfileStore
from coda_common.store.summaries import ScanProblems, store_for
from coda_node.enforce.state import StateFile
from coda_node.system.slurmjobs import record_token
from slurm_plugin.devtools.cluster import NODE_NAME, DevCluster
from tests.conftest import cancel_all, gres, require_slurm, started
from tests.node.test_node_slurm import _cgroup_v1_reason, _job_dir, _squeue, _wait

pytestmark = pytest.mark.slurm

TRAIN = """\
# A pipelined trainer: loader processes prepare batches on the CPU, the "GPU step" (a
# sleep: there is no GPU) consumes one at a time. The rate is that of the slower stage.
import multiprocessing as mp, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress_client import Progress

def work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def loader(q, n):
    while True:
        work(n)
        q.put(1)

if __name__ == "__main__":
    loaders, n, gpu_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000
    q = mp.Queue(maxsize=16)
    for _ in range(loaders):
        mp.Process(target=loader, args=(q, n), daemon=True).start()
    p = Progress(min_interval_s=0.2)
    while True:
        q.get()
        time.sleep(gpu_s)
        p.step()
"""

HOG = """#!/bin/bash
# {threads} busy threads for {busy_s} s, then quiet (the job keeps running).
for i in $(seq {threads}); do timeout {busy_s} bash -c 'while :; do :; done' & done
wait
sleep 600
"""
HOG_THREADS = 16
"""The CPU job's busy threads. Slurm's cgroup v1 jobs share one CFS group, so on the two
cores the DNN job's two loaders get about 2/(2+X) of them before and 2/(2+16+X) after, X
being what else runs there: a drop well over NodeContentionTriggerPct however busy this
machine is (still 30 % beside 35 other runnable threads), where a two-thread CPU job's
2/(4+X) falls under it once X passes 9."""

LOOP_CONF = (
    "NodeProbeWarmupS=2\n"
    "NodeProbeSettleS=2\n"
    "NodeProbeMeasureS=9\n"
    "NodeReleaseHoldS=3\n"
    "NodeContentionTriggerPct=15\n"
    "NodeContentionReleasePct=8\n"
)


MIN_CONFIDENCE = 0.3
"""What the probe must reach and the hook accepts here: this tests that a profile learned
online reaches the next submission, not how sure a probe gets on a busy 2-vCPU machine."""


@pytest.fixture(scope="module")
def loop_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("loopslurm")
    cluster = DevCluster(
        root,
        cgroups=True,
        def_cpu_per_gpu=2,
        coda_conf_extra=LOOP_CONF + f"MinConfidence={MIN_CONFIDENCE}\n",
        extra_partitions=(
            f"PartitionName=shared Nodes={NODE_NAME} OverSubscribe=FORCE:2 "
            "MaxTime=INFINITE State=UP\n"
        ),
    )
    yield from started(cluster)


@pytest.fixture
def cluster(loop_cluster: DevCluster, tmp_path: Path) -> Iterator[DevCluster]:
    yield loop_cluster
    cancel_all(loop_cluster)


@pytest.fixture
def daemon(cluster: DevCluster) -> Iterator[subprocess.Popen[str]]:
    log = cluster.root / "log" / f"coda-node-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "coda_node.cli", "run", "--conf", str(cluster.coda_conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(log.read_text()[-4000:])


def _train_script(cluster: DevCluster, loaders: int, work: int, gpu_ms: float) -> str:
    where = cluster.root / "work"
    where.mkdir(exist_ok=True)
    shutil.copy(coda_node.progress_client.__file__, where / "progress_client.py")
    (where / "train.py").write_text(TRAIN)
    return f"#!/bin/bash\nexec /usr/bin/python3 {where}/train.py {loaders} {work} {gpu_ms}\n"


def _view(cluster: DevCluster) -> dict:
    return StateFile(cluster.node_state_dir, cluster.node_runtime_dir).load().view


def _job_view(cluster: DevCluster, job_id: int) -> dict | None:
    for job in _view(cluster).get("jobs", []):
        if job["job_id"] == job_id:
            return job
    return None


def _events(cluster: DevCluster, job_id: int) -> list[dict]:
    return [e for e in _view(cluster).get("events", []) if e["job_id"] == job_id]


def _export(cluster: DevCluster) -> str:
    return f"--export=ALL,CODA_PROGRESS_DIR={cluster.progress_dir}"


def test_unknown_workload_is_profiled_online_and_the_next_submission_right_sized(
    cluster: DevCluster, daemon: subprocess.Popen[str]
) -> None:
    # GPU-bound: one loader needs ~2 ms of CPU per 10 ms GPU step, so 1 core is enough.
    script = _train_script(cluster, loaders=1, work=20000, gpu_ms=10)
    args = ["--gpus=1", "--comment=coda:workload=loader1", _export(cluster)]
    job_id, _ = cluster.sbatch(args, script)
    _wait(lambda: _job_dir(job_id), f"job {job_id} to start")
    first = cluster.show_job(job_id)
    assert first["NumCPUs"] == "2"  # DefCpuPerGPU=2: no profile yet
    assert "src=none" in first["AdminComment"]
    store = ProfileStore(cluster.profile_store)
    sig = "workload:0:loader1"

    def profiled():
        prof = store.read(sig)
        return prof if prof is not None and prof.confidence >= MIN_CONFIDENCE else None

    prof = _wait(profiled, "coda-node to publish a confident profile", 120)
    # One loader needs ~1 core; which count wins under the machine's load is the probe's
    # measurement (a busy machine can make it extrapolate above the 2 probed), so the hook
    # is checked against what was published, not against 1.
    assert prof.cpus_per_gpu >= 1
    assert prof.source == f"coda-node:{NODE_NAME}"
    assert {s.cores for s in prof.samples} == {1.0, 2.0}
    # The job was probed at one core inside its own allocation, then given it all back.
    actions = [e["what"] for e in _events(cluster, job_id)]
    assert "cpuset 0-1 -> 0" in " ".join(actions) or "probe" in actions
    assert "probe-done" in actions
    d = _job_dir(job_id)
    assert d is not None
    _wait(lambda: (d / "cpuset.cpus").read_text().strip() == "0-1", "the allocation back")

    # The hook reloads the store within ReloadIntervalS; the same workload now gets 1 core.
    def right_sized():
        jid, _ = cluster.sbatch([*args, "--hold"], script)
        job = cluster.show_job(jid)
        cluster.run(["scancel", str(jid)], check=False)
        return job if "action=set" in job["AdminComment"] else None

    second = _wait(right_sized, "the hook to right-size the next submission", 15)
    cpg = prof.cpus_per_gpu
    assert f"cpg={cpg}" in second["AdminComment"] and "src=profile" in second["AdminComment"]
    assert second.get("CpusPerTres") == gres(f"gres:gpu:{cpg}")


def test_a_cpu_job_crowding_a_dnn_job_is_throttled_then_released(
    cluster: DevCluster, daemon: subprocess.Popen[str]
) -> None:
    # CPU-bound: two loaders at ~15 ms of CPU per batch feed a 2 ms GPU step.
    script = _train_script(cluster, loaders=2, work=200000, gpu_ms=2)
    dnn_args = [
        "-p",
        "shared",
        "--gpus=1",
        "--cpus-per-gpu=2",
        "--comment=coda:off",  # no profiling: this test is about contention only
        _export(cluster),
    ]
    dnn_id, _ = cluster.sbatch(dnn_args, script)

    def baseline():
        job = _job_view(cluster, dnn_id)
        cont = job and job.get("contention")
        return cont["baseline"] if cont and cont.get("baseline") else None

    base = _wait(baseline, "an uncontended baseline for the DNN job", 60)

    # Busy long enough to be caught on a loaded machine, then quiet so it is released.
    hog_id, _ = cluster.sbatch(["-p", "shared", "-c2"], HOG.format(busy_s=60, threads=HOG_THREADS))
    _wait(lambda: _job_dir(hog_id), "the CPU job to run on the same cores", 30)
    hog_dir = _job_dir(hog_id)
    dnn_dir = _job_dir(dnn_id)
    assert hog_dir is not None and dnn_dir is not None
    assert (hog_dir / "cpuset.cpus").read_text() == (dnn_dir / "cpuset.cpus").read_text()

    def throttled():
        return [e for e in _events(cluster, hog_id) if e["what"] == "throttle"]

    first = _wait(throttled, "the CPU job to be throttled", 90)[0]
    assert f"job {dnn_id}" in first["reason"]
    assert first["reading"]["victim"] == dnn_id

    # Throttled down the quota ladder: the CPU job is capped below its 2 cores while it
    # runs.  (How much of its rate the DNN job gets back depends on what else this shared
    # machine runs, so it is not asserted here.)
    def capped():
        hog = _job_view(cluster, hog_id)
        return hog if hog and hog["quota_cores"] and hog["quota_cores"] < 2 else None

    _wait(capped, "the CPU job to be capped below its allocation", 90)
    assert base > 0

    # The CPU job goes quiet after its busy phase: released step by step, then free.
    def released():
        changes = StateFile(cluster.node_state_dir).load().changes
        ch = changes.get(hog_id)
        free = ch is None or not ch.quota_active
        evs = [e["what"] for e in _events(cluster, hog_id)]
        return evs if free and "release" in evs else None

    evs = _wait(released, "the CPU job to be released", 150)
    assert evs.count("throttle") >= 1
    assert hog_id in _squeue(cluster)  # released while it still runs, not because it ended
    print(json.dumps(_events(cluster, hog_id), indent=1)[:3000])


def test_a_finished_gpu_job_leaves_one_summary_in_the_store(
    cluster: DevCluster, daemon: subprocess.Popen[str]
) -> None:
    script = _train_script(cluster, loaders=1, work=20000, gpu_ms=10)
    args = ["--gpus=1", "--cpus-per-gpu=2", "--comment=coda:off", _export(cluster)]
    job_id, _ = cluster.sbatch(args, script)
    _wait(lambda: _job_view(cluster, job_id), f"coda-node to see job {job_id}", 30)
    comment = cluster.show_job(job_id).get("AdminComment", "")
    started_s = time.time()
    time.sleep(6)  # several ticks of the job at work
    cluster.run(["scancel", str(job_id)], check=False)
    store = store_for(load_config(cluster.coda_conf))

    def summary():
        problems = ScanProblems()
        found = [s for s in store.scan(problems=problems) if s.job_id == job_id]
        assert problems.count == 0, problems.kept
        return found or None

    (s,) = _wait(summary, f"the summary of job {job_id}", 60)
    assert (s.node, s.kind, s.gpus, s.cores_allocated, s.num_nodes) == (NODE_NAME, "dnn", 1, 2, 1)
    assert (s.user, s.uid) == ("root", 0)
    assert started_s - 60 < s.start_unix_s <= s.end_unix_s <= time.time()
    assert 3 <= s.sampled_s <= s.end_unix_s - s.start_unix_s + 1
    # No NVML on this machine: GPU utilisation unknown, so no waiting either way.
    assert s.gpu_util_pct_mean is None and s.gpu_sampled_s == 0 and s.gpu_wait_s == 0
    assert s.cpu_used_cores_mean is not None and 0 < s.cpu_used_cores_mean <= 2.5
    assert s.probes == 0 and s.probe_s == 0 and s.throttled_s == 0
    assert s.record == record_token(comment)
    (path,) = store.root.glob(f"*/{NODE_NAME}.jsonl")
    events = [e for e in _events(cluster, job_id) if e["what"] == "summary-publish"]
    assert len(events) == 1 and str(path) in events[0]["reason"]
    assert "job ended" in events[0]["reason"]
    time.sleep(3)  # later ticks add nothing
    assert len(summary() or []) == 1
