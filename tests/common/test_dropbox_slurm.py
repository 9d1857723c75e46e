"""Profiles from nodes over munge on a real cluster: Debian's munged, slurmctld and slurmd.

Root squash is simulated: the node daemon runs as root without CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH and CAP_FOWNER against a root-owned store directory of mode 0555, so its
writes there fail with EACCES, as a squashed root's do on the NFS server. Users are uid
``nobody`` with CAP_DAC_READ_SEARCH only (to reach munged's socket and the drop directory
inside pytest's private temp directory): they write nothing that file modes forbid.

Everything here runs on one host, so munge's ENCODE_HOST is always 127.0.0.1. "Root on a
host that is not a node" is a collector whose ProfileDropHosts does not include 127.0.0.1:
this proves the collector refuses by munge's ENCODE_HOST, not that munged reports a foreign
host's address (munged does that from its own resolution of its host name).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.config.codaconf import load_config
from coda_common.publish.dropbox import Drop, drop
from coda_common.store.profiles import CpuUsageRecord, ProfileStore, Sample, UsageRecord
from coda_common.store.summaries import store_for
from slurm_plugin.devtools.cluster import NODE_NAME, DevCluster
from tests.conftest import gres, require_slurm, started
from tests.node.test_node_loop_slurm import LOOP_CONF, _events, _export, _train_script
from tests.node.test_node_slurm import _cgroup_v1_reason, _job_dir, _squeue, _wait

pytestmark = pytest.mark.slurm

NO_DAC = "-dac_override,-dac_read_search,-fowner"
#: Root as root_squash leaves it on the NFS server: no override of file modes.
SQUASHED_ROOT = ["setpriv", f"--inh-caps={NO_DAC}", f"--bounding-set={NO_DAC}", "--"]
#: An ordinary user that can reach munged's socket inside pytest's 0700 temp directory.
USER = [
    "setpriv",
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
    "--inh-caps=+dac_read_search",
    "--ambient-caps=+dac_read_search",
    "--",
]

COLLECT = [sys.executable, "-m", "slurm_plugin.cli.main", "profiles", "collect"]


def _conf(cluster: DevCluster, path: Path, drop_dir: Path, extra: str = "") -> Path:
    path.write_text(
        cluster.coda_conf.read_text()
        + f"ProfilePublish=munge\nProfileDropDir={drop_dir}\n"
        + f"MungeSocket={cluster.munge_socket}\nSlurmConf={cluster.slurm_conf}\n{extra}"
    )
    return path


def _collect(cluster: DevCluster, conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COLLECT, "--conf", str(conf)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def _payload(signature: str, made_s: float) -> Drop:
    run = f"{NODE_NAME}:9:{int(made_s)}"
    samples = tuple(
        Sample(float(c), t, 1, 1, None, NODE_NAME, run) for c, t in ((1, 0.6), (2, 1.0))
    )
    return Drop(signature, NODE_NAME, samples, made_s)


def _munge(
    cluster: DevCluster, payload: bytes, user: list[str], ttl_s: int = 300, *extra: str
) -> bytes:
    argv = [*user, "munge", f"--socket={cluster.munge_socket}", f"--ttl={ttl_s}", *extra]
    return subprocess.run(argv, input=payload, capture_output=True, check=True).stdout


def _as_user(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*USER, *argv], capture_output=True, text=True, check=False)


def _refusal(stderr: str, path: Path) -> str:
    lines = [line for line in stderr.splitlines() if str(path) in line]
    assert len(lines) == 1, (path, stderr)
    assert "refused" in lines[0] and "nothing merged" in lines[0], lines[0]
    return lines[0]


def test_what_is_not_roots_from_a_node_is_refused_one_line_each(
    cluster: DevCluster, tmp_path: Path
) -> None:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    drop_dir.chmod(0o1777)
    store = ProfileStore(cluster.profile_store)
    conf = _conf(cluster, tmp_path / "coda.conf", drop_dir)
    now = time.time()
    good_sig, user_sig = "workload:0:dropgood", "workload:0:dropbyuser"

    # Root on the node: accepted (the node list comes from scontrol show node).
    root_cred = _munge(cluster, _payload(good_sig, now).to_json_bytes(), [])
    (drop_dir / f"{'0' * 32}.munge").write_bytes(root_cred)
    out = _collect(cluster, conf)
    assert "1 accepted (2 samples merged, 0 job summaries appended), 0 refused" in out.stdout, out
    assert store.read(good_sig).n_samples == 2
    assert not any(drop_dir.iterdir())

    files: dict[str, Path] = {}

    def put(key: str, data: bytes, name: str) -> None:
        files[key] = drop_dir / f"{name * 32}.munge"
        subprocess.run([*USER, "sh", "-c", 'cat > "$0"', str(files[key])], input=data, check=True)

    payload = _payload(user_sig, now).to_json_bytes()
    put("replayed", root_cred, "1")  # a copy of the credential consumed above
    put("user", _munge(cluster, payload, USER), "2")
    put("forged", b"MUNGE:" + b"A" * 200 + b":\n", "3")
    put("truncated", _munge(cluster, payload, [])[:80], "4")
    put("expired", _munge(cluster, payload, [], ttl_s=1), "5")
    put("for-user", _munge(cluster, payload, USER, 300, "--restrict-uid=65534"), "7")
    huge = drop_dir / f"{'6' * 32}.munge"
    assert _as_user(["truncate", "-s", "100M", str(huge)]).returncode == 0
    files["huge"] = huge
    time.sleep(2.1)  # the 1 s credential expires

    t0 = time.monotonic()
    out = _collect(cluster, conf)
    collect_s = time.monotonic() - t0
    assert "0 accepted (0 samples merged, 0 job summaries appended), 7 refused" in out.stdout, out
    assert "replayed munge credential" in _refusal(out.stderr, files["replayed"])
    assert "made by uid 65534, only uid 0 accepted" in _refusal(out.stderr, files["user"])
    assert "not a valid munge credential" in _refusal(out.stderr, files["forged"])
    assert "not a valid munge credential" in _refusal(out.stderr, files["truncated"])
    assert "expired munge credential" in _refusal(out.stderr, files["expired"])
    assert "only another uid may decode" in _refusal(out.stderr, files["for-user"])
    assert "104857600 bytes, more than 262144 (not read)" in _refusal(out.stderr, huge)
    assert store.read(user_sig) is None and store.read(good_sig).n_samples == 2
    assert not any(drop_dir.iterdir())
    print(f"collect pass over 7 refused files (one of 100 MB): {collect_s:.2f} s")

    # Root, but on a host that is not a node of this cluster.
    other = _conf(cluster, tmp_path / "other.conf", drop_dir, "ProfileDropHosts=192.0.2.0/24\n")
    path = drop(_payload(user_sig, now), drop_dir, cluster.munge_socket, ttl_s=300)
    out = _collect(cluster, other)
    assert "made on host 127.0.0.1, which is not a node" in _refusal(out.stderr, path)
    assert store.read(user_sig) is None


def test_usage_records_from_a_node_are_merged_through_munge(
    cluster: DevCluster, tmp_path: Path
) -> None:
    # What coda-node drops with ProfilePublish=munge when a job ends: a CPU job's memory
    # bandwidth (its profile is created) and a GPU job's usage (merged into its profile).
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    drop_dir.chmod(0o1777)
    store = ProfileStore(cluster.profile_store)
    conf = _conf(cluster, tmp_path / "coda.conf", drop_dir)
    now = time.time()
    gpu_sig, cpu_sig = "workload:0:usagegpu", "workload:0:usagecpu"
    drop(_payload(gpu_sig, now), drop_dir, cluster.munge_socket, ttl_s=300)
    _collect(cluster, conf)
    gpu = UsageRecord("NVIDIA A100", 0.8, 0.4, 5e9, 12.0, 40, now)
    cpu = CpuUsageRecord(3.5e9, 40, now)
    for payload in (
        Drop(gpu_sig, NODE_NAME, (), now, (gpu,)),
        Drop(cpu_sig, NODE_NAME, (), now, cpu_usage=cpu),
    ):
        drop(payload, drop_dir, cluster.munge_socket, ttl_s=300)
    out = _collect(cluster, conf)
    assert "2 accepted (0 samples merged, 0 job summaries appended), 0 refused" in out.stdout, out
    assert store.read(gpu_sig).usage == (gpu,) and store.read(gpu_sig).n_samples == 2
    made = store.read(cpu_sig)
    assert made is not None and made.cpu_usage == cpu and made.source == "cpu-usage"
    assert "3.50 GB/s per CPU over 40 ticks" in out.stderr
    assert not any(drop_dir.iterdir())


def test_the_drop_directory_cannot_be_used_against_other_files(
    cluster: DevCluster, tmp_path: Path
) -> None:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    drop_dir.chmod(0o1777)
    conf = _conf(cluster, tmp_path / "coda.conf", drop_dir)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    sig = "workload:0:dropsticky"
    # A node's drop: users can neither remove, rename nor overwrite it (sticky, 0600).
    mine = drop(_payload(sig, time.time()), drop_dir, cluster.munge_socket, ttl_s=300)
    assert mine.stat().st_mode & 0o777 == 0o600
    for argv in (
        ["rm", "-f", str(mine)],
        ["mv", str(mine), str(drop_dir / "x")],
        ["sh", "-c", f"echo forged > {mine}"],
    ):
        assert _as_user(argv).returncode != 0, argv
    # A user's symlink with a drop name, to root's file: left alone, never read or removed.
    link = drop_dir / f"{'e' * 32}.munge"
    assert _as_user(["ln", "-s", str(victim), str(link)]).returncode == 0
    out = _collect(cluster, conf)
    assert (
        "1 accepted (2 samples merged, 0 job summaries appended), 0 refused, 1 left alone"
        in out.stdout
    ), out
    assert f"drop {link}: a symbolic link; left alone, not read" in out.stderr
    assert victim.read_text() == "root's file\n" and link.is_symlink() and not mine.exists()


# --------------------------------------------------------------------------------------------
# The closed loop through the drop directory


@pytest.fixture(scope="module")
def drop_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run the daemon without CAP_DAC_OVERRIDE")
    root = tmp_path_factory.mktemp("dropslurm")
    # The coda.conf of the whole cluster, as an admin would write it for NFS with root_squash.
    # MinConfidence=0: the hook uses whatever profile the probing run publishes. How sure
    # the model is of a run depends on this host's load (2 shared vCPUs); what the test
    # shows is the way a profile takes through the drop directory to the next sbatch.
    munge_keys = (
        f"ProfilePublish=munge\nProfileDropDir={root / 'drop'}\n"
        f"MungeSocket={root / 'munge' / 'munge.socket'}\nMinConfidence=0\n"
    )
    cluster = DevCluster(
        root, cgroups=True, def_cpu_per_gpu=2, coda_conf_extra=LOOP_CONF + munge_keys
    )
    yield from started(cluster)


def test_a_probing_run_reaches_the_next_sbatch_through_munge_with_the_store_unwritable(
    drop_cluster: DevCluster, tmp_path: Path
) -> None:
    cluster = drop_cluster
    drop_dir = cluster.root / "drop"
    drop_dir.mkdir(exist_ok=True)
    drop_dir.chmod(0o1777)
    cluster.profile_store.mkdir(parents=True, exist_ok=True)
    cluster.profile_store.chmod(0o555)
    probe = subprocess.run(
        [*SQUASHED_ROOT, "touch", str(cluster.profile_store / "x.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0 and "Permission denied" in probe.stderr

    conf = str(cluster.coda_conf)
    log = tmp_path / "coda-node.log"
    collect_log = tmp_path / "collect.log"
    with log.open("w") as out, collect_log.open("w") as cout:
        daemon = subprocess.Popen(
            [*SQUASHED_ROOT, sys.executable, "-m", "coda_node.cli", "run", "--conf", conf],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        collector = subprocess.Popen(
            [*COLLECT, "--conf", conf, "--watch", "0.5"],
            env=cluster.env,
            stdout=cout,
            stderr=subprocess.STDOUT,
        )
    try:
        script = _train_script(cluster, loaders=1, work=20000, gpu_ms=25)
        args = ["--gpus=1", "--comment=coda:workload=viamunge", _export(cluster)]
        job_id, _ = cluster.sbatch(args, script)
        _wait(lambda: _job_dir(job_id), f"job {job_id} to start")
        assert cluster.show_job(job_id)["NumCPUs"] == "2"  # no profile yet
        store = ProfileStore(cluster.profile_store)
        sig = "workload:0:viamunge"

        prof = _wait(lambda: store.read(sig), "the collector to merge the run's profile", 180)
        # What the model makes of the run depends on this host's load; what matters here is
        # that it reached the store, and from there the next submission.
        assert prof.source == f"coda-node:{NODE_NAME}" and prof.n_samples >= 2
        published = [
            e["reason"] for e in _events(cluster, job_id) if e["action"] == "profile-publish"
        ]
        assert published and "handed to the controller as" in published[0], published
        assert f"samples of {sig} from node {NODE_NAME} merged" in collect_log.read_text()
        assert not list(cluster.profile_store.glob(".*.tmp"))

        def right_sized():
            jid, _ = cluster.sbatch([*args, "--hold"], script)
            job = cluster.show_job(jid)
            cluster.run(["scancel", str(jid)], check=False)
            return job if "action=set" in job["AdminComment"] else None

        second = _wait(right_sized, "the hook to right-size the next submission", 15)
        cpg = prof.cpus_per_gpu
        assert f"cpg={cpg};" in second["AdminComment"] and "src=profile" in second["AdminComment"]
        assert second.get("CpusPerTres") == gres(f"gres:gpu:{cpg}")

        # The job ends: its summary goes the same way, and the collector appends it.
        cluster.run(["scancel", str(job_id)], check=False)
        summaries = store_for(load_config(cluster.coda_conf))

        def summarised():
            return [x for x in summaries.scan() if x.job_id == job_id] or None

        (summary,) = _wait(summarised, "the collector to append the job's summary", 60)
        assert (summary.node, summary.kind, summary.gpus) == (NODE_NAME, "dnn", 1)
        assert summary.probes >= 1 and 0 < summary.probe_s <= summary.sampled_s
        assert [p.name for p in summaries.root.glob("*/*.jsonl")] == ["collector.jsonl"]
        appended = f"job summaries of job(s) {job_id} from node {NODE_NAME} appended"
        assert appended in collect_log.read_text()
        ended = [e["reason"] for e in _events(cluster, job_id) if e["action"] == "summary-publish"]
        assert len(ended) == 1 and "handed to the controller as" in ended[0], ended
    finally:
        cluster.run(["scancel", "-u", "root"], check=False)
        for proc in (daemon, collector):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        _wait(lambda: not _squeue(cluster), "jobs to end", 30)
        print(log.read_text()[-3000:])
        print(collect_log.read_text()[-2000:])
    assert os.stat(cluster.profile_store).st_mode & 0o777 == 0o555
