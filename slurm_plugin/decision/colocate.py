"""Whether two workloads gain from sharing one GPU (placement mechanism 4). Pure.

Source: I. Tabrizian, *Co-location of Deep Learning Jobs in GPU Clusters*, MASc thesis,
University of Toronto, 2020 (the seed text). What it gives:

* The speedup of running a set ``S`` of jobs together over running them one after another,
  eq. (4.1): ``delta = sum_j t_j / max_j t'_j`` (``t_j``: one iteration alone, ``t'_j``: one
  iteration while co-located). ``delta > 1``: sharing is better.
* The job-level metric that explains its measurements, eq. (4.2): the kernel-time-weighted
  memory-bandwidth utilisation ``M = sum_i p_i t_i / sum_i t_i``; pairs with the partner of
  highest ``M`` (ResNet-50) are the slowest, those with VGG11 the fastest (section 4.2,
  figs. 4.5, 4.6 and 4.8); ``M`` and the GPU's utilisation both grow with the batch size
  (fig. 4.8, section 3.1.1), and at batch size 512 every pair measured slowed down slightly
  (fig. 4.3, no MPS).

What it does not give: a closed-form predictor. Its sections 4.2.3 and 4.2.4 ("Identifying
Relationship between Models and Speedup") have no body in the text, and the figures' values
are not in it. So the model below is ours, derived from eqs. (4.1)-(4.2) and the statements
above, and kept conservative (it charges both ways two jobs slow each other):

The daemon measures NVML's ``utilization.gpu`` ``u`` (share of time a kernel runs) and
``utilization.memory`` ``m`` (share of time device memory is read or written). Over one
iteration, ``u`` is ``sum t_i / t`` and ``m`` is about ``sum p_i t_i / t``, so the thesis's
``M`` is ``m / u`` and ``m`` is the *memory-bandwidth-weighted GPU utilisation*
``u * M``. For two jobs sharing a GPU, with one iteration of each normalised to 1
(the thesis pairs models at equal batch sizes; see :func:`predict_speedup`):

* each iteration still takes at least its own time: 1;
* time-slicing (no MPS; thesis fig. 2.4: work of different CUDA contexts never overlaps)
  makes a kernel wait while the other job's kernel runs: with independent busy phases, the
  expected wait is ``u_a * u_b`` of an iteration;
* memory bandwidth is one resource even under MPS (fig. 2.5): while both jobs move data at
  once, each gets half, which costs ``m_a * m_b`` of an iteration.

So ``t' = 1 + u_a*u_b + m_a*m_b`` and ``delta = 2 / t'``. Two jobs that keep the GPU busy
(``u = 1``) and move data (``m > 0``) get ``delta < 1``, the thesis's "minor slowdown" at
batch 512; two half-idle jobs (``u = 0.5, m = 0.2``) get ``delta = 1.55``. Charging both
terms makes the prediction low for MPS (which overlaps kernels and so removes most of the
``u_a*u_b`` wait; the thesis measured larger speedups with MPS, fig. 4.4 against 4.3).
Without MPS it can err the other way: the wait term assumes a job's idle time is free for
its partner, but on an H200 a ResNet-50 that left the GPU idle a third of the time between
its kernels lost as much as a busy job would, and the pair lost 8-9 % where this model
predicted a 9-15 % gain. docs/evaluation.md has its checks against the thesis and against
those measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "VERDICTS",
    "PairVerdict",
    "ShareCandidate",
    "judge_pairs",
    "predict_speedup",
    "shareable_workloads",
]

VERDICTS = ("share", "neutral", "avoid")
"""``share``: delta >= 1 + margin; ``avoid``: delta < 1; ``neutral``: in between."""


@dataclass(frozen=True, slots=True)
class ShareCandidate:
    """One workload's GPU usage while it runs alone at its allocation (means over time)."""

    workload: str
    gpu_util: float
    """0..1, NVML ``utilization.gpu``: share of time a kernel was running."""
    gpu_mem_bw_util: float
    """0..1, NVML ``utilization.memory``: share of time device memory was read or written."""

    def __post_init__(self) -> None:
        for name in ("gpu_util", "gpu_mem_bw_util"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"{self.workload}: {name} must be within 0..1, got {value!r}")


@dataclass(frozen=True, slots=True)
class PairVerdict:
    a: str
    b: str
    speedup: float
    """Predicted delta (thesis eq. 4.1) of running ``a`` and ``b`` on one GPU together."""
    verdict: str
    """One of :data:`VERDICTS`."""
    reason: str


def predict_speedup(a: ShareCandidate, b: ShareCandidate) -> float:
    """Predicted ``delta`` (thesis eq. 4.1) for ``a`` and ``b`` sharing one GPU: the time
    to run one iteration of each one after another over the time to run them together.

    ``2 / (1 + u_a*u_b + m_a*m_b)`` (module docstring). It assumes iterations of equal
    length alone: eq. (4.1) with ``t_a != t_b`` also depends on their ratio, which NVML
    utilisation does not give. Symmetric; between 2/3 (two saturating, memory-bound jobs)
    and 2 (two idle ones).
    """
    wait = a.gpu_util * b.gpu_util
    bandwidth = a.gpu_mem_bw_util * b.gpu_mem_bw_util
    return 2.0 / (1.0 + wait + bandwidth)


def _verdict(speedup: float, margin: float) -> str:
    if speedup < 1.0:
        return "avoid"
    if speedup >= 1.0 + margin:
        return "share"
    return "neutral"


def _reason(a: ShareCandidate, b: ShareCandidate, verdict: str) -> str:
    wait = a.gpu_util * b.gpu_util
    bandwidth = a.gpu_mem_bw_util * b.gpu_mem_bw_util
    terms = f"an iteration together takes {1 + wait + bandwidth:.2f}x (GPU wait {wait:.2f}, "
    terms += f"bandwidth {bandwidth:.2f}) against 2x one after another"
    if verdict == "avoid":
        return f"{terms}: sharing is slower"
    if verdict == "share":
        return f"{terms}: each fills the other's idle time"
    return f"{terms}: gain within the margin"


def judge_pairs(cands: Sequence[ShareCandidate], *, margin: float = 0.05) -> list[PairVerdict]:
    """Every unordered pair of ``cands``, a workload with itself included (two instances
    of it on one GPU), best first (highest predicted delta; ties by names).

    ``margin`` (>= 0): the gain below which sharing is not worth its risk (``neutral``).
    """
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    out: list[PairVerdict] = []
    for i, a in enumerate(cands):
        for b in cands[i:]:
            speedup = predict_speedup(a, b)
            verdict = _verdict(speedup, margin)
            out.append(
                PairVerdict(
                    a=a.workload,
                    b=b.workload,
                    speedup=speedup,
                    verdict=verdict,
                    reason=_reason(a, b, verdict),
                )
            )
    out.sort(key=lambda v: (-v.speedup, v.a, v.b))
    return out


def shareable_workloads(cands: Sequence[ShareCandidate], *, margin: float) -> list[str]:
    """The workloads of ``cands`` whose verdict with *themselves* (two of their jobs on one
    GPU) is ``share``, in the order given: a set of workloads that may all share GPUs with
    each other.

    This is what Slurm can act on. It cannot pair jobs; it can only let a set of jobs use
    ``shard`` GRES (or an MPS partition), and any two of them may then meet on a GPU. Every
    such pair is predicted to gain too: with ``x = (u, m)`` per workload,
    ``delta(a, b) = 2 / (1 + x_a . x_b)`` and, by Cauchy-Schwarz,
    ``x_a . x_b <= |x_a| |x_b| <= max(|x_a|^2, |x_b|^2)``, so
    ``delta(a, b) >= min(delta(a, a), delta(b, b)) >= 1 + margin``.
    """
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    return [c.workload for c in cands if _verdict(predict_speedup(c, c), margin) == "share"]
