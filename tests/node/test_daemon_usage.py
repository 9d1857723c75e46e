"""coda-node records each DNN job's GPU usage, and each CPU job's memory bandwidth per CPU,
into its profile (used by placement).

Driven like tests/node/test_daemon_loop_fixture.py: a fixture node, the NVML double, a fake clock
advanced 1 s per tick. Job 5001 is a 2-GPU DNN job whose hook record names its workload;
job 5002 a CPU job, idle (no contention) unless a test has it draw memory bandwidth and gives
it a hook record. Warm-up is 5 s (``NodeProbeWarmupS=5``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from coda_common.publish import dropbox
from coda_common.store.profiles import Profile
from coda_node.enforce.state import Limit
from tests.node import test_daemon_loop_fixture as loopfix
from tests.node.test_daemon_loop_fixture import (
    CPU,
    CPU_CORES,
    DNN,
    ONSET,
    R0,
    B,
    S,
    Sim,
    _run_until_onset,
    mount_resctrl,
)
from tests.node.test_mbm import _charge, _cpu_tids

RATE = 100.0  # the DNN job's iterations/s, as its progress file says
GPU_MODEL = "NVIDIA A100-SXM4-80GB"  # what the NVML double names every GPU
UTIL = (80, 60)  # utilization.gpu of the job's two GPUs, %
MEM = (40, 20)  # utilization.memory, %
RX_KB, TX_KB = (3000, 1000), (500, 1500)  # PCIe KB/s per GPU


def make_sim(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    flush_s: int = 0,
    min_ticks: int = 5,
    rdt: bool = False,
) -> Sim:
    """``rdt``: resctrl mounted and per-job bandwidth injected from ``sim.bw``."""
    extra = f"NodeUsageFlushS={flush_s}\nNodeUsageMinTicks={min_ticks}\n"
    monkeypatch.setattr(loopfix, "SHORT_TIMES", loopfix.SHORT_TIMES + extra)
    sim = Sim(tmp_path, rdt=rdt, dnn_src="profile")
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


# --------------------------------------------------------------------------------------------
# CPU jobs: memory bandwidth per allocated CPU, from the job's resctrl monitoring group.
# Job 5002 runs on CPU_CORES (16) CPUs; with MemBwSpreadGres set the hook gives it a record.


def cpu_record(sim: Sim, job_id: int = CPU, *, uid: int | None = None) -> str:
    """The hook's record on CPU job ``job_id`` (no cpg, action=skip), naming a key of
    ``uid`` (default: the job's owner); returns the signature."""
    job = sim.node.jobs[job_id]
    sig = f"workload:{job.uid if uid is None else uid}:{job.name}"
    job.admin_comment = f"coda:sig={sig};cpg=;was=;action=skip;src=none;gpn=0;nodes=1"
    return sig


def mbm_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: int) -> Sim:
    """make_sim's node with resctrl (MBM) mounted and no bandwidth injected: the daemon
    gives the CPU job its own monitoring group and reads its rate, as on a real node."""
    sim = make_sim(tmp_path, monkeypatch, **kw)
    sim.rdt = mount_resctrl(sim.node, tasks_in_root=True)
    sim.new_daemon()
    sim.store.ensure_root()
    return sim


def run_cpu_ticks(sim: Sim, n: int, bw_bytes_per_s: float) -> None:
    """``n`` seconds in which the CPU job draws ``bw_bytes_per_s`` (counted by resctrl in
    its monitoring group) and the DNN job trains undisturbed."""
    assert sim.rdt is not None
    tids = _cpu_tids(sim)
    for _ in range(n):
        sim.advance()
        _charge(sim.rdt, tids, bw_bytes_per_s)
        sim.write_progress(DNN, RATE)
        sim.tick()


def end_cpu_job(sim: Sim) -> None:
    sim.node.remove_job(CPU)
    sim.advance()
    sim.write_progress(DNN, RATE)
    sim.tick()


def test_a_cpu_job_gets_its_memory_bandwidth_per_cpu_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = mbm_sim(tmp_path, monkeypatch)
    sig = cpu_record(sim)
    run_cpu_ticks(sim, 12, 8e9)
    monitor = sim.daemon.mem_bw_monitor
    assert monitor is not None and monitor.monitored() == {CPU: f"mon_groups/coda_j{CPU}"}
    assert sim.events("usage-publish") == []  # NodeUsageFlushS=0: only when the job ends
    end_cpu_job(sim)
    ((_tick, event),) = sim.events("usage-publish", CPU)
    prof = sim.store.read(sig)
    assert prof is not None and prof.cpu_usage is not None
    assert prof.cpu_usage.mem_bw_bytes_per_s_per_cpu == pytest.approx(8e9 / CPU_CORES)
    # Tick 0 makes the group (no rate yet) and shows the job unthrottled; every rate from
    # tick 1 on counts.
    assert prof.cpu_usage.ticks == 11
    assert (prof.source, prof.confidence, prof.usage) == ("cpu-usage", 0.0, ())
    assert event["reason"] == (
        f"profile {sig}: memory bandwidth 0.50 GB/s per CPU over 11 ticks (job ended)"
    )


def draw_second(sim: Sim, job_id: int, dnn_sensitivity: float) -> None:
    """One second in which CPU job ``job_id`` draws B less what its MB cap and CPU quota
    hold back, and the DNN job slows by ``dnn_sensitivity`` times its share of B."""
    sim.advance()
    quota = sim.quota_cores(job_id)
    share = min(1.0, quota / CPU_CORES) if quota is not None else 1.0
    sim.bw[job_id] = B * sim.mb_pct(job_id) / 100 * share
    sim.write_progress(DNN, R0 * (1.0 - dnn_sensitivity * sim.bw[job_id] / B))
    sim.tick()


def test_a_throttled_cpu_jobs_ticks_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory-bound CPU job starts beside a training job; once the training job slows
    down the contention eliminator caps it (MBA): the capped readings stay out of its
    record."""
    sim = make_sim(tmp_path, monkeypatch, rdt=True)
    sim.store.ensure_root()
    _run_until_onset(sim)  # the DNN job's baseline, beside the idle job 5002
    assert sim.rdt is not None
    cpus = sim.node.jobs[CPU].cpus
    sim.node.remove_job(CPU)
    new = sim.node.add_job("cpu", cpus, job_id=CPU + 10, admin_comment=None)
    sim.rdt.live_pids |= set(new.all_tids)
    sig = cpu_record(sim, new.job_id)
    for _ in range(10):  # the DNN job does not mind the new job's bandwidth yet
        draw_second(sim, new.job_id, 0.0)
    assert sim.events("throttle") == []
    for _ in range(15):  # now it does: the eliminator caps the CPU job step by step
        draw_second(sim, new.job_id, S)
    throttles = sim.events("throttle", new.job_id)
    assert len(throttles) >= 2 and "capped at MB 70%" in throttles[0][1]["reason"]
    assert sim.mb_pct(new.job_id) < 100  # still capped when it ends
    sim.node.remove_job(new.job_id)
    sim.advance()
    sim.write_progress(DNN, R0)
    sim.tick()
    prof = sim.store.read(sig)
    assert prof is not None and prof.cpu_usage is not None
    # Only its uncapped seconds, each B on 16 CPUs: the first is the tick before the first
    # counted, and the tick that caps it counts no more.
    assert prof.cpu_usage.mem_bw_bytes_per_s_per_cpu == pytest.approx(B / CPU_CORES)
    assert prof.cpu_usage.ticks == throttles[0][0] - ONSET - 1


def test_ticks_under_an_admin_limit_of_a_cpu_job_and_the_tick_after_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_sim(tmp_path, monkeypatch, rdt=True)
    sim.store.ensure_root()
    sig = cpu_record(sim)
    for _ in range(8):  # ticks 1-7 count
        draw_second(sim, CPU, 0.0)
    # An admin caps the job at 4 cores' CPU time: it draws a quarter of B meanwhile.
    sim.node.set_limits({CPU: Limit(quota_cores=4.0, reason="admin: squeeze")})
    for _ in range(5):
        draw_second(sim, CPU, 0.0)
    assert sim.quota_cores(CPU) == 4.0 and sim.bw[CPU] == pytest.approx(B / 4)
    sim.node.set_limits({})
    draw_second(sim, CPU, 0.0)  # the limit goes; this reading is the capped second before
    assert sim.quota_cores(CPU) is None and sim.bw[CPU] == pytest.approx(B / 4)
    for _ in range(6):  # all six count: the tick before each was unlimited
        draw_second(sim, CPU, 0.0)
    end_cpu_job(sim)
    prof = sim.store.read(sig)
    assert prof is not None and prof.cpu_usage is not None
    assert prof.cpu_usage.mem_bw_bytes_per_s_per_cpu == pytest.approx(B / CPU_CORES)
    assert prof.cpu_usage.ticks == 7 + 6


@pytest.mark.parametrize("who", ["no record", "another user's key"])
def test_a_cpu_job_without_its_owners_record_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    sim = mbm_sim(tmp_path, monkeypatch)
    job = sim.node.jobs[CPU]
    sig = f"workload:{job.uid}:{job.name}"
    if who == "another user's key":
        other = next(j.uid for j in sim.node.jobs.values() if j.uid != job.uid)
        sig = cpu_record(sim, uid=other)
    run_cpu_ticks(sim, 12, 8e9)
    assert sim.daemon.mem_bw_monitor is not None
    assert sim.daemon.mem_bw_monitor.rate(CPU) == pytest.approx(8e9)  # it was measured
    end_cpu_job(sim)
    assert sim.events("usage-publish", CPU) == []
    assert sim.store.read(sig) is None
    assert not any(p.name.startswith(f"workload_{job.uid}") for p in sim.store.root.iterdir())


def test_a_damaged_profile_of_a_cpu_job_is_said_and_the_tick_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = mbm_sim(tmp_path, monkeypatch, flush_s=5, min_ticks=3)
    sig = cpu_record(sim)
    run_cpu_ticks(sim, 10, 4e9)
    periodic = sim.events("usage-publish", CPU)
    assert periodic and all("(periodic)" in e["reason"] for _, e in periodic)
    sim.store.path_for(sig).write_text("{not json")
    run_cpu_ticks(sim, 10, 4e9)
    failed = [e for _, e in sim.events("usage-publish", CPU) if "cannot record" in e["reason"]]
    assert failed and "cannot record memory bandwidth in" in failed[0]["reason"]
    assert sim.daemon.tick_errors_total == 0
    assert sim.store.path_for(sig).read_text() == "{not json"  # left for the admin
    assert sim.daemon.state.view["jobs"][-1]["job_id"] == CPU  # the view still shows it
    assert sim.daemon.loop.progress[DNN].phase == "train"  # the tick went on


def munge_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Sim, Path]:
    """mbm_sim's node with ProfilePublish=munge into a fresh drop directory."""
    sim = make_sim(tmp_path, monkeypatch)
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    sim.rdt = mount_resctrl(sim.node, tasks_in_root=True)
    sim.new_daemon(conf_extra=f"ProfilePublish=munge\nProfileDropDir={drop_dir}\n")
    return sim, drop_dir


def test_with_profile_publish_munge_the_record_goes_through_the_drop_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dropbox.munge, "encode", lambda payload, *a, **k: payload)
    sim, drop_dir = munge_sim(tmp_path, monkeypatch)
    sig = cpu_record(sim)
    run_cpu_ticks(sim, 12, 8e9)
    end_cpu_job(sim)
    ((path,),) = [list(drop_dir.glob("*.munge"))]
    payload = dropbox.Drop.from_json_bytes(path.read_bytes(), str(path))
    assert (payload.signature, payload.node, payload.samples) == (sig, sim.daemon.node_name, ())
    assert payload.cpu_usage is not None and payload.cpu_usage.ticks == 11
    assert payload.cpu_usage.mem_bw_bytes_per_s_per_cpu == pytest.approx(8e9 / CPU_CORES)
    ((_t, event),) = sim.events("usage-publish", CPU)
    assert event["reason"].endswith(f"(job ended), handed to the controller as {path}")
    assert not sim.store.root.exists()  # the node writes nothing into the store


def test_a_munge_that_cannot_be_run_is_one_event_and_the_tick_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A munge binary the kernel cannot execute: subprocess raises OSError (ENOEXEC).
    broken = tmp_path / "munge"
    broken.write_bytes(b"\x00not an executable\n")
    broken.chmod(0o755)
    monkeypatch.setattr(dropbox.munge, "_tool", lambda name: str(broken))
    sim, drop_dir = munge_sim(tmp_path, monkeypatch)
    sig = cpu_record(sim)
    run_cpu_ticks(sim, 12, 8e9)
    end_cpu_job(sim)
    ((_t, event),) = sim.events("usage-publish", CPU)
    assert event["reason"].startswith(f"cannot hand memory bandwidth of {sig} to the controller")
    assert "Exec format error" in event["reason"]
    assert not list(drop_dir.iterdir())
    run_ticks(sim, 2)  # ticks go on (the DNN job still trains)


@pytest.mark.parametrize(("src", "probed"), [("prior:alexnet", True), ("profile", False)])
def test_a_job_sized_by_a_prior_is_still_profiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, src: str, probed: bool
) -> None:
    """The hook's record says where the job's cores came from: a prior from its name is no
    profile of its own, so coda-node probes it (its record alone, while the store has no
    profile of the job, counts as a profile only for src=profile or global)."""
    sim = make_sim(tmp_path, monkeypatch)
    sim.store.ensure_root()
    job = sim.node.jobs[DNN]
    assert job.admin_comment is not None
    job.admin_comment = job.admin_comment.replace("src=profile", f"src={src}")
    full = len(job.cpus)
    probed_ticks = 0
    for _ in range(60):
        sim.advance()
        sim.write_progress(DNN, RATE)
        sim.tick()
        probed_ticks += len(sim.cpuset(DNN)) < full
    assert (probed_ticks > 0) is probed, sim.timeline
