"""Usage records: what a workload did with its GPUs, per GPU model (profile format v2), and
the memory bandwidth it drew as a CPU job (format v4).

A leaf module (stdlib only) so that both :mod:`coda_common.store.request` (the hook's
``ProfileView``) and :mod:`coda_common.store.profiles` (the file format) can import it without a
cycle; :mod:`coda_common.store.profiles` re-exports :class:`UsageRecord`.

The placement mechanisms read these records: PCIe traffic marks jobs that should
not share a node's PCIe domain (CODA measured AlexNet/ResNet50 at 8-12 GB/s and a 5-10 %
slowdown when two of them share it), progress per GPU model ranks GPU generations per
workload (Takayama et al.), and GPU / memory-bandwidth utilisation predicts whether two jobs
can share one GPU (Tabrizian et al.).  A CPU workload's memory bandwidth per allocated CPU
(:class:`CpuUsageRecord`) sizes its share of the memory-bandwidth GRES
(:func:`slurm_plugin.decision.placement.membw_units`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CpuUsageRecord",
    "UsageRecord",
    "merge_cpu_usage",
    "merge_into",
    "merge_usage_records",
    "usage_for_model",
]


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """What coda-node measured while the workload ran at its allocation on one GPU model
    (means over ticks when the job was neither probed nor throttled)."""

    gpu_model: str | None
    gpu_util: float
    """0..1, NVML utilization.gpu of the job's GPUs."""
    gpu_mem_bw_util: float
    """0..1, NVML utilization.memory (device memory controller busy)."""
    pcie_bytes_per_s_per_gpu: float | None
    """NVML PCIe rx+tx per GPU; None = not measured."""
    iter_per_s_per_gpu: float | None
    """Exact progress signal per GPU; None = only the proxy was available."""
    ticks: int
    """How many ticks the means cover (>= 1)."""
    updated_unix_s: float


@dataclass(frozen=True, slots=True)
class CpuUsageRecord:
    """What coda-node measured while the workload ran as a CPU job (no GPU), unthrottled:
    the mean over ticks of its memory bandwidth (resctrl MBM of its monitoring group)
    divided by the CPUs Slurm allocated it on the node."""

    mem_bw_bytes_per_s_per_cpu: float
    ticks: int
    """How many ticks the mean covers (>= 1)."""
    updated_unix_s: float


def merge_cpu_usage(old: CpuUsageRecord | None, new: CpuUsageRecord) -> CpuUsageRecord:
    """``old`` and ``new`` as one record: the mean weighted by ticks, ticks added, the newer
    timestamp; ``new`` alone when there is no ``old``."""
    if old is None:
        return new
    return CpuUsageRecord(
        mem_bw_bytes_per_s_per_cpu=_mean(
            old.mem_bw_bytes_per_s_per_cpu, old.ticks, new.mem_bw_bytes_per_s_per_cpu, new.ticks
        ),
        ticks=old.ticks + new.ticks,
        updated_unix_s=max(old.updated_unix_s, new.updated_unix_s),
    )


def _model_key(gpu_model: str | None) -> str | None:
    # NVML names and admins' spellings differ in case ("NVIDIA A100" vs "nvidia a100"):
    # one record per model regardless of case.
    return None if gpu_model is None else gpu_model.lower()


def _mean(old: float, old_n: int, new: float, new_n: int) -> float:
    return (old * old_n + new * new_n) / (old_n + new_n)


def _known_mean(old: float | None, old_n: int, new: float | None, new_n: int) -> float | None:
    if old is None:
        return new
    if new is None:
        return old
    return _mean(old, old_n, new, new_n)


def merge_usage_records(old: UsageRecord, new: UsageRecord) -> UsageRecord:
    """``old`` and ``new`` (same GPU model) as one record: each mean weighted by its ticks;
    a field only one of them measured keeps that value; ticks add; the newer timestamp wins.
    The GPU model keeps ``new``'s spelling."""
    n_old, n_new = old.ticks, new.ticks
    return UsageRecord(
        gpu_model=new.gpu_model,
        gpu_util=_mean(old.gpu_util, n_old, new.gpu_util, n_new),
        gpu_mem_bw_util=_mean(old.gpu_mem_bw_util, n_old, new.gpu_mem_bw_util, n_new),
        pcie_bytes_per_s_per_gpu=_known_mean(
            old.pcie_bytes_per_s_per_gpu, n_old, new.pcie_bytes_per_s_per_gpu, n_new
        ),
        iter_per_s_per_gpu=_known_mean(
            old.iter_per_s_per_gpu, n_old, new.iter_per_s_per_gpu, n_new
        ),
        ticks=n_old + n_new,
        updated_unix_s=max(old.updated_unix_s, new.updated_unix_s),
    )


def merge_into(records: Sequence[UsageRecord], record: UsageRecord) -> tuple[UsageRecord, ...]:
    """``records`` with ``record`` merged into the one of the same GPU model (case-insensitive),
    or appended when there is none; the other models are kept in their order."""
    key = _model_key(record.gpu_model)
    out: list[UsageRecord] = []
    merged = False
    for r in records:
        if not merged and _model_key(r.gpu_model) == key:
            out.append(merge_usage_records(r, record))
            merged = True
        else:
            out.append(r)
    if not merged:
        out.append(record)
    return tuple(out)


def usage_for_model(records: Sequence[UsageRecord], gpu_model: str | None) -> UsageRecord | None:
    """The record of ``gpu_model`` (case-insensitive), or None."""
    key = _model_key(gpu_model)
    for r in records:
        if _model_key(r.gpu_model) == key:
            return r
    return None
