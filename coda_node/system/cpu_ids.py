"""Slurm's CPU ids and the kernel's: how to read the CPUs Slurm says it allocated a job as
the CPU numbers a cpuset holds. Read-only.

Slurm numbers a node's CPUs its own way (``CPU_IDs`` in ``scontrol -d show job``, and
:func:`coda_node.system.slurmjobs.allocated_cpus`): socket by socket, core by core, a core's
threads next to each other, ``(socket x cores per socket + core) x threads per core +
thread``. slurmd maps those ids to the machine's when it writes a job's cpuset, in hwloc's
logical order: packages, then the cores of each, then the threads of each core (Slurm's
``xcpuinfo_abs_to_mac``). The kernel often numbers hyper-threads apart (on a 2-socket,
16-core node, CPU 0's sibling is CPU 32), so Slurm's CPUs 0-1 are the kernel's 0 and 32
there. Where each core has one thread, and where the kernel numbers siblings next to each
other, the two agree.

The machine's layout comes from sysfs (Documentation/ABI/stable/sysfs-devices-system-cpu:
``topology/physical_package_id`` and ``topology/core_id`` of each online CPU).
"""

from __future__ import annotations

from coda_node.system.cpulist import parse_cpulist
from coda_node.system.paths import SystemRoot

__all__ = ["SlurmCpuIds"]


class SlurmCpuIds:
    """Slurm's CPU ids -> the kernel's, for the node under ``root``, read once."""

    def __init__(self, root: SystemRoot) -> None:
        self.kernel_by_slurm: dict[int, int] | None = _read(root)
        """Slurm's id -> the kernel's CPU; None where sysfs does not give the layout (the
        ids are then taken as they are)."""

    def to_kernel(self, slurm_ids: frozenset[int]) -> frozenset[int] | None:
        """The kernel's CPUs for ``slurm_ids``; None when one of them is not a CPU of this
        node as sysfs lays it out (Slurm's idea of the node is not this machine's)."""
        table = self.kernel_by_slurm
        if table is None:
            return slurm_ids
        if not slurm_ids <= table.keys():
            return None
        return frozenset(table[i] for i in slurm_ids)


def _read(root: SystemRoot) -> dict[int, int] | None:
    base = root.path("/sys/devices/system/cpu")
    try:
        online = parse_cpulist((base / "online").read_text())
        layout: dict[int, dict[int, list[int]]] = {}
        for cpu in sorted(online):
            topo = base / f"cpu{cpu}" / "topology"
            package = int((topo / "physical_package_id").read_text())
            core = int((topo / "core_id").read_text())
            layout.setdefault(package, {}).setdefault(core, []).append(cpu)
    except (OSError, ValueError):
        return None
    order = [
        cpu
        for package in sorted(layout)
        for core in sorted(layout[package])
        for cpu in sorted(layout[package][core])
    ]
    return {slurm_id: cpu for slurm_id, cpu in enumerate(order)}
