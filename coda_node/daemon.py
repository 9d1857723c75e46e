"""``coda-node run``: the loop on each GPU node. Sample, plan, enforce; record everything.

Each tick reads the node (:mod:`coda_node.sampling`), asks the pure policy what every job
should look like (:mod:`coda_node.policy`), and writes only the differences
(:mod:`coda_node.enforce`). The state file records, before any write, how Slurm had set
each job, so a restart puts back whatever the plan no longer wants; SIGTERM (and
``coda-node restore``) puts back everything. The systemd unit also runs ``coda-node
restore`` after the daemon stops for any reason, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from coda_node import __version__, cgroups
from coda_node.adaptive import AdaptiveLoop, LoopOutput
from coda_node.cgroups import (
    DETAIL_RANK,
    CgroupJob,
    CgroupLayout,
    CpuQuotaWriter,
    CpusetWriter,
    Detail,
)
from coda_node.check import probe_all
from coda_node.cpu_ids import SlurmCpuIds
from coda_node.cpulist import format_cpulist, parse_cpulist
from coda_node.enforce import Enforcer, JobResult
from coda_node.mbm import JobMonitor, remove_job_groups
from coda_node.nvml import GpuSample, Nvml
from coda_node.observe import Progress
from coda_node.paths import SystemRoot
from coda_node.policy import JobFacts, JobTarget, choose_cpus, plan
from coda_node.resctrl import ResctrlControl, ResctrlError, ResctrlInfo
from coda_node.resctrl import discover as resctrl_discover
from coda_node.sampling import JobView, NodeSnapshot, Sampler
from coda_node.slurmjobs import Runner, SlurmJobs, SlurmQueryError, make_runner
from coda_node.state import (
    REPAIR_ALL,
    JobChanges,
    Limit,
    LimitsFile,
    NodeState,
    StateDamaged,
    StateError,
    StateFile,
)
from coda_node.status import event_action
from coda_node.topology import GpuLocality
from coda_node.usage import UsageAccumulator, UsageFlush, UsageTick
from slurm_plugin.conf import CodaConfig
from slurm_plugin.store import ProfileStore, StoreError

if TYPE_CHECKING:
    from coda_node.metrics import MetricsServer
    from coda_node.perf import PcieBwSample, UncoreMemBw, UncorePcieBw, UncorePlan

    _Uncore = TypeVar("_Uncore", UncoreMemBw, UncorePcieBw)

log = logging.getLogger("coda-node")

MAX_EVENTS = 200


@dataclass(slots=True)
class TickReport:
    snapshot: NodeSnapshot
    targets: dict[int, JobTarget]
    results: dict[int, JobResult]
    problems: list[str] = field(default_factory=list)
    cpu_time_s: float = 0.0
    allocated: dict[int, frozenset[int]] = field(default_factory=dict)
    """Each job's Slurm allocation as known before this tick's writes."""
    held: frozenset[int] = frozenset()
    """Jobs left alone this tick: to be repaired from Slurm's allocation, or repaired."""


class Daemon:
    def __init__(
        self,
        cfg: CodaConfig,
        *,
        runner: Runner | None = None,
        nvml: Nvml | None = None,
        node_name: str | None = None,
        cpuset_writer: Callable[[CgroupLayout], CpusetWriter] | None = None,
        quota_writer: Callable[[CgroupLayout], CpuQuotaWriter] | None = None,
        rdt_control: Callable[[SystemRoot, ResctrlInfo], ResctrlControl] | None = None,
        mem_bw: Callable[[], list[object]] | None = None,
        pcie_bw: Callable[[], Sequence[PcieBwSample]] | None = None,
        mbm: Callable[[int], float | None] | None = None,
        store: ProfileStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.root = SystemRoot(cfg.node_root)
        self.locality = GpuLocality(self.root)
        self.node_name = node_name or cfg.node_name or socket.gethostname().split(".")[0]
        env = dict(os.environ)
        if cfg.slurm_conf is not None:
            env["SLURM_CONF"] = str(cfg.slurm_conf)
        self.env = env
        self._real_runner = runner is None
        self.runner = runner or make_runner(env)
        self.nvml = nvml or Nvml()
        self.state_file = StateFile(cfg.node_state_dir, cfg.node_runtime_dir)
        self.limits_file = LimitsFile(cfg.node_state_dir)
        self.state = NodeState()
        self.layout: CgroupLayout = cgroups.discover_layout(self.root, self.node_name)
        self._make_cpuset = cpuset_writer or CpusetWriter
        self._make_quota = quota_writer or CpuQuotaWriter
        self._make_rdt = rdt_control
        self.rdt_info: ResctrlInfo = resctrl_discover(self.root)
        self.slurm = SlurmJobs(self.node_name, self.runner)
        self._clock = clock
        self._mbm = mbm
        self.mem_bw_monitor: JobMonitor | None = None
        """Per-job bandwidth from resctrl MON groups, when nothing else supplies it."""
        self.mem_bw_monitor_off: str | None = None
        self._start_mem_bw_monitor()
        self._uncore_samplers: list[UncoreMemBw | UncorePcieBw] = []
        """Uncore counters this daemon opened itself (not injected ones): closed on stop."""
        gres_conf = cfg.slurm_conf.with_name("gres.conf") if cfg.slurm_conf else None
        self.sampler = Sampler(
            root=self.root,
            node_name=self.node_name,
            layout=self.layout if self.layout.has_slurm else None,
            slurm=self.slurm,
            nvml=self.nvml,
            gres_conf=gres_conf,
            mem_bw=mem_bw if mem_bw is not None else self._uncore_mem_bw(),
            pcie_bw=pcie_bw if pcie_bw is not None else self._uncore_pcie_bw(),
            mbm=self._job_mem_bw,
            clock=clock,
        )
        self.enforcer = self._make_enforcer()
        self._store = store
        self.loop = self._make_loop()
        self._adaptive_jobs: set[int] = set()
        self._adaptive_task_jobs: set[int] = set()
        """Of those, the jobs the loop throttles (a quota or resctrl group: acts on tasks)."""
        self._start_view: dict[str, Any] = {}
        """The last run's view as start() read it, kept until Slurm's tree appears."""
        self.usage = UsageAccumulator(
            flush_every_s=cfg.node_usage_flush_s, min_ticks=cfg.node_usage_min_ticks
        )
        self._usage_undisturbed: set[int] = set()
        """DNN jobs whose last tick showed their own GPU usage (see _collect_usage)."""
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.capabilities: list[dict[str, object]] = []
        self.started_unix_s = time.time()
        self._limits_error: str | None = None
        self._prev_snap: NodeSnapshot | None = None
        """The last tick's snapshot: a job that ended since still has its GPUs there."""
        self.ticks_total = 0
        self.tick_errors_total = 0
        self.events_total: Counter[str] = Counter()
        """Events by action since start (the view keeps only the last MAX_EVENTS)."""
        self.online_cpus = _online_cpus(self.root)
        """The CPUs online (None where the tree does not say): a record naming others is
        not one that can be put back."""
        self.cpus_online = (
            len(self.online_cpus) if self.online_cpus is not None else _cpus_online(self.root)
        )
        self.slurm_cpu_ids = SlurmCpuIds(self.root)
        """Slurm's CPU ids as the kernel numbers the CPUs (for a repair)."""
        self._unverified: set[int] = set()
        """Jobs whose record came from the state file and whose recorded allocation is not
        yet compared with Slurm's."""
        self._repair_waiting: dict[int, str] = {}
        """Jobs to repair that could not be repaired yet -> why (shown in status)."""
        self._failing: dict[int, frozenset[str]] = {}
        """Each job's failed writes of the last tick: a failure is an event (and a log
        line) when it starts, not on every tick it goes on (status shows it meanwhile)."""
        self.metrics_server: MetricsServer | None = None
        self.metrics_state = (
            "off (NodeMetricsPort=0)"
            if not cfg.node_metrics_port
            else "not served (only `coda-node run` serves it)"
        )

    def _make_enforcer(self) -> Enforcer:
        usable = self.layout.has_slurm
        return Enforcer(
            state=self.state,
            save=self._save,
            cpuset=self._make_cpuset(self.layout) if usable else None,
            quota=self._make_quota(self.layout) if usable else None,
            rdt=self._rdt_control() if usable else None,
            root=self.root,
            cgroup_version=self.layout.version,
            mechanisms=self.cfg.node_enforce,
        )

    def _rdt_control(self) -> ResctrlControl | None:
        """A resctrl writer when "rdt" is enforced and resctrl has MB or L3 CAT."""
        if "rdt" not in self.cfg.node_enforce:
            return None
        if self.rdt_info.mb is None and self.cat_unavailable is not None:
            return None
        if self._make_rdt is not None:
            return self._make_rdt(self.root, self.rdt_info)
        return ResctrlControl(self.root, self.rdt_info)

    @property
    def mba_unavailable(self) -> str | None:
        """None when memory-bandwidth limits can be applied, else why not."""
        if "rdt" not in self.cfg.node_enforce:
            return "NodeEnforce does not include rdt"
        if not self.rdt_info.mounted:
            return self.rdt_info.reason or "resctrl not mounted"
        if self.rdt_info.mb is None:
            return self.rdt_info.mb_reason or "no MB resource in resctrl"
        return None

    @property
    def cat_unavailable(self) -> str | None:
        """None when L3 cache-way limits (CAT) can be applied, else why not."""
        if "rdt" not in self.cfg.node_enforce:
            return "NodeEnforce does not include rdt"
        if not self.rdt_info.usable:
            return self.rdt_info.reason or "resctrl not mounted"
        if self.rdt_info.l3 is None:
            return self.rdt_info.l3_reason or "no L3 resource in resctrl"
        if not self.rdt_info.can_allocate:
            return "resctrl offers no CLOSID for a control group"
        return None

    def _make_loop(self) -> AdaptiveLoop:
        per_job_bw = self._mbm is not None
        l3 = self.rdt_info.l3 if self.cat_unavailable is None else None
        return AdaptiveLoop(
            self.cfg,
            self.root,
            node_name=self.node_name,
            mba=self.mba_unavailable is None and per_job_bw,
            l3_ways=l3.cbm_bits if l3 is not None else None,
            l3_min_ways=l3.min_cbm_bits if l3 is not None else 1,
            profiling_off=self._profiling_off(),
            contention_off=self._contention_off(per_job_bw),
            store=self._store,
        )

    def _rediscover(self) -> None:
        """slurmd creates its cgroup tree with the node's first job, so a daemon started
        on an idle node finds none: look again each tick until it is there."""
        layout = cgroups.discover_layout(self.root, self.node_name)
        if not layout.has_slurm:
            return
        log.info("Slurm's cgroup tree appeared (%s)", ", ".join(map(str, layout.slurm_dirs)))
        self.layout = layout
        self.sampler.layout = layout
        self.sampler.reset_accounting()
        self.enforcer = self._make_enforcer()
        self._start_mem_bw_monitor()  # before the loop: it decides whether MBA is usable
        self.loop = self._make_loop()
        # The new loop knows nothing yet: adopt again what the last run left (the view read
        # at start; the ticks since have replaced state.view). Jobs that ended meanwhile are
        # forgotten at the next tick, as after a start.
        self._adopt(self._start_view)
        self._start_view = {}

    def _profiling_off(self) -> str | None:
        if not self.layout.has_slurm:
            return f"no Slurm cgroup tree ({self.layout.reason})"
        if "cpuset" not in self.cfg.node_enforce:
            return "NodeEnforce does not include cpuset"
        return None

    def _contention_off(self, per_job_bw: bool) -> str | None:
        if not self.layout.has_slurm:
            return f"no Slurm cgroup tree ({self.layout.reason})"
        mba = self.mba_unavailable is None and per_job_bw
        cat = self.cat_unavailable is None
        if "quota" not in self.cfg.node_enforce and not mba and not cat:
            return "NodeEnforce includes neither quota nor a usable rdt"
        return None

    def _uncore_mem_bw(self) -> Callable[[], list[object]] | None:
        """Per-socket memory bandwidth from the uncore IMC counters, where there are some."""
        from coda_node.perf import UncoreMemBw, plan_mem_bw

        sampler = self._open_uncore(UncoreMemBw, plan_mem_bw, "memory-bandwidth")
        return (lambda: list(sampler.sample())) if sampler is not None else None

    def _uncore_pcie_bw(self) -> Callable[[], list[PcieBwSample]] | None:
        """Per-socket PCIe traffic from the uncore IIO counters, where there are some (the
        issue's "PCIe/IIO traffic per socket"; GPUs' own PCIe rates come from NVML)."""
        from coda_node.perf import UncorePcieBw, plan_pcie_bw

        sampler = self._open_uncore(UncorePcieBw, plan_pcie_bw, "PCIe-bandwidth")
        return sampler.sample if sampler is not None else None

    def _open_uncore(
        self,
        kind: Callable[..., _Uncore],
        plan_for: Callable[[SystemRoot], UncorePlan],
        what: str,
    ) -> _Uncore | None:
        """A sampler of ``kind`` over the counters ``plan_for`` finds, opened and kept to
        close on stop; None where there are none, or (logged) when the kernel refuses them
        (no CAP_PERFMON, no such PMU): the daemon goes on without."""
        from coda_node.perf import PerfError

        plan = plan_for(self.root)
        if not plan.available:
            return None
        sampler = kind(self.root, plan=plan)
        try:
            sampler.open()
        except PerfError as exc:
            log.warning("uncore %s counters unavailable: %s", what, exc)
            return None
        self._uncore_samplers.append(sampler)
        return sampler

    def close_counters(self) -> None:
        """Close the uncore counters this daemon opened (each is one perf fd per PMU and
        socket CPU); a later tick reports them as unreadable rather than failing."""
        from coda_node.perf import PerfError

        samplers, self._uncore_samplers = self._uncore_samplers, []
        for sampler in samplers:
            try:
                sampler.close()  # tries every fd before it raises the first error
            except PerfError as exc:
                log.warning("closing the %s counters: %s", sampler.plan.what, exc)

    # -- per-job memory bandwidth (resctrl MBM) -----------------------------------
    def _start_mem_bw_monitor(self) -> None:
        """Measure each CPU job's bandwidth with its own resctrl MON group (coda_node.mbm)
        where resctrl counts it, Slurm's cgroups show the jobs and NodeJobMemBw=yes; else
        record why not. Called again when Slurm's cgroup tree appears."""
        if self.mem_bw_monitor is not None:
            return
        info = self.rdt_info
        if self._mbm is not None:
            self.mem_bw_monitor_off = "not needed: per-job bandwidth is supplied by the caller"
        elif not self.cfg.node_job_mem_bw:
            self.mem_bw_monitor_off = "off (NodeJobMemBw=no)"
        elif not info.usable:
            self.mem_bw_monitor_off = info.reason or "resctrl not usable"
        elif not info.mbm:
            self.mem_bw_monitor_off = info.mbm_reason or "no MBM events in resctrl"
        elif not self.layout.has_slurm:
            self.mem_bw_monitor_off = f"no Slurm cgroup tree ({self.layout.reason})"
        else:
            make = self._make_rdt or ResctrlControl
            try:
                self.mem_bw_monitor = JobMonitor(self.root, make(self.root, info))
            except ResctrlError as exc:
                self.mem_bw_monitor_off = str(exc)
                log.warning("per-job memory bandwidth unavailable: %s", exc)
                return
            self.mem_bw_monitor_off = None
            # Counts as per-job bandwidth in _make_loop / _contention_off from now on.
            self._mbm = self.mem_bw_monitor.rate

    def _job_mem_bw(self, job_id: int) -> float | None:
        """The sampler's per-job bandwidth: the injected source or the monitor's rate."""
        return self._mbm(job_id) if self._mbm is not None else None

    def _sync_mem_bw_monitor(self, snap: NodeSnapshot, cg_jobs: dict[int, CgroupJob]) -> None:
        """After the enforcer: one MON group per CPU job, under the control group the
        enforcer put its threads in (state.changes[job].rdt_group, else the root)."""
        monitor = self.mem_bw_monitor
        if monitor is None:
            return
        cpu_jobs = [j for j, v in snap.jobs.items() if v.kind == "cpu" and j in cg_jobs]

        def ctrl_group_of(job_id: int) -> str:
            ch = self.state.changes.get(job_id)
            return (ch.rdt_group or "") if ch is not None else ""

        def tids(job_id: int) -> list[int] | None:
            cg = cg_jobs[job_id]
            pids: tuple[int, ...] | None = cg.pids
            if cg.detail != "tasks":  # listed without its tasks this tick
                # Only the tasks files: the monitor needs no CPUs or mems of the job.
                pids = cgroups.job_tasks(self.layout, cg)
            # The same thread ids the enforcer moves into its MB groups.
            return self.enforcer.thread_ids(pids) if pids is not None else None

        monitor.sync(self._clock(), cpu_jobs, ctrl_group_of, tids)

    def _mem_bw_monitor_view(self) -> dict[str, Any]:
        monitor = self.mem_bw_monitor
        if monitor is None:
            return {"state": self.mem_bw_monitor_off or "off"}
        return {"state": "on", **monitor.status()}

    def _mem_bw_monitor_capability(self) -> list[dict[str, object]]:
        """A capability row for `coda-node status`: how many CPU jobs are measured and
        which are not, and why. No row where resctrl has no MBM (the "memory-bandwidth
        monitoring" row already says why) or the bandwidth comes from elsewhere."""
        monitor = self.mem_bw_monitor
        if monitor is None:
            if not (self.rdt_info.usable and self.rdt_info.mbm) or self._mbm is not None:
                return []
            return [
                {
                    "name": "per-job memory bandwidth",
                    "available": False,
                    "detail": f"resctrl MBM: {self.mem_bw_monitor_off or 'off'}",
                }
            ]
        detail = f"resctrl MBM ({monitor.event}): {len(monitor.monitored())} CPU job(s) measured"
        if monitor.unmonitored:
            detail += "; not measured: " + "; ".join(
                f"job {j}: {why}" for j, why in sorted(monitor.unmonitored.items())
            )
        return [{"name": "per-job memory bandwidth", "available": True, "detail": detail}]

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Load what a previous run changed. Raises StateError for a file we must not
        overwrite (a newer format) or cannot read. A damaged file is kept aside and
        replaced, durably, by one that says every running job is to be repaired from
        Slurm's allocation: nothing the daemon finds in the cgroups is taken for the
        allocation before that is done."""
        for path in self.state_file.remove_stale_temps(_pid_alive):
            log.info("removed %s, left by a writer that was killed", path)
        try:
            self.state = self.state_file.load()
        except StateDamaged as exc:
            aside = self.state_file.keep_aside()
            kept = f"kept as {aside.name}" if aside is not None else "not kept"
            log.error(
                "%s: %s. Every running job will be put back to the CPUs Slurm allocated it",
                exc,
                kept,
            )
            why = f"the state file was damaged ({exc.reason})"
            self.state = NodeState(repair={REPAIR_ALL: why}, view=self.state_file.load_view())
            self.state_file.save(self.state, view=False)
        self._check_records()
        self._unverified = set(self.state.changes)
        self.enforcer = self._make_enforcer()
        self.capabilities = [
            c.to_dict()
            for c in probe_all(
                self.root,
                slurm=self._real_runner,
                env=self.env,
                nvml=self.nvml,
                node_name=self.node_name,
            )
        ]
        if not self.layout.has_slurm:
            log.warning(
                "no Slurm cgroup tree (%s): observing through squeue only, changing nothing",
                self.layout.reason,
            )
        pending = sorted(self.state.changes)
        if pending:
            log.info("state file lists changes to jobs %s; reconciling", pending)
        view = self.state.view
        self._adopt(view)
        # Kept only while Slurm's tree is missing: _rediscover adopts from it again.
        self._start_view = {} if self.layout.has_slurm else view

    def _check_records(self) -> None:
        """Records naming CPUs this node does not have online cannot be put back (every
        write would fail): their jobs are repaired from Slurm's allocation instead."""
        online = self.online_cpus
        if online is None:
            return
        bad = {
            job_id: ch.recorded_cpus() - online
            for job_id, ch in self.state.changes.items()
            if not ch.recorded_cpus() <= online
        }
        for job_id, missing in sorted(bad.items()):
            del self.state.changes[job_id]
            self.state.repair.setdefault(
                job_id,
                f"its record names CPUs {format_cpulist(missing)}, which this node "
                f"does not have online ({format_cpulist(online)})",
            )
            log.error("job=%d %s", job_id, self.state.repair[job_id])
        if bad:
            self.state_file.save(self.state, view=False)

    def _adopt(self, view: dict[str, Any]) -> None:
        """What the last run's view knew of each DNN job, into this run's loop."""
        self._adopt_baselines(view)
        self._adopt_probes(view)

    @staticmethod
    def _since_view_s(view: dict[str, Any]) -> float:
        """Seconds since the last run wrote ``view`` in the state file (0 when unknown)."""
        with contextlib.suppress(TypeError, ValueError):
            sampled = float(view.get("sampled_unix_s") or time.time())
            return max(0.0, time.time() - sampled)
        return 0.0

    def _adopt_baselines(self, view: dict[str, Any]) -> None:
        """What the last run knew of each DNN job (its view in the state file): how long it
        had been watched (so its warm-up is not served again) and its uncontended baseline.
        Without them a restart leaves every job unshielded for NodeProbeWarmupS and then
        until it has been measured again (quiet ticks, or a baseline probe that caps the CPU
        jobs). Jobs that ended meanwhile are forgotten at the first tick."""
        since_s = self._since_view_s(view)
        adopted = []
        for job in view.get("jobs") or []:
            try:
                if job.get("kind") != "dnn":
                    continue
                job_id = int(job["job_id"])
                age_s = (job.get("progress") or {}).get("age_s")
                if age_s is not None:
                    self.loop.adopt_signal(job_id, self._clock() - float(age_s) - since_s)
                contention = job.get("contention") or {}
                baseline, ticks = contention.get("baseline"), contention.get("baseline_ticks")
                if baseline is not None and self.loop.eliminator.adopt_baseline(
                    job_id, float(baseline), int(ticks)
                ):
                    adopted.append(f"{job_id}={float(baseline):.4g}")
            except (AttributeError, KeyError, TypeError, ValueError):
                continue  # an entry this version cannot read: measured again instead
        if adopted:
            log.info("baselines from the last run: %s", ", ".join(adopted))

    def _adopt_probes(self, view: dict[str, Any]) -> None:
        """Each DNN job's online profile as the last run left it (its ``profiling`` entry
        in the view): a job half-way through its probes goes on from there, with the time
        it already spent below its allocation counted against NodeProbeBudgetS, and a job
        done is neither probed nor published again. What the allocator cannot read is
        profiled afresh."""
        since_s = self._since_view_s(view)
        adopted = []
        for job in view.get("jobs") or []:
            if not isinstance(job, dict) or job.get("kind") != "dnn":
                continue
            record = job.get("profiling")
            job_id = job.get("job_id")
            # A daemon that died with a probe applied left the job below its allocation
            # since its last view (a stopping one put it back, and its view says so).
            left_below = False
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                left_below = len(parse_cpulist(job.get("cpus_now") or "")) < len(
                    parse_cpulist(job.get("cpus_allocated") or "")
                )
            if (
                isinstance(record, dict)
                and isinstance(job_id, int)
                and self.loop.adopt_probe(
                    job_id, record, extra_below_s=since_s if left_below else 0.0
                )
            ):
                rec = self.loop.allocator.records[job_id]
                adopted.append(
                    f"{job_id}={rec.state} ({rec.probes} probes, {rec.below_s:.0f} s below)"
                )
        if adopted:
            log.info("online profiles from the last run: %s", ", ".join(adopted))

    def _save(self) -> None:
        """The enforcer's write-ahead: the record of changes, fsynced (the view waits for
        the tick's end)."""
        self.state_file.save(self.state, view=False)

    def _cgroup_jobs(self) -> dict[int, CgroupJob]:
        return cgroups.list_jobs(self.layout) if self.layout.has_slurm else {}

    # -- repair from Slurm's allocation ----------------------------------------------
    def _repair(self, cg_jobs: dict[int, CgroupJob]) -> dict[int, JobResult]:
        """Put back, to the CPUs Slurm reports, every running job whose record is missing
        or cannot be trusted (``state.repair``), and compare each record read from the
        state file with Slurm's allocation once. The pending repairs are on disk before
        anything is written; a job is taken off them once repaired or gone. A job Slurm
        has not answered for is left as it is, and nothing else is done to it, until it
        does (``_repair_waiting`` says why)."""
        state = self.state
        if not self.layout.has_slurm:
            return {}
        if REPAIR_ALL in state.repair:
            why = state.repair.pop(REPAIR_ALL)
            for job_id in cg_jobs:
                state.repair.setdefault(job_id, why)
            state.changes = {j: ch for j, ch in state.changes.items() if j not in state.repair}
            self.state_file.save(state, view=False)
        self._verify_records(cg_jobs)
        gone = [j for j in state.repair if j not in cg_jobs]
        for job_id in gone:
            # Its cgroups went with it; coda's own cpu cgroup is removed by the enforcer.
            del state.repair[job_id]
            state.changes.pop(job_id, None)
        if gone:
            self.state_file.save(state, view=False)
        self._repair_waiting = {}
        results: dict[int, JobResult] = {}
        pending = sorted(state.repair)
        if not pending:
            return results
        try:
            allocated = self._slurm_allocation(pending)
        except SlurmQueryError as exc:
            self._repair_waiting = {j: f"waiting for Slurm ({exc})" for j in pending}
            return results
        for job_id in pending:
            why = state.repair[job_id]
            if job_id not in allocated:
                self._repair_waiting[job_id] = "waiting: Slurm does not list it on this node"
                continue
            cpus = allocated[job_id]
            if cpus is None:
                self._repair_waiting[job_id] = (
                    "waiting: the CPUs Slurm names for it are not this machine's (does "
                    "slurm.conf describe this node's sockets, cores and threads?)"
                )
                continue
            cg = cgroups.read_job(self.layout, cg_jobs[job_id], detail="tasks")
            if cg is None:
                continue  # ended meanwhile: dropped at the next tick
            self._event(
                job_id,
                "state-repair",
                f"put back to Slurm's allocation {format_cpulist(cpus)}: {why}",
            )
            result = self.enforcer.repair(cg, cpus)
            results[job_id] = result
            if result.failed:
                self._repair_waiting[job_id] = "; ".join(result.failed)
                continue
            del state.repair[job_id]
            self.state_file.save(state, view=False)
            self.sampler.forget(cg)
        return results

    def _slurm_allocation(self, job_ids: list[int]) -> dict[int, frozenset[int] | None]:
        """Job -> the CPUs Slurm allocated it here, as the kernel numbers them (None where
        Slurm names CPUs this machine does not have); a job Slurm does not list here is
        left out. Raises SlurmQueryError when Slurm does not answer."""
        return {
            job_id: self.slurm_cpu_ids.to_kernel(cpus)
            for job_id, cpus in self.slurm.allocated_cpus(job_ids).items()
        }

    def _verify_records(self, cg_jobs: dict[int, CgroupJob]) -> None:
        """Compare the allocation each record read from the state file names with the one
        Slurm reports; a record that disagrees is dropped and its job repaired. Records
        are trusted meanwhile: Slurm not answering is retried at the next tick."""
        ids = sorted(j for j in self._unverified if j in cg_jobs and j in self.state.changes)
        self._unverified &= set(cg_jobs) & set(self.state.changes)
        if not ids:
            return
        try:
            allocated = self._slurm_allocation(ids)
        except SlurmQueryError:
            return
        changed = False
        self._unverified -= set(ids)
        for job_id in ids:
            cpus = allocated.get(job_id)
            if cpus is None:
                # Not running here as far as Slurm knows (ending), or named in CPUs this
                # machine does not have: nothing to compare the record with.
                continue
            recorded = self._allocated(job_id, cg_jobs[job_id])
            if recorded != cpus:
                del self.state.changes[job_id]
                self.state.repair[job_id] = (
                    f"its record says it was allocated CPUs {format_cpulist(recorded)}, "
                    f"Slurm says {format_cpulist(cpus)}"
                )
                log.error("job=%d %s", job_id, self.state.repair[job_id])
                changed = True
        if changed:
            self.state_file.save(self.state, view=False)

    def tick(self) -> TickReport:
        cpu0 = time.process_time()
        self.ticks_total += 1
        if not self.layout.has_slurm:
            self._rediscover()
        limits = {}
        try:
            limits = self.limits_file.load()
            self._limits_error = None
        except StateError as exc:
            if str(exc) != self._limits_error:
                log.error("%s", exc)
            self._limits_error = str(exc)
        # Steps are read only for the jobs this tick may change or put back, and their tasks
        # only where that change acts on tasks (_detail_needed); a job that needs more than
        # was read is read again after the plan.
        self.sampler.detail_jobs = set(limits) | set(self.state.changes) | self._adaptive_jobs
        self.sampler.task_jobs = self._adaptive_task_jobs | {
            j
            for j, d in [*limits.items(), *self.state.changes.items()]
            if _detail_needed(d) == "tasks"
        }
        if self.mem_bw_monitor is not None:
            # One reading per group per tick; the sampler then asks monitor.rate per job.
            self.mem_bw_monitor.sample(self._clock())
        snap = self.sampler.sample()
        repaired = self._repair({j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None})
        # A job still to be repaired, or repaired in this tick (the sample shows it as it
        # was before), is left alone until the next tick's sample shows it as Slurm set it.
        hold = set(self.state.repair) | set(repaired)
        facts = {}
        bus_ids = {g.index: g.pci_bus_id for g in snap.gpus}

        def near_cpus(view: JobView) -> frozenset[int]:
            """The CPUs local to the job's GPUs; asked only where CPUs are to be chosen."""
            gpus = tuple(bus_ids.get(r.nvml_index) for r in view.gpus if r.nvml_index is not None)
            return self.locality.near_cpus(gpus)

        for job_id, view in snap.jobs.items():
            if view.cgroup is None or job_id in hold:
                continue
            facts[job_id] = JobFacts(
                job_id=job_id,
                allocated_cpus=self._allocated(job_id, view.cgroup),
                is_dnn=view.kind == "dnn",
                near_cpus=near_cpus(view) if job_id in limits else frozenset(),
            )
        targets, problems = plan(
            facts,
            {j: lim for j, lim in limits.items() if j not in hold},
            mba=self.mba_unavailable,
        )
        loop = self.loop.step(
            snap,
            lambda j: facts[j].allocated_cpus if j in facts else None,
            blocked={j: "an admin limit is set" for j in limits},
        )
        for job_id, cores in loop.cores.items():
            if job_id in facts and job_id not in targets:
                near = near_cpus(snap.jobs[job_id])
                cpus = choose_cpus(facts[job_id].allocated_cpus, cores, near)
                targets[job_id] = JobTarget(cpus=cpus, reason=f"probe: {cores} cores")
        for job_id, th in loop.throttles.items():
            if job_id in facts and job_id not in targets:
                quota = th.quota_cores
                if quota is not None and quota >= len(facts[job_id].allocated_cpus):
                    quota = None
                targets[job_id] = JobTarget(
                    quota_cores=quota,
                    mem_bw_pct=th.mem_bw_pct,
                    reason=th.reason,
                    l3_ways=th.l3_ways,
                )
        self._adaptive_jobs = set(loop.cores) | set(loop.throttles)
        self._adaptive_task_jobs = set(loop.throttles)
        cg_jobs = {
            j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None and j not in hold
        }
        for job_id in set(targets) | set(self.state.changes):
            cg = cg_jobs.get(job_id)
            if cg is None or not self.layout.has_slurm:
                continue
            need = max(
                _detail_needed(targets.get(job_id)),
                _detail_needed(self.state.changes.get(job_id)),
                key=DETAIL_RANK.__getitem__,
            )
            if DETAIL_RANK[cg.detail] < DETAIL_RANK[need]:
                # A job this tick's policy changes for the first time (or in a new way):
                # read what the change needs now.
                full = cgroups.read_job(self.layout, cg, detail=need)
                if full is None:
                    del cg_jobs[job_id]
                else:
                    cg_jobs[job_id] = full
        results = self.enforcer.reconcile(cg_jobs, targets)
        for job_id, res in repaired.items():
            if job_id in results:  # repaired, then changed again within this tick
                results[job_id].applied[:0] = res.applied
                results[job_id].failed[:0] = res.failed
            else:
                results[job_id] = res
        for job_id, res in results.items():
            if res.applied and job_id in cg_jobs:
                # What the sampler kept of the job (its steps' CPUs) is what we just changed.
                self.sampler.forget(cg_jobs[job_id])
        # After reconcile, outside its resctrl lock: MON groups follow the threads' control
        # group as the enforcer just left it.
        self._sync_mem_bw_monitor(snap, cg_jobs)
        # The loop's decisions first, then the writes they (and admin limits) caused.
        for ev in loop.events:
            self._event(ev.job_id, ev.action, ev.rule, dict(ev.reading))
        for job_id, res in results.items():
            if job_id in repaired and job_id not in targets:
                reason = "repair from Slurm's allocation"
            elif job_id in targets:
                reason = targets[job_id].reason
            else:
                reason = "no limit, probe or throttle applies any more"
            for what in res.applied:
                self._event(job_id, what, reason)
            failing = self._failing.get(job_id, frozenset())
            for what in res.failed:
                if what not in failing:
                    self._event(job_id, f"failed: {what}", reason)
        self._failing = {j: frozenset(r.failed) for j, r in results.items() if r.failed}
        for pub in loop.publish:
            seen = snap if pub.job_id in snap.jobs or self._prev_snap is None else self._prev_snap
            gpu_model = self._gpu_model(seen, pub.job_id)
            line = self.loop.publish(pub, gpu_model)
            self._event(pub.job_id, "profile-publish", line)
        self._collect_usage(snap, facts, targets, loop)
        for flush in self.usage.step(snap.monotonic_s, time.time(), set(snap.jobs)):
            self._publish_usage(flush)
        report = TickReport(
            snapshot=snap,
            targets=targets,
            results=results,
            problems=[f"job {p.job_id}: {p.message}" for p in problems],
            allocated={j: f.allocated_cpus for j, f in facts.items()},
            held=frozenset(hold),
        )
        self.state.view = self._view(report, limits)
        self._prev_snap = snap
        report.cpu_time_s = time.process_time() - cpu0
        self.state.view["tick_cpu_s"] = report.cpu_time_s
        # Changes were saved durably before each write; the view needs no fsync, and the
        # record of changes is written only if something (a prune) changed it since.
        self.state_file.save(self.state, durable=False)
        return report

    def _collect_usage(
        self,
        snap: NodeSnapshot,
        facts: dict[int, JobFacts],
        targets: dict[int, JobTarget],
        loop: LoopOutput,
    ) -> None:
        """Count this tick into each DNN job's usage record where it shows the job's own
        GPU usage (coda_node.usage): a signature, past warm-up, its whole allocation (no
        probe, limit or change of ours in force) and no CPU job on its sockets throttled,
        in this tick and the one before. NVML's utilisation covers the sample period before
        the reading (nvml.h, nvmlDeviceGetUtilizationRates), so the first tick after a
        probe or a throttle still shows the job as it was then."""
        gpus = {g.index: g for g in snap.gpus}
        undisturbed: set[int] = set()
        throttled_sockets: set[int] = set()
        for job_id in loop.throttles:
            if job_id in facts:
                throttled_sockets |= self.loop.sockets_of(facts[job_id].allocated_cpus)
        trigger = self.loop.eliminator.params.trigger_slowdown
        for job_id, view in snap.jobs.items():
            record = view.slurm.admin_record if view.slurm and view.kind == "dnn" else None
            signature = record.get("sig") if record else None
            prog = self.loop.progress.get(job_id)
            if not signature or prog is None or prog.phase in ("warmup", "no-signal"):
                continue
            rec = self.loop.allocator.records.get(job_id)
            if (
                job_id in loop.cores
                or job_id in targets
                or job_id in self.state.changes
                or (rec is not None and rec.state == "probing")
            ):
                continue
            if job_id in facts and throttled_sockets & self.loop.sockets_of(
                facts[job_id].allocated_cpus
            ):
                continue
            contention = self.loop.eliminator.dnn_status(job_id)
            slowdown = contention.get("slowdown") if contention else None
            if isinstance(slowdown, float) and slowdown > trigger:
                continue
            undisturbed.add(job_id)
            tick = _usage_tick(view, gpus, prog)
            if tick is not None and job_id in self._usage_undisturbed:
                model = self._gpu_model(snap, job_id)
                self.usage.add(job_id, signature, model, snap.monotonic_s, tick)
        self._usage_undisturbed = undisturbed

    def _publish_usage(self, flush: UsageFlush) -> None:
        """Merge one usage record into its profile; one event line, on failure too.
        Never raises: the tick goes on whatever the store does."""
        store = self.loop.store
        r = flush.record
        try:
            # No store directory yet: no profile either (merge_usage would fail on its lock).
            prof = store.merge_usage(flush.signature, r) if store.root.is_dir() else None
        except (StoreError, OSError, ValueError) as exc:
            self._event(
                flush.job_id, "usage-publish", f"cannot record GPU usage in {store.root}: {exc}"
            )
            return
        if prof is None:
            # No profile yet (the hook never saw the workload and no probe published one):
            # nothing to attach the record to; the next run of the workload tries again.
            log.debug("job=%d no profile %s: GPU usage not recorded", flush.job_id, flush.signature)
            return
        self._event(
            flush.job_id,
            "usage-publish",
            f"profile {flush.signature}: GPU {r.gpu_util:.0%} busy, memory {r.gpu_mem_bw_util:.0%} "
            f"busy over {r.ticks} ticks on {r.gpu_model or 'an unknown GPU model'} ({flush.why})",
        )

    def _gpu_model(self, snap: NodeSnapshot, job_id: int) -> str | None:
        view = snap.jobs.get(job_id)
        names = {g.index: g.name for g in snap.gpus}
        models = {names.get(r.nvml_index) for r in view.gpus} if view else set()
        models.discard(None)
        return models.pop() if len(models) == 1 else None

    def _allocated(self, job_id: int, cg: CgroupJob) -> frozenset[int]:
        """Slurm's allocation: what the cgroup held before our first change."""
        ch = self.state.changes.get(job_id)
        if ch is not None and ch.allocated_cpus is not None:
            return frozenset(ch.allocated_cpus)
        if ch is not None and ch.cpuset_original is not None:  # a state file without it
            recorded = cgroups.parse_cpulist(ch.cpuset_original["cpus"].get(".", ""))
            return recorded or cg.cpus
        return cg.cpus

    def restore(self) -> dict[int, JobResult]:
        """Put every job back as Slurm set it: from its record, or, where the record is
        missing or cannot be trusted, to the allocation Slurm reports (a job Slurm does
        not answer for is left as it is and reported as failed)."""
        jobs = self._cgroup_jobs()
        repaired = self._repair(jobs)
        results = self.enforcer.restore_all(
            {j: cg for j, cg in jobs.items() if j not in self.state.repair}
        )
        for job_id, res in repaired.items():
            results.setdefault(job_id, JobResult()).applied[:0] = res.applied
            results[job_id].failed[:0] = res.failed
        for job_id, why in self._repair_waiting.items():
            if job_id not in repaired:
                results.setdefault(job_id, JobResult()).failed.append(f"repair: {why}")
        if self.mem_bw_monitor is not None:
            # Every coda_j* MON group goes too (also those a killed daemon left): each
            # holds one of the node's few RMIDs.
            self.mem_bw_monitor.close()
        elif self.rdt_info.usable and self.rdt_info.mbm:
            # No monitor now (NodeJobMemBw=no), but a previous run may have left groups.
            try:
                remove_job_groups((self._make_rdt or ResctrlControl)(self.root, self.rdt_info))
            except (ResctrlError, OSError) as exc:
                log.error("cannot clean up resctrl monitoring groups: %s", exc)
        for job_id, res in results.items():
            for what in res.applied:
                self._event(job_id, what, "restore")
            for what in res.failed:
                self._event(job_id, f"failed: {what}", "restore")
        try:
            snap = self.sampler.sample()
            report = TickReport(snapshot=snap, targets={}, results=results)
            self.state.view = self._view(report, {})
        except Exception:  # the jobs are restored; only the view is stale
            log.exception("cannot refresh the status view after restoring")
        self.state.view.setdefault("daemon", {})["running"] = False
        self.state_file.save(self.state)
        return results

    def run(self, stop: threading.Event) -> None:
        """Tick every NodeIntervalS until ``stop`` is set, then restore every job."""
        interval_s = self.cfg.node_interval_s
        log.info(
            "coda-node %s on %s: every %gs, enforcing %s",
            __version__,
            self.node_name,
            interval_s,
            ",".join(self.cfg.node_enforce) or "nothing (observe only)",
        )
        self.serve_metrics()
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    report = self.tick()
                    for p in report.problems:
                        log.warning("%s", p)
                except StateError as exc:
                    self.tick_errors_total += 1
                    log.error("%s", exc)
                except Exception:
                    self.tick_errors_total += 1
                    log.exception("tick failed; retrying next interval")
                stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
            for flush in self.usage.drain(time.time()):
                self._publish_usage(flush)
            self.restore()
            self.nvml.shutdown()
        finally:
            self.close_counters()
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None

    def serve_metrics(self) -> tuple[str, int] | None:
        """Start the Prometheus endpoint when NodeMetricsPort is set; the address it
        listens on, or None. A port that cannot be bound is logged and shown in status;
        the daemon goes on without metrics (they observe, the daemon enforces)."""
        port = self.cfg.node_metrics_port
        if not port or self.metrics_server is not None:
            return self.metrics_server.address if self.metrics_server else None
        from coda_node.metrics import start_metrics_server

        addr = self.cfg.node_metrics_address
        try:
            self.metrics_server = start_metrics_server(
                self.metrics_view, port, addr, interval_s=self.cfg.node_interval_s
            )
        except OSError as exc:
            self.metrics_state = f"failed: cannot listen on {addr}:{port} ({exc.strerror or exc})"
            log.error("metrics: %s", self.metrics_state)
            return None
        host, bound = self.metrics_server.address
        self.metrics_state = f"http://{host}:{bound}/metrics"
        log.info("metrics: %s", self.metrics_state)
        return self.metrics_server.address

    def counters(self) -> dict[str, Any]:
        return {
            "ticks_total": self.ticks_total,
            "tick_errors_total": self.tick_errors_total,
            "events_total": dict(sorted(self.events_total.items())),
        }

    def metrics_view(self) -> dict[str, Any]:
        """The last tick's view with the counters as of now (for a scrape between ticks)."""
        view = self.state.view
        daemon = dict(view.get("daemon") or {})
        daemon["counters"] = self.counters()
        return {**view, "daemon": daemon}

    # -- the view for `coda-node status` -----------------------------------------------
    def _event(
        self, job_id: int, what: str, reason: str, reading: dict[str, Any] | None = None
    ) -> None:
        """Keep the decision for `coda-node status` and log it once, job id first."""
        action = event_action(what)
        event: dict[str, Any] = {
            "unix_s": round(time.time(), 3),
            "tick": self.ticks_total,
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

    def _view(self, report: TickReport, limits: dict) -> dict[str, Any]:
        snap = report.snapshot
        gpu_by_nvml = {g.index: g for g in snap.gpus}
        jobs = []
        for job_id, v in sorted(snap.jobs.items()):
            ch = self.state.changes.get(job_id)
            target = report.targets.get(job_id)
            res = report.results.get(job_id)
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
            record = dict(v.slurm.admin_record) if v.slurm and v.slurm.admin_record else None
            allocated = report.allocated.get(job_id)
            if job_id in self.state.repair or job_id in report.held:
                # Its cgroup is not (yet) the allocation: show Slurm's.
                allocated = self.slurm_cpu_ids.to_kernel(v.slurm.cpu_ids) if v.slurm else None
            elif allocated is None and v.cgroup is not None:
                allocated = self._allocated(job_id, v.cgroup)
            # What is in force after this tick's writes, not what the sample saw before them.
            cpus_now = v.cpus_now
            if ch is not None and ch.cpuset_applied is not None:
                cpus_now = frozenset(ch.cpuset_applied)
            elif res and allocated and any(a.startswith("cpuset restored") for a in res.applied):
                cpus_now = allocated
            jobs.append(
                {
                    "job_id": job_id,
                    "user": v.slurm.user if v.slurm else None,
                    "name": v.slurm.name if v.slurm else None,
                    "kind": v.kind,
                    "gpus": gpus,
                    "cpus_slurm": _cpus_text(v.slurm.cpu_ids) if v.slurm else None,
                    "cpus_allocated": _cpus_text(allocated) if allocated is not None else None,
                    "cpus_now": _cpus_text(cpus_now),
                    "cpu_usage_ns": v.cpu_usage_ns,
                    "cpu_rate_cores": v.cpu_rate_cores,
                    "mem_bw_bytes_per_s": v.mem_bw_bytes_per_s,
                    "quota_cores": ch.quota_applied if ch and ch.quota_active else None,
                    "limit": limits[job_id].to_dict() if job_id in limits else None,
                    "target_reason": target.reason if target else None,
                    "hook_record": record,
                    "last_failed": res.failed if res else [],
                    **self._policy_view(job_id),
                }
            )
        return {
            "daemon": {
                "running": True,
                "pid": os.getpid(),
                "version": __version__,
                "node_name": self.node_name,
                "started_unix_s": self.started_unix_s,
                "interval_s": self.cfg.node_interval_s,
                "enforce": list(self.cfg.node_enforce),
                "profiling": self.loop.profiling_off or "on",
                "contention": self.loop.contention_off
                or ("on" if self.cfg.node_contention else "off (NodeContention=no)"),
                "metrics": self.metrics_state,
                "counters": self.counters(),
            },
            "node": {
                "cgroup_version": self.layout.version,
                "slurm_cgroups": [str(p) for p in self.layout.slurm_dirs],
                "slurm_cgroups_reason": self.layout.reason,
                "cpus_online": self.cpus_online,
                "capabilities": [*self.capabilities, *self._mem_bw_monitor_capability()],
                "mem_bw_monitor": self._mem_bw_monitor_view(),
                "nvml": _asdict(self.nvml.status()),
                "gpus": [_asdict(g) for g in snap.gpus],
                "mem_bw": [_asdict(m) for m in snap.mem_bw],
                "pcie_bw": [_asdict(p) for p in snap.pcie_bw],
                "errors": list(snap.errors) + report.problems + self._repair_problems(),
            },
            "jobs": jobs,
            "events": list(self.events),
            "sampled_unix_s": snap.unix_s,
        }

    def _repair_problems(self) -> list[str]:
        """One line per job still to be put back to Slurm's allocation, and why not yet."""
        return [
            f"job {job_id}: to be put back to Slurm's allocation ({why}); "
            f"{self._repair_waiting.get(job_id, 'at the next tick')}"
            for job_id, why in sorted(self.state.repair.items())
        ]

    def _policy_view(self, job_id: int) -> dict[str, Any]:
        """What the adaptive loop knows of a job: progress, profiling, contention."""
        prog = self.loop.progress.get(job_id)
        rec = self.loop.allocator.records.get(job_id)
        contention = self.loop.eliminator.dnn_status(job_id) or self.loop.eliminator.cpu_status(
            job_id
        )
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
            "profile_state": self.loop.profile_state(job_id),
            "contention": contention,
            "pcie_bytes_per_s": self.loop.pcie.get(job_id),
        }


def _usage_tick(view: JobView, gpus: dict[int, GpuSample], prog: Progress) -> UsageTick | None:
    """The job's GPUs this tick as one usage tick; None when NVML gave no utilisation."""
    mine = [
        gpus[r.nvml_index] for r in view.gpus if r.nvml_index is not None and r.nvml_index in gpus
    ]
    util = [g.util_pct for g in mine if g.util_pct is not None]
    mem = [g.mem_util_pct for g in mine if g.mem_util_pct is not None]
    if not util or not mem:
        return None
    pcie = [
        (g.pcie_rx_bytes_per_s or 0.0) + (g.pcie_tx_bytes_per_s or 0.0)
        for g in mine
        if g.pcie_rx_bytes_per_s is not None or g.pcie_tx_bytes_per_s is not None
    ]
    # The progress file counts the whole job's iterations: per GPU only where all its GPUs
    # are on this node.
    single_node = view.slurm is not None and view.slurm.num_nodes <= 1
    rate = prog.rate if prog.source == "iterations" and single_node and view.gpus else None
    return UsageTick(
        gpu_util=sum(util) / len(util) / 100.0,
        gpu_mem_bw_util=sum(mem) / len(mem) / 100.0,
        pcie_bytes_per_s_per_gpu=sum(pcie) / len(pcie) if pcie else None,
        iter_per_s_per_gpu=rate / len(view.gpus) if rate is not None else None,
    )


def _detail_needed(what: JobTarget | Limit | JobChanges | None) -> Detail:
    """How much of a job's cgroup tree the enforcer needs this tick to apply (or undo)
    ``what``: a job's cpuset is checked against its steps' CPUs, and new steps are found
    among its steps; a CPU quota (v1: coda's own cpu cgroup, which the job's threads are
    moved into) and a resctrl group (threads are moved one by one) act on its tasks."""
    if what is None:
        return "cpus"
    if isinstance(what, JobChanges):
        if what.quota_active or what.rdt_group is not None or what.rdt_mon_group is not None:
            return "tasks"
        return "steps" if what.cpuset_original is not None else "cpus"
    if what.quota_cores is not None or what.mem_bw_pct is not None:
        return "tasks"
    if isinstance(what, Limit):
        return "steps" if what.cores is not None or what.cpus is not None else "cpus"
    if what.l3_ways is not None:
        return "tasks"
    return "steps" if what.cpus is not None else "cpus"


def _asdict(obj: Any) -> dict[str, Any]:
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
        return _asdict(value)
    return value


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@functools.lru_cache(maxsize=1024)
def _cpus_text(cpus: frozenset[int]) -> str:
    """format_cpulist, cached: the view shows three CPU lists per job every tick, and they
    are the same few sets tick after tick."""
    return format_cpulist(cpus)


def _online_cpus(root: SystemRoot) -> frozenset[int] | None:
    """The CPUs online under NodeRoot (Documentation/ABI/testing/sysfs-devices-system-cpu);
    None for a tree without the file."""
    try:
        return parse_cpulist(root.path("/sys/devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cpus_online(root: SystemRoot) -> int | None:
    """CPUs online under NodeRoot (Documentation/ABI/testing/sysfs-devices-system-cpu);
    the host's count only for the real root, None for a tree without the file."""
    try:
        return len(parse_cpulist(root.path("/sys/devices/system/cpu/online").read_text()))
    except (OSError, ValueError):
        return os.cpu_count() if root.root.resolve() == Path("/") else None


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT end the loop; the loop then restores every job."""

    def handler(signum: int, _frame: object) -> None:
        log.info("signal %d: restoring every job and stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def default_state_dir_ok(path: Path) -> str | None:
    """None when ``path`` can hold the state file, else why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {path} ({exc.strerror})"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable (coda-node runs as root)"
    return None
