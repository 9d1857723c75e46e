"""The cluster a trace replays on, and CPU jobs mixed into GPU-only traces.

Public traces rarely fit the cluster they come with: the Alibaba pod list offers ~0.3 % of
its own 6,212 GPUs, Philly has no inventory at all. :func:`size_for_load` builds a cluster
whose GPUs the trace keeps busy at a chosen offered load, from the trace's own node mix when
it has one (every k-th node of the inventory, so the GPU models keep their shares) or from
one node shape. Offered load is measured over the trace's *busy window* (from the 1st
percentile of submissions to the last), so a sparse head does not dilute it.
"""

from __future__ import annotations

import math

import numpy as np

from slurm_plugin.sim.traces import MAX_SIM_NODES, NodeSpec, Trace, TraceError, uniform_nodes

BUSY_QUANTILE = 0.01


def busy_window(trace: Trace) -> tuple[float, float]:
    """``(start, end)`` seconds of the trace's busy window (see the module docstring)."""
    if len(trace) == 0:
        raise TraceError("the trace has no jobs")
    start = float(np.quantile(trace.submit_s, BUSY_QUANTILE))
    end = float(trace.submit_s[-1])
    return start, max(end, start + 1.0)


def offered_gpu_s(trace: Trace) -> float:
    start, _ = busy_window(trace)
    keep = trace.submit_s >= start
    with np.errstate(over="ignore"):  # absurd run times: inf, which size_for_load refuses
        return float(np.sum(trace.gpus[keep] * trace.duration_s[keep]))


def size_for_load(trace: Trace, load: float, *, shape: tuple[int, int] = (96, 8)) -> list[NodeSpec]:
    """Nodes for ``trace`` at offered GPU ``load`` (see the module docstring).

    ``shape`` is (cores, GPUs) per node when the trace has no inventory. The cluster is
    never smaller than what its largest job needs.
    """
    if not 0.0 < load <= 10.0:
        raise ValueError(f"load must be in (0, 10], got {load}")
    start, end = busy_window(trace)
    want_gpus = offered_gpu_s(trace) / ((end - start) * load)
    biggest = int(trace.gpus.max()) if len(trace) else 1
    inv = [n for n in (trace.node_specs or []) if n.gpus > 0]
    if inv:
        total = sum(n.gpus for n in inv)
        if want_gpus >= total:
            return list(inv)
        # Every k-th node in a stable order keeps the models' shares.
        ordered = sorted(inv, key=lambda n: (n.gpu_model or "", n.gpus, n.cores, n.name))
        k = max(1, math.floor(total / max(want_gpus, 1.0)))
        chosen = ordered[::k]
        while sum(n.gpus for n in chosen) < max(want_gpus, biggest) and k > 1:
            k -= 1
            chosen = ordered[::k]
        return chosen
    cores, gpus = shape
    if gpus < 1 or cores < 1:
        raise ValueError(f"node shape needs cores and GPUs >= 1, got {cores}:{gpus}")
    # Float until checked: a trace of absurd run times offers an infinite load.
    n_nodes = max(want_gpus / gpus, math.ceil(biggest / gpus), 1)
    if n_nodes > MAX_SIM_NODES:
        raise TraceError(
            f"a cluster of {cores}:{gpus} nodes at load {load:g} would need {n_nodes:,.4g} "
            f"nodes, more than the simulator's {MAX_SIM_NODES:,}: the biggest job asks "
            f"{biggest:,} GPUs, and the jobs offer {want_gpus * load:,.4g} GPUs on average "
            f"over the busy window of {end - start:,.4g} s"
        )
    return uniform_nodes(math.ceil(n_nodes), cores, gpus)


def _cpu_job_pool(trace: Trace, donor: Trace | None) -> tuple[np.ndarray, np.ndarray]:
    """The cores and run times :func:`add_cpu_jobs` draws from."""
    if donor is not None and np.any(donor.gpus == 0):
        pick = np.flatnonzero((donor.gpus == 0) & (donor.cpus > 0))
        pool_cores = donor.cpus[pick].astype(np.int64)
        pool_dur = donor.duration_s[pick]
    else:
        pool_cores = np.arange(1, 17, dtype=np.int64)
        pool_dur = trace.duration_s
    return pool_cores, pool_dur


def add_cpu_jobs(
    trace: Trace,
    nodes: list[NodeSpec],
    cpu_load: float,
    *,
    seed: int,
    donor: Trace | None = None,
) -> Trace:
    """``trace`` with CPU-only jobs added whose offered core load is ``cpu_load`` of the
    cluster's cores, arriving as a Poisson process over the busy window.

    Sizes and run times are resampled from ``donor``'s CPU-only jobs (the Alibaba trace's
    real CPU pods when the caller has them), else 1-16 cores and the GPU jobs' durations.
    """
    if cpu_load <= 0:
        return trace
    rng = np.random.default_rng(seed)
    start, end = busy_window(trace)
    total_cores = sum(n.cores for n in nodes)
    pool_cores, pool_dur = _cpu_job_pool(trace, donor)
    max_cores = max(n.cores for n in nodes)
    mean_core_s = float(np.mean(np.minimum(pool_cores, max_cores))) * float(np.mean(pool_dur))
    rate_per_s = cpu_load * total_cores / mean_core_s
    n_new = int(rng.poisson(rate_per_s * (end - start)))
    if n_new == 0:
        return trace
    submit = np.sort(rng.uniform(start, end, n_new))
    idx_c = rng.integers(0, len(pool_cores), n_new)
    idx_d = rng.integers(0, len(pool_dur), n_new)
    cores = np.minimum(pool_cores[idx_c], max_cores).astype(np.int32)
    dur = pool_dur[idx_d].astype(float)
    all_submit = np.concatenate([trace.submit_s, submit])
    order = np.argsort(all_submit, kind="stable")

    def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b.astype(a.dtype)])[order]

    minus = np.full(n_new, -1)
    out = Trace(
        name=f"{trace.name}+cpu{cpu_load:g}",
        submit_s=all_submit[order],
        duration_s=cat(trace.duration_s, dur),
        gpus=cat(trace.gpus, np.zeros(n_new)),
        cpus=cat(trace.cpus, cores),
        nodes=cat(trace.nodes, np.ones(n_new)),
        workload=cat(trace.workload, minus),
        workload_names=list(trace.workload_names),
        gpu_model=cat(trace.gpu_model, minus),
        gpu_model_names=list(trace.gpu_model_names),
        node_specs=trace.node_specs,
        source=trace.source,
        notes=[
            *trace.notes,
            f"{n_new:,} CPU-only jobs added (offered core load {cpu_load:g} of "
            f"{total_cores:,} cores), sizes and run times resampled from "
            + (f"{donor.name}'s CPU jobs" if donor is not None else "1-16 cores"),
        ],
    )
    out.validate()
    return out
