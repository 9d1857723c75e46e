"""The job-summary accumulator (coda_node.policy.summary) on recorded tick sequences: each
interval weighted by the monotonic clock, counted with the previous tick's state and this
tick's readings; which jobs get a summary; what the figures come to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coda_common.store.jobsummary import summary_from_json_line
from coda_node.policy.summary import SummaryAccumulator, SummaryTick

NODE = "gpu01"
RECORD = "coda:sig=workload:1000:resnet50;cpg=8;was=;action=set;src=profile;gpn=2;nodes=1"


def dnn(t: float, **kw: object) -> SummaryTick:
    """A 2-GPU job on 16 cores at monotonic ``t`` (unix time 1.7e9 + t)."""
    base = SummaryTick(
        job_id=4711,
        monotonic_s=t,
        unix_s=1_700_000_000.0 + t,
        kind="dnn",
        user="alice",
        uid=1000,
        account="vision",
        partition="gpu",
        num_nodes=1,
        gpus=2,
        gpu_model="NVIDIA H100",
        record=RECORD,
        profile_state="known",
        cores_allocated=16,
        cores_in_force=16,
        cpu_used_cores=None,
        gpu_util_pct=None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def cpu(t: float, **kw: object) -> SummaryTick:
    return replace(
        dnn(t, job_id=4800, kind="cpu", gpus=0, gpu_model=None, record=None, profile_state=None),
        **kw,  # type: ignore[arg-type]
    )


def run(ticks: list[SummaryTick]) -> list:
    acc = SummaryAccumulator(NODE)
    for t in ticks:
        acc.add(t)
    out = acc.ended(())
    for s in out:  # every summary the accumulator makes reads back as the store reads it
        assert summary_from_json_line(s.to_json_line()) == s
    return out


def test_a_starved_job_waits_on_its_cpus_all_the_time_it_was_sampled() -> None:
    # 16 cores all used, GPUs 40 % busy: waiting. 10 intervals of 2 s.
    ticks = [dnn(2.0 * k, cpu_used_cores=15.8, gpu_util_pct=40.0) for k in range(11)]
    (s,) = run(ticks)
    assert s.sampled_s == pytest.approx(20.0)
    assert s.gpu_sampled_s == pytest.approx(20.0)
    assert s.gpu_wait_s == pytest.approx(20.0)
    assert s.gpu_util_pct_mean == pytest.approx(40.0)
    assert s.cpu_used_cores_mean == pytest.approx(15.8)
    assert s.idle_core_s == pytest.approx(0.2 * 20.0)
    assert s.cores_mean == 16 and s.slim_s == 0 and s.probe_s == 0
    assert (s.kind, s.gpus, s.user, s.account, s.record) == ("dnn", 2, "alice", "vision", RECORD)
    assert s.start_unix_s == 1_700_000_000.0 and s.end_unix_s == 1_700_000_020.0


def test_a_busy_job_does_not_wait_and_its_idle_cores_are_counted() -> None:
    ticks = [dnn(float(k), cpu_used_cores=4.0, gpu_util_pct=95.0) for k in range(6)]
    (s,) = run(ticks)
    assert (s.sampled_s, s.gpu_sampled_s, s.gpu_wait_s) == (5.0, 5.0, 0.0)
    assert s.idle_core_s == pytest.approx(12.0 * 5)


def test_intervals_are_weighted_by_the_clock_and_readings_count_for_the_interval_before() -> None:
    # Readings at t=1 (GPU 40 %, 16 cores used: waiting) cover 1 s; those at t=4 (GPU 100 %)
    # cover 3 s; the first tick's readings (before any interval) count for nothing.
    ticks = [
        dnn(0.0, cpu_used_cores=0.0, gpu_util_pct=0.0),
        dnn(1.0, cpu_used_cores=16.0, gpu_util_pct=40.0),
        dnn(4.0, cpu_used_cores=16.0, gpu_util_pct=100.0),
    ]
    (s,) = run(ticks)
    assert s.sampled_s == 4.0 and s.gpu_wait_s == 1.0
    assert s.gpu_util_pct_mean == pytest.approx((40.0 * 1 + 100.0 * 3) / 4)


def test_a_probed_then_slimmed_job() -> None:
    # t=0: a probe at 8 cores starts (in force from t=0 to t=2); t=2: a probe at 4 cores
    # (to t=4); t=4: the probe is done, the job is slimmed to 12 cores (to t=10).
    ticks = [
        dnn(0.0, probe_cores=8, cores_in_force=8, profile_state="probing"),
        dnn(2.0, probe_cores=4, cores_in_force=4, cpu_used_cores=8.0, gpu_util_pct=90.0),
        dnn(4.0, cores_in_force=12, cpu_used_cores=4.0, gpu_util_pct=60.0),
        *[
            dnn(t, cores_in_force=12, cpu_used_cores=11.0, gpu_util_pct=70.0, profile_state="done")
            for t in (6.0, 8.0, 10.0)
        ],
    ]
    (s,) = run(ticks)
    assert (s.probes, s.probe_s, s.slim_s) == (2, 4.0, 6.0)
    assert s.cores_mean == pytest.approx((8 * 2 + 4 * 2 + 12 * 6) / 10)
    # Waiting: at 4 cores 4 used with GPUs 60 % busy (t=2..4); at 12 cores, 11 used (over
    # 90 %) with GPUs 70 % busy (t=4..10).
    assert s.gpu_wait_s == pytest.approx(8.0)
    assert s.profile_state == "done"
    # Idle against the allocation: 16 - used.
    assert s.idle_core_s == pytest.approx(8 * 2 + 12 * 2 + 5 * 6)


def test_a_throttled_cpu_job_gets_a_summary_and_one_never_throttled_none() -> None:
    throttled = [cpu(0.0), cpu(1.0, throttled=True), cpu(2.0, throttled=True), cpu(5.0)]
    (s,) = run(throttled)
    assert (s.kind, s.gpus, s.throttled_s, s.sampled_s) == (
        "cpu",
        0,
        4.0,
        5.0,
    )  # held from t=1 to t=5
    assert s.gpu_sampled_s == 0 and s.gpu_util_pct_mean is None
    assert run([cpu(float(k), cpu_used_cores=16.0) for k in range(5)]) == []


def test_a_protected_gpu_job_counts_the_time_a_neighbour_was_held_for_it() -> None:
    ticks = [dnn(0.0), dnn(1.0, protected=True), dnn(3.0, protected=True), dnn(4.0)]
    (s,) = run(ticks)
    assert s.protected_s == 3.0 and s.throttled_s == 0


def test_missing_nvml_leaves_the_gpu_figures_unknown_not_zero() -> None:
    ticks = [dnn(float(k), cpu_used_cores=16.0, gpu_util_pct=None) for k in range(4)]
    (s,) = run(ticks)
    assert s.sampled_s == 3.0 and s.gpu_sampled_s == 0 and s.gpu_wait_s == 0
    assert s.gpu_util_pct_mean is None and s.gpu_wait_share is None
    assert s.cpu_used_cores_mean == 16.0


def test_a_job_seen_in_one_tick_only_gets_no_summary() -> None:
    assert run([dnn(0.0, cpu_used_cores=1.0, gpu_util_pct=50.0)]) == []
    assert run([dnn(5.0), dnn(5.0)]) == []  # the clock did not move


def test_names_a_summary_cannot_hold_are_left_out_and_readings_out_of_range_clipped() -> None:
    hostile = {"user": "eve\nroot", "account": "x" * 300, "partition": "", "gpu_model": "\x1b[2J"}
    ticks = [
        dnn(float(k), gpu_util_pct=250.0, cpu_used_cores=float("nan"), **hostile) for k in (0, 1)
    ]
    (s,) = run(ticks)
    assert (s.user, s.account, s.partition, s.gpu_model) == (None, None, None, None)
    assert s.gpu_util_pct_mean == 100.0 and s.cpu_used_cores_mean is None


def test_only_the_jobs_that_left_are_finished() -> None:
    acc = SummaryAccumulator(NODE)
    for t in (0.0, 1.0):
        acc.add(dnn(t))
        acc.add(dnn(t, job_id=4712))
    assert [s.job_id for s in acc.ended({4711})] == [4712]
    assert 4711 in acc and 4712 not in acc
    assert [s.job_id for s in acc.drain()] == [4711]
