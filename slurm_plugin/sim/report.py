"""What a simulated run means for an admin: utilisation, JCT, CPU-job waits, cores freed.

All measures are over the trace's submission window ``[0, last submission]`` for
utilisation (so a policy that merely finishes the tail later is not rewarded), and over
every finished job for times.

The second half (:func:`second_half`) is what a cluster sees once its profile store is
warm: the same measures over the GPU jobs from the middle GPU submission on (in
submission order) and the CPU jobs submitted from that moment; its GPU busy is per job
(:func:`jobs_summary`), since the utilisation bins mix in the jobs of the first half still
running.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from slurm_plugin.sim.engine import RunResult
from slurm_plugin.sim.traces import Trace

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    gpu_util_allocated: float
    """GPU-seconds held by jobs / GPU-seconds of the cluster, over the submission window."""
    gpu_util_effective: float
    """The same, each GPU-second weighted by its job's progress rate (1 = at its best)."""
    gpu_busy: float
    """Effective over allocated: the share of allocated GPU time the GPUs compute, what
    nvidia-smi's or DCGM's utilisation averages over the allocated GPUs (0 with none)."""
    dnn_jct_mean_s: float
    dnn_jct_p99_s: float
    dnn_wait_mean_s: float
    cpu_wait_mean_s: float
    cpu_wait_p99_s: float
    cpu_stretch_mean: float
    """CPU jobs' run time over their run time in the trace (> 1: throttled)."""
    cpu_stretch_p50: float
    cpu_stretch_p99: float
    cpu_work_stretch: float
    """Σ CPU jobs' run time over Σ their run time in the trace: the CPU capacity the
    throttling cost, where long jobs weigh more than in the mean of ratios."""
    core_hours_returned: float
    """Σ (cores asked − given) × run hours over GPU jobs given fewer cores than asked."""
    core_hours_added: float
    """Σ (given − asked) × run hours over GPU jobs given more (starving jobs fed)."""
    makespan_s: float
    finished: int
    unfinished: int
    rejected: int
    events: int
    wall_s: float
    counters: dict[str, int]
    second_half: dict[str, float] = field(default_factory=dict)
    """:func:`jobs_summary` over :func:`second_half`'s jobs."""

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99)) if len(x) else math.nan


def second_half(trace: Trace) -> tuple[np.ndarray, np.ndarray, float]:
    """``(GPU jobs, CPU jobs, from_s)`` of the second half of the submissions: the GPU jobs
    from the middle one on, in submission order (ties in trace order; the later half when
    their number is odd), and the CPU jobs submitted at or after the first of them
    (``from_s``). Boolean masks over the trace's jobs; none with fewer than two GPU jobs."""
    n = len(trace)
    gpu_idx = np.flatnonzero(trace.gpus > 0)
    gpu = np.zeros(n, dtype=bool)
    cpu = np.zeros(n, dtype=bool)
    if len(gpu_idx) < 2:
        return gpu, cpu, math.nan
    order = gpu_idx[np.argsort(trace.submit_s[gpu_idx], kind="stable")]
    later = order[len(order) // 2 :]
    gpu[later] = True
    from_s = float(trace.submit_s[later[0]])
    cpu = (trace.gpus == 0) & (trace.submit_s >= from_s)
    return gpu, cpu, from_s


def jobs_summary(trace: Trace, r: RunResult, gpu: np.ndarray, cpu: np.ndarray) -> dict[str, float]:
    """The job measures over the GPU jobs ``gpu`` and the CPU jobs ``cpu`` (boolean masks):
    DNN JCT and wait, CPU wait and stretch, and GPU busy per job: Σ GPUs × the work each
    job brought (seconds at full speed) over Σ GPUs × its run time, so the time it was
    slowed, probed or given too few cores counts as idle."""
    done = ~np.isnan(r.end_s)
    started = ~np.isnan(r.start_s)
    wait = r.start_s - trace.submit_s
    run_s = r.end_s - r.start_s
    gd = gpu & done
    jct = (r.end_s - trace.submit_s)[gd]
    held_gpu_s = float(np.sum(trace.gpus[gd] * run_s[gd]))
    work_gpu_s = float(np.sum(trace.gpus[gd] * r.work_s[gd]))
    cd = cpu & done
    stretch = run_s[cd] / trace.duration_s[cd]
    trace_run_s = float(trace.duration_s[cd].sum())
    return {
        "gpu_jobs": int(gpu.sum()),
        "cpu_jobs": int(cpu.sum()),
        "gpu_busy": work_gpu_s / held_gpu_s if held_gpu_s else math.nan,
        "dnn_jct_mean_s": _mean(jct),
        "dnn_jct_p99_s": _p99(jct),
        "dnn_wait_mean_s": _mean(wait[gpu & started]),
        "cpu_wait_mean_s": _mean(wait[cpu & started]),
        "cpu_stretch_mean": _mean(stretch),
        "cpu_work_stretch": float(run_s[cd].sum() / trace_run_s) if trace_run_s else math.nan,
        "not_finished": int((gpu & ~done).sum() + (cpu & ~done).sum()),
    }


def summarise(trace: Trace, r: RunResult) -> Summary:
    gpu = trace.gpus > 0
    done = ~np.isnan(r.end_s)
    cap_gpu_s = r.total_gpus * r.horizon_s
    jct = (r.end_s - trace.submit_s)[gpu & done]
    wait = r.start_s - trace.submit_s
    run_s = r.end_s - r.start_s
    cpu_done = ~gpu & done
    delta = (r.asked_cores_per_node - r.cores_per_node).astype(float) * r.nodes_used
    hours = np.where(done, run_s, 0.0) / 3600.0
    returned = float(np.sum(np.clip(delta, 0, None)[gpu] * hours[gpu]))
    added = float(np.sum(np.clip(-delta, 0, None)[gpu] * hours[gpu]))
    started = ~np.isnan(r.start_s)
    alloc_gpu_s = float(r.alloc_gpu_s.sum())
    stretch = run_s[cpu_done] / trace.duration_s[cpu_done]
    trace_run_s = float(trace.duration_s[cpu_done].sum())
    return Summary(
        policy=r.policy,
        gpu_util_allocated=float(r.alloc_gpu_s.sum() / cap_gpu_s) if cap_gpu_s else 0.0,
        gpu_util_effective=float(r.effective_gpu_s.sum() / cap_gpu_s) if cap_gpu_s else 0.0,
        gpu_busy=float(r.effective_gpu_s.sum() / alloc_gpu_s) if alloc_gpu_s else 0.0,
        dnn_jct_mean_s=_mean(jct),
        dnn_jct_p99_s=_p99(jct),
        dnn_wait_mean_s=_mean(wait[gpu & started]),
        cpu_wait_mean_s=_mean(wait[~gpu & started]),
        cpu_wait_p99_s=_p99(wait[~gpu & started]),
        cpu_stretch_mean=_mean(stretch),
        cpu_stretch_p50=float(np.median(stretch)) if len(stretch) else math.nan,
        cpu_stretch_p99=_p99(stretch),
        cpu_work_stretch=float(run_s[cpu_done].sum() / trace_run_s) if trace_run_s else math.nan,
        core_hours_returned=returned,
        core_hours_added=added,
        makespan_s=float(np.nanmax(r.end_s)) if done.any() else math.nan,
        finished=int(done.sum()),
        unfinished=int((~done).sum()) - r.counters.get("rejected", 0),
        rejected=r.counters.get("rejected", 0),
        events=r.events,
        wall_s=r.wall_s,
        counters=r.counters,
        second_half=_second_half_summary(trace, r),
    )


def _second_half_summary(trace: Trace, r: RunResult) -> dict[str, float]:
    gpu, cpu, from_s = second_half(trace)
    return {"from_submit_s": from_s, **jobs_summary(trace, r, gpu, cpu)}


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_util_allocated", "GPU alloc", "pct"),
    ("gpu_util_effective", "GPU eff", "pct"),
    ("gpu_busy", "GPU busy", "pct"),
    ("dnn_jct_mean_s", "JCT mean", "h"),
    ("dnn_jct_p99_s", "JCT p99", "h"),
    ("cpu_wait_mean_s", "CPU wait", "min"),
    ("cpu_stretch_mean", "CPU stretch", "x"),
    ("core_hours_returned", "core-h freed", "int"),
)


def _cell(value: float, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "h":
        return f"{value / 3600:.2f}h"
    if kind == "min":
        return f"{value / 60:.1f}m"
    if kind == "x":
        return f"{value:.3f}"
    return f"{value:,.0f}"


def _ratio(value: float, base: float, higher_better: bool) -> str:
    if not base or math.isnan(base) or math.isnan(value):
        return ""
    return f"{value / base:.2f}x"


def render_table(
    rows: Sequence[Summary],
    baseline: str = "slurm",
    *,
    baseline_of: Mapping[str, str] | None = None,
) -> str:
    """A terminal table, one line per policy, with ratios to ``baseline`` below; with
    ``baseline_of`` (row -> its baseline row, e.g. ``coda+reserve`` -> ``coda``) the ratios
    are each row's to its own baseline instead."""
    head = ["policy"] + [c[1] for c in _COLUMNS]
    body = [[s.policy] + [_cell(getattr(s, k), kind) for k, _, kind in _COLUMNS] for s in rows]
    by_name = {s.policy: s for s in rows}
    if baseline_of is None:
        pairs = [(s, baseline) for s in rows if baseline in by_name and s.policy != baseline]
    else:
        pairs = [(s, baseline_of[s.policy]) for s in rows if baseline_of.get(s.policy) in by_name]
    ratio_rows: list[list[str]] = []
    for s, base_name in pairs:
        base = by_name[base_name]
        ratio_rows.append(
            [f"{s.policy}/{base_name}"]
            + [
                _ratio(getattr(s, k), getattr(base, k), True) if kind != "int" else ""
                for k, _, kind in _COLUMNS
            ]
        )
    widths = [max(len(r[i]) for r in [head, *body, *ratio_rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head)] + [line(r) for r in body]
    if ratio_rows:
        out.append("")
        out += [line(r) for r in ratio_rows]
    return "\n".join(out)


_HALF_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_busy", "GPU busy", "pct"),
    ("dnn_jct_mean_s", "JCT mean", "h"),
    ("dnn_jct_p99_s", "JCT p99", "h"),
    ("cpu_wait_mean_s", "CPU wait", "min"),
    ("cpu_stretch_mean", "CPU stretch", "x"),
)


def render_second_half(rows: Sequence[Summary], gpu_jobs: int) -> str:
    """The second half's measures (:func:`second_half`), one line per policy, under a
    line that says which jobs they are over (``gpu_jobs``: the trace's GPU jobs)."""
    if not rows or not rows[0].second_half:
        return "second half: fewer than two GPU jobs"
    half = rows[0].second_half
    start = gpu_jobs - int(half["gpu_jobs"]) + 1
    title = (
        f"second half: GPU jobs from submission {start:,} of {gpu_jobs:,} "
        f"(from {half['from_submit_s'] / 3600:.1f}h), CPU jobs submitted from then; "
        "GPU busy per job"
    )
    head = ["policy"] + [c[1] for c in _HALF_COLUMNS]
    body = [
        [s.policy] + [_cell(s.second_half[k], kind) for k, _, kind in _HALF_COLUMNS] for s in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [head, *body]
    ]
    return "\n".join([title, *lines])


def plot(trace: Trace, results: Sequence[RunResult], out_dir: Path, fmt: str = "png") -> list[Path]:
    """Utilisation over time and the DNN JCT distribution, one line per policy.

    Needs matplotlib (``pip install 'coda-slurm[plot]'``); raises ImportError otherwise.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for r in results:
        edges = r.bin_edges_s
        width = np.diff(edges)
        util = r.effective_gpu_s / (r.total_gpus * width)
        ax.plot(edges[:-1] / 3600, 100 * util, label=r.policy, linewidth=1)
    ax.set_xlabel("hours since the first submission")
    ax.set_ylabel("effective GPU utilisation (%)")
    ax.set_title(f"{trace.name}: GPU utilisation weighted by progress rate")
    ax.legend()
    fig.tight_layout()
    p = out_dir / f"utilisation.{fmt}"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6, 4))
    gpu = trace.gpus > 0
    for r in results:
        jct = np.sort((r.end_s - trace.submit_s)[gpu & ~np.isnan(r.end_s)]) / 3600
        if len(jct):
            ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=r.policy, linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("DNN job completion time (hours, log)")
    ax.set_ylabel("fraction of DNN jobs")
    ax.set_title(f"{trace.name}: JCT distribution")
    ax.legend()
    fig.tight_layout()
    p = out_dir / f"jct_cdf.{fmt}"
    fig.savefig(p)
    plt.close(fig)
    paths.append(p)
    return paths
