"""The daemon's parts, built from coda.conf and what the node offers: which mechanisms can
act (the capability gates), the enforcer and the adaptive loop over them, the uncore
counters and the per-job bandwidth monitor. Built once at start and again when Slurm's
cgroup tree appears; nothing here ticks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from coda_common.config.codaconf import CodaConfig
from coda_common.store.profiles import ProfileStore
from coda_node.daemon.adaptive import AdaptiveLoop
from coda_node.enforce.enforcer import Enforcer
from coda_node.enforce.mechanisms import registered
from coda_node.enforce.mongroups import JobMonitor
from coda_node.enforce.state import NodeState
from coda_node.sampling.snapshot import Sampler
from coda_node.system.cgroups import CgroupLayout, CpuQuotaWriter, CpusetWriter
from coda_node.system.nvml import Nvml
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import ResctrlControl, ResctrlError, ResctrlInfo
from coda_node.system.slurmjobs import SlurmJobs

if TYPE_CHECKING:
    from coda_node.system.perf import PcieBwSample, UncoreMemBw, UncorePcieBw, UncorePlan

    _Uncore = TypeVar("_Uncore", UncoreMemBw, UncorePcieBw)

log = logging.getLogger("coda-node")

MakeRdt = Callable[[SystemRoot, ResctrlInfo], ResctrlControl]


# -- capability gates ---------------------------------------------------------------
def mba_unavailable(cfg: CodaConfig, info: ResctrlInfo) -> str | None:
    """None when memory-bandwidth limits can be applied, else why not."""
    if "rdt" not in cfg.node_enforce:
        return "NodeEnforce does not include rdt"
    if not info.mounted:
        return info.reason or "resctrl not mounted"
    if info.mb is None:
        return info.mb_reason or "no MB resource in resctrl"
    return None


def cat_unavailable(cfg: CodaConfig, info: ResctrlInfo) -> str | None:
    """None when L3 cache-way limits (CAT) can be applied, else why not."""
    if "rdt" not in cfg.node_enforce:
        return "NodeEnforce does not include rdt"
    if not info.usable:
        return info.reason or "resctrl not mounted"
    if info.l3 is None:
        return info.l3_reason or "no L3 resource in resctrl"
    if not info.can_allocate:
        return "resctrl offers no CLOSID for a control group"
    return None


def profiling_off(cfg: CodaConfig, layout: CgroupLayout) -> str | None:
    if not layout.has_slurm:
        return f"no Slurm cgroup tree ({layout.reason})"
    if "cpuset" not in cfg.node_enforce:
        return "NodeEnforce does not include cpuset"
    return None


def contention_off(
    cfg: CodaConfig, layout: CgroupLayout, info: ResctrlInfo, per_job_bw: bool
) -> str | None:
    if not layout.has_slurm:
        return f"no Slurm cgroup tree ({layout.reason})"
    mba = mba_unavailable(cfg, info) is None and per_job_bw
    cat = cat_unavailable(cfg, info) is None
    if "quota" not in cfg.node_enforce and not mba and not cat:
        return "NodeEnforce includes neither quota nor a usable rdt"
    return None


# -- the enforcer and the loop ----------------------------------------------------------
def rdt_control(
    cfg: CodaConfig, root: SystemRoot, info: ResctrlInfo, make_rdt: MakeRdt | None
) -> ResctrlControl | None:
    """A resctrl writer when "rdt" is enforced and resctrl has MB or L3 CAT."""
    if "rdt" not in cfg.node_enforce:
        return None
    if info.mb is None and cat_unavailable(cfg, info) is not None:
        return None
    if make_rdt is not None:
        return make_rdt(root, info)
    return ResctrlControl(root, info)


def make_enforcer(
    cfg: CodaConfig,
    root: SystemRoot,
    layout: CgroupLayout,
    state: NodeState,
    save: Callable[[], None],
    *,
    make_cpuset: Callable[[CgroupLayout], CpusetWriter],
    make_quota: Callable[[CgroupLayout], CpuQuotaWriter],
    rdt: Callable[[], ResctrlControl | None],
) -> Enforcer:
    """The enforcer over the writers Slurm's cgroup tree allows (none without the tree):
    the built-in mechanisms' from the factories given, any other's from its own
    :meth:`~coda_node.enforce.mechanisms.base.Mechanism.open`."""
    usable = layout.has_slurm
    opened = {kind.name: kind.open(root, layout) for kind in registered()} if usable else {}
    return Enforcer(
        state=state,
        save=save,
        cpuset=make_cpuset(layout) if usable else None,
        quota=make_quota(layout) if usable else None,
        rdt=rdt() if usable else None,
        root=root,
        cgroup_version=layout.version,
        mechanisms=cfg.node_enforce,
        writers={name: writer for name, writer in opened.items() if writer is not None},
    )


def make_loop(
    cfg: CodaConfig,
    root: SystemRoot,
    *,
    node_name: str,
    layout: CgroupLayout,
    info: ResctrlInfo,
    per_job_bw: bool,
    store: ProfileStore | None,
) -> AdaptiveLoop:
    """The adaptive loop over the mechanisms the node offers."""
    l3 = info.l3 if cat_unavailable(cfg, info) is None else None
    return AdaptiveLoop(
        cfg,
        root,
        node_name=node_name,
        mba=mba_unavailable(cfg, info) is None and per_job_bw,
        l3_ways=l3.cbm_bits if l3 is not None else None,
        l3_min_ways=l3.min_cbm_bits if l3 is not None else 1,
        profiling_off=profiling_off(cfg, layout),
        contention_off=contention_off(cfg, layout, info, per_job_bw),
        store=store,
    )


# -- per-job memory bandwidth (resctrl MBM) -----------------------------------------
def start_mem_bw_monitor(
    cfg: CodaConfig,
    root: SystemRoot,
    layout: CgroupLayout,
    info: ResctrlInfo,
    *,
    make_rdt: MakeRdt | None,
    supplied: bool,
) -> tuple[JobMonitor | None, str | None]:
    """(the monitor, None) measuring each CPU job's bandwidth with its own resctrl MON
    group (coda_node.enforce.mongroups, read by coda_node.sampling.mbm) where resctrl counts
    it, Slurm's cgroups show the jobs and NodeJobMemBw=yes; else (None, why not).
    ``supplied``: the caller supplies per-job bandwidth."""
    if supplied:
        return None, "not needed: per-job bandwidth is supplied by the caller"
    if not cfg.node_job_mem_bw:
        return None, "off (NodeJobMemBw=no)"
    if not info.usable:
        return None, info.reason or "resctrl not usable"
    if not info.mbm:
        return None, info.mbm_reason or "no MBM events in resctrl"
    if not layout.has_slurm:
        return None, f"no Slurm cgroup tree ({layout.reason})"
    make = make_rdt or ResctrlControl
    try:
        return JobMonitor(root, make(root, info)), None
    except ResctrlError as exc:
        log.warning("per-job memory bandwidth unavailable: %s", exc)
        return None, str(exc)


def make_sampler(
    cfg: CodaConfig,
    root: SystemRoot,
    node_name: str,
    layout: CgroupLayout,
    slurm: SlurmJobs,
    nvml: Nvml,
    *,
    mem_bw: Callable[[], list[object]],
    pcie_bw: Callable[[], Sequence[PcieBwSample]],
    mbm: Callable[[int], float | None],
    clock: Callable[[], float],
) -> Sampler:
    """The sampler, reading Slurm's tree where there is one (else squeue only) and
    gres.conf beside slurm.conf."""
    gres_conf = cfg.slurm_conf.with_name("gres.conf") if cfg.slurm_conf else None
    return Sampler(
        root=root,
        node_name=node_name,
        layout=layout if layout.has_slurm else None,
        slurm=slurm,
        nvml=nvml,
        gres_conf=gres_conf,
        mem_bw=mem_bw,
        pcie_bw=pcie_bw,
        mbm=mbm,
        clock=clock,
    )


# -- uncore counters ------------------------------------------------------------------
class UncoreCounters:
    """The uncore counters the daemon opens itself (not injected ones), closed on stop."""

    def __init__(self, root: SystemRoot) -> None:
        self.root = root
        self.samplers: list[UncoreMemBw | UncorePcieBw] = []

    def mem_bw(self) -> Callable[[], list[object]] | None:
        """Per-socket memory bandwidth from the uncore IMC counters, where there are some."""
        from coda_node.system.perf import UncoreMemBw, plan_mem_bw

        sampler = self._open(UncoreMemBw, plan_mem_bw, "memory-bandwidth")
        return (lambda: list(sampler.sample())) if sampler is not None else None

    def pcie_bw(self) -> Callable[[], list[PcieBwSample]] | None:
        """Per-socket PCIe traffic from the uncore IIO counters, where there are some (the
        issue's "PCIe/IIO traffic per socket"; GPUs' own PCIe rates come from NVML)."""
        from coda_node.system.perf import UncorePcieBw, plan_pcie_bw

        sampler = self._open(UncorePcieBw, plan_pcie_bw, "PCIe-bandwidth")
        return sampler.sample if sampler is not None else None

    def _open(
        self,
        kind: Callable[..., _Uncore],
        plan_for: Callable[[SystemRoot], UncorePlan],
        what: str,
    ) -> _Uncore | None:
        """A sampler of ``kind`` over the counters ``plan_for`` finds, opened and kept to
        close on stop; None where there are none, or (logged) when the kernel refuses them
        (no CAP_PERFMON, no such PMU): the daemon goes on without."""
        from coda_node.system.perf import PerfError

        plan = plan_for(self.root)
        if not plan.available:
            return None
        sampler = kind(self.root, plan=plan)
        try:
            sampler.open()
        except PerfError as exc:
            log.warning("uncore %s counters unavailable: %s", what, exc)
            return None
        self.samplers.append(sampler)
        return sampler

    def close(self) -> None:
        """Close the uncore counters opened here (each is one perf fd per PMU and socket
        CPU); a later tick reports them as unreadable rather than failing."""
        from coda_node.system.perf import PerfError

        samplers, self.samplers = self.samplers, []
        for sampler in samplers:
            try:
                sampler.close()  # tries every fd before it raises the first error
            except PerfError as exc:
                log.warning("closing the %s counters: %s", sampler.plan.what, exc)
