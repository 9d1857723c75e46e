"""The measured multi-node figure of a profile: the cores per GPU multi-node runs of the
workload actually used on each node.

A leaf module (stdlib only), so that the store (:mod:`coda_common.store.profiles`), the
hook's view (:mod:`coda_common.store.request`) and the node daemon share it.

Where a figure comes from: a job summary (:mod:`coda_common.store.jobsummary`) of a job with
``num_nodes > 1`` and ``gpus > 0`` that has a sampled CPU reading gives
``cpu_used_cores_mean / gpus`` for the node that wrote it; every node of the job writes its
own summary, so one run gives one figure per node. A figure is *starved* when the job's
GPUs waited on its CPUs there (:func:`coda_common.store.multinode_merge.summary_starved`):
it used what it had, so the figure is only a floor of its demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: A profile keeps the most recent this many per-node figures (``n_figures`` keeps counting).
MAX_MULTI_NODE_FIGURES = 16

#: The quantile of the kept figures a profile publishes (nearest rank).
MULTI_NODE_QUANTILE = 0.9

#: A profile whose quantile is a floor publishes this many times it (see
#: :meth:`MultiNodeMeasure.published_cores_per_gpu`).
FLOOR_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class MultiNodeMeasure:
    """The per-node figures (cores per GPU used) of a workload's multi-node runs.

    ``figures_cores_per_gpu``: the most recent :data:`MAX_MULTI_NODE_FIGURES`, oldest first.
    ``n_figures``: every figure ever merged (the samples the hook counts against
    ``MultiNodeMinSamples``). ``updated_unix_s``: when the last one was merged.
    ``starved``: per kept figure, whether the job's GPUs waited on its CPUs on that node
    (:func:`coda_common.store.multinode_merge.summary_starved`); empty when none did.
    """

    figures_cores_per_gpu: tuple[float, ...]
    n_figures: int
    updated_unix_s: float
    starved: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if self.starved and len(self.starved) != len(self.figures_cores_per_gpu):
            raise ValueError(
                f"{len(self.starved)} starved flags for "
                f"{len(self.figures_cores_per_gpu)} multi-node figures"
            )

    @property
    def cores_per_gpu(self) -> float:
        """The published figure: the p90 (nearest rank) of the kept figures.

        A high quantile, not the mean or the median: the nodes of one multi-node run do not
        work alike (the rank that gathers, logs or checkpoints uses more CPU than the others,
        and a node that waits on its peers uses little). The hook gives every node of the
        next run the same cores per GPU, so the figure must cover the busy nodes; a low one
        would starve them and with them the whole synchronous job. The p90 rather than the
        maximum so that one odd reading (a node busy with something else, a job that
        crashed in its first minute) does not set it, and one idle node does not pull it
        down either; the bounded history lets it follow the workload when it changes.
        """
        return quantile(self.figures_cores_per_gpu, MULTI_NODE_QUANTILE)

    @property
    def is_floor(self) -> bool:
        """Whether :attr:`cores_per_gpu` is only a floor of the demand: every figure at or
        above it is starved (none was measured with the GPUs kept busy)."""
        if not any(self.starved):
            return False
        top = self.cores_per_gpu
        return not any(
            f >= top and not starved
            for f, starved in zip(self.figures_cores_per_gpu, self.starved, strict=True)
        )

    def published_cores_per_gpu(self, single_node_cpus_per_gpu: int | None) -> float:
        """The figure the hook gives (before ``MultiNodeMargin``): :attr:`cores_per_gpu`,
        or, when that is a floor (:attr:`is_floor`), :data:`FLOOR_FACTOR` times it, at most
        the workload's single-node figure ``single_node_cpus_per_gpu`` when that is known
        and higher.

        A starved run used everything it had and shows only that it needed at least as
        much: the margin alone would give the next run one core per GPU more each time (3,
        4, 5, ... for a workload that needs 10), one finished run per step. CODA §I.C bounds
        the demand per GPU across nodes by the demand on one node, so the single-node figure
        is where the next run can look without wasting more; above it (or without one) the
        floor is doubled. The next run given enough keeps its GPUs busy and measures its
        demand, and that figure, not the floor, is published from then on.
        """
        top = self.cores_per_gpu
        if not self.is_floor:
            return top
        more = FLOOR_FACTOR * top
        if single_node_cpus_per_gpu is not None and single_node_cpus_per_gpu > top:
            more = min(more, float(single_node_cpus_per_gpu))
        return more


def quantile(values: tuple[float, ...], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (not empty): the smallest value with at
    least ``q`` of the values at or below it."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)), 1)
    return ordered[rank - 1]


def merge_figure(
    current: MultiNodeMeasure | None,
    cores_per_gpu: float,
    now_unix_s: float,
    starved: bool = False,
) -> MultiNodeMeasure:
    """``current`` with one more per-node figure (``starved``: see
    :func:`coda_common.store.multinode_merge.summary_starved`); the oldest goes beyond
    :data:`MAX_MULTI_NODE_FIGURES`. Raises ValueError for a figure that is not a finite
    number >= 0."""
    if not (math.isfinite(cores_per_gpu) and cores_per_gpu >= 0):
        raise ValueError(f"a multi-node figure must be a number >= 0, got {cores_per_gpu!r}")
    kept = () if current is None else current.figures_cores_per_gpu
    flags = (False,) * len(kept) if current is None or not current.starved else current.starved
    count = 0 if current is None else current.n_figures
    flags = (*flags, starved)[-MAX_MULTI_NODE_FIGURES:]
    return MultiNodeMeasure(
        figures_cores_per_gpu=(*kept, float(cores_per_gpu))[-MAX_MULTI_NODE_FIGURES:],
        n_figures=count + 1,
        updated_unix_s=now_unix_s,
        starved=flags if any(flags) else (),
    )


def summary_figure(num_nodes: int, gpus: int, cpu_used_cores_mean: float | None) -> float | None:
    """The per-node figure (cores per GPU used) a job summary gives, or None when it gives
    none: a single-node job, no GPUs, or no sampled CPU reading."""
    if num_nodes <= 1 or gpus <= 0 or cpu_used_cores_mean is None:
        return None
    if not (math.isfinite(cpu_used_cores_mean) and cpu_used_cores_mean >= 0):
        return None
    return cpu_used_cores_mean / gpus
