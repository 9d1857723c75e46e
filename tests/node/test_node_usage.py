"""The usage accumulator (coda_node.policy.usage): means, when records are written, and when not,
for DNN jobs' GPU usage and CPU jobs' memory bandwidth per CPU."""

from __future__ import annotations

import pytest

from coda_common.store.usage import CpuUsageRecord, UsageRecord, merge_cpu_usage
from coda_node.policy.usage import UsageAccumulator, UsageTick

SIG = "workload:1000:train"
CPU_SIG = "workload:1001:stream"


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


# --------------------------------------------------------------------------------------------
# CPU jobs: memory bandwidth per allocated CPU


def test_a_cpu_job_record_is_its_mean_bandwidth_per_cpu_when_it_ends() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=3)
    for t, per_cpu in enumerate((1e9, 2e9, 6e9)):
        acc.add_cpu(9, CPU_SIG, float(t), per_cpu)
    assert acc.ticks(9) == 3 and acc.step(3.0, 1e9, live={9}) == []
    (flush,) = acc.step(4.0, 1.7e9, live=set())
    assert (flush.job_id, flush.signature, flush.why) == (9, CPU_SIG, "job ended")
    assert flush.record == CpuUsageRecord(
        mem_bw_bytes_per_s_per_cpu=pytest.approx(3e9), ticks=3, updated_unix_s=1.7e9
    )
    assert acc.ticks(9) == 0


def test_a_cpu_job_with_too_few_ticks_writes_nothing() -> None:
    acc = UsageAccumulator(flush_every_s=5, min_ticks=4)
    for t in range(3):
        acc.add_cpu(9, CPU_SIG, float(t) * 10, 5e9)
    assert acc.step(30.0, 1e9, live={9}) == []  # due, but three ticks only
    assert acc.step(31.0, 1e9, live=set()) == []  # ended with three: forgotten
    assert acc.drain(1e9) == []


def test_periodic_cpu_writes_add_up_to_the_whole_mean_in_the_store() -> None:
    acc = UsageAccumulator(flush_every_s=10, min_ticks=2)
    for t in range(11):
        acc.add_cpu(9, CPU_SIG, float(t), 4e9)
    (first,) = acc.step(10.0, 100.0, live={9})
    assert first.why == "periodic" and first.record.ticks == 11
    for t in range(11, 16):
        acc.add_cpu(9, CPU_SIG, float(t), 1e9)
    (last,) = acc.step(16.0, 200.0, live=set())
    assert isinstance(last.record, CpuUsageRecord)
    assert last.record.ticks == 5 and last.record.mem_bw_bytes_per_s_per_cpu == pytest.approx(1e9)
    # The store's ticks-weighted merge of the two writes is the mean of all 16 ticks.
    assert isinstance(first.record, CpuUsageRecord)
    merged = merge_cpu_usage(first.record, last.record)
    assert merged.ticks == 16
    assert merged.mem_bw_bytes_per_s_per_cpu == pytest.approx((11 * 4e9 + 5 * 1e9) / 16)


def test_gpu_and_cpu_jobs_are_kept_apart_and_each_drains_its_own_record() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=2)
    for t in range(2):
        acc.add(1, SIG, "H100", float(t), tick(0.5, 0.25))
        acc.add_cpu(2, CPU_SIG, float(t), 2e9)
    acc.add_cpu(3, "workload:1002:short", 0.0, 9e9)  # one tick: below min_ticks
    gpu, cpu = acc.drain(1e9)
    assert (gpu.job_id, gpu.why, cpu.job_id, cpu.why) == (
        1,
        "daemon stopping",
        2,
        "daemon stopping",
    )
    assert isinstance(gpu.record, UsageRecord) and gpu.record.gpu_util == pytest.approx(0.5)
    assert isinstance(cpu.record, CpuUsageRecord)
    assert cpu.record.mem_bw_bytes_per_s_per_cpu == pytest.approx(2e9)
    assert acc.drain(1e9) == []


def test_a_job_id_reused_by_another_workload_starts_again() -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=1)
    acc.add_cpu(9, CPU_SIG, 0.0, 8e9)
    acc.add_cpu(9, "workload:1001:other", 1.0, 2e9)
    (flush,) = acc.step(2.0, 1e9, live=())
    assert flush.signature == "workload:1001:other"
    assert flush.record == CpuUsageRecord(2e9, 1, 1e9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_bad_cpu_reading_is_refused_and_the_mean_kept(bad: float) -> None:
    acc = UsageAccumulator(flush_every_s=0, min_ticks=1)
    acc.add_cpu(9, CPU_SIG, 0.0, 3e9)
    with pytest.raises(ValueError, match="memory bandwidth per CPU"):
        acc.add_cpu(9, CPU_SIG, 1.0, bad)
    (flush,) = acc.drain(1e9)
    assert flush.record == CpuUsageRecord(3e9, 1, 1e9)
