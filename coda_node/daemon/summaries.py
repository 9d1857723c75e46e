"""Each job's summary at its end (:mod:`coda_node.policy.summary`), built from the daemon's
ticks, and where a finished one goes: the summary store (``ProfilePublish=store``, this
node its writer) or the controller's collector through ``ProfileDropDir`` (``munge``).
Also the job-end counters the metrics show, by user and account.

One ``summary-publish`` event per job, failures included; nothing here stops a tick or
the jobs' restore at stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coda_common.config.codaconf import CodaConfig
from coda_common.publish.dropbox import (
    MAX_DROP_SUMMARIES,
    DropError,
    SummaryDrop,
    drop_as_configured,
)
from coda_common.store.jobsummary import JobSummary, SummaryFormatError, summary_from_json_dict
from coda_common.store.multinode_merge import merge_summary_figures
from coda_common.store.profiles import ProfileStore
from coda_common.store.summaries import SummaryStoreError, day_of, store_for
from coda_node.policy.summary import SummaryAccumulator, SummaryTick
from coda_node.sampling.snapshot import JobView, NodeSnapshot
from coda_node.system.nvml import GpuSample

if TYPE_CHECKING:
    from coda_node.daemon.adaptive import AdaptiveLoop
    from coda_node.daemon.tick import Decision
    from coda_node.enforce.state import JobChanges

log = logging.getLogger("coda-node")

EventFn = Callable[[int, str, str], Any]
"""Records one event: job id, what, reason."""

MAX_COUNTER_PAIRS = 500
"""(user, account) pairs the job-end counters keep apart; later pairs count as ``other``."""
OTHER = "other"
UNKNOWN = "unknown"
COUNTER_FIELDS = ("gpu_s", "gpu_wait_s", "idle_core_s", "probe_s", "throttled_s")


class JobEndCounters:
    """What the jobs that ended here add up to since the daemon started, by user and
    account: bounded to :data:`MAX_COUNTER_PAIRS` pairs (the metrics' label sets)."""

    def __init__(self, max_pairs: int = MAX_COUNTER_PAIRS) -> None:
        self.max_pairs = max_pairs
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, s: JobSummary) -> None:
        key = (s.user or UNKNOWN, s.account or UNKNOWN)
        if key not in self._rows and len(self._rows) >= self.max_pairs:
            key = (OTHER, OTHER)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = {"jobs": {}, **dict.fromkeys(COUNTER_FIELDS, 0.0)}
        row["jobs"][s.kind] = row["jobs"].get(s.kind, 0) + 1
        row["gpu_s"] += s.gpus * s.sampled_s
        row["gpu_wait_s"] += s.gpus * s.gpu_wait_s
        row["idle_core_s"] += s.idle_core_s if s.gpus > 0 else 0.0
        row["probe_s"] += s.probe_s
        row["throttled_s"] += s.throttled_s

    def rows(self) -> list[dict[str, Any]]:
        """Each pair's counts: ``user``, ``account``, ``jobs`` by kind, and the seconds."""
        return [
            {"user": u, "account": a, **row, "jobs": dict(row["jobs"])}
            for (u, a), row in sorted(self._rows.items())
        ]


def job_gpus(view: JobView, gpus: Mapping[int, GpuSample]) -> tuple[float | None, str | None]:
    """(the mean NVML utilisation of the job's GPUs that read one, their model where they
    are all of one); None for what NVML did not say."""
    mine = [
        gpus[r.nvml_index] for r in view.gpus if r.nvml_index is not None and r.nvml_index in gpus
    ]
    known = [g.util_pct for g in mine if g.util_pct is not None]
    models = {g.name for g in mine if g.name}
    return (
        sum(known) / len(known) if known else None,
        models.pop() if len(models) == 1 else None,
    )


def summary_tick(
    snap: NodeSnapshot,
    gpus_now: Mapping[int, GpuSample],
    view: JobView,
    allocated: frozenset[int] | None,
    changes: JobChanges | None,
    *,
    probe_cores: int | None,
    throttled: bool,
    protected: bool,
    profile_state: str | None,
) -> SummaryTick | None:
    """One job this tick, for its summary; None without Slurm's record of it (its kind and
    owner unknown this tick)."""
    sj = view.slurm
    if sj is None:
        return None
    cpus = allocated if allocated is not None else sj.cpu_ids
    in_force = len(cpus)
    if changes is not None and changes.cpuset_applied is not None:
        in_force = len(changes.cpuset_applied)
    gpus = len(sj.gpu_indices) or sum(g.count for g in sj.gres if g.name == "gpu")
    util_pct, model = job_gpus(view, gpus_now)
    return SummaryTick(
        job_id=view.job_id,
        monotonic_s=snap.monotonic_s,
        unix_s=snap.unix_s,
        kind="dnn" if sj.is_dnn else "cpu",
        user=sj.user,
        uid=sj.uid,
        account=sj.account,
        partition=sj.partition or None,
        num_nodes=sj.num_nodes,
        gpus=gpus,
        gpu_model=model,
        record=sj.record_text,
        profile_state=profile_state,
        cores_allocated=len(cpus),
        cores_in_force=in_force,
        cpu_used_cores=view.cpu_rate_cores,
        gpu_util_pct=util_pct,
        probe_cores=probe_cores,
        throttled=throttled,
        protected=protected,
    )


def _words(s: JobSummary) -> str:
    """A summary in the words of its ``summary-publish`` event."""
    parts = [f"{s.kind} job, {s.sampled_s:.0f} s on {s.cores_allocated} cores"]
    if s.gpus:
        share = s.gpu_wait_share
        util = f"{s.gpu_util_pct_mean:.0f}%" if s.gpu_util_pct_mean is not None else "?"
        wait = f"{share:.0%}" if share is not None else "unknown"
        parts.append(f"{s.gpus} GPU(s) {util} busy, waiting on its CPUs {wait} of the time")
    if s.probes:
        parts.append(f"{s.probes} probe(s) over {s.probe_s:.0f} s")
    if s.throttled_s:
        parts.append(f"throttled {s.throttled_s:.0f} s")
    return "; ".join(parts)


class SummaryRecorder:
    """Folds each tick into every job's summary and hands on those of the jobs that left
    the node (and, at stop, of every job)."""

    def __init__(self, cfg: CodaConfig, node_name: str, event: EventFn) -> None:
        self.cfg = cfg
        self.node_name = node_name
        self._event = event
        self.running = SummaryAccumulator(node_name)
        self.counters = JobEndCounters()
        self.store = store_for(cfg)

    def step(
        self, snap: NodeSnapshot, decision: Decision, loop: AdaptiveLoop, changes: Mapping
    ) -> None:
        """This tick into each job's summary (after its writes: ``changes`` is what is in
        force now); the summaries of the jobs no longer on the node, handed on."""
        out = decision.loop
        held = [loop.eliminator.throttled.get(j) for j in out.throttles]
        protected = {t.for_job for t in held if t is not None and t.for_job is not None}
        gpus = {g.index: g for g in snap.gpus}
        for job_id, view in snap.jobs.items():
            facts = decision.facts.get(job_id)
            tick = summary_tick(
                snap,
                gpus,
                view,
                facts.allocated_cpus if facts is not None else None,
                changes.get(job_id),
                probe_cores=out.cores.get(job_id),
                throttled=job_id in out.throttles,
                protected=job_id in protected,
                profile_state=loop.profile_state(job_id),
            )
            if tick is not None:
                self.running.add(tick)
        ended = self.running.ended(set(snap.jobs))
        if ended:
            self.publish(ended, "job ended", loop.store)

    def publish_remaining(self, profiles: ProfileStore | None = None) -> None:
        """At stop: the summary of every job running, handed on; never raises."""
        try:
            self.publish(self.running.drain(), "daemon stopping", profiles)
        except Exception:
            # Nothing a summary can do may keep the jobs from being put back.
            log.exception("job summaries not written at stop")

    def publish(
        self, summaries: Sequence[JobSummary], why: str, profiles: ProfileStore | None = None
    ) -> None:
        """Count each summary and hand it on: to the summary store, or (munge) to the
        controller's collector; one event per job, on failure too.  Under
        ``ProfilePublish=store`` a multi-node GPU job's figure also goes into its profile in
        ``profiles`` (:mod:`coda_common.store.multinode_merge`; the collector does that
        under munge), one more event for each."""
        good = []
        for s in summaries:
            try:
                summary_from_json_dict(s.to_json_dict())
            except SummaryFormatError as exc:
                self._event(s.job_id, "summary-publish", f"summary not written: {exc}")
                continue
            self.counters.add(s)
            good.append(s)
        if not good:
            return
        if self.cfg.profile_publish == "munge":
            self._drop(good, why)
            return
        self._append(good, why)
        if profiles is not None:
            for job_id, line in merge_summary_figures(profiles, good, time.time()):
                self._event(job_id, "multi-node-figure", line)

    def _append(self, summaries: list[JobSummary], why: str) -> None:
        """ProfilePublish=store: this node's file of the day in the summary store, then a
        prune where one is due."""
        try:
            self.store.append(summaries, writer=self.node_name)
        except (SummaryStoreError, OSError, ValueError) as exc:
            for s in summaries:
                line = f"cannot write its summary to {self.store.root} ({why}): {exc}"
                self._event(s.job_id, "summary-publish", line)
            return
        for s in summaries:
            path = self.store.root / day_of(s.end_unix_s) / f"{self.node_name}.jsonl"
            self._event(s.job_id, "summary-publish", f"{_words(s)} ({why}), written to {path}")
        try:
            removed = self.store.prune_if_due(time.time())
        except OSError as exc:
            log.warning("cannot prune job summaries in %s (%s)", self.store.root, exc)
            return
        if removed:
            log.info("job summaries of %s removed (retention)", ", ".join(removed))

    def _drop(self, summaries: list[JobSummary], why: str) -> None:
        """ProfilePublish=munge: the summaries as credentials in ProfileDropDir, at most
        MAX_DROP_SUMMARIES each (the collector appends them as writer ``collector``)."""
        for start in range(0, len(summaries), MAX_DROP_SUMMARIES):
            chunk = summaries[start : start + MAX_DROP_SUMMARIES]
            payload = SummaryDrop(self.node_name, time.time(), tuple(chunk))
            try:
                path = drop_as_configured(payload, self.cfg)
            except DropError as exc:
                for s in chunk:
                    line = f"cannot hand its summary to the controller ({why}): {exc}"
                    self._event(s.job_id, "summary-publish", line)
                continue
            for s in chunk:
                line = f"{_words(s)} ({why}), handed to the controller as {path}"
                self._event(s.job_id, "summary-publish", line)
