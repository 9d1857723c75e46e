"""Benchmark of submission latency: no job_submit plugin vs job_submit/lua vs job_submit/coda.

Run as root: ``.venv/bin/python bench/bench_submit.py [--jobs 200] [--parallel 16]
[--profiles 10000] [--unique] [--out results.json]``

Four private one-node clusters (:class:`slurm_plugin.devtools.cluster.DevCluster`) run side by
side, identical except for ``JobSubmitPlugins``:

* ``none``: no job_submit plugin;
* ``lua``: job_submit/lua running ``bench/job_submit.lua`` (copied beside slurm.conf, where
  Slurm looks for it) with a table of ``--profiles`` workload names, doing the rewrite coda
  does: set ``cpus_per_tres``, append to ``admin_comment``, one log line, one user message;
* ``coda``: job_submit/coda with ``--profiles`` profiles in its store (one of them the
  ``resnet50`` profile the jobs use), ``HookStatsFile=`` set so the hook writes its own
  in-hook timings (p50/p99) at every reload tick;
* ``coda-b``: the same with the coda.conf lines given by ``--coda-b-conf``
  (``;``-separated) and a plugin built with ``--coda-b-cflags``, for A/B comparisons;
  with neither, an A/A check of ``coda``.

With ``--unique`` every job has a script of its own (``--wrap`` with a job number), so no
job repeats an earlier one: coda's first-submission cost.  Without it every job is the
same, as resubmissions of one script are.

Every job is ``sbatch --hold --gpus=1 --comment=coda:workload=resnet50 script`` (held, so
nothing runs and only submission is measured). Phase 1 submits ``--jobs`` jobs per cluster
one at a time, round-robin across the clusters (the order rotates every round, so machine
noise and position effects hit all four equally); phase 2 submits ``--jobs`` more per
cluster from ``--parallel`` worker threads per cluster, the four queues filled interleaved.
The time of one job is the wall clock of its ``sbatch`` client process (fork/exec, munge
credential, RPC, slurmctld's job_submit and job creation, reply). Jobs are checked after
each phase (``scontrol -o show job``: ``CpusPerTres=gres:gpu:N`` on the lua and coda
clusters, not on the plain one) and then cancelled, so the queue stays small.

Besides the client wall clock, each phase reports slurmctld's own mean time for
REQUEST_SUBMIT_BATCH_JOB (``sdiag``, reset before the phase): the server side only, without
the client's fork/exec and munge noise. The bootstrap intervals of the ratios resample
rounds in pairs and assume independent rounds; ``--aa`` (all four clusters without a
plugin) shows how far identical clusters disagree on this machine.

The clusters are always torn down (also on Ctrl-C or SIGTERM); ``--keep`` keeps the
directory with the configs and logs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from coda_common.config.codaconf import load_config
from coda_common.store.profiles import Profile, ProfileStore, Sample
from slurm_plugin.devtools.cluster import DevCluster, DevClusterError, parse_scontrol_line

CONFIGS = ("none", "lua", "coda", "coda-b")
PLUGINS = {"none": "", "lua": "lua", "coda": "coda", "coda-b": "coda"}
CODA_B_CONF = ""
"""coda.conf lines of the ``coda-b`` cluster unless ``--coda-b-conf`` says otherwise."""
CODA_CONFIGS = ("coda", "coda-b")
RATIOS = (
    ("coda", "none"),
    ("lua", "none"),
    ("coda", "lua"),
    ("coda-b", "none"),
    ("coda", "coda-b"),
)
WORKLOAD = "resnet50"
LUA_TEMPLATE = Path(__file__).resolve().parent / "job_submit.lua"
LUA_MARKER = "--@@CPUS_PER_GPU_ENTRIES@@"
JOB_SCRIPT = "#!/bin/bash\n# coda submit benchmark: held, never runs\nsleep 1\n"
SBATCH_TIMEOUT_S = 60.0
BOOTSTRAP_RESAMPLES = 2000


# -- results -----------------------------------------------------------------------------


@dataclass(slots=True)
class Submission:
    """One timed sbatch call."""

    config: str
    index: int
    elapsed_s: float
    start_s: float
    job_id: int | None
    stderr: str
    returncode: int


@dataclass(slots=True)
class BenchCluster:
    name: str
    cluster: DevCluster
    script: Path = Path()
    unique: bool = False
    """Every job a script of its own (``--wrap`` with a number never used before)."""
    submitted: itertools.count = field(default_factory=itertools.count)

    def submit(self, index: int, extra_args: Sequence[str]) -> Submission:
        if self.unique:
            job = ["--wrap", f"sleep 1 # coda bench job {next(self.submitted)}"]
        else:
            job = [str(self.script)]
        argv = ["sbatch", "--parsable", *extra_args, *job]
        start = time.perf_counter()
        proc = self.cluster.run(argv, check=False, timeout_s=SBATCH_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        job_id: int | None = None
        if proc.returncode == 0:
            try:
                job_id = int(proc.stdout.strip().split(";")[0])
            except ValueError:
                job_id = None
        return Submission(self.name, index, elapsed, start, job_id, proc.stderr, proc.returncode)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100), as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(times_s: Sequence[float]) -> dict[str, float | int]:
    ms = [t * 1000.0 for t in times_s]
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p90_ms": percentile(ms, 90),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


def bootstrap_ratio_ci(
    num: Sequence[float],
    den: Sequence[float],
    stat: Callable[[Sequence[float]], float],
    rng: random.Random,
) -> tuple[float, float]:
    """95 % bootstrap interval of ``stat(num) / stat(den)``, resampling rounds in pairs
    (submission i of both configurations ran next to each other in time)."""
    n = min(len(num), len(den))
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(stat([num[i] for i in idx]) / stat([den[i] for i in idx]))
    return percentile(ratios, 2.5), percentile(ratios, 97.5)


def _p90(values: Sequence[float]) -> float:
    return percentile(values, 90)


# -- set-up --------------------------------------------------------------------------------


def write_profiles(store_dir: Path, names: Sequence[str], values: dict[str, int]) -> float:
    """One confident global profile per workload name; returns the seconds it took."""
    store = ProfileStore(store_dir)
    store.ensure_root()
    now = time.time()
    start = time.perf_counter()
    for i, name in enumerate(names):
        cpg = values[name]
        samples = tuple(
            Sample(
                cores=float(c),
                throughput=100.0 * min(c, cpg) / cpg,
                gpus=1,
                nodes=1,
                gpu_model="a100",
                node="gpu01",
            )
            for c in (1, 2, 4, 8)
        )
        store.write(
            Profile(
                signature=f"workload:*:{name}",
                workload=name,
                cpus_per_gpu=cpg,
                confidence=0.95,
                n_samples=len(samples),
                updated_unix_s=now,
                source="bench_submit",
                gpu_model="a100",
                samples=samples,
            )
        )
        if (i + 1) % 2000 == 0:
            print(f"  {i + 1}/{len(names)} profiles written", file=sys.stderr)
    return time.perf_counter() - start


def write_lua_script(dest: Path, names: Sequence[str], values: dict[str, int]) -> None:
    template = LUA_TEMPLATE.read_text()
    if LUA_MARKER not in template:
        raise SystemExit(f"{LUA_TEMPLATE} lacks the marker line {LUA_MARKER}")
    entries = "\n".join(f'\t["{name}"] = {values[name]},' for name in names)
    dest.write_text(template.replace(LUA_MARKER, entries))


def workload_table(
    n_profiles: int, cpus_per_gpu: int, seed: int
) -> tuple[list[str], dict[str, int]]:
    """``n_profiles`` workload names (``resnet50`` among them) and their CPUs per GPU."""
    rng = random.Random(seed)
    names = [f"bench-{i:05d}" for i in range(n_profiles - 1)]
    names.insert(rng.randrange(len(names) + 1), WORKLOAD)
    values = {name: rng.randint(1, 16) for name in names}
    values[WORKLOAD] = cpus_per_gpu
    return names, values


def machine_info(env: dict[str, str]) -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run(
        ["sbatch", "--version"], env=env, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    debian = ""
    with_debian = Path("/etc/debian_version")
    if with_debian.exists():
        debian = with_debian.read_text().strip()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "debian_version": debian,
        "slurm": version,
        "python": platform.python_version(),
    }


# -- phases --------------------------------------------------------------------------------


def rotated(items: Sequence[BenchCluster], k: int) -> list[BenchCluster]:
    k %= len(items)
    return [*items[k:], *items[:k]]


def run_sequential(
    clusters: Sequence[BenchCluster], jobs: int, args: Sequence[str], offset: int = 0
) -> list[Submission]:
    out: list[Submission] = []
    for i in range(jobs):
        for bc in rotated(clusters, i + offset):
            out.append(bc.submit(i, args))
    return out


def run_parallel(
    clusters: Sequence[BenchCluster], jobs: int, workers: int, args: Sequence[str]
) -> list[Submission]:
    pools = {
        bc.name: ThreadPoolExecutor(max_workers=workers, thread_name_prefix=bc.name)
        for bc in clusters
    }
    futures: list[Future[Submission]] = []
    try:
        for i in range(jobs):
            for bc in rotated(clusters, i):
                futures.append(pools[bc.name].submit(bc.submit, i, args))
        return [f.result() for f in futures]
    finally:
        for pool in pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


def check_jobs(
    bc: BenchCluster, subs: Sequence[Submission], cpus_per_gpu: int, rewritten: bool
) -> dict[str, Any]:
    """Read every job of ``subs`` back from slurmctld. With ``rewritten`` every job must
    have ``CpusPerTres=gres:gpu:<cpus_per_gpu>`` (``gres/gpu`` from Slurm 23.11 on), without
    it none may."""
    ids = {s.job_id for s in subs if s.job_id is not None}
    out = bc.cluster.run(["scontrol", "-o", "show", "job"], timeout_s=120).stdout
    seen: Counter[str] = Counter()
    for line in out.splitlines():
        fields = parse_scontrol_line(line)
        try:
            job_id = int(fields.get("JobId", ""))
        except ValueError:
            continue
        if job_id in ids:
            seen[fields.get("CpusPerTres", "<unset>")] += 1
    wanted = f"gres:gpu:{cpus_per_gpu}"  # or gres/gpu:N, as this Slurm spells it
    found = sum(seen.values())
    matching = seen.get(wanted, 0) + seen.get(wanted.replace("gres:", "gres/"), 0)
    ok = found == len(ids) == len(subs) and matching == (found if rewritten else 0)
    return {
        "jobs": len(subs),
        "accepted": len(ids),
        "read_back": found,
        "cpus_per_tres": dict(seen),
        "expected": wanted if rewritten else f"anything but {wanted}",
        "matching": matching,
        "user_msgs": sum(1 for s in subs if f"--cpus-per-gpu={cpus_per_gpu}" in s.stderr),
        "ok": ok,
    }


def cancel_all(bc: BenchCluster, subs: Sequence[Submission]) -> None:
    ids = [str(s.job_id) for s in subs if s.job_id is not None]
    for start in range(0, len(ids), 500):
        bc.cluster.run(["scancel", *ids[start : start + 500]], check=False, timeout_s=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = bc.cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if not left:
            return
        time.sleep(0.5)
    print(f"warning: {bc.name}: jobs still queued after scancel", file=sys.stderr)


_SDIAG_SUBMIT_RE = re.compile(
    r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)"
)


def sdiag_reset(bc: BenchCluster) -> None:
    bc.cluster.run(["sdiag", "--reset"], timeout_s=30)


def sdiag_submit(bc: BenchCluster) -> dict[str, float] | None:
    """slurmctld's own count and mean time (µs) of REQUEST_SUBMIT_BATCH_JOB since the last
    reset: the server side of sbatch, from RPC receipt to reply, plugins included."""
    m = _SDIAG_SUBMIT_RE.search(bc.cluster.run(["sdiag"], timeout_s=30).stdout)
    if m is None:
        return None
    return {"count": int(m.group(1)), "ave_us": int(m.group(2)), "total_us": int(m.group(3))}


def read_hook_stats(path: Path, min_calls: int, timeout_s: float = 15.0) -> dict[str, Any] | None:
    """The hook's stats file once it counts at least ``min_calls`` calls."""
    deadline = time.monotonic() + timeout_s
    data: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            data = None
        if data is not None and int(data.get("calls", 0)) >= min_calls:
            return data
        time.sleep(0.5)
    return data


_ACTIVE_RE = re.compile(r"job_submit/coda: active: .*profiles=(\d+).*?(?: load_ms=([0-9.]+))?$")


def ctld_log_facts(bc: BenchCluster) -> dict[str, Any]:
    try:
        text = bc.cluster.ctld_log.read_text(errors="replace")
    except OSError:
        return {}
    facts: dict[str, Any] = {
        "error_lines": [
            ln for ln in text.splitlines() if "job_submit" in ln and "error" in ln.lower()
        ][:10],
    }
    if bc.name in CODA_CONFIGS:
        for line in text.splitlines():
            m = _ACTIVE_RE.search(line)
            if m:
                facts["profiles_loaded"] = int(m.group(1))
                facts["load_ms"] = float(m.group(2)) if m.group(2) else None
        facts["set_lines"] = text.count("action=set")
    elif bc.name == "lua":
        facts["set_lines"] = text.count("action=set")
    return facts


def build_plugin(out_dir: Path, cflags: str) -> Path:
    """job_submit_coda.so built into ``out_dir`` with ``cflags`` added (csrc/build_plugin.py)."""
    script = Path(__file__).resolve().parent.parent / "csrc" / "build_plugin.py"
    env = {**os.environ, "CFLAGS": f"{os.environ.get('CFLAGS', '')} {cflags}".strip()}
    print(f"building the coda-b plugin with CFLAGS={env['CFLAGS']!r} ...", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, str(script), str(out_dir)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])


def stop_orphan_munged(cluster: DevCluster) -> None:
    """Stop this cluster's munged if ``up()`` failed before recording its pid.

    DevCluster saves munged's pid only together with slurmctld's, so ``down()`` cannot see a
    munged whose slurmctld never started. Only a process whose command line names this
    cluster's own munge socket is signalled.
    """
    pid_file = cluster.root / "munge" / "munged.pid"
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return
    if str(cluster.munge_socket) not in cmdline:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)


# -- report --------------------------------------------------------------------------------


def analyse(phases: dict[str, list[Submission]], seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    result: dict[str, Any] = {}
    for phase, subs in phases.items():
        by: dict[str, list[float]] = {c: [] for c in CONFIGS}
        failed: Counter[str] = Counter()
        for s in sorted(subs, key=lambda s: s.index):
            if s.returncode == 0:
                by[s.config].append(s.elapsed_s)
            else:
                failed[s.config] += 1
        stats = {c: {**summarize(by[c]), "failed": failed[c]} for c in CONFIGS if by[c]}
        ratios: dict[str, Any] = {}
        for num, den in RATIOS:
            if num not in stats or den not in stats:
                continue
            med = stats[num]["median_ms"] / stats[den]["median_ms"]
            p90 = stats[num]["p90_ms"] / stats[den]["p90_ms"]
            lo, hi = bootstrap_ratio_ci(by[num], by[den], statistics.median, rng)
            lo90, hi90 = bootstrap_ratio_ci(by[num], by[den], _p90, rng)
            ratios[f"{num}/{den}"] = {
                "median": med,
                "median_ci95": [lo, hi],
                "p90": p90,
                "p90_ci95": [lo90, hi90],
                "median_diff_ms": stats[num]["median_ms"] - stats[den]["median_ms"],
            }
        result[phase] = {
            "stats": stats,
            "ratios": ratios,
            "times_ms": {c: [round(t * 1000, 3) for t in by[c]] for c in CONFIGS},
        }
    return result


def markdown(report: dict[str, Any]) -> str:
    lines: list[str] = []
    m = report.get("machine") or {}
    lines.append(
        f"machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), kernel {m.get('kernel')}, "
        f"Debian {m.get('debian_version')}, {m.get('slurm')}, Python {m.get('python')}\n"
    )
    if report["args"].get("aa"):
        lines.append(
            "**A/A calibration**: no job_submit plugin on any of the four clusters; the "
            "names only label the clusters.\n"
        )
    for phase, data in report["phases"].items():
        lines.append(f"**{phase}** (per-job sbatch wall clock, ms)\n")
        lines.append("| configuration | jobs | median | p90 | mean | min | max | failed |")
        lines.append("|---|--:|--:|--:|--:|--:|--:|--:|")
        for c, s in data["stats"].items():
            lines.append(
                f"| {c} | {s['n']} | {s['median_ms']:.2f} | {s['p90_ms']:.2f} | "
                f"{s['mean_ms']:.2f} | {s['min_ms']:.2f} | {s['max_ms']:.2f} | "
                f"{s['failed']} |"
            )
        lines.append("")
        lines.append("| ratio | median | median 95 % CI | p90 | p90 95 % CI | median diff |")
        lines.append("|---|--:|--:|--:|--:|--:|")
        for name, r in data["ratios"].items():
            lo, hi = r["median_ci95"]
            lo90, hi90 = r["p90_ci95"]
            lines.append(
                f"| {name} | {r['median']:.3f} | {lo:.3f}-{hi:.3f} | {r['p90']:.3f} | "
                f"{lo90:.3f}-{hi90:.3f} | {r['median_diff_ms']:+.2f} ms |"
            )
        lines.append("")
    rpc = report.get("server_rpc") or {}
    if rpc:
        lines.append(
            "**server side** (slurmctld's sdiag: mean time of REQUEST_SUBMIT_BATCH_JOB, µs)\n"
        )
        lines.append(
            "| phase | "
            + " | ".join(CONFIGS)
            + " | "
            + " | ".join(f"{a}/{b}" for a, b in RATIOS)
            + " | "
            + " | ".join(f"{c} - none" for c in CONFIGS[1:])
            + " |"
        )
        lines.append("|---|" + "--:|" * (2 * len(CONFIGS) - 1 + len(RATIOS)))
        for phase, per in rpc.items():
            ave = {c: (per.get(c) or {}).get("ave_us") for c in CONFIGS}
            cells = [f"{ave[c]} (n={(per.get(c) or {}).get('count')})" for c in CONFIGS]
            ratios = [f"{ave[a] / ave[b]:.3f}" if ave[a] and ave[b] else "-" for a, b in RATIOS]
            ratios += [
                f"{ave[c] - ave['none']:+.0f}" if ave[c] and ave["none"] else "-"
                for c in CONFIGS[1:]
            ]
            lines.append(f"| {phase} | {' | '.join(cells)} | {' | '.join(ratios)} |")
        lines.append("")
    by_phase = {k: v for k, v in (report.get("hook_stats_by_phase") or {}).items() if v}
    if by_phase:
        lines.append(
            "**in-hook time** (job_submit/coda's own counters, HookStatsFile; cumulative)\n"
        )
        lines.append(
            "| cluster | counters up to the end of | profiles | calls | changed "
            "| fail_open | over_budget | p50 | p99 | max |"
        )
        lines.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for key, hook in by_phase.items():
            name, phase = key.split(" ", 1)
            label = "warm-up + sequential" if phase == "sequential" else f"all ({phase})"
            lines.append(
                f"| {name} | {label} | {hook.get('profiles')} | {hook.get('calls')} | "
                f"{hook.get('changed')} | {hook.get('fail_open')} | {hook.get('over_budget')} | "
                f"{_us(hook.get('p50_us'))} | {_us(hook.get('p99_us'))} | "
                f"{_us(hook.get('max_us'))} |"
            )
        lines.append("")
    else:
        lines.append("**in-hook time**: not available (no HookStatsFile data)\n")
    lines.append("**correctness** (every job read back with `scontrol -o show job`)\n")
    lines.append(
        "| phase | configuration | accepted | read back | CpusPerTres seen | user msgs | ok |"
    )
    lines.append("|---|---|--:|--:|---|--:|---|")
    for phase, per in report["checks"].items():
        for c, chk in per.items():
            seen = ", ".join(f"{k} x{v}" for k, v in chk["cpus_per_tres"].items())
            lines.append(
                f"| {phase} | {c} | {chk['accepted']} | {chk['read_back']} | {seen} | "
                f"{chk['user_msgs']} | {'yes' if chk['ok'] else 'NO'} |"
            )
    lines.append("")
    return "\n".join(lines)


def _us(value: object) -> str:
    return f"{value:.1f} µs" if isinstance(value, int | float) else "-"


# -- main ------------------------------------------------------------------------------------


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=200, help="jobs per cluster per phase")
    p.add_argument("--parallel", type=int, default=16, help="workers per cluster, phase 2")
    p.add_argument(
        "--profiles",
        type=int,
        default=10000,
        help="profiles in coda's store (and entries in the Lua table)",
    )
    p.add_argument(
        "--cpus-per-gpu",
        type=int,
        default=6,
        help="the resnet50 profile's (and Lua table's) CPUs per GPU",
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed jobs per cluster first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="parent of the temporary cluster directory (default: $TMPDIR)",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A calibration: start all four clusters without a job_submit plugin; the "
        "ratios then show the bias and noise between identical clusters",
    )
    p.add_argument(
        "--coda-b-conf",
        default=CODA_B_CONF,
        help="coda.conf lines (;-separated) of the coda-b cluster (default: none)",
    )
    p.add_argument(
        "--coda-b-cflags",
        default="",
        help="C flags of the coda-b cluster's own plugin build (default: the same plugin)",
    )
    p.add_argument(
        "--unique",
        action="store_true",
        help="give every job a script of its own, so none repeats an earlier one (coda's "
        "first-submission cost; without it every job is the same)",
    )
    p.add_argument("--keep", action="store_true", help="keep the cluster directory")
    p.add_argument("--out", type=Path, default=None, help="also write JSON results here")
    args = p.parse_args(argv)
    if args.jobs < 2 or args.parallel < 1 or args.profiles < 1 or args.cpus_per_gpu < 1:
        p.error("--jobs >= 2, --parallel >= 1, --profiles >= 1, --cpus-per-gpu >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench_submit.py must run as root (it starts slurmctld/slurmd/munged)", file=sys.stderr
        )
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)

    root = Path(tempfile.mkdtemp(prefix="coda-bench-submit-", dir=args.workdir))
    names, values = workload_table(args.profiles, args.cpus_per_gpu, args.seed)
    started: list[BenchCluster] = []
    try:
        clusters: list[BenchCluster] = []
        for name in CONFIGS:
            cl = DevCluster(
                root / name,
                job_submit_plugins="" if args.aa else PLUGINS[name],
                plugin_file=(
                    build_plugin(root / "coda-b-plugin", args.coda_b_cflags)
                    if name == "coda-b" and args.coda_b_cflags
                    else None
                ),
                coda_conf_extra=(
                    "".join(f"{line.strip()}\n" for line in args.coda_b_conf.split(";"))
                    if name == "coda-b"
                    else ""
                ),
            )
            clusters.append(BenchCluster(name, cl, unique=args.unique))
        by_name = {bc.name: bc.cluster for bc in clusters}
        coda = by_name["coda"]
        write_s = 0.0
        for name in CODA_CONFIGS:
            store = by_name[name].profile_store
            print(f"writing {len(names)} profiles into {store} ...", file=sys.stderr)
            write_s = write_profiles(store, names, values)
            print(f"  done in {write_s:.1f} s", file=sys.stderr)
        lua = by_name["lua"]
        lua.etc.mkdir(parents=True, exist_ok=True)
        write_lua_script(lua.etc / "job_submit.lua", names, values)

        for bc in clusters:
            print(f"starting cluster {bc.name} in {bc.cluster.root} ...", file=sys.stderr)
            started.append(bc)
            bc.cluster.up()
            bc.script = bc.cluster.root / "tmp" / "bench-job.sh"
            bc.script.write_text(JOB_SCRIPT)
        coda_cfg = load_config(coda.coda_conf)  # what the plugin itself read
        stats_files: dict[str, Path] = (
            {}
            if args.aa or coda_cfg.hook_stats_file is None
            else {
                name: path
                for name in CODA_CONFIGS
                if (path := load_config(by_name[name].coda_conf).hook_stats_file) is not None
            }
        )
        if coda_cfg.reload_interval_s != 1.0:
            print(
                f"warning: coda.conf has ReloadIntervalS={coda_cfg.reload_interval_s:g}",
                file=sys.stderr,
            )

        sbatch_args = [
            "--hold",
            "--gpus=1",
            f"--comment=coda:workload={WORKLOAD}",
            "--job-name=bench",
        ]
        warm = run_sequential(clusters, args.warmup, sbatch_args)
        bad = [s for s in warm if s.returncode != 0]
        if bad:
            raise DevClusterError(
                f"warm-up sbatch failed on {bad[0].config}", bad[0].stderr.strip()
            )
        for bc in clusters:
            cancel_all(bc, [s for s in warm if s.config == bc.name])

        phases: dict[str, list[Submission]] = {}
        checks: dict[str, dict[str, Any]] = {}
        phase_wall: dict[str, float] = {}
        hook_by_phase: dict[str, dict[str, Any] | None] = {}
        server_rpc: dict[str, dict[str, dict[str, float] | None]] = {}
        for phase in ("sequential", f"parallel x{args.parallel}"):
            print(f"phase {phase}: {args.jobs} jobs per cluster ...", file=sys.stderr)
            for bc in clusters:
                sdiag_reset(bc)
            t0 = time.perf_counter()
            if phase == "sequential":
                subs = run_sequential(clusters, args.jobs, sbatch_args)
            else:
                subs = run_parallel(clusters, args.jobs, args.parallel, sbatch_args)
            phase_wall[phase] = time.perf_counter() - t0
            server_rpc[phase] = {bc.name: sdiag_submit(bc) for bc in clusters}
            phases[phase] = subs
            checks[phase] = {}
            for bc in clusters:
                mine = [s for s in subs if s.config == bc.name]
                checks[phase][bc.name] = check_jobs(
                    bc, mine, args.cpus_per_gpu, rewritten=bc.name != "none" and not args.aa
                )
                cancel_all(bc, mine)
            # Cumulative counters: after the sequential phase they cover the warm-up and
            # that phase only; after the parallel phase, everything.
            calls = args.warmup + len(phases) * args.jobs
            for name, stats_file in stats_files.items():
                hook_by_phase[f"{name} {phase}"] = read_hook_stats(stats_file, calls)
            time.sleep(2.0)  # let the controllers write their state before the next phase

        hook = hook_by_phase.get(f"coda parallel x{args.parallel}")
        report: dict[str, Any] = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine_info(clusters[0].cluster.env),
            "sbatch_args": sbatch_args,
            "profile_write_s": write_s,
            "phase_wall_s": phase_wall,
            "phases": analyse(phases, args.seed),
            "server_rpc": server_rpc,
            "hook_stats": hook,
            "hook_stats_by_phase": hook_by_phase,
            "hook_stats_files": {name: str(path) for name, path in stats_files.items()},
            "checks": checks,
            "ctld_log": {bc.name: ctld_log_facts(bc) for bc in clusters},
        }
        print(markdown(report))
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
            print(f"wrote {args.out}", file=sys.stderr)
        all_ok = all(chk["ok"] for per in checks.values() for chk in per.values())
        if not all_ok:
            print("correctness check FAILED (see the table)", file=sys.stderr)
        return 0 if all_ok else 1
    except KeyboardInterrupt:
        print("interrupted; tearing the clusters down", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip down()
        for bc in reversed(started):
            try:
                bc.cluster.down()
                stop_orphan_munged(bc.cluster)
            except Exception as exc:  # keep tearing the others down
                print(f"warning: stopping {bc.name}: {exc}", file=sys.stderr)
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
