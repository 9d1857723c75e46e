"""What each job does with its node, accumulated into usage records for its profile. Pure.

Placement reads these records from the profile store: GPU and memory-bandwidth
utilisation predict whether two workloads can share one GPU (``coda-slurm colocate``,
Tabrizian 2020), PCIe traffic marks jobs that should not share a PCIe switch (CODA), progress
per GPU model ranks GPU generations per workload (Takayama et al.), and a CPU job's memory
bandwidth per allocated CPU sizes its request for the memory-bandwidth GRES
(``MemBwSpreadGres``).

The daemon feeds one :class:`UsageTick` per DNN job per tick in which the job shows its own,
undisturbed usage: it runs at its whole allocation (not probed, no admin limit), past its
warm-up, with no CPU job on its sockets throttled on its behalf (a contended job's GPU idles
waiting for the CPU, which is not the workload's own usage). A CPU job's tick
(:meth:`UsageAccumulator.add_cpu`) is its memory bandwidth divided by its allocated CPUs, in
ticks when nothing limits it (no throttle, admin limit or other change in force).
:meth:`UsageAccumulator.step` says which records to write: a job's when it ends (disappears
from discovery), and a running job's every ``flush_every_s``; each only once it covers
``min_ticks`` ticks. After a write the sums start again, so the store's ticks-weighted merge
(:meth:`ProfileStore.merge_usage`, :meth:`ProfileStore.merge_cpu_usage`) never counts a tick
twice.

The sums live in memory only: a daemon restart loses the partial means of the jobs running
then, and collects them again from the next tick (at most ``flush_every_s`` of a job's usage is
lost).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from coda_common.store.profiles import CpuUsageRecord, UsageRecord

__all__ = ["UsageAccumulator", "UsageFlush", "UsageTick"]


@dataclass(frozen=True, slots=True)
class UsageTick:
    """One DNN job in one tick, means over its GPUs on this node."""

    gpu_util: float
    """0..1, NVML utilization.gpu."""
    gpu_mem_bw_util: float
    """0..1, NVML utilization.memory."""
    pcie_bytes_per_s_per_gpu: float | None
    """NVML PCIe rx + tx; None when no GPU of the job reports it."""
    iter_per_s_per_gpu: float | None
    """The job's exact progress (its progress file) per GPU; None without one."""


@dataclass(frozen=True, slots=True)
class UsageFlush:
    """A record to merge into the profile of ``signature``: a DNN job's GPU usage
    (:class:`UsageRecord`) or a CPU job's memory bandwidth (:class:`CpuUsageRecord`)."""

    job_id: int
    signature: str
    record: UsageRecord | CpuUsageRecord
    why: str
    """``job ended``, ``periodic`` or ``daemon stopping``."""


@dataclass(slots=True)
class _GpuSums:
    signature: str
    started_s: float
    gpu_model: str | None = None
    ticks: int = 0
    gpu_util: float = 0.0
    gpu_mem_bw_util: float = 0.0
    pcie: float = 0.0
    pcie_ticks: int = 0
    iters: float = 0.0
    iter_ticks: int = 0

    def record(self, unix_s: float) -> UsageRecord:
        n = self.ticks
        return UsageRecord(
            gpu_model=self.gpu_model,
            gpu_util=_unit(self.gpu_util / n),
            gpu_mem_bw_util=_unit(self.gpu_mem_bw_util / n),
            pcie_bytes_per_s_per_gpu=self.pcie / self.pcie_ticks if self.pcie_ticks else None,
            iter_per_s_per_gpu=self.iters / self.iter_ticks if self.iter_ticks else None,
            ticks=n,
            updated_unix_s=unix_s,
        )

    def restart(self, now_s: float) -> _GpuSums:
        return _GpuSums(self.signature, now_s, self.gpu_model)


@dataclass(slots=True)
class _CpuSums:
    signature: str
    started_s: float
    ticks: int = 0
    mem_bw_bytes_per_s_per_cpu: float = 0.0

    def record(self, unix_s: float) -> CpuUsageRecord:
        return CpuUsageRecord(
            mem_bw_bytes_per_s_per_cpu=self.mem_bw_bytes_per_s_per_cpu / self.ticks,
            ticks=self.ticks,
            updated_unix_s=unix_s,
        )

    def restart(self, now_s: float) -> _CpuSums:
        return _CpuSums(self.signature, now_s)


def _unit(x: float) -> float:
    # Float sums of values within 0..1 can land a hair outside; the store refuses that.
    return min(1.0, max(0.0, x))


class UsageAccumulator:
    """Running sums per job, of either kind (a DNN job's GPU usage, a CPU job's memory
    bandwidth); times come in with the calls (monotonic seconds)."""

    def __init__(self, *, flush_every_s: float, min_ticks: int) -> None:
        if flush_every_s < 0 or min_ticks < 1:
            raise ValueError(
                f"flush_every_s >= 0 and min_ticks >= 1, got {flush_every_s}, {min_ticks}"
            )
        self.flush_every_s = flush_every_s
        """0: write only when the job ends."""
        self.min_ticks = min_ticks
        self._jobs: dict[int, _GpuSums | _CpuSums] = {}

    def ticks(self, job_id: int) -> int:
        """Ticks collected for ``job_id`` since its last write (0 for an unknown job)."""
        sums = self._jobs.get(job_id)
        return sums.ticks if sums else 0

    def add(
        self, job_id: int, signature: str, gpu_model: str | None, now_s: float, tick: UsageTick
    ) -> None:
        """Count one undisturbed tick of DNN job ``job_id``."""
        sums = self._jobs.get(job_id)
        if not isinstance(sums, _GpuSums) or sums.signature != signature:
            sums = self._jobs[job_id] = _GpuSums(signature, now_s, gpu_model)
        if gpu_model is not None:
            sums.gpu_model = gpu_model
        sums.ticks += 1
        sums.gpu_util += tick.gpu_util
        sums.gpu_mem_bw_util += tick.gpu_mem_bw_util
        if tick.pcie_bytes_per_s_per_gpu is not None:
            sums.pcie += tick.pcie_bytes_per_s_per_gpu
            sums.pcie_ticks += 1
        if tick.iter_per_s_per_gpu is not None:
            sums.iters += tick.iter_per_s_per_gpu
            sums.iter_ticks += 1

    def add_cpu(
        self, job_id: int, signature: str, now_s: float, mem_bw_bytes_per_s_per_cpu: float
    ) -> None:
        """Count one unthrottled tick of CPU job ``job_id``: its memory bandwidth divided by
        the CPUs allocated to it on this node. ValueError for a negative or non-finite value
        (one would spoil the whole mean, and the store refuses it)."""
        if not (math.isfinite(mem_bw_bytes_per_s_per_cpu) and mem_bw_bytes_per_s_per_cpu >= 0):
            raise ValueError(f"memory bandwidth per CPU {mem_bw_bytes_per_s_per_cpu!r}")
        sums = self._jobs.get(job_id)
        if not isinstance(sums, _CpuSums) or sums.signature != signature:
            sums = self._jobs[job_id] = _CpuSums(signature, now_s)
        sums.ticks += 1
        sums.mem_bw_bytes_per_s_per_cpu += mem_bw_bytes_per_s_per_cpu

    def step(self, now_s: float, unix_s: float, live: Collection[int]) -> list[UsageFlush]:
        """The records to write now: every job not in ``live`` (ended; forgotten whether or
        not it had enough ticks), and every live job whose sums are ``flush_every_s`` old.
        ``unix_s`` dates the records."""
        out: list[UsageFlush] = []
        for job_id in sorted(self._jobs):
            sums = self._jobs[job_id]
            if job_id not in live:
                del self._jobs[job_id]
                if sums.ticks >= self.min_ticks:
                    out.append(UsageFlush(job_id, sums.signature, sums.record(unix_s), "job ended"))
                continue
            due = self.flush_every_s > 0 and now_s - sums.started_s >= self.flush_every_s
            if due and sums.ticks >= self.min_ticks:
                out.append(UsageFlush(job_id, sums.signature, sums.record(unix_s), "periodic"))
                self._jobs[job_id] = sums.restart(now_s)
        return out

    def drain(self, unix_s: float) -> list[UsageFlush]:
        """Every job's record that has ``min_ticks``, and forget all (the daemon stops)."""
        out = [
            UsageFlush(job_id, sums.signature, sums.record(unix_s), "daemon stopping")
            for job_id, sums in sorted(self._jobs.items())
            if sums.ticks >= self.min_ticks
        ]
        self._jobs.clear()
        return out
