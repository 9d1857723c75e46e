"""The placement mechanisms in the simulator, decided by the product's own code.

Four mechanisms, each off by default (:class:`slurm_plugin.sim.params.SimParams`):

- **reserve**: a CPU partition over each node shape whose ``MaxCPUsPerNode`` follows
  :func:`slurm_plugin.reserve.plan.spare_cpus_per_node`, the function ``coda-slurm reserve``
  runs every ``ReserveIntervalS``;
- **pcie spread**: jobs that :func:`slurm_plugin.decision.placement.is_pcie_heavy` marks ask for one
  unit of a node's count-only ``pcie`` GRES;
- **GPU generation prefer**: :func:`slurm_plugin.decision.placement.prefer_gpu_type` over a
  :func:`slurm_plugin.decision.placement.gpu_ranking` sets a soft ``--prefer`` GPU type.
- **GPU sharing** (``shard`` GRES): the workloads
  :func:`slurm_plugin.decision.colocate.shareable_workloads` names may put a second job on GPUs
  another one holds; what sharing then does to both is :func:`shared_iteration_s`, a model
  of time-slicing that is not the predictor (:class:`ShareModel`).

This module holds what the simulator must assume to evaluate them (which models draw PCIe
bandwidth, how much a newer GPU speeds each up; the sources are beside each number) and the
glue that turns the simulator's state into the product functions' inputs. The engine calls
it only when a mechanism or its physical model is switched on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coda_common.store.usage import UsageRecord
from slurm_plugin.decision.colocate import ShareCandidate, shareable_workloads
from slurm_plugin.decision.decide import ProfileView
from slurm_plugin.decision.placement import GpuRanking, gpu_ranking, is_pcie_heavy, prefer_gpu_type
from slurm_plugin.reserve.plan import NodeLoad, expected_cpus_per_gpu, spare_cpus_per_node
from slurm_plugin.sim.workloads import CLASSES, GENERATIONS, JobModel, Workloads

__all__ = [
    "TRAITS",
    "PlacementModel",
    "PlacementTraits",
    "ShareModel",
    "shared_iteration_s",
    "spare_cpus_by_shape",
    "traits_for",
]

_CODA_PCIE = "Zhao et al., CODA (ICDCS'20), section II.C"
_TAKAYAMA = (
    "Takayama et al., Deep Learning Workload Analysis for Efficient Resource Allocation, "
    "MLPerf training times on P100 and V100"
)


@dataclass(frozen=True, slots=True)
class PlacementTraits:
    """What a kind of model does to PCIe and how much a V100 speeds it up over a P100."""

    pcie_heavy: bool
    """Draws the PCIe bandwidth that slows a co-located multi-GPU job (8-12 GB/s)."""
    v100_time_ratio: float
    """Training time on a V100 over that on a P100 (Takayama: 0.66-1.01)."""
    source: str


def _t(heavy: bool, ratio: float, source: str) -> PlacementTraits:
    return PlacementTraits(heavy, ratio, source)


# Takayama's V100/P100 job-time ratios: IC (ResNet-50) 0.66, SSD 0.98, OD (Mask R-CNN) 0.81,
# RM (NCF) 1.01, SA 0.76, RT (GNMT, RNN) 0.68, TL (Transformer) 0.67, SR (DeepSpeech2) 0.72,
# RF (MiniGo) 0.93. Their finding: jobs with high GPU utilisation gain most; those where
# "CPU performance is considered to be important, such as RM and SSD" gain least.
_CPU_BOUND_CV = (
    f"PCIe: assumed as AlexNet, a simple CV model ({_CODA_PCIE}: 'unless the complexity of "
    f"the model is small, it will demand a considerable amount of PCIe bandwidth'); GPU "
    f"generation: assumed as SSD's 0.98, a CPU-hungry job (SoCC'18 sweet spot ~20 cores) "
    f"({_TAKAYAMA})"
)
TRAITS: dict[str, PlacementTraits] = {
    # The SoCC'18 classes (slurm_plugin.sim.workloads.CLASSES).
    "lenet": _t(True, 0.98, _CPU_BOUND_CV),
    "alexnet": _t(
        True,
        0.98,
        f"PCIe: measured heavy ({_CODA_PCIE}); GPU generation: assumed as SSD's 0.98, a "
        f"CPU-hungry job ({_TAKAYAMA})",
    ),
    "overfeat": _t(True, 0.98, _CPU_BOUND_CV),
    "googlenet": _t(
        False,
        0.66,
        f"PCIe: as Inception3, no noticeable drop ({_CODA_PCIE}); GPU generation: as IC "
        f"(ResNet-50), a complex CNN ({_TAKAYAMA})",
    ),
    "languagemodel": _t(
        False, 0.68, f"PCIe: NLP < 1 GB/s ({_CODA_PCIE}); GPU generation: as RT (GNMT, an RNN)"
    ),
    "bi-att-flow": _t(
        False,
        0.68,
        f"PCIe: NLP < 1 GB/s ({_CODA_PCIE}); GPU generation: assumed as RT (RNN + attention)",
    ),
    "deepspeech": _t(
        False, 0.72, f"PCIe: speech < 1 GB/s ({_CODA_PCIE}); GPU generation: SR (DeepSpeech2)"
    ),
    "wavenet": _t(
        False, 0.72, f"PCIe: speech < 1 GB/s ({_CODA_PCIE}); GPU generation: assumed as SR"
    ),
    # Muri's models (named in its trace).
    "resnet18": _t(True, 0.66, f"PCIe: assumed as ResNet50 ({_CODA_PCIE}); as IC (ResNet-50)"),
    "shufflenet_v2_x1_0": _t(
        True, 0.98, "PCIe: assumed heavy, a small CV model; GPU generation: as SSD (CPU-bound)"
    ),
    "vgg16": _t(False, 0.66, f"PCIe: no noticeable drop ({_CODA_PCIE}); as IC (a CNN)"),
    "vgg19": _t(False, 0.66, f"PCIe: assumed as VGG16 ({_CODA_PCIE}); as IC (a CNN)"),
    "bert": _t(False, 0.67, f"PCIe: NLP < 1 GB/s ({_CODA_PCIE}); as TL (Transformer)"),
    "gpt2": _t(False, 0.67, f"PCIe: NLP < 1 GB/s ({_CODA_PCIE}); as TL (Transformer)"),
    "a2c": _t(False, 0.93, "PCIe: assumed light (RL, small models); as RF (MiniGo)"),
    "dqn": _t(False, 0.93, "PCIe: assumed light (RL, small models); as RF (MiniGo)"),
}
"""Per model (lower-case name): PCIe-heaviness and GPU-generation sensitivity."""

UNKNOWN_TRAITS = PlacementTraits(False, 1.0, "assumed: PCIe-light and no faster on a V100")


def traits_for(wl: Workloads, workload: int) -> PlacementTraits:
    """The traits of workload id ``workload``: its class's, or its own name's (Muri)."""
    k = int(wl.klass[workload])
    name = CLASSES[k].name if k < len(CLASSES) else wl.names[workload]
    return TRAITS.get(name.lower(), UNKNOWN_TRAITS)


def _generation_speed(traits: PlacementTraits, generation: str) -> float:
    """Progress rate on ``generation`` relative to the fastest measured one (a V100)."""
    # The trace's run times are taken as V100 times (the fastest generation: most of the
    # Alibaba inventory maps there), so a job only ever slows on an older GPU and effective
    # utilisation stays in [0, 1].
    times = {"P100": 1.0, "V100": traits.v100_time_ratio}
    return min(times.values()) / times[generation]


class PlacementModel:
    """Per-workload placement facts for one run, and the product's decisions over them."""

    def __init__(
        self,
        wl: Workloads,
        model: JobModel,
        node_models: Sequence[str | None],
        node_gpus: Sequence[int],
        *,
        pcie_threshold_bytes_per_s: float,
        prefer_margin: float,
    ) -> None:
        self.wl = wl
        self.m = model
        n_wl = len(wl.names)
        traits = [traits_for(wl, w) for w in range(n_wl)]
        self.pcie_heavy = np.array([t.pcie_heavy for t in traits], dtype=bool)
        """True PCIe-heaviness per workload id (what slows co-located jobs)."""
        self.pcie_bytes_per_s = np.where(
            self.pcie_heavy,
            model.pcie_heavy_bytes_per_s_per_gpu,
            model.pcie_light_bytes_per_s_per_gpu,
        )
        self.threshold = pcie_threshold_bytes_per_s
        gens = dict(model.gpu_generations)
        for gen in gens.values():
            if gen not in GENERATIONS:
                raise ValueError(f"GPU generation {gen!r} is not one of {GENERATIONS}")
        self.types: list[str] = sorted({m for m in node_models if m is not None})
        """GPU models of the cluster, in a stable order (index = type id)."""
        # speed[w, type]: progress rate of workload w on that GPU model (1 = trace speed).
        self.speed = np.ones((n_wl, len(self.types)))
        for ti, name in enumerate(self.types):
            gen = gens.get(name)
            if gen is None:
                continue
            for w, t in enumerate(traits):
                self.speed[w, ti] = _generation_speed(t, gen)
        # PreferGpuTypes as an admin would list them: fastest first (mean speed over the
        # workloads), and among equally fast types the one with most GPUs first, so that a
        # preference for the newest names the pool that can hold the most jobs.
        mean_speed = self.speed.mean(axis=0) if n_wl else np.ones(len(self.types))
        pool = dict.fromkeys(self.types, 0)
        for name, gpus in zip(node_models, node_gpus, strict=True):
            if name is not None:
                pool[name] += int(gpus)
        self.prefer_types: list[str] = sorted(
            self.types, key=lambda name: (-mean_speed[self.types.index(name)], -pool[name], name)
        )
        self._type_index = {name.lower(): ti for ti, name in enumerate(self.types)}
        self._marks: dict[tuple[int, int], bool] = {}
        self._views: dict[int, ProfileView] = {}
        self._prefer: dict[int, int] = {}
        self._ranking: GpuRanking | None = None
        self.margin = prefer_margin

    # -- PCIe ---------------------------------------------------------------------------------
    def usage(self, workload: int) -> tuple[UsageRecord, ...]:
        """What coda-node would have measured for ``workload``: one record per GPU model of
        the cluster (one model-less record on a cluster without models), its PCIe traffic
        and its progress per GPU on that model."""
        pcie = float(self.pcie_bytes_per_s[workload])
        models: list[str | None] = list(self.types) or [None]
        # GPU and memory-bandwidth utilisation are for GPU sharing (not simulated here);
        # placeholders that the placement functions do not read.
        return tuple(
            UsageRecord(
                gpu_model=name,
                gpu_util=0.9,
                gpu_mem_bw_util=0.5,
                pcie_bytes_per_s_per_gpu=pcie,
                iter_per_s_per_gpu=float(self.speed[workload, ti]) if self.types else 1.0,
                ticks=600,
                updated_unix_s=0.0,
            )
            for ti, name in enumerate(models)
        )

    def marks_pcie(self, workload: int, gpus_per_node: int) -> bool:
        """Whether the hook asks ``pcie:1`` for a job of ``workload`` with these GPUs per
        node (the product's :func:`is_pcie_heavy`, memoised)."""
        key = (workload, gpus_per_node)
        got = self._marks.get(key)
        if got is None:
            got = self._marks[key] = is_pcie_heavy(
                self.usage(workload), gpus_per_node, threshold_bytes_per_s=self.threshold
            )
        return got

    # -- GPU generations -------------------------------------------------------------------
    def view(self, workload: int) -> ProfileView:
        v = self._views.get(workload)
        if v is None:
            name = self.wl.names[workload]
            v = self._views[workload] = ProfileView(
                signature=f"workload:{1000 + workload}:{name}",
                workload=name,
                cpus_per_gpu=1,
                confidence=1.0,
                n_samples=8,
                multi_node_cpus_per_gpu=None,
                usage=self.usage(workload),
            )
        return v

    def preferred_type(self, workload: int) -> int:
        """Index into :attr:`types` of the GPU type the hook's ``--prefer`` names for a job
        of ``workload`` with no GPU-type constraint, or -1 for none."""
        got = self._prefer.get(workload)
        if got is None:
            if self._ranking is None:
                # The ranking spans every workload's profile, as the hook's does the store.
                self._ranking = gpu_ranking(self.view(w) for w in range(len(self.wl.names)))
            pick = prefer_gpu_type(
                self.view(workload), self._ranking, self.prefer_types, margin=self.margin
            )
            # The hook answers in lower case (GPU types are compared case-insensitively).
            got = self._type_index[pick[0].lower()] if pick is not None else -1
            self._prefer[workload] = got
        return got


def spare_cpus_by_shape(
    shape_nodes: Sequence[np.ndarray],
    node_cores: np.ndarray,
    node_gpus: np.ndarray,
    free_gpus: np.ndarray,
    gpu_job_cores: np.ndarray,
    pending_cpus_per_gpu: Sequence[float],
    default_cpus_per_gpu: float,
    min_cpus: int,
) -> list[int]:
    """``MaxCPUsPerNode`` of each spare CPU partition (one per node shape), as
    ``coda-slurm reserve`` would set it now: :func:`spare_cpus_per_node` over the shape's
    nodes at :func:`expected_cpus_per_gpu` of the pending GPU jobs (0 when it answers None)."""
    cpg = expected_cpus_per_gpu(pending_cpus_per_gpu, default_cpus_per_gpu)
    out = []
    for idx in shape_nodes:
        loads = [
            NodeLoad(
                name=str(i),
                cpus=int(node_cores[i]),
                gpus=int(node_gpus[i]),
                gpus_alloc=int(node_gpus[i] - free_gpus[i]),
                cpus_alloc_gpu_jobs=int(gpu_job_cores[i]),
            )
            for i in idx
        ]
        spare = spare_cpus_per_node(loads, cpg, min_cpus=min_cpus)
        out.append(0 if spare is None else int(spare))
    return out


# -- GPU sharing (placement mechanism 4) ---------------------------------------------------------


def _check_phases(gpu_a_s: float, private_a_s: float, gpu_b_s: float, private_b_s: float) -> None:
    """ValueError unless :func:`shared_iteration_s`'s phases are times and each job's
    iteration takes some."""
    for name, value in (
        ("gpu_a_s", gpu_a_s),
        ("private_a_s", private_a_s),
        ("gpu_b_s", gpu_b_s),
        ("private_b_s", private_b_s),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if gpu_a_s + private_a_s <= 0 or gpu_b_s + private_b_s <= 0:
        raise ValueError("each job's iteration must take some time")


def shared_iteration_s(
    gpu_a_s: float, private_a_s: float, gpu_b_s: float, private_b_s: float
) -> tuple[float, float]:
    """Steady-state iteration times of two jobs that time-slice one GPU (no MPS).

    Each job loops: a GPU phase (``gpu_*_s``, already stretched by the context-switch
    overhead), then a private phase (``private_*_s``: CPU, data loading, communication)
    that needs no GPU. The GPU serves one GPU phase at a time, first come first served
    (work of two CUDA contexts never overlaps without MPS: Tabrizian 2020, fig. 2.4); both
    jobs ask for it at time 0, ``a`` first. This is the ground truth the simulator charges
    a shared pair; it is not :func:`slurm_plugin.decision.colocate.predict_speedup` (that would make
    the evaluation circular): it follows each job's phases exactly, so two jobs whose GPU
    phases fit into each other's private time lose only the overhead, and a short-iteration
    job beside a long one waits out the long one's GPU phases.

    The system is deterministic and its state at each grant of the GPU is the two jobs'
    times to their next request, so it is stepped until that state repeats (exact, up to
    float rounding); where the times are incommensurate and it never repeats exactly, the
    mean over the last half of 4,000 grants is returned.
    """
    _check_phases(gpu_a_s, private_a_s, gpu_b_s, private_b_s)
    phase = ((gpu_a_s, private_a_s), (gpu_b_s, private_b_s))
    scale = max(gpu_a_s + private_a_s, gpu_b_s + private_b_s)
    tol = 1e-9 * scale
    ask = [0.0, 0.0]  # when each job next asks for the GPU
    free = 0.0  # when the GPU is next free
    done = [0, 0]  # GPU phases granted so far
    seen: dict[tuple[int, int, int], tuple[int, float, int, int]] = {}
    grants = 4000
    half: tuple[float, int, int] | None = None
    for step in range(grants):
        # FCFS: the earlier request; a tie goes to a (it asked first at time 0).
        who = 0 if ask[0] <= ask[1] else 1
        key = (
            round(max(ask[0] - free, 0.0) / tol),
            round(max(ask[1] - free, 0.0) / tol),
            who,
        )
        prev = seen.get(key)
        if prev is not None:
            _, t0, d0a, d0b = prev
            period = free - t0
            na, nb = done[0] - d0a, done[1] - d0b
            if na > 0 and nb > 0:
                return period / na, period / nb
        seen[key] = (step, free, done[0], done[1])
        if step == grants // 2:
            half = (free, done[0], done[1])
        start = max(free, ask[who])
        g, z = phase[who]
        free = start + g
        ask[who] = free + z
        done[who] += 1
    assert half is not None
    t0, d0a, d0b = half
    span = free - t0
    return span / max(done[0] - d0a, 1), span / max(done[1] - d0b, 1)


def _sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (a cache key that keeps ratios)."""
    return float(f"{x:.{digits - 1}e}")


class ShareModel:
    """What the simulator assumes about GPU sharing, and the product's advice over it.

    Per workload and GPUs per node, alone at its sweet spot: the GPU busy share
    ``u_plateau`` and the iteration time. Muri's models take both from the trace's stage
    times (ms per iteration: data, GPU, communication), ``u_plateau = GPU / (GPU + comm)``
    and iteration ``GPU + comm`` (at the sweet spot the data stage is hidden behind them,
    which is how the simulator's throughput curve treats it); the SoCC'18 classes
    (Philly, Alibaba) take ``JobModel.share_gpu_busy`` and one iteration time for all
    (only the two jobs' ratio matters). Below its sweet spot a job's GPU work per
    iteration stays the same and the iteration takes ``1 / throughput`` as long, so its
    GPU busy share is ``throughput × u_plateau``: what coda-node would measure for it.
    """

    def __init__(
        self,
        wl: Workloads,
        model: JobModel,
        stage_ms: Mapping[tuple[str, int], tuple[float, float, float]],
        *,
        margin: float,
        advised: bool,
    ) -> None:
        if not 0.0 <= model.share_switch_overhead <= 1.0:
            raise ValueError(
                f"share_switch_overhead must be within 0..1, got {model.share_switch_overhead}"
            )
        if not 0.0 < model.share_gpu_busy <= 1.0:
            raise ValueError(f"share_gpu_busy must be within (0, 1], got {model.share_gpu_busy}")
        weights = dict(model.share_mem_weight)
        for name, value in [*weights.items(), ("default", model.share_mem_weight_default)]:
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"share_mem_weight of {name} must be within 0..1, got {value}")
        self.wl = wl
        self.m = model
        self.margin = margin
        self.advised = advised
        self.overhead = model.share_switch_overhead
        by_model: dict[str, dict[int, tuple[float, float, float]]] = {}
        for (name, gpus), stages in stage_ms.items():
            by_model.setdefault(name, {})[gpus] = stages
        self._stages = by_model
        self._names = [
            (CLASSES[k].name if k < len(CLASSES) else wl.names[w]).lower()
            for w, k in enumerate(wl.klass.tolist())
        ]
        self._weights = weights
        self._plateau: dict[tuple[int, int], tuple[float, float]] = {}
        self._may: dict[tuple[int, int, float], bool] = {}
        self._factors: dict[tuple[float, float, float], tuple[float, float]] = {}

    def mem_weight(self, workload: int) -> float:
        """The thesis's M of ``workload``'s model (``JobModel.share_mem_weight``)."""
        return self._weights.get(self._names[workload], self.m.share_mem_weight_default)

    def plateau(self, workload: int, gpus: int) -> tuple[float, float]:
        """(GPU busy share, iteration time in s) of ``workload`` alone at its sweet spot."""
        key = (workload, gpus)
        got = self._plateau.get(key)
        if got is None:
            sizes = self._stages.get(self.wl.names[workload])
            if sizes:
                # The stages of this job size, else of the nearest size measured.
                near = min(sizes, key=lambda g: (abs(g - gpus), g))
                _data_ms, gpu_ms, comm_ms = sizes[near]
                busy_ms = max(gpu_ms + comm_ms, 1e-6)
                got = (min(1.0, max(0.0, gpu_ms / busy_ms)), busy_ms / 1000.0)
            else:
                got = (self.m.share_gpu_busy, 1.0)
            self._plateau[key] = got
        return got

    def alone(self, workload: int, gpus: int, throughput: float) -> tuple[float, float]:
        """(GPU busy share, iteration time in s) alone at a throughput (1 = sweet spot)."""
        u, iteration_s = self.plateau(workload, gpus)
        rate = max(throughput, 1e-6)
        return u * min(1.0, rate), iteration_s / rate

    def candidate(self, workload: int, gpus: int, throughput: float) -> ShareCandidate:
        """What coda-node would record for a job of ``workload`` at this throughput."""
        u, _ = self.alone(workload, gpus, throughput)
        return ShareCandidate(self.wl.names[workload], u, u * self.mem_weight(workload))

    def may_share(self, workload: int, gpus: int, throughput: float) -> bool:
        """Whether a job of ``workload`` may use ``shard`` GRES: always for blind sharing;
        with advice, whether the product's :func:`shareable_workloads` names it."""
        if not self.advised:
            return True
        key = (workload, gpus, round(throughput, 3))
        got = self._may.get(key)
        if got is None:
            cand = self.candidate(workload, gpus, key[2])
            got = self._may[key] = bool(shareable_workloads([cand], margin=self.margin))
        return got

    def rate_factors(self, a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
        """Each job's progress rate while shared over its rate alone (``T / T'``), for two
        jobs given as (GPU busy share, iteration time) alone; cached on u to 0.01 and the
        iteration times' ratio to 3 significant digits."""
        (ua, ta), (ub, tb) = a, b
        flip = (ub, -tb) < (ua, -ta)
        if flip:
            (ua, ta), (ub, tb) = (ub, tb), (ua, ta)
        key = (round(ua, 2), round(ub, 2), _sig(tb / ta))
        got = self._factors.get(key)
        if got is None:
            ua_r, ub_r, ratio = key
            stretch = 1.0 + self.overhead
            ta_s, tb_s = 1.0, ratio
            shared_a, shared_b = shared_iteration_s(
                ua_r * ta_s * stretch,
                (1.0 - ua_r) * ta_s,
                ub_r * tb_s * stretch,
                (1.0 - ub_r) * tb_s,
            )
            got = self._factors[key] = (ta_s / shared_a, tb_s / shared_b)
        return (got[1], got[0]) if flip else got
