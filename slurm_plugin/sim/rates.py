"""Each running job's progress rate: a DNN job's throughput curve at the cores it holds,
slowed by memory-bandwidth pressure (and PCIe contention) on its slowest node and sped or
slowed by its GPUs; a CPU job's share of its cores the eliminator leaves it. Rates change
only when the jobs on a node change, so each such change re-solves that node
(:meth:`Rates.resolve`) and re-times its jobs' ends."""

from __future__ import annotations

from coda_common.model.curves import throughput_at
from coda_node.policy.contention import ContentionParams
from slurm_plugin.sim.accounting import Utilisation
from slurm_plugin.sim.booking import MechanismBooks
from slurm_plugin.sim.events import END, EventQueue
from slurm_plugin.sim.nodes import Nodes, Run
from slurm_plugin.sim.params import Policy, SimParams
from slurm_plugin.sim.shield import NodeMix, Shield, slowdowns
from slurm_plugin.sim.workloads import JobModel, Workloads

__all__ = ["Rates"]


def _bucket(gpn: int) -> int:
    return 0 if gpn <= 1 else (1 if gpn < 4 else 2)


class Rates:
    def __init__(
        self,
        nodes: Nodes,
        wl: Workloads,
        model: JobModel,
        policy: Policy,
        params: SimParams,
        contention: ContentionParams,
        books: MechanismBooks,
        use: Utilisation,
        events: EventQueue,
        counters: dict[str, int],
    ) -> None:
        self.nodes = nodes
        self.wl = wl
        self.m = model
        self.pol = policy
        self.rdt = params.rdt
        self.contention = contention
        self.books = books
        self.use = use
        self.events = events
        self.counters = counters
        self.dirty: set[int] = set()
        """Nodes whose jobs changed since the last re-solve."""
        self.node_slow: list[dict[int, float]] = [{} for _ in range(len(nodes))]
        """Per node: each DNN job's slowdown there, from the last re-solve."""
        self.priced = contention.gpu_worth_cores > 0
        self.shield = Shield(
            contention, tick_s=params.shield_tick_s, settle_s=params.shield_settle_s
        )

    def sensitivity(self, run: Run) -> float:
        k = self.wl.klass[self.wl.workload[run.job]]
        return float(self.wl.sensitivity[k, _bucket(run.gpn)])

    def base_rate(self, run: Run) -> float:
        """DNN job ``run``'s rate uncontended: its curve at its cores, at its GPUs' speed."""
        theta = self.wl.sweet_spot(run.job, run.gpn, len(run.nodes), self.m)
        return run.speed * throughput_at(theta, run.cores, log_share=self.m.log_share)

    def resolve(self, now: float) -> None:
        """Re-solve the nodes whose jobs changed and re-time the jobs on them."""
        if not self.dirty:
            return
        touched: set[int] = set()
        for i in self.dirty:
            touched |= self.nodes.on_node[i]
            self._solve(i)
        self.dirty.clear()
        for j in touched:
            self._retime(self.nodes.running[j], now)

    def _solve(self, i: int) -> None:
        """Node ``i``'s DNN jobs' slowdowns and CPU jobs' shares."""
        running = self.nodes.running
        jobs = self.nodes.on_node[i]
        dnn = [running[r] for r in jobs if running[r].gpu]
        cpu = [running[r] for r in jobs if not running[r].gpu]
        if not cpu:
            for r in dnn:
                r.has_baseline = True
        if not dnn or not cpu or not self.pol.contention:
            for r in cpu:
                r.share = 1.0
            self.node_slow[i] = {r.job: 0.0 for r in dnn}
        else:
            self._contended(i, dnn, cpu)
        if self.books.pcie_on and self.books.heavy_on[i] > self.m.pcie_domains_per_node:
            self._pcie_slow(i)

    def _contended(self, i: int, dnn: list[Run], cpu: list[Run]) -> None:
        """Node ``i`` runs DNN and CPU jobs together: the pressure's slowdowns, or what the
        eliminator makes of them."""
        mix = self._mix(dnn, cpu)
        raw = slowdowns(mix, [1.0] * len(cpu))
        # The eliminator acts only for a job slowed past its trigger that has a
        # baseline to compare with, or will get one from a baseline probe; otherwise
        # its outcome is known without ticking it.
        probes = self.contention.baseline_probe_after_s > 0
        acts = any(
            s > self.contention.trigger_slowdown and (has or probes)
            for s, (_, has) in zip(raw, mix.dnn, strict=True)
        )
        if self.pol.shield and acts:
            self.counters["shield_lookups"] += 1
            got = self.shield(mix)
            for r, q in zip(cpu, got.cpu_share, strict=True):
                r.share = q
            slow = got.dnn_slowdown
            for r, extra in zip(dnn, got.dnn_transient_s, strict=True):
                r.work_left += extra * self.base_rate(r)
        else:
            for r in cpu:
                r.share = 1.0
            slow = raw
        self.node_slow[i] = {r.job: s for r, s in zip(dnn, slow, strict=True)}

    def _mix(self, dnn: list[Run], cpu: list[Run]) -> NodeMix:
        """The node's jobs as the eliminator sees them; sorts ``dnn`` and ``cpu`` into its
        order."""
        # Canonical order, so equal mixes on different nodes share one settle.
        # Only the price test reads a job's GPUs: without it, mixes that differ in GPUs
        # alone share one settle.
        gpus = {r.job: r.gpn * len(r.nodes) if self.priced else 0 for r in dnn}
        dnn.sort(key=lambda r: (self.sensitivity(r), r.has_baseline, gpus[r.job], r.job))
        cpu.sort(key=lambda r: (r.cores, float(self.wl.cpu_bw_per_core[r.job]), r.job))
        return NodeMix(
            dnn=tuple((self.sensitivity(r), r.has_baseline) for r in dnn),
            cpu=tuple((r.cores, float(self.wl.cpu_bw_per_core[r.job])) for r in cpu),
            node_bw_bytes_per_s=self.m.node_mem_bw_bytes_per_s,
            exponent=self.m.pressure_exponent,
            rdt=self.rdt,
            dnn_gpus=tuple(gpus[r.job] for r in dnn) if self.priced else (),
        )

    def _pcie_slow(self, i: int) -> None:
        """More PCIe-heavy multi-GPU jobs than PCIe domains on node ``i``: each of them
        slows by ``pcie_slowdown`` on top of its memory-bandwidth slowdown (CODA §II.C)."""
        slow = self.node_slow[i]
        keep = 1.0 - self.m.pcie_slowdown
        for r in self.nodes.on_node[i]:
            if self.nodes.running[r].pcie_heavy:
                slow[r] = 1.0 - (1.0 - slow.get(r, 0.0)) * keep
                self.books.pcie_slowed.add(r)

    def _retime(self, run: Run, now: float) -> None:
        """``run``'s rate from its nodes' last solve; a new rate re-times its end."""
        j = run.job
        if run.gpu:
            slow = max(self.node_slow[i].get(j, 0.0) for i in run.nodes)
            rate = self.base_rate(run) * (1.0 - slow) * run.share_factor
        else:
            rate = run.share
        if rate != run.rate or run.version == 0:
            run.work_left -= run.rate * (now - run.last_s)
            run.last_s = now
            if run.gpu:
                w = run.gpn * len(run.nodes)
                self.use.now_eff += w * (rate - run.rate)
                if run.version == 0 and run.owner:
                    self.use.now_alloc += w
            run.rate = rate
            run.version += 1
            self.counters["rate_changes"] += 1
            end = now + max(0.0, run.work_left) / max(rate, 1e-9)
            self.events.push(end, END, j, run.version)
        else:
            run.work_left -= run.rate * (now - run.last_s)
            run.last_s = now
