"""The adaptive CPU allocator: learn a DNN job's sweet spot while it runs. Pure.

For a GPU job whose workload has no confident profile, probe core counts *inside its own
allocation*: shrink its cpuset to the count the experiment design picks
(:func:`coda_common.model.fit.next_probe`: the whole allocation first, which is the baseline,
then the fewest cores, then where one measurement best separates the candidate sweet
spots), hold it ``settle_s`` for the data pipeline to reach its new level, measure
``measure_s`` in ``windows`` sub-windows (each a sample, so the noise is measured too), and
stop as soon as :func:`coda_common.model.fit.estimate_sweet_spot` is ``min_confidence`` sure.
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

A job that ends while it is still being profiled publishes what it measured, if that is
two core counts or more (its allocation and at least one count below): the next run of
the workload starts from it instead of from nothing. Short jobs often end before their
probes do (in the simulator, about half of the probed jobs on the Alibaba trace), and
without this every one of their runs would be a first run. The caller says which jobs
ended (``step(..., ended=...)``); a job that is only missing from one tick's jobs (its
record dropped, as before) publishes nothing.

Units: core counts are the job's cores on this node; rates are whatever
:class:`coda_node.policy.observe.Progress` gives (iterations/s or GPU %). Published samples are
normalised to the job's own plateau (100 = the plateau of this run), so runs with other
batch sizes, data sets or GPU proxies of the same workload merge into one curve; a run
given too few cores calls its top 100 too, and :func:`coda_common.model.fit.refit_profile`
puts the runs on one scale. It finds them by the run id the daemon gives each publish
(store format 3); samples from older files have none and are told apart by the order
published here (:func:`coda_common.model.fit.run_labels`): the whole allocation first, then
the floor of one core per GPU, each count in one block, never revisited within a run.
Keep that order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from coda_common.model.fit import (
    InconsistentSamples,
    ModelError,
    SweetSpot,
    estimate_sweet_spot,
    next_probe,
)
from coda_node.policy.observe import Progress


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
        """The record as plain JSON values, for the state view; :meth:`Allocator.adopt`
        reads it back after a restart (so it carries ``floor`` and the exact time below the
        allocation, which a person reading ``coda-node status`` does not need)."""
        return {
            "state": self.state,
            "why": self.why,
            "cores_now": self.current,
            "probes": self.probes,
            "below_allocation_s": self.below_s,
            "samples": [[c, r] for c, r in self.samples],
            "floor": self.floor,
            "sweet_spot_cores": self.result.cores if self.result else None,
            "confidence": round(self.result.confidence, 3) if self.result else None,
            "sweet_spot_method": self.result.method if self.result else None,
            "plateau_rate": self.result.plateau_throughput if self.result else None,
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
        self._readmit: set[int] = set()
        """Adopted jobs whose admission this run has not checked yet (at their first step)."""
        self._last: dict[int, ProbeJob] = {}
        """Each job as the last step saw it: what an ended job's publication needs."""

    def adopt(
        self, job_id: int, record: Mapping[str, object], *, extra_below_s: float = 0.0
    ) -> bool:
        """Take over what a previous coda-node run knew of ``job_id``: its record as
        :meth:`ProbeRecord.to_dict` wrote it into the state view. Without this a restart
        (crash, upgrade, SIGTERM and start) profiles a job half-way through its probes from
        scratch: it pays the probes already made a second time and gets its time budget
        anew. Call it before the job's first :meth:`step`; False (and nothing changes) for a
        job that already has a record or a record this version cannot read, which is then
        profiled afresh.

        * ``done``: stays done, with its sweet spot for the view; never probed or published
          again (:meth:`step` publishes only when probing ends).
        * ``waiting`` / ``probing``: the samples, the probe count, the floor and the time
          already spent below the allocation (it counts against ``budget_s``) are kept; the
          job waits to start its next probe afresh. The interrupted probe's unfinished window
          is dropped (its finished windows are samples); the job runs on its whole
          allocation again (the stopping daemon or the first reconcile put it back). Not
          adopted while profiling is off here: admission says why.
        * ``skipped``: not adopted. The reason was the job's own (admission finds it again
          at once) or this node's configuration, which may have changed since.

        ``extra_below_s``: time the job ran below its allocation after the record was
        written (a daemon that died with a probe applied leaves it so until the next one
        reconciles); it counts against the budget too.
        """
        if job_id in self.records:
            return False
        try:
            rec = _record_from_dict(record)
        except (KeyError, TypeError, ValueError):
            return False
        if rec.state == "skipped" or (rec.state != "done" and not self.params.enabled):
            return False
        if rec.state != "done":
            rec.state, rec.why = "waiting", "resumed after a coda-node restart"
            rec.below_s += max(0.0, extra_below_s)
        self.records[job_id] = rec
        self._readmit.add(job_id)
        return True

    def step(
        self, now_s: float, jobs: Mapping[int, ProbeJob], *, ended: Collection[int] = ()
    ) -> AllocatorOutput:
        """One tick over the node's DNN jobs. ``ended``: jobs that have ended since the last
        step (gone from the node); those still being profiled publish what they measured
        (see the module). Other jobs missing from ``jobs`` are forgotten silently."""
        out = AllocatorOutput()
        for gone in set(self.records) - set(jobs):
            rec = self.records.pop(gone)
            last = self._last.get(gone)
            if gone in ended and last is not None and rec.state in ("probing", "waiting"):
                self._ended(last, rec, out)
        self._last = dict(jobs)
        self._readmit &= set(jobs)
        for job_id in sorted(jobs):
            job = jobs[job_id]
            rec = self.records.get(job_id)
            if rec is None:
                rec = self.records[job_id] = ProbeRecord(floor=max(1, job.gpus))
                self._admit(job, rec)
            elif job_id in self._readmit:
                # Adopted: this run's rules apply (a profile that became confident
                # meanwhile ends the probing), and the floor is never below one core per
                # GPU (a view from a version that did not write it).
                self._readmit.discard(job_id)
                rec.floor = max(rec.floor, job.gpus)
                if rec.state != "done":
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
        return _estimate_samples(rec.samples, job.allocated_cores, self.params)

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
        pub = publication(job, rec.samples, result)
        if pub is not None:
            out.publish.append(pub)

    def _ended(self, job: ProbeJob, rec: ProbeRecord, out: AllocatorOutput) -> None:
        """``job`` ended while it was being profiled: publish what it measured."""
        if not rec.samples:
            return
        pub = ended_publication(job, rec, self.params)
        out.events.append(
            Event(
                job.job_id,
                "probe-ended",
                f"the job ended after {rec.probes} probe(s), "
                + (
                    f"publishing the {len(pub.samples)} samples it measured"
                    if pub is not None
                    else "too early to publish: fewer than two core counts measured"
                ),
                {"probes": rec.probes, "samples": len(rec.samples)},
            )
        )
        if pub is not None:
            out.publish.append(pub)


def publication(
    job: ProbeJob, samples: list[tuple[int, float]], result: SweetSpot | None
) -> Publish | None:
    """What a run that measured ``samples`` (rates) publishes: each as % of the run's plateau
    (``result``'s, else its fastest sample); None without a signature or samples."""
    if job.signature is None or not samples:
        return None
    plateau = result.plateau_throughput if result is not None else max(r for _, r in samples)
    if plateau <= 0:
        return None
    scaled = tuple((c, 100.0 * r / plateau) for c, r in samples)
    return Publish(job.job_id, job.signature, job.gpus, scaled, result)


def ended_publication(job: ProbeJob, rec: ProbeRecord, params: ProbeParams) -> Publish | None:
    """What a job that ended while being profiled publishes: the samples of its finished
    windows (the unfinished one is dropped), when they cover two core counts or more; one
    count alone says nothing about the curve. Pure: the simulator asks it at every sample."""
    if job.signature is None or len({c for c, _ in rec.samples}) < 2:
        return None
    result = _estimate_samples(rec.samples, job.allocated_cores, params)
    return publication(job, rec.samples, result)


def _estimate_samples(
    samples: list[tuple[int, float]], allocated_cores: int, params: ProbeParams
) -> SweetSpot | None:
    if len({c for c, _ in samples}) < 2:
        return None
    try:
        return estimate_sweet_spot(
            [c for c, _ in samples],
            [r for _, r in samples],
            plateau_fraction=params.plateau_fraction,
            min_cores=min(c for c, _ in samples),
            max_cores=allocated_cores,
        )
    except (InconsistentSamples, ModelError):
        return None


def _record_from_dict(d: Mapping[str, object]) -> ProbeRecord:
    """A :class:`ProbeRecord` from :meth:`ProbeRecord.to_dict`'s JSON, between probes (no
    current count, no window under way). Raises KeyError, TypeError or ValueError for
    anything it cannot have written."""
    state = d["state"]
    if not isinstance(state, str) or state not in ("waiting", "probing", "done", "skipped"):
        raise ValueError(f"unknown state {state!r}")
    why = d.get("why") or ""
    if not isinstance(why, str):
        raise TypeError("why is not a string")
    samples = []
    raw_samples = d.get("samples") or []
    if not isinstance(raw_samples, list):
        raise TypeError("samples is not a list")
    for pair in raw_samples:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ValueError(f"sample {pair!r} is not a (cores, rate) pair")
        samples.append((_count(pair[0], 1), _number(pair[1])))
    result = None
    spot = d.get("sweet_spot_cores")
    if state == "done" and spot is not None:
        method = d.get("sweet_spot_method") or "fit"
        if not isinstance(method, str):
            raise TypeError("sweet_spot_method is not a string")
        plateau = d.get("plateau_rate")
        # The fit itself is not in the view; a done record only shows its sweet spot.
        result = SweetSpot(
            cores=_count(spot, 1),
            confidence=_number(d["confidence"]),
            method=method,
            plateau_throughput=(
                _number(plateau)
                if plateau is not None
                else max((r for _, r in samples), default=0.0)
            ),
            fit=None,
        )
    return ProbeRecord(
        state=state,
        why=why,
        samples=samples,
        below_s=_number(d.get("below_allocation_s", 0.0)),
        probes=_count(d.get("probes", 0), 0),
        floor=_count(d.get("floor", 1), 1),
        result=result,
    )


def _count(value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not a whole number")
    if value < least:
        raise ValueError(f"{value} is below {least}")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value} is not a finite number >= 0")
    return float(value)
