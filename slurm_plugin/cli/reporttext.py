"""``coda-slurm report`` in words: the terminal page (a verdict, the site's figures, a table
of the groups, most GPU-hours waiting first) and the plain-text mail to each user. Every
number shown is one of the ``--json`` document's, printed by :func:`fmt`."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_plugin.cli.sitereport import JobFigures, Window, hours, utc_text

TOP_ROWS = 20
"""Groups in the terminal table (all of them are in --json)."""
NAME_CHARS = 24
"""A group's name is cut to this many characters in the table."""
IDLE_CORES_PER_GPU = 2.0
"""A job that held, on average, this many unused cores per GPU is pointed out to its user."""
MAIL_JOBS = 200
"""Jobs listed in one user's mail (the newest; all are counted)."""
PROBLEMS_SHOWN = 5
MAIL_COLUMNS = 78
"""The mail's prose is wrapped at this width (its job table is as wide as it needs)."""

COLUMNS: tuple[tuple[str, str], ...] = (
    ("JOBS", "jobs"),
    ("GPU-H", "gpu_hours"),
    ("WAIT-H", "gpu_hours_waiting"),
    ("WAIT%", "waiting_share_pct"),
    ("WAITED", "jobs_gpus_waited"),
    ("IDLE-CORE-H", "idle_core_hours"),
    ("+CORES", "cores_added"),
    ("-CORES", "cores_returned"),
    ("PROFILE", "jobs_from_profile"),
    ("PRIOR", "jobs_from_prior"),
    ("DEFAULT", "jobs_from_default"),
    ("NO-REC", "jobs_without_record"),
    ("BASE?", "jobs_baseline_unknown"),
)
"""The table's columns: heading, key of a group's row in --json."""


def fmt(value: Any) -> str:
    """A number as the report prints it: integers as they are, hours and cores with two
    decimals, a share with one; ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def cut(name: str, chars: int = NAME_CHARS) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "~"


def verdict(doc: Mapping[str, Any]) -> str:
    """The report in one sentence."""
    t = doc["totals"]
    if t["jobs"] == 0:
        return "No GPU job summaries in this window."
    if t["waiting_share_pct"] is None:
        return (
            f"{t['jobs']} GPU jobs, {fmt(t['gpu_hours'])} GPU-hours; coda-node read no GPU "
            "utilisation for them, so whether their GPUs waited on CPUs is unknown."
        )
    groups = doc["groups"][doc["by"]]
    top = groups[0] if groups and groups[0]["gpu_hours_waiting"] > 0 else None
    most = (
        f"; most in {doc['by']} {cut(top['name'])} ({fmt(top['gpu_hours_waiting'])} GPU-hours)"
        if top
        else ""
    )
    return (
        f"GPUs waited on their CPUs for {fmt(t['gpu_hours_waiting'])} of "
        f"{fmt(t['gpu_hours'])} GPU-hours ({fmt_pct(t['waiting_share_pct'])} of the time "
        f"measured){most}."
    )


def site_lines(doc: Mapping[str, Any]) -> list[str]:
    """The site's figures, the baseline, the profiles and the skipped summaries."""
    t, w = doc["totals"], doc["window"]
    lines = [
        f"Site report {w['since']} to {w['until']} ({w['days']:g} days), by {doc['by']}",
        verdict(doc),
        "",
        f"Jobs:      {t['jobs']} GPU jobs ({t['jobs_gpus_waited']} whose GPUs waited), "
        f"{t['cpu_jobs']} CPU jobs throttled; {doc['summaries']} summaries read",
        f"GPU time:  {fmt(t['gpu_hours'])} GPU-hours, {fmt(t['gpu_hours_waiting'])} waiting "
        f"on CPU ({fmt_pct(t['waiting_share_pct'])}); {fmt(t['idle_core_hours'])} core-hours "
        "held idle",
        f"Sized by:  {t['jobs_from_profile']} measured profile, {t['jobs_from_prior']} prior, "
        f"{t['jobs_from_default']} default/none, {t['jobs_without_record']} no coda record",
        f"Cores:     {fmt(t['cores_added'])} added, {fmt(t['cores_returned'])} returned "
        f"({fmt(t['core_hours_added'])} / {fmt(t['core_hours_returned'])} core-hours); "
        f"baseline unknown for {t['jobs_baseline_unknown']} jobs",
        f"Baseline:  {baseline_words(doc['baseline'])}",
        f"Profiles:  {profiles_words(doc['profiles_changed'])}",
    ]
    problems = doc["problems"]
    lines.append(f"Skipped:   {problems['count']} summaries or files (damaged or refused)")
    lines += [f"           {p}" for p in problems["first"][:PROBLEMS_SHOWN]]
    return lines


def baseline_words(b: Mapping[str, Any]) -> str:
    if b["slurm_conf"] is None:
        return f"the user's own request only ({b['why']})"
    parts = [f"DefCpuPerGPU {b['def_cpu_per_gpu']}"] if b["def_cpu_per_gpu"] else []
    parts += [f"{cut(name)}={n}" for name, n in list(b["partitions"].items())[:8]]
    return f"the user's request, else {', '.join(parts) or 'no DefCpuPerGPU'} ({b['slurm_conf']})"


def profiles_words(p: Mapping[str, Any]) -> str:
    if not p["read"]:
        return f"not read ({p['why']})"
    names = ", ".join(f"{cut(x['workload'])} {x['cpus_per_gpu']}/GPU" for x in p["profiles"][:5])
    return f"{p['count']} changed in the window" + (f": {names}" if names else "")


def table(rows: Sequence[Mapping[str, Any]], by: str, limit: int = TOP_ROWS) -> list[str]:
    """The groups as an aligned table, most GPU-hours waiting first."""
    head = [by.upper(), *(h for h, _ in COLUMNS)]
    body = [
        [cut(r["name"])]
        + [fmt_pct(r[k]) if k == "waiting_share_pct" else fmt(r[k]) for _, k in COLUMNS]
        for r in rows[:limit]
    ]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    out = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in [head, *body]
    ]
    if len(rows) > limit:
        out.append(f"... and {len(rows) - limit} more (all in --json)")
    return out


def render(doc: Mapping[str, Any]) -> str:
    return "\n".join([*site_lines(doc), "", *table(doc["groups"][doc["by"]], doc["by"])])


def _job_line(job: JobFigures) -> str:
    share = job.waiting_share
    sized = (
        f"{job.cpg}/GPU ({job.source})" if job.baseline != "unchanged" else f"yours ({job.source})"
    )
    return (
        f"  {job.job_id:>10}  {utc_text(job.end_unix_s)[:16]}  {cut(job.partition, 12):<12}"
        f"  {job.gpus:>4}  {fmt(hours(job.gpu_hours)):>8}"
        f"  {fmt_pct(None if share is None else 100 * share):>6}"
        f"  {fmt(hours(job.idle_core_hours)):>11}  {sized}"
    )


def idle_heavy(job: JobFigures) -> bool:
    return job.gpu_hours > 0 and job.idle_core_hours >= IDLE_CORES_PER_GPU * job.gpu_hours


def suggestions(jobs: Sequence[JobFigures]) -> list[str]:
    """What the user can do, in plain words, one point a line."""
    waited = [j for j in jobs if j.gpus_waited]
    idle = [j for j in jobs if idle_heavy(j)]
    own = [j for j in waited if j.baseline == "unchanged" and j.source != "unrecorded"]
    out = []
    if waited:
        out.append(
            f"- {len(waited)} of your {len(jobs)} jobs had GPUs waiting on their CPUs for 20% "
            f"or more of the time measured (jobs {_ids(waited)}). coda gives a workload more "
            "cores per GPU as it learns it, so the next runs should wait less."
        )
    if own:
        out.append(
            f"- {len(own)} of them kept the cores you asked for (jobs {_ids(own)}): leave "
            "--cpus-per-gpu out and coda sizes them, or ask for more."
        )
    if idle:
        out.append(
            f"- {len(idle)} jobs held {IDLE_CORES_PER_GPU:g} or more unused cores per GPU on "
            f"average (jobs {_ids(idle)}): those cores could have run other jobs. Ask for "
            "fewer, or leave --cpus-per-gpu out and let coda size the job."
        )
    return out or ["- Nothing to change: your GPUs rarely waited on CPUs and few cores sat idle."]


def _ids(jobs: Sequence[JobFigures], most: int = 8) -> str:
    ids = ", ".join(str(j.job_id) for j in jobs[:most])
    return ids + (f" and {len(jobs) - most} more" if len(jobs) > most else "")


def user_mail(user: str, jobs: Sequence[JobFigures], window: Window) -> str:
    """One user's plain-text mail: suggestions first, figures after, then the jobs."""
    gpu_h = sum(j.gpu_hours for j in jobs)
    sampled = sum(j.gpu_hours_sampled for j in jobs)
    waiting = sum(j.gpu_hours_waiting for j in jobs)
    share = fmt_pct(100 * waiting / sampled if sampled else None)
    lines = [
        f"Your GPU jobs, {utc_text(window.since_unix_s)} to {utc_text(window.until_unix_s)}",
        f"User: {user}",
        "",
        "In short:",
        *(textwrap.fill(s, MAIL_COLUMNS, subsequent_indent="  ") for s in suggestions(jobs)),
        "",
        textwrap.fill(
            f"Jobs: {len(jobs)}; GPU-hours: {fmt(hours(gpu_h))}; GPUs waiting on CPUs: "
            f"{fmt(hours(waiting))} GPU-hours ({share} of the time measured); cores held "
            f"idle: {fmt(hours(sum(j.idle_core_hours for j in jobs)))} core-hours",
            MAIL_COLUMNS,
        ),
        "",
        f"  {'JOB':>10}  {'ENDED (UTC)':<16}  {'PARTITION':<12}  {'GPUS':>4}  {'GPU-H':>8}"
        f"  {'WAIT%':>6}  {'IDLE-CORE-H':>11}  CORES",
    ]
    shown = jobs[-MAIL_JOBS:]
    if len(jobs) > len(shown):
        lines.append(f"  (the newest {len(shown)} of {len(jobs)} jobs)")
    lines += [_job_line(j) for j in shown]
    lines += [
        "",
        "WAIT%: the share of the time measured that the job's GPUs were under 80% busy",
        "while it used 90% or more of its cores. CORES: what coda gave it per GPU and from",
        "what (profile: its measured profile; prior: a model's figure; default; yours: your",
        "own request, kept).",
    ]
    return "\n".join(lines) + "\n"
