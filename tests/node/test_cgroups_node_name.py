"""A node's coda-node reads its own node's Slurm tree only, where one host runs several slurmd.

Slurm built with multiple-slurmd (Debian's is) names each slurmd's cgroup v1 tree
``slurm_<NodeName>`` (``CgroupPrepend=/slurm_%n``) and its v2 scope
``<NodeName>_slurmstepd.scope``; a slurmd built without it uses ``slurm`` and
``slurmstepd.scope``, which belong to whichever node this host is.
"""

from __future__ import annotations

from pathlib import Path

from coda_node.system.cgroups import discover_layout, list_jobs
from tests.node.cgroup_fixtures import (
    CGROUP,
    build_v1_debian,
    build_v1_multi_slurmd,
    build_v2,
    v1_cpuset,
)


def _second_node(base: Path, nodename: str, job_id: int) -> None:
    """Another slurmd's tree on the same host, with one job."""
    job = base / CGROUP / "cpuset" / f"slurm_{nodename}" / "uid_0" / f"job_{job_id}"
    for d in (job.parent.parent, job.parent, job):
        v1_cpuset(d, "0-1")
    v1_cpuset(job / "step_batch", "0", tasks=(800,))


def test_each_node_name_reads_only_its_own_v1_tree(tmp_path: Path) -> None:
    fx = build_v1_multi_slurmd(tmp_path, "gpu01")
    _second_node(tmp_path, "gpu02", 8)
    for node, tree, jobs in (("gpu01", "slurm_gpu01", {7}), ("gpu02", "slurm_gpu02", {8})):
        layout = discover_layout(fx.root, node)
        assert [fx.rel(d) for d in layout.slurm_dirs] == [f"/{CGROUP}/cpuset/{tree}"]
        assert set(list_jobs(layout)) == jobs
    # Without a node name every tree is read (what `coda-node check` shows of a host).
    assert set(list_jobs(discover_layout(fx.root))) == {7, 8}


def test_a_plain_slurm_tree_is_this_nodes_whatever_its_name(tmp_path: Path) -> None:
    fx = build_v1_debian(tmp_path)
    layout = discover_layout(fx.root, "gpu07")
    assert [fx.rel(d) for d in layout.slurm_dirs] == [f"/{CGROUP}/cpuset/slurm"]
    assert set(list_jobs(layout)) == {101, 202}


def test_only_other_nodes_trees_is_no_tree_and_says_why(tmp_path: Path) -> None:
    fx = build_v1_multi_slurmd(tmp_path, "gpu01")
    layout = discover_layout(fx.root, "gpu03")
    assert not layout.has_slurm
    assert list_jobs(layout) == {}
    assert layout.reason is not None
    assert "no slurm/ or slurm_gpu03/ directory" in layout.reason
    assert "slurm_gpu01 belong to other nodes' slurmd" in layout.reason
    assert "NodeName=" in layout.reason


def test_v2_scope_of_this_node_only(tmp_path: Path) -> None:
    fx = build_v2(tmp_path)
    assert discover_layout(fx.root, "gpu01").has_slurm
    other = discover_layout(fx.root, "gpu02")
    assert not other.has_slurm
    assert other.reason is not None
    assert "gpu01_slurmstepd.scope belong to other nodes' slurmd" in other.reason
