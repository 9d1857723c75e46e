"""The books the placement mechanisms keep beside GPUs and cores (``SimParams``, all off by
default): what the hook adds to a job at submission (``pcie:1``, ``--prefer``, membw
units), the count-only GRES each node has left, the CPU jobs' cores against the spare
partitions' MaxCPUsPerNode, and the passes of ``coda-slurm reserve`` that set it."""

from __future__ import annotations

import math

import numpy as np

from slurm_plugin.decision import placement
from slurm_plugin.sim.mechanisms import PlacementModel, spare_cpus_by_shape
from slurm_plugin.sim.nodes import Need, Nodes
from slurm_plugin.sim.params import SimParams
from slurm_plugin.sim.traces import NodeSpec
from slurm_plugin.sim.workloads import JobModel, Workloads

__all__ = ["MechanismBooks"]


class MechanismBooks:
    def __init__(
        self,
        nodes: Nodes,
        specs: list[NodeSpec],
        wl: Workloads,
        model: JobModel,
        params: SimParams,
        counters: dict[str, int],
    ) -> None:
        p = self.p = params
        self.nodes = nodes
        self.wl = wl
        self.m = model
        self.counters = counters
        n_nodes = len(nodes)
        # Placement constraints beyond GPUs and cores: Nodes.find's slower path only then.
        self.constrained = p.reserve or p.pcie_spread or p.gpu_prefer or p.membw_spread
        self.reserve_on = p.reserve
        self.pcie_on = p.pcie_interference
        self.place: PlacementModel | None = None
        if p.pcie_interference or p.pcie_spread or p.gpu_speed or p.gpu_prefer:
            self.place = PlacementModel(
                wl,
                model,
                nodes.node_model,
                nodes.node_gpus.tolist(),
                pcie_threshold_bytes_per_s=p.pcie_threshold_bytes_per_s,
                prefer_margin=p.prefer_margin,
            )
        self.on = self.place is not None or p.reserve or p.membw_spread
        """Starts and ends book more than GPUs and cores (see :meth:`start`)."""
        # GPU type of each node, as an index into place.types (-1: no model).
        types = self.place.types if self.place is not None else []
        self.node_type = np.array(
            [types.index(m) if m in types else -1 for m in nodes.node_model], dtype=np.int64
        )
        self.type_mask = [self.node_type == t for t in range(len(types))]
        n = len(nodes.t)
        self.pcie_mark = np.zeros(n, dtype=bool)
        self.prefer = np.full(n, -1, dtype=np.int16)
        self.free_pcie = np.full(n_nodes, model.pcie_domains_per_node, dtype=np.int64)
        self.heavy_on = np.zeros(n_nodes, dtype=np.int64)
        self.pcie_slowed: set[int] = set()
        """Jobs that ran beside too many PCIe-heavy jobs at some time."""
        self.membw_node_units = int(model.node_mem_bw_bytes_per_s // p.membw_unit_bytes_per_s)
        self.free_membw = np.full(n_nodes, self.membw_node_units, dtype=np.int64)
        self.membw_held: dict[int, int] = {}
        """Running CPU jobs' units of the membw GRES on each of their nodes."""
        self.membw_known = np.zeros(n, dtype=bool)
        if p.membw_spread:
            draw = np.random.default_rng(0x6D6277).random(n)
            self.membw_known = (draw < p.membw_known_fraction) & (nodes.t.gpus == 0)
        self._init_reserve(specs)

    def _init_reserve(self, specs: list[NodeSpec]) -> None:
        p = self.p
        # reserve: one spare CPU partition per node shape (cores, GPUs, GPU model).
        shapes: dict[object, list[int]] = {}
        for i, nd in enumerate(specs):
            key = i if p.reserve_per_node else (nd.cores, nd.gpus, nd.gpu_model)
            shapes.setdefault(key, []).append(i)
        self.shape_nodes = [np.array(v, dtype=np.int64) for v in shapes.values()]
        self.node_shape = np.zeros(len(specs), dtype=np.int64)
        for si, idx in enumerate(self.shape_nodes):
            self.node_shape[idx] = si
        self.cpu_cap = self.nodes.node_cores.copy()
        """MaxCPUsPerNode of each node's spare CPU partition (reserve on)."""
        self.cpu_on = np.zeros(len(specs), dtype=np.int64)
        """Cores CPU jobs hold on each node."""
        self.pending_cpg: dict[int, float] = {}
        """Queued GPU jobs' cores per GPU (reserve's expected demand)."""
        self.reserve_dirty = True
        self.cpu_retry = False
        # The hook routes a CPU job to the spare partition only if it fits there when no
        # GPU job is pending; a bigger one keeps today's CPU partition (it would never start).
        self.route_max_cores = max(
            max(p.reserve_min_cpus, nd.cores - math.ceil(nd.gpus * p.reserve_cpus_per_gpu))
            for nd in specs
        )
        t = self.nodes.t
        self.last_submit_s = float(t.submit_s[-1]) if len(t) else 0.0

    # -- at submission -------------------------------------------------------------------
    def mark(self, j: int, gpn: int) -> None:
        """What the hook adds to GPU job ``j`` at submission: ``pcie:1`` and ``--prefer``.

        Every workload's usage record is taken as known (measured by an earlier run): an
        upper bound on what the hook can do for a workload's first run.
        """
        assert self.place is not None
        wid = int(self.wl.workload[j])
        if self.p.pcie_spread and self.m.pcie_domains_per_node > 0:
            self.pcie_mark[j] = self.place.marks_pcie(wid, gpn)
        if self.p.gpu_prefer and self.nodes.t.gpu_model[j] < 0 and self.place.types:
            self.prefer[j] = self.place.preferred_type(wid)

    def membw_units(self, j: int, cores: int) -> int:
        """Units of the membw GRES CPU job ``j`` asks for on each node (0: none)."""
        if not self.membw_known[j]:
            return 0
        return placement.membw_units(
            float(self.wl.cpu_bw_per_core[j]),
            cores,
            heavy_bytes_per_s_per_core=self.p.membw_heavy_bytes_per_s_per_core,
            unit_bytes_per_s=self.p.membw_unit_bytes_per_s,
            node_units=self.membw_node_units,
        )

    def route_check(self, c: int) -> None:
        """Count a CPU job of ``c`` cores the hook cannot route to the spare partition."""
        if self.reserve_on and c > self.route_max_cores:
            self.counters["reserve_unrouted"] = self.counters.get("reserve_unrouted", 0) + 1

    def pend(self, j: int, need: Need) -> None:
        """Queue GPU job ``j``'s cores per GPU for reserve's expected demand."""
        _gpu, gpn, _k, c = need
        if c < 0:  # even: a node's cores over its GPUs (the largest node shape's)
            c = self.nodes.max_cores // self.nodes.max_gpn * gpn
        self.pending_cpg[j] = c / gpn
        self.reserve_dirty = True

    # -- placement -------------------------------------------------------------------------
    def find(
        self, j: int, need: Need, only: set[int] | None, avoid: frozenset[int]
    ) -> list[int] | None:
        """:meth:`Nodes.find` with the placement mechanisms' constraints (see SimParams)."""
        gpu, _gpn, _k, c = need
        mask = None
        if gpu and self.pcie_mark[j]:
            mask = self.free_pcie >= 1
        if not gpu and self.p.reserve and c <= self.route_max_cores:
            mask = self.cpu_on + c <= self.cpu_cap
        units = self.membw_units(j, c) if not gpu else 0
        if units:
            fits = self.free_membw >= units
            mask = fits if mask is None else mask & fits
        pref = int(self.prefer[j]) if gpu else -1
        if pref >= 0:
            # Slurm's --prefer: the preferred type if it fits now, else any (soft).
            tm = self.type_mask[pref]
            got = self.nodes.find(j, need, only, avoid, tm if mask is None else mask & tm)
            if got is not None:
                return got
        return self.nodes.find(j, need, only, avoid, mask)

    def start(
        self, j: int, gpu: bool, gpn: int, c: int, nodes: list[int]
    ) -> tuple[float, bool, bool]:
        """Book job ``j``'s placement resources; (speed, holds pcie, PCIe-heavy)."""
        self.reserve_dirty = True
        if not gpu:
            self._start_cpu(j, c, nodes)
            return 1.0, False, False
        self.pending_cpg.pop(j, None)
        speed, unit, heavy = 1.0, False, False
        place = self.place
        if place is None:
            return speed, unit, heavy
        wid = int(self.wl.workload[j])
        if self.p.gpu_speed and place.types:
            types = self.node_type[nodes]
            known = types[types >= 0]
            if len(known):
                # Data-parallel steps wait for the slowest GPU.
                speed = float(place.speed[wid, known].min())
        if self.pcie_mark[j]:
            unit = True
            for i in nodes:
                self.free_pcie[i] -= 1
                if self.p.check and self.free_pcie[i] < 0:
                    raise RuntimeError(f"node {i}: pcie GRES over-allocated by job {j}")
        if self.p.pcie_interference and gpn >= 2 and place.pcie_heavy[wid]:
            heavy = True
            for i in nodes:
                self.heavy_on[i] += 1
        return speed, unit, heavy

    def _start_cpu(self, j: int, c: int, nodes: list[int]) -> None:
        for i in nodes:
            self.cpu_on[i] += c
            routed = self.p.reserve and c <= self.route_max_cores
            if self.p.check and routed and self.cpu_on[i] > self.cpu_cap[i]:
                raise RuntimeError(
                    f"node {i}: CPU jobs hold {self.cpu_on[i]} cores, over the spare "
                    f"partition's MaxCPUsPerNode={self.cpu_cap[i]}"
                )
        units = self.membw_units(j, c)
        if units:
            self.membw_held[j] = units
            for i in nodes:
                self.free_membw[i] -= units
                if self.p.check and self.free_membw[i] < 0:
                    raise RuntimeError(f"node {i}: membw GRES over-allocated by job {j}")

    def end(
        self,
        j: int,
        gpu: bool,
        cores: int,
        nodes: tuple[int, ...],
        pcie_unit: bool,
        pcie_heavy: bool,
    ) -> None:
        """Give back what :meth:`start` booked for job ``j``."""
        self.reserve_dirty = True
        membw = self.membw_held.pop(j, 0)
        for i in nodes:
            if not gpu:
                self.cpu_on[i] -= cores
                self.free_membw[i] += membw
            if pcie_unit:
                self.free_pcie[i] += 1
            if pcie_heavy:
                self.heavy_on[i] -= 1

    # -- coda-slurm reserve ----------------------------------------------------------------
    def reserve_pass(self) -> None:
        """One pass of ``coda-slurm reserve``: every spare partition's MaxCPUsPerNode from
        the product's :func:`spare_cpus_by_shape`; CPU jobs retry when a cap rose."""
        if not self.reserve_dirty:
            return
        self.reserve_dirty = False
        self.counters["reserve_updates"] = self.counters.get("reserve_updates", 0) + 1
        nd = self.nodes
        gpu_job_cores = nd.node_cores - nd.free_cores - self.cpu_on
        caps = spare_cpus_by_shape(
            self.shape_nodes,
            nd.node_cores,
            nd.node_gpus,
            nd.free_gpus,
            gpu_job_cores,
            list(self.pending_cpg.values()),
            self.p.reserve_cpus_per_gpu,
            self.p.reserve_min_cpus,
        )
        new = np.array(caps, dtype=np.int64)[self.node_shape]
        if np.any(new > self.cpu_cap):
            self.cpu_retry = True
        self.cpu_cap = new

    def counters_at_end(self) -> dict[str, int]:
        """What the run's result reports of the mechanisms that are on."""
        p = self.p
        out: dict[str, int] = {}
        if p.pcie_interference or p.pcie_spread:
            out["pcie_marked_jobs"] = int(self.pcie_mark.sum())
            out["pcie_slowed_jobs"] = len(self.pcie_slowed)
        if p.membw_spread:
            out["membw_marked_jobs"] = sum(
                1 for j in np.flatnonzero(self.membw_known) if self.membw_units(j, 1)
            )
        if p.gpu_prefer:
            out["prefer_jobs"] = int(np.count_nonzero(self.prefer >= 0))
        return out
