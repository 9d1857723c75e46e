"""coda-slurm reserve, the pure part: how many cores a spare partition may use per node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coda_common.config.codaconf import parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmjson import SlurmQueryError
from slurm_plugin.cli.main import main
from slurm_plugin.reserve import cluster as reserve_cluster
from slurm_plugin.reserve.cluster import (
    STATE_FORMAT,
    ClusterView,
    ReserveSettings,
    ReserveState,
    ReserveStateError,
    default_cpus_per_gpu,
    node_is_up,
    parse_jobs,
    parse_nodes,
    parse_partitions,
    plan_for,
    read_cluster,
)
from slurm_plugin.reserve.plan import (
    NodeLoad,
    expected_cpus_per_gpu,
    node_reserved_cpus,
    plan_partition,
    spare_cpus_per_node,
)


def node(
    name: str = "gpu01",
    cpus: int = 32,
    gpus: int = 4,
    gpus_alloc: int = 0,
    held: int = 0,
    up: bool = True,
) -> NodeLoad:
    return NodeLoad(name, cpus, gpus, gpus_alloc, held, up)


@pytest.mark.parametrize(
    ("load", "cpus_per_gpu", "reserved"),
    [
        # idle node: every GPU keeps its expected cores
        (node(), 4, 16),
        (node(), 8, 32),
        # 3 GPUs busy holding 12 cores, 1 idle GPU x 4
        (node(gpus_alloc=3, held=12), 4, 16),
        # all GPUs busy: only what the GPU jobs hold
        (node(gpus_alloc=4, held=10), 4, 10),
        # fractional cores per GPU round up per node (3 idle x 2.5 = 7.5 -> 8)
        (node(gpus_alloc=1, held=2), 2.5, 2 + 8),
        # floating point: 5 idle x 2.2 is 11.000000000000002, still 11
        (node(cpus=64, gpus=5), 2.2, 11),
        # never more than the node has
        (node(cpus=16), 8, 16),
        (node(cpus=16, gpus_alloc=2, held=14), 4, 16),
        # more GPUs allocated than configured (reconfigured node): no negative idle
        (node(gpus=2, gpus_alloc=3, held=6), 4, 6),
        # a node without GPUs reserves nothing
        (node(gpus=0), 4, 0),
        # zero cores per GPU: only what is held
        (node(gpus_alloc=1, held=5), 0, 5),
    ],
)
def test_node_reserved_cpus(load: NodeLoad, cpus_per_gpu: float, reserved: int) -> None:
    assert node_reserved_cpus(load, cpus_per_gpu) == reserved


@pytest.mark.parametrize(
    ("nodes", "cpus_per_gpu", "min_cpus", "spare"),
    [
        ([node()], 4, 1, 16),
        # the tightest up node with an idle GPU sets the value
        ([node("a"), node("b", gpus_alloc=3, held=24)], 4, 1, 4),
        # a node with every GPU allocated does not: Slurm keeps CPU jobs off held cores
        ([node("a"), node("b", gpus_alloc=4, held=28)], 4, 1, 16),
        # a: 20 held + 3 idle GPUs x 4 = all 32 cores; never below min_cpus
        ([node("a", gpus_alloc=1, held=20), node("b", gpus_alloc=4, held=31)], 4, 1, 1),
        # no node has an idle GPU: the most any node can spare
        ([node("a", gpus_alloc=4, held=30), node("b", gpus_alloc=4, held=20)], 4, 1, 12),
        # a down node is skipped, even when it is the tightest
        ([node("a"), node("b", gpus_alloc=4, held=30, up=False)], 4, 1, 16),
        # never below min_cpus
        ([node(gpus_alloc=4, held=32)], 4, 1, 1),
        ([node(gpus_alloc=4, held=32)], 4, 0, 0),
        ([node(cpus=16)], 8, 2, 2),
        # no up node: leave the value alone
        ([node(up=False)], 4, 1, None),
        ([], 4, 1, None),
        # mixed shapes in one partition: the small node sets it (why one partition per shape)
        ([node("big", cpus=64, gpus=4), node("small", cpus=16, gpus=2)], 4, 1, 8),
    ],
)
def test_spare_cpus_per_node(
    nodes: list[NodeLoad], cpus_per_gpu: float, min_cpus: int, spare: int | None
) -> None:
    assert spare_cpus_per_node(nodes, cpus_per_gpu, min_cpus=min_cpus) == spare


def test_spare_cpus_per_node_takes_any_iterable() -> None:
    assert spare_cpus_per_node(iter([node()]), 4) == 16


@pytest.mark.parametrize(
    ("pending", "default", "expected"),
    [
        ([], 4, 4.0),
        ([6], 4, 6.0),
        ([2, 3, 10], 4, 3.0),
        ([2, 4], 8, 3.0),
        # one job asking 64 per GPU does not decide for everyone
        ([3, 3, 64], 4, 3.0),
        # nonsense values (0, negative) are not jobs that ask for cores
        ([0, -1], 5, 5.0),
        ([0, 6], 4, 6.0),
        ([1.5, 2.5], 4, 2.0),
    ],
)
def test_expected_cpus_per_gpu(pending: list[float], default: float, expected: float) -> None:
    assert expected_cpus_per_gpu(pending, default) == expected


def test_plan_partition_reason_names_the_tightest_node_first() -> None:
    plan = plan_partition(
        "gpu_spare",
        [node("gpu02", gpus_alloc=1, held=4), node("gpu01", gpus_alloc=3, held=12)],
        [],
        default_cpus_per_gpu=4,
        min_cpus=1,
    )
    assert plan.partition == "gpu_spare"
    assert plan.max_cpus_per_node == 16
    assert plan.cpus_per_gpu == 4.0
    assert plan.per_node == (("gpu02", 16), ("gpu01", 16))
    assert plan.reason.startswith("gpu01: 16 reserved = 12 held + 1 idle GPU x 4; ")
    assert "gpu02: 16 reserved = 4 held + 3 idle GPUs x 4" in plan.reason


def test_plan_partition_uses_pending_jobs_cores_per_gpu() -> None:
    plan = plan_partition("gpu_spare", [node()], [6, 6, 2], default_cpus_per_gpu=4, min_cpus=1)
    assert plan.cpus_per_gpu == 6.0
    assert plan.max_cpus_per_node == 32 - 24
    assert "4 idle GPUs x 6" in plan.reason


def test_plan_partition_skips_down_nodes_and_says_so() -> None:
    plan = plan_partition(
        "gpu_spare",
        [node("gpu01"), node("gpu02", gpus_alloc=4, held=32, up=False)],
        [],
        default_cpus_per_gpu=4,
        min_cpus=1,
    )
    assert plan.max_cpus_per_node == 16
    assert plan.per_node == (("gpu01", 16),)
    assert "1 down or drained, skipped (gpu02)" in plan.reason


@pytest.mark.parametrize(
    ("nodes", "says"),
    [
        ([node(up=False)], "every node is down or drained: gpu01"),
        ([], "the partition has no node"),
    ],
)
def test_plan_partition_without_up_nodes_leaves_the_value(nodes: list[NodeLoad], says: str) -> None:
    plan = plan_partition("gpu_spare", nodes, [], default_cpus_per_gpu=4, min_cpus=1)
    assert plan.max_cpus_per_node is None
    assert plan.per_node == ()
    assert plan.reason.startswith(says)


def test_plan_partition_floor_is_named() -> None:
    plan = plan_partition(
        "gpu_spare", [node(gpus_alloc=4, held=32)], [], default_cpus_per_gpu=4, min_cpus=2
    )
    assert plan.max_cpus_per_node == 2
    assert plan.reason.endswith("floor ReserveMinCpus=2")


def test_plan_partition_reason_stays_short_on_big_partitions() -> None:
    nodes = [node(f"gpu{i:03d}") for i in range(100)]
    plan = plan_partition("gpu_spare", nodes, [], default_cpus_per_gpu=4, min_cpus=1)
    assert len(plan.per_node) == 100
    assert "97 more node(s)" in plan.reason
    assert len(plan.reason) < 300


def test_plan_partition_says_when_a_node_is_capped_at_its_cpus() -> None:
    plan = plan_partition(
        "gpu_spare",
        [node(cpus=16, gpus_alloc=2, held=14)],
        [],
        default_cpus_per_gpu=4,
        min_cpus=1,
    )
    assert plan.max_cpus_per_node == 1
    assert "gpu01: 16 reserved = 14 held + 2 idle GPUs x 4 (capped at its 16 CPUs)" in plan.reason


# -- reading Slurm's records (lines as Slurm 22.05 prints them) ------------------------------


NODES = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=8  CPUAlloc=5 CPUEfctv=8 CPUTot=8 "
    "CPULoad=0.48 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:2 "
    "NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 RealMemory=64000 AllocMem=0 "
    "Sockets=1 Boards=1 State=MIXED ThreadsPerCore=1 GresDrain=N/A "
    "GresUsed=gpu:a100:1(IDX:0) Partitions=gpu,gpu_spare  CfgTRES=cpu=8 AllocTRES=cpu=5\n"
    "NodeName=gpu02 CPUTot=64 Gres=gpu:h100:4(S:0-1) State=MIXED+DRAIN "
    "GresUsed=gpu:h100:0(IDX:N/A) Reason=maintenance [root@2026-01-01T00:00:00]\n"
    "NodeName=gpu03 CPUTot=64 Gres=gpu:4 State=IDLE\n"
)


def test_parse_nodes() -> None:
    nodes = parse_nodes(NODES)
    assert nodes["gpu01"].cpus == 8 and nodes["gpu01"].gpus == 2
    assert nodes["gpu01"].gpus_used == 1 and nodes["gpu01"].up
    assert nodes["gpu02"].gpus == 4 and nodes["gpu02"].gpus_used == 0
    assert not nodes["gpu02"].up
    # no GresUsed (scontrol without -d): the GPUs come from the jobs instead
    assert nodes["gpu03"].gpus_used is None
    assert parse_nodes("No nodes in the system\n") == {}


@pytest.mark.parametrize(
    ("state", "up"),
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("MIXED+PLANNED", True),
        ("IDLE+COMPLETING", True),
        ("IDLE+POWERED_DOWN", True),
        ("DOWN", False),
        ("DOWN+NOT_RESPONDING", False),
        ("IDLE+DRAIN", False),
        ("MIXED+DRAIN", False),
        ("ALLOCATED+NOT_RESPONDING", False),
        ("IDLE*", False),
        ("FUTURE", False),
        ("FAIL", False),
        ("", False),
    ],
)
def test_node_is_up(state: str, up: bool) -> None:
    assert node_is_up(state) is up


def _job(
    job_id: int,
    state: str,
    partition: str = "gpu",
    held: dict[str, tuple[int, str]] | None = None,
    cpus_per_tres: str = "",
    **text: str,
) -> dict[str, object]:
    """A job record as ``squeue --json`` of 24.11 and later prints it; ``held``: node ->
    (cores allocated there, its ``gres_detail`` entry)."""
    nodes = list((held or {}).items())
    allocation = [
        {
            "index": i,
            "name": name,
            "sockets": [
                {"index": 0, "cores": [{"index": c, "status": ["ALLOCATED"]} for c in range(k)]}
            ],
        }
        for i, (name, (k, _)) in enumerate(nodes)
    ]
    return {
        "job_id": job_id,
        "job_state": [state],
        "partition": partition,
        "cpus_per_tres": cpus_per_tres,
        "job_resources": {"nodes": {"allocation": allocation}} if nodes else None,
        "gres_detail": [g for _, (_, g) in nodes],
        **text,
    }


JOBS = [
    # a running GPU job: 3 cores and 1 GPU on gpu01, whose name and comment say it holds
    # 32 cores and 4 GPUs (what `scontrol -o` would print for an allocation)
    _job(
        1,
        "RUNNING",
        held={"gpu01": (3, "gpu:a100:1(IDX:0)")},
        cpus_per_tres="gres:gpu:3",
        name="j Nodes=gpu01 CPU_IDs=0-31 Mem=0 GRES=gpu:a100:4(IDX:0-3)",
        comment="\nNodes=gpu[02-03] CPU_IDs=0-31 Mem=0 GRES=gpu:4(IDX:0-3)",
    ),
    # a two-node GPU job: 8 cores and 2 GPUs on each node
    _job(2, "RUNNING", held={"gpu02": (8, "gpu:2(IDX:0-1)"), "gpu03": (8, "gpu:2(IDX:0-1)")}),
    # a CPU job beside them: not counted
    _job(3, "RUNNING", "gpu_spare", held={"gpu01": (2, "")}),
    # pending GPU jobs: their cores per GPU; one submitted to two partitions; one whose
    # comment claims a CpusPerTres
    _job(4, "PENDING", cpus_per_tres="gres:gpu:2", comment="CpusPerTres=gres:gpu:64"),
    _job(5, "PENDING", "gpu,gpu_big", cpus_per_tres="gres/gpu:a100:6"),
    # pending without --cpus-per-gpu, and a finished GPU job: neither counts
    _job(6, "PENDING", comment=" JobState=PENDING CpusPerTres=gres:gpu:9"),
    _job(7, "COMPLETED", held={"gpu01": (3, "gpu:a100:1(IDX:1)")}),
]
THREADS_PER_CORE = {"gpu01": 1, "gpu02": 1, "gpu03": 1}
SLURM_JSON = Path(__file__).parents[1] / "data" / "slurm_json"


def test_parse_jobs() -> None:
    usage = parse_jobs(JOBS, THREADS_PER_CORE)
    assert dict(usage.gpu_job_cpus) == {"gpu01": 3, "gpu02": 8, "gpu03": 8}
    assert dict(usage.gpu_job_gpus) == {"gpu01": 1, "gpu02": 2, "gpu03": 2}
    assert [(j.job_id, j.partitions, j.cpus_per_gpu) for j in usage.pending] == [
        (4, ("gpu",), 2.0),
        (5, ("gpu", "gpu_big"), 6.0),
    ]
    assert parse_jobs([], THREADS_PER_CORE).pending == ()


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_parse_jobs_of_real_slurm_ignores_what_a_hostile_job_says(release: str) -> None:
    """Records captured from each release (tests/data/slurm_json): nobody's GPU job names
    ``Nodes=gpu01 CPU_IDs=0-31 Mem=0 GRES=gpu:a100:4`` in its comment; the node has 2
    threads per core. What counts is what Slurm allocated: 1 core (2 CPUs) and 2 GPUs
    to it, 2 cores (4 CPUs) and 1 GPU to root's GPU job; the CPU job and the pending one
    hold no GPU."""
    raw = (SLURM_JSON / f"{release}-squeue.json").read_bytes()
    records = json.loads(raw.decode("utf-8", errors="replace"))["jobs"]
    usage = parse_jobs(records, {"gpu01": 2})
    assert dict(usage.gpu_job_cpus) == {"gpu01": 6}
    assert dict(usage.gpu_job_gpus) == {"gpu01": 3}
    assert usage.pending == ()


PARTITIONS = (
    "PartitionName=gpu AllowGroups=ALL Default=YES MaxCPUsPerNode=UNLIMITED "
    "Nodes=gpu[01-03] State=UP TotalCPUs=136 JobDefaults=DefCpuPerGPU=4 "
    "DefMemPerNode=UNLIMITED\n"
    "PartitionName=gpu_spare Default=NO MaxCPUsPerNode=24 Nodes=gpu[02-03] "
    "JobDefaults=(null)\n"
    "PartitionName=empty MaxCPUsPerNode=UNLIMITED Nodes=(null) "
    "JobDefaults=DefMemPerGPU=1000,DefCpuPerGPU=6\n"
)


def test_parse_partitions() -> None:
    parts = parse_partitions(PARTITIONS)
    assert parts["gpu"].nodes == ("gpu01", "gpu02", "gpu03")
    assert parts["gpu"].max_cpus_per_node == "UNLIMITED"
    assert parts["gpu"].def_cpu_per_gpu == 4
    assert parts["gpu_spare"].max_cpus_per_node == "24"
    assert parts["gpu_spare"].def_cpu_per_gpu is None
    assert parts["empty"].nodes == () and parts["empty"].def_cpu_per_gpu == 6


def test_plan_from_parsed_records() -> None:
    """The partition over gpu[02-03] sees the two-node job on both nodes and the pending
    jobs of the partition sharing its nodes."""
    usage = parse_jobs(JOBS, THREADS_PER_CORE)
    nodes = {
        name: NodeLoad(
            name,
            r.cpus,
            r.gpus,
            r.gpus_used if r.gpus_used is not None else usage.gpu_job_gpus.get(name, 0),
            usage.gpu_job_cpus.get(name, 0),
            r.up,
        )
        for name, r in parse_nodes(NODES).items()
    }
    view = ClusterView(nodes, parse_partitions(PARTITIONS), usage.pending)
    plan = plan_for(view, view.partitions["gpu_spare"], ReserveSettings(("gpu_spare",)))
    # gpu02 is drained (skipped); gpu03: 8 held + 2 idle GPUs x median(2, 6) = 16
    assert plan.cpus_per_gpu == 4.0
    assert plan.per_node == (("gpu03", 16),)
    assert plan.max_cpus_per_node == 64 - 16
    assert "1 down or drained, skipped (gpu02)" in plan.reason


def test_default_cpus_per_gpu_comes_from_the_gpu_partitions() -> None:
    parts = parse_partitions(PARTITIONS)
    view = ClusterView({}, parts, ())
    spare = parts["gpu_spare"]
    assert default_cpus_per_gpu(view, spare, ReserveSettings(("gpu_spare",))) == 4.0
    assert (
        default_cpus_per_gpu(view, spare, ReserveSettings(("gpu_spare",), cpus_per_gpu=2.5)) == 2.5
    )
    # no partition over the same nodes says: 4
    lonely = parse_partitions("PartitionName=cpu_spare MaxCPUsPerNode=8 Nodes=cpu01\n")
    view = ClusterView({}, lonely, ())
    assert default_cpus_per_gpu(view, lonely["cpu_spare"], ReserveSettings(("cpu_spare",))) == 4.0


# -- RestrictedCoresPerGPU (Slurm 24.05 on) --------------------------------------------------
# slurm.conf(5): "If a job does not request a GPU it will not have access to these cores."
# gpu01: 16 CPUs, 4 GPUs, 3 cores restricted per GPU: 12 for GPU jobs only, 4 for anyone.


def restricted_node(gpus_alloc: int = 0, held: int = 0, held_restricted: int = 0) -> NodeLoad:
    return NodeLoad("gpu01", 16, 4, gpus_alloc, held, True, 3, held_restricted)


@pytest.mark.parametrize(
    ("load", "cpus_per_gpu", "reserved"),
    [
        # idle: the 12 restricted cores, and what an idle GPU needs beyond its own 3
        (restricted_node(), 2, 12),
        (restricted_node(), 3, 12),
        (restricted_node(), 4, 12 + 4 * 1),
        (restricted_node(), 3.5, 12 + 2),
        # a GPU job holding 1 restricted core: its GPU's other 2 stay restricted
        (restricted_node(gpus_alloc=1, held=1, held_restricted=1), 4, 12 + 0 + 3 * 1),
        # a GPU job holding 3 restricted cores and 4 others: those 4 are held
        (restricted_node(gpus_alloc=1, held=7, held_restricted=3), 3, 12 + 4),
        # every GPU busy: restricted plus what is held beside them
        (restricted_node(gpus_alloc=4, held=14, held_restricted=12), 4, 12 + 2),
    ],
)
def test_restricted_cores_are_reserved_and_idle_gpus_need_only_the_rest(
    load: NodeLoad, cpus_per_gpu: float, reserved: int
) -> None:
    assert node_reserved_cpus(load, cpus_per_gpu) == reserved
    # never lent: a CPU job could not use a restricted core
    spare = spare_cpus_per_node([load], cpus_per_gpu, min_cpus=0)
    assert spare is not None
    assert spare <= load.cpus - 12 - (load.cpus_alloc_gpu_jobs - load.restricted_cpus_held)


def test_without_restricted_cores_nothing_changes() -> None:
    plain = NodeLoad("gpu01", 32, 4, 1, 5, True)
    assert node_reserved_cpus(plain, 4) == 5 + 3 * 4
    assert NodeLoad("gpu01", 32, 4, 1, 5, True, 0, 0) == plain


def test_plan_reason_says_what_is_restricted() -> None:
    plan = plan_partition(
        "gpu_spare",
        [restricted_node(gpus_alloc=1, held=1, held_restricted=1)],
        [],
        default_cpus_per_gpu=4,
        min_cpus=1,
    )
    assert plan.max_cpus_per_node == 1
    assert plan.reason == (
        "gpu01: 15 reserved = 12 restricted (RestrictedCoresPerGPU) + 0 held outside them + "
        "3 idle GPUs x 1 (4 less 3 restricted)"
    )


RESTRICTED_NODES = (
    # Slurm 24.11's `scontrol -d -o show node`: cores per GPU, then which cores
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=8 CPUAlloc=4 CPUEfctv=16 CPUTot=16 "
    "Gres=gpu:a100:4 Sockets=2 Boards=1 RestrictedCoresPerGPU=3(0-5,8-13) State=MIXED "
    "ThreadsPerCore=1 GresUsed=gpu:a100:1(IDX:0)\n"
    # two threads per core; not yet registered: Slurm does not know which cores yet
    "NodeName=gpu02 CoresPerSocket=8 CPUTot=32 Gres=gpu:4 Sockets=2 "
    "RestrictedCoresPerGPU=2((null)) State=IDLE ThreadsPerCore=2 GresUsed=gpu:0\n"
    # no restriction (or Slurm 22.05)
    "NodeName=gpu03 CoresPerSocket=8 CPUTot=16 Gres=gpu:4 Sockets=2 State=IDLE "
    "ThreadsPerCore=1\n"
)


def test_parse_nodes_reads_restricted_cores() -> None:
    nodes = parse_nodes(RESTRICTED_NODES)
    gpu01, gpu02, gpu03 = nodes["gpu01"], nodes["gpu02"], nodes["gpu03"]
    assert gpu01.restricted_cores_per_gpu == 3
    assert gpu01.restricted_cores == frozenset([0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13])
    assert gpu01.cores_per_socket == 8
    assert (gpu02.restricted_cores_per_gpu, gpu02.restricted_cores) == (2, None)
    assert gpu02.threads_per_core == 2
    assert (gpu03.restricted_cores_per_gpu, gpu03.restricted_cores) == (0, None)


@pytest.mark.parametrize("value", ["lots", "3(0-a)", "3(5-1)"])
def test_parse_nodes_names_a_bad_restriction(value: str) -> None:
    with pytest.raises(SlurmQueryError, match=r"node gpu01: .*RestrictedCoresPerGPU"):
        parse_nodes(f"NodeName=gpu01 CPUTot=16 Gres=gpu:4 RestrictedCoresPerGPU={value}\n")


def test_a_node_with_no_more_cpus_than_cores_counts_one_cpu_per_core() -> None:
    """Slurm's ``tpc``: CPUs=16 on 16 cores of 2 threads schedules cores, one CPU each."""
    text = "NodeName=g CoresPerSocket=8 CPUTot=16 Gres=gpu:4 Sockets=2 ThreadsPerCore=2\n"
    assert parse_nodes(text)["g"].threads_per_core == 1


def _on_cores(job_id: int, cores: dict[int, list[int]], gres: str) -> dict[str, object]:
    """A running job of ``squeue --json`` (24.11 on) holding ``cores`` (socket -> cores)
    and ``gres`` on gpu01."""
    sockets = [
        {"index": s, "cores": [{"index": c, "status": ["ALLOCATED"]} for c in cs]}
        for s, cs in cores.items()
    ]
    allocation = [{"index": 0, "name": "gpu01", "sockets": sockets}]
    return {
        "job_id": job_id,
        "job_state": ["RUNNING"],
        "partition": "gpu",
        "cpus_per_tres": "",
        "job_resources": {"nodes": {"allocation": allocation}},
        "gres_detail": [gres],
    }


RESTRICTED_JOBS = [
    # a GPU job on cores 0 and 6 of socket 0 and core 0 of socket 1 (cores 0, 6, 8):
    # 0 and 8 are restricted
    _on_cores(1, {0: [0, 6], 1: [0]}, "gpu:a100:1(IDX:0)"),
    # a CPU job on the unrestricted cores 7 and 15: not a GPU job's
    _on_cores(2, {0: [7], 1: [7]}, ""),
]


def test_parse_jobs_counts_the_restricted_cores_gpu_jobs_hold() -> None:
    restricted = parse_nodes(RESTRICTED_NODES)["gpu01"].restricted_cores
    assert restricted is not None
    usage = parse_jobs(RESTRICTED_JOBS, {"gpu01": 1}, {"gpu01": (8, restricted)})
    assert dict(usage.gpu_job_cpus) == {"gpu01": 3}
    assert dict(usage.gpu_job_restricted_cpus) == {"gpu01": 2}
    # without the node's cores: none counted as restricted
    assert dict(parse_jobs(RESTRICTED_JOBS, {"gpu01": 1}).gpu_job_restricted_cpus) == {}


def test_read_cluster_lends_only_unrestricted_cores() -> None:
    """Slurm's records in, the plan out: gpu01 keeps its 12 restricted cores, the 1 core
    the GPU job holds beside them, and 3 idle GPUs x (4 - 3); of the 4 unrestricted cores,
    the CPU job may have 2 (the other holds 1, and 1 goes to the idle GPUs)."""
    outputs = {
        "scontrol -d -o show node": RESTRICTED_NODES.splitlines()[0] + "\n",
        "squeue --json --all": json.dumps({"jobs": RESTRICTED_JOBS}),
        "scontrol -o show partition": (
            "PartitionName=gpu MaxCPUsPerNode=UNLIMITED Nodes=gpu01 JobDefaults=DefCpuPerGPU=4\n"
            "PartitionName=gpu_spare MaxCPUsPerNode=UNLIMITED Nodes=gpu01 JobDefaults=(null)\n"
        ),
    }
    view = read_cluster(lambda argv: outputs[" ".join(argv)])
    load = view.nodes["gpu01"]
    assert (load.restricted_cpus_per_gpu, load.restricted_cpus_held) == (3, 2)
    plan = plan_for(view, view.partitions["gpu_spare"], ReserveSettings(("gpu_spare",)))
    assert plan.per_node == (("gpu01", 12 + 1 + 3),)
    assert plan.max_cpus_per_node == 1


# -- the state file -------------------------------------------------------------------------


def test_state_file_round_trip_and_first_value_wins(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "reserve.json"
    state = ReserveState.load(path)
    assert state.originals == {}
    assert state.remember("gpu_spare", "UNLIMITED", 100.0)
    assert not state.remember("gpu_spare", "16", 200.0)  # ours, not the admin's
    state.save()
    doc = json.loads(path.read_text())
    assert doc["format"] == STATE_FORMAT and doc["format_version"] == 1
    again = ReserveState.load(path)
    assert again.originals == {"gpu_spare": "UNLIMITED"}
    again.originals.clear()
    again.save()
    assert not path.exists()
    assert list((tmp_path / "sub").iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "is not JSON"),
        ("[" * 100_000, "is not JSON \\(nested too deeply\\)"),
        ('{"format": "other"}', "not a coda-slurm reserve state file"),
        (
            '{"format": "coda-reserve-state", "format_version": 2, "partitions": {}}',
            "newer coda-slurm",
        ),
        (
            '{"format": "coda-reserve-state", "format_version": 1, '
            '"partitions": {"p": {"original": "lots"}}}',
            "is not UNLIMITED or a number",
        ),
    ],
)
def test_state_file_problems_are_named(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "reserve.json"
    path.write_text(text)
    with pytest.raises(ReserveStateError, match=says) as info:
        ReserveState.load(path)
    assert str(path) in str(info.value)


def test_a_state_file_past_its_cap_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reserve_cluster, "MAX_STATE_BYTES", 1 << 10)
    path = tmp_path / "reserve.json"
    path.write_text(json.dumps({"format": "coda-reserve-state", "pad": "x" * 2000}))
    with pytest.raises(ReserveStateError, match="larger than") as info:
        ReserveState.load(path)
    assert str(path) in str(info.value)


# -- coda.conf keys and the command's own errors (no Slurm needed) ---------------------------


def test_reserve_keys_parse_and_are_off_by_default() -> None:
    default, _ = parse_config("")
    assert default.reserve_partitions == ()
    assert default.reserve_state_file == Path("/var/lib/coda/reserve.json")
    cfg, _ = parse_config(
        "ReservePartitions=gpu_spare,gpu_spare_small ReserveIntervalS=30 ReserveMinCpus=0 "
        "ReserveCpusPerGpu=2.5 ReserveStateFile=/srv/coda/reserve.json"
    )
    assert cfg.reserve_partitions == ("gpu_spare", "gpu_spare_small")
    assert (cfg.reserve_interval_s, cfg.reserve_min_cpus, cfg.reserve_cpus_per_gpu) == (
        30.0,
        0,
        2.5,
    )
    assert cfg.reserve_state_file == Path("/srv/coda/reserve.json")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("ReserveIntervalS=0", "ReserveIntervalS must be at least 0.1"),
        ("ReserveIntervalS=1e99", "ReserveIntervalS must be at most 86400"),
        ("ReserveMinCpus=-1", "ReserveMinCpus must be a whole number"),
        ("ReserveCpusPerGpu=0", "ReserveCpusPerGpu must be greater than 0"),
        ("ReserveStateFile=reserve.json", "ReserveStateFile must be an absolute path"),
        ('ReservePartitions="a,b c"', "contains blanks"),
    ],
)
def test_reserve_keys_reject_bad_values(line: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config(line)


def run_reserve(
    tmp_path: Path, conf_text: str, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    conf = tmp_path / "coda.conf"
    conf.write_text(conf_text)
    rc = main(["reserve", "--conf", str(conf), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_reserve_is_off_until_partitions_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run_reserve(tmp_path, "", "--once", capsys=capsys)
    assert rc == 1
    assert err.startswith("coda-slurm: reserve is off (ReservePartitions is empty in ")


def test_revert_without_saved_values_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "reserve.json"
    rc, out, _ = run_reserve(tmp_path, f"ReserveStateFile={state}\n", "--revert", capsys=capsys)
    assert rc == 0
    assert out == f"nothing to revert ({state} holds no saved value)\n"


def test_a_bad_state_file_stops_the_pass_before_slurm_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "reserve.json"
    state.write_text('{"format": "coda-reserve-state", "format_version": 9, "partitions": {}}')
    conf = f"ReservePartitions=gpu_spare\nReserveStateFile={state}\n"
    for args in (["--once"], ["--revert"]):
        rc, _, err = run_reserve(tmp_path, conf, *args, capsys=capsys)
        assert rc == 1
        assert err.startswith("coda-slurm: cannot use the state file (")
        assert "format_version 9 (written by a newer coda-slurm" in err
