"""slurm.conf's ``RestrictedCoresPerGPU`` (Slurm 24.05 on), read on the controller side: the
cores per GPU a GPU job can be given, and the share, respect it.

Slurm's rules (slurm.conf(5); select/cons_tres): a job that asks for no GPU cannot use the
restricted cores; a job holding g of a node's G GPUs gets at most g x N of them, so at most
``CPUs - N x (G - g)`` CPUs there (N in CPUs: cores times the CPUs Slurm counts per core).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import NodeShape, read_slurm_conf
from slurm_plugin.config.nodecap import (
    NodeCap,
    max_cpus_per_gpu_on_any_node,
    node_share_cpus_per_gpu,
)


def _node(conf: Path, line: str) -> NodeShape:
    conf.write_text(line + "\n")
    nodes, _ = read_slurm_conf(conf)
    assert len(nodes) == 1
    return nodes[0]


@pytest.mark.parametrize(
    ("line", "cpus", "restricted"),
    [
        # one CPU per core
        ("NodeName=g CPUs=16 Gres=gpu:4 RestrictedCoresPerGPU=3", 16, 3),
        ("NodeName=g Sockets=2 CoresPerSocket=8 Gres=gpu:4 RestrictedCoresPerGPU=3", 16, 3),
        # two threads per core: a restricted core is 2 CPUs
        (
            "NodeName=g Sockets=2 CoresPerSocket=8 ThreadsPerCore=2 Gres=gpu:4 "
            "RestrictedCoresPerGPU=3",
            32,
            6,
        ),
        # CPUs= with threads and no Sockets: Slurm infers 2 sockets, 16 cores, 2 per core
        (
            "NodeName=g CPUs=32 CoresPerSocket=8 ThreadsPerCore=2 Gres=gpu:4 "
            "RestrictedCoresPerGPU=1",
            32,
            2,
        ),
        # CPUs= no more than the cores: Slurm schedules cores, one CPU each
        (
            "NodeName=g CPUs=16 Sockets=2 CoresPerSocket=8 ThreadsPerCore=2 Gres=gpu:4 "
            "RestrictedCoresPerGPU=3",
            16,
            3,
        ),
        # the key is case-insensitive, as every slurm.conf key
        ("NodeName=g CPUs=16 Gres=gpu:4 restrictedcorespergpu=2", 16, 2),
        # absent (and on Slurm 22.05, where it does not exist): nothing restricted
        ("NodeName=g CPUs=16 Gres=gpu:4", 16, 0),
    ],
)
def test_restricted_cores_are_read_as_cpus_per_gpu(
    tmp_path: Path, line: str, cpus: int, restricted: int
) -> None:
    node = _node(tmp_path / "slurm.conf", line)
    assert (node.cpus, node.restricted_cpus_per_gpu) == (cpus, restricted)


def test_restricted_cores_come_from_nodename_default(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "NodeName=DEFAULT RestrictedCoresPerGPU=2\n"
        "NodeName=a CPUs=16 Gres=gpu:4\n"
        "NodeName=b CPUs=16 Gres=gpu:4 RestrictedCoresPerGPU=0\n"
    )
    nodes, _ = read_slurm_conf(conf)
    assert [n.restricted_cpus_per_gpu for n in nodes] == [2, 0]


def test_a_bad_value_names_the_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=g CPUs=16 Gres=gpu:4 RestrictedCoresPerGPU=lots\n")
    with pytest.raises(ConfigError, match=r":1: .*bad restrictedcorespergpu value 'lots'"):
        read_slurm_conf(conf)


RESTRICTED = NodeShape("r", 16, 4, restricted_cpus_per_gpu=3)
"""16 CPUs, 4 GPUs, 3 cores restricted per GPU: 12 for GPU jobs only, 4 for anyone."""


@pytest.mark.parametrize(
    ("gpus", "cpus"),
    [(1, 16 - 3 * 3), (2, 16 - 3 * 2), (3, 16 - 3), (4, 16), (5, 16)],
)
def test_a_gpu_job_gets_all_but_the_other_gpus_restricted_cores(gpus: int, cpus: int) -> None:
    assert RESTRICTED.gpu_job_cpus(gpus) == cpus


def test_a_cpu_job_gets_none_of_the_restricted_cores() -> None:
    assert RESTRICTED.cpu_job_cpus == 4
    assert NodeShape("plain", 16, 4).cpu_job_cpus == 16


@pytest.mark.parametrize(
    ("nodes", "gpus_per_node", "cap"),
    [
        # the restricted node alone: 7, 5, 4, 4 CPUs per GPU (not 16, 8, 5, 4)
        ((RESTRICTED,), 1, 7),
        ((RESTRICTED,), 2, 5),
        ((RESTRICTED,), 3, 4),
        ((RESTRICTED,), 4, 4),
        # beside a node without restriction, that node gives more
        ((RESTRICTED, NodeShape("plain", 12, 4)), 1, 12),
        ((RESTRICTED, NodeShape("plain", 12, 4)), 3, 4),
        # a node restricting more cores than it has is DOWN in Slurm: it gives nothing
        ((NodeShape("down", 64, 8, restricted_cpus_per_gpu=9), RESTRICTED), 1, 7),
        ((NodeShape("down", 64, 8, restricted_cpus_per_gpu=9),), 1, None),
    ],
)
def test_the_node_cap_leaves_the_other_gpus_restricted_cores(
    nodes: tuple[NodeShape, ...], gpus_per_node: int, cap: int | None
) -> None:
    assert max_cpus_per_gpu_on_any_node(nodes, gpus_per_node) == cap
    assert NodeCap(nodes, "slurm.conf")(gpus_per_node) == cap


@pytest.mark.parametrize("gpus_per_node", [1, 2, 3, 4])
@pytest.mark.parametrize("restricted", [0, 1, 3, 4])
def test_the_share_includes_the_restricted_cores_and_fits_under_the_cap(
    gpus_per_node: int, restricted: int
) -> None:
    """``DefaultCpusPerGpu=share`` stays each GPU's even share (the restricted cores are
    part of it, never more than it), so a job given the share can always start."""
    node = NodeShape("r", 16, 4, restricted_cpus_per_gpu=restricted)
    share = node_share_cpus_per_gpu((node,), gpus_per_node)
    assert share == 4
    assert share >= restricted
    assert share * gpus_per_node <= node.gpu_job_cpus(gpus_per_node)
    cap = max_cpus_per_gpu_on_any_node((node,), gpus_per_node)
    assert cap is not None and share <= cap


def test_the_share_skips_a_node_that_cannot_restrict() -> None:
    down = NodeShape("down", 8, 4, restricted_cpus_per_gpu=3)
    assert node_share_cpus_per_gpu((down, RESTRICTED), 1) == 4
    assert node_share_cpus_per_gpu((down,), 1) is None


def test_slurm_conf_to_cap(tmp_path: Path) -> None:
    """What the hook reads at load: slurm.conf, the restricted node's line, the cap."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "NodeName=gpu01 Sockets=2 CoresPerSocket=8 ThreadsPerCore=1 Gres=gpu:a100:4 "
        "RestrictedCoresPerGPU=3\n"
        "PartitionName=gpu Nodes=gpu01 Default=YES\n"
    )
    cap = NodeCap.from_slurm_conf(conf, lambda level, msg: None)
    assert [cap(g) for g in (1, 2, 3, 4)] == [7, 5, 4, 4]
    assert [cap.share(g) for g in (1, 2, 3, 4)] == [4, 4, 4, 4]
