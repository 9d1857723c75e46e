"""Issue 7's placement mechanisms in the simulator, decided by the product's own code.

Three mechanisms, each off by default (:class:`slurm_plugin.sim.engine.SimParams`):

- **reserve**: a CPU partition over each node shape whose ``MaxCPUsPerNode`` follows
  :func:`slurm_plugin.reserve.spare_cpus_per_node`, the function ``coda-slurm reserve``
  runs every ``ReserveIntervalS``;
- **pcie spread**: jobs that :func:`slurm_plugin.placement.is_pcie_heavy` marks ask for one
  unit of a node's count-only ``pcie`` GRES;
- **GPU generation prefer**: :func:`slurm_plugin.placement.prefer_gpu_type` over a
  :func:`slurm_plugin.placement.gpu_ranking` sets a soft ``--prefer`` GPU type.

This module holds what the simulator must assume to evaluate them (which models draw PCIe
bandwidth, how much a newer GPU speeds each up; the sources are beside each number) and the
glue that turns the simulator's state into the product functions' inputs. The engine calls
it only when a mechanism or its physical model is switched on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slurm_plugin.placement import GpuRanking, gpu_ranking, is_pcie_heavy, prefer_gpu_type
from slurm_plugin.policy import ProfileView
from slurm_plugin.reserve import NodeLoad, expected_cpus_per_gpu, spare_cpus_per_node
from slurm_plugin.sim.workloads import CLASSES, GENERATIONS, JobModel, Workloads
from slurm_plugin.usage import UsageRecord

__all__ = [
    "TRAITS",
    "PlacementModel",
    "PlacementTraits",
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
