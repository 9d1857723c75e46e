"""What the simulator assumes about jobs: CPU demand curves, contention, CPU jobs.

Every assumption is a field of :class:`JobModel` with its source or its reasoning, so a
result can always be traced back to a number someone can argue with (``coda-slurm simulate
--param NAME=VALUE`` changes any of them).

**DNN jobs.** A training job's throughput at ``C`` cores on one node is the SoCC'18
predictor shape (:func:`coda_common.model.curves.throughput_curve`): rising as ``log`` plus
linear up to the sweet spot ``θ``, flat after it. ``θ`` per GPU comes from the workload's
class: the SoCC'18 table of cores for best 1-GPU performance (P100, 24-core host), and on one
node it grows linearly with the GPUs (CODA §I.C: "in the case of a single node, its CPU
demand has a linear relationship with the GPU number"). Across nodes the demand per GPU is
at most ``multi_node_cores_per_gpu`` (CODA §I.C: in the multi-node configuration "the CPU
demands of all models do not exceed two cores").

**Contention.** A DNN job beside CPU jobs slows by ``sensitivity × pressure**exponent``,
where ``pressure`` is the memory bandwidth the CPU jobs on its node draw over what the node
can deliver (capped at 1). Sensitivities are CODA §II.B's: AlexNet up to ~50 % at the
highest pressure, NLP models at least 50 % on one GPU, the complex CV models insensitive on
one GPU, ~10 % on two and ~30 % on four; DeepSpeech more sensitive than Wavenet. The
exponent comes from the one pair of points CODA gives for one class (3 % at 75 % pressure,
10 % at the highest): ``ln(0.3) / ln(0.75) ≈ 4.2``.

**CPU jobs** run at full speed on the cores they are given, or at their CPU-quota share
when throttled; ``cpu_mem_bound_fraction`` of them are memory-bound (STREAM/HEAT-like,
drawing ``mem_bound_bw_per_core``), the rest compute-bound.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import numpy as np

from coda_common.model.curves import REFERENCE_WORKLOADS
from slurm_plugin.sim.traces import Trace

__all__ = [
    "CLASSES",
    "GENERATIONS",
    "JobModel",
    "WorkloadClass",
    "Workloads",
    "assign_workloads",
    "muri_classes",
    "starter_table",
]


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """A kind of DNN job: its CPU demand and how it suffers from memory contention."""

    name: str
    cores_per_gpu: float
    """Sweet spot θ per GPU on one node (cores for best throughput)."""
    sensitivity: tuple[float, float, float]
    """Slowdown at full memory-bandwidth pressure with 1, 2 and >= 4 GPUs on the node."""
    source: str

    def sensitivity_for(self, gpus_on_node: int) -> float:
        if gpus_on_node <= 1:
            return self.sensitivity[0]
        if gpus_on_node < 4:
            return self.sensitivity[1]
        return self.sensitivity[2]


_CODA = "Zhao et al., CODA (ICDCS'20), section II.B"
_SIMPLE_CV = (0.5, 0.5, 0.5)
"""AlexNet: up to ~50 % (CODA §II.B). LeNet and OverFeat are assumed alike: simple CV
networks whose bandwidth demand is anti-correlated with model complexity (CODA §II.A)."""
_COMPLEX_CV = (0.0, 0.10, 0.30)
_NLP = (0.5, 0.5, 0.5)
_SENSITIVITY: dict[str, tuple[tuple[float, float, float], str]] = {
    "Lenet": (_SIMPLE_CV, f"assumed as AlexNet ({_CODA})"),
    "Alexnet": (_SIMPLE_CV, _CODA),
    "Overfeat": (_SIMPLE_CV, f"assumed as AlexNet ({_CODA})"),
    "Googlenet": (_COMPLEX_CV, f"as VGG16/Inception3/ResNet50 ({_CODA})"),
    "LanguageModel": (_NLP, _CODA),
    "Bi-Att-Flow": (_NLP, _CODA),
    "DeepSpeech": ((0.3, 0.3, 0.3), f"assumed: 'more sensitive than Wavenet' ({_CODA})"),
    "Wavenet": ((0.1, 0.1, 0.1), f"assumed: 'degrades slightly' ({_CODA})"),
}

CLASSES: tuple[WorkloadClass, ...] = tuple(
    WorkloadClass(
        w.name,
        float(w.sweet_spot_cores),
        _SENSITIVITY[w.name][0],
        f"sweet spot: {w.source}; sensitivity: {_SENSITIVITY[w.name][1]}",
    )
    for w in REFERENCE_WORKLOADS
)
"""The SoCC'18 table's eight models with CODA's contention sensitivities."""


GENERATIONS = ("P100", "V100")
"""The GPU generations Takayama et al. measured MLPerf's training times on."""


@dataclass(frozen=True, slots=True)
class JobModel:
    """The simulator's named assumptions (see the module docstring for sources)."""

    class_weights: tuple[float, ...] = (1.0,) * len(CLASSES)
    """Share of each :data:`CLASSES` entry among jobs whose model the trace does not name
    (equal: the traces do not say what the jobs train)."""
    sweet_spot_jitter: float = 0.25
    """Each workload's θ is its class's times ``exp(N(0, jitter))``: no two scripts of
    "the same model" need exactly the same cores (input size, augmentation, batch)."""
    max_cores_per_gpu: float = 32.0
    """No workload's θ per GPU exceeds this."""
    log_share: float = 0.3
    """Weight of the log term below the knee
    (:func:`coda_common.model.curves.throughput_curve`)."""
    multi_node_cores_per_gpu: float = 2.0
    """Per-GPU demand of a job spread over several nodes is at most this (CODA §I.C)."""
    distinct_workload_fraction: float = 0.1
    """Unnamed jobs are runs of recurring workloads: the trace's GPU jobs come from
    ``fraction × jobs`` distinct workloads, chosen Zipf-like. An assumption (the public
    traces carry no job names); 1.0 means no workload ever recurs."""
    zipf_exponent: float = 1.1
    """Popularity of recurring workloads: the k-th most popular is chosen ∝ ``k**-s``."""
    pressure_exponent: float = 4.2
    """Slowdown = sensitivity × pressure**exponent (CODA: 3 % at 75 %, 10 % at 100 %)."""
    node_mem_bw_bytes_per_s: float = 200e9
    """What one GPU node's memory system delivers (two sockets of six DDR4 channels, as
    measured with STREAM: ~100 GB/s per socket)."""
    cpu_mem_bound_fraction: float = 0.5
    """Share of CPU jobs that are memory-bound (HEAT/STREAM-like)."""
    mem_bound_bw_per_core_bytes_per_s: float = 10e9
    """What one core of a memory-bound job draws (one STREAM thread: ~10 GB/s)."""
    compute_bound_bw_per_core_bytes_per_s: float = 0.5e9
    user_cpus_per_gpu: tuple[tuple[int, float], ...] = (
        (2, 0.05),
        (4, 0.20),
        (6, 0.20),
        (8, 0.15),
        (10, 0.10),
        (12, 0.20),
        (16, 0.10),
    )
    """Cores per GPU users ask for when the trace does not say (Philly): an assumed
    distribution around the Alibaba GPU trace's median of ~10 requested CPUs per GPU."""
    muri_testbed_cores_per_gpu: float = 2.0
    """Cores per GPU the Muri testbed's data stage ran on (not published; assumed). A Muri
    model's θ per GPU is this times its data-stage time over its GPU-stage time: the cores
    that make the data stage keep up with the GPU."""
    time_limit_factor: float = 2.0
    """Users' time limits (what backfill plans with) are this times the real run time."""
    script_names_model: float = 1.0
    """Share of workloads whose job names the model it trains: its batch script's
    ``srun python train.py --arch MODEL`` line, as the common reference training scripts
    choose the network (pytorch/examples' ImageNet script: ``--arch``). A stable draw per
    workload. The SoCC'18 class a workload is given (Philly, Alibaba: the traces name no
    model; an sacct export names jobs, not models) is what its script names; a workload
    the trace names after its model (Muri) names it in its job name too, and one that
    draws "no" there gets a name of its own (``job-ID``) and a script that names nothing.
    An assumption: no public trace records scripts."""
    # -- placement (slurm_plugin/sim/mechanisms.py has the per-model tables) ------
    pcie_heavy_bytes_per_s_per_gpu: float = 8e9
    """PCIe traffic per GPU of a PCIe-heavy model (CODA §II.C: AlexNet and ResNet50 average
    8 GB/s, at most 12 GB/s, in the 1-node 2-GPU case)."""
    pcie_light_bytes_per_s_per_gpu: float = 0.5e9
    """PCIe traffic per GPU of the other models (CODA §II.C: NLP and speech models "less
    than 1 GB/s")."""
    pcie_domains_per_node: int = 1
    """PCIe-heavy multi-GPU jobs a node carries without interference; also the count of the
    count-only ``pcie`` GRES each node offers (1: one root complex shared by all GPUs)."""
    pcie_slowdown: float = 0.075
    """Slowdown of each heavy multi-GPU job on a node that runs more of them than it has
    PCIe domains (CODA §II.C: 5-10 % when co-running with a higher PCIe demand model)."""
    gpu_generations: tuple[tuple[str, str], ...] = (
        ("P100", "P100"),
        ("V100M16", "V100"),
        ("V100M32", "V100"),
        ("T4", "P100"),
        ("A10", "V100"),
        ("G1", "V100"),
        ("G2", "V100"),
        ("G3", "V100"),
    )
    """Trace GPU model -> the generation Takayama et al. measured (P100 or V100). P100 and
    V100 are measured; T4 (8.1 FP32 TFLOPS, 320 GB/s: below a P100's 9.3 and 720 GB/s) is
    assumed P100-like; A10 and Alibaba's undisclosed G1-G3 (8-GPU 96-core nodes like the
    V100M32 ones) are assumed no faster than a V100. Models not listed run at trace speed."""
    # -- GPU sharing (placement mechanism 4; slurm_plugin/sim/mechanisms.py, ShareModel) -----
    share_switch_overhead: float = 0.05
    """ε: each GPU phase of a job that shares its GPU (time-slicing, no MPS) takes this much
    longer for the context switches. Tabrizian (MASc thesis, Toronto 2020) measured a small
    slowdown for every pair of saturating jobs at batch size 512 (fig. 4.3, sec. 4.2)."""
    share_gpu_busy: float = 1.0
    """GPU busy share (NVML ``utilization.gpu``) at the sweet spot of the SoCC'18 classes
    (Philly, Alibaba), each alone. Assumed: at its sweet spot a job is GPU-bound (the
    throughput curve is flat there: more cores do not help). Muri's models take theirs
    from the trace's stage times instead."""
    share_mem_weight: tuple[tuple[str, float], ...] = (
        ("lenet", 0.35),
        ("alexnet", 0.35),
        ("overfeat", 0.35),
        ("googlenet", 0.55),
        ("languagemodel", 0.45),
        ("bi-att-flow", 0.45),
        ("deepspeech", 0.45),
        ("wavenet", 0.45),
        ("resnet18", 0.40),
        ("shufflenet_v2_x1_0", 0.55),
        ("vgg16", 0.25),
        ("vgg19", 0.25),
        ("bert", 0.45),
        ("gpt2", 0.45),
        ("a2c", 0.30),
        ("dqn", 0.30),
    )
    """The thesis's M (eq. 4.2: kernel-time-weighted memory-bandwidth utilisation) per model
    (lower-case name); NVML's memory busy share is ``u × M``. Assumed, keeping only the
    orderings the thesis states: ResNet-50 highest, VGG lowest (sec. 4.2, figs. 4.5-4.8),
    and M growing with the batch size (fig. 4.8). GoogLeNet and ShuffleNet as ResNet-50
    (deep nets of small kernels); AlexNet, LeNet, OverFeat near VGG (few large layers);
    ResNet-18 between; the RNN, speech and Transformer models in the middle (the thesis
    did not measure them); the RL models (small networks) low."""
    share_mem_weight_default: float = 0.45
    """M of a model not in ``share_mem_weight`` (the middle of its range)."""

    def with_params(self, overrides: dict[str, str]) -> JobModel:
        """A copy with ``NAME=VALUE`` overrides; ValueError naming the bad one."""
        known = {f.name: f for f in fields(self)}
        changes: dict[str, object] = {}
        for name, text in overrides.items():
            f = known.get(name)
            if f is None:
                raise ValueError(
                    f"unknown simulator parameter {name!r}; known: {', '.join(sorted(known))}"
                )
            current = getattr(self, name)
            try:
                if isinstance(current, float):
                    changes[name] = _float_param(name, text)
                elif isinstance(current, int):
                    changes[name] = int(text)
                elif name == "gpu_generations":
                    gens = []
                    for part in text.split(","):
                        gpu, _, gen = part.partition(":")
                        if gen not in GENERATIONS:
                            raise ValueError(
                                f"expected MODEL:GENERATION pairs, GENERATION one of "
                                f"{', '.join(GENERATIONS)}"
                            )
                        gens.append((gpu.strip(), gen))
                    changes[name] = tuple(gens)
                elif name == "share_mem_weight":
                    weights = []
                    for part in text.split(","):
                        model_name, _, value = part.partition(":")
                        if not model_name.strip() or not value:
                            raise ValueError("expected MODEL:M pairs, e.g. vgg16:0.25")
                        weight = _float_param("share_mem_weight_default", value)
                        weights.append((model_name.strip().lower(), weight))
                    # The models named replace theirs; the others keep the table's.
                    changes[name] = tuple({**dict(current), **dict(weights)}.items())
                elif isinstance(current, tuple) and name == "class_weights":
                    vals = tuple(float(v) for v in text.split(","))
                    if len(vals) != len(CLASSES):
                        raise ValueError(f"needs {len(CLASSES)} comma-separated weights")
                    changes[name] = vals
                elif isinstance(current, tuple):
                    pairs = []
                    for part in text.split(","):
                        k, _, w = part.partition(":")
                        pairs.append((int(k), float(w)))
                    changes[name] = tuple(pairs)
                else:
                    raise ValueError("cannot be set from the command line")
            except ValueError as exc:
                raise ValueError(f"simulator parameter {name}={text!r}: {exc}") from None
        return replace(self, **changes)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class Workloads:
    """Per-job workload facts for one trace (columnar, aligned with the trace's jobs)."""

    workload: np.ndarray
    """int32 workload id per job (-1 for CPU jobs)."""
    names: list[str]
    """Name of each workload id."""
    klass: np.ndarray
    """int16 class index per workload id."""
    cores_per_gpu: np.ndarray
    """float64 true sweet spot θ per GPU per workload id."""
    sensitivity: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    """float64 (classes, 3) slowdown at full pressure for 1, 2, >= 4 GPUs."""
    user_cpus_per_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """float64 per job: what the user asked per GPU (GPU jobs), sampled when unknown."""
    cpu_bw_per_core: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """float64 per job: memory bandwidth per core of CPU jobs (0 for GPU jobs)."""
    models: list[str] = field(default_factory=list)
    """Per workload id: the model it trains, lower-case, as a script would name it: the
    trace's name where the caller's classes say it is a model (Muri), else its class's."""
    names_model: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Per workload id: its job names its model (``JobModel.script_names_model``)."""
    model_cores_per_gpu: dict[str, float] = field(default_factory=dict)
    """Per model: the cores per GPU a table of models would give it: its class's sweet
    spot (SoCC'18), not a workload's own jittered one; Muri's models their own θ."""

    def label(self, wid: int) -> str:
        """The name workload ``wid``'s jobs go by (job name and ``coda:workload=``): its
        own name, unless that is its model's and its jobs do not name their model."""
        name = self.names[wid]
        if self.names_model.size and not self.names_model[wid] and name.lower() == self.models[wid]:
            return f"job-{wid}"
        return name

    def script(self, wid: int) -> str:
        """Workload ``wid``'s batch script as the hook reads it."""
        if self.names_model.size and self.names_model[wid]:
            return f"#!/bin/bash\nsrun python train.py --arch {self.models[wid]}\n"
        return "#!/bin/bash\nsrun python train.py\n"

    def sweet_spot(self, job: int, gpus_on_node: int, nodes: int, model: JobModel) -> float:
        """θ in cores on one node for ``job`` holding ``gpus_on_node`` GPUs there."""
        per_gpu = float(self.cores_per_gpu[self.workload[job]])
        if nodes > 1:
            per_gpu = min(per_gpu, model.multi_node_cores_per_gpu)
        return max(1.0, per_gpu * gpus_on_node)


def muri_classes(
    stages: dict[str, tuple[float, float, float]], model: JobModel
) -> dict[str, tuple[float, tuple[float, float, float]]]:
    """``name -> (θ per GPU, sensitivity)`` for Muri's models from their stage times (ms).

    A model whose data (CPU) stage is longer than its GPU stage is CPU-bound: it gets the
    sensitivity of CODA's bandwidth-hungry jobs (AlexNet, NLP); the others that of the
    complex CV models (VGG16, ResNet50), which CODA found insensitive on one GPU.
    """
    out: dict[str, tuple[float, tuple[float, float, float]]] = {}
    for name, (data_ms, gpu_ms, _comm_ms) in stages.items():
        ratio = data_ms / max(gpu_ms, 1e-3)
        theta = min(model.max_cores_per_gpu, max(1.0, model.muri_testbed_cores_per_gpu * ratio))
        out[name] = (theta, _SIMPLE_CV if ratio > 1.0 else _COMPLEX_CV)
    return out


def _stable_seed(*parts: object) -> int:
    return zlib.crc32("\0".join(str(p) for p in parts).encode())


def assign_workloads(
    trace: Trace,
    model: JobModel,
    seed: int,
    *,
    named_classes: dict[str, tuple[float, tuple[float, float, float]]] | None = None,
) -> Workloads:
    """Give every GPU job a workload (and every workload a class and a true θ).

    Jobs the trace names keep their name as the workload; ``named_classes`` maps such a
    name to ``(θ per GPU, sensitivity)`` when the caller knows it (Muri's stage times), else
    the name picks a class by a stable hash. Unnamed GPU jobs draw from a pool of
    ``distinct_workload_fraction × jobs`` synthetic workloads, Zipf-popular. CPU jobs get
    their memory behaviour. The same seed gives the same answer.
    """
    gpus, cpus = trace.gpus, trace.cpus
    trace_workload = trace.workload
    rng = np.random.default_rng(seed)
    n = len(gpus)
    is_gpu = gpus > 0
    weights = np.asarray(model.class_weights, dtype=float)
    if weights.shape != (len(CLASSES),) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("class_weights must be non-negative, one per class, not all zero")
    weights = weights / weights.sum()

    table = _WorkloadTable()
    workload = np.full(n, -1, dtype=np.int32)
    lut = table.add_named(trace.workload_names, model, seed, weights, named_classes or {})
    named = is_gpu & (trace_workload >= 0)
    if named.any():
        workload[named] = lut[trace_workload[named]]
    unnamed = np.flatnonzero(is_gpu & (trace_workload < 0))
    if len(unnamed):
        base = len(table.names)
        picks = table.add_pool(rng, len(unnamed), model, seed, weights)
        workload[unnamed] = base + picks.astype(np.int32)
    sens = np.array([c.sensitivity for c in CLASSES] + table.extra_sens, dtype=float)
    user = _user_cpus_per_gpu(rng, gpus, cpus, is_gpu, model)
    draws = np.array(
        [np.random.default_rng(_stable_seed(seed, "names-model", w)).random() for w in table.names]
    )
    return Workloads(
        workload=workload,
        names=table.names,
        klass=np.array(table.klass, dtype=np.int16),
        cores_per_gpu=np.array(table.theta, dtype=float),
        sensitivity=sens.reshape(-1, 3),
        user_cpus_per_gpu=user,
        cpu_bw_per_core=_cpu_bw_per_core(rng, is_gpu, model),
        models=table.models,
        names_model=draws < model.script_names_model,
        model_cores_per_gpu=table.model_theta,
    )


def starter_table(wl: Workloads, error: float, seed: int) -> dict[str, int]:
    """A table of models' cores per GPU, as an admin would import it: each model of ``wl``
    at its :attr:`Workloads.model_cores_per_gpu`, times ``1 + error`` or ``1 - error`` by
    a fair coin per model and seed (0: exact), rounded up as ``coda-slurm profiles
    starter --scale`` rounds (:func:`coda_common.model.starter.scaled_cores`)."""
    if not (math.isfinite(error) and 0.0 <= error < 1.0):
        raise ValueError(f"a starter table's error is a share from 0 to below 1, got {error!r}")
    table: dict[str, int] = {}
    for name, cores in sorted(wl.model_cores_per_gpu.items()):
        if error:
            up = np.random.default_rng(_stable_seed(seed, "starter-error", name)).random() < 0.5
            cores *= (1.0 + error) if up else (1.0 - error)
        table[name] = max(1, math.ceil(cores - 1e-9))
    return table


@dataclass(slots=True)
class _WorkloadTable:
    """The workloads :func:`assign_workloads` builds, one entry per workload id."""

    names: list[str] = field(default_factory=list)
    klass: list[int] = field(default_factory=list)
    """Index into CLASSES, or past it into ``extra_sens`` (a caller's named class)."""
    theta: list[float] = field(default_factory=list)
    """True cores per GPU."""
    extra_sens: list[tuple[float, float, float]] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    """The model each workload trains, lower-case."""
    model_theta: dict[str, float] = field(default_factory=dict)
    """Cores per GPU of each model: its class's, or the caller's for a named class."""

    def add_named(
        self,
        trace_names: list[str],
        model: JobModel,
        seed: int,
        weights: np.ndarray,
        named_classes: dict[str, tuple[float, tuple[float, float, float]]],
    ) -> np.ndarray:
        """Add the trace's named workloads; the workload id of each trace name index.

        A name in ``named_classes`` gets its θ and sensitivity; any other picks a class by
        a stable hash of the name."""
        ids: list[int] = []
        for name in trace_names:
            ids.append(len(self.names))
            self.names.append(name)
            known = named_classes.get(name)
            if known is not None:
                # The caller's classes are models (Muri's): the name is the model's.
                self.klass.append(len(CLASSES) + len(self.extra_sens))
                self.extra_sens.append(known[1])
                theta = float(min(model.max_cores_per_gpu, max(1.0, known[0])))
                self.theta.append(theta)
                self.models.append(name.lower())
                self.model_theta[name.lower()] = theta
            else:
                # A job name (an sacct export's): it trains its class's model.
                r = np.random.default_rng(_stable_seed(seed, "class", name))
                k = int(r.choice(len(CLASSES), p=weights))
                self.klass.append(k)
                self.theta.append(_jittered(CLASSES[k].cores_per_gpu, name, model, seed))
                self.models.append(CLASSES[k].name.lower())
                self.model_theta[CLASSES[k].name.lower()] = CLASSES[k].cores_per_gpu
        return np.array(ids, dtype=np.int32)

    def add_pool(
        self, rng: np.random.Generator, n_jobs: int, model: JobModel, seed: int, weights: np.ndarray
    ) -> np.ndarray:
        """Add a Zipf-popular pool of synthetic recurring workloads for ``n_jobs`` unnamed
        GPU jobs; each job's pick, an index into the pool."""
        pool = max(1, round(model.distinct_workload_fraction * n_jobs))
        ranks = np.arange(1, pool + 1, dtype=float)
        pop = ranks**-model.zipf_exponent
        pop /= pop.sum()
        picks = rng.choice(pool, size=n_jobs, p=pop)
        pool_classes = rng.choice(len(CLASSES), size=pool, p=weights)
        for i in range(pool):
            name = f"w{i:06d}"
            self.names.append(name)
            k = int(pool_classes[i])
            self.klass.append(k)
            self.models.append(CLASSES[k].name.lower())
            self.model_theta[CLASSES[k].name.lower()] = CLASSES[k].cores_per_gpu
            self.theta.append(_jittered(CLASSES[k].cores_per_gpu, name, model, seed))
        return picks


def _jittered(base: float, key: str, model: JobModel, seed: int) -> float:
    """``base`` cores per GPU with the workload's own stable jitter, within 1..max."""
    r = np.random.default_rng(_stable_seed(seed, key))
    value = base * math.exp(model.sweet_spot_jitter * float(r.standard_normal()))
    return float(min(model.max_cores_per_gpu, max(1.0, value)))


def _user_cpus_per_gpu(
    rng: np.random.Generator,
    gpus: np.ndarray,
    cpus: np.ndarray,
    is_gpu: np.ndarray,
    model: JobModel,
) -> np.ndarray:
    """What users asked per GPU: the trace's request, or a draw from the assumed mix."""
    user = np.zeros(len(gpus), dtype=float)
    known_cpus = is_gpu & (cpus > 0)
    user[known_cpus] = np.maximum(1.0, np.ceil(cpus[known_cpus] / gpus[known_cpus]))
    unknown = np.flatnonzero(is_gpu & ~known_cpus)
    if len(unknown):
        vals = np.array([v for v, _ in model.user_cpus_per_gpu], dtype=float)
        ps = np.array([p for _, p in model.user_cpus_per_gpu], dtype=float)
        user[unknown] = rng.choice(vals, size=len(unknown), p=ps / ps.sum())
    return user


def _cpu_bw_per_core(rng: np.random.Generator, is_gpu: np.ndarray, model: JobModel) -> np.ndarray:
    """Memory bandwidth per core of the CPU jobs: memory-bound or compute-bound by draw."""
    cpu_jobs = np.flatnonzero(~is_gpu)
    bw = np.zeros(len(is_gpu), dtype=float)
    if len(cpu_jobs):
        mem_bound = rng.random(len(cpu_jobs)) < model.cpu_mem_bound_fraction
        bw[cpu_jobs] = np.where(
            mem_bound,
            model.mem_bound_bw_per_core_bytes_per_s,
            model.compute_bound_bw_per_core_bytes_per_s,
        )
    return bw


def _fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0


def _bytes_per_s(value: float) -> bool:
    return value <= 1e15


_FLOAT_PARAM_CHECKS: dict[str, tuple[Callable[[float], bool], str]] = {
    "sweet_spot_jitter": (lambda v: v <= 5.0, "at most 5"),
    "node_mem_bw_bytes_per_s": (lambda v: 0.0 < v <= 1e15, "more than 0 and at most 1e15"),
    "mem_bound_bw_per_core_bytes_per_s": (_bytes_per_s, "at most 1e15"),
    "compute_bound_bw_per_core_bytes_per_s": (_bytes_per_s, "at most 1e15"),
    "pcie_heavy_bytes_per_s_per_gpu": (_bytes_per_s, "at most 1e15"),
    "pcie_light_bytes_per_s_per_gpu": (_bytes_per_s, "at most 1e15"),
    "share_switch_overhead": (_fraction, "within 0..1"),
    "share_gpu_busy": (lambda v: 0.0 < v <= 1.0, "more than 0 and at most 1"),
    "share_mem_weight_default": (_fraction, "within 0..1"),
    "script_names_model": (_fraction, "a share within 0..1"),
}
"""The float parameters with a narrower range than any finite number >= 0."""


def _float_param(name: str, text: str) -> float:
    """A float simulator parameter: a finite number, 0 or more, within the range
    :data:`_FLOAT_PARAM_CHECKS` gives ``name``; ValueError otherwise."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite number, 0 or more, got {text!r}")
    ok, what = _FLOAT_PARAM_CHECKS.get(name, (lambda _v: True, ""))
    if not ok(value):
        raise ValueError(f"expected {what}, got {text!r}")
    return value
