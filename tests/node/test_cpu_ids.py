"""Slurm's CPU ids read as the kernel's CPU numbers (coda_node/system/cpu_ids.py), on sysfs trees
laid out as the kernel lays them out on each kind of node."""

from __future__ import annotations

from pathlib import Path

import pytest

from coda_node.system.cpu_ids import SlurmCpuIds
from coda_node.system.paths import SystemRoot


def _sysfs(root: Path, cpus: dict[int, tuple[int, int]]) -> SystemRoot:
    """CPU number -> (physical_package_id, core_id), every CPU online."""
    base = root / "sys/devices/system/cpu"
    base.mkdir(parents=True)
    (base / "online").write_text(f"0-{max(cpus)}\n")
    for cpu, (package, core) in cpus.items():
        topo = base / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return SystemRoot(root)


# 2 sockets x 2 cores x 2 threads. Linux's usual numbering puts every core's first thread
# first (0-3), then the siblings (4-7); some BIOSes number siblings next to each other.
SIBLINGS_APART = {cpu: (cpu // 2 % 2, cpu % 2) for cpu in range(8)}
SIBLINGS_NEXT = {cpu: (cpu // 4, cpu // 2 % 2) for cpu in range(8)}
# Core ids with gaps (as on many Xeons: 0, 1, 2, 8, 9, ...), one thread per core.
CORE_ID_GAPS = {0: (0, 0), 1: (0, 4), 2: (0, 8), 3: (0, 9)}


@pytest.mark.parametrize(
    "layout,slurm,kernel",
    [
        (SIBLINGS_APART, {0, 1}, {0, 4}),  # Slurm's first core: both its threads
        (SIBLINGS_APART, {2, 3}, {1, 5}),
        (SIBLINGS_APART, {4, 5, 6, 7}, {2, 6, 3, 7}),  # the second socket
        (SIBLINGS_NEXT, {0, 1, 6}, {0, 1, 6}),
        (CORE_ID_GAPS, {1, 3}, {1, 3}),
    ],
    ids=["apart-core0", "apart-core1", "apart-socket1", "next", "core-id-gaps"],
)
def test_slurms_ids_read_as_the_kernels(
    tmp_path: Path, layout: dict[int, tuple[int, int]], slurm: set[int], kernel: set[int]
) -> None:
    ids = SlurmCpuIds(_sysfs(tmp_path, layout))
    assert ids.to_kernel(frozenset(slurm)) == frozenset(kernel)


def test_an_id_this_machine_does_not_have_is_no_answer(tmp_path: Path) -> None:
    ids = SlurmCpuIds(_sysfs(tmp_path, SIBLINGS_APART))
    assert ids.to_kernel(frozenset({7, 8})) is None


def test_without_the_layout_the_ids_are_taken_as_they_are(tmp_path: Path) -> None:
    ids = SlurmCpuIds(SystemRoot(tmp_path))
    assert ids.kernel_by_slurm is None
    assert ids.to_kernel(frozenset({0, 63})) == frozenset({0, 63})


def test_this_host(tmp_path: Path) -> None:
    """Whatever the host is, every id maps to an online CPU, each to a different one."""
    ids = SlurmCpuIds(SystemRoot(Path("/")))
    if ids.kernel_by_slurm is None:
        pytest.skip("no CPU topology in this host's sysfs")
    table = ids.kernel_by_slurm
    assert sorted(table) == list(range(len(table))) and len(set(table.values())) == len(table)
