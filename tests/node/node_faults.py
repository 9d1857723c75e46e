"""Fault injection for coda-node on the confined dev cluster: SIGKILL the real daemon at
random points while admin limits of mixed kinds come and go, and check after each restart
that every job holds what it should.

Used by tests/node/test_node_faults_slurm.py (a few kills) and bench/bench_fault_injection.py
(many). Two jobs share the host's CPUs (an ``OverSubscribe=FORCE:2`` partition): a GPU job
and a CPU job, each allocated every CPU of the host. Each round:

1. new limits for some jobs: none, ``--cores 1``, ``--cpus <one CPU>``, ``--cpu-quota``,
   or cores and quota together (written as ``coda-node limit`` / ``release`` write them);
2. the running daemon is killed with SIGKILL: half the time a random moment within its
   next two intervals, half the time a few milliseconds after it rewrote its state file,
   which is when it starts writing the jobs' cgroups;
3. sometimes what systemd's ``ExecStopPost`` does (``coda-node restore``: every job must
   then hold Slurm's allocation at once), sometimes the limits are released while the
   daemon is down, sometimes the state file is damaged (cut in half, or bytes that are
   not UTF-8);
4. a new daemon starts; every job must reach what the limits now say (a limited cpuset of
   the right size inside the allocation, every step and thread inside it, the quota in
   coda's cpu cgroup) or, unlimited, Slurm's allocation (its cpuset, its threads' affinity,
   no quota), within ``converge_timeout_s``.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coda_node.enforce.state import STATE_FILE, Limit, save_limits
from coda_node.system.cpulist import format_cpulist, parse_cpulist
from slurm_plugin.devtools.cluster import NODE_NAME, DevCluster

CPUSET = Path("/sys/fs/cgroup/cpuset")
CODA_CPU = Path("/sys/fs/cgroup/cpu/coda")
SLEEP = "#!/bin/bash\nsleep 100000\n"
QUOTAS = (0.3, 0.5, 1.0)

FAULT_CONF = "NodeIntervalS=0.2\nNodeProfile=no\nNodeContention=no\n"
"""A fast daemon (more ticks, and so more kills inside one, per second of the run) that
acts on admin limits only."""


def fault_cluster(root: Path) -> DevCluster:
    """The confined dev cluster the faults are injected on (not started)."""
    return DevCluster(
        root,
        cgroups=True,
        coda_conf_extra=FAULT_CONF,
        extra_partitions=(
            f"PartitionName=shared Nodes={NODE_NAME} OverSubscribe=FORCE:2 "
            "MaxTime=INFINITE State=UP\n"
        ),
    )


@dataclass
class Outcome:
    kills: int = 0
    wrong: list[str] = field(default_factory=list)
    """One line per restart after which a job did not reach what it should."""
    converge_s: list[float] = field(default_factory=list)
    """Per restart that found a job not as it should be: from the new daemon's start until
    every job held what it should (restarts that found everything right take no time)."""
    restarts_right: int = 0
    """Restarts that found every job as it should be already."""
    mid_change: int = 0
    """Kills that left some job neither as it was nor as the new limits want it."""
    restores: int = 0
    damaged: int = 0
    released_while_down: int = 0

    def summary(self) -> str:
        conv = sorted(self.converge_s)
        if conv:
            p95 = conv[min(len(conv) - 1, int(0.95 * len(conv)))]
            times = (
                f"converged in p50 {statistics.median(conv):.2f} s, p95 {p95:.2f} s, "
                f"max {conv[-1]:.2f} s"
            )
        else:
            times = "no restart had anything to put right"
        return (
            f"kills {self.kills}, wrong states {len(self.wrong)}; "
            f"{len(conv)} restarts found a job to put right, {times}; "
            f"{self.mid_change} kills mid-change, {self.restores} coda-node restore, "
            f"{self.damaged} damaged state files, {self.released_while_down} releases "
            "while down"
        )


def _job_dir(job_id: int) -> Path | None:
    hits = list(CPUSET.glob(f"slurm_{NODE_NAME}/uid_*/job_{job_id}"))
    return hits[0] if hits else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _allowed(tid: int) -> frozenset[int] | None:
    text = _read(Path(f"/proc/{tid}/status"))
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", text or "", re.M)
    return parse_cpulist(m.group(1)) if m else None


class FaultInjector:
    """Kills and restarts coda-node on ``cluster`` (started) with jobs running on it."""

    def __init__(
        self,
        cluster: DevCluster,
        *,
        seed: int,
        converge_timeout_s: float = 15.0,
        log_dir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.converge_timeout_s = converge_timeout_s
        self.log_dir = log_dir or cluster.root / "log"
        self.jobs: dict[int, frozenset[int]] = {}
        """Job -> the CPUs Slurm allocated it (scontrol's CPU_IDs)."""
        self.limits: dict[int, Limit] = {}
        self.state_file = cluster.node_state_dir / STATE_FILE
        self._daemon: subprocess.Popen[bytes] | None = None
        self._starts = 0

    # -- jobs ------------------------------------------------------------------------
    def start_jobs(self) -> None:
        for args in (["--gpus=1"], []):
            job_id, _ = self.cluster.sbatch(["-p", "shared", "-c2", *args], SLEEP)
            self.jobs[job_id] = frozenset()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(self._ready(j) for j in self.jobs):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"jobs {sorted(self.jobs)} did not start")
        for job_id in self.jobs:
            line = self.cluster.run(["scontrol", "-d", "-o", "show", "job", str(job_id)]).stdout
            m = re.search(r" CPU_IDs=(\S+)", line)
            assert m is not None, line
            self.jobs[job_id] = parse_cpulist(m.group(1))

    def _ready(self, job_id: int) -> bool:
        d = _job_dir(job_id)
        return d is not None and bool(_read(d / "step_batch" / "tasks"))

    # -- what each job should hold ---------------------------------------------------
    def mismatches(self) -> list[str]:
        """What differs from the limits (or, without one, from Slurm's allocation)."""
        out = []
        for job_id, allocation in self.jobs.items():
            d = _job_dir(job_id)
            if d is None:
                out.append(f"job {job_id}: gone")
                continue
            limit = self.limits.get(job_id)
            cpus = parse_cpulist(_read(d / "cpuset.cpus") or "")
            slim = limit is not None and (limit.cores is not None or limit.cpus is not None)
            if not slim:
                ok = cpus == allocation
            elif limit is not None and limit.cpus is not None:
                ok = cpus == frozenset(limit.cpus)
            else:
                ok = len(cpus) == (limit.cores if limit else 0) and cpus <= allocation
            if not ok:
                out.append(f"job {job_id}: cpuset {format_cpulist(cpus)} under {limit}")
            for step in sorted(d.glob("step_*")):
                held = parse_cpulist(_read(step / "cpuset.cpus") or "")
                if held and held != cpus:
                    out.append(f"job {job_id}: {step.name} cpuset {format_cpulist(held)}")
                for tid in (int(t) for t in (_read(step / "tasks") or "").split()):
                    allowed = _allowed(tid)
                    if allowed is not None and allowed != cpus:
                        out.append(f"job {job_id}: thread {tid} on {format_cpulist(allowed)}")
            quota = _read(CODA_CPU / f"job_{job_id}" / "cpu.cfs_quota_us")
            want = None if limit is None else limit.quota_cores
            kept = len(allocation)
            if limit is not None and limit.cores is not None:
                kept = limit.cores
            elif limit is not None and limit.cpus is not None:
                kept = len(limit.cpus)
            if want is not None and want >= kept:
                want = None  # a cap at or above the CPUs it keeps changes nothing
            if want is None and quota is not None:
                out.append(f"job {job_id}: quota {quota} µs with no quota limit")
            elif want is not None and quota != str(round(want * 100_000)):
                out.append(f"job {job_id}: quota {quota} µs under {limit}")
        return out

    def _random_limits(self) -> dict[int, Limit]:
        limits = dict(self.limits)
        for job_id, allocation in self.jobs.items():
            if self.rng.random() > 0.6:
                continue
            kind = self.rng.choice(["none", "cores", "cpus", "quota", "cores+quota"])
            quota = self.rng.choice(QUOTAS)
            if kind == "none":
                limits.pop(job_id, None)
            elif kind == "cores":
                limits[job_id] = Limit(cores=1)
            elif kind == "cpus":
                limits[job_id] = Limit(cpus=(self.rng.choice(sorted(allocation)),))
            elif kind == "quota":
                limits[job_id] = Limit(quota_cores=quota)
            else:
                limits[job_id] = Limit(cores=1, quota_cores=quota)
        return limits

    # -- the daemon ------------------------------------------------------------------
    def start_daemon(self) -> None:
        self._starts += 1
        log = (self.log_dir / f"coda-node-fault-{self._starts:04d}.log").open("wb")
        with log:
            self._daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "coda_node.cli",
                    "run",
                    "--conf",
                    str(self.cluster.coda_conf),
                ],
                env=self.cluster.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill_daemon(self) -> None:
        if self._daemon is not None and self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGKILL)
            self._daemon.wait(timeout=20)
        self._daemon = None

    def stop_daemon(self) -> None:
        """SIGTERM: the daemon puts every job back before it exits."""
        if self._daemon is not None and self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGTERM)
            try:
                self._daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._daemon.kill()
                self._daemon.wait()
        self._daemon = None

    def _kill_at_a_random_point(self, interval_s: float) -> None:
        if self.rng.random() < 0.5:
            time.sleep(self.rng.uniform(0, 2 * interval_s))
        else:
            # A few milliseconds after the state file changes: the write-ahead record is on
            # disk and the cgroup writes it covers are under way.
            before = self._stat()
            deadline = time.monotonic() + 3 * interval_s
            while self._stat() == before and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(self.rng.uniform(0, 0.004))
        self.kill_daemon()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.state_file.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def restore(self) -> list[str]:
        """``coda-node restore``, as systemd runs it after the daemon stopped; what differs
        from Slurm's allocation afterwards."""
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "coda_node.cli",
                "restore",
                "--conf",
                str(self.cluster.coda_conf),
            ],
            env=self.cluster.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0 or "Traceback" in proc.stderr:
            return [f"coda-node restore exited {proc.returncode}: {proc.stderr.strip()[-300:]}"]
        held, self.limits = self.limits, {}
        try:
            return self.mismatches()
        finally:
            self.limits = held

    def _damage(self) -> None:
        try:
            text = self.state_file.read_bytes()
        except FileNotFoundError:
            text = b"{}"
        if self.rng.random() < 0.5:
            self.state_file.write_bytes(text[: len(text) // 2])
        else:
            self.state_file.write_bytes(b"\xff\xfe" + text[2:])

    # -- the run ---------------------------------------------------------------------
    def run(self, kills: int, interval_s: float = 0.2) -> Outcome:
        """``kills`` rounds; the daemon is left running (stop it with :meth:`stop_daemon`)."""
        out = Outcome()
        if self._daemon is None:
            self.start_daemon()
        for round_no in range(1, kills + 1):
            before = list(self.limits.items())
            self.limits = self._random_limits()
            save_limits(self.cluster.node_state_dir, self.limits)
            self._kill_at_a_random_point(interval_s)
            out.kills += 1
            now = self.mismatches()
            if now:
                held, self.limits = self.limits, dict(before)
                if self.mismatches():
                    out.mid_change += 1
                self.limits = held
            if self.rng.random() < 0.15:
                out.damaged += 1
                self._damage()
            if self.rng.random() < 0.25:
                out.restores += 1
                for problem in self.restore():
                    out.wrong.append(f"kill {round_no}: after coda-node restore: {problem}")
            if self.rng.random() < 0.15:
                out.released_while_down += 1
                self.limits = {}
                save_limits(self.cluster.node_state_dir, {})
            started = time.monotonic()
            self.start_daemon()
            problems = self.mismatches()
            if not problems:
                out.restarts_right += 1
                continue
            while problems and time.monotonic() - started < self.converge_timeout_s:
                time.sleep(0.05)
                problems = self.mismatches()
            if problems:
                out.wrong.append(f"kill {round_no}: " + "; ".join(problems))
            else:
                out.converge_s.append(time.monotonic() - started)
        return out


@contextlib.contextmanager
def injector(cluster: DevCluster, *, seed: int) -> Iterator[FaultInjector]:
    """Jobs started on ``cluster``, a daemon running; everything put back afterwards."""
    inj = FaultInjector(cluster, seed=seed)
    inj.start_jobs()
    try:
        yield inj
    finally:
        inj.kill_daemon()
        inj.limits = {}
        save_limits(cluster.node_state_dir, {})
        inj.restore()
        cluster.run(["scancel", "-u", "root"], check=False)
