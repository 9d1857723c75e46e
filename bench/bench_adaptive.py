"""coda-node's two adaptive policies replayed at node level against modelled jobs.

    .venv/bin/python bench/bench_adaptive.py [--seeds 10] [--quick]

The code under test is the daemon's own: :class:`coda_node.policy.observe.JobSignal`,
:class:`coda_node.policy.allocator.Allocator` and
:class:`coda_node.policy.contention.Eliminator`, with
their default parameters (``SignalParams()``, ``ProbeParams()``, ``ContentionParams()``: the
eliminator at a 25 % floor on 75/50/25 % quota steps without the hold test, not coda.conf's
defaults),
one tick per simulated second (the daemon's default ``NodeIntervalS=1``). Time is simulated:
nothing sleeps, and every run is reproducible from its seed.

**Part 1, online profiling.** One single-GPU job per SoCC'18 reference workload
(:data:`coda_common.model.curves.REFERENCE_WORKLOADS`: P100, 24-core host) on a 24-core
allocation. At ``c`` cores it trains at ``PEAK * throughput_curve(sweet_spot, c)``
iterations/s times ``1 + noise * N(0, 1)``, drawn afresh each tick (2 % and 5 %), or held
for 20 s (5 %: slow noise, so that each of the allocator's 20 s sub-windows sees a
different level instead of the average of 20 draws). It reports an integer
cumulative iteration count whose write time is when the last iteration finished (what the
progress file's mtime is). Each tick: the job's count goes to ``JobSignal.update``
(``hold_level=True`` while the allocator's record is ``probing``, as the daemon does), the
progress to ``Allocator.step``, and the job runs the next second at
``AllocatorOutput.cores`` (its whole allocation when absent). The job reacts to a core
count at once (no pipeline transient). The run ends when the record is ``done`` (or
``skipped``), or one hour after warm-up.

Lost work is the integral of ``1 - rate(cores) / rate(allocation)`` over the run, with the
noise-free curve: seconds of full-speed training the probes cost. The truth to compare with
is ``cores_for_fraction(sweet_spot, max_cores=allocation)`` (fewest cores reaching 95 % of
the best rate; the model's tolerance is +-max(1 core, 5 %)).

**Part 2, contention reaction.** A DNN job (100 iterations/s uncontended, 2 % per-tick
noise, past warm-up) and a CPU job on the same socket. The CPU job starts at
``ONSET_S``, wants ``D`` cores and ``B`` bytes/s, and stops drawing at ``STOP_S``. The DNN
job is slowed by ``s * min(1, draw / draw_full)``, where ``draw`` is what the CPU job gets
under the throttle in force: quota ``min(D, quota_cores)``; MBA ``B * mb_pct / 100``, or for
an MBA that overshoots ``min(B, 3.5 * B * mb_pct / 100)``. The throttle the eliminator
returns at tick ``t`` is in force from ``t`` to ``t + 1``. D = 8 cores (its allocation),
B = 10 GB/s; under MBA the job still uses its 8 cores (stalled, not idle). The DNN job's
recovery is judged on the noise-free rate: back within ``trigger_slowdown`` of 100/s.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coda_common.model.curves import REFERENCE_WORKLOADS, cores_for_fraction, throughput_curve
from coda_node.policy.allocator import Allocator, ProbeJob, ProbeParams
from coda_node.policy.contention import ContentionParams, CpuJob, DnnJob, Eliminator
from coda_node.policy.observe import JobSignal, Reading, SignalParams

PEAK = 100.0
"""Iterations/s of a job at its plateau (part 1) or uncontended (part 2)."""
UNIX_BASE_S = 1.7e9
"""Write times are unix seconds in the daemon; the simulation's t=0 is here."""
HORIZON_AFTER_WARMUP_S = 3600
NOISES = ((0.02, 1), (0.05, 1), (0.05, 20))
"""(relative noise, seconds it is held): redrawn every tick, or every 20 s (slow noise)."""

ONSET_S = 600
STOP_S = 1200
END_S = 1800
CPU_CORES = 8
"""D: cores the CPU job wants (and is allocated)."""
CPU_BW = 10e9
"""B: bytes/s of memory bandwidth the CPU job wants."""
DNN_NOISE = 0.02
MBA_OVERSHOOT = 3.5


# -- shared -----------------------------------------------------------------------------
class Trainer:
    """A training loop seen through its progress file: an integer iteration count and the
    time the last iteration finished."""

    def __init__(self) -> None:
        self.done = 0.0
        self.written_s = 0.0

    def advance(self, now_s: float, rate: float) -> Reading:
        """Train at ``rate`` iterations/s over the last second and report at ``now_s``."""
        before = math.floor(self.done)
        self.done += rate
        count = math.floor(self.done)
        if count > before and rate > 0:
            self.written_s = now_s - (self.done - count) / rate
        return Reading(
            now_s=now_s, iterations=float(count), iterations_written_s=UNIX_BASE_S + self.written_s
        )


def _noisy(rng: np.random.Generator, rate: float, noise: float) -> float:
    return max(0.0, rate * (1.0 + noise * float(rng.standard_normal())))


def _med(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def _fmt(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def _med_max(xs: Sequence[float], digits: int = 0) -> str:
    if not xs:
        return "—"
    return f"{_fmt(_med(xs), digits)} ({_fmt(max(xs), digits)})"


def _med_range(xs: Sequence[float], digits: int = 0) -> str:
    if not xs:
        return "—"
    lo, mid, hi = min(xs), _med(xs), max(xs)
    if lo == hi:
        return _fmt(mid, digits)
    return f"{_fmt(mid, digits)} [{_fmt(lo, digits)}–{_fmt(hi, digits)}]"


def _table(header: Sequence[str], align: str, rows: list[list[str]]) -> str:
    marks = {"l": "---", "r": "--:"}
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(marks[a] for a in align) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# -- part 1: online profiling -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProfileRun:
    probes: int
    end_s: float
    """Seconds from the end of warm-up to the allocator's result."""
    below_s: float
    lost_s: float
    worst: float
    cores: int | None
    confidence: float | None
    confident: bool
    why: str
    rate_at_result: float | None
    """Noise-free rate at the result, as a fraction of the rate at the allocation."""


def profile_run(
    sweet_spot: int,
    allocation: int,
    noise: float,
    hold_s: int,
    rng: np.random.Generator,
    sp: SignalParams,
    pp: ProbeParams,
) -> ProfileRun:
    curve = PEAK * throughput_curve(sweet_spot, np.arange(1, allocation + 1))
    full = float(curve[allocation - 1])
    signal = JobSignal(0.0, sp)
    alloc = Allocator(pp)
    trainer = Trainer()
    cores = allocation
    lost = worst = below = 0.0
    t = 0
    rec = None
    factor = 1.0
    while t < sp.warmup_s + HORIZON_AFTER_WARMUP_S:
        t += 1
        if (t - 1) % hold_s == 0:
            factor = max(0.0, 1.0 + noise * float(rng.standard_normal()))
        true_rate = float(curve[cores - 1])
        slow = 1.0 - true_rate / full
        lost += slow
        worst = max(worst, slow)
        below += cores < allocation
        reading = trainer.advance(float(t), true_rate * factor)
        rec = alloc.records.get(1)
        probing = rec is not None and rec.state == "probing"
        prog = signal.update(reading, hold_level=probing)
        job = ProbeJob(
            job_id=1,
            signature="bench:workload",
            gpus=1,
            allocated_cores=allocation,
            single_node=True,
            progress=prog,
        )
        out = alloc.step(float(t), {1: job})
        cores = out.cores.get(1, allocation)
        rec = alloc.records[1]
        if rec.state in ("done", "skipped"):
            break
    assert rec is not None
    res = rec.result
    confident = res is not None and res.confidence >= pp.min_confidence
    return ProfileRun(
        probes=rec.probes,
        end_s=t - sp.warmup_s,
        below_s=below,
        lost_s=lost,
        worst=worst,
        cores=res.cores if res else None,
        confidence=res.confidence if res else None,
        confident=confident and rec.state == "done",
        why=rec.why if rec.state in ("done", "skipped") else "horizon",
        rate_at_result=float(curve[min(res.cores, allocation) - 1]) / full if res else None,
    )


def _why_short(why: str) -> str:
    if why.startswith("sweet spot"):
        return "confident"
    if why.startswith("probe limit"):
        return "probe limit"
    if why.startswith("time budget"):
        return "budget"
    if why.startswith("every core count"):
        return "all counts"
    if why.startswith("no further probe"):
        return "no probe"
    return why.split(" ")[0]


def part1(seeds: int, sp: SignalParams, pp: ProbeParams) -> str:
    cases = [(w.name, w.sweet_spot_cores, w.host_cores) for w in REFERENCE_WORKLOADS]
    lm = next(w for w in REFERENCE_WORKLOADS if w.name == "LanguageModel")
    cases += [(f"{lm.name}, 4-core alloc.", lm.sweet_spot_cores, 4)]
    cases += [(f"{lm.name}, 2-core alloc.", lm.sweet_spot_cores, 2)]
    out = []
    header = [
        "workload",
        "table",
        "true 95 %",
        "probes",
        "result s",
        "below s",
        "lost s",
        "worst",
        "result cores",
        "within tol.",
        ">= 95 % peak",
        "confidence",
        "confident",
        "ended by",
    ]
    for ni, (noise, hold_s) in enumerate(NOISES):
        rows = []
        for wi, (name, spot, allocation) in enumerate(cases):
            truth = cores_for_fraction(spot, max_cores=allocation)
            tol = max(1.0, 0.05 * truth)
            runs = [
                profile_run(
                    spot, allocation, noise, hold_s, np.random.default_rng([seed, wi, ni]), sp, pp
                )
                for seed in range(seeds)
            ]
            got = [r.cores for r in runs if r.cores is not None]
            confs = [r.confidence for r in runs if r.confidence is not None]
            ended = Counter(_why_short(r.why) for r in runs)
            within = sum(1 for r in runs if r.cores is not None and abs(r.cores - truth) <= tol)
            reach = sum(
                1 for r in runs if r.rate_at_result is not None and r.rate_at_result >= 0.95 - 1e-9
            )
            rows.append(
                [
                    name,
                    str(spot),
                    str(truth),
                    _med_range([r.probes for r in runs]),
                    _med_max([r.end_s for r in runs]),
                    _med_max([r.below_s for r in runs]),
                    _med_max([r.lost_s for r in runs], 1),
                    f"{max(r.worst for r in runs):.0%}",
                    _med_range(got),
                    f"{within}/{len(runs)}",
                    f"{reach}/{len(runs)}",
                    _med_range(confs, 2),
                    f"{sum(r.confident for r in runs)}/{len(runs)}",
                    ", ".join(f"{k} {v}" for k, v in ended.most_common()),
                ]
            )
        out.append(
            f"**Part 1, online profiling: {noise:.0%} noise, "
            + ("redrawn every tick" if hold_s == 1 else f"held for {hold_s} s")
            + f", {seeds} seeds**\n\n"
            + _table(header, "lrrrrrrrrrrrrl", rows)
        )
    return "\n\n".join(out)


# -- part 2: contention reaction ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    mba: bool
    draw: Callable[[float | None, int | None], float]
    """(quota_cores, mb_pct) in force -> the CPU job's draw as a fraction of what it wants."""


def _quota_draw(quota: float | None, pct: int | None) -> float:
    return 1.0 if quota is None else min(CPU_CORES, quota) / CPU_CORES


def _mba_draw(quota: float | None, pct: int | None) -> float:
    # A CPU quota (the eliminator's step after MBA's floor) cuts bandwidth in proportion.
    return (1.0 if pct is None else pct / 100.0) * _quota_draw(quota, pct)


def _mba_overshoot_draw(quota: float | None, pct: int | None) -> float:
    return (1.0 if pct is None else min(1.0, MBA_OVERSHOOT * pct / 100.0)) * _quota_draw(quota, pct)


VARIANTS = (
    Variant("quota", False, _quota_draw),
    Variant("MBA", True, _mba_draw),
    Variant(f"MBA, {MBA_OVERSHOOT:g}x overshoot", True, _mba_overshoot_draw),
)


@dataclass(frozen=True, slots=True)
class ContentionRun:
    first_throttle: int | None
    recovery: int | None
    slow_mean: float
    slow_end: float
    worst_after: float
    """Largest slowdown while drawing after the first recovery (the oscillation's peaks)."""
    kept_mean: float
    kept_end: float
    release: int | None
    down: int
    up: int
    up_while_drawing: int
    releases_while_drawing: int


def contention_run(
    s: float, variant: Variant, rng: np.random.Generator, cp: ContentionParams, sp: SignalParams
) -> ContentionRun:
    elim = Eliminator(cp, mba=variant.mba)
    signal = JobSignal(0.0, sp)
    trainer = Trainer()
    quota: float | None = None
    pct: int | None = None
    first = recovery = release = None
    throttled_slow: list[float] = []
    throttled_kept: list[float] = []
    worst_after = math.nan
    steps: Counter[str] = Counter()
    up_while_drawing = releases_while_drawing = 0
    for t in range(1, END_S + 1):
        drawing = ONSET_S < t <= STOP_S  # the interval (t - 1, t]
        kept = variant.draw(quota, pct) if drawing else 0.0
        slow = s * kept
        if drawing and (quota is not None or pct is not None):
            throttled_slow.append(slow)
            throttled_kept.append(kept)
        if drawing and recovery is None and first is not None and slow <= cp.trigger_slowdown:
            recovery = t - ONSET_S
            worst_after = slow
        elif drawing and recovery is not None:
            worst_after = max(worst_after, slow)
        prog = signal.update(trainer.advance(float(t), _noisy(rng, PEAK * (1 - slow), DNN_NOISE)))
        dnn = {1: DnnJob(job_id=1, sockets=frozenset({0}), progress=prog)}
        cpu = {}
        if t >= ONSET_S:
            cpu[2] = CpuJob(
                job_id=2,
                sockets=frozenset({0}),
                allocated_cores=CPU_CORES,
                cpu_rate_cores=CPU_CORES * _quota_draw(quota, pct) if drawing else 0.0,
                mem_bw_bytes_per_s=(CPU_BW * kept if drawing else 0.0) if variant.mba else None,
            )
        out = elim.step(float(t), dnn, cpu)
        for e in out.events:
            if e.action in ("throttle", "throttle-correct"):
                steps["down"] += 1
            elif e.action in ("release-step", "release"):
                steps["up"] += 1
                if t <= STOP_S:
                    up_while_drawing += 1
                    releases_while_drawing += e.action == "release"
        th = out.throttles.get(2)
        quota = th.quota_cores if th else None
        pct = th.mem_bw_pct if th else None
        if th is not None and first is None and t >= ONSET_S:
            first = t - ONSET_S
        if t > STOP_S:
            if th is None and release is None:
                release = t - STOP_S
            elif th is not None:
                release = None
    tail = 60
    return ContentionRun(
        first_throttle=first,
        recovery=recovery,
        slow_mean=statistics.fmean(throttled_slow) if throttled_slow else math.nan,
        slow_end=statistics.fmean(throttled_slow[-tail:]) if throttled_slow else math.nan,
        worst_after=worst_after,
        kept_mean=statistics.fmean(throttled_kept) if throttled_kept else math.nan,
        kept_end=statistics.fmean(throttled_kept[-tail:]) if throttled_kept else math.nan,
        release=release,
        down=steps["down"],
        up=steps["up"],
        up_while_drawing=up_while_drawing,
        releases_while_drawing=releases_while_drawing,
    )


def _pct_range(xs: list[float]) -> str:
    got = [x for x in xs if not math.isnan(x)]
    if not got:
        return "—"
    lo, hi = min(got), max(got)
    return f"{lo:.1%}" if lo == hi else f"{lo:.1%}–{hi:.1%}"


def _two(a: list[float], b: list[float], digits: int) -> str:
    """Medians of two per-run percentages, "a / b"."""
    return f"{_med(a):.{digits}%} / {_med(b):.{digits}%}"


def _ticks(xs: list[int | None]) -> str:
    got = [x for x in xs if x is not None]
    never = len(xs) - len(got)
    text = _med_range(got) if got else "never"
    if got and never:
        text += f", never in {never}/{len(xs)}"
    return text


def part2(seeds: int, cp: ContentionParams, sp: SignalParams) -> str:
    rows = []
    for si, s in enumerate((0.5, 0.3)):
        for vi, variant in enumerate(VARIANTS):
            runs = [
                contention_run(s, variant, np.random.default_rng([seed, 100 + si, vi]), cp, sp)
                for seed in range(seeds)
            ]
            rows.append(
                [
                    f"{s:.0%}",
                    variant.name,
                    _ticks([r.first_throttle for r in runs]),
                    _ticks([r.recovery for r in runs]),
                    _two([r.slow_mean for r in runs], [r.slow_end for r in runs], 1),
                    _pct_range([r.worst_after for r in runs]),
                    _two([r.kept_mean for r in runs], [r.kept_end for r in runs], 0),
                    _ticks([r.release for r in runs]),
                    _med_range([r.down for r in runs]),
                    _med_range([r.up for r in runs]),
                    _med_range([r.up_while_drawing for r in runs]),
                    _med_range([r.releases_while_drawing for r in runs]),
                ]
            )
    header = [
        "s",
        "throttle",
        "to 1st throttle",
        "to recovery",
        "DNN slowdown throttled (mean / last 60 s)",
        "worst after recovery",
        "CPU job keeps (mean / last 60 s)",
        "stop to release",
        "down steps",
        "up steps",
        "up steps while drawing",
        "full releases while drawing",
    ]
    return (
        f"**Part 2, contention reaction: CPU job draws from t={ONSET_S} to t={STOP_S} s, "
        f"{seeds} seeds, ticks (median [min–max])**\n\n" + _table(header, "llrrrrrrrrrr", rows)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per row (default 10)")
    ap.add_argument("--quick", action="store_true", help="2 seeds: a smoke run")
    args = ap.parse_args(argv)
    seeds = 2 if args.quick else args.seeds
    if seeds < 1:
        ap.error("--seeds must be at least 1")
    sp, pp, cp = SignalParams(), ProbeParams(), ContentionParams()
    t0 = time.perf_counter()
    print(part1(seeds, sp, pp))
    print()
    print(part2(seeds, cp, sp))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
