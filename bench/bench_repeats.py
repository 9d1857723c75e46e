"""How often does a submission repeat an earlier one byte for byte, as job_submit/coda keys it?

job_submit/coda answers a job whose decision fields equal an earlier job's from a plan
decided before (``DecisionMemo``, slurm_plugin/hook/submit.py).  The memo keys on uid, job
name, partition, ``tres_per_node/job/task/socket``, ``cpus_per_tres``, ``cpus_per_task``,
``ntasks_per_node``, ``min_nodes``, ``num_tasks``, ``sockets_per_node``, comment, script and
``--prefer``; it holds at most ``MEMO_MAX_ENTRIES`` plans, empties itself when full, and is
emptied whenever the profile snapshot changes.

For each trace this prints the fraction of GPU submissions whose key equals an earlier
submission's key:

* ``overall``: any earlier submission;
* ``last N keys``: one of the last N distinct keys (an LRU window of the memo's size);
* ``memo``: the memo as built: N entries, emptied when full;
* ``memo + churn``: the same, also emptied at every reload tick (``ReloadIntervalS``, 1 s)
  after a profile file changed.  coda-node writes each running GPU job's usage record into
  its profile every ``NodeUsageFlushS`` (600 s) and when the job ends, and every write
  replaces the snapshot.  The trace's own start and end times give those writes, taking
  start = submission (no queueing) and every job's workload as profiled: the most churn.

The public traces of ``/work/shared/data`` (README there) hold no user, job name or script:
their keys use only the request fields they have, mapped to the key field they would land
in (fields the key does not read, such as memory or QOS, are left out), so each fraction
is an upper bound of what the full key gives.  ``--sacct FILE`` measures a site's own
accounting export, with whichever of these columns it has::

    sacct -a -X -P -S 2025-01-01 \\
        -o JobID,Submit,End,User,JobName,Partition,ReqTRES,ReqNodes,Comment,SubmitLine

(``SubmitLine`` from Slurm 23.02 on: the script's path and its options, a proxy for the
script; ``Comment`` needs ``AccountingStoreFlags=job_comment``).  Array tasks count once
(one submission); only jobs whose ``ReqTRES`` asks for ``gres/gpu`` count, unless
``--all-jobs``.

    .venv/bin/python bench/bench_repeats.py [--data-dir /work/shared/data] [--sacct FILE]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import sys
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = Path("/work/shared/data")
USAGE_FLUSH_S = 600.0
"""coda.conf's ``NodeUsageFlushS`` default: seconds between a running job's usage writes."""
RELOAD_INTERVAL_S = 1.0
"""coda.conf's ``ReloadIntervalS`` default: the reloader's tick, when a write is seen."""

KEY_FIELDS = (
    "uid",
    "name",
    "partition",
    "tres_per_*",
    "cpus_per_tres",
    "cpus_per_task",
    "ntasks_per_node",
    "min_nodes",
    "num_tasks",
    "sockets_per_node",
    "comment",
    "script",
    "prefer",
)


@dataclass(frozen=True, slots=True)
class Job:
    """One submission: when, until when it ran (None: unknown), and its key."""

    submit_s: float
    end_s: float | None
    key: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    source: str
    fields: str
    """The trace fields in the key, and the key field each stands for."""
    missing: tuple[str, ...]
    """Key fields the trace does not have."""
    jobs: list[Job]


@dataclass(frozen=True, slots=True)
class Result:
    jobs: int
    distinct_keys: int
    overall: float
    lru: float
    table: float
    table_churn: float | None
    snapshot_changes: int | None


def table_bound() -> int:
    """``MEMO_MAX_ENTRIES`` of the hook's decision memo."""
    sys.path.insert(0, str(REPO))
    from slurm_plugin.hook.submit import MEMO_MAX_ENTRIES

    return MEMO_MAX_ENTRIES


# -- measures ------------------------------------------------------------------------------


def repeat_overall(keys: Sequence[tuple[str, ...]]) -> float:
    seen: set[tuple[str, ...]] = set()
    hits = 0
    for key in keys:
        hits += key in seen
        seen.add(key)
    return hits / len(keys)


def repeat_lru(keys: Sequence[tuple[str, ...]], bound: int) -> float:
    """Hits among the last ``bound`` distinct keys."""
    window: OrderedDict[tuple[str, ...], None] = OrderedDict()
    hits = 0
    for key in keys:
        if key in window:
            hits += 1
            window.move_to_end(key)
        else:
            window[key] = None
            if len(window) > bound:
                window.popitem(last=False)
    return hits / len(keys)


def repeat_table(jobs: Sequence[Job], bound: int, resets_s: Sequence[float] | None = None) -> float:
    """Hits of the decision memo as built: at most ``bound`` entries, emptied when full
    (``DecisionMemo.add``) and at each time of ``resets_s`` (sorted; a new profile
    snapshot)."""
    table: set[tuple[str, ...]] = set()
    hits = 0
    next_reset = 0
    resets = resets_s or ()
    for job in jobs:
        if next_reset < len(resets) and resets[next_reset] <= job.submit_s:
            table.clear()
            next_reset = bisect.bisect_right(resets, job.submit_s, next_reset)
        if job.key in table:
            hits += 1
            continue
        if len(table) >= bound:
            table.clear()
        table.add(job.key)
    return hits / len(jobs)


def snapshot_changes(
    jobs: Iterable[Job], flush_s: float = USAGE_FLUSH_S, tick_s: float = RELOAD_INTERVAL_S
) -> list[float] | None:
    """The reload ticks at which the profile snapshot changes: every running job writes
    its usage every ``flush_s`` and when it ends (seen at the next tick).  None when the
    trace has no end times."""
    jobs = list(jobs)
    if not jobs or any(job.end_s is None for job in jobs):
        return None
    horizon_s = max(job.submit_s for job in jobs)  # no later submission can be affected
    ticks: set[float] = set()
    for job in jobs:
        assert job.end_s is not None
        end_s = min(job.end_s, horizon_s + tick_s)
        t = job.submit_s + flush_s if flush_s > 0 else math.inf
        while t < end_s:
            ticks.add(math.ceil(t / tick_s) * tick_s)
            t += flush_s
        ticks.add(math.ceil(end_s / tick_s) * tick_s)
    return sorted(ticks)


def measure(trace: Trace, bound: int, flush_s: float = USAGE_FLUSH_S) -> Result:
    jobs = sorted(trace.jobs, key=lambda j: j.submit_s)  # stable: file order among equals
    keys = [j.key for j in jobs]
    resets = snapshot_changes(jobs, flush_s)
    return Result(
        jobs=len(jobs),
        distinct_keys=len(set(keys)),
        overall=repeat_overall(keys),
        lru=repeat_lru(keys, bound),
        table=repeat_table(jobs, bound),
        table_churn=None if resets is None else repeat_table(jobs, bound, resets),
        snapshot_changes=None if resets is None else len(resets),
    )


# -- traces --------------------------------------------------------------------------------


def _rows(path: Path, delimiter: str = ",") -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter=delimiter))


def philly(data_dir: Path) -> Trace:
    rows = _rows(data_dir / "philly-pollux" / "philly.csv")
    jobs = []
    for r in rows:
        t = datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        submit_s = t.timestamp()
        jobs.append(Job(submit_s, submit_s + float(r["duration"]), (r["cluster"], r["num_gpus"])))
    return Trace(
        "philly-pollux",
        "petuum/adaptdl osdi21-artifact simulator/traces/philly.csv (Microsoft Philly)",
        "virtual cluster (as partition), GPUs (tres_per_job)",
        ("uid", "name", "cpus", "tasks/nodes", "comment", "script"),
        jobs,
    )


def alibaba(data_dir: Path) -> Trace:
    rows = _rows(data_dir / "alibaba-gpu-v2023" / "openb_pod_list_default.csv")
    jobs = []
    for r in rows:
        if int(r["num_gpu"]) == 0:
            continue  # a CPU-only job never reaches the memo (the hook stops before it)
        end = r["deletion_time"]
        jobs.append(
            Job(
                float(r["creation_time"]),
                float(end) if end else None,
                (r["cpu_milli"], r["num_gpu"], r["gpu_milli"], r["gpu_spec"]),
            )
        )
    return Trace(
        "alibaba-gpu-v2023 (default, GPU pods)",
        "alibaba/clusterdata cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv",
        "CPUs (cpus_per_tres), GPUs, GPU share, GPU type (tres_per_*)",
        ("uid", "name", "partition", "tasks/nodes", "comment", "script"),
        jobs,
    )


def muri(data_dir: Path) -> list[Trace]:
    rows = _rows(data_dir / "muri" / "cluster_trace.csv")
    source = "Rivendile/Muri cluster_exp/trace-data/cluster_trace.csv"
    missing = ("uid", "name", "partition", "cpus", "tasks/nodes", "comment")

    def job(r: dict[str, str], key: tuple[str, ...]) -> Job:
        submit_s = float(r["submit_time"]) / 1000  # ms (slurm_plugin/sim/traces.py)
        return Job(submit_s, submit_s + float(r["duration"]) / 1000, key)

    return [
        Trace(
            "muri",
            source,
            "GPUs (tres_per_job)",
            (*missing, "script"),
            [job(r, (r["num_gpu"],)) for r in rows],
        ),
        Trace(
            "muri, script proxy",
            source,
            "GPUs; model, batch size, iterations as if written in the script",
            missing,
            [
                job(r, (r["num_gpu"], r["model_name"], r["batch_size"], r["iterations"]))
                for r in rows
            ],
        ),
    ]


SACCT_KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "User": ("uid",),
    "UID": ("uid",),
    "JobName": ("name",),
    "Partition": ("partition",),
    "ReqTRES": ("tres_per_*", "cpus_per_tres", "cpus_per_task"),
    "ReqGRES": ("tres_per_*",),
    "TRESPerNode": ("tres_per_*",),
    "NTasks": ("num_tasks",),
    "ReqNodes": ("min_nodes",),
    "Comment": ("comment",),
    "SubmitLine": ("script",),
}
"""sacct columns the key can use, and the key fields each stands for (``SubmitLine``: the
script's path and the options, not its text)."""


def _sacct_time(text: str) -> float | None:
    if not text or text in ("Unknown", "None"):
        return None
    return datetime.fromisoformat(text).timestamp()


def sacct(path: Path, all_jobs: bool = False) -> Trace:
    """A ``sacct -X -P`` export (``|``-separated, header line)."""
    rows = _rows(path, delimiter="|")
    if not rows or "Submit" not in rows[0]:
        raise SystemExit(f"{path}: not a sacct -P export with a Submit column")
    columns = [c for c in SACCT_KEY_COLUMNS if c in rows[0]]
    has_end = "End" in rows[0]
    seen_arrays: set[str] = set()
    jobs = []
    for r in rows:
        job_id = r.get("JobID", "")
        if "." in job_id:
            continue  # a step
        if "_" in job_id:
            array = job_id.split("_", 1)[0]
            if array in seen_arrays:
                continue  # one submission for the whole array
            seen_arrays.add(array)
        tres = r.get("ReqTRES", "") + r.get("ReqGRES", "") + r.get("TRESPerNode", "")
        if not all_jobs and "gpu" not in tres:
            continue
        submit_s = _sacct_time(r["Submit"])
        if submit_s is None:
            continue
        end_s: float | None = None
        if has_end:
            # Not ended (still running, or never ran): it writes until the trace ends.
            end_s = _sacct_time(r["End"]) or math.inf
        jobs.append(Job(submit_s, end_s, tuple(r[c] for c in columns)))
    have = {f for c in columns for f in SACCT_KEY_COLUMNS[c]}
    return Trace(
        path.name + ("" if all_jobs else " (GPU jobs)"),
        str(path),
        ", ".join(
            f"{c} (script path and options, for script)"
            if c == "SubmitLine"
            else f"{c} ({', '.join(SACCT_KEY_COLUMNS[c])})"
            for c in columns
        ),
        tuple(f for f in KEY_FIELDS if f not in have),
        jobs,
    )


# -- output ----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(rows: Sequence[tuple[Trace, Result]], bound: int) -> str:
    out = [
        f"| dataset | GPU jobs | distinct keys | fields used (key field) | key fields missing "
        f"| overall | last {bound} keys | memo ({bound}, emptied when full) "
        f"| memo + churn | snapshot changes |",
        "|---|--:|--:|---|---|--:|--:|--:|--:|--:|",
    ]
    for trace, r in rows:
        out.append(
            f"| {trace.name} | {r.jobs} | {r.distinct_keys} | {trace.fields} | "
            f"{', '.join(trace.missing) or '-'} | {_pct(r.overall)} | {_pct(r.lru)} | "
            f"{_pct(r.table)} | {_pct(r.table_churn)} | "
            f"{'-' if r.snapshot_changes is None else r.snapshot_changes} |"
        )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    p.add_argument("--sacct", type=Path, action="append", default=[], help="a sacct -X -P export")
    p.add_argument("--all-jobs", action="store_true", help="sacct: count CPU-only jobs too")
    p.add_argument("--bound", type=int, default=None, help="memo entries (default: the hook's)")
    p.add_argument(
        "--usage-flush-s",
        type=float,
        default=USAGE_FLUSH_S,
        help="NodeUsageFlushS of the churn model (0: a profile is written only at a job's end)",
    )
    args = p.parse_args(argv)
    bound = args.bound or table_bound()
    t0 = time.perf_counter()
    traces: list[Trace] = []
    if args.data_dir.is_dir():
        traces += [philly(args.data_dir), alibaba(args.data_dir), *muri(args.data_dir)]
    else:
        print(f"warning: no {args.data_dir}; public traces skipped", file=sys.stderr)
    traces += [sacct(path, args.all_jobs) for path in args.sacct]
    rows = [(t, measure(t, bound, args.usage_flush_s)) for t in traces if t.jobs]
    sys.stdout.write(table(rows, bound))
    sources = "".join(f"\n- {t.name}: {t.source}" for t, _ in rows)
    sys.stdout.write(f"\nsources:{sources}\n")
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
