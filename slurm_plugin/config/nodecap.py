"""Cores per GPU the nodes of slurm.conf can give a job, by its GPUs per node.

Read once when coda.conf is (re)loaded, off the hot path; the hook then asks
``node_cap(gpus_per_node)`` from a small dict.  The simulator builds one from its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from slurm_plugin.config.codaconf import (
    ConfigError,
    NodeShape,
    PartitionShape,
    expand_hostlist,
    read_slurm_conf,
)

__all__ = [
    "NodeCap",
    "gres_units_per_node",
    "max_cpus_per_gpu_on_any_node",
    "node_share_cpus_per_gpu",
]


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


def gres_units_per_node(
    nodes: Iterable[NodeShape],
    partitions: Iterable[PartitionShape],
    gres: str,
    partition: str | None,
) -> int | None:
    """The most units of the count-only GRES ``gres`` a job may ask per node and still be
    accepted wherever it could run before: the smallest per-node count of ``gres`` over
    every node of every partition in ``partition`` (a comma-separated list as submitted;
    None or "" = the ``Default=YES`` partition).

    None when that cannot be known or is not safe: no such partition in slurm.conf, a
    partition whose ``Nodes=`` names a node slurm.conf does not define (a NodeSet, a
    feature), or a node without ``gres``.  Slurm refuses a job asking for a GRES that no
    node of its partition has, so the caller then asks for none.
    """
    by_name = {p.name: p for p in partitions}
    if partition:
        names = [p for p in partition.split(",") if p]
    else:
        names = [p.name for p in by_name.values() if p.default][:1]
    if not names:
        return None
    counts: dict[str, int] = {}
    for node in nodes:
        count = dict(node.gres).get(gres, 0)
        try:
            hosts = expand_hostlist(node.names)
        except ValueError:
            return None
        for host in hosts:
            counts[host] = count
    least: int | None = None
    for name in names:
        part = by_name.get(name)
        if part is None or not part.nodes:
            return None
        try:
            hosts = list(counts) if part.nodes.upper() == "ALL" else expand_hostlist(part.nodes)
        except ValueError:
            return None
        for host in hosts:
            count = counts.get(host, 0)
            if count < 1:
                return None
            least = count if least is None else min(least, count)
    return least


class NodeCap:
    """``cap(gpus_per_node)`` -> the most cores per GPU any node with that many GPUs has;
    ``cap.share(gpus_per_node)`` -> a GPU's even share of cores on the leanest such node
    (``DefaultCpusPerGpu=share``)."""

    __slots__ = ("_cache", "_gres_cache", "_share_cache", "nodes", "partitions", "source")

    def __init__(
        self,
        nodes: tuple[NodeShape, ...],
        source: str,
        partitions: tuple[PartitionShape, ...] = (),
    ) -> None:
        self.nodes = nodes
        self.partitions = partitions
        self.source = source
        self._cache: dict[int, int | None] = {}
        self._share_cache: dict[int, int | None] = {}
        self._gres_cache: dict[tuple[str, str | None], int | None] = {}

    @classmethod
    def from_slurm_conf(cls, path: Path, log: Callable[[str, str], None]) -> NodeCap:
        partitions: tuple[PartitionShape, ...] = ()
        try:
            nodes, partitions = read_slurm_conf(path)
        except (OSError, ConfigError) as exc:
            # Without node shapes the hook still clamps to MaxCpusPerGpu.
            log(
                "error",
                f"cannot read node shapes from {path} ({exc}); "
                "cores per GPU are capped by MaxCpusPerGpu only",
            )
            nodes = ()
        return cls(nodes, str(path), partitions)

    def __call__(self, gpus_per_node: int) -> int | None:
        return self._cached(self._cache, max_cpus_per_gpu_on_any_node, gpus_per_node)

    def share(self, gpus_per_node: int) -> int | None:
        return self._cached(self._share_cache, node_share_cpus_per_gpu, gpus_per_node)

    def gres_units(self, gres: str, partition: str | None) -> int | None:
        """:func:`gres_units_per_node` for these nodes and partitions, once per
        (GRES, partition list)."""
        key = (gres, partition)
        try:
            return self._gres_cache[key]
        except KeyError:
            got = gres_units_per_node(self.nodes, self.partitions, gres, partition)
            if len(self._gres_cache) < 4096:  # partition strings are the user's: bounded
                self._gres_cache[key] = got
            return got

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
