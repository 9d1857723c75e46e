"""GPU and memory-bandwidth usage records of the node's jobs (coda_node.policy.usage): which
ticks show a workload's own usage, and where a finished record goes (the profile store, or
the controller's collector through ProfileDropDir)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from coda_common.config.codaconf import CodaConfig
from coda_common.publish.dropbox import Drop, DropError, drop_as_configured
from coda_common.store.profiles import CpuUsageRecord, ProfileStore, StoreError, UsageRecord
from coda_node.daemon.adaptive import AdaptiveLoop, LoopOutput
from coda_node.daemon.tick import gpu_model, usage_tick
from coda_node.policy.targets import JobFacts, JobTarget
from coda_node.policy.usage import UsageAccumulator, UsageFlush
from coda_node.sampling.snapshot import JobView, NodeSnapshot

log = logging.getLogger("coda-node")

EventFn = Callable[[int, str, str], Any]
"""Records one event: job id, what, reason."""


class UsageRecorder:
    """Counts the ticks that show each job's own usage into its record, and hands each
    finished record on; one ``usage-publish`` event per record, failures included."""

    def __init__(self, cfg: CodaConfig, node_name: str, event: EventFn) -> None:
        self.cfg = cfg
        self.node_name = node_name
        self._event = event
        self.usage = UsageAccumulator(
            flush_every_s=cfg.node_usage_flush_s, min_ticks=cfg.node_usage_min_ticks
        )
        self._undisturbed: set[int] = set()
        """DNN and CPU jobs whose last tick showed their own usage (see collect)."""

    def collect(
        self,
        snap: NodeSnapshot,
        facts: dict[int, JobFacts],
        targets: dict[int, JobTarget],
        loop: LoopOutput,
        adaptive: AdaptiveLoop,
        changes: Mapping[int, object],
    ) -> None:
        """Count this tick into each job's usage record (coda_node.policy.usage) where it
        shows the workload's own usage, in this tick and the one before: a DNN job's GPU
        usage, a CPU job's memory bandwidth per allocated CPU. Either needs a signature (the
        hook's record) and no limit or change of ours in force. NVML's utilisation covers the
        sample period before the reading (nvml.h, nvmlDeviceGetUtilizationRates) and an MBM
        rate the interval since the group's previous reading, so the first tick after a
        probe or a throttle still shows the job as it was then."""
        gpus = {g.index: g for g in snap.gpus}
        undisturbed: set[int] = set()
        throttled_sockets: set[int] = set()
        for job_id in loop.throttles:
            if job_id in facts:
                throttled_sockets |= adaptive.sockets_of(facts[job_id].allocated_cpus)
        for job_id, view in snap.jobs.items():
            record = view.slurm.admin_record if view.slurm else None
            signature = record.get("sig") if record else None
            if not signature or job_id in targets or job_id in changes:
                continue
            if view.kind == "dnn":
                if not _gpu_usage_undisturbed(job_id, facts, loop, throttled_sockets, adaptive):
                    continue
                undisturbed.add(job_id)
                tick = usage_tick(view, gpus, adaptive.progress[job_id])
                if tick is not None and job_id in self._undisturbed:
                    model = gpu_model(snap, job_id)
                    self.usage.add(job_id, signature, model, snap.monotonic_s, tick)
            elif view.kind == "cpu" and job_id in facts and job_id not in loop.throttles:
                # In facts: its cgroup is read and not held for a repair, so it runs on
                # what Slurm allocated it.
                undisturbed.add(job_id)
                per_cpu = _mem_bw_per_cpu(view)
                if per_cpu is not None and job_id in self._undisturbed:
                    self.usage.add_cpu(job_id, signature, snap.monotonic_s, per_cpu)
        self._undisturbed = undisturbed

    def publish(self, flush: UsageFlush, store: ProfileStore) -> None:
        """Merge one usage record into its profile (ProfilePublish=munge: hand it to the
        controller's collector); one event line, on failure too. Never raises: the tick goes
        on whatever the store does."""
        r = flush.record
        what = "memory bandwidth" if isinstance(r, CpuUsageRecord) else "GPU usage"
        if self.cfg.profile_publish == "munge":
            self._drop(flush, what)
            return
        try:
            # No store directory yet: no profile either (a merge would fail on its lock).
            if not store.root.is_dir():
                prof = None
            elif isinstance(r, CpuUsageRecord):
                prof = store.merge_cpu_usage(flush.signature, r)
            else:
                prof = store.merge_usage(flush.signature, r)
        except (StoreError, OSError, ValueError) as exc:
            self._event(
                flush.job_id, "usage-publish", f"cannot record {what} in {store.root}: {exc}"
            )
            return
        if prof is None:
            # No profile yet (the hook never saw the workload and no probe published one):
            # nothing to attach a GPU record to; the next run of the workload tries again.
            # A CPU record creates its profile, where the store directory exists.
            log.debug("job=%d no profile %s: %s not recorded", flush.job_id, flush.signature, what)
            return
        self._event(
            flush.job_id,
            "usage-publish",
            f"profile {flush.signature}: {_usage_line(r)} ({flush.why})",
        )

    def publish_remaining(self, store: ProfileStore) -> None:
        """At stop: every record with ticks in it, published; never raises."""
        try:
            for flush in self.usage.drain(time.time()):
                self.publish(flush, store)
        except Exception:
            # Nothing a usage record can do may keep the jobs from being put back.
            log.exception("usage records not written at stop")

    def _drop(self, flush: UsageFlush, what: str) -> None:
        """ProfilePublish=munge: the record as a credential in ProfileDropDir (the
        collector merges it as merge_usage or merge_cpu_usage would)."""
        r = flush.record
        cpu = r if isinstance(r, CpuUsageRecord) else None
        gpu = (r,) if isinstance(r, UsageRecord) else ()
        payload = Drop(flush.signature, self.node_name, (), time.time(), gpu, cpu)
        try:
            path = drop_as_configured(payload, self.cfg)
        except DropError as exc:
            line = f"cannot hand {what} of {flush.signature} to the controller: {exc}"
        else:
            line = (
                f"profile {flush.signature}: {_usage_line(r)} ({flush.why}), handed to the "
                f"controller as {path}"
            )
        self._event(flush.job_id, "usage-publish", line)


def _gpu_usage_undisturbed(
    job_id: int,
    facts: dict[int, JobFacts],
    loop: LoopOutput,
    throttled_sockets: set[int],
    adaptive: AdaptiveLoop,
) -> bool:
    """A DNN job shows its own GPU usage: past warm-up, at its whole allocation (no
    probe), no CPU job on its sockets throttled, not slowed past the contention
    trigger."""
    prog = adaptive.progress.get(job_id)
    if prog is None or prog.phase in ("warmup", "no-signal"):
        return False
    rec = adaptive.allocator.records.get(job_id)
    if job_id in loop.cores or (rec is not None and rec.state == "probing"):
        return False
    if job_id in facts and throttled_sockets & adaptive.sockets_of(facts[job_id].allocated_cpus):
        return False
    contention = adaptive.eliminator.dnn_status(job_id)
    slowdown = contention.get("slowdown") if contention else None
    trigger = adaptive.eliminator.params.trigger_slowdown
    return not (isinstance(slowdown, float) and slowdown > trigger)


def _mem_bw_per_cpu(view: JobView) -> float | None:
    """A CPU job's memory bandwidth (its resctrl MON group's rate) per CPU Slurm allocated it
    on this node; None when either is unknown."""
    bw = view.mem_bw_bytes_per_s
    cpus = len(view.slurm.cpu_ids) if view.slurm else 0
    if bw is None or not cpus or not math.isfinite(bw) or bw < 0:
        return None
    return bw / cpus


def _usage_line(r: UsageRecord | CpuUsageRecord) -> str:
    """A usage record in the words of its ``usage-publish`` event."""
    if isinstance(r, CpuUsageRecord):
        return (
            f"memory bandwidth {r.mem_bw_bytes_per_s_per_cpu / 1e9:.2f} GB/s per CPU over "
            f"{r.ticks} ticks"
        )
    return (
        f"GPU {r.gpu_util:.0%} busy, memory {r.gpu_mem_bw_util:.0%} busy over {r.ticks} ticks "
        f"on {r.gpu_model or 'an unknown GPU model'}"
    )
