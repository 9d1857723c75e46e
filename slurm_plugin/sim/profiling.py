"""Online profiling of a simulated job: coda-node's own allocator, ticked.

:func:`probe_run` drives :class:`coda_node.policy.allocator.Allocator` over one job whose true
throughput curve is known, from the end of its warm-up until the allocator publishes (or
gives up), with a small measurement noise. It returns what the daemon would publish and what
probing cost the job: the work it did not do while running below its allocation; and, for
a job that ends before the allocator is done, what it would publish when it ends at each
moment (:func:`coda_node.policy.allocator.ended_publication`, asked after every new sample).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coda_common.model.curves import throughput_at
from coda_node.policy.allocator import Allocator, ProbeJob, ProbeParams, ended_publication
from coda_node.policy.observe import Progress, SignalParams

WARMUP_S = SignalParams().warmup_s
"""coda-node probes a job only after its warm-up: the probe slot is taken from then."""


@dataclass(frozen=True, slots=True)
class ProbeRun:
    samples: tuple[tuple[int, float], ...]
    """(cores on the node, throughput as % of the run's plateau) to publish; empty when
    the allocator published nothing."""
    done_after_s: float
    """Seconds from the job's start until the allocator finished (warm-up included)."""
    lost_work_s: float
    """Seconds of full-allocation progress the job lost while probed."""
    probes: int
    sweet_spot_cores: int | None
    confidence: float | None
    partial: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] = ()
    """(seconds from the job's start, samples): what the job publishes if it ends from then
    on, before ``done_after_s``; in time order. Empty before two core counts are measured."""


def probe_run(
    *,
    theta_cores: float,
    allocated_cores: int,
    gpus: int,
    params: ProbeParams,
    seed: int,
    log_share: float = 0.3,
    noise_rel: float = 0.02,
    tick_s: float = 10.0,
    warmup_s: float = WARMUP_S,
    max_s: float = 4 * 3600.0,
) -> ProbeRun:
    """Profile a job with sweet spot ``theta_cores`` on ``allocated_cores`` (see module)."""
    rng = np.random.default_rng(seed)
    alloc = Allocator(params)
    full = throughput_at(theta_cores, allocated_cores, log_share=log_share)
    now = warmup_s
    lost = 0.0
    cores = allocated_cores
    partial: list[tuple[float, tuple[tuple[int, float], ...]]] = []
    measured = 0
    while now < warmup_s + max_s:
        true = throughput_at(theta_cores, cores, log_share=log_share)
        rate = 100.0 * true * (1.0 + noise_rel * float(rng.standard_normal()))
        prog = Progress(rate=rate, source="iterations", phase="train", age_s=now, level=rate)
        job = ProbeJob(
            job_id=1,
            signature="workload:0:sim",
            gpus=gpus,
            allocated_cores=allocated_cores,
            single_node=True,
            progress=prog,
        )
        out = alloc.step(now, {1: job})
        lost += max(0.0, full - true) * tick_s
        cores = out.cores.get(1, allocated_cores)
        rec = alloc.records[1]
        if rec.state in ("done", "skipped"):
            pub = out.publish[0] if out.publish else None
            return ProbeRun(
                samples=pub.samples if pub else (),
                done_after_s=now,
                lost_work_s=lost,
                probes=rec.probes,
                sweet_spot_cores=rec.result.cores if rec.result else None,
                confidence=rec.result.confidence if rec.result else None,
                partial=tuple(partial),
            )
        if len(rec.samples) != measured:
            measured = len(rec.samples)
            ended = ended_publication(job, rec, params)
            if ended is not None:
                partial.append((now, ended.samples))
        now += tick_s
    return ProbeRun((), now, lost, alloc.records[1].probes, None, None, tuple(partial))
