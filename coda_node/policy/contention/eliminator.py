"""The eliminator of one node: each tick it finds the CPU jobs that draw, measures the DNN
jobs (:mod:`~coda_node.policy.contention.baseline`), steps the contender that draws most for
each slowed one (:mod:`~coda_node.policy.contention.ladder`), judges who pays
(:mod:`~coda_node.policy.contention.attribution`) and what each hold buys
(:mod:`~coda_node.policy.contention.holds`), releases (:mod:`~coda_node.policy.contention.release`)
and gives out a throttle per held CPU job. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping

from coda_node.policy.allocator import Event
from coda_node.policy.contention.attribution import Attribution
from coda_node.policy.contention.baseline import Baselines
from coda_node.policy.contention.holds import Holds
from coda_node.policy.contention.jobs import ContentionOutput, CpuJob, DnnJob, Throttle, tighter
from coda_node.policy.contention.ladder import Ladder
from coda_node.policy.contention.params import ContentionParams
from coda_node.policy.contention.release import Release
from coda_node.policy.contention.state import BaselineProbe, Throttled, throttled_fields

CLOCK_SLACK_S = 1e-6
"""How far two clocks may disagree by rounding on when a wait ends
(:meth:`Eliminator.next_deadline_s`)."""


class Eliminator:
    def __init__(
        self,
        params: ContentionParams | None = None,
        *,
        mba: bool = False,
        quota: bool = True,
        l3_ways: int | None = None,
        l3_min_ways: int = 1,
    ) -> None:
        self.params = params or ContentionParams()
        self.mba = mba
        """Whether memory-bandwidth allocation can be applied on this node."""
        self.quota = quota
        """Whether CPU quota can be applied (after MBA's and L3's floors, or alone)."""
        self.l3_ways = l3_ways
        """The ways of the L3 cache when CAT can be applied here (cbm_mask's bits); None:
        no cache allocation."""
        self.l3_min_ways = l3_min_ways
        """The fewest ways a CAT mask may have here (info/L3/min_cbm_bits)."""
        self.ladder = Ladder(
            self.params, mba=mba, quota=quota, l3_ways=l3_ways, l3_min_ways=l3_min_ways
        )
        self.throttled: dict[int, Throttled] = {}
        """Per CPU job stepped at least once: its place on the ladder."""
        self.baselines = Baselines(self.params, self.ladder)
        self.victims = self.baselines.victims
        """Per DNN job: its rates, baseline and slowdown."""
        self.attribution = Attribution(self.params, self.ladder, self.throttled, self.victims)
        self.innocent = self.attribution.innocent
        """CPU jobs whose first step did not speed up the DNN job it was for: since when."""
        self.hold_judge = Holds(self.params, self.ladder, self.throttled, self.victims)
        self.holds = self.hold_judge.holds
        """Per DNN job shielded now: its hold, until judged (``min_gain_per_hold``)."""
        self.unshielded = self.hold_judge.unshielded
        """DNN jobs whose hold bought too little: since when (not shielded for
        ``retest_s``)."""
        self.releaser = Release(self.params, self.ladder, self.throttled, self.victims)
        self._unresolved: dict[int, float] = {}
        """DNN jobs slowed with no CPU job drawing beside them: when that was last said."""
        self._given: dict[int, tuple[tuple[object, ...], Throttle]] = {}
        """Per throttled CPU job: the throttle a step last gave out and what it was built
        from (its limits and the DNN job it shields), to give out again while unchanged."""

    @property
    def probe(self) -> BaselineProbe | None:
        """The baseline probe under way on this node, if any."""
        return self.baselines.probe

    # -- the view ---------------------------------------------------------------
    def dnn_status(self, job_id: int) -> dict[str, object] | None:
        v = self.victims.get(job_id)
        if v is None:
            return None
        base = self.baselines.baseline(v)
        return {
            "baseline": base,
            "baseline_ticks": len(v.baseline),
            "slowdown": v.slowdown,
        }

    def adopt_baseline(self, job_id: int, baseline: float, ticks: int) -> bool:
        """Take a baseline a previous run of the daemon measured (its state file's view), so
        a restart does not leave the job unshielded until it is measured again. Counts as
        at most ``baseline_min_ticks`` ticks, so this run's own quiet ticks soon outweigh
        it. False (nothing taken) for a job this run already knows or a value not usable."""
        return self.baselines.adopt(job_id, baseline, ticks)

    def probing_baseline_of(self) -> int | None:
        """The DNN job whose baseline is being measured now, if any."""
        return None if self.probe is None else self.probe.victim

    def cpu_status(self, job_id: int) -> dict[str, object] | None:
        t = self.throttled.get(job_id)
        if t is None:
            return None
        return {
            "mechanism": t.mechanism,
            "level": t.level,
            "mem_bw_pct": t.mba_pct,
            "l3_ways": t.l3_ways,
            "l3_ways_total": self.l3_ways,
            "quota_cores": t.quota_cores,
            "for_job": t.for_job,
        }

    # -- replaying it faster: its state and its clock ----------------------------------
    def state_key(self) -> tuple[object, ...]:
        """Everything a step reads of this eliminator's own state, as one comparable value
        (a hold's tick count only up to where it stops mattering). Two steps with the same
        inputs from states with equal keys act alike until :meth:`next_deadline_s`: a
        replay (the simulator's) may skip the ticks in between."""
        hold_ticks = self.params.smooth_ticks + 1
        # tuple([...]) rather than tuple(generator): the same value, built faster.
        victims = tuple(
            [
                (
                    j,
                    tuple(v.rates),
                    tuple(v.baseline),
                    v.slowdown,
                    v.contended_since_s,
                    v.last_probe_s,
                    v.floor_since_s,
                    tuple(v.floor_rates),
                )
                for j, v in sorted(self.victims.items())
            ]
        )
        throttled = tuple([(j, *throttled_fields(t)) for j, t in sorted(self.throttled.items())])
        probe = self.probe
        return (
            victims,
            throttled,
            tuple(sorted(self._unresolved.items())),
            None
            if probe is None
            else (probe.victim, probe.started_s, tuple(sorted(probe.caps)), tuple(probe.rates)),
            tuple(sorted(self.innocent.items())),
            tuple(
                [
                    (
                        j,
                        tuple(sorted(h.before.items())),
                        min(h.quiet_ticks, hold_ticks),
                        h.judged,
                        h.priced,
                    )
                    for j, h in sorted(self.holds.items())
                ]
            ),
            tuple(sorted(self.unshielded.items())),
        )

    def next_deadline_s(self, now_s: float) -> float:
        """The earliest moment after ``now_s`` at which one of this eliminator's waits may
        end and change what a step does (a step's, a release's, a retest's, a baseline
        probe's); inf: none pending. Each timestamp it keeps, paired with every wait it is
        compared against."""
        p = self.params
        ends: list[float] = [s + p.release_hold_s for s in self._unresolved.values()]
        ends += (s + p.retest_s for s in self.innocent.values())
        ends += (s + p.retest_s for s in self.unshielded.values())
        for v in self.victims.values():
            if v.contended_since_s is not None:
                ends.append(v.contended_since_s + p.baseline_probe_after_s)
            if v.last_probe_s is not None:
                ends.append(v.last_probe_s + p.baseline_probe_every_s)
            if v.floor_since_s is not None:
                ends += (v.floor_since_s + p.step_s, v.floor_since_s + p.baseline_reset_s)
        for t in self.throttled.values():
            if t.level == 0:
                continue  # its release time matters only to a step that throttles it again
            last = t.last_change_s
            ends += (last + p.step_s, last + p.release_hold_s, last + p.release_hold_s * t.backoff)
            if t.quiet_since_s is not None:
                ends.append(t.quiet_since_s + p.release_hold_s)
        if self.probe is not None:
            started = self.probe.started_s
            ends += (started + p.step_s, started + p.baseline_probe_max_s)
        # A wait that ends within a hair of ``now_s`` may or may not have shown yet.
        after = now_s - CLOCK_SLACK_S
        return min((e for e in ends if e > after), default=math.inf)

    # -- one tick -----------------------------------------------------------------
    def step(
        self, now_s: float, dnn: Mapping[int, DnnJob], cpu: Mapping[int, CpuJob]
    ) -> ContentionOutput:
        p = self.params
        out = ContentionOutput()
        self._forget_ended(dnn, cpu)
        if not p.enabled:
            self.throttled.clear()
            self.baselines.probe = None
            return out
        self.baselines.probe_tick(now_s, dnn, out)
        drawing, contended = self._contenders(cpu)
        victims = self.baselines.measure(now_s, dnn, contended, drawing, out)
        stepped: set[int] = set()
        self.baselines.forget_floor({job.job_id for _, job in victims})
        if p.min_effect_per_core > 0:
            self.attribution.judge_return(now_s, out)
            self.attribution.attribute(cpu)
        exhausted_for = self._shield(now_s, dnn, victims, drawing, stepped, out)
        if self.hold_judge.judging:
            self.hold_judge.judge(now_s, dnn, cpu, exhausted_for, out)
        self.ladder.verify(now_s, self.throttled, cpu, stepped, out)
        self.releaser.release(now_s, dnn, cpu, stepped, out)
        self._give_out(cpu, out)
        return out

    def _forget_ended(self, dnn: Mapping[int, DnnJob], cpu: Mapping[int, CpuJob]) -> None:
        """Drop what is kept of jobs no longer running."""
        for kept, live in (
            (self.victims, dnn),
            (self.throttled, cpu),
            (self.innocent, cpu),
            (self.holds, dnn),
            (self.unshielded, dnn),
            (self._given, cpu),
        ):
            if kept and not kept.keys() <= live.keys():
                for gone in kept.keys() - live.keys():
                    del kept[gone]

    def _contenders(self, cpu: Mapping[int, CpuJob]) -> tuple[dict[int, CpuJob], set[int]]:
        """The CPU jobs that draw (``contender_mem_bw_bytes_per_s`` of memory bandwidth or
        ``contender_cpu_fraction`` of their allocated cores, or any use of a cap), and the
        sockets no DNN job's rate is a baseline on: those of the jobs that draw or are held
        back."""
        p = self.params
        bw_min_bytes_per_s, cpu_fraction = p.contender_mem_bw_bytes_per_s, p.contender_cpu_fraction
        drawing: dict[int, CpuJob] = {}
        for j, c in cpu.items():
            bw, rate = c.mem_bw_bytes_per_s, c.cpu_rate_cores
            if (bw is not None and bw >= bw_min_bytes_per_s) or (
                rate is not None and rate >= cpu_fraction * max(1, c.allocated_cores)
            ):
                drawing[j] = c
        held_sockets: set[int] = set()
        for j, t in self.throttled.items():
            if t.mba_step or t.l3_step or t.quota_step:  # level > 0
                c = cpu[j]  # _forget_ended left only jobs still running
                held_sockets.update(c.sockets)
                # A capped job that still uses its cap draws, however small the cap.
                if not self.ladder.quiet(c, t):
                    drawing[j] = c
        hot_sockets = {s for c in drawing.values() for s in c.sockets}
        return drawing, hot_sockets | held_sockets

    def _shield(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        victims: list[tuple[float, DnnJob]],
        drawing: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> set[int]:
        """Step a contender for each slowed DNN job, the most slowed first; the DNN jobs
        whose contenders are all at their floor."""
        judging = self.hold_judge.judging
        exhausted_for: set[int] = set()
        if len(victims) > 1:
            victims.sort(key=lambda x: (-x[0], x[1].job_id))
        for slowdown, job in victims:
            if judging and self.hold_judge.is_unshielded(now_s, job.job_id):
                continue
            before = len(stepped)
            exhausted = self._protect(now_s, job, slowdown, drawing, stepped, out)
            if exhausted:
                exhausted_for.add(job.job_id)
            if judging and len(stepped) > before:
                self.hold_judge.stepped_for(job, dnn)
            self.baselines.check_stale(now_s, job, exhausted, out)
        return exhausted_for

    def _protect(
        self,
        now_s: float,
        job: DnnJob,
        slowdown: float,
        drawing: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> bool:
        """Step the contender that draws most; True when every contender near the job is
        already at its floor (nothing left to take)."""
        p = self.params
        near = [c for c in drawing.values() if c.sockets & job.sockets]
        if not near:
            self._unexplained(now_s, job, slowdown, out)
            return False
        near = self.attribution.suspects(near, job)
        by_bw = all(c.mem_bw_bytes_per_s is not None for c in near)
        near.sort(
            key=lambda c: (
                -(c.mem_bw_bytes_per_s or 0.0) if by_bw else -(c.cpu_rate_cores or 0.0),
                c.job_id,
            )
        )
        for c in near:
            if self.attribution.exempt(now_s, c.job_id):
                continue
            if c.job_id in stepped:
                return False  # one step per tick for a job; let it show
            t = self.throttled.get(c.job_id)
            if t is not None and t.level > 0 and now_s - t.last_change_s < p.step_s:
                return False
            if t is not None and t.test_victim is not None and self.ladder.at_floor(t, c):
                return False  # being judged at its floor: step no other job meanwhile
            if self.ladder.step_down(now_s, self.throttled, c, job, slowdown, out):
                stepped.add(c.job_id)
                return False
        return True  # every contender is at its floor: nothing more to take

    def _unexplained(
        self, now_s: float, job: DnnJob, slowdown: float, out: ContentionOutput
    ) -> None:
        """Say (at most every ``release_hold_s``) that a DNN job is slowed with no CPU job
        drawing beside it."""
        last = self._unresolved.get(job.job_id)
        if last is None or now_s - last >= self.params.release_hold_s:
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

    def _give_out(self, cpu: Mapping[int, CpuJob], out: ContentionOutput) -> None:
        """A throttle per held CPU job (the same object while its limits stay), and the
        probe's caps on top."""
        throttles, given = out.throttles, self._given
        for job_id, t in self.throttled.items():
            if t.mba_step or t.l3_step or t.quota_step:  # level > 0
                limits = (t.quota_cores, t.mba_pct, t.l3_ways, t.for_job)
                last = given.get(job_id)
                if last is None or last[0] != limits:
                    last = given[job_id] = (
                        limits,
                        Throttle(
                            quota_cores=t.quota_cores,
                            mem_bw_pct=t.mba_pct,
                            reason=f"contention: shielding job {t.for_job}",
                            l3_ways=t.l3_ways,
                        ),
                    )
                throttles[job_id] = last[1]
        if self.probe is not None:
            for job_id, cap in self.probe.caps.items():
                if job_id in cpu:
                    out.throttles[job_id] = tighter(out.throttles.get(job_id), cap)
