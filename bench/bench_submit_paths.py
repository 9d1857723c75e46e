"""Server-side submit cost of each job_submit/coda path, in blocks, next to Lua and no plugin.

Run as root: ``.venv/bin/python bench/bench_submit_paths.py [--jobs 400] [--block 20]
[--out results.json]``

The same four private one-node clusters as ``bench/bench_submit.py`` (whose set-up this
reuses): ``none`` (no job_submit plugin), ``lua`` (``bench/job_submit.lua``), ``coda``
(the plugin as built) and ``coda-b`` (the plugin built again with ``--coda-b-cflags``;
by default ``-DCODA_ARENA_KEEP=0``: Python's stack chunks are not kept from one RPC
thread to the next; empty: the same plugin, an A/A check).  Two sequential phases, every
job ``sbatch --hold --gpus=1 --comment=coda:workload=resnet50``:

* ``repeated``: every job the same script, so coda answers all but the first from the
  plan in its decision memo;
* ``never seen``: every job a script of its own (``--wrap`` with a job number), so coda
  decides each one.

Jobs go round-robin over the clusters in rotating order.  Every ``--block`` rounds each
cluster's ``sdiag`` mean time of REQUEST_SUBMIT_BATCH_JOB is read and reset, so each
block gives one server-side mean per cluster from the same stretch of time; a block's
"added cost" is its mean minus ``none``'s.  The medians over blocks resist what a busy
shared machine does to one stretch, where a whole-phase mean (bench_submit.py's sdiag
figure) takes every stall in.  The in-hook time of each coda path comes from the
clusters' decision journals (``hook_us`` of the phase's entries).  Jobs are read back
and checked as in bench_submit.py, then cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_submit import (
    CODA_CONFIGS,
    CONFIGS,
    JOB_SCRIPT,
    PLUGINS,
    WORKLOAD,
    BenchCluster,
    Submission,
    build_plugin,
    cancel_all,
    check_jobs,
    machine_info,
    percentile,
    rotated,
    sdiag_reset,
    sdiag_submit,
    stop_orphan_munged,
    workload_table,
    write_lua_script,
    write_profiles,
)

from slurm_plugin.devtools.cluster import DevCluster, DevClusterError

PHASES = ("repeated", "never seen")
CODA_B_CFLAGS = "-DCODA_ARENA_KEEP=0"
BOOTSTRAP_RESAMPLES = 2000


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_blocks(
    clusters: Sequence[BenchCluster], jobs: int, block: int, args: Sequence[str]
) -> tuple[list[Submission], list[dict[str, dict[str, float] | None]]]:
    """``jobs`` rounds (one job per cluster each); sdiag read and reset every ``block``."""
    subs: list[Submission] = []
    blocks: list[dict[str, dict[str, float] | None]] = []
    for bc in clusters:
        sdiag_reset(bc)
    for i in range(jobs):
        for bc in rotated(clusters, i):
            subs.append(bc.submit(i, args))
        if (i + 1) % block == 0 or i + 1 == jobs:
            blocks.append({bc.name: sdiag_submit(bc) for bc in clusters})
            for bc in clusters:
                sdiag_reset(bc)
    return subs, blocks


def journal_hook_us(path: Path, t0_s: float, t1_s: float) -> list[float]:
    """``hook_us`` of the decision journal's entries written between ``t0_s`` and ``t1_s``."""
    out: list[float] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        t = entry.get("t")
        if isinstance(t, int | float) and t0_s <= t <= t1_s and "hook_us" in entry:
            out.append(float(entry["hook_us"]))
    return out


def _median_ci(values: Sequence[float], rng: random.Random) -> tuple[float, float]:
    meds = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        meds.append(statistics.median(rng.choice(values) for _ in values))
    return percentile(meds, 2.5), percentile(meds, 97.5)


def analyse_blocks(
    blocks: Sequence[dict[str, dict[str, float] | None]], rng: random.Random
) -> dict[str, Any]:
    """Per configuration: block means (µs), the added cost over ``none`` per block, and
    their medians (with a bootstrap interval of the added cost's median)."""
    usable = [b for b in blocks if all((b.get(c) or {}).get("count") for c in CONFIGS)]
    out: dict[str, Any] = {"blocks": len(usable)}
    if not usable:
        return out
    mean_us = {c: [float(b[c]["ave_us"]) for b in usable] for c in CONFIGS}  # type: ignore[index]
    for c in CONFIGS:
        added = [m - n for m, n in zip(mean_us[c], mean_us["none"], strict=True)]
        lo, hi = _median_ci(added, rng) if c != "none" else (0.0, 0.0)
        out[c] = {
            "block_mean_us": mean_us[c],
            "median_us": statistics.median(mean_us[c]),
            "added_us": added,
            "added_median_us": statistics.median(added),
            "added_median_ci95_us": [lo, hi],
            "ratio_over_none": statistics.median(
                m / n for m, n in zip(mean_us[c], mean_us["none"], strict=True)
            ),
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), kernel {m.get('kernel')}, "
        f"Debian {m.get('debian_version')}, {m.get('slurm')}, Python {m.get('python')}; "
        f"{report['args']['jobs']} jobs per cluster per phase, blocks of "
        f"{report['args']['block']} rounds; coda-b's plugin built with "
        f"{report['args']['coda_b_cflags'] or 'the same flags as coda'}\n",
        "**server side** (sdiag mean of REQUEST_SUBMIT_BATCH_JOB per block; medians over "
        "blocks, µs)\n",
        "| phase | configuration | blocks | median block mean | added over none "
        "| 95 % CI | x none | added / Lua's added | in-hook p50 | in-hook p90 |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for phase, data in report["phases"].items():
        a = data["server"]
        lua_added = (a.get("lua") or {}).get("added_median_us")
        for c in CONFIGS:
            s = a.get(c)
            if s is None:
                continue
            lo, hi = s["added_median_ci95_us"]
            rel = (
                f"{s['added_median_us'] / lua_added:.1f}"
                if c not in ("none", "lua") and lua_added and lua_added > 0
                else "-"
            )
            hook = data["in_hook_us"].get(c) or {}
            lines.append(
                f"| {phase} | {c} | {a['blocks']} | {s['median_us']:.0f} | "
                f"{s['added_median_us']:+.0f} | {lo:+.0f} to {hi:+.0f} | "
                f"{s['ratio_over_none']:.3f} | {rel} | "
                f"{_us(hook.get('p50'))} | {_us(hook.get('p90'))} |"
            )
    lines.append("")
    lines.append("**correctness** (every job read back with `scontrol -o show job`)\n")
    lines.append("| phase | configuration | accepted | CpusPerTres seen | user msgs | ok |")
    lines.append("|---|---|--:|---|--:|---|")
    for phase, data in report["phases"].items():
        for c, chk in data["checks"].items():
            seen = ", ".join(f"{k} x{v}" for k, v in chk["cpus_per_tres"].items())
            lines.append(
                f"| {phase} | {c} | {chk['accepted']} | {seen} | {chk['user_msgs']} | "
                f"{'yes' if chk['ok'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def _us(value: object) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--jobs", type=int, default=400, help="jobs per cluster per phase")
    p.add_argument("--block", type=int, default=20, help="rounds per sdiag block")
    p.add_argument("--profiles", type=int, default=10000, help="profiles (and Lua entries)")
    p.add_argument("--cpus-per-gpu", type=int, default=6)
    p.add_argument("--warmup", type=int, default=5, help="untimed jobs per cluster first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--aa", action="store_true", help="no job_submit plugin anywhere (A/A)")
    p.add_argument(
        "--coda-b-cflags",
        default=CODA_B_CFLAGS,
        help=f"C flags of the coda-b cluster's plugin build (default: {CODA_B_CFLAGS}; "
        "empty: the same plugin as coda)",
    )
    p.add_argument("--out", type=Path, default=None, help="also write JSON results here")
    args = p.parse_args(argv)
    if args.jobs < args.block or args.block < 1:
        p.error("--jobs >= --block >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench_submit_paths.py must run as root", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    root = Path(tempfile.mkdtemp(prefix="coda-bench-paths-", dir=args.workdir))
    names, values = workload_table(args.profiles, args.cpus_per_gpu, args.seed)
    started: list[BenchCluster] = []
    try:
        coda_b_plugin = (
            build_plugin(root / "coda-b-plugin", args.coda_b_cflags) if args.coda_b_cflags else None
        )
        clusters = [
            BenchCluster(
                name,
                DevCluster(
                    root / name,
                    job_submit_plugins="" if args.aa else PLUGINS[name],
                    plugin_file=coda_b_plugin if name == "coda-b" else None,
                ),
            )
            for name in CONFIGS
        ]
        by_name = {bc.name: bc.cluster for bc in clusters}
        for name in CODA_CONFIGS:
            write_profiles(by_name[name].profile_store, names, values)
        by_name["lua"].etc.mkdir(parents=True, exist_ok=True)
        write_lua_script(by_name["lua"].etc / "job_submit.lua", names, values)
        for bc in clusters:
            print(f"starting cluster {bc.name} in {bc.cluster.root} ...", file=sys.stderr)
            started.append(bc)
            bc.cluster.up()
            bc.script = bc.cluster.root / "tmp" / "bench-job.sh"
            bc.script.write_text(JOB_SCRIPT)
        sbatch_args = [
            "--hold",
            "--gpus=1",
            f"--comment=coda:workload={WORKLOAD}",
            "--job-name=bench",
        ]
        warm = [bc.submit(i, sbatch_args) for i in range(args.warmup) for bc in clusters]
        bad = [s for s in warm if s.returncode != 0]
        if bad:
            raise DevClusterError(f"warm-up sbatch failed on {bad[0].config}", bad[0].stderr)
        for bc in clusters:
            cancel_all(bc, [s for s in warm if s.config == bc.name])

        rng = random.Random(args.seed)
        phases: dict[str, Any] = {}
        for phase in PHASES:
            for bc in clusters:
                bc.unique = phase == "never seen"
            print(f"phase {phase}: {args.jobs} jobs per cluster ...", file=sys.stderr)
            t0_s = time.time()
            subs, blocks = run_blocks(clusters, args.jobs, args.block, sbatch_args)
            t1_s = time.time()
            time.sleep(2.5)  # the journals are flushed once a second
            in_hook: dict[str, dict[str, float] | None] = {}
            for name in CODA_CONFIGS:
                hook_us = journal_hook_us(by_name[name].decision_journal, t0_s, t1_s)
                in_hook[name] = (
                    {
                        "n": len(hook_us),
                        "p50": percentile(hook_us, 50),
                        "p90": percentile(hook_us, 90),
                    }
                    if hook_us
                    else None
                )
            checks = {}
            for bc in clusters:
                mine = [s for s in subs if s.config == bc.name]
                checks[bc.name] = check_jobs(
                    bc, mine, args.cpus_per_gpu, rewritten=bc.name != "none" and not args.aa
                )
                cancel_all(bc, mine)
            phases[phase] = {
                "server": analyse_blocks(blocks, rng),
                "raw_blocks": blocks,
                "in_hook_us": in_hook,
                "checks": checks,
                "wall_s": t1_s - t0_s,
            }
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "machine": machine_info(clusters[0].cluster.env),
            "phases": phases,
        }
        print(markdown(report))
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        ok = all(chk["ok"] for data in phases.values() for chk in data["checks"].values())
        if not ok:
            print("correctness check FAILED (see the table)", file=sys.stderr)
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("interrupted; tearing the clusters down", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for bc in reversed(started):
            try:
                bc.cluster.down()
                stop_orphan_munged(bc.cluster)
            except Exception as exc:
                print(f"warning: stopping {bc.name}: {exc}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
