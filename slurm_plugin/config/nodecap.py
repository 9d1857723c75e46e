"""Cores per GPU the nodes of slurm.conf can give a job, by its GPUs per node.

Read once when coda.conf is (re)loaded, off the hot path; the hook then asks
``node_cap(gpus_per_node)`` from a small dict.  The simulator builds one from its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from slurm_plugin.config.codaconf import ConfigError, NodeShape, read_slurm_nodes

__all__ = ["NodeCap", "max_cpus_per_gpu_on_any_node", "node_share_cpus_per_gpu"]


def max_cpus_per_gpu_on_any_node(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """The largest ``cpus // gpus_per_node`` over nodes with at least ``gpus_per_node``
    GPUs: the most CPUs per GPU any node can give such a job.  None when no node fits (or
    there is no node information, or ``gpus_per_node`` < 1)."""
    if gpus_per_node < 1:
        return None
    best: int | None = None
    for node in nodes:
        if node.gpus >= gpus_per_node:
            per_gpu = node.cpus // gpus_per_node
            if best is None or per_gpu > best:
                best = per_gpu
    return best


def node_share_cpus_per_gpu(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """``DefaultCpusPerGpu=share``: the fewest ``cpus // gpus`` over the nodes with at least
    ``gpus_per_node`` GPUs, i.e. each GPU's even share of its node's cores on the leanest node
    that could run the job (so the job fits on any of them beside jobs sized the same way).
    None when no node fits, or there is no node information."""
    if gpus_per_node < 1:
        return None
    shares = [node.cpus // node.gpus for node in nodes if node.gpus >= gpus_per_node]
    return max(1, min(shares)) if shares else None


class NodeCap:
    """``cap(gpus_per_node)`` -> the most cores per GPU any node with that many GPUs has;
    ``cap.share(gpus_per_node)`` -> a GPU's even share of cores on the leanest such node
    (``DefaultCpusPerGpu=share``)."""

    __slots__ = ("_cache", "_share_cache", "nodes", "source")

    def __init__(self, nodes: tuple[NodeShape, ...], source: str) -> None:
        self.nodes = nodes
        self.source = source
        self._cache: dict[int, int | None] = {}
        self._share_cache: dict[int, int | None] = {}

    @classmethod
    def from_slurm_conf(cls, path: Path, log: Callable[[str, str], None]) -> NodeCap:
        try:
            nodes = read_slurm_nodes(path)
        except (OSError, ConfigError) as exc:
            # Without node shapes the hook still clamps to MaxCpusPerGpu.
            log(
                "error",
                f"cannot read node shapes from {path} ({exc}); "
                "cores per GPU are capped by MaxCpusPerGpu only",
            )
            nodes = ()
        return cls(nodes, str(path))

    def __call__(self, gpus_per_node: int) -> int | None:
        return self._cached(self._cache, max_cpus_per_gpu_on_any_node, gpus_per_node)

    def share(self, gpus_per_node: int) -> int | None:
        return self._cached(self._share_cache, node_share_cpus_per_gpu, gpus_per_node)

    def _cached(
        self,
        cache: dict[int, int | None],
        compute: Callable[[tuple[NodeShape, ...], int], int | None],
        gpus_per_node: int,
    ) -> int | None:
        try:
            return cache[gpus_per_node]
        except KeyError:
            got = compute(self.nodes, gpus_per_node) if self.nodes else None
            cache[gpus_per_node] = got
            return got
