"""Job summaries of multi-node GPU jobs into their workloads' profiles: the measured
multi-node figure (:mod:`coda_common.store.multinode`).

Both publish paths call :func:`merge_summary_figures` with the summaries they hand on:
coda-node itself under ``ProfilePublish=store`` (it writes the store), the controller's
collector when it appends a summary drop under ``ProfilePublish=munge``. A failure here is
said (one line per job) and never undoes or stops the summaries' own publication.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from coda_common.store.jobsummary import JobSummary
from coda_common.store.multinode import summary_figure
from coda_common.store.profiles import ProfileStore, StoreError

_OWNER_KEY = re.compile(r"(?:workload|script):([0-9]+):\S+", re.ASCII)


def multi_node_figure(summary: JobSummary) -> tuple[str, float] | None:
    """``(profile signature, cores per GPU used on this node)`` of a summary that gives a
    multi-node figure, else None.

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
    return key, figure


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
        signature, figure = found
        what = f"multi-node figure {figure:.2f} cores/GPU of {signature} from node {s.node}"
        try:
            profile = store.merge_multi_node(signature, figure, now_unix_s)
        except (StoreError, OSError, ValueError) as exc:
            said.append((s.job_id, f"{what} not merged: {exc}"))
            continue
        measure = profile.multi_node
        assert measure is not None  # merge_multi_node always sets it
        said.append(
            (
                s.job_id,
                f"{what} merged: {measure.cores_per_gpu:.2f} cores/GPU (p90) "
                f"from {measure.n_figures} per-node figures",
            )
        )
    return said
