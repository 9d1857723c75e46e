"""Sampling: everything the daemon reads in one tick, joined per job. Reads only.

Jobs are found in Slurm's cgroup tree (:mod:`coda_node.system.cgroups`) and joined with Slurm's
record of them (:mod:`coda_node.system.slurmjobs`, fetched once per job); GPUs come from NVML
(:mod:`coda_node.system.nvml`), mapped from Slurm's GRES index through the device minor number;
CPU time from cgroup accounting; memory bandwidth from resctrl MBM and the uncore memory
controllers, and PCIe traffic per socket from the uncore IIO stacks, where the node has them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from coda_node.system import cgroups
from coda_node.system.cgroups import CgroupJob, CgroupLayout
from coda_node.system.nvml import GpuSample, Nvml
from coda_node.system.paths import SystemRoot
from coda_node.system.perf import PerfError
from coda_node.system.slurmjobs import (
    GresDevice,
    SlurmJob,
    SlurmJobs,
    SlurmQueryError,
    gres_gpu_devices,
)

if TYPE_CHECKING:
    from coda_node.system.perf import PcieBwSample

log = logging.getLogger("coda-node")

UNSEEN_CHECK_S = 120.0
"""How often a daemon that finds no job in Slurm's cgroup tree asks ``squeue`` whether
jobs run here (one call per node per period, and none while the tree shows jobs)."""

_Sample = TypeVar("_Sample")


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU of a job: Slurm's index, the device's minor number, NVML's index."""

    slurm_index: int
    minor: int | None
    nvml_index: int | None


@dataclass(frozen=True, slots=True)
class JobView:
    job_id: int
    slurm: SlurmJob | None
    """None when slurmctld could not be asked (the job is still shown, from its cgroup)."""
    cgroup: CgroupJob | None
    """None without Slurm's cgroup tree, or when the job's cgroup could not be read
    (:attr:`NodeSnapshot.unreadable`)."""
    gpus: tuple[GpuRef, ...]
    cpu_usage_ns: int | None
    cpu_rate_cores: float | None
    """CPU time used per second of wall time since the last tick, in cores."""
    mem_bw_bytes_per_s: float | None
    """From the job's resctrl monitoring group, where one exists."""
    kind: str
    """``dnn`` (a GPU job), ``cpu``, or ``unknown`` without Slurm's record. Worked out once
    per sample: a tick asks it of every job several times."""

    @property
    def cpus_now(self) -> frozenset[int]:
        if self.cgroup is not None:
            return self.cgroup.cpus
        return self.slurm.cpu_ids if self.slurm is not None else frozenset()


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    monotonic_s: float
    unix_s: float
    node_name: str
    jobs: dict[int, JobView]
    gpus: tuple[GpuSample, ...]
    mem_bw: tuple[object, ...]
    """Per-socket uncore memory bandwidth samples (:class:`coda_node.system.perf.MemBwSample`)."""
    errors: tuple[str, ...]
    pcie_bw: tuple[PcieBwSample, ...] = ()
    """Per-socket PCIe traffic from the uncore IIO counters; empty when not measured or
    when reading them failed this tick."""
    unreadable: Mapping[int, str] = field(default_factory=dict)
    """Jobs whose cgroup is there but could not be read this tick -> why (the file named).
    Such a job is in ``jobs`` without its cgroup where Slurm lists it; it has not ended,
    and nothing of it is to be changed or put back until it reads again."""


class Sampler:
    def __init__(
        self,
        *,
        root: SystemRoot,
        node_name: str,
        layout: CgroupLayout | None,
        slurm: SlurmJobs,
        nvml: Nvml,
        gres_conf: Path | None,
        mem_bw: Callable[[], list[object]] | None = None,
        pcie_bw: Callable[[], Sequence[PcieBwSample]] | None = None,
        mbm: Callable[[int], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.node_name = node_name
        self.layout = layout
        self.slurm = slurm
        self.nvml = nvml
        self.gres_conf = gres_conf
        self._mem_bw = mem_bw
        self._pcie_bw = pcie_bw
        self._uncore_failing: dict[str, str] = {}
        """What failed the last time each uncore sampler was read, by what it measures."""
        self._mbm = mbm
        self._clock = clock
        self._last_cpu: dict[int, tuple[float, int]] = {}
        self._cgroup_accounting: bool | None = None
        self.detail_jobs: set[int] = set()
        """Jobs whose steps are read too (those the daemon may change)."""
        self.task_jobs: set[int] = set()
        """Jobs whose tasks are read too (those where a change acts on tasks: a CPU quota
        that moves them, a resctrl group); every job's when CPU time is summed per thread."""
        self._subdirs = cgroups.SubdirCache()
        """Those jobs' directories, listed again only when they change."""
        self._gres: list[GresDevice] | None = None
        self._unseen_asked_s: float | None = None
        self._unseen_listed: frozenset[int] = frozenset()
        """The running jobs squeue listed at the last check while the tree showed none."""
        self._unseen: frozenset[int] = frozenset()
        """Jobs squeue listed at two checks in a row while the tree showed none."""
        self._logged: set[str] = set()
        """The cgroup problems already logged: each is logged when it starts, not per tick."""

    def gres_devices(self) -> list[GresDevice]:
        if self._gres is None:
            if self.gres_conf is None:
                self._gres = []
            else:
                self._gres = gres_gpu_devices(self.gres_conf, self.node_name, self.root)
        return self._gres

    def reset_accounting(self) -> None:
        """Decide again where CPU time comes from (the cgroup layout changed)."""
        self._cgroup_accounting = None
        self._subdirs = cgroups.SubdirCache()

    def _accounting_in_cgroups(self) -> bool:
        """Whether a job's CPU time is one file (v2 cpu.stat, v1 cpuacct by Slurm's
        jobacct_gather/cgroup) rather than a sum over its threads."""
        if self._cgroup_accounting is None:
            layout = self.layout
            ok = False
            if layout is not None and layout.version == 2:
                ok = True
            elif layout is not None and layout.cpuacct_mount and layout.cpuset_mount:
                ok = any(
                    (layout.cpuacct_mount / top.relative_to(layout.cpuset_mount)).is_dir()
                    for top in layout.slurm_dirs
                    if top.is_relative_to(layout.cpuset_mount)
                )
            self._cgroup_accounting = ok
        return self._cgroup_accounting

    def forget(self, job: CgroupJob) -> None:
        """Read ``job``'s directories afresh next time (the daemon just wrote to them)."""
        self._subdirs.forget(os.fspath(job.path))

    def _detail(self, job_id: int) -> cgroups.Detail:
        if job_id in self.task_jobs:
            return "tasks"
        return "steps" if job_id in self.detail_jobs else "cpus"

    def sample(self) -> NodeSnapshot:
        errors: list[str] = []
        now = self._clock()
        scan = self._scan_cgroups(errors)
        cg_jobs = scan.jobs
        ids = set(cg_jobs) | set(scan.unreadable)
        if self.layout is None:
            try:
                ids = self.slurm.on_node()
            except SlurmQueryError as exc:
                errors.append(f"cannot list jobs: {exc}")
        slurm_jobs = self.slurm.get(ids)
        if self.slurm.last_error:
            errors.append(self.slurm.last_error)
        gpus = tuple(self.nvml.sample())
        minor_to_nvml = self.nvml.minor_to_index() if gpus else {}
        by_index = {d.index: d for d in self.gres_devices()}
        jobs: dict[int, JobView] = {}
        for job_id in sorted(ids):
            cg = cg_jobs.get(job_id)
            sj = slurm_jobs.get(job_id)
            if cg is None and sj is None:
                continue
            refs = _gpu_refs(sj, by_index, minor_to_nvml)
            usage = self._usage_ns(cg, errors)
            rate = self._cpu_rate(job_id, usage)
            jobs[job_id] = JobView(
                job_id=job_id,
                slurm=sj,
                cgroup=cg,
                gpus=refs,
                cpu_usage_ns=usage,
                cpu_rate_cores=rate,
                mem_bw_bytes_per_s=self._mbm(job_id) if self._mbm is not None else None,
                kind="unknown" if sj is None else "dnn" if sj.is_dnn else "cpu",
            )
        for gone in set(self._last_cpu) - set(jobs):
            del self._last_cpu[gone]
        mem_bw = self._read_uncore("memory bandwidth", self._mem_bw, errors)
        pcie_bw = self._read_uncore("PCIe bandwidth", self._pcie_bw, errors)
        return NodeSnapshot(
            monotonic_s=now,
            unix_s=time.time(),
            node_name=self.node_name,
            jobs=jobs,
            gpus=gpus,
            mem_bw=tuple(mem_bw),
            errors=tuple(errors),
            pcie_bw=tuple(pcie_bw),
            unreadable=scan.unreadable,
        )

    def _scan_cgroups(self, errors: list[str]) -> cgroups.JobScan:
        """The jobs in Slurm's cgroup tree (none without a cgroup layout); what keeps jobs
        out of sight goes to ``errors``."""
        if self.layout is None:
            return cgroups.JobScan({})
        # Without cgroup accounting CPU time comes from each thread in /proc: every job
        # is then read with its tasks.
        detail = self._detail if self._accounting_in_cgroups() else None
        scan = cgroups.scan_jobs(
            self.layout,
            detail=detail,
            cache=self._subdirs,
            resolve=self.slurm.job_ids_of_dirs,
        )
        self._cgroup_problems(scan, errors)
        return scan

    def _usage_ns(self, cg: CgroupJob | None, errors: list[str]) -> int | None:
        """The job's CPU time so far (cgroups.cpu_usage_ns); None, and a line in
        ``errors``, when its accounting cannot be read: that job's rate is unknown this
        tick, and the tick goes on."""
        if cg is None or self.layout is None:
            return None
        try:
            return cgroups.cpu_usage_ns(self.layout, cg)
        except (cgroups.CgroupReadError, ValueError) as exc:
            errors.append(f"job {cg.job_id}: cannot read its CPU time ({exc})")
            return None

    def _cpu_rate(self, job_id: int, usage_ns: int | None) -> float | None:
        """The job's CPU use in cores since its last reading, None for its first; remembers
        ``usage_ns`` as its last reading."""
        if usage_ns is None:
            return None
        rate = None
        # Timed at the read itself: a slow scontrol call earlier in this tick must
        # not stretch or shrink the interval the rate is computed over.
        read_s = self._clock()
        last = self._last_cpu.get(job_id)
        if last is not None and read_s > last[0] and usage_ns >= last[1]:
            rate = (usage_ns - last[1]) / 1e9 / (read_s - last[0])
        self._last_cpu[job_id] = (read_s, usage_ns)
        return rate

    def _cgroup_problems(self, scan: cgroups.JobScan, errors: list[str]) -> None:
        """What keeps jobs out of sight: directories under Slurm's scope no job can be
        named for, jobs whose cgroup cannot be read, and jobs squeue runs here while the
        tree shows none. Each is in the view's errors while it lasts, and logged once when
        it starts."""
        found = [f"{d.path} is no job coda-node can name ({d.why})" for d in scan.unattributed]
        found += [
            f"job {job_id}: cannot read its cgroup ({why}); it is left as it is, limits and "
            "record kept, until it reads again"
            for job_id, why in sorted(scan.unreadable.items())
        ]
        if self.slurm.sluid_error:
            found.append(self.slurm.sluid_error)
        unseen = self._unseen_jobs(bool(scan.jobs or scan.unattributed or scan.unreadable))
        if unseen:
            assert self.layout is not None
            where = ", ".join(map(str, self.layout.slurm_dirs))
            found.append(
                f"squeue lists running job(s) {', '.join(map(str, sorted(unseen)))} on "
                f"{self.node_name}, but Slurm's cgroup tree ({where}) holds no job: "
                "coda-node cannot see or change them"
            )
        errors.extend(found)
        for line in found:
            if line not in self._logged:
                log.warning("%s", line)
        for line in self._logged - set(found):
            log.info("resolved: %s", line)
        self._logged = set(found)

    def _unseen_jobs(self, tree_shows_jobs: bool) -> frozenset[int]:
        """Jobs ``squeue`` lists as running here at two checks in a row (UNSEEN_CHECK_S
        apart) while the tree showed none: a job just started may not have its cgroup yet,
        one seen twice has had a whole period to make it."""
        if tree_shows_jobs:
            self._unseen_asked_s = None
            self._unseen_listed = self._unseen = frozenset()
            return self._unseen
        now = self._clock()
        if self._unseen_asked_s is not None and now - self._unseen_asked_s < UNSEEN_CHECK_S:
            return self._unseen
        self._unseen_asked_s = now
        try:
            listed = frozenset(self.slurm.on_node(states="R"))
        except SlurmQueryError:
            return self._unseen  # slurmctld unreachable: the tick's other errors say so
        self._unseen = listed & self._unseen_listed
        self._unseen_listed = listed
        return self._unseen

    def _read_uncore(
        self, what: str, read: Callable[[], Sequence[_Sample]] | None, errors: list[str]
    ) -> Sequence[_Sample]:
        """One uncore sampler's per-socket samples; none this tick when its counters cannot
        be read. Node-wide counters are context for the jobs, not something a tick needs:
        a failed read(2) (a CPU taken offline under a counter, EBADF after a close) is shown
        in the view's errors, logged once until it reads again, and the tick goes on."""
        if read is None:
            return []
        try:
            samples = read()
        except PerfError as exc:
            message = f"cannot read the uncore {what} counters: {exc}"
            errors.append(message)
            if self._uncore_failing.get(what) != message:
                log.warning("%s; going on without them", message)
            self._uncore_failing[what] = message
            return []
        if self._uncore_failing.pop(what, None) is not None:
            log.info("uncore %s counters read again", what)
        return samples


def _gpu_refs(
    sj: SlurmJob | None, by_index: dict[int, GresDevice], minor_to_nvml: dict[int, int]
) -> tuple[GpuRef, ...]:
    """The job's GPUs: Slurm's indices with the device minor (gres.conf) and NVML's index."""
    refs = []
    for idx in sj.gpu_indices if sj is not None else ():
        dev = by_index.get(idx)
        minor = dev.minor if dev is not None else None
        refs.append(GpuRef(idx, minor, minor_to_nvml.get(minor) if minor is not None else None))
    return tuple(refs)
