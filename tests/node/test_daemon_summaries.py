"""coda-node writes one summary per GPU job (and per CPU job it throttled) when the job
leaves the node, to the summary store or through the drop directory to the collector, and
counts the jobs that ended for the metrics.

Driven like tests/node/test_daemon_usage.py: the fixture node, the NVML double, a fake
clock advanced 1 s per tick. Job 5001 is a 2-GPU job on 48 cores whose hook record names
its workload (profiled: never probed); job 5002 a CPU job on 16 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from coda_common.publish import dropbox, munge
from coda_common.publish.dropbox import Collector, HostFilter
from coda_common.store.jobsummary import JobSummary
from coda_common.store.profiles import ProfileStore
from coda_common.store.summaries import ScanProblems, SummaryStore, store_for
from coda_node.daemon.summaries import MAX_COUNTER_PAIRS, JobEndCounters
from coda_node.status.metrics import StatusCollector
from coda_node.system.slurmjobs import record_token
from tests.node.test_daemon_loop_fixture import CPU, DNN, B, Sim, _contention_step, _run_until_onset
from tests.node.test_daemon_usage import UTIL, set_gpus

DNN_CORES = 48
USED_CORES = 46.0  # what the DNN job burns per second: 96 % of its cores


def make_sim(tmp_path: Path, conf_extra: str = "") -> Sim:
    sim = Sim(tmp_path)
    sim.node.jobs[DNN].account = "vision"
    if conf_extra:
        sim.new_daemon(conf_extra=conf_extra)
    set_gpus(sim, UTIL)  # 80 % and 60 % busy: 70 % on average
    return sim


def run_ticks(sim: Sim, n: int) -> None:
    for _ in range(n):
        sim.advance()
        if DNN in sim.node.jobs:
            sim.node.advance_cpu(DNN, int(USED_CORES * 1e9))
        sim.tick()


def end(sim: Sim, job_id: int) -> None:
    sim.node.remove_job(job_id)
    sim.advance()
    sim.tick()


def scan(store: SummaryStore) -> list[JobSummary]:
    problems = ScanProblems()
    found = list(store.scan(problems=problems))
    assert problems.count == 0, problems.kept
    return found


def check_dnn_summary(sim: Sim, s: JobSummary, ticks: int) -> None:
    """The figures of job 5001 after ``ticks`` ticks past its first."""
    job = sim.node.jobs.get(DNN)
    assert (s.job_id, s.node, s.kind, s.user, s.account) == (DNN, "gpu01", "dnn", "alice", "vision")
    assert (s.gpus, s.gpu_model, s.cores_allocated) == (2, "NVIDIA A100-SXM4-80GB", DNN_CORES)
    assert s.sampled_s == ticks  # 1 s per tick, from its first tick to its last
    assert s.end_unix_s - s.start_unix_s >= 0
    assert s.cores_mean == DNN_CORES and s.slim_s == 0 and s.probe_s == 0 and s.probes == 0
    assert s.cpu_used_cores_mean == pytest.approx(USED_CORES)
    assert s.gpu_util_pct_mean == pytest.approx(70.0)
    # GPUs 70 % busy (under 80 %) while it uses 46 of 48 cores (over 90 %): waiting on its
    # CPUs all along (the sampler's first reading, at the job's first tick, opens the CPU
    # rate of the first interval).
    assert s.gpu_sampled_s == ticks and s.gpu_wait_s == ticks
    assert s.idle_core_s == pytest.approx((DNN_CORES - USED_CORES) * ticks)
    assert s.throttled_s == 0 and s.protected_s == 0
    assert s.profile_state == "known"
    if job is not None:
        assert s.record == record_token(job.admin_comment or "")
    assert s.record is not None and s.record.startswith("coda:sig=workload:")


def test_a_job_that_ends_leaves_exactly_one_summary_in_the_store(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    record = record_token(sim.node.jobs[DNN].admin_comment or "")
    run_ticks(sim, 11)  # its first tick and 10 more
    store = store_for(sim.cfg)
    assert scan(store) == []  # nothing while it runs
    end(sim, DNN)
    (s,) = scan(store)
    check_dnn_summary(sim, s, 10)
    assert s.record == record
    ((_tick, event),) = sim.events("summary-publish", DNN)
    assert (
        "job ended" in event["reason"] and "waiting on its CPUs 100% of the time" in event["reason"]
    )
    (path,) = store.root.glob("*/gpu01.jsonl")
    assert str(path) in event["reason"]
    assert os.stat(path).st_mode & 0o777 == 0o644
    # Later ticks write nothing more; the CPU job (never throttled) gets no summary.
    run_ticks(sim, 2)
    end(sim, CPU)
    assert scan(store) == [s] and sim.events("summary-publish", CPU) == []
    assert sim.daemon.job_summaries.running.drain() == []


def test_at_stop_the_running_jobs_summaries_are_written_then_the_jobs_restored(
    tmp_path: Path,
) -> None:
    sim = make_sim(tmp_path)
    run_ticks(sim, 4)
    sim.daemon.job_summaries.publish_remaining()
    (s,) = scan(store_for(sim.cfg))
    assert s.job_id == DNN and s.sampled_s == 3
    assert "daemon stopping" in list(sim.daemon.events)[-1]["reason"]


def test_a_store_that_cannot_be_written_is_an_event_and_the_tick_goes_on(
    tmp_path: Path,
) -> None:
    # JobSummaryDir under a regular file: every write fails (ENOTDIR) as in a read-only
    # directory, whose mode root would not heed.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    sim = make_sim(tmp_path, conf_extra=f"JobSummaryDir={blocker}/jobs\n")
    run_ticks(sim, 4)
    end(sim, DNN)
    ((_tick, event),) = sim.events("summary-publish", DNN)
    assert event["reason"].startswith(f"cannot write its summary to {blocker}/jobs (job ended)")
    assert "Not a directory" in event["reason"]
    ticks = sim.daemon.ticks_total
    run_ticks(sim, 2)
    assert sim.daemon.ticks_total == ticks + 2 and sim.daemon.tick_errors_total == 0
    # The job still counts for the metrics, and the other job is put back at stop.
    (row,) = sim.daemon.job_summaries.counters.rows()
    assert row["jobs"] == {"dnn": 1}
    results = sim.daemon.restore()
    assert all(not r.failed for r in results.values())


def _decode_plain(credential: bytes, _socket: Path) -> munge.Decoded:
    """munged's answer for a credential root made on a node: the payload as it is."""
    return munge.Decoded(
        status=0,
        status_text="Success",
        uid=0,
        gid=0,
        encode_host="127.0.0.1",
        encode_time_unix_s=1,
        ttl_s=300,
        payload=credential,
    )


def test_with_munge_the_summary_is_dropped_and_the_collector_appends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dropbox.munge, "encode", lambda payload, *a, **k: payload)
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir(mode=0o1777)
    sim = make_sim(tmp_path, conf_extra=f"ProfilePublish=munge\nProfileDropDir={drop_dir}\n")
    run_ticks(sim, 6)
    end(sim, DNN)
    (path,) = drop_dir.glob("*.munge")
    ((_tick, event),) = sim.events("summary-publish", DNN)
    assert f"handed to the controller as {path}" in event["reason"]
    store = store_for(sim.cfg)
    assert scan(store) == []  # the node writes no store in munge mode
    lines: list[str] = []
    collector = Collector(
        drop_dir,
        ProfileStore(sim.cfg.profile_store),
        tmp_path / "sock",
        accept_uids=[0],
        hosts=HostFilter(["127.0.0.1"]),
        log=lambda level, msg: lines.append(f"{level}: {msg}"),
        decode=_decode_plain,
        summaries=store,
    )
    stats = collector.collect()
    assert (stats.accepted, stats.refused, stats.summaries) == (1, 0, 1)
    assert not path.exists()
    (s,) = scan(store)
    check_dnn_summary(sim, s, 5)
    assert list(store.root.glob("*/*.jsonl")) == list(store.root.glob("*/collector.jsonl"))
    assert any(f"job summaries of job(s) {DNN} from node gpu01 appended" in x for x in lines)
    assert (store.root / ".pruned").exists()  # the collector pruned (none due again for an hour)


def test_a_throttled_cpu_job_and_the_gpu_job_it_was_throttled_for(tmp_path: Path) -> None:
    sim = Sim(tmp_path, rdt=True)
    _run_until_onset(sim)
    for _ in range(8):
        _contention_step(sim, True, lambda mb: B * mb / 100.0)
    assert sim.events("throttle", CPU)
    end(sim, CPU)
    store = store_for(sim.cfg)
    (cpu,) = scan(store)
    assert (cpu.job_id, cpu.kind, cpu.gpus) == (CPU, "cpu", 0)
    assert 0 < cpu.throttled_s <= 8 and cpu.gpu_sampled_s == 0
    end(sim, DNN)
    dnn = next(s for s in scan(store) if s.job_id == DNN)
    # A neighbour held for it all the time the CPU job was held, and in the second in which
    # the CPU job ended (its summary ends with its last tick).
    assert dnn.protected_s == cpu.throttled_s + 1


def _scrape(collector: StatusCollector) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_count_the_jobs_that_ended_by_user_and_account(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    run_ticks(sim, 11)
    end(sim, DNN)
    samples = _scrape(StatusCollector(sim.daemon.metrics_view, 1.0))
    who = (("account", "vision"), ("user", "alice"))
    assert samples[("coda_node_jobs_ended_total", (*who[:1], ("kind", "dnn"), who[1]))] == 1
    assert samples[("coda_node_jobs_ended_gpu_seconds_total", who)] == 2 * 10
    assert samples[("coda_node_jobs_ended_gpu_wait_seconds_total", who)] == 2 * 10
    assert samples[("coda_node_jobs_ended_idle_core_seconds_total", who)] == pytest.approx(2 * 10)
    assert samples[("coda_node_jobs_ended_probe_seconds_total", who)] == 0
    assert samples[("coda_node_jobs_ended_throttled_seconds_total", who)] == 0
    assert not any("job_id" in dict(labels) for name, labels in samples if "ended" in name)


def _summary(user: str, account: str | None = "acct", kind: str = "dnn") -> JobSummary:
    return JobSummary(
        job_id=1, node="gpu01", user=user, uid=1, account=account, partition=None, kind=kind,
        num_nodes=1, start_unix_s=0.0, end_unix_s=10.0, sampled_s=10.0,
        gpus=1 if kind == "dnn" else 0, gpu_model=None, cores_allocated=4, cores_mean=4.0,
        cpu_used_cores_mean=1.0, gpu_util_pct_mean=50.0, gpu_sampled_s=10.0, gpu_wait_s=0.0,
        idle_core_s=30.0, probe_s=0.0, probes=0, slim_s=0.0, throttled_s=0.0, protected_s=0.0,
        profile_state=None, record=None,
    )  # fmt: skip


def test_the_label_sets_are_bounded_and_hostile_names_escaped() -> None:
    counters = JobEndCounters()
    for k in range(MAX_COUNTER_PAIRS + 20):
        counters.add(_summary(f"user{k}"))
    hostile = 'eve"} coda_node_jobs_ended_total{user="root'
    counters.add(_summary("user0", account=hostile))  # a new pair, past the bound: other
    rows = counters.rows()
    assert len(rows) == MAX_COUNTER_PAIRS + 1
    other = next(r for r in rows if r["user"] == "other")
    assert (other["account"], other["jobs"]) == ("other", {"dnn": 21})

    small = JobEndCounters(max_pairs=3)
    small.add(_summary(hostile, account=None))
    small.add(_summary("a\\b\nc"))
    view = {"job_end": small.rows()}
    samples = _scrape(StatusCollector(lambda: view, 1.0))
    ended = {labels for name, labels in samples if name == "coda_node_jobs_ended_total"}
    # Escaped in the text, read back whole: no series injected, no label lost.
    assert (("account", "unknown"), ("kind", "dnn"), ("user", hostile)) in ended
    # A name with a newline is no label value a person could read: shown as unknown.
    assert (("account", "acct"), ("kind", "dnn"), ("user", "unknown")) in ended
    assert len(ended) == 2


def _dnn_sig(sim: Sim) -> str:
    return (
        record_token(sim.node.jobs[DNN].admin_comment or "").removeprefix("coda:sig=").split(";")[0]
    )


def test_a_multi_node_jobs_summary_merges_its_figure_into_the_profile(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    sim.node.jobs[DNN].num_nodes = 2
    sig = _dnn_sig(sim)
    before = ProfileStore(sim.cfg.profile_store).read(sig)
    run_ticks(sim, 6)
    end(sim, DNN)
    (s,) = scan(store_for(sim.cfg))
    assert s.num_nodes == 2
    profile = ProfileStore(sim.cfg.profile_store).read(sig)
    assert profile is not None and profile.multi_node is not None
    # 46 cores used over 2 GPUs on this node.
    assert profile.multi_node.figures_cores_per_gpu == (pytest.approx(USED_CORES / 2),)
    assert profile.multi_node.n_figures == 1
    # 46 of its 48 cores busy with its GPUs at 70 %: they waited on the CPUs, a floor.
    assert profile.multi_node.starved == (True,)
    if before is not None:  # the single-node prediction is left as it was
        assert (profile.cpus_per_gpu, profile.confidence) == (
            before.cpus_per_gpu,
            before.confidence,
        )
    ((_tick, event),) = sim.events("multi-node-figure", DNN)
    assert (
        f"multi-node figure 23.00 cores/GPU (starved) of {sig} from node gpu01 merged"
        in event["reason"]
    )


def test_a_single_node_jobs_summary_merges_no_figure(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    sig = _dnn_sig(sim)
    run_ticks(sim, 4)
    end(sim, DNN)
    profile = ProfileStore(sim.cfg.profile_store).read(sig)
    assert profile is None or profile.multi_node is None
    assert sim.events("multi-node-figure", DNN) == []


def test_a_record_of_another_users_key_merges_no_figure(tmp_path: Path) -> None:
    sim = make_sim(tmp_path)
    job = sim.node.jobs[DNN]
    job.num_nodes = 2
    job.admin_comment = "coda:sig=workload:4242:resnet50;cpg=8;was=;action=set;src=profile"
    run_ticks(sim, 4)
    end(sim, DNN)
    assert ProfileStore(sim.cfg.profile_store).read("workload:4242:resnet50") is None
    assert sim.events("multi-node-figure", DNN) == []
