"""coda_node.policy.allocator: probing a DNN job's cores inside its allocation, tick by tick.

The end-to-end cases drive :class:`JobSignal` and :class:`Allocator` together as the daemon
does (hold the level while a probe runs), with the job's rate from the modelled curve
(:func:`coda_common.model.curves.throughput_curve`) plus 3 % noise, on 1-s ticks. Time is passed
in; nothing sleeps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from coda_common.model.curves import REFERENCE_WORKLOADS, cores_for_fraction, throughput_curve
from coda_node.policy.allocator import Allocator, AllocatorOutput, Event, ProbeJob, ProbeParams
from coda_node.policy.observe import JobSignal, Progress, Reading, SignalParams

FAST = ProbeParams(settle_s=5.0, measure_s=9.0)
WARMUP_S = 3.0


def training(rate: float = 100.0, phase: str = "train") -> Progress:
    return Progress(rate=rate, source="iterations", phase=phase, age_s=1000.0, level=100.0)


def job(
    job_id: int = 1,
    *,
    progress: Progress | None = None,
    signature: str | None = "sig-a",
    gpus: int = 1,
    allocated_cores: int = 24,
    single_node: bool = True,
    profile_confident: bool = False,
    blocked: str | None = None,
) -> ProbeJob:
    return ProbeJob(
        job_id=job_id,
        signature=signature,
        gpus=gpus,
        allocated_cores=allocated_cores,
        single_node=single_node,
        progress=progress or training(),
        profile_confident=profile_confident,
        blocked=blocked,
    )


@dataclass
class Sim:
    """Jobs on one node, each with a rate at every core count; one tick per second."""

    allocator: Allocator
    rate_of: dict[int, Callable[[int], float]]
    allocated: dict[int, int]
    phase_of: Callable[[int, float], str | None] = lambda job_id, now_s: None
    noise: float = 0.03
    seed: int = 0
    t: float = 0.0
    signals: dict[int, JobSignal] = field(default_factory=dict)
    counts: dict[int, float] = field(default_factory=dict)
    cores: dict[int, int] = field(default_factory=dict)
    outs: list[tuple[float, AllocatorOutput]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        for job_id in self.rate_of:
            self.signals[job_id] = JobSignal(0.0, SignalParams(warmup_s=WARMUP_S))
            self.counts[job_id] = 0.0
            self.cores[job_id] = self.allocated[job_id]

    def tick(self, jobs: set[int] | None = None) -> AllocatorOutput:
        now = self.t
        probe_jobs = {}
        for job_id in sorted(self.rate_of if jobs is None else jobs):
            rate = self.rate_of[job_id](self.cores[job_id])
            rate *= 1.0 + self.noise * float(self.rng.standard_normal())
            self.counts[job_id] += max(0.0, rate)
            rec = self.allocator.records.get(job_id)
            prog = self.signals[job_id].update(
                Reading(
                    now_s=now,
                    iterations=self.counts[job_id],
                    iterations_written_s=now,
                    reported_phase=self.phase_of(job_id, now),
                ),
                hold_level=rec is not None and rec.state == "probing",
            )
            probe_jobs[job_id] = job(job_id, progress=prog, allocated_cores=self.allocated[job_id])
        out = self.allocator.step(now, probe_jobs)
        for job_id in probe_jobs:
            self.cores[job_id] = out.cores.get(job_id, self.allocated[job_id])
        self.outs.append((now, out))
        self.t += 1.0
        return out

    def run_until_done(self, job_id: int = 1, limit_s: float = 2000.0) -> None:
        while self.t < limit_s:
            self.tick()
            rec = self.allocator.records.get(job_id)
            if rec is not None and rec.state in ("done", "skipped"):
                return
        raise AssertionError(f"job {job_id} still {self.allocator.records[job_id].state}")

    def events(self, action: str | None = None) -> list[tuple[float, Event]]:
        return [(t, e) for t, out in self.outs for e in out.events if action in (None, e.action)]

    def publishes(self):
        return [p for _, out in self.outs for p in out.publish]


def curve(sweet_spot: float, peak: float = 100.0) -> Callable[[int], float]:
    return lambda cores: float(throughput_curve(sweet_spot, np.array([cores]), peak=peak)[0])


def sim1(sweet_spot: float, *, params: ProbeParams = FAST, seed: int = 0, **kw) -> Sim:
    return Sim(Allocator(params), {1: curve(sweet_spot)}, {1: 24}, seed=seed, **kw)


# -- the sweet spot of the reference workloads ----------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("workload", REFERENCE_WORKLOADS, ids=lambda w: w.name)
def test_reference_workload_sweet_spot_within_one_core(workload, seed: int) -> None:
    sim = sim1(workload.sweet_spot_cores, seed=seed)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    truth = cores_for_fraction(workload.sweet_spot_cores, max_cores=24, fraction=0.95)
    assert rec.state == "done"
    assert rec.result is not None, rec.why
    assert abs(rec.result.cores - truth) <= 1, (rec.result, truth, rec.samples)
    assert rec.result.confidence >= FAST.min_confidence
    assert "sweet spot" in rec.why
    assert rec.probes <= FAST.max_probes
    assert rec.below_s <= FAST.budget_s
    # Done: the job has its whole allocation back, and the samples are published.
    assert sim.outs[-1][1].cores == {}
    [pub] = sim.publishes()
    assert pub.signature == "sig-a" and pub.gpus == 1 and pub.result == rec.result
    assert max(r for _, r in pub.samples) == pytest.approx(100.0, rel=0.15)


def test_never_probes_outside_the_allocation() -> None:
    sim = sim1(11)
    sim.run_until_done()
    targets = [c for _, out in sim.outs for c in out.cores.values()]
    assert targets and all(1 <= c < 24 for c in targets)
    assert all(1 <= c <= 24 for c, _ in sim.allocator.records[1].samples)


def test_first_probe_is_the_whole_allocation_without_settle() -> None:
    sim = sim1(11)
    while sim.allocator.records.get(1) is None or sim.allocator.records[1].state != "probing":
        out = sim.tick()
        assert out.cores == {}
    start = sim.t - 1.0
    rec = sim.allocator.records[1]
    # Not during warm-up; the first probe is the allocation: no cpuset change, no "probe" event.
    assert start >= WARMUP_S
    assert rec.current == 24
    assert sim.outs[-1][1].cores == {}
    assert sim.events("probe") == []
    # No settle: the first sample comes one window after the start, before settle_s is over.
    while not rec.samples:
        assert sim.tick().cores == {}
    assert rec.samples[0][0] == 24
    assert sim.t - 1.0 - start <= 1.0 + FAST.measure_s / FAST.windows < FAST.settle_s
    # The next probe does change the cpuset, and announces it.
    sim.run_until_done()
    first_probe = sim.events("probe")[0][1]
    assert first_probe.reading["cores"] < 24


# -- pauses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "progress",
    [
        training(phase="warmup"),
        training(phase="val"),
        training(phase="checkpoint"),
        training(phase="paused"),
        Progress(rate=None, source="iterations", phase="no-signal", age_s=1000.0, level=100.0),
    ],
    ids=lambda p: p.phase,
)
def test_not_training_pauses_a_running_probe_and_it_resumes(progress: Progress) -> None:
    al = Allocator(FAST)
    t = 0.0
    # Baseline, then a probe below the allocation.
    while al.step(t, {1: job()}).cores == {}:
        t += 1.0
        assert t < 100
    probing_at = al.records[1].current
    assert probing_at is not None and probing_at < 24
    t += 1.0
    out = al.step(t, {1: job(progress=progress)})
    assert out.cores == {}  # back to the whole allocation at once
    [ev] = out.events
    assert ev.action == "probe-paused" and progress.phase in ev.rule
    rec = al.records[1]
    assert rec.state == "waiting" and progress.phase in rec.why
    for _ in range(20):  # stays at its allocation while not training
        t += 1.0
        assert al.step(t, {1: job(progress=progress)}).cores == {}
    t += 1.0
    out = al.step(t, {1: job()})
    assert out.cores == {1: probing_at}  # resumed where it was
    assert rec.state == "probing"
    # The paused probe's partial window was thrown away: only the baseline is kept.
    assert {c for c, _ in rec.samples} == {24}


def test_reported_val_phase_pauses_a_running_probe_end_to_end() -> None:
    # The job reports "val" from t=25 to t=40, when the first probe below 24 cores runs.
    sim = sim1(11, phase_of=lambda job_id, now_s: "val" if 25 <= now_s < 40 else None)
    sim.run_until_done()
    for t, out in sim.outs:
        if 25 <= t < 40:
            assert out.cores == {}, t
    [(paused_t, paused)] = sim.events("probe-paused")
    assert paused_t == 25.0 and "val" in paused.rule
    was = paused.reading["cores"]
    assert was < 24 and dict(sim.outs[24][1].cores) == {1: was}
    # Resumed once training again, at the count it had to abandon.
    assert sim.outs[40][1].cores == {1: was}
    rec = sim.allocator.records[1]
    assert rec.result is not None and rec.result.confidence >= FAST.min_confidence


def test_no_probe_during_warmup() -> None:
    sim = sim1(11)
    for _ in range(int(WARMUP_S)):
        out = sim.tick()
        assert out.cores == {}
        assert sim.allocator.records[1].state == "waiting"


@pytest.mark.parametrize("blocked", ["CPU job 7 on its socket is throttled (contention)"])
def test_blocked_job_is_not_probed_and_a_probe_pauses(blocked: str) -> None:
    al = Allocator(FAST)
    for t in range(30):
        assert al.step(float(t), {1: job(blocked=blocked)}).cores == {}
    assert al.records[1].state == "waiting"
    t = 30.0
    while al.step(t, {1: job()}).cores == {}:
        t += 1.0
    out = al.step(t + 1, {1: job(blocked=blocked)})
    assert out.cores == {}
    assert out.events[0].action == "probe-paused" and blocked in out.events[0].rule


# -- cost bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize("budget_s", [15.0, 30.0, 45.0])
def test_budget_ends_profiling(budget_s: float) -> None:
    params = ProbeParams(settle_s=5.0, measure_s=9.0, budget_s=budget_s, min_confidence=1.0)
    sim = sim1(11, params=params)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    assert rec.state == "done"
    assert "budget" in rec.why
    assert rec.below_s <= budget_s
    [(_, done)] = sim.events("probe-done")
    assert "budget" in done.rule
    assert sim.outs[-1][1].cores == {}


@pytest.mark.parametrize("max_probes", [2, 3, 4])
def test_max_probes_ends_profiling(max_probes: int) -> None:
    params = ProbeParams(settle_s=5.0, measure_s=9.0, max_probes=max_probes, min_confidence=1.0)
    sim = sim1(11, params=params)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    assert rec.state == "done"
    assert rec.probes == max_probes
    assert f"probe limit reached ({max_probes} probes)" in rec.why
    assert len({c for c, _ in rec.samples}) == max_probes
    assert sim.outs[-1][1].cores == {}


@pytest.mark.parametrize("sweet_spot", [20, 22])
def test_max_slowdown_cuts_a_probe_and_raises_the_floor(sweet_spot: int) -> None:
    sim = sim1(sweet_spot)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    cuts = sim.events("probe-cut")
    assert cuts, "1 core of a 20-core job runs far below half the allocation's rate"
    first_cut_t, cut = cuts[0]
    cut_cores = cut.reading["cores"]
    assert cut.reading["rate"] < (1.0 - FAST.max_slowdown) * cut.reading["baseline"]
    # Cut after the first window, not after the whole measurement.
    assert sum(1 for c, _ in rec.samples if c == cut_cores) == 1
    assert rec.floor > cut_cores
    # Nothing at or below the cut count is probed afterwards.
    later = [c for t, out in sim.outs if t > first_cut_t for c in out.cores.values()]
    assert later and min(later) > cut_cores
    floors = [int(e.rule.split("nothing below ")[1].split()[0]) for _, e in cuts]
    assert all(c >= floors[0] for t, out in sim.outs if t > first_cut_t for c in out.cores.values())
    assert rec.result is not None


def test_max_jobs_one_probes_one_job_at_a_time() -> None:
    al = Allocator(FAST)
    sim = Sim(al, {1: curve(8), 2: curve(3)}, {1: 24, 2: 16})
    while al.records.get(1) is None or al.records[1].state != "done":
        out = sim.tick()
        assert 2 not in out.cores
        if 1 in al.records and al.records[1].state == "probing":
            assert al.records[2].state == "waiting"
        assert sum(1 for r in al.records.values() if r.state == "probing") <= 1
        assert sim.t < 500
    sim.run_until_done(2)
    assert al.records[2].state == "done"
    assert any(2 in out.cores for _, out in sim.outs)
    assert {p.job_id for p in sim.publishes()} == {1, 2}


def test_max_jobs_two_probes_both() -> None:
    al = Allocator(ProbeParams(settle_s=5.0, measure_s=9.0, max_jobs=2))
    sim = Sim(al, {1: curve(8), 2: curve(3)}, {1: 24, 2: 16})
    for _ in range(20):
        sim.tick()
    assert al.records[1].state == al.records[2].state == "probing"


# -- who is not probed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "state", "why"),
    [
        ({"signature": None}, "skipped", "no workload signature"),
        ({"single_node": False}, "skipped", "multi-node"),
        ({"profile_confident": True}, "done", "confident profile"),
        ({"gpus": 4, "allocated_cores": 4}, "skipped", "nothing smaller to try"),
        ({"gpus": 2, "allocated_cores": 1}, "skipped", "nothing smaller to try"),
        ({"gpus": 1, "allocated_cores": 1}, "skipped", "nothing smaller to try"),
    ],
)
def test_jobs_not_probed(kw: dict, state: str, why: str) -> None:
    al = Allocator(FAST)
    for t in range(60):
        out = al.step(float(t), {1: job(**kw)})
        assert out.cores == {} and out.publish == []
    rec = al.records[1]
    assert rec.state == state
    assert why in rec.why
    assert rec.samples == []


def test_profiling_off_skips() -> None:
    al = Allocator(ProbeParams(enabled=False))
    out = al.step(0.0, {1: job()})
    assert out.cores == {}
    assert al.records[1].state == "skipped" and "off" in al.records[1].why


def test_a_skipped_job_does_not_hold_the_probe_slot() -> None:
    al = Allocator(FAST)
    jobs = {1: job(1, signature=None), 2: job(2)}
    al.step(0.0, jobs)
    assert al.records[1].state == "skipped"
    assert al.records[2].state == "probing"


# -- small allocations, publishing, forgetting -----------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_cores_equally_fast_on_one_gives_one(seed: int) -> None:
    sim = Sim(Allocator(FAST), {1: lambda cores: 250.0}, {1: 2}, seed=seed)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    assert rec.state == "done"
    assert rec.result is not None
    assert rec.result.cores == 1
    assert rec.result.method == "table"
    assert rec.result.confidence >= FAST.min_confidence
    [pub] = sim.publishes()
    assert {c for c, _ in pub.samples} == {1, 2}
    # Normalised to this run's plateau: ~100, whatever the job's own units (250 it/s).
    assert all(90.0 <= r <= 110.0 for _, r in pub.samples)
    assert np.mean([r for _, r in pub.samples]) == pytest.approx(100.0, abs=3.0)


def test_publish_without_a_result_normalises_to_the_best_sample() -> None:
    params = ProbeParams(settle_s=5.0, measure_s=9.0, max_probes=2, min_confidence=1.0)
    sim = sim1(11, params=params)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    [pub] = sim.publishes()
    assert pub.result is None and rec.result is None
    assert max(r for _, r in pub.samples) == pytest.approx(100.0)
    assert len(pub.samples) == len(rec.samples)


def test_a_job_that_disappears_is_forgotten() -> None:
    al = Allocator(FAST)
    t = 0.0
    while al.step(t, {1: job(), 2: job(2)}).cores == {}:
        t += 1.0
    assert al.records[1].state == "probing"
    # Job 1 ends mid-probe: forgotten, and job 2 may be probed now.
    out = al.step(t + 1, {2: job(2)})
    assert 1 not in al.records
    assert 1 not in out.cores
    assert al.records[2].state == "probing"
    # The same id again (a requeued job) starts from scratch.
    al.step(t + 2, {1: job(), 2: job(2)})
    assert al.records[1].samples == [] and al.records[1].probes == 0


def _end_job_1(sim: Sim) -> AllocatorOutput:
    """Job 1 ends: the next step sees no job 1 and is told it ended."""
    out = sim.allocator.step(sim.t, {}, ended={1})
    sim.outs.append((sim.t, out))
    return out


def test_a_job_that_ends_mid_probe_publishes_what_it_measured() -> None:
    sim = sim1(11)
    _run_until_mid_probe(sim, probes=2)
    rec = sim.allocator.records[1]
    measured = list(rec.samples)
    assert len({c for c, _ in measured}) >= 2
    out = _end_job_1(sim)
    assert 1 not in sim.allocator.records
    [pub] = out.publish
    # Every finished window, as % of this run's plateau, in the order measured; the
    # allocation first, as refit_profile's run_labels expects.
    assert [c for c, _ in pub.samples] == [c for c, _ in measured]
    assert pub.samples[0][0] == 24
    assert max(r for _, r in pub.samples) == pytest.approx(100.0, abs=8.0)
    fast, slow = pub.samples[0][1], min(r for _, r in pub.samples)
    assert slow < 0.8 * fast  # the floor's probe (1 core of an 11-core job) shows the curve
    [(_, ev)] = [(t, e) for t, e in sim.events("probe-ended")]
    assert "publishing the" in ev.rule and ev.job_id == 1


def test_a_job_that_ends_after_one_count_publishes_nothing() -> None:
    sim = sim1(11)
    while not sim.allocator.records.get(1) or not sim.allocator.records[1].samples:
        sim.tick()
    assert {c for c, _ in sim.allocator.records[1].samples} == {24}
    out = _end_job_1(sim)
    assert out.publish == []
    [(_, ev)] = sim.events("probe-ended")
    assert "too early" in ev.rule


def test_a_job_missing_from_one_step_but_not_ended_publishes_nothing() -> None:
    sim = sim1(11)
    _run_until_mid_probe(sim, probes=2)
    out = sim.allocator.step(sim.t, {})
    assert out.publish == [] and out.events == []
    assert 1 not in sim.allocator.records


def test_a_job_that_ended_after_publishing_does_not_publish_again() -> None:
    sim = sim1(11)
    sim.run_until_done()
    assert len(sim.publishes()) == 1
    out = _end_job_1(sim)
    assert out.publish == [] and out.events == []


def test_record_view_is_plain_json() -> None:
    sim = sim1(8)
    sim.run_until_done()
    d = sim.allocator.records[1].to_dict()
    assert d["state"] == "done" and d["sweet_spot_cores"] == sim.allocator.records[1].result.cores
    assert all(isinstance(c, int) and isinstance(r, float) for c, r in d["samples"])


# -- a coda-node restart: the record carries over ------------------------------------------------


def _restart(sim: Sim) -> dict:
    """coda-node dies and starts again a tick later: a new allocator takes the job over from
    the record in the state view (JSON, as the file holds it), with the tick the job ran
    below its allocation after the view was written, and the job runs on its whole
    allocation again."""
    view = json.loads(json.dumps(sim.allocator.records[1].to_dict()))
    left_below = sim.cores[1] < sim.allocated[1]
    sim.allocator = Allocator(sim.allocator.params)
    assert sim.allocator.adopt(1, view, extra_below_s=1.0 if left_below else 0.0)
    sim.cores[1] = sim.allocated[1]
    return view


def _run_until_mid_probe(sim: Sim, probes: int) -> None:
    """Until the job has ``probes`` probes done and is part-way into the next one, below its
    allocation, with a window of it measured."""
    while True:
        sim.tick()
        rec = sim.allocator.records.get(1)
        if (
            rec is not None
            and rec.state == "probing"
            and rec.probes >= probes
            and rec.current is not None
            and rec.current < 24
            and rec.windows_done >= 1
        ):
            return
        assert sim.t < 500, "never reached the middle of a probe"


def _counts_probed(sim: Sim, since_s: float = 0.0) -> list[int]:
    return [e.reading["cores"] for t, e in sim.events("probe") if t >= since_s]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_restart_mid_probe_goes_on_from_the_samples_it_had(seed: int) -> None:
    fresh = sim1(11, seed=seed)
    fresh.run_until_done()
    fresh_rec = fresh.allocator.records[1]

    sim = sim1(11, seed=seed)
    _run_until_mid_probe(sim, probes=2)
    before = sim.allocator.records[1]
    cut_at = before.current
    finished = {c for c, _ in before.samples if c != cut_at}  # whole probes, not the cut one
    below_before = before.below_s
    samples_before = list(before.samples)
    restart_s = sim.t
    _restart(sim)
    rec = sim.allocator.records[1]
    # Between probes: everything measured kept, nothing under way.
    assert (rec.state, rec.current) == ("waiting", None)
    assert rec.samples == samples_before and rec.probes == before.probes
    assert rec.below_s == below_before + 1.0 > 1.0  # and the tick after the last view
    # The next probe starts at once, at a count not measured yet, and serves its settle.
    out = sim.tick()
    assert list(out.cores) == [1]
    assert out.cores[1] not in {c for c, _ in samples_before}
    assert sim.allocator.records[1].since_s == sim.t - 1.0

    sim.run_until_done()
    rec = sim.allocator.records[1]
    after = _counts_probed(sim, restart_s)
    assert not set(after) & finished, (after, samples_before)
    assert 24 not in after  # the baseline is not measured again
    assert rec.samples[: len(samples_before)] == samples_before
    # Fewer probes after the restart than a profile from scratch takes, the same answer.
    assert rec.probes - before.probes < fresh_rec.probes
    assert rec.result is not None and fresh_rec.result is not None
    truth = cores_for_fraction(11, max_cores=24, fraction=0.95)
    assert abs(rec.result.cores - truth) <= 1
    assert rec.below_s >= below_before
    [pub] = sim.publishes()
    assert len(pub.samples) == len(rec.samples)


@pytest.mark.parametrize("budget_s", [30.0, 45.0])
def test_time_below_the_allocation_before_a_restart_counts_against_the_budget(
    budget_s: float,
) -> None:
    params = ProbeParams(settle_s=5.0, measure_s=9.0, budget_s=budget_s, min_confidence=1.0)
    sim = sim1(11, params=params)
    _run_until_mid_probe(sim, probes=1)
    _restart(sim)
    sim.run_until_done()
    rec = sim.allocator.records[1]
    assert "budget" in rec.why
    # What the job lived through, both runs together: seconds on fewer cores than its own.
    below_s = sum(1.0 for _, out in sim.outs if out.cores)
    assert below_s <= budget_s
    assert rec.below_s <= budget_s


def test_without_the_record_a_restart_grants_the_budget_again() -> None:
    """The cost the adoption saves: the same restart with nothing carried over."""
    params = ProbeParams(settle_s=5.0, measure_s=9.0, budget_s=30.0, min_confidence=1.0)
    sim = sim1(11, params=params)
    _run_until_mid_probe(sim, probes=1)
    sim.allocator = Allocator(params)
    sim.cores[1] = 24
    sim.run_until_done()
    below_s = sum(1.0 for _, out in sim.outs if out.cores)
    assert below_s > params.budget_s


def test_a_done_record_stays_done_and_is_not_published_again() -> None:
    sim = sim1(8)
    sim.run_until_done()
    [first] = sim.publishes()
    done = sim.allocator.records[1]
    view = _restart(sim)
    assert view["state"] == "done"
    for _ in range(100):
        assert sim.tick().cores == {}
    rec = sim.allocator.records[1]
    assert rec.state == "done" and rec.why == done.why
    assert rec.probes == done.probes and rec.samples == done.samples
    assert rec.result is not None and done.result is not None
    assert (rec.result.cores, rec.result.confidence) == (
        done.result.cores,
        round(done.result.confidence, 3),
    )
    assert rec.to_dict()["sweet_spot_cores"] == done.result.cores
    assert sim.publishes() == [first]
    assert [e for _, e in sim.events() if e.action.startswith("probe")][-1].action == "probe-done"
    assert sim.events("probe")[-1][0] < sim.t - 100


def test_an_adopted_record_follows_this_runs_admission() -> None:
    al = Allocator(FAST)
    # A workload that became confident meanwhile: no more probing.
    assert al.adopt(1, {"state": "waiting", "samples": [[24, 100.0]], "probes": 1})
    assert al.adopt(2, {"state": "probing", "samples": [[4, 100.0]], "probes": 1})
    out = al.step(0.0, {1: job(profile_confident=True), 2: job(2, gpus=4, allocated_cores=16)})
    assert al.records[1].state == "done" and "confident profile" in al.records[1].why
    # No floor in the view (an older version): never below one core per GPU.
    assert al.records[2].floor == 4
    assert out.cores == {}
    # Profiling off on this run: a probe under way is not resumed; a done one is kept.
    off = Allocator(ProbeParams(enabled=False))
    assert not off.adopt(1, {"state": "probing", "samples": [[24, 100.0]], "probes": 1})
    assert off.adopt(2, {"state": "done", "samples": [], "probes": 0})
    off.step(0.0, {1: job(), 2: job(2)})
    assert off.records[1].state == "skipped" and off.records[2].state == "done"
    # A skipped job is admitted again (its reason may have been this node's configuration).
    assert not al.adopt(3, {"state": "skipped", "why": "online profiling is off"})
    # A job the allocator already knows keeps its own record.
    assert not al.adopt(2, {"state": "done"})


GOOD = {"state": "probing", "samples": [[24, 100.0], [1, 40.0]], "probes": 2, "floor": 1}


@pytest.mark.parametrize(
    "record",
    [
        None,
        [],
        "probing",
        {},
        {**GOOD, "state": "measuring"},
        {**GOOD, "samples": "24:100"},
        {**GOOD, "samples": [[24]]},
        {**GOOD, "samples": [[0, 100.0]]},
        {**GOOD, "samples": [[2.5, 100.0]]},
        {**GOOD, "samples": [[True, 100.0]]},
        {**GOOD, "samples": [[24, -1.0]]},
        {**GOOD, "samples": [[24, math.nan]]},
        {**GOOD, "samples": [[24, "100"]]},
        {**GOOD, "probes": -1},
        {**GOOD, "probes": 1.5},
        {**GOOD, "floor": 0},
        {**GOOD, "below_allocation_s": "10"},
        {**GOOD, "below_allocation_s": math.inf},
        {**GOOD, "why": 3},
        {"state": "done", "sweet_spot_cores": 6, "confidence": None},
        {"state": "done", "sweet_spot_cores": 0, "confidence": 0.9},
    ],
    ids=repr,
)
def test_a_malformed_record_is_not_adopted_and_the_job_is_profiled_afresh(record) -> None:
    al = Allocator(FAST)
    assert not al.adopt(1, record)
    assert 1 not in al.records
    al.step(0.0, {1: job()})
    assert al.records[1].samples == [] and al.records[1].probes == 0
    assert al.adopt(2, GOOD)  # the table's base record itself is fine
