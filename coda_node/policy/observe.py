"""Per-job progress over time: a rate, a phase and the job's own recent level. Pure.

The daemon feeds one :class:`Reading` per job per tick; :class:`JobSignal` turns the stream
into :class:`Progress`, which the online profiler (:mod:`coda_node.policy.allocator`) and the
contention eliminator (:mod:`coda_node.policy.contention`) both read. No files, no clocks: times
come in with the readings, so the same code runs in the daemon, in tests over recorded
readings and in the simulator.

Two sources of progress, best first:

* ``iterations``: the job reports iterations done (:mod:`coda_node.progress_client`, a file
  the daemon reads). The rate is the change in the count over the change in the file's
  write time, so it does not depend on when the daemon happens to read.
* ``gpu_util``: otherwise the mean NVML utilisation of the job's GPUs, in percent. CODA and
  the SoCC'18 poster both use GPU utilisation as the proxy for training throughput.

Phases (``Progress.phase``): ``warmup`` for the first ``warmup_s`` of a job (data loaders
fill, cuDNN autotunes, the first epoch caches the data set); a phase the job reports that is
not training (``val``, ``checkpoint``, ...); ``paused`` when the rate falls below
``pause_fraction`` of the job's recent training level (validation or checkpointing that was
not reported: the GPU idles on purpose and CPU dominates, as the SoCC'18 poster notes);
``gpu-idle`` for a job that has held its GPUs for ``gpu_idle_after_s`` past warm-up without
using them; ``no-signal`` when there is neither source; else ``train``. Only ``train`` feeds
the profiler and the contention eliminator: contention slows a job, it does not stop it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

NOT_TRAINING_PHASES = frozenset(
    {"val", "valid", "validation", "eval", "evaluate", "test", "checkpoint", "ckpt", "save"}
)
"""Phase names a job may report that mean "not training now"."""


@dataclass(frozen=True, slots=True)
class SignalParams:
    warmup_s: float = 300.0
    """No probing and no baseline in a job's first minutes."""
    pause_fraction: float = 0.2
    """A rate below this fraction of the job's recent training median is a pause."""
    gpu_idle_pct: float = 5.0
    """GPU utilisation below this is idle."""
    gpu_idle_after_s: float = 600.0
    """A job idle this long past warm-up (never busy) is marked ``gpu-idle``."""
    stall_s: float = 5.0
    """An iteration count unchanged this long means a rate of zero."""
    history: int = 120
    """Training rates kept for the job's recent level (ticks)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One tick's raw inputs for one job."""

    now_s: float
    """Monotonic time of the sample."""
    iterations: float | None = None
    iterations_written_s: float | None = None
    """When the job wrote ``iterations`` (the file's mtime, unix seconds)."""
    reported_phase: str | None = None
    gpu_util_pct: float | None = None
    """Mean utilisation of the job's GPUs, None when NVML has none."""


@dataclass(frozen=True, slots=True)
class Progress:
    rate: float | None
    """Iterations per second (source ``iterations``) or GPU utilisation % (``gpu_util``)."""
    source: str | None
    phase: str
    age_s: float
    level: float | None
    """Median of the job's recent training rates (None before any)."""

    @property
    def training(self) -> bool:
        return self.phase == "train" and self.rate is not None


class JobSignal:
    """The progress of one job, tick after tick."""

    def __init__(self, first_seen_s: float, params: SignalParams | None = None) -> None:
        self.params = params or SignalParams()
        self.first_seen_s = first_seen_s
        self._last_count: tuple[float, float] | None = None
        """(iterations, written unix s) at the last change of the count."""
        self._last_rate: float | None = None
        self._still_since_s: float | None = None
        self._busy_seen = False
        self._rates: deque[float] = deque(maxlen=self.params.history)
        self.last: Progress | None = None

    def _iterations_rate(self, r: Reading) -> float | None:
        if r.iterations is None or r.iterations_written_s is None:
            return None
        if not math.isfinite(r.iterations) or r.iterations < 0:
            return None
        last = self._last_count
        if last is None or r.iterations < last[0]:  # first reading, or the job restarted
            self._last_count = (r.iterations, r.iterations_written_s)
            self._last_rate = None
            return None
        if r.iterations == last[0]:
            # No new count since the last change: the last rate holds until the count has
            # been still for stall_s (then it is a pause), timed by the sample clock.
            if self._still_since_s is None:
                self._still_since_s = r.now_s
            if self._last_rate is not None and r.now_s - self._still_since_s >= self.params.stall_s:
                return 0.0
            return self._last_rate
        self._still_since_s = None
        dt = r.iterations_written_s - last[1]
        if dt <= 0:
            return self._last_rate
        rate = (r.iterations - last[0]) / dt
        self._last_count = (r.iterations, r.iterations_written_s)
        self._last_rate = rate
        return rate

    def update(self, r: Reading, *, hold_level: bool = False) -> Progress:
        """The job's progress at ``r``. ``hold_level``: the job runs below its allocation
        on purpose (a probe), so its rates must not become its training level and a low
        rate is not a pause."""
        p = self.params
        age_s = r.now_s - self.first_seen_s
        rate = self._iterations_rate(r)
        source: str | None = "iterations" if self._last_count is not None else None
        if source is None and r.gpu_util_pct is not None:
            source = "gpu_util"
            rate = r.gpu_util_pct
        if source == "gpu_util" and rate is not None and rate >= p.gpu_idle_pct:
            self._busy_seen = True
        level = statistics.median(self._rates) if self._rates else None
        phase = self._phase(r, rate, source, age_s, None if hold_level else level)
        if phase == "train" and rate is not None and not hold_level:
            self._rates.append(rate)
        self.last = Progress(rate=rate, source=source, phase=phase, age_s=age_s, level=level)
        return self.last

    def _phase(
        self, r: Reading, rate: float | None, source: str | None, age_s: float, level: float | None
    ) -> str:
        p = self.params
        reported = (r.reported_phase or "").lower() or None
        if source is None:
            return "no-signal"
        if age_s < p.warmup_s:
            return "warmup"
        if reported in NOT_TRAINING_PHASES:
            return reported
        if rate is None:
            return "no-signal"
        if source == "gpu_util" and rate < p.gpu_idle_pct:
            if not self._busy_seen and age_s >= p.warmup_s + p.gpu_idle_after_s:
                return "gpu-idle"
            return "paused"
        if level is not None and rate < p.pause_fraction * level:
            return "paused"
        return "train"
