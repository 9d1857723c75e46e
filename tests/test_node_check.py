"""coda-node check against fixture trees laid out like the kernel's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coda_node.check import probe_all
from coda_node.cli import main
from coda_node.paths import SystemRoot


def make_tree(root: Path, *, resctrl: bool, mb: bool, imc: int, cgroup: str) -> Path:
    mounts = []
    if cgroup == "v1":
        mounts += [
            "cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,relatime,cpuset 0 0",
            "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0",
        ]
    elif cgroup == "v2":
        mounts.append("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0")
        (root / "sys/fs/cgroup").mkdir(parents=True)
        (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    if resctrl:
        mounts.append("resctrl /sys/fs/resctrl resctrl rw,relatime 0 0")
        (root / "sys/fs/resctrl/info/L3_MON").mkdir(parents=True)
        if mb:
            (root / "sys/fs/resctrl/info/MB").mkdir(parents=True)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mounts").write_text("\n".join(mounts) + "\n")
    pmus = root / "sys/bus/event_source/devices"
    for name in ["software", "tracepoint", *[f"uncore_imc_{i}" for i in range(imc)]]:
        (pmus / name).mkdir(parents=True)
    (root / "dev").mkdir()
    return root


@pytest.mark.parametrize(
    "resctrl,mb,imc,cgroup,expect",
    [
        (
            True,
            True,
            4,
            "v1",
            {
                "cpuset control": True,
                "memory-bandwidth control": True,
                "memory-bandwidth monitoring": True,
                "uncore counters": True,
            },
        ),
        (
            True,
            False,
            0,
            "v2",
            {
                "cpuset control": True,
                "memory-bandwidth control": False,
                "memory-bandwidth monitoring": True,
                "uncore counters": False,
            },
        ),
        (
            False,
            False,
            0,
            "none",
            {"cpuset control": False, "CPU quota": False, "memory-bandwidth control": False},
        ),
    ],
)
def test_capabilities_follow_the_tree(
    tmp_path: Path, resctrl: bool, mb: bool, imc: int, cgroup: str, expect: dict[str, bool]
) -> None:
    root = make_tree(tmp_path, resctrl=resctrl, mb=mb, imc=imc, cgroup=cgroup)
    caps = {c.name: c for c in probe_all(SystemRoot(root))}
    for name, available in expect.items():
        assert caps[name].available is available, caps[name]
    if not resctrl:
        assert "resctrl not mounted" in caps["memory-bandwidth control"].detail
    assert caps["GPUs (NVML)"].available is False  # no GPU on this machine or in the tree


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path, resctrl=False, mb=False, imc=2, cgroup="v1")
    assert main(["check", "--root", str(root), "--json"]) == 0
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert data["uncore counters"]["detail"] == "2 memory-controller PMUs"
