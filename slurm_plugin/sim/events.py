"""The simulator's clock: a queue of future events in time order, ties broken by kind and
then by the order they were queued in."""

from __future__ import annotations

import heapq

__all__ = ["END", "PROBE_BEGIN", "PUBLISH", "RESERVE", "EventQueue"]

END = 0
"""A job's end (its ``version`` must still be the job's: a rate change re-times it)."""
PUBLISH = 2
"""A probed job's profile is published."""
RESERVE = 3
"""``coda-slurm reserve`` runs."""
PROBE_BEGIN = 4
"""A job's warm-up is over: it may take its node's probe slot."""


class EventQueue:
    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0

    def __bool__(self) -> bool:
        return bool(self.heap)

    def push(self, t: float, kind: int, j: int, version: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, j, version))

    def next_s(self) -> float:
        """When the next event is (the queue must not be empty)."""
        return self.heap[0][0]

    def pop(self) -> tuple[float, int, int, int, int]:
        """(time, kind, sequence, job, version) of the next event."""
        return heapq.heappop(self.heap)
