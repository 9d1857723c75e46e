"""How many cores per GPU the largest suitable node can hold, from slurm.conf.

Read once when coda.conf is (re)loaded, off the hot path; the hook then asks
``node_cap(gpus_per_node)`` from a small dict.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slurm_plugin.conf import (
    ConfigError,
    NodeShape,
    max_cpus_per_gpu_on_any_node,
    node_share_cpus_per_gpu,
    read_slurm_nodes,
)


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
