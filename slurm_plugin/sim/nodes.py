"""The simulated nodes' books and Slurm's placement on them: what each node has and has free,
which jobs run where, best-fit placement of a job, and the backfill reservation of a job
that must wait (when, by the running jobs' time limits, the nodes it needs free up).

A job's need is :data:`Need`: ``(GPU job, GPUs per node, nodes, cores per node)``, the
cores ``-1`` when they depend on the node (the ``even`` policy: its cores over its GPUs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slurm_plugin.sim.traces import NodeSpec, Trace

__all__ = ["Need", "Nodes", "Reservation", "Run"]

Need = tuple[bool, int, int, int]
"""(GPU job, GPUs per node, nodes, cores per node or -1 when node-dependent)."""

Reservation = tuple[int, frozenset[int], float]
"""(the waiting job, the nodes kept for it, when they are all free: its shadow time)."""


@dataclass(slots=True)
class Run:
    """A running job."""

    job: int
    gpu: bool
    nodes: tuple[int, ...]
    cores: int
    """Per node."""
    gpn: int
    """GPUs per node."""
    work_left: float
    rate: float
    last_s: float
    limit_end_s: float
    version: int = 0
    share: float = 1.0
    """CPU jobs: share of their cores the eliminator lets them use."""
    slowdown: float = 0.0
    has_baseline: bool = False
    """DNN jobs: ran uncontended on its node for a while (the eliminator has a baseline)."""
    probing: bool = False
    probe_from_s: float = 0.0
    """When the job started (and its probing run began)."""
    speed: float = 1.0
    """DNN jobs: progress rate of its slowest GPU's generation (1 = trace speed)."""
    pcie_unit: bool = False
    """Holds one unit of the ``pcie`` GRES on each of its nodes."""
    pcie_heavy: bool = False
    """Truly PCIe-heavy with >= 2 GPUs per node: slows beside another such job."""
    partner: int = -1
    """The job it shares its GPUs with (``gpu_share``), or -1."""
    owner: bool = True
    """Holds its GPUs in the books (false for the second job on shared GPUs until the
    first ends): a shared GPU counts once in free GPUs and allocated utilisation."""
    share_factor: float = 1.0
    """Progress rate while shared over the rate alone (``T / T'``)."""
    pair_since_s: float = 0.0


class Nodes:
    """Every node's cores and GPUs, what is free of them, and the jobs running there."""

    def __init__(self, trace: Trace, nodes: list[NodeSpec]) -> None:
        if not nodes:
            raise ValueError("the cluster has no nodes")
        self.t = trace
        self.node_cores = np.array([nd.cores for nd in nodes], dtype=np.int64)
        self.node_gpus = np.array([nd.gpus for nd in nodes], dtype=np.int64)
        self.free_cores = self.node_cores.copy()
        self.free_gpus = self.node_gpus.copy()
        self.node_model = [nd.gpu_model for nd in nodes]
        self.max_gpn = int(self.node_gpus.max())
        self.max_cores = int(self.node_cores.max())
        self.on_node: list[set[int]] = [set() for _ in nodes]
        self.running: dict[int, Run] = {}
        self.sharing = False
        """Two jobs may share GPUs (``gpu_share``): a shared GPU is free when both end."""
        self.feasible_memo: dict[tuple[int, int, int, int], bool] = {}
        # GPU-type constraints (Alibaba's gpu_spec "A|B"): the nodes each spec allows.
        self.allowed: list[np.ndarray | None] = []
        for spec in trace.gpu_model_names:
            ok = set(spec.split("|"))
            mask = np.array([m in ok for m in self.node_model], dtype=bool)
            self.allowed.append(mask if mask.any() else None)

    def __len__(self) -> int:
        return len(self.node_cores)

    def even_cores(self, i: int, gpn: int) -> int:
        """Node ``i``'s cores over its GPUs, for ``gpn`` of them (the ``even`` policy)."""
        return max(1, int(self.node_cores[i] // self.node_gpus[i]) * gpn)

    def allowed_for(self, j: int) -> np.ndarray | None:
        """The nodes job ``j``'s GPU-type constraint allows (None: any)."""
        spec = int(self.t.gpu_model[j])
        return self.allowed[spec] if spec >= 0 else None

    def feasible(self, j: int, need: Need) -> bool:
        """Whether some set of nodes could ever hold the job (Slurm rejects it otherwise)."""
        key = (need[1], need[2], need[3], int(self.t.gpu_model[j]))
        ok = self.feasible_memo.get(key)
        if ok is None:
            _gpu, gpn, k, c = need
            spec = key[3]
            mask = self.node_gpus >= gpn
            if c >= 0:
                mask &= self.node_cores >= c
            if spec >= 0:
                allowed = self.allowed[spec]
                mask &= allowed if allowed is not None else False
            ok = self.feasible_memo[key] = int(mask.sum()) >= k
        return ok

    def most_cores(self, j: int, gpn: int, k: int) -> int:
        """The most cores per node job ``j`` (``gpn`` GPUs on each of ``k`` nodes) can be
        given and still fit: the ``k``-th largest core count of the nodes with ``gpn`` GPUs
        its GPU type allows; 0 when fewer than ``k`` such nodes exist."""
        mask = self.node_gpus >= gpn
        spec = int(self.t.gpu_model[j])
        if spec >= 0:
            allowed = self.allowed[spec]
            mask &= allowed if allowed is not None else False
        cores = np.sort(self.node_cores[mask])
        return int(cores[-k]) if len(cores) >= k else 0

    def fits_node(self, i: int, gpn: int, c: int, allowed: np.ndarray | None) -> bool:
        if self.free_gpus[i] < gpn:
            return False
        if allowed is not None and not allowed[i]:
            return False
        if c < 0:
            c = self.even_cores(i, gpn)
        return self.free_cores[i] >= c

    def find(
        self,
        j: int,
        need: Need,
        only: set[int] | None,
        avoid: frozenset[int],
        mask: np.ndarray | None = None,
    ) -> list[int] | None:
        """Nodes for job ``j`` now, or None. ``only``: look only there (single-node jobs);
        ``mask``: only nodes where it is True (the placement mechanisms)."""
        _gpu, gpn, k, c = need
        allowed = self.allowed_for(j)
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        if only is not None and k == 1:
            best = None
            for i in only:
                if i in avoid or not self.fits_node(i, gpn, c, allowed):
                    continue
                key = (int(self.free_gpus[i]), int(self.free_cores[i]), i)
                if best is None or key < best:
                    best = key
            return None if best is None else [best[2]]
        if c < 0:
            per_node = np.maximum(1, self.node_cores // np.maximum(self.node_gpus, 1)) * gpn
        else:
            per_node = c
        mask = (self.free_gpus >= gpn) & (self.free_cores >= per_node)
        if allowed is not None:
            mask &= allowed
        idx = np.flatnonzero(mask)
        if avoid:
            idx = np.array([i for i in idx if i not in avoid], dtype=np.int64)
        if len(idx) < k:
            return None
        order = np.lexsort((idx, self.free_cores[idx], self.free_gpus[idx]))
        return [int(i) for i in idx[order[:k]]]

    def availability(self, i: int, gpn: int, c: int, now: float) -> float:
        """When node ``i`` has ``gpn`` GPUs and ``c`` cores free, by running jobs' limits."""
        fg, fc = int(self.free_gpus[i]), int(self.free_cores[i])
        if c < 0:
            c = self.even_cores(i, gpn)
        if fg >= gpn and fc >= c:
            return now
        ends = sorted((self.running[r].limit_end_s, r) for r in self.on_node[i])
        if self.sharing:
            return self._availability_shared(ends, fg, fc, gpn, c, now)
        for end, r in ends:
            run = self.running[r]
            fg += run.gpn
            fc += run.cores
            if fg >= gpn and fc >= c:
                return max(now, end)
        return math.inf

    def _availability_shared(
        self, ends: list[tuple[float, int]], fg: int, fc: int, gpn: int, c: int, now: float
    ) -> float:
        """:meth:`availability` where two jobs may share GPUs: those free when both end."""
        ended: set[int] = set()
        for end, r in ends:
            run = self.running[r]
            ended.add(r)
            if run.partner < 0 or run.partner in ended:
                fg += run.gpn
            fc += run.cores
            if fg >= gpn and fc >= c:
                return max(now, end)
        return math.inf

    def reserve(self, j: int, need: Need, now: float) -> Reservation:
        """The backfill reservation of waiting job ``j``: the nodes that free up for it
        soonest and when the last of them does."""
        _gpu, gpn, k, c = need
        allowed = self.allowed_for(j)
        cand = np.flatnonzero(self.node_gpus >= gpn)
        if allowed is not None:
            cand = cand[allowed[cand]]
        if c >= 0:
            cand = cand[self.node_cores[cand] >= c]
        # Nodes likeliest to free first: most free GPUs, then most free cores.
        if len(cand) > 64:
            order = np.lexsort((-self.free_cores[cand], -self.free_gpus[cand]))
            cand = cand[order[: max(64, 4 * k)]]
        avail = sorted((self.availability(int(i), gpn, c, now), int(i)) for i in cand)
        chosen = avail[:k]
        shadow = chosen[-1][0] if len(chosen) == k else math.inf
        return j, frozenset(i for _, i in chosen), shadow
