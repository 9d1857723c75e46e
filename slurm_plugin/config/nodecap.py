"""Cores per GPU the nodes of slurm.conf can give a job, by its GPUs per node, and the
units of a count-only GRES its partitions' nodes can give it.

Read once when coda.conf or slurm.conf is (re)loaded, off the hot path; the hook then asks
``node_cap(gpus_per_node)`` and ``node_cap.gres_units(gres, partitions)`` from small dicts.
The simulator builds one from its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import (
    NodeShape,
    PartitionShape,
    gres_units_per_partition,
    read_slurm_conf,
)

__all__ = [
    "NodeCap",
    "gres_units_per_node",
    "gres_units_per_partition",
    "max_cpus_per_gpu_on_any_node",
    "node_share_cpus_per_gpu",
]


def _can_hold(node: NodeShape, gpus_per_node: int) -> bool:
    """``node`` has ``gpus_per_node`` GPUs and can run jobs (a ``RestrictedCoresPerGPU``
    larger than the node leaves it DOWN)."""
    return node.gpus >= gpus_per_node and node.restriction_fits


def max_cpus_per_gpu_on_any_node(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """The most CPUs per GPU any node can give a job with ``gpus_per_node`` GPUs there:
    the largest ``gpu_job_cpus(gpus_per_node) // gpus_per_node`` over the nodes with that
    many GPUs (on a node with ``RestrictedCoresPerGPU``, all its CPUs but the cores
    restricted to its other GPUs: Slurm gives a job only its own GPUs' share of them).
    None when no node fits (or there is no node information, or ``gpus_per_node`` < 1)."""
    if gpus_per_node < 1:
        return None
    best: int | None = None
    for node in nodes:
        if _can_hold(node, gpus_per_node):
            per_gpu = node.gpu_job_cpus(gpus_per_node) // gpus_per_node
            if best is None or per_gpu > best:
                best = per_gpu
    return best


def node_share_cpus_per_gpu(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """``DefaultCpusPerGpu=share``: the fewest ``cpus // gpus`` over the nodes with at least
    ``gpus_per_node`` GPUs, i.e. each GPU's even share of its node's cores on the leanest node
    that could run the job (so the job fits on any of them beside jobs sized the same way).
    A GPU's share includes its ``RestrictedCoresPerGPU`` cores and is never below them (Slurm
    restricts at most the node's cores), so it is always within
    :func:`max_cpus_per_gpu_on_any_node`.  None when no node fits, or there is no node
    information."""
    if gpus_per_node < 1:
        return None
    shares = [node.cpus // node.gpus for node in nodes if _can_hold(node, gpus_per_node)]
    return max(1, min(shares)) if shares else None


def gres_units_per_node(
    per_partition: Mapping[str, int | None], default: str | None, partition: str | None
) -> int | None:
    """The most units a job submitted to ``partition`` (a comma-separated list as
    submitted; None or "" = the ``default`` partition) may ask per node: the smallest of
    its partitions' :func:`gres_units_per_partition`; None when any of them is None or not
    in slurm.conf."""
    names = [p for p in partition.split(",") if p] if partition else [default] if default else []
    least: int | None = None
    for name in names:
        units = per_partition.get(name)
        if units is None:
            return None
        least = units if least is None else min(least, units)
    return least


def _at_most(units: int | None, top: int | None) -> int | None:
    return None if units is None or top is None else min(units, top)


class NodeCap:
    """``cap(gpus_per_node)`` -> the most cores per GPU any node with that many GPUs can
    give such a job (:func:`max_cpus_per_gpu_on_any_node`); ``cap.share(gpus_per_node)`` ->
    a GPU's even share of cores on the leanest such node (``DefaultCpusPerGpu=share``)."""

    __slots__ = (
        "_cache",
        "_default_partition",
        "_gres_cache",
        "_share_cache",
        "ceiling",
        "nodes",
        "partitions",
        "read_stamp",
        "source",
    )

    def __init__(
        self,
        nodes: tuple[NodeShape, ...],
        source: str,
        partitions: tuple[PartitionShape, ...] = (),
        read_stamp: tuple[tuple[Path, int | None], ...] = (),
    ) -> None:
        self.nodes = nodes
        self.read_stamp = read_stamp
        """slurm.conf, the files it includes and the folders its Include globs look in, each
        with its mtime before it was read (:func:`read_slurm_conf`)."""
        self.partitions = partitions
        self.source = source
        self._cache: dict[int, int | None] = {}
        self._share_cache: dict[int, int | None] = {}
        self._gres_cache: dict[str, Mapping[str, int | None]] = {}
        self.ceiling: NodeCap | None = None
        """The slurm.conf read when slurmctld started: a GRES count read later is never
        above its count there (slurmctld learns a new GRES, or a larger count, only on a
        restart; a request above what it knows is refused)."""
        self._default_partition = next((p.name for p in partitions if p.default), None)

    @classmethod
    def from_slurm_conf(cls, path: Path, log: Callable[[str, str], None]) -> NodeCap:
        partitions: tuple[PartitionShape, ...] = ()
        read: list[tuple[Path, int | None]] = []
        try:
            nodes, partitions = read_slurm_conf(path, read)
        except (OSError, ConfigError) as exc:
            # Without node shapes the hook still clamps to MaxCpusPerGpu.
            log(
                "error",
                f"cannot read node shapes from {path} ({exc}); "
                "cores per GPU are capped by MaxCpusPerGpu only",
            )
            nodes = ()
        first: dict[Path, int | None] = {}
        for p, mtime in read:
            first.setdefault(p, mtime)
        return cls(nodes, str(path), partitions, tuple(first.items()))

    def __call__(self, gpus_per_node: int) -> int | None:
        return self._cached(self._cache, max_cpus_per_gpu_on_any_node, gpus_per_node)

    def share(self, gpus_per_node: int) -> int | None:
        return self._cached(self._share_cache, node_share_cpus_per_gpu, gpus_per_node)

    @property
    def default_partition(self) -> str | None:
        """slurm.conf's ``Default=YES`` partition (the last that says so), or None."""
        return self._default_partition

    def gres_units(self, gres: str, partition: str | None) -> int | None:
        """:func:`gres_units_per_node` for these partitions; each partition's count is
        worked out once per GRES (:meth:`prepare_gres`, which the hook calls at load)."""
        per = self._gres_cache.get(gres)
        if per is None:
            per = self.prepare_gres(gres)
        return gres_units_per_node(per, self._default_partition, partition)

    def prepare_gres(self, gres: str) -> Mapping[str, int | None]:
        """Work out every partition's count of ``gres`` now (host lists expanded once),
        never above the :attr:`ceiling`'s."""
        per = gres_units_per_partition(self.nodes, self.partitions, gres)
        if self.ceiling is not None:
            top = self.ceiling._gres_cache.get(gres) or self.ceiling.prepare_gres(gres)
            per = {name: _at_most(units, top.get(name)) for name, units in per.items()}
        self._gres_cache[gres] = per
        return per

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
