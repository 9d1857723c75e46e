"""A three-node cluster on one machine: each slurmd in its own network namespace with its own
cgroup tree (``slurm_gpuNN``), each node with its own running ``coda-node`` and one shared
profile store.

A workload profiled online on gpu01 is right-sized for a job that lands on gpu02; a 2-node
GPU job gets the hook's multi-node rule and each node's daemon sees only its own part; and
``coda-slurm reserve`` caps each node's spare partition from that node's own GPU jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.store.profiles import Profile, ProfileStore
from coda_node.enforce.state import StateFile
from slurm_plugin.devtools.cluster import (
    DevCluster,
    NodeSpec,
    parse_scontrol_line,
    two_node_try_args,
)
from tests.conftest import cancel_all, gres, require_slurm, started
from tests.node.test_node_loop_slurm import LOOP_CONF, _train_script
from tests.node.test_node_slurm import _cgroup_v1_reason, _wait

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
NODES = ("gpu01", "gpu02", "gpu03")
CPUSET = Path("/sys/fs/cgroup/cpuset")
SPARES = ("spare01", "spare02", "spare03", "spare_all")
SLEEP = "#!/bin/sh\nsleep 300\n"
MIN_CONFIDENCE = 0.3
"""Low: what is tested is that one node's profile reaches another node's job, not how sure
the profiler gets on a shared 2-vCPU machine (under load a probe is noisy)."""
ADDR_AND_SLEEP = "#!/bin/sh\nip -o -4 addr show eth0\necho $CODA_PROGRESS_DIR\nsleep 300\n"


def _multinode_reason() -> str | None:
    reason = _cgroup_v1_reason()
    if reason:
        return reason
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not found (iproute2, util-linux): needed for one namespace per node"
    if not Path("/proc/self/ns/net").exists():
        return "no network namespaces in this kernel"
    return None


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _multinode_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("multinode")
    spares = "".join(
        f"PartitionName=spare{i:02d} Nodes=gpu{i:02d} MaxTime=INFINITE State=UP\n"
        for i in range(1, len(NODES) + 1)
    )
    cluster = DevCluster(
        root,
        node=NodeSpec(gpus=2),
        cgroups=True,
        nodes=len(NODES),
        coda_nodes=True,
        def_cpu_per_gpu=2,
        coda_conf_extra=(
            LOOP_CONF
            + f"MinConfidence={MIN_CONFIDENCE}\n"
            + f"ReservePartitions={','.join(SPARES)}\nReserveCpusPerGpu=0.5\n"
            f"ReserveMinCpus=0\nReserveStateFile={root / 'reserve.json'}\n"
        ),
        extra_partitions=spares
        + f"PartitionName=spare_all Nodes=gpu[01-{len(NODES):02d}] MaxTime=INFINITE State=UP\n",
    )
    yield from started(cluster)


@pytest.fixture
def cluster(multi: DevCluster) -> Iterator[DevCluster]:
    yield multi
    cancel_all(multi)


def _view(c: DevCluster, node: str) -> dict:
    return StateFile(c.node_state_dir_of(node), c.node_runtime_dir_of(node)).load().view


def _job_views(c: DevCluster, job_id: int) -> dict[str, dict]:
    """Each node's daemon's view of ``job_id``, by node (nodes whose daemon lacks it absent)."""
    found = {}
    for node in NODES:
        for job in _view(c, node).get("jobs", []):
            if job["job_id"] == job_id:
                found[node] = job
    return found


def _cgroup_nodes(job_id: int) -> set[str]:
    """The nodes whose slurmd made a cgroup for ``job_id`` (``slurm_<node>/uid_*/job_<id>``)."""
    return {p.parts[5].removeprefix("slurm_") for p in CPUSET.glob(f"slurm_*/uid_*/job_{job_id}")}


def _running_on(c: DevCluster, job_id: int) -> dict[str, str]:
    def running() -> dict[str, str] | None:
        job = c.show_job(job_id)
        return job if job["JobState"] == "RUNNING" else None

    return _wait(running, f"job {job_id} to run", 30)


def test_every_node_has_its_own_address_slurmd_cgroup_tree_and_coda_node(
    cluster: DevCluster,
) -> None:
    assert cluster.node_states() == dict.fromkeys(NODES, "IDLE")
    out = cluster.run(["scontrol", "-o", "show", "node"]).stdout
    addrs = {f["NodeName"]: f["NodeAddr"] for f in map(parse_scontrol_line, out.splitlines())}
    assert addrs == {"gpu01": "10.77.0.11", "gpu02": "10.77.0.12", "gpu03": "10.77.0.13"}
    # A job on each node: its processes run in that node's namespace and cgroup tree.
    ids = {node: cluster.sbatch(["-w", node, "-c1"], ADDR_AND_SLEEP)[0] for node in NODES}
    for node, job_id in ids.items():
        _wait(lambda job_id=job_id: _cgroup_nodes(job_id), f"job {job_id}'s cgroup")
        assert _cgroup_nodes(job_id) == {node}
        out_file = cluster.root / "tmp" / f"slurm-{job_id}.out"

        def output(f: Path = out_file) -> list[str] | None:
            lines = f.read_text().splitlines() if f.exists() else []
            return lines if len(lines) >= 2 else None

        addr_line, progress_dir = _wait(output, f"job {job_id}'s output")[:2]
        assert f"inet {cluster.node_addr(node)}/24" in addr_line
        # Its tasks report progress where its own node's coda-node reads it (TaskProlog).
        assert progress_dir == str(cluster.node_progress_dir_of(node))
    # Each node's coda-node sees its own node's job and no other.
    for node, job_id in ids.items():

        def seen(node: str = node) -> set[int] | None:
            jobs = {j["job_id"] for j in _view(cluster, node).get("jobs", [])}
            return jobs if jobs else None

        assert _wait(seen, f"{node}'s coda-node to see its job") == {job_id}


def test_profiled_on_one_node_right_sizes_a_job_on_another(cluster: DevCluster) -> None:
    # GPU-bound: one loader needs ~2 ms of CPU per 10 ms GPU step, so 1 core is enough on
    # a quiet machine (on a loaded one the profiler may find it needs more).
    script = _train_script(cluster, loaders=1, work=20000, gpu_ms=10)
    args = ["--gpus=1", "--comment=coda:workload=mn-loader"]
    first_id, _ = cluster.sbatch(["-w", "gpu01", *args], script)
    first = _running_on(cluster, first_id)
    assert first["NumCPUs"] == "2" and "src=none" in first["AdminComment"]
    store = ProfileStore(cluster.profile_store)

    def profiled() -> Profile | None:
        prof = store.read("workload:0:mn-loader")
        return prof if prof is not None and prof.confidence >= MIN_CONFIDENCE else None

    prof = _wait(profiled, "gpu01's coda-node to publish a profile", 120)
    # What the hook gives a 1-GPU job from it on a node of 2 CPUs per GPU.
    cpg = min(prof.cpus_per_gpu, 2)
    assert prof.source == "coda-node:gpu01"
    assert {s.node for s in prof.samples} == {"gpu01"}
    cluster.run(["scancel", str(first_id)])

    # The hook reloads the store within ReloadIntervalS; then the next submission lands
    # on gpu02, right-sized from gpu01's profile.
    def hook_knows() -> bool:
        held, _ = cluster.sbatch(["--hold", *args], script)
        comment = cluster.show_job(held)["AdminComment"]
        cluster.run(["scancel", str(held)], check=False)
        return "src=profile" in comment

    _wait(hook_knows, "the hook to load gpu01's profile", 15)
    second_id, _ = cluster.sbatch(["-w", "gpu02", *args], script)
    second = _running_on(cluster, second_id)
    assert second["NodeList"] == "gpu02"
    assert "src=profile" in second["AdminComment"]
    assert f"cpg={cpg};" in second["AdminComment"]
    assert second["NumCPUs"] == str(cpg)
    assert second.get("CpusPerTres") == gres(f"gres:gpu:{cpg}")
    # gpu02's daemon has the job, with the cores of gpu02's cgroup; no other daemon has it.
    view = _wait(lambda: _job_views(cluster, second_id).get("gpu02"), "gpu02's daemon's view")
    cpus = (CPUSET / f"slurm_gpu02/uid_0/job_{second_id}/cpuset.cpus").read_text().strip()
    assert view["cpus_now"] == cpus
    assert set(_job_views(cluster, second_id)) == {"gpu02"}


def test_a_two_node_gpu_job_gets_the_multi_node_rule_and_each_daemon_its_part(
    cluster: DevCluster,
) -> None:
    # Measured: 2 cores per GPU on one node, 1 per GPU when the job spans nodes.
    ProfileStore(cluster.profile_store).write(
        Profile(
            signature="workload:0:mn-wide",
            workload="mn-wide",
            cpus_per_gpu=2,
            multi_node_cpus_per_gpu=1,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=__import__("time").time(),
            source="test",
        )
    )
    comment = "--comment=coda:workload=mn-wide"

    def decided(args: list[str]) -> dict[str, str] | None:
        job_id, _ = cluster.sbatch(["--hold", comment, *args], SLEEP)
        job = cluster.show_job(job_id)
        cluster.run(["scancel", str(job_id)], check=False)
        return job if "src=profile" in job["AdminComment"] else None

    one = _wait(lambda: decided(["--gpus=1"]), "the hook to load the profile", 15)
    assert "cpg=2" in one["AdminComment"] and one["CpusPerTres"] == gres("gres:gpu:2")
    two_args = ["-N2", "--ntasks-per-node=1", "--gpus-per-node=1", comment]
    job_id, _ = cluster.sbatch(two_args, "#!/bin/sh\nsrun sleep 300\n")
    job = _running_on(cluster, job_id)
    assert "cpg=1" in job["AdminComment"] and job["CpusPerTres"] == gres("gres:gpu:1")
    assert job["NumNodes"] == "2"
    out = cluster.run(["scontrol", "show", "hostnames", job["NodeList"]]).stdout
    nodes = set(out.split())
    assert len(nodes) == 2 and nodes < set(NODES)

    # srun's step runs on both nodes: each slurmd made the job's cgroup in its own tree.
    _wait(lambda: _cgroup_nodes(job_id) == nodes, "the step's cgroup on both nodes")

    # Each node's daemon shows the job with its own part (one GPU, one core) and skips it:
    # profiles come from single-node runs. The third node's daemon does not have it.
    def both() -> dict[str, dict] | None:
        views = _job_views(cluster, job_id)
        return views if set(views) == nodes else None

    views = _wait(both, "both nodes' daemons to see the job")
    for node, view in views.items():
        cpus = (CPUSET / f"slurm_{node}/uid_0/job_{job_id}/cpuset.cpus").read_text().strip()
        assert view["cpus_now"] == cpus, node
        assert len(view["gpus"]) == 1, node
        assert "multi-node job" in json.dumps(view), node


def test_a_workload_measured_across_nodes_gets_its_measured_figure_next_time(
    cluster: DevCluster,
) -> None:
    # One node's profile says 2 cores per GPU; the rule (MultiNodeGpuCap=2, one GPU a node)
    # gives a 2-node job the same 2 on each node. The job only sleeps: each node's coda-node
    # reads its part's CPU use when it ends and merges the figure (about 0 cores per GPU)
    # into the profile; with MultiNodeMinSamples=2 figures the next multi-node job gets the
    # measured figure with its margin, at least 1 core per GPU, and its record says so.
    store = ProfileStore(cluster.profile_store)
    store.write(
        Profile(
            signature="workload:0:mn-measured",
            workload="mn-measured",
            cpus_per_gpu=2,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=time.time(),
            source="test",
        )
    )
    comment = "--comment=coda:workload=mn-measured"
    two_args = ["-N2", "--ntasks-per-node=1", "--gpus-per-node=1", comment]

    def decided(want: str) -> dict[str, str] | None:
        job_id, _ = cluster.sbatch(["--hold", *two_args], SLEEP)
        job = cluster.show_job(job_id)
        cluster.run(["scancel", str(job_id)], check=False)
        return job if want in job["AdminComment"] else None

    ruled = _wait(lambda: decided("src=profile"), "the hook to load the profile", 15)
    assert "cpg=2;" in ruled["AdminComment"] and ";mn=" not in ruled["AdminComment"]
    job_id, _ = cluster.sbatch(two_args, "#!/bin/sh\nsrun sleep 10\n")
    job = _running_on(cluster, job_id)
    assert job["CpusPerTres"] == gres("gres:gpu:2") and job["NumNodes"] == "2"

    def measured() -> Profile | None:
        prof = store.read("workload:0:mn-measured")
        done = prof is not None and prof.multi_node is not None
        return prof if done and prof.multi_node.n_figures >= 2 else None

    prof = _wait(measured, "both nodes' figures of the 2-node job in the profile", 120)
    assert prof.multi_node.n_figures == 2
    assert all(0 <= f < 0.5 for f in prof.multi_node.figures_cores_per_gpu)
    # The single-node figure is untouched: a one-GPU job still gets 2.
    assert prof.cpus_per_gpu == 2
    after = _wait(lambda: decided(";mn=2"), "the hook to give the measured figure", 30)
    assert "cpg=1;" in after["AdminComment"]
    assert after["CpusPerTres"] == gres("gres:gpu:1")
    one = _wait(lambda: decided_one(cluster, comment), "a one-node job's decision", 15)
    assert "cpg=2;" in one["AdminComment"]


def decided_one(cluster: DevCluster, comment: str) -> dict[str, str] | None:
    job_id, _ = cluster.sbatch(["--hold", "--gpus=1", comment], SLEEP)
    job = cluster.show_job(job_id)
    cluster.run(["scancel", str(job_id)], check=False)
    return job if "src=profile" in job["AdminComment"] else None


def test_the_job_dev_cluster_up_suggests_runs(cluster: DevCluster) -> None:
    # What `dev-cluster up --nodes N` prints for this cluster's nodes (this host's CPUs).
    args = two_node_try_args(os.cpu_count() or 1, cluster.def_cpu_per_gpu)
    job_id, _ = cluster.sbatch(args, "#!/bin/sh\nsrun sleep 300\n")
    assert _running_on(cluster, job_id)["NumNodes"] == "2"


def test_the_suggested_job_fits_a_node_smaller_than_def_cpu_per_gpu() -> None:
    # `up --nodes 3` on a 2-CPU host: DefCpuPerGPU=4 alone would ask 4 CPUs of a 2-CPU node.
    assert two_node_try_args(2, 4) == ["-N2", "--gpus-per-node=1", "--cpus-per-gpu=2"]
    assert two_node_try_args(16, 4) == ["-N2", "--gpus-per-node=1"]
    assert two_node_try_args(2, None) == ["-N2", "--gpus-per-node=1"]


def _reserve(cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_plugin.cli.main", "reserve", *args],
        env=cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reserve_caps_each_node_from_its_own_gpu_jobs(cluster: DevCluster) -> None:
    # Idle: each node's 2 GPUs keep ceil(2 x 0.5) = 1 of its 2 cores; 1 may go to CPU jobs.
    proc = _reserve(cluster, "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    try:
        after = {p["partition"]: p["after"] for p in json.loads(proc.stdout)["partitions"]}
        assert after == dict.fromkeys(SPARES, "1")
        # A GPU job on gpu02 holds a core and a GPU: gpu02 keeps 1 + ceil(1 x 0.5) = 2 and
        # lends nothing; gpu01 and gpu03 still lend 1. The partition over every node takes
        # the fewest any node with an idle GPU can spare.
        job_id, _ = cluster.sbatch(["-w", "gpu02", "--gpus=1", "--cpus-per-gpu=1"], SLEEP)
        _running_on(cluster, job_id)
        proc = _reserve(cluster, "--once", "--json")
        assert proc.returncode == 0, proc.stderr
        doc = {p["partition"]: p for p in json.loads(proc.stdout)["partitions"]}
        assert {name: p["after"] for name, p in doc.items()} == {
            "spare01": "1",
            "spare02": "0",
            "spare03": "1",
            "spare_all": "0",
        }
        assert doc["spare02"]["per_node"] == [{"node": "gpu02", "reserved_cpus": 2}]
        assert doc["spare01"]["per_node"] == [{"node": "gpu01", "reserved_cpus": 1}]
        assert {n["node"]: n["reserved_cpus"] for n in doc["spare_all"]["per_node"]} == {
            "gpu01": 1,
            "gpu02": 2,
            "gpu03": 1,
        }
        shown = cluster.run(["scontrol", "-o", "show", "partition", "spare02"]).stdout
        assert parse_scontrol_line(shown.strip())["MaxCPUsPerNode"] == "0"
    finally:
        proc = _reserve(cluster, "--revert")
        assert proc.returncode == 0, proc.stderr
    assert not (cluster.root / "reserve.json").exists()
    assert os.path.exists(cluster.slurm_conf)
