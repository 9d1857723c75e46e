"""``coda-slurm report``'s figures: the job summaries coda-node wrote
(:mod:`coda_common.store.jobsummary`) of the jobs that ended in a window, summed per user,
account and partition and for the site. Pure: summaries, baselines and profile times in, the
report document (``--json``, schema :data:`SCHEMA_VERSION`) out.

What each figure is (docs/admin-guide.md, "Site report"):

- ``jobs``: GPU jobs (one per job id, however many nodes it ran on); ``cpu_jobs``: CPU jobs
  coda-node throttled (the only CPU jobs it summarises).
- ``gpu_hours``: GPUs x run time (end - start), summed over the job's nodes.
- ``gpu_hours_waiting``: GPUs x ``gpu_wait_s``, the time coda-node saw the job's GPUs under
  80% busy while the job used 90% or more of its cores (:func:`gpus_waiting`).
  ``waiting_share_pct`` is that over GPUs x ``gpu_sampled_s``, the time with both readings.
- ``idle_core_hours``: core-hours GPU jobs held but did not use (``idle_core_s``).
- ``cores_added`` / ``cores_returned``: for each job coda sized (the hook wrote
  ``--cpus-per-gpu``: set, default, raise, lower, replace), (chosen cores per GPU - the
  baseline) x the job's GPUs, counted as added when positive and returned when negative;
  ``core_hours_*`` weigh them by each node's run time. The baseline is what the job would
  have had without coda: the user's own request (``was=cpg:N``, or ``was=cpt:N`` scaled by
  the ``cpt=`` coda wrote), else slurm.conf's ``DefCpuPerGPU`` of the job's partition, else
  the global one; else it is unknown and the job is counted in ``jobs_baseline_unknown``
  and in neither sum.
- ``jobs_from_profile`` (``src=profile`` or ``global``: a measured profile),
  ``jobs_from_prior`` (``src=prior:*``: a model's figure before its own profile),
  ``jobs_from_default`` (``default`` or ``none``), ``jobs_without_record`` (no coda record:
  the hook did not see the job).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coda_common.slurm.adminrecord import parse_admin_record
from coda_common.store.jobsummary import WAIT_SHARE_YES, JobSummary

SCHEMA_VERSION = 1
"""Version of the ``--json`` document; keys are only ever added."""
GROUP_KEYS = ("user", "account", "partition")
UNKNOWN = "(unknown)"
"""The group of a summary without that name."""
WRITTEN_ACTIONS = frozenset({"set", "default", "raise", "lower", "replace"})
"""Actions with which the hook wrote the job's cores (the others leave the job's own)."""
DAY_S = 86400.0

_REL = re.compile(r"now(?:\s*-\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+))?")
_UNIT_S = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip


def parse_when(text: str, now_unix_s: float) -> float:
    """``now``, ``now-7days`` (s, min, h, days, weeks), or an ISO date or time
    (``2026-12-01``, ``2026-12-01T08:00``; UTC unless it names its offset). ValueError says
    what is wrong."""
    t = text.strip().lower()
    m = _REL.fullmatch(t)
    if m is not None:
        if m.group(1) is None:
            return now_unix_s
        unit = _UNIT_S.get(m.group(2))
        if unit is None:
            raise ValueError(f"{text!r}: unknown unit {m.group(2)!r} (s, min, h, days, weeks)")
        return now_unix_s - float(m.group(1)) * unit
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither now[-N<unit>] nor an ISO date or time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@dataclass(frozen=True, slots=True)
class Window:
    since_unix_s: float
    until_unix_s: float

    @property
    def days(self) -> float:
        return (self.until_unix_s - self.since_unix_s) / DAY_S


def window_from(
    since: str | None, until: str | None, days: float | None, now_unix_s: float
) -> Window:
    """The window of ``--since``, ``--until`` and ``--days`` (default: the 7 days to now);
    ValueError when they contradict each other or the window is empty."""
    if since is not None and days is not None:
        raise ValueError("give --since or --days, not both")
    until_s = parse_when(until, now_unix_s) if until is not None else now_unix_s
    if since is not None:
        since_s = parse_when(since, now_unix_s)
    else:
        since_s = until_s - (days if days is not None else 7) * DAY_S
    if since_s >= until_s:
        raise ValueError("the window is empty: --since is not before --until")
    return Window(since_s, until_s)


@dataclass(frozen=True, slots=True)
class Baselines:
    """slurm.conf's ``DefCpuPerGPU``: per partition and global; ``source`` is the file read,
    or None (then ``why`` says why not)."""

    partitions: Mapping[str, int] = field(default_factory=dict)
    global_cpg: int | None = None
    source: str | None = None
    why: str | None = None

    def for_partition(self, partition: str | None) -> tuple[float | None, str]:
        if partition is not None and partition in self.partitions:
            return float(self.partitions[partition]), "partition"
        if self.global_cpg is not None:
            return float(self.global_cpg), "global"
        return None, "unknown"


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isascii() and text.isdigit() else None


def baseline_cpg(
    fields: Mapping[str, str], baselines: Baselines, partition: str | None
) -> tuple[float | None, str]:
    """The cores per GPU the job would have had without coda, and where that comes from:
    ``was`` (the user's request), ``partition``/``global`` (DefCpuPerGPU) or ``unknown``."""
    kind, _, count = fields.get("was", "").partition(":")
    asked = _int(count)
    if kind == "cpg" and asked is not None:
        return float(asked), "was"
    if kind == "cpt" and asked is not None:
        cpg, cpt = _int(fields.get("cpg")), _int(fields.get("cpt"))
        # The hook wrote cpt = cpg x gpn / tasks; the same tasks had `asked` each before.
        if cpg is not None and cpt:
            return cpg * asked / cpt, "was"
        return None, "unknown"
    return baselines.for_partition(partition)


def source_class(fields: Mapping[str, str] | None) -> str:
    """``profile``, ``prior``, ``default`` or ``unrecorded`` (see the module's doc)."""
    if fields is None:
        return "unrecorded"
    src = fields.get("src", "")
    if src.startswith("prior:"):
        return "prior"
    if src in ("profile", "global"):
        return "profile"
    return "default"


@dataclass(slots=True)
class JobFigures:
    """One job, its nodes' summaries summed."""

    job_id: int
    user: str
    account: str
    partition: str
    end_unix_s: float
    gpus: int
    gpu_hours: float
    gpu_hours_sampled: float
    gpu_hours_waiting: float
    idle_core_hours: float
    source: str
    cpg: int | None
    baseline_cpg: float | None
    baseline: str
    """``unchanged`` (coda wrote nothing), ``was``, ``partition``, ``global``, ``unknown``."""
    cores_delta: float = 0.0
    core_hours_delta: float = 0.0

    @property
    def waiting_share(self) -> float | None:
        return self.gpu_hours_waiting / self.gpu_hours_sampled if self.gpu_hours_sampled else None

    @property
    def gpus_waited(self) -> bool:
        share = self.waiting_share
        return share is not None and share >= WAIT_SHARE_YES


def _record_fields(s: JobSummary) -> dict[str, str] | None:
    if not s.record:
        return None
    try:
        return parse_admin_record(s.record)
    except ValueError:
        return None


def job_figures(nodes: Sequence[JobSummary], baselines: Baselines) -> JobFigures:
    """One job from its summaries, one per node (a GPU job: some node has GPUs)."""
    first = nodes[0]
    fields = next((f for f in map(_record_fields, nodes) if f is not None), None)
    cpg = _int(fields.get("cpg")) if fields else None
    written = fields is not None and fields.get("action") in WRITTEN_ACTIONS and cpg is not None
    base, base_src = (
        baseline_cpg(fields, baselines, first.partition)
        if written and fields is not None
        else (None, "unchanged")
    )
    job = JobFigures(
        job_id=first.job_id,
        user=first.user or UNKNOWN,
        account=first.account or UNKNOWN,
        partition=first.partition or UNKNOWN,
        end_unix_s=max(s.end_unix_s for s in nodes),
        gpus=sum(s.gpus for s in nodes),
        gpu_hours=sum(s.gpus * (s.end_unix_s - s.start_unix_s) for s in nodes) / 3600.0,
        gpu_hours_sampled=sum(s.gpus * s.gpu_sampled_s for s in nodes) / 3600.0,
        gpu_hours_waiting=sum(s.gpus * s.gpu_wait_s for s in nodes) / 3600.0,
        idle_core_hours=sum(s.idle_core_s for s in nodes) / 3600.0,
        source=source_class(fields),
        cpg=cpg,
        baseline_cpg=base,
        baseline=base_src,
    )
    if cpg is not None and base is not None:
        delta = cpg - base
        job.cores_delta = delta * job.gpus
        job.core_hours_delta = (
            sum(delta * s.gpus * (s.end_unix_s - s.start_unix_s) for s in nodes) / 3600.0
        )
    return job


@dataclass(slots=True)
class Tally:
    """A group's sums (a user, an account, a partition, or the site)."""

    name: str
    jobs: int = 0
    cpu_jobs: int = 0
    gpu_hours: float = 0.0
    gpu_hours_sampled: float = 0.0
    gpu_hours_waiting: float = 0.0
    idle_core_hours: float = 0.0
    cores_added: float = 0.0
    cores_returned: float = 0.0
    core_hours_added: float = 0.0
    core_hours_returned: float = 0.0
    jobs_gpus_waited: int = 0
    jobs_baseline_unknown: int = 0
    sources: dict[str, int] = field(
        default_factory=lambda: {"profile": 0, "prior": 0, "default": 0, "unrecorded": 0}
    )

    def add(self, job: JobFigures) -> None:
        self.jobs += 1
        self.gpu_hours += job.gpu_hours
        self.gpu_hours_sampled += job.gpu_hours_sampled
        self.gpu_hours_waiting += job.gpu_hours_waiting
        self.idle_core_hours += job.idle_core_hours
        if job.cores_delta >= 0:
            self.cores_added += job.cores_delta
            self.core_hours_added += job.core_hours_delta
        else:
            self.cores_returned -= job.cores_delta
            self.core_hours_returned -= job.core_hours_delta
        self.jobs_gpus_waited += job.gpus_waited
        self.jobs_baseline_unknown += job.baseline == "unknown"
        self.sources[job.source] += 1

    def as_json(self) -> dict[str, Any]:
        share = (
            100.0 * self.gpu_hours_waiting / self.gpu_hours_sampled
            if self.gpu_hours_sampled > 0
            else None
        )
        return {
            "name": self.name,
            "jobs": self.jobs,
            "cpu_jobs": self.cpu_jobs,
            "gpu_hours": hours(self.gpu_hours),
            "gpu_hours_waiting": hours(self.gpu_hours_waiting),
            "waiting_share_pct": None if share is None else round(share, 1),
            "idle_core_hours": hours(self.idle_core_hours),
            "cores_added": hours(self.cores_added),
            "cores_returned": hours(self.cores_returned),
            "core_hours_added": hours(self.core_hours_added),
            "core_hours_returned": hours(self.core_hours_returned),
            "jobs_gpus_waited": self.jobs_gpus_waited,
            "jobs_baseline_unknown": self.jobs_baseline_unknown,
            "jobs_from_profile": self.sources["profile"],
            "jobs_from_prior": self.sources["prior"],
            "jobs_from_default": self.sources["default"],
            "jobs_without_record": self.sources["unrecorded"],
        }


def hours(value: float) -> float:
    """A figure as the report shows it: two decimals (``--json`` holds these very values)."""
    return round(value + 0.0, 2) + 0.0


def group_jobs(summaries: Iterable[JobSummary]) -> tuple[list[list[JobSummary]], list[JobSummary]]:
    """(GPU jobs, each its summaries; CPU jobs' summaries, one per job)."""
    by_job: dict[int, list[JobSummary]] = {}
    for s in summaries:
        by_job.setdefault(s.job_id, []).append(s)
    gpu, cpu = [], []
    for nodes in by_job.values():
        if any(s.gpus > 0 for s in nodes):
            gpu.append(nodes)
        else:
            cpu.append(nodes[0])
    return gpu, cpu


def group_name(item: JobFigures | JobSummary, key: str) -> str:
    return getattr(item, key) or UNKNOWN


def _by_day(jobs: Sequence[JobFigures], window: Window) -> list[dict[str, Any]]:
    """GPU-hours and GPU-hours waiting per UTC day of the window, by the day jobs ended."""
    first = dt.datetime.fromtimestamp(window.since_unix_s, dt.UTC).date()
    last = dt.datetime.fromtimestamp(window.until_unix_s - 1e-3, dt.UTC).date()
    days: dict[str, list[float]] = {}
    day = first
    while day <= last:
        days[day.isoformat()] = [0.0, 0.0]
        day += dt.timedelta(days=1)
    for job in jobs:
        key = dt.datetime.fromtimestamp(job.end_unix_s, dt.UTC).date().isoformat()
        if key in days:
            days[key][0] += job.gpu_hours
            days[key][1] += job.gpu_hours_waiting
    return [
        {"day": k, "gpu_hours": hours(v[0]), "gpu_hours_waiting": hours(v[1])}
        for k, v in days.items()
    ]


def _groups(
    jobs: Sequence[JobFigures], cpu: Sequence[JobSummary], key: str
) -> list[dict[str, Any]]:
    tallies: dict[str, Tally] = {}
    for job in jobs:
        name = group_name(job, key)
        tallies.setdefault(name, Tally(name)).add(job)
    for s in cpu:
        name = group_name(s, key)
        tallies.setdefault(name, Tally(name)).cpu_jobs += 1
    rows = [t.as_json() for t in tallies.values()]
    rows.sort(key=lambda r: (-r["gpu_hours_waiting"], -r["gpu_hours"], r["name"]))
    return rows


@dataclass(frozen=True, slots=True)
class ProfileChange:
    signature: str
    workload: str
    cpus_per_gpu: int
    updated_unix_s: float
    source: str


def figures(
    summaries: Iterable[JobSummary], baselines: Baselines
) -> tuple[list[JobFigures], list[JobSummary]]:
    """(the GPU jobs' figures, the CPU jobs' summaries) of deduplicated summaries."""
    gpu_nodes, cpu = group_jobs(summaries)
    return [job_figures(nodes, baselines) for nodes in gpu_nodes], cpu


def build_report(
    jobs: Sequence[JobFigures],
    cpu: Sequence[JobSummary],
    window: Window,
    baselines: Baselines,
    *,
    by: str = "user",
    problems: tuple[int, Sequence[str]] = (0, ()),
    profiles: Sequence[ProfileChange] | None = None,
    profiles_why: str | None = None,
    generated_unix_s: float = 0.0,
    summaries_read: int = 0,
) -> dict[str, Any]:
    """The report document from :func:`figures` of the window's summaries, deduplicated
    (:func:`coda_common.store.summaries.latest`); ``problems`` (count, first few) what the
    scan skipped; ``profiles`` the profiles updated in the window, None when the store could
    not be read (``profiles_why``)."""
    site = Tally("site")
    for job in jobs:
        site.add(job)
    site.cpu_jobs = len(cpu)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_unix_s": round(generated_unix_s, 3),
        "window": _window_json(window),
        "by": by,
        "summaries": summaries_read,
        "totals": site.as_json(),
        "groups": {key: _groups(jobs, cpu, key) for key in GROUP_KEYS},
        "daily": _by_day(jobs, window),
        "baseline": {
            "slurm_conf": baselines.source,
            "why": baselines.why,
            "def_cpu_per_gpu": baselines.global_cpg,
            "partitions": dict(sorted(baselines.partitions.items())),
        },
        "profiles_changed": _profiles_json(profiles, profiles_why),
        "problems": {"count": problems[0], "first": list(problems[1])},
    }


def _window_json(window: Window) -> dict[str, Any]:
    return {
        "since_unix_s": window.since_unix_s,
        "until_unix_s": window.until_unix_s,
        "since": utc_text(window.since_unix_s),
        "until": utc_text(window.until_unix_s),
        "days": round(window.days, 2),
    }


def _profiles_json(profiles: Sequence[ProfileChange] | None, why: str | None) -> dict[str, Any]:
    if profiles is None:
        return {"read": False, "why": why, "count": None, "profiles": []}
    ordered = sorted(profiles, key=lambda p: (-p.updated_unix_s, p.signature))
    return {
        "read": True,
        "why": why,
        "count": len(ordered),
        "profiles": [
            {
                "signature": p.signature,
                "workload": p.workload,
                "cpus_per_gpu": p.cpus_per_gpu,
                "updated": utc_text(p.updated_unix_s),
                "source": p.source,
            }
            for p in ordered
        ],
    }


def utc_text(unix_s: float) -> str:
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def user_jobs(jobs: Iterable[JobFigures]) -> dict[str, list[JobFigures]]:
    """Each named user's GPU jobs, oldest first (the per-user mails)."""
    out: dict[str, list[JobFigures]] = {}
    for job in jobs:
        if job.user != UNKNOWN:
            out.setdefault(job.user, []).append(job)
    for jobs in out.values():
        jobs.sort(key=lambda j: (j.end_unix_s, j.job_id))
    return out
