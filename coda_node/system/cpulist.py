"""Kernel CPU lists (``0-3,8,10-11``): the one parser and formatter every node module uses.

Pure: cgroup cpusets, Slurm's ``CPU_IDs`` and GRES ``IDX``, PMU cpumasks and the admin's
``--cpus`` all use this syntax.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from coda_common.slurm.ranges import parse_ranges


@functools.lru_cache(maxsize=512)
def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8,10-11"`` -> {0, 1, 2, 3, 8, 10, 11}; ``""`` -> empty. Order does not matter.

    Accepts what the kernel prints in ``cpuset.cpus`` (Documentation/admin-guide/cgroup-v1/
    cpusets.rst, "list format"); raises ValueError on anything else. Cached: a tick parses
    the same few lists (each job's and step's cpuset) hundreds of times, and the result is
    immutable.
    """
    text = text.strip()
    if not text:
        return frozenset()
    return parse_ranges(text, "cpulist")


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> ``"0-3,8"``: compact ranges, as the kernel prints them."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
