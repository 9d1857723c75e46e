"""Who pays: each throttled CPU job judged by its effect on the DNN job it is held back for
(``min_effect_per_core``). A job that shows none at its floor is *unproven* and given back
whole; if the DNN job then slows by too little, the job is *innocent* and left alone for
``retest_s``. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from coda_node.policy.allocator import Event
from coda_node.policy.contention.jobs import ContentionOutput, CpuJob, DnnJob, throttle_share
from coda_node.policy.contention.part import Part


@dataclass(eq=False)
class Attribution(Part):
    """The effect tests of the throttled jobs, and the jobs found innocent (since when)."""

    innocent: dict[int, float] = field(default_factory=dict, init=False)
    """CPU jobs whose first step did not speed up the DNN job it was for: since when."""

    def attribute(self, cpu: Mapping[int, CpuJob]) -> None:
        """Judge each throttled job by its effect. The test starts at its first step and ends
        when the DNN job it was for is back under the trigger (it helped), or when the job
        has been at its floor for ``smooth_ticks`` ticks: then the DNN job must be less
        slowed by ``min_effect_per_core`` per core held back, or the CPU job is released
        and left alone. Judged at the floor, not after one step: on a saturated memory bus
        one step of the job that fills it shows nothing yet."""
        p = self.params
        # Each job is judged on its own (no event, nothing shared): in any order.
        for job_id, t in self.throttled.items():
            if t.test_victim is None or not (t.mba_step or t.l3_step or t.quota_step):
                t.test_victim = None
                continue
            victim, before = t.test_victim, t.test_slowdown
            v = self.victims.get(victim)
            if v is None or v.slowdown is None or before <= 0:
                t.test_victim = None  # nothing to judge by (it ended or stopped training)
                continue
            if v.slowdown <= p.trigger_slowdown:
                t.test_victim = None  # it helped
                continue
            c = cpu[job_id]
            if not self.ladder.at_floor(t, c):
                t.test_ticks = 0
                continue
            t.test_ticks += 1
            if t.test_ticks < p.smooth_ticks:
                continue
            t.test_victim = None
            kept = throttle_share(self.ladder.throttle(t), c.allocated_cores)
            held_cores = c.allocated_cores * (1.0 - kept)
            if held_cores <= 0:
                continue
            effect = (before - v.slowdown) / before / held_cores
            t.unproven = effect < p.min_effect_per_core

    def judge_return(self, now_s: float, out: ContentionOutput) -> None:
        """An unproven job released whole: if the DNN job it was held for got slower by
        less than ``min_effect_per_core`` of the trigger per core given back, it is not
        what slows it and is left alone for ``retest_s``."""
        p = self.params
        returned = [(j, t) for j, t in self.throttled.items() if t.return_slowdown is not None]
        for job_id, t in sorted(returned):
            assert t.return_slowdown is not None
            t.test_ticks += 1
            if t.test_ticks < p.smooth_ticks:
                continue
            before, t.return_slowdown = t.return_slowdown, None
            v = self.victims.get(t.for_job) if t.for_job is not None else None
            if v is None or v.slowdown is None or t.return_cores <= 0:
                continue
            effect = (v.slowdown - before) / p.trigger_slowdown / t.return_cores
            if effect >= p.min_effect_per_core:
                continue  # it does slow it: the ladder takes it again if needed
            self.innocent[job_id] = now_s
            out.events.append(
                Event(
                    job_id,
                    "innocent",
                    f"giving back {t.return_cores:.3g} cores moved job {t.for_job} only "
                    f"from {before:.0%} to {v.slowdown:.0%} below its baseline: not what "
                    f"slows it; not throttled for {p.retest_s:g} s",
                    {"victim": t.for_job, "before": round(before, 4)},
                )
            )

    def suspects(self, near: list[CpuJob], job: DnnJob) -> list[CpuJob]:
        """One suspect at a time: while a job's effect is being judged for ``job``, it
        alone is stepped, so no other job's step is credited to it."""
        throttled = self.throttled
        suspect = [
            c
            for c in near
            if (t := throttled.get(c.job_id)) is not None
            and t.test_victim == job.job_id
            and t.level > 0
        ]
        return suspect or near

    def exempt(self, now_s: float, job_id: int) -> bool:
        """Not to be stepped now: found not to slow anyone lately, or being judged."""
        t = self.throttled.get(job_id)
        if t is not None and t.return_slowdown is not None:
            return True
        since = self.innocent.get(job_id)
        if since is not None:
            if now_s - since < self.params.retest_s:
                return True
            del self.innocent[job_id]
        return False
