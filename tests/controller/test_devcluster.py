"""What the dev cluster reads from the Slurm installed here (its plugin directory and version)
and the node it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_plugin.devtools.cluster import (
    DevCluster,
    DevClusterError,
    NodeSpec,
    gres_conf,
    parse_slurm_version,
    plugin_dir_candidates,
    system_plugin_dir,
)


def slurm_dirs(tmp_path: Path, *names: str) -> list[Path]:
    dirs = [tmp_path / name for name in names]
    for d in dirs:
        d.mkdir()
    return dirs


def test_the_plugin_dir_is_the_first_that_holds_slurms_own_plugins(tmp_path: Path) -> None:
    empty, wlm, other = slurm_dirs(tmp_path, "empty", "slurm-wlm", "other")
    (empty / "job_submit_coda.so").touch()  # ours, not Slurm's
    (wlm / "select_cons_tres.so").touch()
    (other / "select_cons_tres.so").touch()
    assert system_plugin_dir([empty, tmp_path / "missing", wlm, other]) == wlm


def test_no_plugin_dir_names_every_place_looked(tmp_path: Path) -> None:
    dirs = slurm_dirs(tmp_path, "a", "b")
    with pytest.raises(DevClusterError) as err:
        system_plugin_dir(dirs)
    message = str(err.value)
    assert "no Slurm plugin directory found" in message
    assert f"{dirs[0]}, {dirs[1]}" in message


def test_candidates_follow_the_architecture() -> None:
    assert plugin_dir_candidates("aarch64-linux-gnu")[:2] == [
        Path("/usr/lib/aarch64-linux-gnu/slurm-wlm"),
        Path("/usr/lib/aarch64-linux-gnu/slurm"),
    ]
    assert Path("/usr/lib64/slurm") in plugin_dir_candidates(None)
    assert not [p for p in plugin_dir_candidates(None) if "None" in str(p)]


@pytest.mark.parametrize(
    "text,version",
    [
        ("slurm-wlm 22.05.8\n", (22, 5)),
        ("slurm-wlm 24.11.5\n", (24, 11)),
        ("slurm 26.05.5", (26, 5)),
        ("slurm 23.02.0-0rc1", (23, 2)),
    ],
)
def test_slurm_version_is_read_from_slurmctld_v(text: str, version: tuple[int, int]) -> None:
    assert parse_slurm_version(text) == version


@pytest.mark.parametrize("text", ["", "slurmctld: error: something\n", "slurm-wlm x.y"])
def test_an_unreadable_version_says_what_it_read(text: str) -> None:
    with pytest.raises(DevClusterError, match="cannot read a Slurm version"):
        parse_slurm_version(text)


def test_a_node_with_two_threads_per_core_declares_cores_not_cpus(tmp_path: Path) -> None:
    node = NodeSpec(cpus=32, sockets=2, gpus=4, threads_per_core=2)
    c = DevCluster(tmp_path, node=node)
    (tmp_path / "etc").mkdir()
    c._write_configs(ctld_port=7001, slurmd_port=7002, metrics_ports={})
    line = next(x for x in c.slurm_conf.read_text().splitlines() if x.startswith("NodeName=gpu01"))
    assert "Sockets=2 CoresPerSocket=8 ThreadsPerCore=2 " in line
    # gres.conf's Cores= are core numbers: each socket's GPUs beside its 8 cores.
    assert [x.split("Cores=")[1] for x in gres_conf(node, tmp_path).splitlines()] == ["0-7", "8-15"]
