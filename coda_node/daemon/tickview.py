"""The view one tick writes for ``coda-node status`` and the metrics: the daemon's entry,
the node's (its capabilities, sampled GPUs and bandwidth, errors) and each job's, built
from the tick's report and what the daemon holds (coda_node.daemon.view builds the
entries)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from coda_node import __version__
from coda_node.daemon.recovery import allocated_cpus
from coda_node.daemon.view import (
    asdict,
    gpu_entries,
    job_entry,
    mem_bw_monitor_capability,
    mem_bw_monitor_entry,
    policy_entry,
)

if TYPE_CHECKING:
    from coda_common.config.codaconf import CodaConfig
    from coda_node.daemon.adaptive import AdaptiveLoop
    from coda_node.daemon.endpoint import MetricsEndpoint
    from coda_node.daemon.membw import MemBwMonitoring
    from coda_node.daemon.recovery import Recovery
    from coda_node.daemon.tick import TickReport
    from coda_node.enforce.state import NodeState
    from coda_node.system.cgroups import CgroupLayout
    from coda_node.system.cpu_ids import SlurmCpuIds
    from coda_node.system.nvml import Nvml
    from coda_node.system.resctrl import ResctrlInfo


class Daemon(Protocol):
    """What the view is built from: the running daemon (coda_node.daemon.service)."""

    cfg: CodaConfig
    node_name: str
    started_unix_s: float
    loop: AdaptiveLoop
    metrics: MetricsEndpoint
    counters: Callable[[], dict[str, Any]]
    layout: CgroupLayout
    cpus_online: int | None
    capabilities: list[dict[str, object]]
    mem_bw: MemBwMonitoring
    rdt_info: ResctrlInfo
    nvml: Nvml
    recovery: Recovery
    state: NodeState
    events: Iterable[dict[str, Any]]
    slurm_cpu_ids: SlurmCpuIds


def tick_view(d: Daemon, report: TickReport, limits: dict) -> dict[str, Any]:
    """The view of one tick (or of a restore): the daemon, the node, each job, the events."""
    snap = report.snapshot
    jobs = _job_views(d, report, limits)
    return {
        "daemon": {
            "running": True,
            "pid": os.getpid(),
            "version": __version__,
            "node_name": d.node_name,
            "started_unix_s": d.started_unix_s,
            "interval_s": d.cfg.node_interval_s,
            "enforce": list(d.cfg.node_enforce),
            "profiling": d.loop.profiling_off or "on",
            "contention": d.loop.contention_off
            or (
                f"on ({d.loop.hold_price})" if d.cfg.node_contention else "off (NodeContention=no)"
            ),
            "metrics": d.metrics.state,
            "counters": d.counters(),
        },
        "node": {
            "cgroup_version": d.layout.version,
            "slurm_cgroups": [str(p) for p in d.layout.slurm_dirs],
            "slurm_cgroups_reason": d.layout.reason,
            "cpus_online": d.cpus_online,
            "capabilities": [
                *d.capabilities,
                *mem_bw_monitor_capability(
                    d.mem_bw.monitor,
                    d.mem_bw.off,
                    d.rdt_info,
                    supplied=d.mem_bw.supplied,
                ),
            ],
            "mem_bw_monitor": mem_bw_monitor_entry(d.mem_bw.monitor, d.mem_bw.off),
            "nvml": asdict(d.nvml.status()),
            "gpus": [asdict(g) for g in snap.gpus],
            "mem_bw": [asdict(m) for m in snap.mem_bw],
            "pcie_bw": [asdict(p) for p in snap.pcie_bw],
            "errors": [
                *snap.errors,
                *report.problems,
                *d.limits_file.refused,
                *d.recovery.problems(d.state),
            ],
        },
        "jobs": jobs,
        "events": list(d.events),
        "sampled_unix_s": snap.unix_s,
    }


def _job_views(d: Daemon, report: TickReport, limits: dict) -> list[dict[str, Any]]:
    """Each job's entry, by job id."""
    snap = report.snapshot
    gpu_by_nvml = {g.index: g for g in snap.gpus}
    jobs = []
    for job_id, v in sorted(snap.jobs.items()):
        allocated = report.allocated.get(job_id)
        if job_id in d.state.repair or job_id in report.held:
            # Its cgroup is not (yet) the allocation: show Slurm's.
            allocated = d.slurm_cpu_ids.to_kernel(v.slurm.cpu_ids) if v.slurm else None
        elif allocated is None and v.cgroup is not None:
            allocated = allocated_cpus(d.state, job_id, v.cgroup)
        jobs.append(
            job_entry(
                job_id,
                v,
                gpus=gpu_entries(v, gpu_by_nvml),
                allocated=allocated,
                ch=d.state.changes.get(job_id),
                target=report.targets.get(job_id),
                res=report.results.get(job_id),
                limit=limits.get(job_id),
                policy=policy_entry(d.loop, job_id),
            )
        )
    return jobs
