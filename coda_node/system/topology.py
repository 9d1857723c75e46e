"""Which CPUs sit nearest a GPU: its PCI device's ``local_cpulist`` in sysfs. Read-only.

A GPU hangs off one socket's PCIe root complex. Data a loader thread prepares on a CPU of
another socket crosses the inter-socket link (UPI/Infinity Fabric) on its way to the GPU,
and a pinned host buffer allocated there sits in the far socket's memory. So when coda-node
slims a job to fewer cores, it keeps the ones local to the job's GPUs.

The kernel exposes the locality of every PCI device as
``/sys/bus/pci/devices/<domain:bus:dev.fn>/local_cpulist`` (Documentation/ABI/stable/
sysfs-bus-pci: "local_cpulist ... CPUs that are local to the device", in list format), and
``numa_node`` beside it. On a single-socket machine, or a VM without NUMA, the list is every
CPU, and the preference changes nothing. Device locality does not change while the node
runs, so each device is read once.
"""

from __future__ import annotations

import re

from coda_node.system.cpulist import parse_cpulist
from coda_node.system.paths import SystemRoot

__all__ = ["GpuLocality", "pci_address"]

_NVML_BUS_ID = re.compile(r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def pci_address(bus_id: str | None) -> str | None:
    """NVML's bus id (``00000000:3B:00.0``: an 8-digit domain) as sysfs names the device
    (``0000:3b:00.0``: at least 4 digits, so a VMD domain stays ``10000:...``); None for
    None or anything that is not a PCI address."""
    if bus_id is None:
        return None
    m = _NVML_BUS_ID.fullmatch(bus_id.strip())
    if m is None:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


class GpuLocality:
    """The CPUs local to GPUs, by NVML bus id, read from sysfs under ``root`` once each."""

    def __init__(self, root: SystemRoot) -> None:
        self.root = root
        self._local: dict[str, frozenset[int] | None] = {}
        self._near: dict[tuple[str | None, ...], frozenset[int]] = {}

    def local_cpus(self, bus_id: str | None) -> frozenset[int] | None:
        """The CPUs local to the device, or None when sysfs does not say (no such device, no
        ``local_cpulist``, an unreadable or malformed one, or no bus id)."""
        addr = pci_address(bus_id)
        if addr is None:
            return None
        if addr not in self._local:
            cpus: frozenset[int] | None
            try:
                text = self.root.path(f"/sys/bus/pci/devices/{addr}/local_cpulist").read_text()
                cpus = parse_cpulist(text) or None
            except (OSError, ValueError):
                cpus = None
            self._local[addr] = cpus
        return self._local[addr]

    def near_cpus(self, bus_ids: tuple[str | None, ...]) -> frozenset[int]:
        """The CPUs local to any of the GPUs (empty when none is known). Kept per tuple:
        the daemon asks for each GPU job's set on every tick."""
        near = self._near.get(bus_ids)
        if near is None:
            cpus: set[int] = set()
            for bus_id in bus_ids:
                cpus |= self.local_cpus(bus_id) or frozenset()
            near = self._near[bus_ids] = frozenset(cpus)
        return near
