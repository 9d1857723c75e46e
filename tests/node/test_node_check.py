"""coda-node check against fixture trees laid out like the kernel's, one per hardware kind:
the node's rows with each enforcement mechanism's (coda_node.enforce.mechanisms.probe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coda_node.cli import main
from coda_node.enforce.mechanisms import probe
from coda_node.system.paths import SystemRoot
from tests.node import cgroup_fixtures, perf_fixtures, resctrl_fixtures


def make_node(tmp: Path, *, cgroup: str, resctrl: str, cpu: str) -> SystemRoot:
    """One tree: a Slurm cgroup layout, a resctrl variant and a PMU set."""
    builders = {
        "v1": cgroup_fixtures.build_v1_debian,
        "v2": cgroup_fixtures.build_v2,
        "none": lambda base: cgroup_fixtures.build_no_slurm(base, "none"),
    }
    builders[cgroup](tmp)
    mounts = (tmp / "proc/self/mounts").read_text().splitlines()
    resctrl_fixtures.build(tmp, resctrl)
    resctrl_line = [
        line for line in (tmp / "proc/self/mounts").read_text().splitlines() if "resctrl" in line
    ]
    (tmp / "proc/self/mounts").write_text("\n".join(mounts + resctrl_line) + "\n")
    if cpu == "skx":
        perf_fixtures.make_skx_tree(tmp)
    else:
        perf_fixtures.make_amd_tree(tmp)
    (tmp / "dev").mkdir(exist_ok=True)
    return SystemRoot(tmp)


@pytest.mark.parametrize(
    ("cgroup", "resctrl", "cpu", "expect"),
    [
        (
            "v1",
            "full",
            "skx",
            {
                "cpuset control": True,
                "Slurm job cgroups": True,
                "memory-bandwidth control": True,
                "cache allocation": True,
                "memory-bandwidth monitoring": True,
                "uncore memory bandwidth": True,
            },
        ),
        (
            "v2",
            "nomb",
            "skx",
            {
                "Slurm job cgroups": True,
                "memory-bandwidth control": False,
                "cache allocation": True,
                "memory-bandwidth monitoring": True,
            },
        ),
        (
            "v1",
            "unmounted",
            "amd",
            {
                "Slurm job cgroups": True,
                "memory-bandwidth control": False,
                "memory-bandwidth monitoring": False,
                "uncore memory bandwidth": False,
            },
        ),
        ("none", "cat_only", "amd", {"Slurm job cgroups": False, "cache allocation": True}),
    ],
)
def test_capabilities_follow_the_tree(
    tmp_path: Path, cgroup: str, resctrl: str, cpu: str, expect: dict[str, bool]
) -> None:
    caps = {
        c.name: c
        for c in probe(make_node(tmp_path, cgroup=cgroup, resctrl=resctrl, cpu=cpu), slurm=False)
    }
    for name, available in expect.items():
        assert caps[name].available is available, caps[name]
    assert caps["GPUs (NVML)"].available is False  # no GPU on this machine or in the tree
    assert "Slurm commands" not in caps


def test_missing_hardware_is_explained_in_plain_words(tmp_path: Path) -> None:
    root = make_node(tmp_path, cgroup="none", resctrl="unmounted", cpu="amd")
    caps = {c.name: c.detail for c in probe(root, slurm=False)}
    assert "resctrl not mounted" in caps["memory-bandwidth control"]
    assert "no uncore_imc" in caps["uncore memory bandwidth"]
    assert "ConstrainCores=yes" in caps["Slurm job cgroups"]
    assert "NVML" in caps["GPUs (NVML)"] and "driver" in caps["GPUs (NVML)"]


def test_resctrl_limits_are_reported(tmp_path: Path) -> None:
    root = make_node(tmp_path, cgroup="v1", resctrl="full", cpu="skx")
    caps = {c.name: c.detail for c in probe(root, slurm=False)}
    assert "steps of 10 from 10" in caps["memory-bandwidth control"]
    assert "224 RMIDs" in caps["memory-bandwidth monitoring"]
    assert "20 ways" in caps["cache allocation"]


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_node(tmp_path, cgroup="v1", resctrl="unmounted", cpu="skx")
    assert main(["check", "--root", str(root.root), "--json"]) == 0
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert data["uncore memory bandwidth"]["available"] is True
    assert data["memory-bandwidth control"]["available"] is False
    assert "Slurm commands" not in data  # a fixture tree: slurmctld is not asked


def test_cli_check_with_conf_shows_only_its_nodes_slurm_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three slurmd on one host (multiple-slurmd): each has its own /slurm_<NodeName> tree.
    root = make_node(tmp_path, cgroup="v1", resctrl="unmounted", cpu="skx")
    cpuset = root.path("/sys/fs/cgroup/cpuset")
    for node in ("gpu01", "gpu02", "gpu03"):
        (cpuset / f"slurm_{node}").mkdir()
    conf = tmp_path / "coda-gpu02.conf"
    conf.write_text(f"NodeName=gpu02\nNodeRoot={root.root}\n")

    assert main(["check", "--conf", str(conf), "--json"]) == 0
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    detail = data["Slurm job cgroups"]["detail"]
    assert "slurm_gpu02" in detail
    assert "slurm_gpu01" not in detail and "slurm_gpu03" not in detail
    assert "Slurm commands" not in data  # NodeRoot is a fixture tree: slurmctld is not asked

    # Without NodeName: every node's tree.
    assert main(["check", "--root", str(root.root), "--json"]) == 0
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    for node in ("gpu01", "gpu02", "gpu03"):
        assert f"slurm_{node}" in data["Slurm job cgroups"]["detail"]


def test_cli_table_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    for name in ("cpuset control", "GPUs (NVML)", "Slurm commands", "uncore memory bandwidth"):
        assert name in out
