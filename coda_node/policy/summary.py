"""Each job's summary (:class:`coda_common.store.jobsummary.JobSummary`) while it runs on
this node, folded from the daemon's ticks. Pure: ticks in, summaries out.

The daemon hands one :class:`SummaryTick` per job per tick. A tick's readings (the job's
CPU rate, its GPUs' utilisation) cover the interval since the job's previous tick: the CPU
rate is the cgroup's CPU time over that interval, and NVML's utilisation the sample period
before the reading (nvml.h, nvmlDeviceGetUtilizationRates). What coda-node had in force over
that interval (the job's cores, a probe, a throttle) is what the previous tick left. So each
interval is weighted by the snapshot's monotonic clock and counted with the previous tick's
state and this tick's readings; a job's first tick only opens its summary, and a job seen
in one tick only has none.

Which jobs get one: every job with GPUs, and every CPU job coda-node throttled at some tick
(:attr:`SummaryTick.throttled`); a job of unknown kind (no Slurm record) is not counted in
the ticks it has none.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from coda_common.store.jobsummary import (
    MAX_RECORD_CHARS,
    JobSummary,
    clean_text,
    gpus_waiting,
)

__all__ = ["SummaryAccumulator", "SummaryTick"]


@dataclass(frozen=True, slots=True)
class SummaryTick:
    """One job at one tick: who it is, what it read, what coda-node left in force."""

    job_id: int
    monotonic_s: float
    unix_s: float
    kind: str
    """``dnn`` or ``cpu``."""
    user: str | None
    uid: int | None
    account: str | None
    partition: str | None
    num_nodes: int
    gpus: int
    gpu_model: str | None
    record: str | None
    """The hook's raw ``coda:sig=...`` token, as read from the job."""
    profile_state: str | None
    cores_allocated: int
    cores_in_force: int
    """Cores the job may run on after this tick's writes (its cpuset as coda-node left it)."""
    cpu_used_cores: float | None
    """CPU the job used since its previous tick, in cores."""
    gpu_util_pct: float | None
    """Mean NVML utilization.gpu over the job's GPUs; None without a reading."""
    probe_cores: int | None = None
    """The core count a probe runs the job at from this tick on; None: not probed."""
    throttled: bool = False
    """A CPU job throttled (quota, MBA or cache ways) from this tick on."""
    protected: bool = False
    """A GPU job some neighbour is throttled for from this tick on."""


@dataclass(slots=True)
class _Running:
    """A job's summary so far: its latest tick and the sums over the intervals."""

    first: SummaryTick
    last: SummaryTick
    ever_throttled: bool = False
    sums: dict[str, float] = field(default_factory=dict)
    probes: int = 0

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def get(self, key: str) -> float:
        return self.sums.get(key, 0.0)


def _reading(value: float | None, high: float) -> float | None:
    """A reading the sums may take (finite, 0..``high``; clipped at ``high``), else None."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return min(float(value), high)


class SummaryAccumulator:
    """The running summaries of the jobs on ``node``."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._jobs: dict[int, _Running] = {}

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def add(self, tick: SummaryTick) -> None:
        """Fold ``tick`` into its job's summary (opening it at the job's first tick)."""
        run = self._jobs.get(tick.job_id)
        if run is None:
            run = self._jobs[tick.job_id] = _Running(first=tick, last=tick)
            run.probes = int(_probe_starts(None, tick))
            run.ever_throttled = tick.throttled
            return
        dt_s = tick.monotonic_s - run.last.monotonic_s
        if dt_s > 0 and math.isfinite(dt_s):
            _fold(run, run.last, tick, dt_s)
        run.probes += int(_probe_starts(run.last, tick))
        run.ever_throttled = run.ever_throttled or tick.throttled
        run.last = tick

    def ended(self, live: Collection[int]) -> list[JobSummary]:
        """The summaries of the jobs no longer in ``live``, finished and forgotten (those
        that get none left out)."""
        return [s for j in sorted(set(self._jobs) - set(live)) if (s := self.finish(j))]

    def drain(self) -> list[JobSummary]:
        """Every running summary, finished (the daemon stops)."""
        return self.ended(())

    def finish(self, job_id: int) -> JobSummary | None:
        """The job's summary, and forget it; None for a job that gets none: no GPUs and
        never throttled, or no interval covered (seen in one tick only)."""
        run = self._jobs.pop(job_id, None)
        if run is None or run.get("sampled_s") <= 0:
            return None
        if run.last.gpus <= 0 and not run.ever_throttled:
            return None
        return _summary(self.node, run)


def _probe_starts(before: SummaryTick | None, now: SummaryTick) -> bool:
    """A probe at a new core count below the allocation starts at ``now``."""
    cores = now.probe_cores
    if cores is None or cores >= now.cores_allocated:
        return False
    return before is None or before.probe_cores != cores


def _fold(run: _Running, before: SummaryTick, now: SummaryTick, dt_s: float) -> None:
    """One interval of ``dt_s``: ``now``'s readings under ``before``'s state."""
    run.add("sampled_s", dt_s)
    cores = max(0, before.cores_in_force)
    run.add("core_s", cores * dt_s)
    used = _reading(now.cpu_used_cores, float(max(now.cores_allocated, cores, 1)) * 4)
    if used is not None:
        run.add("cpu_sampled_s", dt_s)
        run.add("cpu_core_s", used * dt_s)
        run.add("idle_core_s", max(0.0, now.cores_allocated - used) * dt_s)
    util = _reading(now.gpu_util_pct, 100.0) if now.gpus > 0 else None
    if util is not None:
        run.add("gpu_util_sampled_s", dt_s)
        run.add("gpu_util_pct_s", util * dt_s)
    waiting = gpus_waiting(util, used, cores)
    if waiting is not None:
        run.add("gpu_sampled_s", dt_s)
        if waiting:
            run.add("gpu_wait_s", dt_s)
    if before.probe_cores is not None:
        run.add("probe_s", dt_s)
    elif cores < before.cores_allocated:
        run.add("slim_s", dt_s)
    if before.throttled:
        run.add("throttled_s", dt_s)
    if before.protected:
        run.add("protected_s", dt_s)


def _mean(run: _Running, total: str, over: str, digits: int) -> float | None:
    weight = run.get(over)
    return round(run.get(total) / weight, digits) if weight > 0 else None


def _summary(node: str, run: _Running) -> JobSummary:
    """The finished summary; names a summary cannot hold are left out (None)."""
    first, last = run.first, run.last
    sampled = run.get("sampled_s")

    def part(key: str) -> float:
        return round(min(run.get(key), sampled), 3)

    return JobSummary(
        job_id=last.job_id,
        node=node,
        user=clean_text(last.user),
        uid=last.uid if last.uid is not None and 0 <= last.uid < (1 << 32) else None,
        account=clean_text(last.account),
        partition=clean_text(last.partition),
        kind="dnn" if last.gpus > 0 else "cpu",
        num_nodes=max(1, last.num_nodes),
        start_unix_s=round(first.unix_s, 3),
        end_unix_s=round(max(first.unix_s, last.unix_s), 3),
        sampled_s=round(sampled, 3),
        gpus=max(0, last.gpus),
        gpu_model=clean_text(last.gpu_model),
        cores_allocated=max(0, last.cores_allocated),
        cores_mean=round(run.get("core_s") / sampled, 3),
        cpu_used_cores_mean=_mean(run, "cpu_core_s", "cpu_sampled_s", 3),
        gpu_util_pct_mean=_mean(run, "gpu_util_pct_s", "gpu_util_sampled_s", 2),
        gpu_sampled_s=part("gpu_sampled_s"),
        gpu_wait_s=round(min(run.get("gpu_wait_s"), run.get("gpu_sampled_s"), sampled), 3),
        idle_core_s=round(run.get("idle_core_s"), 3),
        probe_s=part("probe_s"),
        probes=run.probes,
        slim_s=part("slim_s"),
        throttled_s=part("throttled_s"),
        protected_s=part("protected_s"),
        profile_state=clean_text(last.profile_state),
        record=clean_text(last.record, MAX_RECORD_CHARS),
    )
