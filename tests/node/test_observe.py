"""coda_node.policy.observe: per-tick readings of one job into Progress (rate, phase, level).

Table-driven over scripted tick sequences; time comes in with the readings, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from coda_node.policy.observe import JobSignal, Progress, Reading, SignalParams

# No warm-up unless a test is about it, so phases are "train" from the first tick.
NO_WARMUP = SignalParams(warmup_s=0.0)


def it(now_s: float, count: float, written_s: float | None = None, phase: str | None = None):
    """An iterations reading read at ``now_s``, written by the job at ``written_s``."""
    return Reading(
        now_s=now_s,
        iterations=count,
        iterations_written_s=now_s if written_s is None else written_s,
        reported_phase=phase,
    )


def gpu(now_s: float, util: float, phase: str | None = None) -> Reading:
    return Reading(now_s=now_s, gpu_util_pct=util, reported_phase=phase)


def feed(
    readings: list[Reading], params: SignalParams = NO_WARMUP, *, hold: set[int] = frozenset()
) -> tuple[JobSignal, list[Progress]]:
    sig = JobSignal(0.0, params)
    out = [sig.update(r, hold_level=i in hold) for i, r in enumerate(readings)]
    return sig, out


def steady(n: int, rate: float = 100.0, start_s: float = 0.0) -> list[Reading]:
    """``n`` 1-s ticks of a job making ``rate`` iterations/s, written as it is read."""
    return [it(start_s + i, rate * (start_s + i)) for i in range(n)]


# -- rate from iterations -------------------------------------------------------------------


@dataclass(frozen=True)
class RateCase:
    name: str
    readings: list[Reading]
    rates: list[float | None]


RATE_CASES = [
    RateCase(
        "read as written",
        [it(0, 0), it(1, 100), it(2, 200)],
        [None, 100.0, 100.0],
    ),
    RateCase(
        # Written at t=0,1,2, read whenever the daemon got round to it: the rate is the job's.
        "uneven reads",
        [it(0.1, 0, 0.0), it(1.9, 100, 1.0), it(2.2, 200, 2.0)],
        [None, 100.0, 100.0],
    ),
    RateCase(
        "uneven reads with a repeat of the same count",
        [it(0.4, 0, 0.0), it(1.05, 100, 1.0), it(1.6, 100, 1.0), it(2.95, 200, 2.0)],
        [None, 100.0, 100.0, 100.0],
    ),
    RateCase(
        "late read of two writes' worth",
        [it(0.0, 0, 0.0), it(1.0, 100, 1.0), it(3.5, 300, 3.0)],
        [None, 100.0, 100.0],
    ),
    RateCase(
        "counter backwards is a restart: no rate that tick, then a fresh rate",
        [it(0, 0), it(1, 100), it(2, 200), it(3, 50), it(4, 100), it(5, 150)],
        [None, 100.0, 100.0, None, 50.0, 50.0],
    ),
    RateCase(
        "restart to zero",
        [it(0, 500), it(1, 600), it(2, 0), it(3, 100)],
        [None, 100.0, None, 100.0],
    ),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=lambda c: c.name)
def test_rate_from_iterations_uses_write_times(case: RateCase) -> None:
    _, progress = feed(case.readings)
    assert [p.rate for p in progress] == pytest.approx(case.rates)
    assert all(p.source == "iterations" for p in progress)


def test_restart_tick_is_not_training() -> None:
    _, progress = feed([it(0, 0), it(1, 100), it(2, 200), it(3, 50)])
    assert progress[3].rate is None
    assert not progress[3].training


@pytest.mark.parametrize("stall_s", [3.0, 5.0, 10.0])
def test_count_unchanged_for_stall_s_is_rate_zero_and_paused(stall_s: float) -> None:
    params = SignalParams(warmup_s=0.0, stall_s=stall_s)
    # 10 s at 100/s, then the count stops at 1000 (last written at t=10).
    readings = steady(11) + [it(t, 1000.0, 10.0) for t in range(11, 40)]
    _, progress = feed(readings, params)
    first_zero = next(i for i, p in enumerate(progress) if p.rate == 0.0)
    # The last rate holds while the count may merely not have been rewritten yet ...
    assert all(p.rate == pytest.approx(100.0) for p in progress[1:first_zero])
    # ... and it is zero once the count has been still for stall_s (read at 1-s ticks).
    assert 10.0 + stall_s <= first_zero <= 11.0 + stall_s
    assert all(p.rate == 0.0 and p.phase == "paused" for p in progress[first_zero:])


def test_stall_then_resume_trains_again() -> None:
    params = SignalParams(warmup_s=0.0, stall_s=5.0)
    readings = steady(11) + [it(t, 1000.0, 10.0) for t in range(11, 20)]
    readings += [it(t, 1000.0 + 100.0 * (t - 20), float(t)) for t in range(20, 30)]
    _, progress = feed(readings, params)
    assert progress[19].phase == "paused"
    assert [p.phase for p in progress[22:]] == ["train"] * 8
    assert progress[-1].rate == pytest.approx(100.0)


# -- phases ------------------------------------------------------------------------------------


@pytest.mark.parametrize("warmup_s", [5.0, 30.0])
def test_warmup_for_the_first_warmup_s(warmup_s: float) -> None:
    n = int(warmup_s) + 10
    _sig, progress = feed(steady(n), SignalParams(warmup_s=warmup_s))
    for i, p in enumerate(progress):
        assert p.age_s == pytest.approx(i)
        assert p.phase == ("warmup" if i < warmup_s else "train")
        assert p.training == (i >= warmup_s)
    # Warm-up rates are not the job's level: none before the first training tick.
    assert progress[int(warmup_s)].level is None
    assert progress[int(warmup_s) + 1].level == pytest.approx(100.0)


def test_warmup_counts_from_first_seen() -> None:
    sig = JobSignal(1000.0, SignalParams(warmup_s=10.0))
    assert sig.update(it(1005.0, 0)).phase == "warmup"
    assert sig.update(it(1009.0, 400)).phase == "warmup"
    assert sig.update(it(1010.0, 500)).phase == "train"


@pytest.mark.parametrize(
    ("reported", "phase"),
    [
        ("val", "val"),
        ("validation", "validation"),
        ("eval", "eval"),
        ("checkpoint", "checkpoint"),
        ("ckpt", "ckpt"),
        ("save", "save"),
        ("VAL", "val"),
        ("Checkpoint", "checkpoint"),
        ("train", "train"),
        ("", "train"),
        (None, "train"),
    ],
)
@pytest.mark.parametrize("source", ["iterations", "gpu_util"])
def test_reported_phase(reported: str | None, phase: str, source: str) -> None:
    if source == "iterations":
        readings = [*steady(5), it(5, 500, phase=reported)]
    else:
        readings = [gpu(t, 90.0) for t in range(5)] + [gpu(5, 90.0, phase=reported)]
    _sig, progress = feed(readings)
    assert progress[-1].phase == phase
    assert progress[-1].training == (phase == "train")


def test_reported_phase_rates_stay_out_of_the_level() -> None:
    # A validation pass runs at a quarter of the training rate; it must not drag the level.
    readings = steady(10) + [it(t, 900 + 25.0 * (t - 9), phase="val") for t in range(10, 50)]
    readings.append(it(50, 900 + 25.0 * 41 + 100.0))
    _sig, progress = feed(readings)
    assert all(p.phase == "val" for p in progress[10:50])
    assert progress[-1].level == pytest.approx(100.0)


def test_reported_phase_does_not_cut_warmup_short() -> None:
    _, progress = feed([it(0, 0, phase="val"), it(1, 100, phase="val")], SignalParams())
    assert [p.phase for p in progress] == ["warmup", "warmup"]


# -- gpu_util source -----------------------------------------------------------------------------


def test_gpu_util_source_when_no_iterations() -> None:
    _, progress = feed([gpu(t, 80.0 + t) for t in range(4)])
    assert [p.source for p in progress] == ["gpu_util"] * 4
    assert [p.rate for p in progress] == [80.0, 81.0, 82.0, 83.0]
    assert all(p.phase == "train" for p in progress)


def test_iterations_win_over_gpu_util() -> None:
    readings = [
        Reading(now_s=t, iterations=100.0 * t, iterations_written_s=t, gpu_util_pct=40.0)
        for t in range(3)
    ]
    _, progress = feed(readings)
    assert [p.source for p in progress] == ["iterations"] * 3
    assert progress[-1].rate == pytest.approx(100.0)


def test_no_source_is_no_signal() -> None:
    _, progress = feed([Reading(now_s=t) for t in range(3)])
    assert all(p.phase == "no-signal" and p.source is None for p in progress)
    assert not any(p.training for p in progress)


IDLE = SignalParams(warmup_s=10.0, gpu_idle_after_s=20.0, gpu_idle_pct=5.0)


@dataclass(frozen=True)
class IdleCase:
    name: str
    utils: list[float]
    phases: dict[int, str]
    """tick -> expected phase (1-s ticks from t=0)."""


IDLE_CASES = [
    IdleCase(
        "never busy: gpu-idle after warm-up + gpu_idle_after_s",
        [0.0] * 40,
        {0: "warmup", 9: "warmup", 10: "paused", 29: "paused", 30: "gpu-idle", 39: "gpu-idle"},
    ),
    IdleCase(
        "never busy, just under the idle line",
        [4.9] * 40,
        {10: "paused", 30: "gpu-idle"},
    ),
    IdleCase(
        "busy during warm-up, then idles: paused, never gpu-idle",
        [90.0] * 5 + [0.0] * 60,
        {4: "warmup", 10: "paused", 30: "paused", 64: "paused"},
    ),
    IdleCase(
        "busy after warm-up, then idles: paused, never gpu-idle",
        [0.0] * 15 + [90.0] * 5 + [0.0] * 60,
        {12: "paused", 15: "train", 20: "paused", 40: "paused", 79: "paused"},
    ),
]


@pytest.mark.parametrize("case", IDLE_CASES, ids=lambda c: c.name)
def test_gpu_idle(case: IdleCase) -> None:
    _, progress = feed([gpu(t, u) for t, u in enumerate(case.utils)], IDLE)
    for tick, phase in case.phases.items():
        assert progress[tick].phase == phase, f"tick {tick}"
    assert not any(p.training for p, u in zip(progress, case.utils, strict=True) if u < 5.0)


# -- pauses and the level ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "phase"),
    [(100.0, "train"), (50.0, "train"), (21.0, "train"), (19.0, "paused"), (0.5, "paused")],
)
def test_rate_below_pause_fraction_of_level_is_paused(rate: float, phase: str) -> None:
    # Level 100/s from 20 training ticks, then one tick at ``rate`` (pause_fraction 0.2).
    readings = [*steady(21), it(21, 2000.0 + rate)]
    _sig, progress = feed(readings)
    assert progress[-1].level == pytest.approx(100.0)
    assert progress[-1].rate == pytest.approx(rate)
    assert progress[-1].phase == phase


def test_paused_rates_do_not_become_the_level() -> None:
    readings = steady(21) + [it(t, 2000.0 + 10.0 * (t - 20), float(t)) for t in range(21, 100)]
    readings.append(it(100, 2000.0 + 10.0 * 80 + 100.0))
    _, progress = feed(readings)
    assert all(p.phase == "paused" for p in progress[21:100])
    assert progress[-1].level == pytest.approx(100.0)


@dataclass(frozen=True)
class HoldCase:
    name: str
    probe_rate: float


HOLD_CASES = [
    HoldCase("probe at half rate", 50.0),
    HoldCase("probe far below the pause line", 10.0),
    HoldCase("probe above the level", 130.0),
]


@pytest.mark.parametrize("case", HOLD_CASES, ids=lambda c: c.name)
def test_hold_level_keeps_probe_rates_out_of_the_level(case: HoldCase) -> None:
    # 20 training ticks at 100/s, 200 probe ticks (more than `history`), then training again.
    readings = steady(21)
    count = 2000.0
    for t in range(21, 221):
        count += case.probe_rate
        readings.append(it(t, count))
    readings.append(it(221, count + 100.0))
    hold = set(range(21, 221))
    _, progress = feed(readings, hold=hold)
    for p in progress[22:221]:
        assert p.rate == pytest.approx(case.probe_rate)
        assert p.level == pytest.approx(100.0)
        # A probe's low rate is on purpose: not a pause.
        assert p.phase == "train"
    assert progress[-1].level == pytest.approx(100.0)


def test_without_hold_level_probe_rates_would_move_the_level() -> None:
    # The control for the test above: the same rates, not held, do become the level.
    readings = steady(21)
    count = 2000.0
    for t in range(21, 221):
        count += 50.0
        readings.append(it(t, count))
    _, progress = feed(readings)
    assert progress[-1].level == pytest.approx(50.0)


def test_level_is_the_median_of_recent_training_rates() -> None:
    params = SignalParams(warmup_s=0.0, history=5)
    counts = [0, 100, 200, 300, 400, 500, 560, 620, 680, 740, 800, 860]
    _, progress = feed([it(t, c) for t, c in enumerate(counts)], params)
    # Rates 100 x5 then 60 x6: after 5 ticks at 60 the 5-tick history holds only 60s.
    assert progress[6].level == pytest.approx(100.0)
    assert progress[-1].level == pytest.approx(60.0)
