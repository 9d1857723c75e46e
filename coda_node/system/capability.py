"""What a probe of this node found: one capability, present or not, and why.

Missing hardware is a state, not a crash: the probes in :mod:`coda_node.system.check` and the
perf reader (:func:`coda_node.system.perf.capabilities`) each return these rows for
``coda-node check`` and the status view.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    available: bool
    detail: str
    problem: bool = False
    """Something is wrong, not merely missing (jobs run here that coda-node cannot see):
    ``coda-node check`` exits non-zero."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
