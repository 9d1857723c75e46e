"""Each DNN job's uncontended baseline and its slowdown against it: measured over quiet
ticks, measured by a probe that caps the CPU jobs beside it when it has none, and reset when
the job stays slowed with every CPU job beside it at its floor. Pure."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping

from coda_node.policy.allocator import Event
from coda_node.policy.contention.jobs import ContentionOutput, CpuJob, DnnJob
from coda_node.policy.contention.ladder import Ladder
from coda_node.policy.contention.params import ContentionParams
from coda_node.policy.contention.state import BaselineProbe, Victim


class Baselines:
    """The DNN jobs' rates and baselines (``victims``) and the baseline probe under way."""

    def __init__(self, params: ContentionParams, ladder: Ladder) -> None:
        self.params = params
        self.ladder = ladder
        self.victims: dict[int, Victim] = {}
        self.probe: BaselineProbe | None = None

    def baseline(self, v: Victim) -> float | None:
        if len(v.baseline) < self.params.baseline_min_ticks:
            return None
        return statistics.median(v.baseline)

    def _new_victim(self, job_id: int) -> Victim:
        p = self.params
        v = self.victims[job_id] = Victim(
            rates=deque(maxlen=p.smooth_ticks), baseline=deque(maxlen=p.baseline_ticks)
        )
        return v

    def adopt(self, job_id: int, baseline: float, ticks: int) -> bool:
        """See :meth:`Eliminator.adopt_baseline`."""
        p = self.params
        if job_id in self.victims or not baseline > 0 or ticks < p.baseline_min_ticks:
            return False
        v = self._new_victim(job_id)
        v.baseline.extend([baseline] * p.baseline_min_ticks)
        return True

    # -- each tick ---------------------------------------------------------------------
    def measure(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        contended: set[int],
        drawing: Mapping[int, CpuJob],
        out: ContentionOutput,
    ) -> list[tuple[float, DnnJob]]:
        """Take each training job's rate, into its baseline when none of its sockets is
        ``contended``; its slowdown when it has a baseline. The jobs past the trigger, with
        their slowdowns (a probe may start for a job that has no baseline)."""
        p = self.params
        victims: list[tuple[float, DnnJob]] = []
        measured = None if self.probe is None else self.probe.victim
        min_ticks = p.baseline_min_ticks
        for job_id, job in sorted(dnn.items()):
            v = self.victims.get(job_id)
            if v is None:
                v = self._new_victim(job_id)
            v.slowdown = None
            prog = job.progress
            if not prog.training or job.probing:
                v.rates.clear()
                continue
            assert prog.rate is not None
            v.rates.append(prog.rate)
            if job_id == measured:
                continue  # its rate is being measured (see probe_tick)
            quiet = not (job.sockets & contended)
            if quiet:
                v.baseline.append(prog.rate)
            base = statistics.median(v.baseline) if len(v.baseline) >= min_ticks else None
            if base is None or base <= 0:
                if base is None and not quiet:
                    self._maybe_start_probe(now_s, job, v, drawing, out)
                else:
                    v.contended_since_s = None
                continue
            v.contended_since_s = None
            v.slowdown = 1.0 - (sum(v.rates) / len(v.rates)) / base
            if v.slowdown > p.trigger_slowdown:
                victims.append((v.slowdown, job))
        return victims

    def forget_floor(self, slowed: set[int]) -> None:
        """A job no longer past the trigger starts its wait at the floor afresh."""
        for job_id, v in self.victims.items():
            if job_id not in slowed:
                v.floor_since_s = None
                v.floor_rates.clear()

    # -- the baseline probe ----------------------------------------------------------
    def _maybe_start_probe(
        self,
        now_s: float,
        job: DnnJob,
        v: Victim,
        drawing: Mapping[int, CpuJob],
        out: ContentionOutput,
    ) -> None:
        p = self.params
        if p.baseline_probe_after_s <= 0:
            return
        if v.contended_since_s is None:
            v.contended_since_s = now_s
        if self.probe is not None or now_s - v.contended_since_s < p.baseline_probe_after_s:
            return
        if v.last_probe_s is not None and now_s - v.last_probe_s < p.baseline_probe_every_s:
            return
        near = sorted(
            (c for c in drawing.values() if c.sockets & job.sockets), key=lambda c: c.job_id
        )
        caps = {c.job_id: self.ladder.floor_cap(c, job.job_id) for c in near}
        caps = {j: cap for j, cap in caps.items() if cap is not None}
        if not caps:
            return
        v.last_probe_s = now_s
        self.probe = BaselineProbe(job.job_id, now_s, caps)
        out.events.append(
            Event(
                job.job_id,
                "baseline-probe",
                f"no uncontended baseline after {now_s - v.contended_since_s:.0f} s beside "
                f"CPU job(s) {', '.join(str(j) for j in caps)}: capping them at their floor "
                f"for up to {p.baseline_probe_max_s:g} s to measure one",
                {"cpu_jobs": sorted(caps)},
            )
        )

    def probe_tick(self, now_s: float, dnn: Mapping[int, DnnJob], out: ContentionOutput) -> None:
        """Measure the victim of the probe under way, and end the probe when done."""
        probe = self.probe
        if probe is None:
            return
        p = self.params
        job = dnn.get(probe.victim)
        v = self.victims.get(probe.victim)
        training = (
            job is not None
            and v is not None
            and job.progress.training
            and not job.probing
            and job.progress.rate is not None
        )
        if training and now_s - probe.started_s >= p.step_s:
            assert job is not None and job.progress.rate is not None
            probe.rates.append(job.progress.rate)
        done = len(probe.rates) >= p.baseline_min_ticks
        if not (done or not training or now_s - probe.started_s >= p.baseline_probe_max_s):
            return
        self.probe = None
        if done and v is not None:
            v.baseline.extend(probe.rates)
            v.contended_since_s = None
            base = statistics.median(probe.rates)
            what = f"baseline {base:.4g} measured over {len(probe.rates)} ticks"
        elif not training:
            what = "the job stopped training; no baseline"
        else:
            what = f"only {len(probe.rates)} tick(s) measured in {p.baseline_probe_max_s:g} s"
        out.events.append(
            Event(
                probe.victim,
                "baseline-probe-end",
                f"{what}; caps on CPU job(s) {', '.join(str(j) for j in probe.caps)} lifted",
                {"rates": [round(r, 4) for r in probe.rates]},
            )
        )

    # -- the baseline reset ----------------------------------------------------------
    def check_stale(
        self, now_s: float, job: DnnJob, exhausted: bool, out: ContentionOutput
    ) -> None:
        """A job that stays slowed with every CPU job beside it at its floor is not slowed
        by them: its own speed changed (a new phase, a longer sequence length, a slower
        input pipeline), and its old baseline would hold the CPU jobs at their floor for
        as long as it runs. Its rate at the floor is the best it gets here, so that becomes
        its baseline; the usual release follows, and a throttle again only if the CPU jobs
        then slow it below *that*."""
        p = self.params
        v = self.victims[job.job_id]
        if not exhausted or p.baseline_reset_s <= 0:
            v.floor_since_s = None
            v.floor_rates.clear()
            return
        if v.floor_since_s is None:
            v.floor_since_s = now_s
            v.floor_rates.clear()
        if now_s - v.floor_since_s < p.step_s or not v.rates:
            return  # the last step has not shown yet
        v.floor_rates.append(v.rates[-1])
        if (
            now_s - v.floor_since_s < p.baseline_reset_s
            or len(v.floor_rates) < p.baseline_min_ticks
        ):
            return
        old = self.baseline(v)
        new = statistics.median(v.floor_rates)
        v.baseline.clear()
        v.baseline.extend(v.floor_rates[-p.baseline_ticks :])
        held = now_s - v.floor_since_s
        v.floor_since_s = None
        v.floor_rates.clear()
        out.events.append(
            Event(
                job.job_id,
                "baseline-reset",
                f"still {1.0 - new / old:.0%} below its baseline {old:.4g} after {held:.0f} s "
                f"with every CPU job beside it at its floor: not their doing; its rate there, "
                f"{new:.4g}, is its baseline from now on (the CPU jobs are released step by "
                "step)"
                if old
                else f"baseline {new:.4g} measured with every CPU job beside it at its floor",
                {"old_baseline": old, "new_baseline": new, "held_s": round(held, 1)},
            )
        )
