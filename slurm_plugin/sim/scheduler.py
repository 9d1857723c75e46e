"""Slurm's scheduling in the simulator: two partitions (GPU jobs, CPU jobs), each FIFO in
submit order with EASY backfill. The first job of a partition that does not fit reserves
the node(s) that free up for it soonest (:meth:`slurm_plugin.sim.nodes.Nodes.reserve`);
later jobs in the first ``bf_window`` of the queue start now if they fit and either avoid
the reserved nodes or end (by their own limit) before the reservation's start."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from slurm_plugin.sim.booking import MechanismBooks
from slurm_plugin.sim.nodes import Need, Nodes, Reservation
from slurm_plugin.sim.sharing import GpuSharing

__all__ = ["Backfill"]

Find = Callable[[int, Need, "set[int] | None", frozenset[int]], "list[int] | None"]
"""Nodes for a job now or None: ``(job, need, look only there, avoid)``."""


class Backfill:
    def __init__(
        self,
        nodes: Nodes,
        books: MechanismBooks,
        sharing: GpuSharing,
        limit_s: Callable[[int], float],
        bf_window: int,
        start: Callable[[int, Need, list[int], float], None],
    ) -> None:
        self.nodes = nodes
        self.books = books
        self.sharing = sharing
        self.limit_s = limit_s
        """Job ``j``'s time limit."""
        self.bf_window = bf_window
        self.start = start
        """Starts job ``j`` of ``need`` on ``nodes`` at ``now``."""
        self.q: dict[bool, deque[int]] = {True: deque(), False: deque()}
        self.tried: set[int] = set()
        """Queued jobs looked at since they last could have started."""
        self.resv: dict[bool, Reservation | None] = {True: None, False: None}
        self.needs: dict[int, Need] = {}
        """What each queued job needs (decided at submission)."""

    def submit(self, j: int, need: Need, gpu: bool) -> None:
        """Queue job ``j`` in the GPU (``gpu``) or the CPU partition."""
        self.needs[j] = need
        self.q[gpu].append(j)

    def schedule(self, now: float, freed: set[int]) -> None:
        """One scheduling pass at ``now``; ``freed``: nodes where jobs ended."""
        gpu_resv_before = self.resv[True]
        find = self.books.find if self.books.constrained else self.nodes.find
        sharing = self.sharing
        if sharing.on and sharing.new_nodes:
            # A job that may host started there: a waiting job may share its GPUs now.
            freed = freed | sharing.new_nodes
            sharing.new_nodes = set()
        for gpu in (True, False):
            if not self.q[gpu]:
                continue
            retry_all = not gpu and (self.resv[True] is not gpu_resv_before or self.books.cpu_retry)
            resv = self.resv[gpu]
            if resv is not None and freed & resv[1]:
                # Its nodes freed up: re-plan the reservation (it may move).
                self.resv[gpu] = self.nodes.reserve(resv[0], self.needs[resv[0]], now)
                retry_all = True
            self._partition(gpu, find, freed, retry_all, now)
        self.books.cpu_retry = False

    def _partition(
        self, gpu: bool, find: Find, freed: set[int], retry_all: bool, now: float
    ) -> None:
        """The pass over one partition's backfill window."""
        q = self.q[gpu]
        window = [q.popleft() for _ in range(min(self.bf_window, len(q)))]
        keep: list[int] = []
        for j in window:
            resv = self.resv[gpu]
            is_head = resv is not None and resv[0] == j
            new = retry_all or j not in self.tried
            if not (new or freed or is_head):
                keep.append(j)  # nothing changed that could let it start
                continue
            self.tried.add(j)
            need = self.needs[j]
            only = None if new or is_head else freed
            nodes = self._place(j, gpu, need, only, None if is_head else resv, find, now)
            if nodes is not None:
                self.start(j, need, nodes, now)
                self.tried.discard(j)
                del self.needs[j]
                if is_head:
                    self.resv[gpu] = None
                    retry_all = True  # the jobs behind it may use those nodes now
                continue
            keep.append(j)
            if self.resv[gpu] is None:
                self.resv[gpu] = self.nodes.reserve(j, need, now)
        q.extendleft(reversed(keep))

    def _place(
        self,
        j: int,
        gpu: bool,
        need: Need,
        only: set[int] | None,
        resv: Reservation | None,
        find: Find,
        now: float,
    ) -> list[int] | None:
        """Nodes job ``j`` of the GPU (``gpu``) or CPU partition may start on now under
        reservation ``resv`` (None: none, or its own), or None."""
        end_s = now + self.limit_s(j)
        avoid = frozenset() if gpu else self._gpu_head_cores(need[3], end_s)
        nodes = self._within(find, j, need, only, avoid, resv, end_s)
        if nodes is None and self.sharing.on and self.sharing.ok[j]:
            # Only a job that would otherwise wait shares, under the same
            # reservation rule as any other placement.
            nodes = self._within(self.sharing.find, j, need, only, avoid, resv, end_s)
        return nodes

    @staticmethod
    def _within(
        find: Find,
        j: int,
        need: Need,
        only: set[int] | None,
        avoid: frozenset[int],
        resv: Reservation | None,
        end_s: float,
    ) -> list[int] | None:
        """``find`` off the reserved nodes, or on them for a job that ends by their start."""
        if resv is None:
            return find(j, need, only, avoid)
        nodes = find(j, need, only, resv[1] | avoid)
        if nodes is None and end_s <= resv[2]:
            nodes = find(j, need, only, avoid)
        return nodes

    def _gpu_head_cores(self, cores: int, end_s: float) -> frozenset[int]:
        """Nodes reserved for the first waiting GPU job where a CPU job of ``cores`` ending
        (by its limit) at ``end_s`` would take cores that job needs: backfill plans across
        partitions that share nodes, so CPU jobs must not delay the GPU job either."""
        resv = self.resv[True]
        if resv is None or end_s <= resv[2]:
            return frozenset()
        head = self.needs.get(resv[0])
        if head is None:
            return frozenset()
        _gpu, gpn, _k, c = head
        nd = self.nodes
        out = []
        for i in resv[1]:
            want = c if c >= 0 else int(nd.node_cores[i] // nd.node_gpus[i]) * gpn
            if nd.free_cores[i] - cores < want:
                out.append(i)
        return frozenset(out)
