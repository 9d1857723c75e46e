"""Reference workloads and synthetic throughput-vs-cores curves.

The reference table is the one published by Xiao et al., "Scheduling CPU for GPU-based Deep
Learning jobs" (SoCC'18 poster): the number of CPU cores each model needs for its best
1-GPU performance on an Azure VM with one P100 and 24 cores.

The synthetic curves follow the poster's predictor, ``P0*log(C) + P1*C`` up to the sweet
spot and flat after it, continuous at the knee. That shape is what a pipelined trainer
gives when its data stage (read, decode, augment on the CPU) runs in parallel on ``C``
cores and the GPU stage is fixed: throughput is limited by the slower stage (Zhao et al.,
"CODA: Improving Resource Utilization by Slimming and Co-locating DNN and CPU Jobs",
section I.A, Fig. 2). The log term is the diminishing return of adding workers. The Muri
trace (``slurm_plugin/sim/data/muri/cluster_trace.csv``, SIGCOMM'22) shows both kinds of job: for
resnet18, shufflenet, a2c and dqn the data stage is several times longer than the GPU
stage, for bert and gpt2 it is negligible.

A ``softness`` above zero rounds the knee off (a real pipeline reaches its plateau
gradually because stage times vary from batch to batch); the fitted model has a hard knee,
so soft curves measure how the fit copes with a shape it does not exactly describe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MODEL_CLASSES",
    "REFERENCE_WORKLOADS",
    "SOCC18_HOST_CORES",
    "ReferenceWorkload",
    "cores_for_fraction",
    "noisy_samples",
    "relative_throughput",
    "throughput_at",
    "throughput_curve",
]

_SOCC18 = (
    'W. Xiao et al., "Scheduling CPU for GPU-based Deep Learning jobs", SoCC\'18 poster, '
    'table "CPU number required for best 1-GPU performance on P100 Azure VM (24 cores in total)"'
)

# Cores of the VM the SoCC'18 table was measured on: no sweet spot above it can be observed.
SOCC18_HOST_CORES = 24


@dataclass(frozen=True, slots=True)
class ReferenceWorkload:
    """One model from a published CPU-demand table."""

    name: str
    category: str
    sweet_spot_cores: int
    gpu: str
    host_cores: int
    source: str


REFERENCE_WORKLOADS: tuple[ReferenceWorkload, ...] = tuple(
    ReferenceWorkload(name, category, cores, "P100", SOCC18_HOST_CORES, _SOCC18)
    for name, category, cores in (
        ("Lenet", "CV", 20),
        ("Alexnet", "CV", 19),
        ("Overfeat", "CV", 22),
        ("Googlenet", "CV", 11),
        ("LanguageModel", "NLP", 1),
        ("Bi-Att-Flow", "NLP", 8),
        ("DeepSpeech", "Speech", 3),
        ("Wavenet", "Speech", 3),
    )
)

_CODA_FIG4 = (
    'H. Zhao et al., "CODA: Improving Resource Utilization by Slimming and Co-locating DNN '
    "and CPU Jobs\", ICDCS'20, section I.B and Fig. 4; knee assumed (see MODEL_CLASSES)"
)

MODEL_CLASSES: tuple[tuple[str, str, float, str], ...] = (
    *((w.name, w.category, float(w.sweet_spot_cores), w.source) for w in REFERENCE_WORKLOADS),
    ("VGG16", "CV", 4.0, _CODA_FIG4),
    ("ResNet50", "CV", 5.0, _CODA_FIG4),
    ("Inception3", "CV", 7.0, _CODA_FIG4),
    ("Transformer", "NLP", 2.0, _CODA_FIG4),
)
"""(name, category, knee in cores, source) of the twelve models whose 1-GPU CPU demand the
two characterisations describe: the eight of the SoCC'18 table, and the four more among the
models CODA characterises (AlexNet, VGG16, Inception3, ResNet50, BAT, the Transformer,
DeepSpeech, Wavenet; sections I and II). CODA gives their demand only as a figure (Fig. 4,
"the optimal CPU core number for different benchmarks"); its text says that the more
complex a CV model, the fewer cores it needs (Insight 2: VGG16, Inception3 and ResNet50
against AlexNet's 19 and GoogLeNet's 11 in the SoCC'18 table), and that the Transformer
needs cores for its preprocessing between iterations. Their knees here are assumptions
within that ordering, placed between the core counts 1, 3, 6 and 12 of the model's
fixed-probe benchmark, where a knee is hardest to locate (bench/bench_model.py)."""


def throughput_curve(
    sweet_spot_cores: float,
    cores: np.ndarray,
    *,
    peak: float = 1.0,
    log_share: float = 0.3,
    softness: float = 0.0,
) -> np.ndarray:
    """Noise-free throughput at each core count for a job whose plateau starts at the sweet spot.

    ``sweet_spot_cores`` is the knee θ: with ``softness=0`` throughput first reaches ``peak``
    there (the SoCC'18 table's "cores for best performance"). Below it the curve is
    ``peak * (log_share * log(C)/log(θ) + (1 - log_share) * C/θ)``, i.e. the poster's
    predictor with P0, P1 >= 0 and continuity at θ. ``softness`` in [0, 1) replaces the hard
    minimum with a smooth one (``(r**-k + 1)**(-1/k)``, ``k = 1/softness``), so throughput
    at θ is ``peak * 2**-softness`` and approaches ``peak`` beyond it.
    """
    if sweet_spot_cores < 1.0:
        raise ValueError(f"sweet spot must be at least 1 core, got {sweet_spot_cores}")
    if not 0.0 <= log_share <= 1.0:
        raise ValueError(f"log_share must be in [0, 1], got {log_share}")
    if not 0.0 <= softness < 1.0:
        raise ValueError(f"softness must be in [0, 1), got {softness}")
    c = np.asarray(cores, dtype=float)
    if np.any(c <= 0.0):
        raise ValueError("core counts must be positive")
    return peak * relative_throughput(float(sweet_spot_cores), log_share, softness, c)


def relative_throughput(
    knee_cores: float | np.ndarray,
    log_share: float | np.ndarray,
    softness: float | np.ndarray,
    cores: float | np.ndarray,
) -> np.ndarray:
    """:func:`throughput_curve` with ``peak`` 1, every argument broadcast against the others
    and not checked (knee >= 1, log share in [0, 1], softness in [0, 1), cores > 0): the
    shape family :func:`coda_common.model.fit.fit_curve` weighs, many curves at once."""
    theta = np.asarray(knee_cores, dtype=float)
    share = np.asarray(log_share, dtype=float)
    soft = np.asarray(softness, dtype=float)
    c = np.asarray(cores, dtype=float)
    log_theta = np.log(theta)
    flat = log_theta <= 0.0  # a knee at one core: flat everywhere a job can run
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = share * np.log(c) / np.where(flat, 1.0, log_theta) + (1.0 - share) * c / theta
    rise = np.where(flat, np.inf, rise)
    hard = np.minimum(rise, 1.0)
    if not np.any(soft > 0.0):
        return np.maximum(hard, 0.0)
    # (r**-k + 1)**(-1/k) with k = 1/softness, in log space: r**-k overflows for small
    # softness.
    s = np.where(soft > 0.0, soft, 1.0)
    log_r = np.log(np.maximum(rise, 1e-300))
    smooth = np.exp(-s * np.logaddexp(-log_r / s, 0.0))
    return np.maximum(np.where(soft > 0.0, smooth, hard), 0.0)


def throughput_at(sweet_spot_cores: float, cores: float, *, log_share: float = 0.3) -> float:
    """:func:`throughput_curve` at one core count, hard knee, ``peak`` 1, without numpy
    (the simulator calls it per job event). Same arguments' checks are the caller's."""
    if cores >= sweet_spot_cores or sweet_spot_cores <= 1.0:
        return 1.0
    c = max(cores, 1e-9)
    rise = log_share * math.log(c) / math.log(sweet_spot_cores) + (1.0 - log_share) * c / (
        sweet_spot_cores
    )
    return min(1.0, max(0.0, rise))


def noisy_samples(
    rng: np.random.Generator | int,
    sweet_spot_cores: float,
    cores: np.ndarray,
    noise_rel: float,
    *,
    peak: float = 1.0,
    log_share: float = 0.3,
    softness: float = 0.0,
) -> np.ndarray:
    """:func:`throughput_curve` times ``1 + noise_rel * N(0, 1)`` per sample, clipped at 0.

    ``rng`` is a numpy Generator or a seed for one, so results are reproducible.
    """
    if noise_rel < 0.0:
        raise ValueError(f"noise_rel must not be negative, got {noise_rel}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    clean = throughput_curve(
        sweet_spot_cores, cores, peak=peak, log_share=log_share, softness=softness
    )
    noise = 1.0 + noise_rel * gen.standard_normal(clean.shape)
    return np.maximum(clean * noise, 0.0)


def cores_for_fraction(
    sweet_spot_cores: float,
    *,
    max_cores: int,
    fraction: float = 0.95,
    log_share: float = 0.3,
    softness: float = 0.0,
) -> int:
    """Fewest whole cores in 1..max_cores reaching ``fraction`` of the best throughput there.

    This is the ground truth the fitted ``sweet_spot_cores`` (same ``fraction``) should hit;
    it is below the knee θ because the curve is within 5 % of the peak just before it.
    """
    if max_cores < 1:
        raise ValueError(f"max_cores must be at least 1, got {max_cores}")
    ks = np.arange(1, max_cores + 1, dtype=float)
    s = throughput_curve(sweet_spot_cores, ks, log_share=log_share, softness=softness)
    return int(ks[np.argmax(s >= fraction * s.max() - 1e-12)])
