"""Pairs of PCIe-heavy DNN jobs behind one PCIe switch, for coda-node to report. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PcieUse:
    """One DNN job's PCIe traffic and the PCIe switches its GPUs hang off."""

    job_id: int
    switches: frozenset[str]
    bytes_per_s: float


PCIE_HEAVY_BYTES_PER_S = 8e9
"""CODA measured AlexNet and ResNet-50 moving 8-12 GB/s over PCIe, and 5-10 % slowdown
when two such jobs share a PCIe switch; a job at or above this rate counts as heavy."""


def pcie_pairs(
    uses: Mapping[int, PcieUse], heavy_bytes_per_s: float = PCIE_HEAVY_BYTES_PER_S
) -> list[tuple[int, int, str]]:
    """Pairs of heavy DNN jobs behind one PCIe switch: ``(job, other job, switch)``, each
    pair once, for placement (coda-node reports them; it cannot move a running job)."""
    heavy = sorted(
        (u for u in uses.values() if u.bytes_per_s >= heavy_bytes_per_s), key=lambda u: u.job_id
    )
    out = []
    for i, a in enumerate(heavy):
        for b in heavy[i + 1 :]:
            shared = sorted(a.switches & b.switches)
            if shared:
                out.append((a.job_id, b.job_id, shared[0]))
    return out
