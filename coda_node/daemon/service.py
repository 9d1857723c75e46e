"""``coda-node run``: the loop on each GPU node. Sample, plan, enforce; record everything.

Each tick reads the node (:mod:`coda_node.sampling.snapshot`), asks the pure policy what every
job should look like (:mod:`coda_node.policy.targets`, through :mod:`coda_node.daemon.tick`), and
writes only the differences (:mod:`coda_node.enforce.enforcer`). The state file records, before
any write, how Slurm had set each job, so a restart puts back whatever the plan no longer wants
(:mod:`coda_node.daemon.recovery`); SIGTERM (and ``coda-node restore``) puts back everything. The
systemd unit also runs ``coda-node restore`` after the daemon stops for any reason,
SIGKILL included. The parts are built from coda.conf by :mod:`coda_node.daemon.wiring`; the view
``coda-node status`` reads is put together by :mod:`coda_node.daemon.view`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coda_common.config.codaconf import CodaConfig
from coda_common.store.profiles import ProfileStore
from coda_node import __version__
from coda_node.daemon.adaptive import AdaptiveLoop
from coda_node.daemon.endpoint import MetricsEndpoint
from coda_node.daemon.limits import AdminLimits
from coda_node.daemon.membw import MemBwMonitoring
from coda_node.daemon.recovery import Recovery, RepairPlan, adopt, allocated_cpus
from coda_node.daemon.summaries import SummaryRecorder
from coda_node.daemon.tick import (
    Decision,
    TickReport,
    cgroups_to_enforce,
    decide,
    gpu_model,
    merge_repaired,
    near_cpus_of,
    sample_detail,
    write_reason,
)
from coda_node.daemon.tickview import tick_view
from coda_node.daemon.usage import UsageRecorder
from coda_node.daemon.view import (
    MAX_EVENTS,
    EventLog,
)
from coda_node.daemon.wiring import (
    UncoreCounters,
    cat_unavailable,
    make_enforcer,
    make_loop,
    make_sampler,
    mba_unavailable,
    rdt_control,
)
from coda_node.enforce.enforcer import Enforcer, JobResult
from coda_node.enforce.mechanisms import probe
from coda_node.enforce.mongroups import JobMonitor
from coda_node.enforce.state import Limit, LimitsFile, NodeState, StateError, StateFile
from coda_node.sampling.snapshot import NodeSnapshot
from coda_node.system import cgroups
from coda_node.system.cgroups import CgroupJob, CgroupLayout, CpuQuotaWriter, CpusetWriter
from coda_node.system.cpu_ids import SlurmCpuIds
from coda_node.system.cpulist import parse_cpulist
from coda_node.system.nvml import Nvml
from coda_node.system.paths import SystemRoot
from coda_node.system.resctrl import ResctrlControl, ResctrlInfo
from coda_node.system.resctrl import discover as resctrl_discover
from coda_node.system.slurmjobs import Runner, SlurmJobs, make_runner
from coda_node.system.topology import GpuLocality

if TYPE_CHECKING:
    from coda_node.status.metrics import MetricsServer
    from coda_node.system.perf import PcieBwSample

log = logging.getLogger("coda-node")

__all__ = ["MAX_EVENTS", "Daemon", "TickReport", "default_state_dir_ok", "install_signal_handlers"]


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
        self.env = _slurm_env(cfg)
        self._real_runner = runner is None
        self.runner = runner or make_runner(self.env)
        self.nvml = nvml or Nvml()
        self.state_file = StateFile(cfg.node_state_dir, cfg.node_runtime_dir)
        self.limits_file = LimitsFile(cfg.node_state_dir)
        self.admin_limits = AdminLimits()
        self.state = NodeState()
        self.layout: CgroupLayout = cgroups.discover_layout(self.root, self.node_name)
        self._make_cpuset = cpuset_writer or CpusetWriter
        self._make_quota = quota_writer or CpuQuotaWriter
        self._make_rdt = rdt_control
        self.rdt_info: ResctrlInfo = resctrl_discover(self.root)
        self.slurm = SlurmJobs(self.node_name, self.runner)
        self._clock = clock
        self.mem_bw = MemBwMonitoring(
            cfg, self.root, self.rdt_info, make_rdt=rdt_control, supplied=mbm
        )
        self.mem_bw.start(self.layout)
        self.uncore = UncoreCounters(self.root)
        self.sampler = make_sampler(
            cfg,
            self.root,
            self.node_name,
            self.layout,
            self.slurm,
            self.nvml,
            mem_bw=mem_bw if mem_bw is not None else self.uncore.mem_bw(),
            pcie_bw=pcie_bw if pcie_bw is not None else self.uncore.pcie_bw(),
            mbm=self.mem_bw.job_rate,
            clock=clock,
        )
        self.enforcer = self._make_enforcer()
        self._store = store
        self.loop = self._make_loop()
        self._init_records()
        self.online_cpus, self.cpus_online = _cpu_counts(self.root)
        self.slurm_cpu_ids = SlurmCpuIds(self.root)  # as the kernel numbers them, for a repair
        self.recovery = Recovery(self.state_file, self.slurm, self.slurm_cpu_ids, self.online_cpus)
        self._init_tick_memory()

    def _init_records(self) -> None:
        """What the daemon records and shows: events, usage, counters, the endpoint."""
        self.usage_records = UsageRecorder(self.cfg, self.node_name, self._event)
        self.usage = self.usage_records.usage
        self.job_summaries = SummaryRecorder(self.cfg, self.node_name, self._event)
        self.event_log = EventLog()
        self.events = self.event_log.events
        self.events_total = self.event_log.events_total
        """Events by action since start (the view keeps only the last MAX_EVENTS)."""
        self.capabilities: list[dict[str, object]] = []
        self.started_unix_s = time.time()
        self.ticks_total = 0
        self.tick_errors_total = 0
        self.metrics = MetricsEndpoint(self.cfg, self.metrics_view)

    def _init_tick_memory(self) -> None:
        """What a tick keeps for the next."""
        self._start_view: dict[str, Any] = {}
        """The last run's view as start() read it, kept until Slurm's tree appears."""
        self._adaptive_jobs: set[int] = set()
        """Jobs the adaptive loop probes or throttles: their steps are read."""
        self._adaptive_task_jobs: set[int] = set()
        """Of those, the jobs the loop throttles (a quota or resctrl group: acts on tasks)."""
        self._prev_snap: NodeSnapshot | None = None
        """The last tick's snapshot: a job that ended since still has its GPUs there."""

    # -- wiring ---------------------------------------------------------------------------
    def _make_enforcer(self) -> Enforcer:
        return make_enforcer(
            self.cfg,
            self.root,
            self.layout,
            self.state,
            self._save,
            make_cpuset=self._make_cpuset,
            make_quota=self._make_quota,
            rdt=lambda: rdt_control(self.cfg, self.root, self.rdt_info, self._make_rdt),
        )

    @property
    def mba_unavailable(self) -> str | None:
        """None when memory-bandwidth limits can be applied, else why not."""
        return mba_unavailable(self.cfg, self.rdt_info)

    @property
    def cat_unavailable(self) -> str | None:
        """None when L3 cache-way limits (CAT) can be applied, else why not."""
        return cat_unavailable(self.cfg, self.rdt_info)

    def _make_loop(self) -> AdaptiveLoop:
        return make_loop(
            self.cfg,
            self.root,
            node_name=self.node_name,
            layout=self.layout,
            info=self.rdt_info,
            per_job_bw=self.mem_bw.supplied,
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
        self.mem_bw.start(layout)  # before the loop: it decides whether MBA is usable
        self.loop = self._make_loop()
        # The new loop knows nothing yet: adopt again what the last run left (the view read
        # at start; the ticks since have replaced state.view). Jobs that ended meanwhile are
        # forgotten at the next tick, as after a start.
        adopt(self.loop, self._start_view, self._clock)
        self._start_view = {}

    def close_counters(self) -> None:
        """Close the uncore counters this daemon opened (each is one perf fd per PMU and
        socket CPU); a later tick reports them as unreadable rather than failing."""
        self.uncore.close()

    @property
    def mem_bw_monitor(self) -> JobMonitor | None:
        """Per-job bandwidth from resctrl MON groups, when nothing else supplies it."""
        return self.mem_bw.monitor

    # -- lifecycle ----------------------------------------------------------------
    def start(self, *, put_back: bool = False) -> None:
        """Load what a previous run changed. Raises StateError for a file we cannot read,
        and StateNewer for one we must not overwrite (a newer format) unless ``put_back``
        (then every job is to be repaired from Slurm's allocation by :meth:`restore`; see
        Recovery.load). A damaged file is kept aside and replaced, durably, by one that says
        every running job is to be repaired from Slurm's allocation: nothing the daemon
        finds in the cgroups is taken for the allocation before that is done."""
        self.state = self.recovery.load(put_back=put_back)
        self.enforcer = self._make_enforcer()
        self.capabilities = [
            c.to_dict()
            for c in probe(
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
        adopt(self.loop, view, self._clock)
        # Kept only while Slurm's tree is missing: _rediscover adopts from it again.
        self._start_view = {} if self.layout.has_slurm else view

    def _save(self) -> None:
        """The enforcer's write-ahead: the record of changes, fsynced (the view waits for
        the tick's end)."""
        self.state_file.save(self.state, view=False)

    def _cgroup_scan(self) -> cgroups.JobScan:
        if not self.layout.has_slurm:
            return cgroups.JobScan({})
        # SLUID-named jobs (Slurm 26.05) by what the ticks learnt from Slurm's record, so
        # that putting them back at stop needs no answer from slurmctld.
        return cgroups.scan_jobs(self.layout, resolve=self.slurm.job_ids_of_dirs)

    def _allocated(self, job_id: int, cg: CgroupJob) -> frozenset[int]:
        """Slurm's allocation: what the cgroup held before our first change."""
        return allocated_cpus(self.state, job_id, cg)

    def _repair(self, plan: RepairPlan) -> dict[int, JobResult]:
        """Put back the jobs ``plan`` names to Slurm's allocation (coda_node.daemon.recovery)."""
        return self.recovery.apply(plan, self.state, self.enforcer, self.sampler, self._event)

    # -- one tick: read, decide, write, record ----------------------------------------
    def tick(self) -> TickReport:
        cpu0 = time.process_time()
        self.ticks_total += 1
        if not self.layout.has_slurm:
            self._rediscover()
        limits = self.admin_limits.load(self.limits_file)
        # Read: the node, and what Slurm says of the jobs to be put back to its allocation.
        snap = self._sample(limits)
        cg_sampled = {j: v.cgroup for j, v in snap.jobs.items() if v.cgroup is not None}
        repair = self.recovery.prepare(self.state, self.layout, cg_sampled, snap.unreadable)
        # Decide. A job still to be repaired, or repaired in this tick (the sample shows it
        # as it was before), is left alone until the next tick's sample shows it as Slurm
        # set it; so is a job whose cgroup could not be read, until it reads again.
        decision = decide(
            snap,
            limits,
            repair.hold,
            loop=self.loop,
            allocated=self._allocated,
            near_cpus=near_cpus_of(snap, self.locality),
            mba=self.mba_unavailable,
        )
        self._adaptive_jobs = set(decision.loop.cores) | set(decision.loop.throttles)
        self._adaptive_task_jobs = set(decision.loop.throttles)
        # Write: the repairs, then every other job to its target.
        repaired = self._repair(repair)
        results = self._enforce(snap, decision, repair.hold)
        merge_repaired(results, repaired)
        # Record: the events, the profiles and usage published, the view.
        self.event_log.record_tick(
            self.ticks_total,
            decision.loop.events,
            results,
            lambda job_id: write_reason(job_id, repaired, decision.targets),
        )
        self._publish(snap, decision)
        report = TickReport(
            snapshot=snap,
            targets=decision.targets,
            results=results,
            problems=[f"job {p.job_id}: {p.message}" for p in decision.problems],
            allocated={j: f.allocated_cpus for j, f in decision.facts.items()},
            held=repair.hold,
        )
        self.state.view = self._view(report, limits)
        self._prev_snap = snap
        report.cpu_time_s = time.process_time() - cpu0
        self.state.view["tick_cpu_s"] = report.cpu_time_s
        # Changes were saved durably before each write; the view needs no fsync, and the
        # record of changes is written only if something (a prune) changed it since.
        self.state_file.save(self.state, durable=False)
        return report

    def _sample(self, limits: dict[int, Limit]) -> NodeSnapshot:
        """The node this tick. Steps are read only for the jobs this tick may change or put
        back, and their tasks only where that change acts on tasks; a job that needs more
        than was read is read again after the plan (tick.cgroups_to_enforce)."""
        self.sampler.detail_jobs, self.sampler.task_jobs = sample_detail(
            limits, self.state.changes, self._adaptive_jobs, self._adaptive_task_jobs
        )
        if self.mem_bw.monitor is not None:
            # One reading per group per tick; the sampler then asks monitor.rate per job.
            self.mem_bw.monitor.sample(self._clock())
        return self.sampler.sample()

    def _enforce(
        self, snap: NodeSnapshot, decision: Decision, hold: frozenset[int]
    ) -> dict[int, JobResult]:
        """Every job but those held to its target (absent: as Slurm set it)."""
        changes, layout = self.state.changes, self.layout
        cg_jobs, unread = cgroups_to_enforce(snap, hold, decision.targets, changes, layout)
        results = self.enforcer.reconcile(cg_jobs, decision.targets, held=hold | frozenset(unread))
        results.update(unread)
        for job_id, res in results.items():
            if res.applied and job_id in cg_jobs:
                # What the sampler kept of the job (its steps' CPUs) is what we just changed.
                self.sampler.forget(cg_jobs[job_id])
        # After reconcile, outside its resctrl lock: MON groups follow the threads' control
        # group as the enforcer just left it.
        self.mem_bw.sync(snap, cg_jobs, self.state.changes, self.layout, self.enforcer, self._clock)
        return results

    def _publish(self, snap: NodeSnapshot, decision: Decision) -> None:
        """The profiles the loop finished, the GPU usage records due, and the summaries of
        the jobs that ended."""
        for pub in decision.loop.publish:
            seen = snap if pub.job_id in snap.jobs or self._prev_snap is None else self._prev_snap
            line = self.loop.publish(pub, gpu_model(seen, pub.job_id))
            self._event(pub.job_id, "profile-publish", line)
        self.usage_records.collect(
            snap, decision.facts, decision.targets, decision.loop, self.loop, self.state.changes
        )
        for flush in self.usage.step(snap.monotonic_s, time.time(), set(snap.jobs)):
            self.usage_records.publish(flush, self.loop.store)
        self.job_summaries.step(snap, decision, self.loop, self.state.changes)

    def restore(self, only: frozenset[int] | None = None) -> dict[int, JobResult]:
        """Put every job (or the jobs ``only`` names) back as Slurm set it: from its
        record, or, where the record is missing or cannot be trusted, to the allocation
        Slurm reports (a job Slurm does not answer for, or whose cgroup cannot be read, is
        left as it is, its record kept, and reported as failed). coda's own cgroups and
        resctrl groups that no record covers go too."""
        scan = self._cgroup_scan()
        jobs = scan.jobs
        # Every running job is prepared (the pending repairs of the others stay on record);
        # only the chosen ones are written.
        plan = self.recovery.prepare(self.state, self.layout, jobs, scan.unreadable)
        if only is not None:
            plan.jobs = [p for p in plan.jobs if p[0] in only]
            jobs = {j: cg for j, cg in jobs.items() if j in only}
        repaired = self._repair(plan)
        kept = {j: cg for j, cg in jobs.items() if j not in self.state.repair}
        results = self.enforcer.restore_all(kept, only=only, unreadable=scan.unreadable)
        self.recovery.fold_into(results, repaired, only)
        self.mem_bw.remove_groups()
        self.event_log.record_results(self.ticks_total, results, "restore")
        try:
            snap = self.sampler.sample()
            report = TickReport(snapshot=snap, targets={}, results=results)
            self.state.view = self._view(report, {})
        except Exception:  # the jobs are restored; only the view is stale
            log.exception("cannot refresh the status view after restoring")
        self.state.view.setdefault("daemon", {})["running"] = False
        self.state_file.save(self.state, view=False)
        try:
            self.state_file.save(self.state)
        except OSError as exc:  # the jobs are back and on record; only the view is stale
            log.error("cannot write the status view %s (%s)", self.state_file.view_path, exc)
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
            self.usage_records.publish_remaining(self.loop.store)
            self.job_summaries.publish_remaining(self.loop.store)
            self.restore()
            self.nvml.shutdown()
        finally:
            self.close_counters()
            self.metrics.close()

    def serve_metrics(self) -> tuple[str, int] | None:
        """Start the Prometheus endpoint when NodeMetricsPort is set (MetricsEndpoint.serve)."""
        return self.metrics.serve()

    @property
    def metrics_server(self) -> MetricsServer | None:
        return self.metrics.server

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
        return {**view, "daemon": daemon, "job_end": self.job_summaries.counters.rows()}

    # -- the view for `coda-node status` -----------------------------------------------
    def _event(
        self, job_id: int, what: str, reason: str, reading: dict[str, Any] | None = None
    ) -> None:
        """Keep the decision for `coda-node status` and log it once, job id first."""
        self.event_log.record(self.ticks_total, job_id, what, reason, reading)

    def _view(self, report: TickReport, limits: dict) -> dict[str, Any]:
        return tick_view(self, report, limits)


def _slurm_env(cfg: CodaConfig) -> dict[str, str]:
    """The environment for Slurm's commands: this one, with SlurmConf as SLURM_CONF."""
    env = dict(os.environ)
    if cfg.slurm_conf is not None:
        env["SLURM_CONF"] = str(cfg.slurm_conf)
    return env


def _cpu_counts(root: SystemRoot) -> tuple[frozenset[int] | None, int | None]:
    """The CPUs online (None where the tree does not say: a record naming others is not one
    that can be put back) and how many."""
    online = _online_cpus(root)
    return online, len(online) if online is not None else _cpus_online(root)


def _online_cpus(root: SystemRoot) -> frozenset[int] | None:
    """The CPUs online under NodeRoot (Documentation/ABI/testing/sysfs-devices-system-cpu);
    None for a tree without the file."""
    try:
        return parse_cpulist(root.path("/sys/devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return None


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
