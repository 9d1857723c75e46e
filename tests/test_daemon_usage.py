"""coda-node records each DNN job's GPU usage into its profile (used by placement).

Driven like tests/test_daemon_loop_fixture.py: a fixture node, the NVML double, a fake clock
advanced 1 s per tick. Job 5001 is a 2-GPU DNN job whose hook record names its workload;
job 5002 a CPU job that stays idle (no contention). Warm-up is 5 s (``NodeProbeWarmupS=5``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from coda_node.enforce.state import Limit
from slurm_plugin.store.profiles import Profile
from tests import test_daemon_loop_fixture as loopfix
from tests.test_daemon_loop_fixture import DNN, Sim

RATE = 100.0  # the DNN job's iterations/s, as its progress file says
GPU_MODEL = "NVIDIA A100-SXM4-80GB"  # what the NVML double names every GPU
UTIL = (80, 60)  # utilization.gpu of the job's two GPUs, %
MEM = (40, 20)  # utilization.memory, %
RX_KB, TX_KB = (3000, 1000), (500, 1500)  # PCIe KB/s per GPU


def make_sim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, flush_s: int = 0, min_ticks: int = 5
) -> Sim:
    extra = f"NodeUsageFlushS={flush_s}\nNodeUsageMinTicks={min_ticks}\n"
    monkeypatch.setattr(loopfix, "SHORT_TIMES", loopfix.SHORT_TIMES + extra)
    sim = Sim(tmp_path, dnn_src="profile")
    set_gpus(sim, UTIL)
    return sim


def set_gpus(sim: Sim, util: tuple[int, int]) -> None:
    """The job's two GPUs (NVML indices through their minors) read ``util`` % busy."""
    refs = sim.node.expected_gpu_refs(DNN)
    assert len(refs) == 2
    for k, (_slurm, _minor, nvml_index) in enumerate(refs):
        gpu = sim.node.nvml_lib.gpus[nvml_index]
        gpu.util_pct, gpu.mem_util_pct = util[k], MEM[k]
        gpu.pcie_rx_kb_per_s, gpu.pcie_tx_kb_per_s = RX_KB[k], TX_KB[k]


def store_profile(sim: Sim) -> None:
    job = sim.node.jobs[DNN]
    sim.store.ensure_root()
    sim.store.write(
        Profile(
            signature=sim.signature,
            workload=job.name,
            cpus_per_gpu=24,
            confidence=0.95,
            n_samples=3,
            updated_unix_s=time.time() - 3600,
            source="import",
        )
    )


def run_ticks(sim: Sim, n: int) -> None:
    for _ in range(n):
        sim.advance()
        sim.write_progress(DNN, RATE)
        sim.tick()


def end_job(sim: Sim) -> None:
    sim.node.remove_job(DNN)
    sim.advance()
    sim.tick()


def test_a_job_gets_a_usage_record_with_what_nvml_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim(tmp_path, monkeypatch)
    store_profile(sim)
    run_ticks(sim, 20)
    assert sim.events("usage-publish") == []  # NodeUsageFlushS=0: only when the job ends
    end_job(sim)
    (_tick, event), *_ = sim.events("usage-publish", DNN)
    prof = sim.store.read(sim.signature)
    assert prof is not None
    (rec,) = prof.usage
    assert rec.gpu_model == GPU_MODEL
    assert rec.gpu_util == pytest.approx(0.70)  # (80 + 60) / 2 %
    assert rec.gpu_mem_bw_util == pytest.approx(0.30)  # (40 + 20) / 2 %
    per_gpu_kb = ((3000 + 500) + (1000 + 1500)) / 2
    assert rec.pcie_bytes_per_s_per_gpu == pytest.approx(per_gpu_kb * 1024)  # NVML KB = 1024 B
    assert rec.iter_per_s_per_gpu == pytest.approx(RATE / 2)
    # Ticks 0-4 are warm-up (age < 5 s); tick 5 is the first undisturbed one, counted from
    # the next on (NVML reads the period before the tick): ticks 6-19.
    assert rec.ticks == 14
    assert "GPU 70% busy, memory 30% busy over 14 ticks" in event["reason"]
    assert "job ended" in event["reason"]
    assert prof.cpus_per_gpu == 24 and prof.confidence == 0.95  # the CPU profile untouched


def test_ticks_under_an_admin_limit_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim(tmp_path, monkeypatch)
    store_profile(sim)
    run_ticks(sim, 10)  # ticks 6-9 count
    # An admin squeezes the job onto 4 cores for 5 ticks; its GPUs starve meanwhile.
    sim.node.set_limits({DNN: Limit(cores=4, reason="admin: squeeze")})
    set_gpus(sim, (10, 10))
    run_ticks(sim, 5)
    assert len(sim.cpuset(DNN)) == 4
    sim.node.set_limits({})
    run_ticks(sim, 1)  # the limit goes; this tick's NVML reading is the squeezed second
    set_gpus(sim, UTIL)
    run_ticks(sim, 6)  # all six counted: the tick before each was undisturbed
    end_job(sim)
    prof = sim.store.read(sim.signature)
    assert prof is not None
    (rec,) = prof.usage
    assert rec.gpu_util == pytest.approx(0.70)  # none of the starved readings
    assert rec.ticks == 4 + 6


def test_ticks_while_probed_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim(tmp_path, monkeypatch)
    job = sim.node.jobs[DNN]
    assert job.admin_comment is not None
    job.admin_comment = job.admin_comment.replace("src=profile", "src=none")
    store_profile(sim)
    # Not confident: coda-node probes the job (fewer cores) after its warm-up.
    prof = sim.store.read(sim.signature)
    assert prof is not None
    sim.store.write(Profile(**{**{f: getattr(prof, f) for f in prof.__slots__}, "confidence": 0.3}))
    full = len(job.cpus)
    probed_ticks = counted_full = 0
    for _ in range(60):
        sim.advance()
        cores = len(sim.cpuset(DNN))
        # The job's GPUs idle while it runs on fewer cores than its allocation.
        set_gpus(sim, UTIL if cores == full else (5, 5))
        sim.write_progress(DNN, RATE if cores == full else RATE / 4)
        sim.tick()
        probed_ticks += cores < full
        counted_full += cores == full
    assert probed_ticks > 0, sim.timeline
    end_job(sim)
    prof = sim.store.read(sim.signature)
    assert prof is not None
    (rec,) = prof.usage
    assert rec.gpu_util == pytest.approx(0.70)  # no probed second in the mean
    assert 0 < rec.ticks < counted_full


@pytest.mark.parametrize("store_exists", [False, True], ids=["no-store-dir", "no-profile"])
def test_a_job_without_a_profile_records_nothing_quietly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    store_exists: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="coda-node")
    sim = make_sim(tmp_path, monkeypatch)
    if store_exists:
        sim.store.ensure_root()
    run_ticks(sim, 15)
    end_job(sim)
    assert sim.events("usage-publish") == []
    assert not sim.store.path_for(sim.signature).exists()
    scary = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert scary == [], [r.getMessage() for r in scary]
    assert not any("usage" in r.getMessage().lower() for r in caplog.records)


def test_long_jobs_write_periodically_and_a_broken_store_only_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim(tmp_path, monkeypatch, flush_s=5, min_ticks=3)
    store_profile(sim)
    run_ticks(sim, 20)
    periodic = sim.events("usage-publish", DNN)
    assert len(periodic) >= 2 and all("(periodic)" in e["reason"] for _, e in periodic)
    prof = sim.store.read(sim.signature)
    assert prof is not None
    (rec,) = prof.usage
    written = rec.ticks
    assert written >= 6 and rec.gpu_util == pytest.approx(0.70)
    # The profile becomes unreadable: the next write fails, the daemon goes on.
    sim.store.path_for(sim.signature).write_text("{not json")
    run_ticks(sim, 10)
    failed = [e for _, e in sim.events("usage-publish", DNN) if "cannot record" in e["reason"]]
    assert len(failed) >= 1
    assert sim.daemon.tick_errors_total == 0
    assert sim.daemon.loop.progress[DNN].phase == "train"  # the tick went on
