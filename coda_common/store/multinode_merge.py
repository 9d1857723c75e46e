"""Job summaries of multi-node GPU jobs into their workloads' profiles: the measured
multi-node figure (:mod:`coda_common.store.multinode`).

Both publish paths call :func:`merge_summary_figures` with the summaries they hand on:
coda-node itself under ``ProfilePublish=store`` (it writes the store), the controller's
collector when it appends a summary drop under ``ProfilePublish=munge``. A failure here is
said (one line per job) and never undoes or stops the summaries' own publication.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

from coda_common.store.jobsummary import CPU_BOUND_SHARE, WAIT_SHARE_YES, JobSummary
from coda_common.store.multinode import summary_figure
from coda_common.store.profiles import ProfileStore, StoreError

_OWNER_KEY = re.compile(r"(?:workload|script):([0-9]+):\S+", re.ASCII)


class NodeFigure(NamedTuple):
    """What one node's summary of a multi-node job gives its profile."""

    signature: str
    cores_per_gpu: float
    """Cores per GPU the job used on the node."""
    starved: bool
    """Its GPUs waited on its CPUs there (:func:`summary_starved`): a floor of its demand."""


def multi_node_figure(summary: JobSummary) -> NodeFigure | None:
    """The profile signature, the cores per GPU used on this node and whether that is
    starved (:func:`summary_starved`) of a summary that
    gives a multi-node figure, else None.

    It gives one when the job ran on several nodes with GPUs, the node sampled its CPU use,
    no probe changed its cores here, and the hook's record names a key of the job's owner
    (``workload:<uid>:`` or ``script:<uid>:``): the same owner rule coda-node applies to a
    record before it measures a job under it (``hook_record``), so a copied or hand-made
    record cannot put one user's figures under a shared key or another user's.
    """
    if summary.probes or summary.uid is None:
        return None
    figure = summary_figure(summary.num_nodes, summary.gpus, summary.cpu_used_cores_mean)
    if figure is None:
        return None
    fields = summary.decision
    key = fields.get("sig", "") if fields is not None else ""
    m = _OWNER_KEY.fullmatch(key)
    if m is None or m.group(1) != str(summary.uid):
        return None
    return NodeFigure(key, figure, summary_starved(summary))


def summary_starved(summary: JobSummary) -> bool:
    """Whether a summary's figure is starved, a floor of the job's demand on that node: its
    GPUs waited on its CPUs for at least :data:`WAIT_SHARE_YES` of the sampled GPU time
    (:attr:`JobSummary.gpu_wait_share`), or, without a GPU reading, it used at least
    :data:`CPU_BOUND_SHARE` of the cores it could run on there (``cores_mean``).

    A job given exactly what it needs also keeps all its cores busy, but its GPUs too: its
    figure is its demand, not a floor."""
    used = summary.cpu_used_cores_mean
    if used is None or not math.isfinite(used):
        return False
    share = summary.gpu_wait_share
    if share is not None:
        return share >= WAIT_SHARE_YES
    return summary.cores_mean > 0 and used >= CPU_BOUND_SHARE * summary.cores_mean


def merge_summary_figures(
    store: ProfileStore, summaries: Iterable[JobSummary], now_unix_s: float
) -> list[tuple[int, str]]:
    """Merge the multi-node figure of every summary that gives one
    (:meth:`ProfileStore.merge_multi_node`); ``(job id, what happened)`` for each of them,
    failures included (a summary without a figure is not named)."""
    said: list[tuple[int, str]] = []
    for s in summaries:
        found = multi_node_figure(s)
        if found is None:
            continue
        signature, figure, starved = found
        what = (
            f"multi-node figure {figure:.2f} cores/GPU{' (starved)' if starved else ''} "
            f"of {signature} from node {s.node}"
        )
        try:
            profile = store.merge_multi_node(signature, figure, now_unix_s, starved)
        except (StoreError, OSError, ValueError) as exc:
            said.append((s.job_id, f"{what} not merged: {exc}"))
            continue
        measure = profile.multi_node
        assert measure is not None  # merge_multi_node always sets it
        said.append(
            (
                s.job_id,
                f"{what} merged: {measure.cores_per_gpu:.2f} cores/GPU (p90"
                f"{', a floor' if measure.is_floor else ''}) "
                f"from {measure.n_figures} per-node figures",
            )
        )
    return said
