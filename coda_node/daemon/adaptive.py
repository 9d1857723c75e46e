"""The daemon's closed loop: turn each snapshot into inputs of the two pure policies
(:mod:`coda_node.policy.allocator`, :mod:`coda_node.policy.contention`), their outputs into
targets for :mod:`coda_node.enforce.enforcer`, and finished profiles into samples in the
profile store.

Reads here: the per-job progress files and the profile store (once per job). Writes: the
progress files' creation and the profile store's merge. Everything that decides is in the
policy modules, which see only the records built here.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from coda_common.config.codaconf import CodaConfig
from coda_common.model.fit import is_censored, refit_profile
from coda_common.publish.dropbox import Drop, DropError, drop_as_configured
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurm_conf, spread_partitions
from coda_common.store.profiles import ProfileStore, Sample, StoreError, run_id_problem
from coda_node.policy.allocator import (
    Allocator,
    AllocatorOutput,
    Event,
    ProbeJob,
    ProbeParams,
    Publish,
)
from coda_node.policy.contention import (
    ContentionOutput,
    ContentionParams,
    CpuJob,
    DnnJob,
    Eliminator,
    PcieUse,
    Throttle,
    params_from_config,
    pcie_pairs,
)
from coda_node.policy.observe import JobSignal, Progress, Reading, SignalParams
from coda_node.sampling.snapshot import JobView, NodeSnapshot
from coda_node.system.paths import SystemRoot
from coda_node.system.perf import cpu_socket
from coda_node.system.progress import ProgressFiles
from coda_node.system.slurmjobs import SlurmJob
from coda_node.system.topology import pci_address

log = logging.getLogger("coda-node")


def signal_params(cfg: CodaConfig) -> SignalParams:
    return SignalParams(warmup_s=cfg.node_probe_warmup_s)


def probe_params(cfg: CodaConfig, *, why_off: str | None = None) -> ProbeParams:
    return ProbeParams(
        enabled=cfg.node_profile and why_off is None and cfg.node_probe_max_jobs > 0,
        settle_s=cfg.node_probe_settle_s,
        measure_s=cfg.node_probe_measure_s,
        max_jobs=cfg.node_probe_max_jobs,
        budget_s=cfg.node_probe_budget_s,
        max_slowdown=cfg.node_probe_max_slowdown_pct / 100.0,
        min_confidence=cfg.min_confidence,
    )


def contention_params(cfg: CodaConfig, node_name: str) -> tuple[ContentionParams, str]:
    """The eliminator's settings on this node, and what ``coda-node status`` says of its
    price of a hold (where it came from when coda.conf leaves it empty)."""
    if cfg.node_throttle_gpu_worth_cores is not None:
        params = params_from_config(cfg)
        if params.gpu_worth_cores == 0:
            return params, "holds not priced"
        return params, f"a hold priced at {params.gpu_worth_cores:g} cores a GPU"
    spread, why = membw_spread_here(cfg, node_name)
    params = params_from_config(cfg, membw_spread=spread)
    log.info("price of a hold: %g cores per GPU (%s)", params.gpu_worth_cores, why)
    return params, f"a hold priced at {params.gpu_worth_cores:g} cores a GPU, {why}"


def membw_spread_here(cfg: CodaConfig, node_name: str) -> tuple[bool, str]:
    """Whether the submit hook spreads memory-bound CPU jobs over this node, and why: coda.conf
    names ``MemBwSpreadGres`` and a partition of this node, not in ``ExcludePartitions``,
    has that GRES on every node (:func:`spread_partitions`). An unreadable slurm.conf counts
    as no."""
    gres = cfg.mem_bw_spread_gres
    if gres is None:
        return False, "CPU jobs not spread"
    if cfg.slurm_conf is None:
        return False, "CPU jobs taken as not spread: no slurm.conf"
    try:
        nodes, partitions = read_slurm_conf(cfg.slurm_conf)
    except (ConfigError, OSError) as exc:
        log.warning("cannot read %s for MemBwSpreadGres: %s", cfg.slurm_conf, exc)
        return False, f"CPU jobs taken as not spread: {cfg.slurm_conf} unreadable"
    spread = spread_partitions(node_name, nodes, partitions, gres, cfg.exclude_partitions)
    if not spread:
        return False, f"CPU jobs not spread: no partition of this node has {gres} on every node"
    return True, f"{gres} spreads memory-bound CPU jobs here ({','.join(spread)})"


@dataclass(slots=True)
class LoopOutput:
    cores: dict[int, int] = field(default_factory=dict)
    """Probed DNN jobs: the core count they run at now."""
    throttles: dict[int, Throttle] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    publish: list[Publish] = field(default_factory=list)


def training_gpus(gpus_here: int, num_nodes: int) -> int:
    """The GPUs a DNN job trains on, on all its nodes, as the eliminator's price test weighs
    them: its GPUs on this node times its nodes (a synchronous job runs at the pace of its
    slowest node, so what slows it here slows all of them; Slurm gives a job the same GPUs
    on each node with ``--gpus-per-node``, the common way to ask for several nodes)."""
    return max(1, gpus_here) * max(1, num_nodes)


class AdaptiveLoop:
    def __init__(
        self,
        cfg: CodaConfig,
        root: SystemRoot,
        *,
        node_name: str,
        mba: bool,
        l3_ways: int | None = None,
        l3_min_ways: int = 1,
        profiling_off: str | None = None,
        contention_off: str | None = None,
        store: ProfileStore | None = None,
        progress: ProgressFiles | None = None,
    ) -> None:
        self.cfg = cfg
        self.root = root
        self.node_name = node_name
        self.signal_params = signal_params(cfg)
        self.allocator = Allocator(probe_params(cfg, why_off=profiling_off))
        self.profiling_off = profiling_off
        cparams, self.hold_price = contention_params(cfg, node_name)
        if contention_off is not None:
            cparams = replace(cparams, enabled=False)
        self.contention_off = contention_off
        # l3_ways: the L3 cache's ways where CAT can be applied (None: no CAT here).
        self.eliminator = Eliminator(
            cparams,
            mba=mba,
            quota="quota" in cfg.node_enforce,
            l3_ways=l3_ways,
            l3_min_ways=l3_min_ways,
        )
        self.store = store if store is not None else ProfileStore(cfg.profile_store)
        self.progress_files = progress or ProgressFiles(root, cfg.node_progress_dir)
        self.signals: dict[int, JobSignal] = {}
        self.progress: dict[int, Progress] = {}
        self._confident: dict[int, bool] = {}
        self._sockets: dict[int, int] = {}
        self._ensured: set[int] = set()
        self._switch: dict[str, str | None] = {}
        self._pcie_reported: set[tuple[int, int]] = set()
        self.pcie: dict[int, float] = {}
        """Each DNN job's PCIe traffic this tick (bytes/s, rx + tx over its GPUs)."""

    def adopt_signal(self, job_id: int, first_seen_s: float) -> None:
        """Watch ``job_id`` as if since ``first_seen_s`` (a restarted daemon, from its last
        run's view), so its warm-up is not served a second time."""
        if job_id not in self.signals:
            self.signals[job_id] = JobSignal(first_seen_s, self.signal_params)

    def adopt_probe(
        self, job_id: int, record: Mapping[str, object], *, extra_below_s: float = 0.0
    ) -> bool:
        """Resume ``job_id``'s online profile from the last run's view (its ``profiling``
        entry); False when it is profiled afresh (see :meth:`Allocator.adopt`)."""
        return self.allocator.adopt(job_id, record, extra_below_s=extra_below_s)

    # -- inputs -------------------------------------------------------------------------
    def sockets_of(self, cpus: frozenset[int]) -> frozenset[int]:
        out = set()
        for cpu in cpus:
            s = self._sockets.get(cpu)
            if s is None:
                try:
                    s = cpu_socket(self.root, cpu)
                except (OSError, ValueError):
                    s = 0  # no topology in sysfs: one socket
                self._sockets[cpu] = s
            out.add(s)
        return frozenset(out)

    def _profile_confident(self, view: JobView, signature: str) -> bool:
        """Whether the workload already has a settled profile: confident and not censored
        (a censored one only says "at least this many": probe again with the room the hook
        gave). Read once per job; the hook's record stands in when the store cannot be read."""
        cached = self._confident.get(view.job_id)
        if cached is not None:
            return cached
        record = view.slurm.admin_record if view.slurm else None
        by_record = bool(record and record.get("src") in ("profile", "global"))
        try:
            prof = self.store.read(signature)
        except (StoreError, OSError) as exc:
            log.warning("job=%d cannot read profile %s: %s", view.job_id, signature, exc)
            confident = by_record
        else:
            confident = (
                prof is not None
                and prof.confidence >= self.cfg.min_confidence
                and not is_censored(prof)
            ) or (by_record and prof is None)
        self._confident[view.job_id] = confident
        return confident

    def _reading(
        self, now_s: float, view: JobView, gpu_util: Mapping[int, float | None]
    ) -> Reading:
        pr = self.progress_files.read(view.job_id)
        utils = [gpu_util.get(g.nvml_index) for g in view.gpus if g.nvml_index is not None]
        known = [u for u in utils if u is not None]
        return Reading(
            now_s=now_s,
            iterations=pr.iterations if pr else None,
            iterations_written_s=pr.written_unix_s if pr else None,
            reported_phase=pr.phase if pr else None,
            gpu_util_pct=sum(known) / len(known) if known else None,
        )

    # -- one tick -------------------------------------------------------------------------
    def step(
        self,
        snap: NodeSnapshot,
        allocated: Callable[[int], frozenset[int] | None],
        *,
        blocked: Mapping[int, str] | None = None,
    ) -> LoopOutput:
        """``allocated(job_id)``: Slurm's CPUs of the job on this node (before our
        changes), None for a job without a cgroup. ``blocked``: jobs not to probe, why."""
        blocked = dict(blocked or {})
        now_s = snap.monotonic_s
        live = set(snap.jobs)
        self._forget_ended(live)
        gpu_util = {g.index: g.util_pct for g in snap.gpus}

        probe_jobs: dict[int, ProbeJob] = {}
        cpu: dict[int, CpuJob] = {}
        sockets_of_job: dict[int, frozenset[int]] = {}
        for job_id, view in snap.jobs.items():
            cpus = allocated(job_id)
            if cpus is None or view.slurm is None:
                continue
            sockets = sockets_of_job[job_id] = self.sockets_of(cpus)
            if not view.slurm.is_dnn:
                cpu[job_id] = CpuJob(
                    job_id=job_id,
                    sockets=sockets,
                    allocated_cores=len(cpus),
                    cpu_rate_cores=view.cpu_rate_cores,
                    mem_bw_bytes_per_s=view.mem_bw_bytes_per_s,
                )
                continue
            probe_jobs[job_id] = self._probe_job(
                now_s, job_id, view, view.slurm, len(cpus), gpu_util, blocked.get(job_id)
            )
        # Jobs near a throttled CPU job are not probed: their rate is not their own.
        for job_id, pj in list(probe_jobs.items()):
            if pj.blocked is None:
                why = self._throttled_near(sockets_of_job[job_id], sockets_of_job)
                if why:
                    probe_jobs[job_id] = replace(pj, blocked=why)
        ended = set(self.allocator.records) - live
        alloc_out: AllocatorOutput = self.allocator.step(now_s, probe_jobs, ended=ended)
        dnn = self._dnn_jobs(snap, probe_jobs, sockets_of_job)
        cont_out: ContentionOutput = self.eliminator.step(now_s, dnn, cpu)
        self.progress_files.forget(live)
        return LoopOutput(
            cores=alloc_out.cores,
            throttles=cont_out.throttles,
            events=alloc_out.events + cont_out.events + self._pcie_events(snap),
            publish=alloc_out.publish,
        )

    def _forget_ended(self, live: set[int]) -> None:
        """Drop what is kept per job for the jobs no longer in ``live``."""
        for gone in set(self.signals) - live:
            self.signals.pop(gone, None)
            self.progress.pop(gone, None)
            self._confident.pop(gone, None)
        self._ensured &= live

    def _probe_job(
        self,
        now_s: float,
        job_id: int,
        view: JobView,
        slurm: SlurmJob,
        allocated_cores: int,
        gpu_util: Mapping[int, float | None],
        blocked: str | None,
    ) -> ProbeJob:
        """What the allocator weighs of one DNN job this tick (``slurm``: Slurm's view of it);
        updates its progress signal and makes sure its progress file exists."""
        if job_id not in self._ensured:
            self.progress_files.ensure(job_id, slurm.uid)
            self._ensured.add(job_id)
        sig_ = self.signals.get(job_id)
        if sig_ is None:
            sig_ = self.signals[job_id] = JobSignal(now_s, self.signal_params)
        rec = self.allocator.records.get(job_id)
        probed = rec is not None and rec.state == "probing"
        prog = sig_.update(self._reading(now_s, view, gpu_util), hold_level=probed)
        self.progress[job_id] = prog
        record = slurm.admin_record
        signature = record.get("sig") if record else None
        gpus = len(slurm.gpu_indices) or sum(g.count for g in slurm.gres if g.name == "gpu")
        return ProbeJob(
            job_id=job_id,
            signature=signature or None,
            gpus=max(1, gpus),
            allocated_cores=allocated_cores,
            single_node=slurm.num_nodes <= 1,
            progress=prog,
            profile_confident=bool(signature) and self._profile_confident(view, signature),
            blocked=blocked,
        )

    def _dnn_jobs(
        self,
        snap: NodeSnapshot,
        probe_jobs: Mapping[int, ProbeJob],
        sockets_of_job: Mapping[int, frozenset[int]],
    ) -> dict[int, DnnJob]:
        """The DNN jobs as the contention eliminator weighs them, after the allocator's step."""
        dnn: dict[int, DnnJob] = {}
        for job_id, pj in probe_jobs.items():
            rec = self.allocator.records.get(job_id)
            slurm_job = snap.jobs[job_id].slurm
            dnn[job_id] = DnnJob(
                job_id=job_id,
                sockets=sockets_of_job[job_id],
                progress=pj.progress,
                probing=rec is not None and rec.state == "probing",
                gpus=training_gpus(pj.gpus, slurm_job.num_nodes if slurm_job else 1),
            )
        return dnn

    # -- PCIe ------------------------------------------------------------------------------
    def switch_of(self, pci_bus_id: str | None) -> str | None:
        """The PCIe switch (its upstream port's address) a GPU hangs off, from sysfs:
        ``/sys/bus/pci/devices/<gpu>`` links to ``.../<root port>/<switch up>/<switch
        down>/<gpu>``. A GPU right under a root port counts that port as its "switch"."""
        if pci_bus_id is None:
            return None
        if pci_bus_id not in self._switch:
            key = None
            addr = pci_address(pci_bus_id)
            if addr is not None:
                link = self.root.path(f"/sys/bus/pci/devices/{addr}")
                chain = [p for p in os.path.realpath(link).split("/") if _PCI_ADDR.fullmatch(p)]
                if len(chain) >= 3:
                    key = chain[-3]  # gpu <- switch downstream port <- switch upstream port
                elif len(chain) == 2:
                    key = chain[-2]  # directly under a root port
            self._switch[pci_bus_id] = key
        return self._switch[pci_bus_id]

    def _pcie_events(self, snap: NodeSnapshot) -> list[Event]:
        by_index = {g.index: g for g in snap.gpus}
        uses: dict[int, PcieUse] = {}
        self.pcie = {}
        for job_id, view in snap.jobs.items():
            if view.slurm is None or not view.slurm.is_dnn:
                continue
            total, switches, known = 0.0, set(), False
            for ref in view.gpus:
                g = by_index.get(ref.nvml_index) if ref.nvml_index is not None else None
                if g is None:
                    continue
                for v in (g.pcie_rx_bytes_per_s, g.pcie_tx_bytes_per_s):
                    if v is not None:
                        total += v
                        known = True
                sw = self.switch_of(g.pci_bus_id)
                if sw is not None:
                    switches.add(sw)
            if known:
                self.pcie[job_id] = total
                uses[job_id] = PcieUse(job_id, frozenset(switches), total)
        events = []
        pairs = pcie_pairs(uses)
        now = {(a, b) for a, b, _ in pairs}
        for a, b, sw in pairs:
            if (a, b) in self._pcie_reported:
                continue
            for job, other in ((a, b), (b, a)):
                events.append(
                    Event(
                        job,
                        "pcie-shared",
                        f"job {job} and job {other} both move over 8 GB/s through PCIe switch "
                        f"{sw} (CODA: 5-10 % slowdown each); placement should spread them",
                        {
                            "other": other,
                            "switch": sw,
                            "pcie_bytes_per_s": uses[job].bytes_per_s,
                            "other_pcie_bytes_per_s": uses[other].bytes_per_s,
                        },
                    )
                )
        self._pcie_reported = now
        return events

    def _throttled_near(
        self, sockets: frozenset[int], sockets_of_job: Mapping[int, frozenset[int]]
    ) -> str | None:
        for job_id, t in self.eliminator.throttled.items():
            if t.level > 0 and sockets_of_job.get(job_id, frozenset()) & sockets:
                return f"CPU job {job_id} on its socket is throttled (contention)"
        return None

    def profile_state(self, job_id: int) -> str | None:
        """The job's profile as ``coda-node status`` names it
        (coda_node.status.document.PROFILE_STATES):
        known, waiting, probing, probed, confident or skipped; None for a job not profiled
        (a CPU job)."""
        rec = self.allocator.records.get(job_id)
        if rec is None:
            return None
        if rec.state != "done":
            return rec.state
        confident = self._confident.get(job_id, False)
        if rec.probes == 0:
            return "known" if confident else "probed"
        return "confident" if confident else "probed"

    # -- publishing ---------------------------------------------------------------------------
    def publish(
        self, pub: Publish, gpu_model: str | None = None, *, now_unix_s: float | None = None
    ) -> str:
        """Merge a probed job's samples into the profile store; one line saying what
        happened (for the event log). Never raises.

        The samples share one run id, ``<node>:<job id>:<unix s>`` (``now_unix_s``, default
        now): they are relative to this run's own top, and ``refit_profile`` puts runs on one
        scale by it (:func:`coda_common.model.fit.run_labels`).
        """
        now = time.time() if now_unix_s is None else now_unix_s
        run: str | None = f"{self.node_name}:{pub.job_id}:{int(now)}"
        if run_id_problem(run) is not None:
            # A node name the store cannot hold in an id (whitespace, non-ASCII, very long):
            # publish without one, as before version 3 (refit then infers the runs), rather
            # than lose the samples.
            run = None
        samples = [
            Sample(
                cores=float(cores),
                throughput=round(throughput, 4),
                gpus=pub.gpus,
                nodes=1,
                gpu_model=gpu_model,
                node=self.node_name,
                run=run,
            )
            for cores, throughput in pub.samples
        ]
        if self.cfg.profile_publish == "munge":
            return self._drop(pub, samples, now)
        try:
            self.store.ensure_root()
            prof = self.store.merge_samples(
                pub.signature,
                samples,
                refit=refit_profile,
                source=f"coda-node:{self.node_name}",
                now_unix_s=now,
            )
        except (StoreError, OSError, ValueError) as exc:
            return f"cannot publish to {self.store.root}: {exc}"
        self._confident[pub.job_id] = (
            prof.confidence >= self.cfg.min_confidence and not is_censored(prof)
        )
        return (
            f"profile {pub.signature}: {prof.cpus_per_gpu} cores/GPU at confidence "
            f"{prof.confidence:.2f} from {prof.n_samples} samples"
        )

    def _drop(self, pub: Publish, samples: list[Sample], now_unix_s: float) -> str:
        """ProfilePublish=munge: hand the samples to the controller's collector."""
        payload = Drop(pub.signature, self.node_name, tuple(samples), now_unix_s)
        try:
            path = drop_as_configured(payload, self.cfg)
        except DropError as exc:
            return f"cannot hand profile {pub.signature} to the controller: {exc}"
        return f"profile {pub.signature}: {len(samples)} samples handed to the controller as {path}"


_PCI_ADDR = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d")
