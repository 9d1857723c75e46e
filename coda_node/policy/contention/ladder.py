"""The step ladder of one CPU job: down (MBA, then L3 ways, then CPU quota, one step at a
time, each to its floor), MBA's correction on measured bandwidth, and back up in reverse.
Pure: acts on the :class:`~coda_node.policy.contention.state.Throttled` records it is
handed."""

from __future__ import annotations

from collections.abc import Mapping

from coda_node.policy.allocator import Event
from coda_node.policy.contention.jobs import (
    ContentionOutput,
    CpuJob,
    DnnJob,
    Throttle,
    draw_text,
)
from coda_node.policy.contention.params import ContentionParams
from coda_node.policy.contention.state import Throttled


class Ladder:
    """The rungs this node offers (which mechanisms it has, how many L3 ways) and the steps
    between them."""

    def __init__(
        self,
        params: ContentionParams,
        *,
        mba: bool,
        quota: bool,
        l3_ways: int | None,
        l3_min_ways: int,
    ) -> None:
        self.params = params
        self.mba = mba
        self.quota = quota
        self.l3_ways = l3_ways
        self.l3_min_ways = l3_min_ways

    # -- the rungs -------------------------------------------------------------------
    def l3_floor(self) -> int:
        """The fewest ways the ladder goes to: ``floor_l3_ways``, at least the hardware's
        minimum, at most the whole cache (then CAT has no step to take)."""
        assert self.l3_ways is not None
        return min(self.l3_ways, max(self.params.floor_l3_ways, self.l3_min_ways))

    def l3_at(self, step: int) -> int:
        """The ways of ``step`` on the L3 ladder (step >= 1)."""
        assert self.l3_ways is not None
        p = self.params
        if step <= len(p.l3_way_fractions):
            return max(self.l3_floor(), round(self.l3_ways * p.l3_way_fractions[step - 1]))
        return self.l3_floor()

    def mba_at(self, step: int) -> int:
        """The MB value of ``step`` on the MBA ladder (None-free: step >= 1)."""
        p = self.params
        if step <= len(p.mba_fractions):
            return max(p.floor_mba_pct, round(100 * p.mba_fractions[step - 1]))
        return p.floor_mba_pct

    def quota_at(self, step: int, allocated_cores: int) -> float:
        p = self.params
        floor_cores = max(0.1, p.floor_fraction * allocated_cores)
        if step <= len(p.quota_fractions):
            return round(max(floor_cores, p.quota_fractions[step - 1] * allocated_cores), 2)
        return round(floor_cores, 2)

    def at_floor(self, t: Throttled, c: CpuJob) -> bool:
        """Nothing left to step on this job's ladder."""
        p = self.params
        if self.quota:
            floor_cores = max(0.1, p.floor_fraction * c.allocated_cores)
            return t.quota_cores is not None and t.quota_cores <= floor_cores + 1e-9
        return t.mba_pct is not None and t.mba_pct <= p.floor_mba_pct

    def floor_cap(self, c: CpuJob, victim: int) -> Throttle | None:
        """The throttle that holds ``c`` at its floor while ``victim``'s baseline is
        measured; None when no mechanism here can."""
        p = self.params
        reason = f"contention: measuring job {victim}'s baseline"
        if self.quota:
            floor_cores = round(max(0.1, p.floor_fraction * c.allocated_cores), 2)
            return Throttle(quota_cores=floor_cores, reason=reason)
        if self.mba and c.mem_bw_bytes_per_s is not None:
            return Throttle(mem_bw_pct=p.floor_mba_pct, reason=reason)
        return None

    def quiet(self, c: CpuJob, t: Throttled) -> bool:
        """A throttled job that uses less than half of what it may (its cap, or what makes
        a job a contender): it has stopped drawing, whatever its cap."""
        if c.cpu_rate_cores is None:
            return False
        may = self.params.contender_cpu_fraction * max(1, c.allocated_cores)
        if t.quota_cores is not None:
            may = min(may, t.quota_cores)
        return c.cpu_rate_cores < 0.5 * may

    @staticmethod
    def throttle(t: Throttled) -> Throttle:
        return Throttle(quota_cores=t.quota_cores, mem_bw_pct=t.mba_pct, l3_ways=t.l3_ways)

    @staticmethod
    def draw_of(c: CpuJob, mechanism: str) -> float:
        if mechanism == "mba":
            return c.mem_bw_bytes_per_s or 0.0
        return c.cpu_rate_cores or 0.0

    # -- down ------------------------------------------------------------------------
    def step_down(
        self,
        now_s: float,
        throttled: dict[int, Throttled],
        c: CpuJob,
        victim: DnnJob,
        slowdown: float,
        out: ContentionOutput,
    ) -> bool:
        """One step down the job's ladder: MBA (where RDT and per-job bandwidth are
        there) to its floor, then L3 ways (where CAT is there) to their floor, then CPU
        quota to its floor. False when nothing is left."""
        use_mba = self.mba and c.mem_bw_bytes_per_s is not None
        t = self._taken_for(now_s, throttled, c, victim, slowdown, use_mba)
        what = self._next_rung(t, c, use_mba)
        if what is None:
            return False
        t.last_change_s = now_s
        out.events.append(self._throttle_event(t, c, victim, slowdown, what))
        return True

    def _taken_for(
        self,
        now_s: float,
        throttled: dict[int, Throttled],
        c: CpuJob,
        victim: DnnJob,
        slowdown: float,
        use_mba: bool,
    ) -> Throttled:
        """The job's record, started afresh at level 0, with its backoff and the DNN job
        it is now stepped for."""
        p = self.params
        t = throttled.get(c.job_id)
        if t is None or t.level == 0:
            t = Throttled(
                mba_step=0,
                quota_step=0,
                before_draw=self.draw_of(c, "mba" if use_mba else "quota"),
                last_change_s=now_s,
                backoff=t.backoff if t is not None else 1,
                released_s=t.released_s if t is not None else None,
            )
            if (
                t.released_s is not None
                and now_s - t.released_s >= 4 * p.release_hold_s * t.backoff
            ):
                t.backoff = 1  # quiet for long after the last release: start afresh
            throttled[c.job_id] = t
        if t.released_s is not None and now_s - t.released_s < p.release_hold_s * t.backoff:
            # Throttled again soon after a release: the release was premature. Wait longer
            # before the next one (damps throttle/release oscillation).
            t.backoff = min(p.max_backoff, t.backoff * 2)
        t.for_job = victim.job_id
        if p.min_effect_per_core > 0 and t.level == 0:
            t.test_victim, t.test_slowdown, t.test_ticks = victim.job_id, slowdown, 0
        return t

    def _next_rung(self, t: Throttled, c: CpuJob, use_mba: bool) -> str | None:
        """Take the next step on the first ladder with one left; what it did, for the
        event (None: every ladder is at its floor)."""
        p = self.params
        floor_cores = max(0.1, p.floor_fraction * c.allocated_cores)
        if (
            use_mba
            and t.quota_step == 0
            and t.l3_step == 0
            and (t.mba_pct is None or t.mba_pct > p.floor_mba_pct)
        ):
            return self._step_mba(t)
        if (
            self.l3_ways is not None
            and t.quota_step == 0
            and (t.l3_ways or self.l3_ways) > self.l3_floor()
        ):
            return self._step_l3(t)
        if self.quota and (t.quota_cores is None or t.quota_cores > floor_cores + 1e-9):
            return self._step_quota(t, c)
        return None

    def _step_mba(self, t: Throttled) -> str:
        p = self.params
        t.mba_step += 1
        pct = self.mba_at(t.mba_step)
        if t.mba_pct is not None:
            pct = min(pct, t.mba_pct - p.mba_correction_pct)
        t.mba_pct = max(p.floor_mba_pct, pct)
        return f"memory bandwidth capped at MB {t.mba_pct}%"

    def _step_l3(self, t: Throttled) -> str:
        assert self.l3_ways is not None
        t.l3_step += 1
        # Each step takes at least one way (a small cache rounds two fractions alike).
        ways = min(self.l3_at(t.l3_step), (t.l3_ways or self.l3_ways) - 1)
        t.l3_ways = max(self.l3_floor(), ways)
        what = f"L3 limited to {t.l3_ways} of {self.l3_ways} ways"
        if t.mba_step:
            what += f" (MB {t.mba_pct}% was not enough)"
        return what

    def _step_quota(self, t: Throttled, c: CpuJob) -> str:
        t.quota_step += 1
        quota = self.quota_at(t.quota_step, c.allocated_cores)
        if t.quota_cores is not None:
            quota = min(quota, t.quota_cores)
        t.quota_cores = quota
        what = f"CPU capped at {t.quota_cores:g} of {c.allocated_cores} cores"
        tried = []
        if t.mba_step:
            tried.append(f"MB {t.mba_pct}%")
        if t.l3_step:
            tried.append(f"L3 {t.l3_ways} of {self.l3_ways} ways")
        if tried:
            what += f" ({' and '.join(tried)} {'was' if len(tried) == 1 else 'were'} not enough)"
        return what

    def _throttle_event(
        self, t: Throttled, c: CpuJob, victim: DnnJob, slowdown: float, what: str
    ) -> Event:
        p = self.params
        reading: dict[str, object] = {
            "victim": victim.job_id,
            "slowdown": round(slowdown, 3),
            "level": t.level,
            "cpu_rate_cores": c.cpu_rate_cores,
            "mem_bw_bytes_per_s": c.mem_bw_bytes_per_s,
        }
        if self.l3_ways is not None:
            reading["l3_ways"] = t.l3_ways
        return Event(
            c.job_id,
            "throttle",
            f"{what}: job {victim.job_id} runs {slowdown:.0%} below its baseline "
            f"(trigger {p.trigger_slowdown:.0%}) while this job draws " + draw_text(c),
            reading,
        )

    # -- MBA's correction --------------------------------------------------------------
    def verify(
        self,
        now_s: float,
        throttled: Mapping[int, Throttled],
        cpu: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> None:
        """MBA: lower the cap while the measured bandwidth overshoots the aim."""
        p = self.params
        for job_id, t in throttled.items():
            if t.mba_step == 0 or t.l3_step or t.quota_step or job_id in stepped:
                continue
            if now_s - t.last_change_s < p.step_s or t.mba_pct is None:
                continue
            bw = cpu[job_id].mem_bw_bytes_per_s
            if bw is None or t.before_draw <= 0:
                continue
            aim = t.before_draw * self.mba_at(t.mba_step) / 100.0
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
                    {
                        "victim": t.for_job,
                        "mem_bw_bytes_per_s": bw,
                        "aim_bytes_per_s": aim,
                        "mb_pct": t.mba_pct,
                    },
                )
            )

    # -- up ----------------------------------------------------------------------------
    def release_step(
        self,
        now_s: float,
        job_id: int,
        t: Throttled,
        c: CpuJob,
        hold_s: float,
        quiet: bool,
        out: ContentionOutput,
    ) -> None:
        """One step back up the ladder, in reverse: quota first, then L3 ways, then MBA."""
        p = self.params
        released = "quota" if t.quota_step else "l3" if t.l3_step else "mba"
        if released == "quota":
            t.quota_step -= 1
            t.quota_cores = self.quota_at(t.quota_step, c.allocated_cores) if t.quota_step else None
        elif released == "l3":
            t.l3_step -= 1
            t.l3_ways = self.l3_at(t.l3_step) if t.l3_step else None
        else:
            t.mba_step -= 1
            t.mba_pct = self.mba_at(t.mba_step) if t.mba_step else None
        t.last_change_s = now_s
        t.released_s = now_s
        why = (
            f"the job has been quiet for {hold_s:g} s"
            if quiet
            else f"no DNN job on its socket(s) is more than "
            f"{p.release_slowdown:.0%} below its baseline for {hold_s:g} s"
        )
        out.events.append(
            Event(
                job_id,
                "release" if t.level == 0 else "release-step",
                f"{self._released_what(t, released)}: {why}",
                {
                    "victim": t.for_job,
                    "level": t.level,
                    "cpu_rate_cores": c.cpu_rate_cores,
                }
                | ({"l3_ways": t.l3_ways} if self.l3_ways is not None else {}),
            )
        )

    def _released_what(self, t: Throttled, released: str) -> str:
        """What a release step left in place, for its event."""
        if t.level == 0:
            return "released"
        if released == "l3":
            return (
                f"L3 limit raised to {t.l3_ways} of {self.l3_ways} ways"
                if t.l3_ways is not None
                else f"L3 limit lifted (all {self.l3_ways} ways)"
            )
        if t.quota_cores is not None:
            return f"CPU cap raised to {t.quota_cores:g} cores"
        if t.l3_ways is not None:
            return f"CPU cap lifted (L3 stays at {t.l3_ways} of {self.l3_ways} ways)"
        return f"memory bandwidth cap raised to MB {t.mba_pct}%"

    @staticmethod
    def release_all(
        now_s: float, job_id: int, t: Throttled, why: str, out: ContentionOutput
    ) -> None:
        """Give the job back whole, at once."""
        victim = t.for_job
        t.mba_step = t.l3_step = t.quota_step = 0
        t.mba_pct = t.l3_ways = None
        t.quota_cores = None
        t.test_victim = None
        t.last_change_s = now_s
        t.released_s = now_s
        out.events.append(Event(job_id, "release", f"released: {why}", {"victim": victim}))
