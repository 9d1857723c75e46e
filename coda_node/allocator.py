"""The adaptive CPU allocator: learn a DNN job's sweet spot while it runs. Pure.

For a GPU job whose workload has no confident profile, probe core counts *inside its own
allocation*: shrink its cpuset to the count the experiment design picks
(:func:`slurm_plugin.model.next_probe`: the whole allocation first, which is the baseline,
then the fewest cores, then where one measurement best separates the candidate sweet
spots), hold it ``settle_s`` for the data pipeline to reach its new level, measure
``measure_s`` in ``windows`` sub-windows (each a sample, so the noise is measured too), and
stop as soon as :func:`slurm_plugin.model.estimate_sweet_spot` is ``min_confidence`` sure.
The job then gets its whole allocation back and keeps it: Slurm owns the allocation, and
cores taken from a running job would only idle (nothing else can be scheduled onto them);
the gain comes at the next submission, which the hook right-sizes from the published
profile.

Cost bounds, all per job unless said otherwise:

* ``budget_s``: total time spent below the allocation; ``max_probes`` probes at most;
* ``max_slowdown``: a probe whose first window is slower than this fraction of the
  baseline ends at once, and counts below the one the curve so far says would be as slow
  are never probed;
* never during warm-up or a phase that is not training (the probe is abandoned and resumed
  later, its partial window thrown away);
* ``max_jobs`` probed at once on a node.

Units: core counts are the job's cores on this node; rates are whatever
:class:`coda_node.observe.Progress` gives (iterations/s or GPU %). Published samples are
normalised to the job's own plateau (100 = the plateau of this run), so runs with other
batch sizes, data sets or GPU proxies of the same workload merge into one curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from coda_node.observe import Progress
from slurm_plugin.model import (
    InconsistentSamples,
    ModelError,
    SweetSpot,
    estimate_sweet_spot,
    next_probe,
)


@dataclass(frozen=True, slots=True)
class ProbeParams:
    enabled: bool = True
    settle_s: float = 30.0
    measure_s: float = 60.0
    windows: int = 3
    max_jobs: int = 1
    budget_s: float = 900.0
    max_probes: int = 8
    max_slowdown: float = 0.5
    min_confidence: float = 0.8
    plateau_fraction: float = 0.95


@dataclass(frozen=True, slots=True)
class ProbeJob:
    """What the allocator needs to know about one DNN job this tick."""

    job_id: int
    signature: str | None
    """The submit hook's signature key; None when the hook did not see the job."""
    gpus: int
    allocated_cores: int
    single_node: bool
    progress: Progress
    profile_confident: bool = False
    """The store already holds a confident profile for this workload."""
    blocked: str | None = None
    """Why the job must not be probed now (an admin limit, throttling nearby), or None."""


@dataclass(frozen=True, slots=True)
class Event:
    job_id: int
    action: str
    rule: str
    reading: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Publish:
    """Samples to merge into the profile store (the daemon does the writing)."""

    job_id: int
    signature: str
    gpus: int
    samples: tuple[tuple[int, float], ...]
    """(cores on the node, throughput as % of this run's plateau)."""
    result: SweetSpot | None


@dataclass(slots=True)
class ProbeRecord:
    """The allocator's memory of one job."""

    state: str = "waiting"
    """waiting | probing | done | skipped."""
    why: str = ""
    samples: list[tuple[int, float]] = field(default_factory=list)
    current: int | None = None
    since_s: float = 0.0
    window_start_s: float | None = None
    window_rates: list[float] = field(default_factory=list)
    windows_done: int = 0
    below_s: float = 0.0
    probes: int = 0
    floor: int = 1
    result: SweetSpot | None = None
    last_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "state": self.state,
            "why": self.why,
            "cores_now": self.current,
            "probes": self.probes,
            "below_allocation_s": round(self.below_s, 1),
            "samples": [[c, round(r, 4)] for c, r in self.samples],
            "sweet_spot_cores": self.result.cores if self.result else None,
            "confidence": round(self.result.confidence, 3) if self.result else None,
        }


@dataclass(slots=True)
class AllocatorOutput:
    cores: dict[int, int] = field(default_factory=dict)
    """Core count each probed job should have now (absent: its whole allocation)."""
    publish: list[Publish] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


class Allocator:
    def __init__(self, params: ProbeParams | None = None) -> None:
        self.params = params or ProbeParams()
        self.records: dict[int, ProbeRecord] = {}

    def step(self, now_s: float, jobs: Mapping[int, ProbeJob]) -> AllocatorOutput:
        out = AllocatorOutput()
        for gone in set(self.records) - set(jobs):
            del self.records[gone]
        for job_id in sorted(jobs):
            job = jobs[job_id]
            rec = self.records.get(job_id)
            if rec is None:
                rec = self.records[job_id] = ProbeRecord(floor=max(1, job.gpus))
                self._admit(job, rec)
            dt = 0.0 if rec.last_s is None else max(0.0, now_s - rec.last_s)
            rec.last_s = now_s
            if rec.state == "probing":
                self._probing(now_s, dt, job, rec, out)
        probing = sum(1 for r in self.records.values() if r.state == "probing")
        for job_id in sorted(jobs):
            rec = self.records[job_id]
            job = jobs[job_id]
            if rec.state == "waiting" and probing < self.params.max_jobs and self._may_start(job):
                self._next(now_s, job, rec, out)
                probing += rec.state == "probing"
            current = rec.current if rec.state == "probing" else None
            if current is not None and current < job.allocated_cores:
                out.cores[job_id] = current
        return out

    # -- admission --------------------------------------------------------------
    def _admit(self, job: ProbeJob, rec: ProbeRecord) -> None:
        why = None
        if not self.params.enabled:
            why = "online profiling is off (NodeProfile=no)"
        elif job.signature is None:
            why = "no workload signature (the submit hook did not see this job)"
        elif not job.single_node:
            why = "multi-node job (profiles come from single-node runs)"
        elif job.profile_confident:
            rec.state, rec.why = "done", "the workload already has a confident profile"
            return
        elif job.allocated_cores <= rec.floor:
            why = f"{job.allocated_cores} core(s) for {job.gpus} GPU(s): nothing smaller to try"
        if why is not None:
            rec.state, rec.why = "skipped", why

    def _may_start(self, job: ProbeJob) -> bool:
        return job.blocked is None and job.progress.training

    # -- probing ----------------------------------------------------------------
    def _probing(
        self, now_s: float, dt: float, job: ProbeJob, rec: ProbeRecord, out: AllocatorOutput
    ) -> None:
        p = self.params
        assert rec.current is not None
        if rec.current < job.allocated_cores:
            rec.below_s += dt
        if job.blocked is not None or not job.progress.training:
            why = job.blocked or f"job is in phase {job.progress.phase!r}"
            out.events.append(Event(job.job_id, "probe-paused", why, {"cores": rec.current}))
            rec.state, rec.why = "waiting", f"paused: {why}"
            rec.current, rec.window_start_s, rec.window_rates = None, None, []
            rec.windows_done = 0
            return
        if now_s - rec.since_s < p.settle_s:
            return
        if rec.window_start_s is None:
            rec.window_start_s = now_s
            rec.window_rates = []
        assert job.progress.rate is not None
        rec.window_rates.append(job.progress.rate)
        if now_s - rec.window_start_s < p.measure_s / p.windows:
            return
        sample = sum(rec.window_rates) / len(rec.window_rates)
        rec.samples.append((rec.current, sample))
        rec.windows_done += 1
        rec.window_start_s, rec.window_rates = now_s, []
        base = self._baseline(job, rec)
        too_slow = (
            base is not None
            and rec.current < job.allocated_cores
            and sample < (1.0 - p.max_slowdown) * base
        )
        if too_slow:
            assert base is not None
            rec.floor = self._raised_floor(job, rec.current, sample, base)
            out.events.append(
                Event(
                    job.job_id,
                    "probe-cut",
                    f"{rec.current} cores ran at {sample / base:.0%} of the allocation's "
                    f"rate, below the {1 - p.max_slowdown:.0%} allowed; nothing below "
                    f"{rec.floor} cores is tried",
                    {"cores": rec.current, "rate": sample, "baseline": base},
                )
            )
        if too_slow or rec.windows_done >= p.windows:
            rec.probes += 1
            self._next(now_s, job, rec, out)

    def _baseline(self, job: ProbeJob, rec: ProbeRecord) -> float | None:
        full = [r for c, r in rec.samples if c == job.allocated_cores]
        return sum(full) / len(full) if full else None

    def _raised_floor(self, job: ProbeJob, cores: int, rate: float, base: float) -> int:
        """The fewest cores a job that ran at ``rate`` on ``cores`` might need to stay within
        the allowed slowdown, if its rate grew in proportion to cores. For the model's
        ``P0 log C + P1 C`` that is a lower bound only where rate/cores falls with C, i.e.
        from e ≈ 2.7 cores on; from a 1- or 2-core probe (log C near 0) the guess can
        overshoot, so it never reaches the allocation then: one count below it stays open
        (else a small allocation's curve would be published from two counts only)."""
        wanted = (1.0 - self.params.max_slowdown) * base
        guess = math.ceil(cores * wanted / max(rate, 1e-12))
        top = job.allocated_cores if cores >= 3 else job.allocated_cores - 1
        return min(job.allocated_cores, max(cores + 1, min(guess, top)))

    def _next(self, now_s: float, job: ProbeJob, rec: ProbeRecord, out: AllocatorOutput) -> None:
        """Pick and start the next probe, or finish."""
        p = self.params
        rec.result = self._estimate(job, rec)
        done_why = None
        confirm = None
        r = rec.result
        if r is not None and r.confidence >= p.min_confidence:
            done_why = f"sweet spot {r.cores} cores at confidence {r.confidence:.2f}"
            measured = {c for c, _ in rec.samples}
            if r.cores not in measured and r.cores < job.allocated_cores:
                # Confident, but only through the model: measure the answer itself before
                # publishing it (a knee between two probes can fool the fit by a core).
                done_why, confirm = None, r.cores
        if done_why is None and rec.probes >= p.max_probes:
            done_why = f"probe limit reached ({p.max_probes} probes)"
        elif done_why is None and rec.below_s + p.settle_s + p.measure_s > p.budget_s:
            done_why = (
                f"time budget spent ({rec.below_s:.0f} s of {p.budget_s:.0f} s "
                "below the allocation)"
            )
        nxt = confirm
        if done_why is None and nxt is None:
            try:
                nxt = next_probe(
                    rec.samples,
                    max_cores=job.allocated_cores,
                    min_cores=min(rec.floor, job.allocated_cores),
                    plateau_fraction=p.plateau_fraction,
                    confident_at=p.min_confidence,
                )
            except ModelError as exc:
                done_why = f"no further probe: {exc}"
            if nxt is None and done_why is None:
                done_why = "every core count in range has been measured"
        if done_why is not None:
            self._finish(job, rec, done_why, out)
            return
        assert nxt is not None
        rec.state, rec.why = "probing", f"measuring {nxt} of {job.allocated_cores} cores"
        from_full = rec.current is None and nxt == job.allocated_cores
        if rec.current != nxt and not from_full:
            rec.since_s = now_s
            out.events.append(
                Event(
                    job.job_id,
                    "probe",
                    (
                        f"confirming the predicted sweet spot of {nxt} cores"
                        if nxt == confirm
                        else f"experiment design picks {nxt} cores"
                    )
                    + f" (probe {rec.probes + 1})",
                    {"cores": nxt, "allocated": job.allocated_cores},
                )
            )
        else:
            rec.since_s = now_s - p.settle_s  # the job already runs at this count: settled
        rec.current = nxt
        rec.window_start_s, rec.window_rates, rec.windows_done = None, [], 0

    def _estimate(self, job: ProbeJob, rec: ProbeRecord) -> SweetSpot | None:
        if len({c for c, _ in rec.samples}) < 2:
            return None
        try:
            return estimate_sweet_spot(
                [c for c, _ in rec.samples],
                [r for _, r in rec.samples],
                plateau_fraction=self.params.plateau_fraction,
                min_cores=min(c for c, _ in rec.samples),
                max_cores=job.allocated_cores,
            )
        except InconsistentSamples:
            return None
        except ModelError:
            return None

    def _finish(self, job: ProbeJob, rec: ProbeRecord, why: str, out: AllocatorOutput) -> None:
        rec.state, rec.why, rec.current = "done", why, None
        result = rec.result
        out.events.append(
            Event(
                job.job_id,
                "probe-done",
                why,
                {
                    "probes": rec.probes,
                    "below_allocation_s": round(rec.below_s, 1),
                    "sweet_spot_cores": result.cores if result else None,
                    "confidence": round(result.confidence, 3) if result else None,
                },
            )
        )
        if job.signature is None or not rec.samples:
            return
        plateau = (
            result.plateau_throughput if result is not None else max(r for _, r in rec.samples)
        )
        if plateau <= 0:
            return
        samples = tuple((c, 100.0 * r / plateau) for c, r in rec.samples)
        out.publish.append(Publish(job.job_id, job.signature, job.gpus, samples, result))
