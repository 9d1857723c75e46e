"""Per-job memory bandwidth on the node: the injected source, or one resctrl MON group per
CPU job (coda_node.enforce.mongroups, read by coda_node.sampling.mbm) where resctrl counts
it, Slurm's cgroups show the jobs and NodeJobMemBw=yes; and the groups' removal when the
daemon puts the jobs back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from coda_common.config.codaconf import CodaConfig
from coda_node.daemon.wiring import start_mem_bw_monitor
from coda_node.enforce.enforcer import Enforcer
from coda_node.enforce.mongroups import JobMonitor, remove_job_groups
from coda_node.enforce.state import JobChanges
from coda_node.sampling.snapshot import NodeSnapshot
from coda_node.system import cgroups
from coda_node.system.cgroups import CgroupJob, CgroupLayout
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import ResctrlControl, ResctrlError, ResctrlInfo

log = logging.getLogger("coda-node")


class MemBwMonitoring:
    """Where each job's memory bandwidth comes from, and the MON groups that measure it."""

    def __init__(
        self,
        cfg: CodaConfig,
        root: SystemRoot,
        rdt_info: ResctrlInfo,
        *,
        make_rdt: Callable[[SystemRoot, ResctrlInfo], ResctrlControl] | None,
        supplied: Callable[[int], float | None] | None,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.rdt_info = rdt_info
        self._make_rdt = make_rdt
        self.rate_of = supplied
        """A job's bandwidth in bytes/s: the injected source or the monitor's rate."""
        self.monitor: JobMonitor | None = None
        """Per-job bandwidth from resctrl MON groups, when nothing else supplies it."""
        self.off: str | None = None
        """Why there is no monitor (None while there is one, or none was tried)."""

    @property
    def supplied(self) -> bool:
        """Per-job bandwidth is measured (injected, or by the monitor)."""
        return self.rate_of is not None

    def start(self, layout: CgroupLayout) -> None:
        """Start the monitor where it can run, else record why not. Called again when
        Slurm's cgroup tree appears."""
        if self.monitor is not None:
            return
        self.monitor, self.off = start_mem_bw_monitor(
            self.cfg,
            self.root,
            layout,
            self.rdt_info,
            make_rdt=self._make_rdt,
            supplied=self.rate_of is not None,
        )
        if self.monitor is not None:
            # Counts as per-job bandwidth for the adaptive loop from now on.
            self.rate_of = self.monitor.rate

    def job_rate(self, job_id: int) -> float | None:
        """The sampler's per-job bandwidth."""
        return self.rate_of(job_id) if self.rate_of is not None else None

    def sync(
        self,
        snap: NodeSnapshot,
        cg_jobs: dict[int, CgroupJob],
        changes: Mapping[int, JobChanges],
        layout: CgroupLayout,
        enforcer: Enforcer,
        clock: Callable[[], float],
    ) -> None:
        """After the enforcer: one MON group per CPU job, under the control group the
        enforcer put its threads in (changes[job].rdt_group, else the root)."""
        monitor = self.monitor
        if monitor is None:
            return
        cpu_jobs = [j for j, v in snap.jobs.items() if v.kind == "cpu" and j in cg_jobs]

        def ctrl_group_of(job_id: int) -> str:
            ch = changes.get(job_id)
            return (ch.rdt_group or "") if ch is not None else ""

        def tids(job_id: int) -> list[int] | None:
            cg = cg_jobs[job_id]
            pids: tuple[int, ...] | None = cg.pids
            if cg.detail != "tasks":  # listed without its tasks this tick
                # Only the tasks files: the monitor needs no CPUs or mems of the job.
                pids = cgroups.job_tasks(layout, cg)
            # The same thread ids the enforcer moves into its MB groups.
            return enforcer.thread_ids(pids) if pids is not None else None

        monitor.sync(clock(), cpu_jobs, ctrl_group_of, tids)

    def remove_groups(self) -> None:
        """Every coda_j* MON group goes (also those a killed daemon left): each holds one
        of the node's few RMIDs."""
        if self.monitor is not None:
            self.monitor.close()
        elif self.rdt_info.usable and self.rdt_info.mbm:
            # No monitor now (NodeJobMemBw=no), but a previous run may have left groups.
            try:
                remove_job_groups((self._make_rdt or ResctrlControl)(self.root, self.rdt_info))
            except (ResctrlError, OSError) as exc:
                log.error("cannot clean up resctrl monitoring groups: %s", exc)
