"""The contention eliminator: shield DNN jobs from the CPU jobs beside them. Pure.

Each tick, each training DNN job's rate is compared with its own uncontended baseline: the
median of its rates over *quiet* ticks (training at its whole allocation, not probed, no
CPU job drawing on its sockets, nothing throttled there). When the rate (mean of the last
``smooth_ticks``) is more than ``trigger_slowdown`` below the baseline while CPU jobs on the
same socket draw memory bandwidth or CPU, the CPU job that draws most is throttled one step:

* **MBA** (Intel RDT memory-bandwidth allocation) where the node has it: the CPU job's
  bandwidth is aimed at ``mba_fractions`` of what it drew before the first step. MBA's
  percentage is only a request (caps overshooting 3-4x are reported against
  intel-cmt-cat), so the loop closes on *measured* bandwidth: while the job still draws
  more than ``overshoot`` times the aim, the MBA value is lowered further in
  ``mba_correction_pct`` steps, down to the floor.
* **CPU quota** otherwise: the job is capped at ``quota_fractions`` of its allocated cores.
* L3 way partitioning (CAT) is not used yet: coda-node does not write ``L3:`` schemata.

One step per victim per tick, and a job that was just stepped is not stepped again for
``step_s`` (its effect needs a tick to show). Release is one step at a time, each after
``release_hold_s`` with no victim on the job's sockets (every DNN job there within
``release_slowdown`` of its baseline, or not training); a job throttled again soon after a
release waits twice as long before the next one (up to 8x), which damps oscillation. A CPU
job is never throttled below ``floor_fraction`` of its allocation (quota) or
``floor_mba_pct`` (MBA); DNN jobs are never throttled.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from coda_node.allocator import Event
from coda_node.observe import Progress


@dataclass(frozen=True, slots=True)
class ContentionParams:
    enabled: bool = True
    trigger_slowdown: float = 0.10
    release_slowdown: float = 0.05
    smooth_ticks: int = 2
    baseline_min_ticks: int = 5
    baseline_ticks: int = 300
    contender_cpu_fraction: float = 0.25
    """A CPU job draws when it uses this share of its allocated cores..."""
    contender_mem_bw_bytes_per_s: float = 1e9
    """... or this much memory bandwidth."""
    quota_fractions: tuple[float, ...] = (0.75, 0.5, 0.25)
    mba_fractions: tuple[float, ...] = (0.7, 0.5, 0.3)
    overshoot: float = 1.25
    mba_correction_pct: int = 10
    floor_fraction: float = 0.1
    floor_mba_pct: int = 10
    step_s: float = 2.0
    release_hold_s: float = 30.0
    max_backoff: int = 8


@dataclass(frozen=True, slots=True)
class DnnJob:
    job_id: int
    sockets: frozenset[int]
    progress: Progress
    probing: bool = False
    """Its cores are being probed: its rate is low on purpose."""


@dataclass(frozen=True, slots=True)
class CpuJob:
    job_id: int
    sockets: frozenset[int]
    allocated_cores: int
    cpu_rate_cores: float | None
    mem_bw_bytes_per_s: float | None


@dataclass(frozen=True, slots=True)
class Throttle:
    quota_cores: float | None = None
    mem_bw_pct: int | None = None
    reason: str = ""


@dataclass(slots=True)
class _Victim:
    rates: deque[float]
    baseline: deque[float]
    slowdown: float | None = None


@dataclass(slots=True)
class _Throttled:
    mechanism: str
    """"mba" or "quota"."""
    level: int
    """Steps taken (1 = first step); 0 = released."""
    before_draw: float
    """What the job drew before the first step (bytes/s for mba, cores for quota)."""
    last_change_s: float
    mba_pct: int | None = None
    quota_cores: float | None = None
    backoff: int = 1
    released_s: float | None = None
    for_job: int | None = None


@dataclass(slots=True)
class ContentionOutput:
    throttles: dict[int, Throttle] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class Eliminator:
    def __init__(self, params: ContentionParams | None = None, *, mba: bool = False) -> None:
        self.params = params or ContentionParams()
        self.mba = mba
        """Whether memory-bandwidth allocation can be applied on this node."""
        self.victims: dict[int, _Victim] = {}
        self.throttled: dict[int, _Throttled] = {}
        self._unresolved: dict[int, float] = {}

    # -- the view ---------------------------------------------------------------
    def dnn_status(self, job_id: int) -> dict[str, object] | None:
        v = self.victims.get(job_id)
        if v is None:
            return None
        base = self._baseline(v)
        return {
            "baseline": base,
            "baseline_ticks": len(v.baseline),
            "slowdown": v.slowdown,
        }

    def cpu_status(self, job_id: int) -> dict[str, object] | None:
        t = self.throttled.get(job_id)
        if t is None:
            return None
        return {
            "mechanism": t.mechanism,
            "level": t.level,
            "mem_bw_pct": t.mba_pct,
            "quota_cores": t.quota_cores,
            "for_job": t.for_job,
        }

    def _baseline(self, v: _Victim) -> float | None:
        if len(v.baseline) < self.params.baseline_min_ticks:
            return None
        return statistics.median(v.baseline)

    # -- one tick -----------------------------------------------------------------
    def step(
        self, now_s: float, dnn: Mapping[int, DnnJob], cpu: Mapping[int, CpuJob]
    ) -> ContentionOutput:
        p = self.params
        out = ContentionOutput()
        for gone in set(self.victims) - set(dnn):
            del self.victims[gone]
        for gone in set(self.throttled) - set(cpu):
            del self.throttled[gone]
        if not p.enabled:
            self.throttled.clear()
            return out
        drawing = {j: c for j, c in cpu.items() if self._draws(c)}
        hot_sockets = {s for c in drawing.values() for s in c.sockets}
        held_sockets = {s for j, t in self.throttled.items() if t.level > 0 for s in cpu[j].sockets}
        victims: list[tuple[float, DnnJob]] = []
        for job_id, job in sorted(dnn.items()):
            v = self.victims.get(job_id)
            if v is None:
                v = self.victims[job_id] = _Victim(
                    rates=deque(maxlen=p.smooth_ticks), baseline=deque(maxlen=p.baseline_ticks)
                )
            v.slowdown = None
            prog = job.progress
            if not prog.training or job.probing:
                v.rates.clear()
                continue
            assert prog.rate is not None
            v.rates.append(prog.rate)
            quiet = not (job.sockets & hot_sockets) and not (job.sockets & held_sockets)
            if quiet:
                v.baseline.append(prog.rate)
            base = self._baseline(v)
            if base is None or base <= 0:
                continue
            v.slowdown = 1.0 - (sum(v.rates) / len(v.rates)) / base
            if v.slowdown > p.trigger_slowdown:
                victims.append((v.slowdown, job))
        stepped: set[int] = set()
        for slowdown, job in sorted(victims, key=lambda x: (-x[0], x[1].job_id)):
            self._protect(now_s, job, slowdown, drawing, stepped, out)
        self._verify(now_s, cpu, stepped, out)
        self._release(now_s, dnn, cpu, stepped, out)
        for job_id, t in self.throttled.items():
            if t.level > 0:
                out.throttles[job_id] = Throttle(
                    quota_cores=t.quota_cores,
                    mem_bw_pct=t.mba_pct,
                    reason=f"contention: shielding job {t.for_job}",
                )
        return out

    def _draws(self, c: CpuJob) -> bool:
        p = self.params
        if (
            c.mem_bw_bytes_per_s is not None
            and c.mem_bw_bytes_per_s >= p.contender_mem_bw_bytes_per_s
        ):
            return True
        if c.cpu_rate_cores is not None:
            return c.cpu_rate_cores >= p.contender_cpu_fraction * max(1, c.allocated_cores)
        return False

    def _draw_of(self, c: CpuJob, mechanism: str) -> float:
        if mechanism == "mba":
            return c.mem_bw_bytes_per_s or 0.0
        return c.cpu_rate_cores or 0.0

    def _protect(
        self,
        now_s: float,
        job: DnnJob,
        slowdown: float,
        drawing: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> None:
        p = self.params
        near = [c for c in drawing.values() if c.sockets & job.sockets]
        if not near:
            last = self._unresolved.get(job.job_id)
            if last is None or now_s - last >= p.release_hold_s:
                self._unresolved[job.job_id] = now_s
                out.events.append(
                    Event(
                        job.job_id,
                        "contention-unexplained",
                        f"rate {slowdown:.0%} below its baseline, but no CPU job draws on "
                        f"socket(s) {sorted(job.sockets)}",
                        {"slowdown": round(slowdown, 3)},
                    )
                )
            return
        by_bw = all(c.mem_bw_bytes_per_s is not None for c in near)
        near.sort(
            key=lambda c: (
                -(c.mem_bw_bytes_per_s or 0.0) if by_bw else -(c.cpu_rate_cores or 0.0),
                c.job_id,
            )
        )
        for c in near:
            if c.job_id in stepped:
                return  # one step per tick for a job; let it show
            t = self.throttled.get(c.job_id)
            if t is not None and t.level > 0 and now_s - t.last_change_s < p.step_s:
                return
            if self._step_down(now_s, c, job, slowdown, out):
                stepped.add(c.job_id)
                return
        # every contender is at its floor: nothing more to do

    def _step_down(
        self, now_s: float, c: CpuJob, victim: DnnJob, slowdown: float, out: ContentionOutput
    ) -> bool:
        p = self.params
        t = self.throttled.get(c.job_id)
        mechanism = "mba" if self.mba and c.mem_bw_bytes_per_s is not None else "quota"
        if t is None or t.level == 0:
            backoff = 1
            if (
                t is not None
                and t.released_s is not None
                and now_s - t.released_s < (p.release_hold_s * t.backoff)
            ):
                backoff = min(p.max_backoff, t.backoff * 2)  # re-throttled soon after release
            elif t is not None:
                backoff = t.backoff
            t = _Throttled(
                mechanism=mechanism,
                level=0,
                before_draw=self._draw_of(c, mechanism),
                last_change_s=now_s,
                backoff=backoff,
            )
            self.throttled[c.job_id] = t
        t.for_job = victim.job_id
        if t.mechanism == "mba":
            floor_pct = p.floor_mba_pct
            if t.mba_pct is not None and t.mba_pct <= floor_pct:
                return False
            t.level += 1
            pct = floor_pct
            if t.level <= len(p.mba_fractions):
                pct = round(100 * p.mba_fractions[t.level - 1])
            if t.mba_pct is not None:
                pct = min(pct, t.mba_pct - p.mba_correction_pct)
            t.mba_pct = max(floor_pct, pct)
            what = f"memory bandwidth capped at MB {t.mba_pct}%"
        else:
            floor_cores = max(0.1, p.floor_fraction * c.allocated_cores)
            if t.quota_cores is not None and t.quota_cores <= floor_cores + 1e-9:
                return False
            t.level += 1
            quota = floor_cores
            if t.level <= len(p.quota_fractions):
                quota = p.quota_fractions[t.level - 1] * c.allocated_cores
            if t.quota_cores is not None:
                quota = min(quota, t.quota_cores)
            t.quota_cores = round(max(floor_cores, quota), 2)
            what = f"CPU capped at {t.quota_cores:g} of {c.allocated_cores} cores"
        t.last_change_s = now_s
        out.events.append(
            Event(
                c.job_id,
                "throttle",
                f"{what}: job {victim.job_id} runs {slowdown:.0%} below its baseline "
                f"(trigger {p.trigger_slowdown:.0%}) while this job draws " + _draw_text(c),
                {
                    "victim": victim.job_id,
                    "slowdown": round(slowdown, 3),
                    "level": t.level,
                    "cpu_rate_cores": c.cpu_rate_cores,
                    "mem_bw_bytes_per_s": c.mem_bw_bytes_per_s,
                },
            )
        )
        return True

    def _verify(
        self, now_s: float, cpu: Mapping[int, CpuJob], stepped: set[int], out: ContentionOutput
    ) -> None:
        """MBA: lower the cap while the measured bandwidth overshoots the aim."""
        p = self.params
        for job_id, t in self.throttled.items():
            if t.mechanism != "mba" or t.level == 0 or job_id in stepped:
                continue
            if now_s - t.last_change_s < p.step_s or t.mba_pct is None:
                continue
            bw = cpu[job_id].mem_bw_bytes_per_s
            if bw is None or t.before_draw <= 0:
                continue
            aim = t.before_draw * p.mba_fractions[min(t.level, len(p.mba_fractions)) - 1]
            if bw <= p.overshoot * aim or t.mba_pct <= p.floor_mba_pct:
                continue
            old = t.mba_pct
            t.mba_pct = max(p.floor_mba_pct, old - p.mba_correction_pct)
            t.last_change_s = now_s
            stepped.add(job_id)
            out.events.append(
                Event(
                    job_id,
                    "throttle-correct",
                    f"MB {old}% still lets it draw {bw / 1e9:.2f} GB/s, over "
                    f"{p.overshoot:g}x the aim of {aim / 1e9:.2f} GB/s; MB lowered to "
                    f"{t.mba_pct}%",
                    {"mem_bw_bytes_per_s": bw, "aim_bytes_per_s": aim, "mb_pct": t.mba_pct},
                )
            )

    def _release(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> None:
        p = self.params
        for job_id, t in sorted(self.throttled.items()):
            if t.level == 0 or job_id in stepped:
                continue
            sockets = cpu[job_id].sockets
            needed = False
            for d in dnn.values():
                v = self.victims.get(d.job_id)
                if not (d.sockets & sockets) or v is None or v.slowdown is None:
                    continue
                if v.slowdown > p.release_slowdown:
                    needed = True
            if needed:
                continue
            if now_s - t.last_change_s < p.release_hold_s * t.backoff:
                continue
            t.level -= 1
            t.last_change_s = now_s
            if t.level == 0:
                t.mba_pct = t.quota_cores = None
                t.released_s = now_s
                what = "released"
            elif t.mechanism == "mba":
                t.mba_pct = min(100, round(100 * p.mba_fractions[t.level - 1]))
                what = f"memory bandwidth cap raised to MB {t.mba_pct}%"
            else:
                c = cpu[job_id]
                t.quota_cores = round(
                    p.quota_fractions[min(t.level, len(p.quota_fractions)) - 1] * c.allocated_cores,
                    2,
                )
                what = f"CPU cap raised to {t.quota_cores:g} cores"
            out.events.append(
                Event(
                    job_id,
                    "release" if t.level == 0 else "release-step",
                    f"{what}: no DNN job on its socket(s) is more than "
                    f"{p.release_slowdown:.0%} below its baseline for "
                    f"{p.release_hold_s * t.backoff:g} s",
                    {"level": t.level, "cpu_rate_cores": cpu[job_id].cpu_rate_cores},
                )
            )


def _draw_text(c: CpuJob) -> str:
    parts = []
    if c.mem_bw_bytes_per_s is not None:
        parts.append(f"{c.mem_bw_bytes_per_s / 1e9:.2f} GB/s")
    if c.cpu_rate_cores is not None:
        parts.append(f"{c.cpu_rate_cores:.2f} cores")
    return " and ".join(parts) or "an unknown amount"
