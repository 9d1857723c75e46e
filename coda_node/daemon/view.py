"""The daemon's record of a tick for ``coda-node status`` and the metrics: the events it
keeps (and logs once), and each job's and the node's entries of the view it writes.

Nothing here reads the node or decides anything: the entries are built from the tick's
snapshot, targets and results and from what the enforcer recorded.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from coda_node.status.document import event_action
from coda_node.system.cpulist import format_cpulist

if TYPE_CHECKING:
    from coda_node.daemon.adaptive import AdaptiveLoop
    from coda_node.enforce.enforcer import JobResult
    from coda_node.enforce.mongroups import JobMonitor
    from coda_node.enforce.state import JobChanges, Limit
    from coda_node.policy.targets import JobTarget
    from coda_node.sampling.snapshot import JobView
    from coda_node.system.nvml import GpuSample
    from coda_node.system.resctrl import ResctrlInfo

log = logging.getLogger("coda-node")

MAX_EVENTS = 200


class EventLog:
    """The daemon's decisions and writes: the last MAX_EVENTS for the view, a count by
    action since start for the metrics, and one log line each."""

    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.events_total: Counter[str] = Counter()
        """Events by action since start (the view keeps only the last MAX_EVENTS)."""
        self._failing: dict[int, frozenset[str]] = {}
        """Each job's failed writes of the last tick: a failure is an event (and a log
        line) when it starts, not on every tick it goes on (status shows it meanwhile)."""

    def record(
        self,
        tick: int,
        job_id: int,
        what: str,
        reason: str,
        reading: dict[str, Any] | None = None,
    ) -> None:
        """Keep the decision for `coda-node status` and log it once, job id first."""
        action = event_action(what)
        event: dict[str, Any] = {
            "unix_s": round(time.time(), 3),
            "tick": tick,
            "job_id": job_id,
            "action": action,
            "what": what,
            "reason": reason,
        }
        if reading:
            event["reading"] = reading
        self.events.append(event)
        self.events_total[action] += 1
        log.log(
            logging.ERROR if action == "failed" else logging.INFO,
            "job=%d action=%s reason=%s%s",
            job_id,
            json.dumps(what),
            json.dumps(reason),
            f" reading={json.dumps(reading, sort_keys=True)}" if reading else "",
        )

    def record_tick(
        self,
        tick: int,
        loop_events: Iterable[Any],
        results: Mapping[int, JobResult],
        reason_of: Callable[[int], str],
    ) -> None:
        """The loop's decisions first, then the writes they (and admin limits) caused."""
        for ev in loop_events:
            self.record(tick, ev.job_id, ev.action, ev.rule, dict(ev.reading))
        for job_id, res in results.items():
            reason = reason_of(job_id)
            for what in res.applied:
                self.record(tick, job_id, what, reason)
            failing = self._failing.get(job_id, frozenset())
            for what in res.failed:
                if what not in failing:
                    self.record(tick, job_id, f"failed: {what}", reason)
        self._failing = {j: frozenset(r.failed) for j, r in results.items() if r.failed}

    def record_results(self, tick: int, results: Mapping[int, JobResult], reason: str) -> None:
        """Every write of ``results``, done or failed, for one reason."""
        for job_id, res in results.items():
            for what in res.applied:
                self.record(tick, job_id, what, reason)
            for what in res.failed:
                self.record(tick, job_id, f"failed: {what}", reason)


def job_entry(
    job_id: int,
    v: JobView,
    *,
    gpus: list[dict[str, Any]],
    allocated: frozenset[int] | None,
    ch: JobChanges | None,
    target: JobTarget | None,
    res: JobResult | None,
    limit: Limit | None,
    policy: dict[str, Any],
) -> dict[str, Any]:
    """One job's entry of the view; ``allocated`` is Slurm's allocation as the tick knew
    it, ``ch`` the enforcer's record after this tick's writes."""
    # What is in force after this tick's writes, not what the sample saw before them.
    cpus_now = v.cpus_now
    if ch is not None and ch.cpuset_applied is not None:
        cpus_now = frozenset(ch.cpuset_applied)
    elif res and allocated and any(a.startswith("cpuset restored") for a in res.applied):
        cpus_now = allocated
    record = dict(v.slurm.admin_record) if v.slurm and v.slurm.admin_record else None
    return {
        "job_id": job_id,
        "user": v.slurm.user if v.slurm else None,
        "name": v.slurm.name if v.slurm else None,
        "kind": v.kind,
        "gpus": gpus,
        "cpus_slurm": cpus_text(v.slurm.cpu_ids) if v.slurm else None,
        "cpus_allocated": cpus_text(allocated) if allocated is not None else None,
        "cpus_now": cpus_text(cpus_now),
        "cpu_usage_ns": v.cpu_usage_ns,
        "cpu_rate_cores": v.cpu_rate_cores,
        "mem_bw_bytes_per_s": v.mem_bw_bytes_per_s,
        "quota_cores": ch.quota_applied if ch and ch.quota_active else None,
        "limit": limit.to_dict() if limit is not None else None,
        "target_reason": target.reason if target else None,
        "hook_record": record,
        "last_failed": res.failed if res else [],
        **policy,
    }


def policy_entry(loop: AdaptiveLoop, job_id: int) -> dict[str, Any]:
    """What the adaptive loop knows of a job: progress, profiling, contention."""
    prog = loop.progress.get(job_id)
    rec = loop.allocator.records.get(job_id)
    contention = loop.eliminator.dnn_status(job_id) or loop.eliminator.cpu_status(job_id)
    return {
        "progress": {
            "rate": prog.rate,
            "source": prog.source,
            "phase": prog.phase,
            "level": prog.level,
            "age_s": prog.age_s,
        }
        if prog
        else None,
        "profiling": rec.to_dict() if rec else None,
        "profile_state": loop.profile_state(job_id),
        "contention": contention,
        "pcie_bytes_per_s": loop.pcie.get(job_id),
    }


def gpu_entries(v: JobView, gpu_by_nvml: dict[int, GpuSample]) -> list[dict[str, Any]]:
    """The job's GPUs in its view entry: Slurm's index, the device minor, NVML's index
    and its utilisation."""
    gpus = []
    for ref in v.gpus:
        g = gpu_by_nvml.get(ref.nvml_index) if ref.nvml_index is not None else None
        gpus.append(
            {
                "slurm_index": ref.slurm_index,
                "minor": ref.minor,
                "nvml_index": ref.nvml_index,
                "util_pct": g.util_pct if g else None,
            }
        )
    return gpus


def mem_bw_monitor_entry(monitor: JobMonitor | None, off: str | None) -> dict[str, Any]:
    if monitor is None:
        return {"state": off or "off"}
    return {"state": "on", **monitor.status()}


def mem_bw_monitor_capability(
    monitor: JobMonitor | None, off: str | None, info: ResctrlInfo, supplied: bool
) -> list[dict[str, object]]:
    """A capability row for `coda-node status`: how many CPU jobs are measured and
    which are not, and why. No row where resctrl has no MBM (the "memory-bandwidth
    monitoring" row already says why) or the bandwidth comes from elsewhere
    (``supplied``)."""
    if monitor is None:
        if not (info.usable and info.mbm) or supplied:
            return []
        return [
            {
                "name": "per-job memory bandwidth",
                "available": False,
                "detail": f"resctrl MBM: {off or 'off'}",
            }
        ]
    detail = f"resctrl MBM ({monitor.event}): {len(monitor.monitored())} CPU job(s) measured"
    if monitor.unmonitored:
        detail += "; not measured: " + "; ".join(
            f"job {j}: {why}" for j, why in sorted(monitor.unmonitored.items())
        )
    return [{"name": "per-job memory bandwidth", "available": True, "detail": detail}]


def asdict(obj: Any) -> dict[str, Any]:
    """A sample as a plain dict for the view, nested samples too. Not dataclasses.asdict,
    which deep-copies every value: for the view's GPUs that was a third of the view's build
    time (docs/benchmarks.md); every value here is immutable or built afresh."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {name: _plain(getattr(obj, name)) for name in _field_names(type(obj))}
    return dict(obj)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@functools.lru_cache(maxsize=1024)
def cpus_text(cpus: frozenset[int]) -> str:
    """format_cpulist, cached: the view shows three CPU lists per job every tick, and they
    are the same few sets tick after tick."""
    return format_cpulist(cpus)
