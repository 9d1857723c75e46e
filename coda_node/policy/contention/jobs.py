"""What the eliminator reads each tick (the DNN and CPU jobs on the node) and what it gives
out (a throttle per CPU job, and its events). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from coda_node.policy.allocator import Event
from coda_node.policy.observe import Progress


@dataclass(frozen=True, slots=True)
class DnnJob:
    job_id: int
    sockets: frozenset[int]
    progress: Progress
    probing: bool = False
    """Its cores are being probed: its rate is low on purpose."""
    gpus: int = 1
    """The GPUs it trains on, on all its nodes (a synchronous job runs at the pace of its
    slowest node, so a hold on one node speeds all of them): what the price test
    (``gpu_worth_cores``) weighs its slowdown by."""


@dataclass(frozen=True, slots=True)
class CpuJob:
    job_id: int
    sockets: frozenset[int]
    allocated_cores: int
    cpu_rate_cores: float | None
    mem_bw_bytes_per_s: float | None


@dataclass(frozen=True, slots=True)
class Throttle:
    quota_cores: float | None = None
    mem_bw_pct: int | None = None
    reason: str = ""
    l3_ways: int | None = None
    """L3 ways the job may allocate in (CAT); None: the whole cache."""


@dataclass(slots=True)
class ContentionOutput:
    throttles: dict[int, Throttle] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


def throttle_share(t: Throttle | None, allocated_cores: float) -> float:
    """The share of its cores (or of its bandwidth, under MBA) a throttled job keeps: what
    a job whose progress follows its cores or its bandwidth is slowed to."""
    if t is None:
        return 1.0
    share = 1.0
    if t.quota_cores is not None:
        share = min(share, t.quota_cores / max(allocated_cores, 1))
    if t.mem_bw_pct is not None:
        share = min(share, t.mem_bw_pct / 100.0)
    return share


def tighter(a: Throttle | None, b: Throttle) -> Throttle:
    """The stricter of two throttles on one CPU job (each limit the lower one)."""
    if a is None:
        return b

    def low(x: float | None, y: float | None) -> float | None:
        return y if x is None else x if y is None else min(x, y)

    mb = low(a.mem_bw_pct, b.mem_bw_pct)
    ways = low(a.l3_ways, b.l3_ways)
    return Throttle(
        quota_cores=low(a.quota_cores, b.quota_cores),
        mem_bw_pct=None if mb is None else int(mb),
        reason=b.reason,
        l3_ways=None if ways is None else int(ways),
    )


def draw_text(c: CpuJob) -> str:
    parts = []
    if c.mem_bw_bytes_per_s is not None:
        parts.append(f"{c.mem_bw_bytes_per_s / 1e9:.2f} GB/s")
    if c.cpu_rate_cores is not None:
        parts.append(f"{c.cpu_rate_cores:.2f} cores")
    return " and ".join(parts) or "an unknown amount"
