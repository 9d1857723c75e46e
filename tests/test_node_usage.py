"""The usage accumulator (coda_node.policy.usage): means, when records are written, and when not."""

from __future__ import annotations

import pytest

from coda_node.policy.usage import UsageAccumulator, UsageTick

SIG = "workload:1000:train"


def tick(u: float, m: float, pcie: float | None = 2e9, it: float | None = 10.0) -> UsageTick:
    return UsageTick(
        gpu_util=u, gpu_mem_bw_util=m, pcie_bytes_per_s_per_gpu=pcie, iter_per_s_per_gpu=it
    )


def test_record_is_the_mean_of_its_ticks_and_written_when_the_job_ends() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=3)
    acc.add(7, SIG, "NVIDIA A100", 0.0, tick(0.8, 0.4, 2e9, 10.0))
    acc.add(7, SIG, "NVIDIA A100", 1.0, tick(0.6, 0.2, None, None))
    acc.add(7, SIG, "NVIDIA A100", 2.0, tick(0.7, 0.3, 4e9, 20.0))
    assert acc.step(3.0, 1e9, live={7}) == []  # still running, no periodic writes
    (flush,) = acc.step(4.0, 1.7e9, live=set())
    assert (flush.job_id, flush.signature, flush.why) == (7, SIG, "job ended")
    r = flush.record
    assert r.gpu_model == "NVIDIA A100"
    assert r.gpu_util == pytest.approx(0.7) and r.gpu_mem_bw_util == pytest.approx(0.3)
    assert r.pcie_bytes_per_s_per_gpu == pytest.approx(3e9)  # over the two ticks that had it
    assert r.iter_per_s_per_gpu == pytest.approx(15.0)
    assert (r.ticks, r.updated_unix_s) == (3, 1.7e9)
    assert acc.ticks(7) == 0 and acc.step(5.0, 1e9, live=set()) == []  # forgotten


def test_too_few_ticks_write_nothing() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=30)
    for t in range(29):
        acc.add(7, SIG, None, float(t), tick(0.5, 0.5))
    assert acc.step(30.0, 1e9, live=set()) == []


def test_periodic_writes_restart_the_sums() -> None:
    acc = UsageAccumulator(flush_every_s=10, min_ticks=2)
    for t in range(10):
        acc.add(7, SIG, "H100", float(t), tick(0.9, 0.5))
        assert acc.step(float(t), 1e9, live={7}) == []
    acc.add(7, SIG, "H100", 10.0, tick(0.9, 0.5))
    (first,) = acc.step(10.0, 1e9, live={7})
    assert first.why == "periodic" and first.record.ticks == 11
    for t in range(11, 14):
        acc.add(7, SIG, "H100", float(t), tick(0.1, 0.0, None, None))
    (last,) = acc.step(14.0, 1e9, live=set())
    # Only the ticks since the periodic write: the store's merge adds, never double counts.
    assert last.record.ticks == 3 and last.record.gpu_util == pytest.approx(0.1)
    assert last.record.pcie_bytes_per_s_per_gpu is None
    assert last.record.iter_per_s_per_gpu is None


def test_periodic_write_waits_for_min_ticks() -> None:
    acc = UsageAccumulator(flush_every_s=5, min_ticks=4)
    acc.add(7, SIG, None, 0.0, tick(0.5, 0.5))
    acc.add(7, SIG, None, 9.0, tick(0.5, 0.5))
    assert acc.step(9.0, 1e9, live={7}) == []  # old enough, but two ticks only
    acc.add(7, SIG, None, 10.0, tick(0.5, 0.5))
    acc.add(7, SIG, None, 11.0, tick(0.5, 0.5))
    (flush,) = acc.step(11.0, 1e9, live={7})
    assert flush.record.ticks == 4


def test_jobs_are_kept_apart_and_drained_at_stop() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=1)
    acc.add(1, SIG, None, 0.0, tick(1.0, 1.0))
    acc.add(2, "workload:2000:other", None, 0.0, tick(0.2, 0.1))
    acc.add(3, "workload:3000:short", None, 0.0, tick(0.2, 0.1))
    flushes = acc.drain(1e9)
    assert [(f.job_id, f.why) for f in flushes] == [
        (1, "daemon stopping"),
        (2, "daemon stopping"),
        (3, "daemon stopping"),
    ]
    assert flushes[0].record.gpu_util == 1.0 and flushes[1].record.gpu_util == pytest.approx(0.2)
    assert acc.drain(1e9) == []


def test_means_stay_within_0_1_despite_float_sums() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=1)
    for t in range(10):
        acc.add(1, SIG, None, float(t), tick(1.0, 1.0))
    (flush,) = acc.step(10.0, 1e9, live=())
    assert flush.record.gpu_util <= 1.0 and flush.record.gpu_mem_bw_util <= 1.0


@pytest.mark.parametrize(("every", "ticks"), [(-1.0, 1), (0.0, 0)])
def test_bad_parameters_are_refused(every: float, ticks: int) -> None:
    with pytest.raises(ValueError):
        UsageAccumulator(flush_every_s=every, min_ticks=ticks)
