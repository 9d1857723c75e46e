"""One job's report, in the spirit of ``seff`` and Princeton's ``jobstats``: what CODA decided
at submission, what the job asked, the cores it had, what it used, and whether its GPUs were
waiting on the CPU.

Sources, each named in the report:

- ``sacct`` (slurmdbd): the allocation, times, state and ``TotalCPU`` (the CPU time of the
  job's finished steps, from the kernel's rusage) or, while a step runs, its
  ``TRESUsageInTot`` ``cpu=``; the hook's record from ``AdminComment``;
- coda-node's view of this node (``NodeRuntimeDir/view.json``) while the job runs here: its
  GPUs' utilisation, the cores it uses and has, and whether coda-node throttled neighbours
  for it;
- once the job has ended, the job summaries coda-node wrote (``JobSummaryDir``; one per
  node): the GPU-waiting verdict and, per node, what coda-node saw and did;
- the hook's decision: the admin comment's record, else a summary's, else the decision
  journal's entry (:mod:`slurm_plugin.cli.jobdecision` says which, and why).

Job names are users' text: ``|``, line breaks and bytes that are not UTF-8 are all possible.
The structured query therefore holds no free text, and the name and the admin comment are
read by queries of one field for one record, whose whole output is the value.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coda_common.store.jobsummary import JobSummary
from coda_common.store.summaries import SummaryStore
from slurm_plugin.cli.jobdecision import (
    MAX_NAMESAKE_CHECKS,
    SOURCE_WORDS,
    SUBMIT_MATCH_S,
    admin_records,
    choose_decision,
    finished_verdict,
    from_admin_text,
    match_journal,
    summary_json,
)
from slurm_plugin.hook.journal import JournalRead, read_journal

SCHEMA_VERSION = 1
"""Version of the ``--json`` document; keys are only ever added."""

SACCT_TIMEOUT_S = 30.0
JOURNAL_LOOKBACK_S = 60.0
"""Journal entries this far either side of a job's submit time are read for it."""
JOURNAL_MAX_READ = 256 << 20
"""Of a journal file larger than this only its end is read (as ``coda-slurm status``)."""

SACCT_FIELDS = (
    "JobIDRaw",
    "JobID",
    "State",
    "User",
    "UID",
    "Partition",
    "NNodes",
    "NodeList",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocCPUS",
    "ReqTRES",
    "AllocTRES",
    "TotalCPU",
    "TRESUsageInTot",
    "ExitCode",
)
"""The structured query (``sacct -P -j JOBID``): none of these holds a user's text.
``JobIDRaw`` is what JOBID is matched with (an array task's own id; ``JobID`` is
``<array job>_<index>`` there)."""

GPU_BUSY_PCT = 80.0
"""GPUs at least this busy are not waiting on anything."""
CPU_BOUND_SHARE = 0.9
"""A job using this share of its cores is CPU-bound."""


class ReportError(RuntimeError):
    """The job cannot be reported; ``args`` are (what, why)."""


@dataclass(frozen=True, slots=True)
class SacctRecord:
    """The job's own line (the allocation) and its steps' lines of the structured query."""

    job: dict[str, str]
    steps: list[dict[str, str]]


def run_sacct(args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """``sacct ARGS``'s stdout, bytes that are not UTF-8 replaced; ReportError on failure."""
    try:
        proc = subprocess.run(
            ["sacct", *args],
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=SACCT_TIMEOUT_S,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise ReportError("sacct not found", "install Slurm's client commands") from None
    except subprocess.TimeoutExpired:
        raise ReportError("sacct did not answer", f"no reply in {SACCT_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        raise ReportError("sacct failed", proc.stderr.strip() or f"exit {proc.returncode}")
    return proc.stdout


def parse_structured(text: str, job_id: int) -> SacctRecord:
    """The lines of ``sacct -P -n -j JOBID --format=<SACCT_FIELDS>`` as dicts."""
    job: dict[str, str] | None = None
    steps: list[dict[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS):
            raise ReportError(
                "cannot read sacct's output",
                f"{len(values)} fields in {line[:80]!r}, expected {len(SACCT_FIELDS)}",
            )
        row = dict(zip(SACCT_FIELDS, values, strict=True))
        if row["JobIDRaw"] == str(job_id):
            job = row
        elif row["JobIDRaw"].startswith(f"{job_id}."):
            steps.append(row)
    if job is None:
        raise ReportError(f"no job {job_id} in Slurm's accounting", "sacct lists no such job")
    return SacctRecord(job, steps)


def one_value(text: str) -> str:
    """The value of a one-field, one-record ``sacct -P -n`` query: the whole output but the
    last line break (a value may hold line breaks and ``|`` itself)."""
    return text[:-1] if text.endswith("\n") else text


def parse_tres(text: str) -> dict[str, str]:
    """``billing=8,cpu=8,gres/gpu=2,node=1`` -> ``{"cpu": "8", "gres/gpu": "2", ...}``."""
    out: dict[str, str] = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if eq and name:
            out[name.strip()] = value.strip()
    return out


def tres_int(tres: Mapping[str, str], name: str) -> int | None:
    value = tres.get(name, "")
    return int(value) if value.isdigit() else None


def tres_gpus(tres: Mapping[str, str]) -> int | None:
    """``gres/gpu=N``, else the sum of typed ``gres/gpu:TYPE=N``."""
    total = tres_int(tres, "gres/gpu")
    if total is not None:
        return total
    typed = [int(v) for k, v in tres.items() if k.startswith("gres/gpu:") and v.isdigit()]
    return sum(typed) if typed else None


_DURATION = re.compile(r"^(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def parse_duration_s(text: str) -> float | None:
    """Slurm's CPU times: ``MM:SS.mmm``, ``HH:MM:SS``, ``D-HH:MM:SS``; None when empty."""
    m = _DURATION.match(text.strip())
    if m is None:
        return None
    days, hours, minutes, seconds = m.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _time(text: str) -> str | None:
    return None if text.strip() in ("", "Unknown", "None") else text.strip()


def cpu_used(record: SacctRecord) -> tuple[float | None, str]:
    """(CPU seconds the job used, where the number comes from).  ``TotalCPU`` counts the
    job's finished steps; while a step runs it is 0, and the steps' ``TRESUsageInTot``
    ``cpu=`` (jobacct_gather's last poll) says more."""
    total = parse_duration_s(record.job["TotalCPU"])
    polled = [
        parse_duration_s(parse_tres(step["TRESUsageInTot"]).get("cpu", "")) for step in record.steps
    ]
    polled_s = (
        sum(p for p in polled if p is not None) if any(p is not None for p in polled) else None
    )
    if total and (polled_s is None or total >= polled_s):
        return total, "sacct TotalCPU"
    if polled_s is not None:
        return polled_s, "sacct TRESUsageInTot"
    return total, "sacct TotalCPU"


def decision(admin_comment: str) -> dict[str, Any] | None:
    """The hook's record in the admin comment, or None when it holds none."""
    return from_admin_text(admin_comment)


def node_samples(status: Mapping[str, Any] | None, job_id: int) -> dict[str, Any] | None:
    """What coda-node's view (``coda_node.status.document`` document) says about the job now."""
    if not status:
        return None
    for job in status.get("jobs") or []:
        if job.get("job_id") == job_id:
            daemon = status.get("daemon") or {}
            return {
                "node": (status.get("node") or {}).get("name"),
                "daemon": daemon.get("status"),
                "gpu_util_pct": job.get("gpu_util_pct"),
                "cpu_rate_cores": job.get("cpu_rate_cores"),
                "cores_allocated": job.get("cores_allocated"),
                "cores_in_force": job.get("cores_in_force"),
                "throttle_level": job.get("throttle_level"),
                "profile_state": job.get("profile_state"),
            }
    return None


def gpu_wait_verdict(samples: Mapping[str, Any] | None, state: str) -> dict[str, str]:
    """Whether the job's GPUs were waiting on the CPU: ``yes``, ``no``, or ``unknown`` with
    why.  Only coda-node's GPU samples can say; CPU time alone cannot."""
    if samples is None:
        why = (
            "no job summary from coda-node for it in JobSummaryDir"
            if state not in ("RUNNING", "SUSPENDED")
            else "coda-node on the job's node reported nothing for it here"
        )
        return {"verdict": "unknown", "why": f"no GPU samples ({why})"}
    gpu = samples.get("gpu_util_pct")
    if gpu is None:
        return {
            "verdict": "unknown",
            "why": "no GPU samples (coda-node read no GPU utilisation: no NVML on the node?)",
        }
    used = samples.get("cpu_rate_cores")
    cores = samples.get("cores_in_force") or samples.get("cores_allocated")
    if gpu >= GPU_BUSY_PCT:
        return {"verdict": "no", "why": f"GPUs {gpu:.0f}% busy"}
    if used is not None and cores and used >= CPU_BOUND_SHARE * cores:
        return {
            "verdict": "yes",
            "why": f"GPUs {gpu:.0f}% busy while the job used {used:.1f} of its {cores:g} cores",
        }
    spare = (
        f" with cores to spare ({used:.1f} of {cores:g} used)" if used is not None and cores else ""
    )
    return {"verdict": "no", "why": f"GPUs {gpu:.0f}% busy{spare}: not waiting on the CPU"}


def _used(record: SacctRecord, elapsed_s: int | None, cores: int | None) -> dict[str, Any]:
    """The report's ``used``: CPU time, mean cores and the share of its cores it used."""
    cpu_s, cpu_source = cpu_used(record)
    mean_cores = cpu_s / elapsed_s if cpu_s is not None and elapsed_s else None
    efficiency = 100.0 * mean_cores / cores if mean_cores is not None and cores else None
    return {
        "cpu_s": cpu_s,
        "mean_cores": mean_cores,
        "cpu_efficiency_pct": efficiency,
        "source": cpu_source,
    }


def build_report(
    job_id: int,
    record: SacctRecord,
    name: str,
    admin_comment: str,
    status: Mapping[str, Any] | None = None,
    summaries: Sequence[JobSummary] = (),
    journal: tuple[Mapping[str, Any] | None, str] | None = None,
    journal_tokens: Collection[str] | None = None,
) -> dict[str, Any]:
    """The report document (``--json``; schema_version :data:`SCHEMA_VERSION`).
    ``summaries``: the job's summaries (one per node, ended jobs); ``journal``: the decision
    journal's match (:func:`slurm_plugin.cli.jobdecision.match_journal`), None unread;
    ``journal_tokens``: the journal's tokens, where the admin comment holds several records."""
    job = record.job
    req = parse_tres(job["ReqTRES"])
    alloc = parse_tres(job["AllocTRES"])
    state = job["State"].split()[0] if job["State"].strip() else "UNKNOWN"
    elapsed_s = _int(job["ElapsedRaw"])
    cores = _int(job["AllocCPUS"]) or tres_int(alloc, "cpu")
    samples = node_samples(status, job_id)
    coda, coda_source = choose_decision(admin_comment, summaries, journal, journal_tokens)
    if samples is None and summaries and state not in ("RUNNING", "SUSPENDED"):
        waiting = finished_verdict(summaries)
    else:
        waiting = gpu_wait_verdict(samples, state)
    return {
        "schema_version": SCHEMA_VERSION,
        "job_id": job_id,
        "job_id_text": job["JobID"],
        "name": name,
        "user": job["User"],
        "state": state,
        "exit_code": job["ExitCode"],
        "partition": job["Partition"],
        "nodes": _int(job["NNodes"]),
        "node_list": job["NodeList"],
        "submit": _time(job["Submit"]),
        "start": _time(job["Start"]),
        "end": _time(job["End"]),
        "elapsed_s": elapsed_s,
        "coda": coda,
        "coda_source": coda_source,
        "admin_comment": admin_comment,
        "asked": {
            "gpus": tres_gpus(req),
            "cores": tres_int(req, "cpu"),
            "nodes": tres_int(req, "node"),
            "tres": job["ReqTRES"],
        },
        "allocated": {
            "gpus": tres_gpus(alloc),
            "cores": cores,
            "tres": job["AllocTRES"],
        },
        "used": _used(record, elapsed_s, cores),
        "node_samples": samples,
        "summaries": [summary_json(s) for s in sorted(summaries, key=lambda s: s.node)],
        "gpus_waiting_on_cpu": waiting,
    }


def sacct_time_s(text: str) -> float | None:
    """sacct's ``2026-12-07T20:32:24`` (local time, as sacct prints it) as unix seconds."""
    value = _time(text)
    if value is None:
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def fetch_report(
    job_id: int,
    *,
    status: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    summary_store: SummaryStore | None = None,
    journal_path: Path | Sequence[Path] | None = None,
) -> dict[str, Any]:
    """Query sacct for ``job_id`` and build its report (:func:`build_report`), with the
    job's summaries from ``summary_store`` and its entry in the journal at ``journal_path``
    (each None: not read; several paths: each controller's journal)."""
    fields = ",".join(SACCT_FIELDS)
    record = parse_structured(
        run_sacct(["-P", "-n", "-j", str(job_id), f"--format={fields}"], env), job_id
    )
    one = ["-P", "-n", "-X", "-j", str(job_id)]
    name = one_value(run_sacct([*one, "--format=JobName"], env))
    admin_comment = one_value(run_sacct([*one, "--format=AdminComment"], env))
    end_s = sacct_time_s(record.job["End"])
    summaries: list[JobSummary] = []
    if summary_store is not None and end_s is not None:
        try:
            summaries = summary_store.find_job(job_id, around_s=end_s)
        except OSError:  # the store's directory unreadable here (a login node): none
            summaries = []
    journal = tokens = None
    paths = [journal_path] if isinstance(journal_path, Path) else list(journal_path or ())
    if paths and decision(admin_comment) is None:
        journal = _journal_match(paths, record, name, summaries, env)
    if paths and len(admin_records(admin_comment)) > 1:
        tokens = _journal_tokens(paths, sacct_time_s(record.job["Submit"]))
    return build_report(job_id, record, name, admin_comment, status, summaries, journal, tokens)


def _read_journals(paths: Sequence[Path], since_s: float) -> JournalRead:
    """The entries since ``since_s`` of every controller's journal, oldest first, and the
    files read; OSError from the first that cannot be read."""
    out = JournalRead()
    for path in paths:
        read = read_journal(path, since_s, max_file_bytes=JOURNAL_MAX_READ)
        out.entries += read.entries
        out.files += read.files
    out.entries.sort(key=lambda e: float(e["t"]))
    return out


def _journal_tokens(paths: Sequence[Path], submit_s: float | None) -> set[str] | None:
    """The tokens of the journals' entries around ``submit_s``; None when unreadable."""
    if submit_s is None:
        return None
    try:
        read = _read_journals(paths, submit_s - JOURNAL_LOOKBACK_S)
    except OSError:
        return None
    return {
        e["tok"]
        for e in read.entries
        if isinstance(e.get("tok"), str) and float(e["t"]) <= submit_s + JOURNAL_LOOKBACK_S
    }


def _journal_match(
    paths: Sequence[Path],
    record: SacctRecord,
    name: str,
    summaries: Sequence[JobSummary],
    env: Mapping[str, str] | None,
) -> tuple[Mapping[str, Any] | None, str] | None:
    """The job's entry in the decision journal (:func:`match_journal`); None when there is
    no submit time to look from or the journal cannot be read."""
    submit_s = sacct_time_s(record.job["Submit"])
    if submit_s is None:
        return None
    try:
        read = _read_journals(paths, submit_s - JOURNAL_LOOKBACK_S)
    except OSError as exc:
        return None, f"cannot read {exc.filename or paths[0]}: {exc.strerror or exc}"
    if not read.files:
        return None, f"no journal at {', '.join(str(p) for p in paths)}"
    tokens = [from_admin_text(s.record or "") for s in summaries]
    token = next((t["token"] for t in tokens if t and t.get("token")), None)
    uid = _int(record.job["UID"])
    try:
        others = 1 if token or uid is None else namesakes(record, uid, name, submit_s, env)
    except ReportError as exc:
        return None, f"ambiguous: sacct did not say which jobs share its name ({exc.args[0]})"
    return match_journal(
        (e for e in read.entries if float(e["t"]) <= submit_s + JOURNAL_LOOKBACK_S),
        token=token,
        uid=uid,
        job_name=name,
        submit_unix_s=submit_s,
        namesakes=others,
    )


def namesakes(
    record: SacctRecord, uid: int, name: str, submit_s: float, env: Mapping[str, str] | None
) -> int:
    """The submissions of user ``uid`` named ``name`` within SUBMIT_MATCH_S of
    ``submit_s`` in Slurm's accounting, this job's included (an array's tasks are one
    submission). Names are read one job at a time: they are users' text."""
    window = [
        dt.datetime.fromtimestamp(submit_s + d).strftime("%Y-%m-%dT%H:%M:%S")
        for d in (-SUBMIT_MATCH_S, SUBMIT_MATCH_S + 1)
    ]
    query = ["-P", "-n", "-X", "-u", str(uid), "-S", window[0], "-E", window[1]]
    text = run_sacct([*query, "--format=JobIDRaw,JobID,Submit"], env)
    own = record.job["JobID"].split("_")[0]
    others: set[str] = set()
    for line in text.splitlines():
        raw, job_id, submit = [*line.split("|"), "", "", ""][:3]
        when = sacct_time_s(submit)
        if when is None or abs(when - submit_s) > SUBMIT_MATCH_S:
            continue
        if raw != record.job["JobIDRaw"] and job_id.split("_")[0] != own:
            others.add(raw)
    if len(others) > MAX_NAMESAKE_CHECKS:
        return 1 + len(others)
    one = ["-P", "-n", "-X", "--format=JobName", "-j"]
    same = sum(one_value(run_sacct([*one, raw], env)) == name for raw in sorted(others))
    return 1 + same


_REQUEST_UNITS = {"cpg": "cores per GPU", "cpt": "cores per task"}


def _asked_cores(coda: Mapping[str, Any] | None, asked: Mapping[str, Any]) -> str:
    """The cores the user asked for: the hook's record of the request before it (ReqTRES
    holds Slurm's minimum, ``cpu=1``, when only GPUs were asked), else ReqTRES's."""
    if coda is None:
        return f"{asked['cores'] if asked['cores'] is not None else '?'} cores"
    kind, _, count = (coda["user_request"] or "").partition(":")
    if kind in _REQUEST_UNITS:
        return f"{count} {_REQUEST_UNITS[kind]}"
    return "no core count"


_WRITTEN = frozenset({"set", "default", "raise", "lower", "replace"})
_SOURCES = {
    "profile": "the user's own profile",
    "global": "the shared profile",
    "default": "DefaultCpusPerGpu",
    "none": "no confident profile",
}


def _source_words(src: str) -> str:
    """A record's ``src=`` in words."""
    if src.startswith("prior:"):
        return f'the prior "{src[len("prior:") :]}" the job names (no profile of its own yet)'
    return _SOURCES.get(src, src)


def _decided(coda: Mapping[str, Any]) -> str:
    """The hook's decision in words: what it wrote, or why it wrote nothing."""
    cpg, action = coda["cpus_per_gpu"], coda["action"]
    source = _source_words(coda["source"])
    if coda["gpus_per_node"] == 0:  # a CPU-only job's record (MemBwSpreadGres)
        units = coda.get("mem_bw_units")
        if units:
            return f"CPU-only job, memory-bound: {units} units of memory bandwidth per node"
        return "CPU-only job: recorded so coda-node measures its memory bandwidth"
    if action in _WRITTEN:
        text = f"{cpg} cores per GPU ({action}, from {source})"
    elif action == "advise":
        text = f"would {coda['would']} {cpg} cores per GPU (advise: nothing written)"
    elif action == "keep":
        hint = f"; {cpg} per GPU predicted" if cpg is not None else ""
        text = f"kept the user's request ({source}{hint})"
    else:
        text = f"left the job as submitted ({action}, {source})"
    kind, _, count = (coda["user_request"] or "").partition(":")
    if kind in _REQUEST_UNITS:
        text += f"; the user asked {count} {_REQUEST_UNITS[kind]}"
    return text


def _summary_line(n: Mapping[str, Any]) -> str:
    """One node's job summary in words: what coda-node saw, then what it did."""

    def num(value: float | None, fmt: str = "{:.1f}") -> str:
        return "?" if value is None else fmt.format(value)

    util = n["gpu_util_pct_mean"]
    gpus = f"GPUs {num(util, '{:.0f}')}% busy" if n["gpus"] else "no GPUs"
    did = [
        f"probed {n['probes']}x ({n['probe_s']:.0f} s)",
        f"slimmed {n['slim_s']:.0f} s",
        f"throttled {n['throttled_s']:.0f} s",
        f"protected {n['protected_s']:.0f} s",
    ]
    return (
        f"{n['node']}: {gpus}, used {num(n['cpu_used_cores_mean'])} of "
        f"{n['cores_mean']:.1f} cores it had ({n['cores_allocated']} allocated), "
        f"{n['idle_core_s'] / 3600:.2f} idle core-hours; {', '.join(did)}"
    )


def render(report: Mapping[str, Any]) -> str:
    """The human table: one line per fact, the verdict last."""

    def num(value: float | None, fmt: str = "{:g}", unit: str = "") -> str:
        return "?" if value is None else fmt.format(value) + unit

    width = len("GPUs waiting on CPU")
    coda = report["coda"]
    source = report.get("coda_source") or {}
    if coda is None:
        decided = "no coda record (the hook left the job alone, or was not loaded)"
        if source.get("why") and report["admin_comment"]:
            decided += f"\n{'':{width}}  {source['why']}"
    else:
        decided = _decided(coda)
        if coda["message"]:
            decided += f"\n{'':{width}}  {coda['message']}"
        if source.get("source") not in (None, "admin_comment"):
            decided += f"\n{'':{width}}  from {SOURCE_WORDS[source['source']]}: {source['why']}"
    asked, alloc, used = report["asked"], report["allocated"], report["used"]
    samples = report["node_samples"]
    name = report["name"].encode("unicode_escape").decode("ascii")  # one line, printable
    rows = [
        ("Job", f"{report['job_id_text']} {name} ({report['user']}, {report['partition']})"),
        ("State", f"{report['state']} exit {report['exit_code']}"),
        ("Nodes", f"{report['nodes']} ({report['node_list']})"),
        (
            "Ran",
            f"{report['start'] or '-'} to {report['end'] or '-'}, "
            f"{num(report['elapsed_s'], unit=' s')}",
        ),
        ("CODA decided", decided),
        ("Asked", f"{num(asked['gpus'])} GPUs, {_asked_cores(coda, asked)} ({asked['tres']})"),
        ("Had", f"{num(alloc['gpus'])} GPUs, {num(alloc['cores'])} cores"),
        (
            "Used",
            f"{num(used['cpu_s'], '{:.1f}', ' CPU-s')}, {num(used['mean_cores'], '{:.2f}')} "
            f"cores on average, {num(used['cpu_efficiency_pct'], '{:.0f}', '%')} of its cores "
            f"({used['source']})",
        ),
    ]
    if report.get("summaries"):
        rows.extend(("coda-node", _summary_line(n)) for n in report["summaries"])
    elif samples is not None:
        rows.append(
            (
                "coda-node",
                f"{samples['node']}: GPUs {num(samples['gpu_util_pct'], '{:.0f}', '%')} busy, "
                f"using {num(samples['cpu_rate_cores'], '{:.1f}')} of "
                f"{num(samples['cores_in_force'])} cores, profile {samples['profile_state']}",
            )
        )
    else:
        rows.append(("coda-node", "no samples"))
    wait = report["gpus_waiting_on_cpu"]
    rows.append(("GPUs waiting on CPU", f"{wait['verdict']}: {wait['why']}"))
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
