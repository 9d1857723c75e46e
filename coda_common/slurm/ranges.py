"""Integer range lists (``0-3,8,10-11``): the one parser for the syntax the kernel prints
for CPU lists and Slurm for CPU ids and GRES indices. Pure, stdlib only, so coda-node's CPU
lists (:mod:`coda_node.system.cpulist`) and the controller's Slurm readers share it.
"""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)

MAX_ID = 1 << 16
"""Above any CPU number Linux supports (NR_CPUS is at most 8192) and any GRES index: a list
naming a higher one is refused before its range is built (``0-4000000000`` would take all
memory)."""


def parse_ranges(text: str, what: str) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}. Every comma-separated part must be ``N`` or ``N-M``
    with ``M >= N`` (blanks around a part are allowed); otherwise ValueError names ``what``
    (``bad cpulist '0-a'``, ``bad cpulist '3-1': range 3-1 runs backwards``)."""
    out: set[int] = set()
    for part in text.split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"bad {what} {text!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"bad {what} {text!r}: range {part} runs backwards")
        if last > MAX_ID:
            raise ValueError(f"bad {what} {text[:60]!r}: {last} is above {MAX_ID}")
        out.update(range(first, last + 1))
    return frozenset(out)
