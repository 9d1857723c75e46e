"""Placement decisions the submit hook adds to a job.  Pure: no I/O, stdlib only.

Slurm does the placing; these functions only say what to ask it for:

* :func:`is_pcie_heavy`: a multi-GPU job whose measured PCIe traffic would slow a second such
  job on the same node.  CODA (seed 000, section "The characterization of PCIe bandwidth
  demand and interference") measured AlexNet and ResNet50 in the one-node-two-GPU
  configuration at 8 GB/s on average and 12 GB/s at most, NLP and speech models below
  1 GB/s, and a 5-10 % slowdown when a job shares the node's PCIe with such a model.  The
  hook then asks for one unit of a count-only GRES whose per-node count is the node's PCIe
  domains, so Slurm never puts more heavy jobs on a node than it has domains.
* :func:`gpu_ranking`, :func:`prefer_gpu_type`: the GPU generation a job gains most (or
  least) from.  Takayama et al. (seed 004) ran MLPerf on P100 and V100: the V100/P100 time
  ratio ranged from 0.66 (image classification) to 1.01 (recommendation), and giving the
  newer GPUs to the jobs that gain most ("Priority Assignment") cut total execution time by
  8.24 % against an even assignment.  The hook turns that into Slurm's soft ``--prefer``.
* :func:`membw_units`: a memory-bound CPU job's share of a node's memory bandwidth, as units
  of a count-only GRES whose per-node count is the node's bandwidth, so Slurm never puts
  more memory-bound CPU work on a node than its memory system delivers.  CODA (seed 000,
  "Interference characterization") measured AlexNet and the NLP models slowed by about
  50 % as memory-bandwidth pressure grows, multi-GPU jobs more than one-GPU ones; the
  contention eliminator can only take that bandwidth back by slowing the CPU jobs, while
  spread out they saturate fewer nodes and need fewer holds (docs/evaluation.md, "Placement
  instead of throttling").
* :func:`route_cpu_job`: CPU-only jobs the user did not place are offered a list of
  partitions (e.g. a CPU partition over the GPU nodes' spare cores, see ``coda-slurm
  reserve``); Slurm starts them in whichever can run them first.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from coda_common.store.request import ProfileView
from coda_common.store.usage import UsageRecord

__all__ = [
    "GpuRanking",
    "gpu_ranking",
    "is_pcie_heavy",
    "membw_units",
    "prefer_gpu_type",
    "ranking_for",
    "route_cpu_job",
    "workload_speedup",
]


def is_pcie_heavy(
    usage: Sequence[UsageRecord],
    gpus_per_node: int,
    *,
    threshold_bytes_per_s: float,
    min_gpus: int = 2,
) -> bool:
    """True for a multi-GPU job (``gpus_per_node >= min_gpus``) whose measured PCIe traffic
    per GPU, times its GPUs per node, reaches ``threshold_bytes_per_s``.

    The traffic is the largest ``pcie_bytes_per_s_per_gpu`` over the records that measured
    it (the job may run on any of those GPU models).  No measurement: not heavy.  One-GPU
    jobs are never heavy: CODA found no slowdown between two one-GPU jobs on a node, since
    no model used more than half of a PCIe 3.0 link (seed 000).
    """
    if gpus_per_node < min_gpus:
        return False
    measured = [u.pcie_bytes_per_s_per_gpu for u in usage if u.pcie_bytes_per_s_per_gpu is not None]
    if not measured:
        return False
    return max(measured) * gpus_per_node >= threshold_bytes_per_s


def membw_units(
    bw_per_core_bytes_per_s: float | None,
    cores: int,
    *,
    heavy_bytes_per_s_per_core: float,
    unit_bytes_per_s: float,
    node_units: int,
) -> int:
    """Units of the count-only memory-bandwidth GRES a CPU job asks for on each node: its
    measured bandwidth per core times its cores per node, in ``unit_bytes_per_s``, rounded
    up and at most ``node_units`` (a job that alone fills a node's memory system asks for all
    of it, never for more than a node has, which Slurm would refuse).

    0 for a job that was not measured (None) or draws less than
    ``heavy_bytes_per_s_per_core`` per core: compute-bound jobs are placed as Slurm would.
    """
    if bw_per_core_bytes_per_s is None or cores < 1 or node_units < 1:
        return 0
    if not bw_per_core_bytes_per_s >= heavy_bytes_per_s_per_core:  # NaN is not heavy
        return 0
    if unit_bytes_per_s <= 0:
        raise ValueError(f"unit_bytes_per_s must be > 0, got {unit_bytes_per_s}")
    want = bw_per_core_bytes_per_s * cores / unit_bytes_per_s
    if not math.isfinite(want):  # an absurd measurement (1e308): all of a node, no more
        return node_units
    return min(node_units, max(1, math.ceil(want - 1e-9)))


@dataclass(frozen=True, slots=True)
class GpuRanking:
    """How much faster one GPU model runs the cluster's workloads than another.

    ``speedup[(fast, slow)]`` is the median over workloads (profiles) measured on both of
    ``iter_per_s_per_gpu[fast] / iter_per_s_per_gpu[slow]``; model names are lower case.
    Both orders of each pair are present.
    """

    speedup: Mapping[tuple[str, str], float]


def _rates(view: ProfileView) -> dict[str, float]:
    """``{lower-case GPU model: iter_per_s_per_gpu}`` for the exactly measured models."""
    rates: dict[str, float] = {}
    for u in view.usage:
        rate = u.iter_per_s_per_gpu
        if u.gpu_model is not None and rate is not None and rate > 0:
            rates[u.gpu_model.lower()] = rate
    return rates


def gpu_ranking(views: Iterable[ProfileView]) -> GpuRanking:
    """The cluster's :class:`GpuRanking`, from every profile with the exact progress signal
    (``iter_per_s_per_gpu``) on at least two GPU models.

    The proxy signal (GPU utilisation) is not used: it says how busy a GPU was, not how
    much work it did, so it cannot compare two generations.
    """
    ratios: dict[tuple[str, str], list[float]] = {}
    for view in views:
        if len(view.usage) < 2:
            continue  # the common case, kept cheap: 10k profiles are scanned per snapshot
        rates = _rates(view)
        for fast, fast_rate in rates.items():
            for slow, slow_rate in rates.items():
                if fast != slow:
                    ratios.setdefault((fast, slow), []).append(fast_rate / slow_rate)
    return GpuRanking(
        MappingProxyType({pair: statistics.median(values) for pair, values in ratios.items()})
    )


# One cached ranking: the profile snapshot it was computed from (kept referenced, so its
# id cannot be reused) and the ranking.  The hook's snapshot is replaced, never mutated.
_ranking_memo: tuple[Mapping[str, ProfileView], GpuRanking] | None = None


def ranking_for(profiles: Mapping[str, ProfileView]) -> GpuRanking:
    """:func:`gpu_ranking` of ``profiles.values()``, computed once per snapshot object.

    The submit hook calls this on every untyped GPU job; the store's cache hands out the
    same immutable mapping until a profile changes, so the scan runs once per change.
    """
    global _ranking_memo
    memo = _ranking_memo
    if memo is not None and memo[0] is profiles:
        return memo[1]
    ranking = gpu_ranking(profiles.values())
    _ranking_memo = (profiles, ranking)
    return ranking


def workload_speedup(view: ProfileView, fast: str, slow: str) -> float | None:
    """``iter_per_s_per_gpu`` on ``fast`` over that on ``slow`` for this workload (model
    names compared case-insensitively); None unless both were measured exactly."""
    rates = _rates(view)
    fast_rate = rates.get(fast.lower())
    slow_rate = rates.get(slow.lower())
    if fast_rate is None or slow_rate is None:
        return None
    return fast_rate / slow_rate


def prefer_gpu_type(
    view: ProfileView | None,
    ranking: GpuRanking,
    types: Sequence[str],
    *,
    margin: float = 0.05,
) -> tuple[str, str] | None:
    """The GPU type to prefer for this workload and why, or None.

    ``types`` are the admin's GPU types, fastest first (``PreferGpuTypes``).  Among those
    the workload was measured on, take the fastest and the slowest; compare the workload's
    speedup between them with the cluster's median for the same pair:

    * more than ``margin`` (relative) above the median: ``(fastest measured type, reason)``
      -- this job gains more than most from the newer GPU;
    * more than ``margin`` below: ``(slowest measured type, reason)`` -- leave the newer
      GPUs to jobs that gain more (Takayama et al., seed 004: giving newer GPUs to the
      sensitive jobs cut total time by 8.24 %);
    * otherwise None.

    None too for an unknown workload, fewer than two measured types, or no cluster median.
    """
    if view is None or not view.usage:
        return None
    rates = _rates(view)
    measured = [t.lower() for t in types if t.lower() in rates]
    if len(measured) < 2:
        return None
    fast, slow = measured[0], measured[-1]
    own = rates[fast] / rates[slow]
    median = ranking.speedup.get((fast, slow))
    if median is None:
        return None
    detail = f"{own:.2f}x faster on {fast} than on {slow}, cluster median {median:.2f}x"
    if own > median * (1.0 + margin):
        return fast, f"gains more than most from {fast} ({detail})"
    if own < median * (1.0 - margin):
        return slow, f"gains less than most from {fast} ({detail})"
    return None


def route_cpu_job(partition: str | None, route: Sequence[str]) -> str | None:
    """The partition list for a CPU-only job, or None to leave the job's partition alone.

    When the user named no partition and the admin configured ``route`` (e.g.
    ``("batch", "gpu_spare")``), the job gets ``"batch,gpu_spare"``: Slurm considers every
    listed partition and starts the job in whichever can run it first (sbatch(1),
    ``--partition``).  A partition the user named is never changed.
    """
    if partition or not route:
        return None
    return ",".join(route)
