"""GPU sharing through ``shard`` GRES in the simulator (``SimParams.gpu_share``): which jobs
the hook lets share, where a waiting single-node job finds GPUs to share, and the books of
a pair: one job holds the GPUs, both progress at the rates of a time-sliced GPU
(:class:`slurm_plugin.sim.mechanisms.ShareModel`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from coda_common.model.curves import throughput_at
from slurm_plugin.sim.accounting import Utilisation
from slurm_plugin.sim.mechanisms import ShareModel
from slurm_plugin.sim.nodes import Need, Nodes, Run
from slurm_plugin.sim.params import SimParams
from slurm_plugin.sim.workloads import JobModel, Workloads

__all__ = ["GpuSharing"]


class GpuSharing:
    def __init__(
        self,
        nodes: Nodes,
        wl: Workloads,
        model: JobModel,
        params: SimParams,
        use: Utilisation,
        dirty: set[int],
    ) -> None:
        p = params
        if p.gpu_share not in ("", "advised", "any"):
            raise ValueError(f"gpu_share must be '', 'advised' or 'any', got {p.gpu_share!r}")
        self.nodes = nodes
        self.wl = wl
        self.m = model
        self.check = p.check
        self.use = use
        self.dirty = dirty
        """Nodes whose jobs' rates must be re-solved (shared with the rates' solver)."""
        self.on = bool(p.gpu_share)
        self.model: ShareModel | None = None
        if self.on:
            stages = {(name, gpus): (d, g, c) for name, gpus, d, g, c in p.share_stage_ms}
            self.model = ShareModel(
                wl, model, stages, margin=p.share_margin, advised=p.gpu_share == "advised"
            )
        self.ok = np.zeros(len(nodes.t), dtype=bool)
        """Single-node GPU jobs allowed ``shard`` GRES (the hook's advice, or all)."""
        self.hosts: dict[int, set[int]] = {}
        """GPUs per node -> running jobs that may take a second job on their GPUs."""
        self.host = -1
        """The job whose GPUs the last successful :meth:`find` chose."""
        self.new_nodes: set[int] = set()
        """Nodes where a job that may host started since the last scheduling pass."""
        self.shared_jobs: set[int] = set()
        self.gpu_s = 0.0
        self.job_s = 0.0
        self.slow_job_s = 0.0

    def mark(self, j: int, gpn: int, cores: int) -> None:
        """Whether the hook lets single-node GPU job ``j`` use ``shard`` GRES: with advice,
        whether its workload's usage at these cores (what coda-node would have recorded:
        an upper bound, as for the other mechanisms) gains beside itself."""
        assert self.model is not None
        theta = self.wl.sweet_spot(j, gpn, 1, self.m)
        thr = throughput_at(theta, cores, log_share=self.m.log_share)
        self.ok[j] = self.model.may_share(int(self.wl.workload[j]), gpn, thr)

    def find(
        self, j: int, need: Need, only: set[int] | None, avoid: frozenset[int]
    ) -> list[int] | None:
        """The node of a running job whose GPUs single-node job ``j`` may share now, or None:
        a job of as many GPUs on one node, sharing with no one, that may use ``shard`` too;
        ``j`` still needs its own cores there. Best fit as :meth:`Nodes.find`; the chosen
        job is left in :attr:`host` for :meth:`take_host`."""
        _gpu, gpn, k, c = need
        hosts = self.hosts.get(gpn)
        if k != 1 or not hosts:
            return None
        nd = self.nodes
        allowed = nd.allowed_for(j)
        best: tuple[int, int, int, int] | None = None
        cands: Iterable[int] = hosts
        if only is not None and len(only) < len(hosts):
            # Only a few nodes changed: look at their jobs rather than at every host.
            cands = sorted(r for i in only for r in nd.on_node[i] if r in hosts)
        for h in cands:
            i = nd.running[h].nodes[0]
            if (only is not None and i not in only) or i in avoid:
                continue
            if allowed is not None and not allowed[i]:
                continue
            want = c if c >= 0 else nd.even_cores(i, gpn)
            if nd.free_cores[i] < want:
                continue
            key = (int(nd.free_gpus[i]), int(nd.free_cores[i]), i, h)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        self.host = best[3]
        return [best[2]]

    def take_host(self) -> int:
        """The host :meth:`find` chose for the job starting now (-1: none), once."""
        host, self.host = self.host, -1
        return host

    def _alone(self, run: Run) -> tuple[float, float]:
        """(GPU busy share, iteration time) of ``run`` alone at its cores."""
        assert self.model is not None
        theta = self.wl.sweet_spot(run.job, run.gpn, 1, self.m)
        thr = throughput_at(theta, run.cores, log_share=self.m.log_share)
        return self.model.alone(int(self.wl.workload[run.job]), run.gpn, thr)

    def start(self, run: Run, host: int, now: float) -> None:
        """Book single-node GPU job ``run``: paired with ``host`` (>= 0) on its GPUs, or, if
        it may share, offered as a host to later jobs."""
        assert self.model is not None
        j = run.job
        if host < 0:
            if self.ok[j]:
                self.hosts.setdefault(run.gpn, set()).add(j)
                self.new_nodes.add(run.nodes[0])
            if self.check:
                self.check_gpus(run.nodes[0])
            return
        h = self.nodes.running[host]
        if self.check and (
            h.partner >= 0 or h.gpn != run.gpn or h.nodes != run.nodes or not h.owner
        ):
            raise RuntimeError(
                f"job {j} shares the GPUs of job {host}, which is not a lone job of "
                f"{run.gpn} GPUs on node {run.nodes[0]}"
            )
        self.hosts[run.gpn].discard(host)
        h.partner, run.partner = j, host
        run.owner = False
        fh, fj = self.model.rate_factors(self._alone(h), self._alone(run))
        h.share_factor, run.share_factor = fh, fj
        h.pair_since_s = run.pair_since_s = now
        self.shared_jobs.update((host, j))
        self.dirty.add(run.nodes[0])  # the host's rate changes too
        if self.check:
            self.check_gpus(run.nodes[0])

    def end(self, run: Run, now: float) -> int:
        """Unbook ending single-node GPU job ``run`` from sharing; the GPUs it gives back
        (none while a partner still runs on them)."""
        self.hosts.get(run.gpn, set()).discard(run.job)
        if run.partner < 0:
            return run.gpn
        p = self.nodes.running[run.partner]
        dt = now - run.pair_since_s
        self.gpu_s += run.gpn * dt
        self.job_s += 2 * dt
        self.slow_job_s += (1.0 / run.share_factor + 1.0 / p.share_factor) * dt
        p.partner, p.share_factor = -1, 1.0  # back to its rate alone (node re-solved)
        if not p.owner:
            p.owner = True
            if p.version > 0:
                self.use.now_alloc += p.gpn
        if self.ok[p.job]:
            self.hosts.setdefault(p.gpn, set()).add(p.job)
        return 0

    def check_gpus(self, i: int) -> None:
        """At most two jobs per GPU on node ``i``: each second job on the GPUs of a lone
        job of as many GPUs there, and the GPUs booked once."""
        nd = self.nodes
        held = 0
        for r in nd.on_node[i]:
            run = nd.running.get(r)
            if run is None or not run.gpu:
                continue
            if run.owner:
                held += run.gpn
                continue
            p = nd.running.get(run.partner)
            if p is None or p.partner != r or not p.owner or p.gpn != run.gpn:
                raise RuntimeError(f"node {i}: job {r} shares GPUs with no lone owner")
        if held + int(nd.free_gpus[i]) != int(nd.node_gpus[i]):
            raise RuntimeError(
                f"node {i}: jobs hold {held} GPUs and {nd.free_gpus[i]} are free, "
                f"of {nd.node_gpus[i]}"
            )

    def counters(self) -> dict[str, int]:
        """What the run's result reports of sharing."""
        # Mean over the time jobs spent shared of T'/T (iteration time shared over alone).
        mean = self.slow_job_s / self.job_s if self.job_s else 0.0
        return {
            "share_eligible_jobs": int(self.ok.sum()),
            "share_jobs": len(self.shared_jobs),
            "share_gpu_s": round(self.gpu_s),
            "share_slowdown_x1000": round(1000 * mean),
        }
