"""CPU time per tick and resident memory of coda-node's daemon on a fixture GPU node.

    .venv/bin/python bench/bench_node_tick.py [--ticks 200] [--dir DIR]     (as root)

The node is tests/node_fixtures.py's: 64 CPUs, 8 GPUs (NVML double), 32 Slurm jobs (16 GPU
jobs, 16 CPU jobs) in a cgroup v1 tree, scontrol answered in-process. Root is needed for
the /dev/nvidia* character devices. ``--dir`` puts the fixture (and so the state file,
which is fsynced on every save) on another filesystem; the default is the temp directory.

Measured with time.process_time (this process's CPU time, user + system), per tick:

1. ``Daemon.tick()`` with no limits;
2. ``Daemon.tick()`` with 8 GPU jobs held to 2 of their 3 CPUs (cpuset) and 8 CPU jobs
   capped at 0.5 cores (quota), in steady state: the first tick, which applies them, is
   shown on its own;
3. the parts of a tick, timed by calling them directly as ``tick()`` does: sampling
   (cgroups, scontrol cache, NVML), limits file + plan, reconcile (cgroup reads and writes),
   the status view, and state saves (the enforcer saves once per reconcile and ``tick()``
   once more; each is a JSON dump, fsync and rename).

Then the resident memory of this process (which also holds the fixture, pynvml and psutil)
and, for comparison, of a fresh ``python -c "import coda_node.daemon"``.
Targets: < 5 ms CPU per tick, < 60 MB resident.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from coda_node.daemon import Daemon, TickReport
from coda_node.policy import JobFacts, plan
from coda_node.state import Limit, load_limits
from tests.node_fixtures import FakeNode, build_node, mknod_reason

TARGET_TICK_MS = 5.0
TARGET_RSS_MB = 60.0
MB = 1024 * 1024


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _row(name: str, ms: list[float], target: str = "") -> str:
    line = f"{name:<36} {_pct(ms, 50):>7.3f} {_pct(ms, 99):>7.3f} {statistics.fmean(ms):>7.3f}"
    return f"{line}  {target}".rstrip()


def _verdict(ms: list[float]) -> str:
    p99 = _pct(ms, 99)
    return f"<{TARGET_TICK_MS:g} {'ok' if p99 < TARGET_TICK_MS else 'OVER'}"


def _tick_times_ms(daemon: Daemon, ticks: int) -> list[float]:
    out = []
    for _ in range(ticks):
        t0 = time.process_time()
        daemon.tick()
        out.append((time.process_time() - t0) * 1e3)
    return out


class _TimedSave:
    """Wraps the enforcer's save callback to count its calls and CPU time."""

    def __init__(self, save: Callable[[], None]) -> None:
        self.inner = save
        self.calls = 0
        self.cpu_s = 0.0

    def __call__(self) -> None:
        t0 = time.process_time()
        self.inner()
        self.cpu_s += time.process_time() - t0
        self.calls += 1


def _breakdown_ms(daemon: Daemon, ticks: int) -> tuple[dict[str, list[float]], int]:
    """Daemon.tick()'s steps, each timed, in its order; and the state saves per tick."""
    names = ("sample", "limits file + plan", "reconcile (without saves)", "status view")
    parts: dict[str, list[float]] = {name: [] for name in names}
    parts["state saves"] = []
    timed = _TimedSave(daemon.enforcer._save)
    daemon.enforcer._save = timed
    try:
        for _ in range(ticks):
            timed.cpu_s, timed.calls = 0.0, 0
            t0 = time.process_time()
            snap = daemon.sampler.sample()
            t1 = time.process_time()
            limits = load_limits(daemon.cfg.node_state_dir)
            facts = {
                job_id: JobFacts(
                    job_id=job_id,
                    allocated_cpus=daemon._allocated(job_id, view.cgroup),
                    is_dnn=view.kind == "dnn",
                )
                for job_id, view in snap.jobs.items()
                if view.cgroup is not None
            }
            targets, problems = plan(facts, limits, mba=daemon.mba_unavailable)
            t2 = time.process_time()
            cg_jobs = {j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None}
            results = daemon.enforcer.reconcile(cg_jobs, targets)
            t3 = time.process_time()
            saves_in_reconcile_s = timed.cpu_s
            report = TickReport(snapshot=snap, targets=targets, results=results)
            daemon.state.view = daemon._view(report, limits)
            t4 = time.process_time()
            timed()  # tick()'s own save, after the view
            if problems:
                raise AssertionError(f"the plan refused a limit: {problems}")
            parts["sample"].append((t1 - t0) * 1e3)
            parts["limits file + plan"].append((t2 - t1) * 1e3)
            parts["reconcile (without saves)"].append((t3 - t2 - saves_in_reconcile_s) * 1e3)
            parts["status view"].append((t4 - t3) * 1e3)
            parts["state saves"].append(timed.cpu_s * 1e3)
    finally:
        daemon.enforcer._save = timed.inner
    return parts, timed.calls


def _fresh_import_rss_mb() -> float:
    """Resident memory of a new interpreter that has imported coda_node.daemon."""
    code = "import sys, coda_node.daemon; print('ready', flush=True); sys.stdin.read()"
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=repo,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return psutil.Process(proc.pid).memory_info().rss / MB
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def _filesystem_of(path: Path) -> str:
    best = ("?", "?", "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, point, fs_type = line.split()[:3]
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best[2]):
            best = (fs_type, dev, point)
    return f"{best[0]} ({best[1]} on {best[2]})"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _limits(node: FakeNode) -> dict[int, Limit]:
    dnn = [j for j, job in sorted(node.jobs.items()) if job.kind == "dnn"][:8]
    cpu = [j for j, job in sorted(node.jobs.items()) if job.kind == "cpu"][:8]
    limits = {j: Limit(cores=2, reason="bench") for j in dnn}
    limits.update({j: Limit(quota_cores=0.5, reason="bench") for j in cpu})
    return limits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ticks", type=int, default=200, help="ticks per measurement")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the node")
    args = parser.parse_args()
    reason = mknod_reason()
    if reason is not None:
        print(f"bench_node_tick: cannot build the fixture node ({reason})", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="coda-node-bench-") as tmp:
        node = build_node(Path(tmp), version=1, cpus=64, gpus=8, jobs=32)
        daemon = node.daemon()
        daemon.tick()  # first tick: every job's scontrol, NVML init

        idle = _tick_times_ms(daemon, args.ticks)
        idle_parts, idle_saves = _breakdown_ms(daemon, args.ticks)

        node.set_limits(_limits(node))
        t0 = time.process_time()
        first = daemon.tick()
        first_ms = (time.process_time() - t0) * 1e3
        applied = sum(1 for r in first.results.values() if r.applied)
        writes_first = len(node.journal)
        limited = _tick_times_ms(daemon, args.ticks)
        writes_steady = len(node.journal) - writes_first
        lim_parts, lim_saves = _breakdown_ms(daemon, args.ticks)

        gc.collect()
        rss_mb = psutil.Process().memory_info().rss / MB
        scontrol = sum(node.slurm.scontrol_counts().values())
        jobs = len(node.jobs)
        where = _filesystem_of(Path(tmp))
        state_kib = node.state_file.stat().st_size / 1024

    fresh_mb = _fresh_import_rss_mb()

    print("coda-node tick: 64 CPUs, 8 GPUs, 32 jobs (16 GPU, 16 CPU), cgroup v1")
    print(f"command: {shlex.join(sys.orig_argv)}")
    print(f"python {sys.version.split()[0]} on {_cpu_model()}, {os.cpu_count()} CPUs")
    print(f"fixture and state file on {where}; state file {state_kib:.0f} KiB")
    print()
    print(f"CPU time per tick, ms ({args.ticks} ticks each)")
    print(f"{'':<36} {'p50':>7} {'p99':>7} {'mean':>7}  target")
    print(_row("no limits", idle, _verdict(idle)))
    print(_row("8 cpuset + 8 quota limits, steady", limited, _verdict(limited)))
    print(
        f"{'first tick applying the 16 limits':<36} {first_ms:>7.3f}  (one tick: "
        f"{applied} jobs changed, {writes_first} cgroup writes)"
    )
    print(f"cgroup writes in the {args.ticks} steady ticks: {writes_steady}")
    print(f"scontrol calls in all {4 * args.ticks + 2} ticks: {scontrol} for {jobs} jobs")
    for title, parts, saves in (
        ("no limits", idle_parts, idle_saves),
        ("8 cpuset + 8 quota limits, steady", lim_parts, lim_saves),
    ):
        print()
        print(f"where a tick's CPU time goes, ms ({title}; {saves} state saves per tick)")
        print(f"{'part':<36} {'p50':>7} {'p99':>7} {'mean':>7}")
        for name, ms in parts.items():
            print(_row(name, ms))
        total = [sum(v) for v in zip(*parts.values(), strict=True)]
        print(_row("sum of parts", total))
    print()
    print("resident memory, MB")
    verdict = "ok" if rss_mb < TARGET_RSS_MB else "OVER"
    print(f"{'this process after the ticks':<44} {rss_mb:>7.1f}  <{TARGET_RSS_MB:g} {verdict}")
    fresh = "fresh python -c 'import coda_node.daemon'"
    print(f"{fresh:<44} {fresh_mb:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
