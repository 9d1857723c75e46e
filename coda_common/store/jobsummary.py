"""A job's summary at its end: what it had, what it used, whether its GPUs waited on its
CPUs, and what coda-node did to it, as one node saw it.

coda-node writes one summary per job and node when the job leaves the node (every GPU
job, and every CPU job it throttled); the controller keeps them
(:mod:`coda_common.store.summaries`) and ``coda-slurm job`` and ``coda-slurm report`` read
them. Pure: the record, its JSON form, and the rule that says when a job's GPUs were
waiting on its CPUs.

JSON form, one object per line, version :data:`SUMMARY_FORMAT_VERSION` (keys may be
added; a reader skips a line of a newer version and names it)::

    {"format": "coda-job-summary", "format_version": 1, "job_id": 4711, "node": "gpu01",
     "user": "alice", "uid": 1000, "account": "vision", "partition": "gpu", "kind": "dnn",
     "num_nodes": 1, "start_unix_s": 1765100000.0, "end_unix_s": 1765103600.0,
     "sampled_s": 3590.0, "gpus": 2, "gpu_model": "NVIDIA H100 80GB HBM3",
     "cores_allocated": 16, "cores_mean": 14.2, "cpu_used_cores_mean": 11.8,
     "gpu_util_pct_mean": 91.5, "gpu_sampled_s": 3560.0, "gpu_wait_s": 120.0,
     "idle_core_s": 15120.0, "probe_s": 600.0, "probes": 1, "slim_s": 1800.0,
     "throttled_s": 0.0, "protected_s": 240.0, "profile_state": "profiled",
     "record": "coda:sig=workload:1000:resnet50;cpg=8;was=;action=set;src=profile;..."}

Times are seconds. ``sampled_s`` is the time the node's ticks covered; the ``*_s`` figures
below it are parts of it (``idle_core_s`` is core-seconds). ``record`` is the submit hook's
admin record as the node read it while the job ran, so the decision outlives an
``AdminComment`` that another tool (jobstats' epilog) replaces at job end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from coda_common.slurm.adminrecord import parse_admin_record

SUMMARY_FORMAT = "coda-job-summary"
SUMMARY_FORMAT_VERSION = 1

GPU_BUSY_PCT = 80.0
"""GPUs at least this busy (NVML utilization.gpu, mean over the job's GPUs) are not waiting
on anything."""
CPU_BOUND_SHARE = 0.9
"""A job using at least this share of the cores it has is CPU-bound."""
WAIT_SHARE_YES = 0.2
"""A finished job whose GPUs waited on its CPUs for at least this share of its sampled
GPU time is reported as waiting (``coda-slurm job``)."""

MAX_TEXT_CHARS = 256
"""User, account, partition, node and GPU model names longer than this are refused."""
MAX_RECORD_CHARS = 1024
MAX_GPUS = 4096
MAX_CORES = 1 << 20
MAX_SECONDS = 100 * 365 * 86400.0

KINDS = ("dnn", "cpu")


def clean_text(value: object, limit: int = MAX_TEXT_CHARS) -> str | None:
    """``value`` where a summary can carry it (printable text of 1..``limit`` characters),
    else None: a name Slurm or a user gave that a summary will not hold is left out, never
    written in part."""
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        return None
    return value


class SummaryFormatError(ValueError):
    """A summary that cannot be used; the message says why, for a log line."""


def gpus_waiting(
    gpu_util_pct: float | None, cpu_used_cores: float | None, cores: float | None
) -> bool | None:
    """Whether a job's GPUs are waiting on its CPUs at one sample: its GPUs are less than
    :data:`GPU_BUSY_PCT` busy while it uses at least :data:`CPU_BOUND_SHARE` of the cores it
    has. None when a signal is missing (no NVML, no CPU reading, no cores known)."""
    if gpu_util_pct is None or cpu_used_cores is None or not cores or cores <= 0:
        return None
    return gpu_util_pct < GPU_BUSY_PCT and cpu_used_cores >= CPU_BOUND_SHARE * cores


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job on one node, from its first tick there to its last."""

    job_id: int
    node: str
    user: str | None
    uid: int | None
    account: str | None
    partition: str | None
    kind: str
    """``dnn`` (a job with GPUs) or ``cpu``."""
    num_nodes: int
    start_unix_s: float
    end_unix_s: float
    sampled_s: float
    gpus: int
    gpu_model: str | None
    cores_allocated: int
    """Cores Slurm allocated the job on this node."""
    cores_mean: float
    """Cores the job could run on, time-weighted (less than allocated while slimmed or
    probed)."""
    cpu_used_cores_mean: float | None
    gpu_util_pct_mean: float | None
    gpu_sampled_s: float
    """Time with both a GPU and a CPU reading: what :attr:`gpu_wait_s` is a share of."""
    gpu_wait_s: float
    """Time :func:`gpus_waiting` held."""
    idle_core_s: float
    """Core-seconds the job held (allocated) but did not use."""
    probe_s: float
    probes: int
    slim_s: float
    """Time at fewer cores than allocated, outside probes."""
    throttled_s: float
    """A CPU job: time coda-node throttled it (cpuset, quota or MBA)."""
    protected_s: float
    """A GPU job: time coda-node throttled a neighbour for it."""
    profile_state: str | None
    record: str | None

    @property
    def gpu_wait_share(self) -> float | None:
        """The share of the sampled GPU time the GPUs waited on the CPUs; None unsampled."""
        return self.gpu_wait_s / self.gpu_sampled_s if self.gpu_sampled_s > 0 else None

    @property
    def decision(self) -> dict[str, str] | None:
        """The submit hook's record's fields, or None."""
        if not self.record:
            return None
        try:
            return parse_admin_record(self.record)
        except ValueError:
            return None

    def to_json_dict(self) -> dict[str, Any]:
        return {"format": SUMMARY_FORMAT, "format_version": SUMMARY_FORMAT_VERSION, **asdict(self)}

    def to_json_line(self) -> bytes:
        return (json.dumps(self.to_json_dict(), separators=(",", ":")) + "\n").encode()


_INT_FIELDS = {
    "job_id": (1, (1 << 32) - 1),
    "num_nodes": (1, 1 << 20),
    "gpus": (0, MAX_GPUS),
    "cores_allocated": (0, MAX_CORES),
    "probes": (0, 1 << 20),
}
_SECONDS_FIELDS = (
    "sampled_s",
    "gpu_sampled_s",
    "gpu_wait_s",
    "probe_s",
    "slim_s",
    "throttled_s",
    "protected_s",
)
_TEXT_FIELDS = ("user", "account", "partition", "gpu_model", "profile_state")


def _int(d: Mapping[str, Any], key: str, low: int, high: int) -> int:
    v = d.get(key)
    if type(v) is not int or not low <= v <= high:
        raise SummaryFormatError(f"{key} is {v!r}, not an integer in {low}..{high}")
    return v


def _float(d: Mapping[str, Any], key: str, high: float, *, optional: bool = False) -> Any:
    v = d.get(key)
    if v is None and optional:
        return None
    if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= high:
        raise SummaryFormatError(f"{key} is {v!r}, not a number in 0..{high:g}")
    return float(v)


def _text(d: Mapping[str, Any], key: str, *, limit: int = MAX_TEXT_CHARS) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > limit or not v.isprintable():
        raise SummaryFormatError(f"{key} is not a printable name of 1..{limit} characters")
    return v


def _check_header(d: Any) -> None:
    if not isinstance(d, dict):
        raise SummaryFormatError("not a JSON object")
    if d.get("format") != SUMMARY_FORMAT:
        raise SummaryFormatError(f"format is {str(d.get('format'))[:40]!r}, not {SUMMARY_FORMAT}")
    version = d.get("format_version")
    if type(version) is not int or version < 1:
        raise SummaryFormatError(f"format_version is {str(version)[:20]!r}")
    if version > SUMMARY_FORMAT_VERSION:
        raise SummaryFormatError(
            f"format_version {version} is newer than this coda reads "
            f"({SUMMARY_FORMAT_VERSION}): upgrade coda on this host"
        )


def _check_parts(secs: Mapping[str, float]) -> None:
    """The parts of the sampled time are no more than the whole."""
    for part in ("gpu_wait_s", "gpu_sampled_s", "probe_s", "slim_s", "throttled_s"):
        if secs[part] > secs["sampled_s"] + 1e-6:
            raise SummaryFormatError(f"{part} is more than sampled_s")
    if secs["gpu_wait_s"] > secs["gpu_sampled_s"] + 1e-6:
        raise SummaryFormatError("gpu_wait_s is more than gpu_sampled_s")


def summary_from_json_dict(d: Any) -> JobSummary:
    """Validate one decoded line; SummaryFormatError says what is wrong."""
    _check_header(d)
    ints = {k: _int(d, k, lo, hi) for k, (lo, hi) in _INT_FIELDS.items()}
    secs = {k: _float(d, k, MAX_SECONDS) for k in _SECONDS_FIELDS}
    texts = {k: _text(d, k) for k in _TEXT_FIELDS}
    node = _text(d, "node")
    if node is None:
        raise SummaryFormatError("node is missing")
    kind = d.get("kind")
    if kind not in KINDS:
        raise SummaryFormatError(f"kind is {str(kind)[:20]!r}, not one of {', '.join(KINDS)}")
    uid = d.get("uid")
    if uid is not None and (type(uid) is not int or not 0 <= uid < (1 << 32)):
        raise SummaryFormatError(f"uid is {str(uid)[:20]!r}")
    start, end = _float(d, "start_unix_s", 1e11), _float(d, "end_unix_s", 1e11)
    if end < start:
        raise SummaryFormatError("end_unix_s is before start_unix_s")
    record = _text(d, "record", limit=MAX_RECORD_CHARS)
    if record is not None:
        try:
            parse_admin_record(record)
        except ValueError as exc:
            raise SummaryFormatError(f"record: {exc}") from None
    _check_parts(secs)
    return JobSummary(
        job_id=ints["job_id"],
        node=node,
        user=texts["user"],
        uid=uid,
        account=texts["account"],
        partition=texts["partition"],
        kind=kind,
        num_nodes=ints["num_nodes"],
        start_unix_s=start,
        end_unix_s=end,
        sampled_s=secs["sampled_s"],
        gpus=ints["gpus"],
        gpu_model=texts["gpu_model"],
        cores_allocated=ints["cores_allocated"],
        cores_mean=_float(d, "cores_mean", MAX_CORES),
        cpu_used_cores_mean=_float(d, "cpu_used_cores_mean", MAX_CORES, optional=True),
        gpu_util_pct_mean=_float(d, "gpu_util_pct_mean", 100.0, optional=True),
        gpu_sampled_s=secs["gpu_sampled_s"],
        gpu_wait_s=secs["gpu_wait_s"],
        idle_core_s=_float(d, "idle_core_s", MAX_SECONDS * MAX_CORES),
        probe_s=secs["probe_s"],
        probes=ints["probes"],
        slim_s=secs["slim_s"],
        throttled_s=secs["throttled_s"],
        protected_s=secs["protected_s"],
        profile_state=texts["profile_state"],
        record=record,
    )


def summary_from_json_line(line: bytes) -> JobSummary:
    try:
        d = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise SummaryFormatError(f"not JSON: {str(exc)[:80]}") from None
    return summary_from_json_dict(d)


def wait_verdict(summaries: Sequence[JobSummary]) -> dict[str, Any]:
    """Whether a finished job's GPUs waited on its CPUs, from its summaries (one per node):
    ``{"verdict": "yes"|"no"|"unknown", "why": ..., "share": float|None}``."""
    gpu = [s for s in summaries if s.gpus > 0]
    if not gpu:
        return {"verdict": "unknown", "why": "no GPU job summary from coda-node", "share": None}
    sampled = sum(s.gpu_sampled_s for s in gpu)
    if sampled <= 0:
        return {
            "verdict": "unknown",
            "why": "coda-node read no GPU utilisation for it (no NVML on the node?)",
            "share": None,
        }
    share = sum(s.gpu_wait_s for s in gpu) / sampled
    util = _weighted((s.gpu_util_pct_mean, s.gpu_sampled_s) for s in gpu)
    busy = f"GPUs {util:.0f}% busy on average" if util is not None else "GPU use unknown"
    if share >= WAIT_SHARE_YES:
        why = (
            f"{busy}; for {share:.0%} of the run they were under {GPU_BUSY_PCT:.0f}% busy "
            f"while the job used {CPU_BOUND_SHARE:.0%} or more of its cores"
        )
        return {"verdict": "yes", "why": why, "share": share}
    return {
        "verdict": "no",
        "why": f"{busy}; waiting on the CPU for {share:.0%} of the run",
        "share": share,
    }


def _weighted(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    num = den = 0.0
    for value, weight in pairs:
        if value is not None and weight > 0:
            num += value * weight
            den += weight
    return num / den if den > 0 else None
