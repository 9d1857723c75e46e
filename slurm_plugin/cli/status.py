"""``coda-slurm status``: what the submit hook did and how it is doing, on one screen.

It reads what the hook leaves behind on the controller, and recomputes nothing the hook
decided:

- ``HookStatsFile``: the hook's counters (calls, p50/p99 in-hook time, fail-opens), rewritten
  by slurmctld every ``ReloadIntervalS``;
- ``DecisionJournal`` (and its rotated ``.1``): one line per decision
  (:mod:`slurm_plugin.hook.journal`), summed over ``--since``;
- with several ``SlurmctldHost`` in slurm.conf, both of every controller, each in its own
  files (:mod:`slurm_plugin.config.controllers`): shown per controller, the decisions of all
  of them summed;
- ``ProfileStore``: the workload profiles, their age;
- ``squeue``, only when the hook looks idle or absent: were jobs submitted that it never saw?
- ``squeue --json`` and ``scontrol show config`` when the window holds decisions: which of
  them Slurm kept. slurmctld validates much of a submission after job_submit, so a decision
  counts only when a job of Slurm's holds its token (:func:`slurm_plugin.hook.journal.reconcile`).

It reads nothing of the nodes: a node's own view is ``coda-node status`` there, the nodes
side by side are Prometheus's (coda-node's ``/metrics``).

Each part ends in a plain-language verdict when something is off. ``--json`` prints the same
data (``schema_version`` :data:`SCHEMA_VERSION`; keys are only ever added).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from coda_common.cli import CliError, conf_option, emit_json
from coda_common.config.codaconf import CodaConfig, load_config
from coda_common.config.paths import default_conf_path, slurm_conf_for
from coda_common.model.starter import STARTER_SOURCE
from coda_common.slurm.conffile import ConfigError
from coda_common.store.profiles import ProfileFormatError, ProfileStore, StoreUnavailable
from slurm_plugin.cli.profiles import format_age, format_table
from slurm_plugin.config.controllers import Controllers, read_controllers
from slurm_plugin.decision.decide import ADMIN_PREFIX, parse_admin_record
from slurm_plugin.hook.journal import read_journal, reconcile, rotated_path, summarize_decisions

SCHEMA_VERSION = 1
STATS_FORMAT = "coda-hook-stats"
STATS_FORMAT_VERSION = 1
IDLE_S = 3600.0
"""No hook call for this long makes status ask squeue whether jobs were submitted."""
SQUEUE_TIMEOUT_S = 5.0
"""squeue retries for about 9 s when slurmctld is down; status does not wait that long."""
PROFILE_ROWS = 20
"""Profiles shown on the screen (all of them are in --json)."""

_SINCE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

SLURM_TIMEOUT_S = 30.0
"""``squeue --json`` of a large cluster takes a while; status waits this long for it."""
SETTLE_S = 60.0
"""A decision this recent may belong to a submission slurmctld is still working on (waiting
for its job write lock): it is not judged refused when Slurm has no job for it yet."""

SubmitTimes = Callable[[], list[float]]
"""Returns the submit times (unix s) of the jobs slurmctld knows; raises OSError or
subprocess.SubprocessError when it cannot tell."""


@dataclass(frozen=True, slots=True)
class SlurmTokens:
    """The decision tokens in the admin records of the jobs slurmctld holds."""

    tokens: frozenset[str]
    queried_unix_s: float
    """When slurmctld was asked (before the answer: its jobs were there at that time)."""
    min_job_age_s: float
    """slurmctld's MinJobAge: how long it holds a job after the job ended."""
    sees_all_jobs: bool = True
    """False when ``PrivateData=jobs`` hid other users' jobs from the query (not run as root
    or SlurmUser): a token missing from it proves nothing."""


SlurmLookup = Callable[[], SlurmTokens]
"""Asks Slurm (normally :func:`slurm_tokens`); raises OSError or subprocess.SubprocessError
when it cannot tell."""


def parse_since(text: str) -> float:
    """``1d``, ``6h``, ``30m``, ``90s``, ``2w`` (also ``1.5h``) in seconds; ValueError else."""
    m = _SINCE.fullmatch(text.strip().lower())
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 1d, 6h, 30m or 90s")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True, slots=True)
class Verdict:
    level: str
    """``ok``, ``info``, ``warn`` or ``error``."""
    topic: str
    """``hook``, ``store``, ``journal``, ``decisions`` or ``conf``."""
    message: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "topic": self.topic, "message": self.message}


# -- reading what the hook left behind --------------------------------------------------------


def _stats_bytes(path: Path) -> bytes | str:
    """The bytes of the stats file, or why it is not read: not a regular file (a FIFO there
    must not hang the command), or larger than any the hook writes."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > MAX_STATS_FILE_BYTES:
            return (
                f"{st.st_size:,} bytes, more than {MAX_STATS_FILE_BYTES:,}: not a hook stats file"
            )
        return f.read()


def _is_time(value: Any) -> bool:
    return _is_number(value) and 0 <= value < _YEAR_10000_UNIX_S


def _is_us(value: Any) -> bool:
    return _is_number(value) and value >= 0


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_YEAR_10000_UNIX_S = 253402300800
MAX_STATS_FILE_BYTES = 1 << 20
"""The most a hook stats file holds (the hook writes about a kilobyte)."""
_STATS_FIELDS: tuple[tuple[Callable[[Any], bool], str, tuple[str, ...]], ...] = (
    (
        _is_time,
        "a time",
        (
            "started_unix_s",
            "written_unix_s",
            "conf_loaded_unix_s",
            "store_refreshed_unix_s",
            "last_call_unix_s",
        ),
    ),
    (
        _is_count,
        "a count",
        (
            "calls",
            "gpu_jobs",
            "changed",
            "rejected",
            "fail_open",
            "over_budget",
            "cpu_jobs",
            "window",
            "profiles",
            "pid",
        ),
    ),
    (_is_us, "microseconds", ("p50_us", "p99_us", "max_us")),
    (_is_text, "text", ("store_error", "conf", "mode", "profile_store", "host")),
)
"""What each field of the hook stats document holds when present (null: unknown)."""
_JOURNAL_FIELDS: tuple[tuple[Callable[[Any], bool], str, tuple[str, ...]], ...] = (
    (_is_count, "a count", ("written", "dropped", "pending")),
    (_is_text, "text", ("path", "error")),
)


def _stats_problem(doc: dict[str, Any]) -> str | None:
    """The first field of a hook stats document that holds what the hook never writes (a
    damaged file), as ``"<field> is <value>, expected <what>"``; None when there is none."""
    journal = doc.get("journal")
    if journal is not None and not isinstance(journal, dict):
        return f"journal is {_short(journal)}, expected an object"
    tables = [("", doc, _STATS_FIELDS)]
    if journal is not None:
        tables.append(("journal.", journal, _JOURNAL_FIELDS))
    for prefix, where, fields in tables:
        for ok, what, names in fields:
            for name in names:
                value = where.get(name)
                if value is not None and not ok(value):
                    return f"{prefix}{name} is {_short(value)}, expected {what}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def read_hook_stats(path: Path | None, now_unix_s: float, interval_s: float) -> dict[str, Any]:
    """``{"path", "state", "error", "age_s", "stats"}``; state is ``ok``, ``stale``,
    ``missing``, ``unreadable`` or ``disabled`` (HookStatsFile empty)."""
    out: dict[str, Any] = {
        "path": None if path is None else str(path),
        "state": "disabled",
        "error": None,
        "age_s": None,
        "stale_after_s": stale_after_s(interval_s),
        "stats": None,
    }
    if path is None:
        return out
    try:
        data = _stats_bytes(path)
        if isinstance(data, str):
            out.update(state="unreadable", error=data)
            return out
        doc = json.loads(data)
    except FileNotFoundError:
        out["state"] = "missing"
        return out
    except OSError as exc:
        out.update(state="unreadable", error=exc.strerror or str(exc))
        return out
    except ValueError as exc:
        out.update(state="unreadable", error=f"not JSON: {exc}")
        return out
    except RecursionError:
        out.update(state="unreadable", error="not JSON: nested too deeply")
        return out
    if not isinstance(doc, dict) or doc.get("format") != STATS_FORMAT:
        out.update(
            state="unreadable", error=f'not a hook stats file (no "format": "{STATS_FORMAT}")'
        )
        return out
    version = doc.get("format_version")
    if version != STATS_FORMAT_VERSION:
        newer = isinstance(version, int) and version > STATS_FORMAT_VERSION
        why = "written by a newer coda; upgrade coda-slurm" if newer else "unknown"
        out.update(state="unreadable", error=f"format_version {version!r} ({why})")
        return out
    problem = _stats_problem(doc)
    if problem is not None:
        out.update(state="unreadable", error=f"not a hook stats file: {problem}")
        return out
    written = doc.get("written_unix_s")
    age_s = now_unix_s - written if isinstance(written, int | float) else None
    out.update(
        stats=doc,
        age_s=age_s,
        state="ok" if age_s is not None and age_s <= out["stale_after_s"] else "stale",
    )
    return out


def stale_after_s(interval_s: float) -> float:
    """The hook rewrites its stats every ReloadIntervalS; three missed writes (at least 30 s)
    mean slurmctld or the plugin is not running."""
    return max(3 * interval_s, 30.0)


def read_store(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(summary, profiles)`` of the profile store at ``root``."""
    summary: dict[str, Any] = {
        "path": str(root),
        "readable": True,
        "error": None,
        "profiles": 0,
        "unusable": 0,
        "unusable_files": [],
        "newest_updated_unix_s": None,
        "oldest_updated_unix_s": None,
    }
    rows: list[dict[str, Any]] = []
    try:
        for _path, item in ProfileStore(root).iter_profiles():
            if isinstance(item, ProfileFormatError):
                summary["unusable"] += 1
                summary["unusable_files"].append({"path": item.path, "problem": item.problem})
                continue
            rows.append(
                {
                    "signature": item.signature,
                    "workload": item.workload,
                    "cpus_per_gpu": item.cpus_per_gpu,
                    "multi_node_cpus_per_gpu": item.multi_node_cpus_per_gpu,
                    "confidence": item.confidence,
                    "n_samples": item.n_samples,
                    "updated_unix_s": item.updated_unix_s,
                    "source": item.source,
                    "jobs": 0,
                }
            )
    except StoreUnavailable as exc:
        cause = exc.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        summary.update(readable=False, error=why)
        return summary, []
    summary["profiles"] = len(rows)
    summary["starter"] = sum(1 for r in rows if r["source"] == STARTER_SOURCE)
    if rows:
        summary["newest_updated_unix_s"] = max(r["updated_unix_s"] for r in rows)
        summary["oldest_updated_unix_s"] = min(r["updated_unix_s"] for r in rows)
    return summary, rows


def squeue_submit_times() -> list[float]:
    """Submit times of every job slurmctld still knows (``squeue -a -t all``, local time)."""
    proc = subprocess.run(
        ["squeue", "-h", "-a", "-t", "all", "-o", "%V"],
        capture_output=True,
        text=True,
        timeout=SQUEUE_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise subprocess.SubprocessError(proc.stderr.strip() or f"exit {proc.returncode}")
    times: list[float] = []
    for line in proc.stdout.split():
        try:
            times.append(datetime.strptime(line, "%Y-%m-%dT%H:%M:%S").timestamp())
        except ValueError:
            continue  # "N/A"
    return times


_MIN_JOB_AGE = re.compile(r"^MinJobAge\s*=\s*([0-9]+)\s*sec", re.MULTILINE)
_PRIVATE_DATA = re.compile(r"^PrivateData\s*=\s*(\S*)", re.MULTILINE)
_SLURM_USER = re.compile(r"^SlurmUser\s*=\s*([^(\s]*)\(([0-9]+)\)", re.MULTILINE)


def _slurm_command(argv: list[str]) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, errors="replace", timeout=SLURM_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"exit {proc.returncode}"
        raise subprocess.SubprocessError(f"{' '.join(argv)}: {why}")
    return proc.stdout


def parse_min_job_age_s(config_text: str) -> float:
    """MinJobAge from ``scontrol show config``; ValueError when it is not there."""
    m = _MIN_JOB_AGE.search(config_text)
    if m is None:
        raise ValueError("scontrol show config printed no MinJobAge")
    return float(m.group(1))


def parse_slurm_tokens(squeue_json: str) -> frozenset[str]:
    """The ``tok`` of the hook's record (the last ``coda:sig=`` one) in the admin comment of
    each job of ``squeue --json`` (22.05 to 26.05: ``jobs[].admin_comment``, a string).
    ValueError when the text is not that document."""
    doc = json.loads(squeue_json)
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("squeue --json printed no job list")
    tokens: set[str] = set()
    for job in jobs:
        comment = job.get("admin_comment") if isinstance(job, dict) else None
        if not isinstance(comment, str):
            continue
        start = comment.rfind(ADMIN_PREFIX)
        if start < 0:
            continue
        try:
            token = parse_admin_record(comment[start:]).get("tok")
        except ValueError:
            continue
        if token:
            tokens.add(token)
    return frozenset(tokens)


def sees_all_jobs(config_text: str, euid: int) -> bool:
    """Whether ``squeue`` run as ``euid`` lists every user's jobs: root and SlurmUser always
    do; others unless ``PrivateData`` hides jobs (``jobs`` or ``all``)."""
    m = _SLURM_USER.search(config_text)
    if euid == 0 or (m is not None and int(m.group(2)) == euid):
        return True
    private = _PRIVATE_DATA.search(config_text)
    hidden = {p.strip().lower() for p in private.group(1).split(",")} if private else set()
    return not hidden & {"jobs", "all"}


def slurm_tokens() -> SlurmTokens:
    """Ask slurmctld for the tokens of every job it holds, and its MinJobAge."""
    config = _slurm_command(["scontrol", "show", "config"])
    age_s = parse_min_job_age_s(config)
    queried_unix_s = time.time()
    text = _slurm_command(["squeue", "--json", "--all", "--states=all"])
    try:
        tokens = parse_slurm_tokens(text)
    except ValueError as exc:
        raise subprocess.SubprocessError(f"squeue --json: {exc}") from None
    return SlurmTokens(tokens, queried_unix_s, age_s, sees_all_jobs(config, os.geteuid()))


def slurmctld_log_hint(slurm_conf: Path | None) -> str:
    """Where slurmctld logs: ``SlurmctldLogFile=`` of slurm.conf, else syslog/journald."""
    if slurm_conf is not None:
        try:
            text = slurm_conf.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            m = re.match(r"\s*slurmctldlogfile\s*=\s*(\S+)", line, re.IGNORECASE)
            if m:
                return m.group(1).strip('"')
    return "slurmctld's log (journalctl -u slurmctld)"


# -- the status document --------------------------------------------------------------------


def collect_status(
    cfg: CodaConfig,
    conf_path: Path,
    since_s: float,
    now_unix_s: float,
    submit_times: SubmitTimes | None = None,
    slurm_lookup: SlurmLookup | None = None,
) -> dict[str, Any]:
    """Everything ``coda-slurm status`` shows, as the ``--json`` document.

    ``submit_times`` (normally :func:`squeue_submit_times`) is asked only when the hook
    looks idle or absent; None skips that check. ``slurm_lookup`` (normally
    :func:`slurm_tokens`) is asked which decisions Slurm kept when the window holds any;
    None counts them all, unchecked."""
    since_unix_s = now_unix_s - since_s
    controllers, ctld_error = read_controllers(slurm_conf_for(conf_path, cfg.slurm_conf))
    per_host, entries = _controllers_status(cfg, controllers, since_unix_s, now_unix_s)
    hook = _active_hook(per_host)
    journal = _merged_journal(cfg, per_host)
    store, profiles = read_store(Path(cfg.profile_store))
    slurm = _check_slurm(entries, now_unix_s, slurm_lookup)
    decisions = summarize_decisions(slurm.pop("_counted"))
    used = decisions["profiles_used"]
    for row in profiles:
        row["jobs"] = used.get(row["signature"], 0)
    profiles.sort(key=lambda r: (-r["jobs"], -r["updated_unix_s"], r["signature"]))

    submissions = _check_submissions(hook, now_unix_s, submit_times)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "generated_unix_s": now_unix_s,
        "since_s": since_s,
        "since_unix_s": since_unix_s,
        "conf": {
            "path": str(conf_path),
            "mode": cfg.mode,
            "user_value": cfg.user_value,
            "hook_budget_ms": cfg.hook_budget_ms,
            "reload_interval_s": cfg.reload_interval_s,
            "slurmctld_log": slurmctld_log_hint(cfg.slurm_conf),
        },
        "hook": hook,
        "controllers": per_host,
        "controllers_error": ctld_error,
        "store": store,
        "profiles": profiles,
        "journal": journal,
        "decisions": decisions,
        "slurm": slurm,
        "submissions": submissions,
    }
    doc["verdicts"] = [v.to_json() for v in verdicts(doc)]
    return doc


def _controllers_status(
    cfg: CodaConfig, controllers: Controllers, since_unix_s: float, now_unix_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(doc["controllers"], entries)``: each controller's hook stats and journal (one
    when slurm.conf lists one controller and the paths name no host), and the journal
    entries of all of them since ``since_unix_s``, oldest first."""
    stats_files = controllers.files(cfg.hook_stats_file)
    journal_files = controllers.files(cfg.decision_journal)
    hosts = list(dict.fromkeys([*controllers.hosts, *stats_files, *journal_files]))
    if not hosts:
        hosts = [controllers.this]
    per_host: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    for index, host in enumerate(hosts):
        hook = read_hook_stats(stats_files.get(host), now_unix_s, cfg.reload_interval_s)
        journal, found = _journal_since(journal_files.get(host), cfg, since_unix_s)
        entries += found
        per_host.append(
            {
                "host": host,
                "role": "primary" if index == 0 else "backup",
                "this_host": host == controllers.this,
                "hook": hook,
                "journal": journal,
                "decisions": sum(1 for e in found if e.get("update") is None),
                "updates": sum(1 for e in found if e.get("update") is not None),
            }
        )
    entries.sort(key=lambda e: float(e["t"]))
    return per_host, entries


def _last_call_unix_s(hook: dict[str, Any]) -> float:
    value = (hook["stats"] or {}).get("last_call_unix_s")
    return float(value) if isinstance(value, int | float) else 0.0


def _active_hook(per_host: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc["hook"]``: the hook of the controller in control, as far as the files tell:
    of those whose stats are current, the one called last (the primary when none was)."""
    current = [c for c in per_host if c["hook"]["state"] == "ok"] or per_host
    return max(current, key=lambda c: _last_call_unix_s(c["hook"]))["hook"]


def _merged_journal(cfg: CodaConfig, per_host: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc["journal"]``: the controllers' journals as one: every file read, the counts
    summed, the oldest entry of any; the first error."""
    journals = [c["journal"] for c in per_host]
    if len(journals) == 1:
        return journals[0]
    oldest = [j["oldest_unix_s"] for j in journals if j["oldest_unix_s"] is not None]
    errors = [j["error"] for j in journals if j["error"]]
    return {
        "path": None if cfg.decision_journal is None else str(cfg.decision_journal),
        "max_bytes": cfg.journal_max_bytes,
        "files": [f for j in journals for f in j["files"]],
        "malformed": sum(j["malformed"] for j in journals),
        "newer_format": sum(j["newer_format"] for j in journals),
        "oldest_unix_s": min(oldest) if oldest else None,
        "unread_bytes": sum(j["unread_bytes"] for j in journals),
        "error": errors[0] if errors else None,
    }


def _journal_since(
    path: Path | None, cfg: CodaConfig, since_unix_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(journal, entries)``: one decision journal's files and counts, and its entries
    since ``since_unix_s`` (none when there is no journal or it cannot be read)."""
    journal: dict[str, Any] = {
        "path": None if path is None else str(path),
        "max_bytes": cfg.journal_max_bytes,
        "files": [],
        "malformed": 0,
        "newer_format": 0,
        "oldest_unix_s": None,
        "unread_bytes": 0,
        "error": None,
    }
    entries: list[dict[str, Any]] = []
    if path is not None:
        try:
            # The hook rotates a file at JournalMaxBytes; one far longer is not its own.
            read = read_journal(path, since_unix_s, max_file_bytes=2 * cfg.journal_max_bytes)
        except OSError as exc:
            journal["error"] = exc.strerror or str(exc)
        else:
            entries = read.entries
            journal.update(
                files=[str(p) for p in read.files],
                malformed=read.malformed,
                newer_format=read.newer_format,
                oldest_unix_s=read.oldest_unix_s,
                unread_bytes=read.unread_bytes,
            )
    return journal, entries


def _check_slurm(
    entries: list[dict[str, Any]], now_unix_s: float, lookup: SlurmLookup | None
) -> dict[str, Any]:
    """``doc["slurm"]``: how many decisions Slurm kept, refused or could not tell about;
    ``_counted`` holds the entries to sum (taken out by the caller)."""
    out: dict[str, Any] = {
        "asked": False,
        "error": None,
        "kept": 0,
        "refused": 0,
        "unchecked": 0,
        "min_job_age_s": None,
        "settle_s": SETTLE_S,
    }
    found: SlurmTokens | None = None
    if lookup is not None and any(isinstance(e.get("tok"), str) for e in entries):
        out["asked"] = True
        try:
            found = lookup()
        except subprocess.TimeoutExpired:
            out["error"] = f"Slurm did not answer within {SLURM_TIMEOUT_S:g} s"
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            out["error"] = str(exc) or type(exc).__name__
    if found is not None and not found.sees_all_jobs:
        out["error"] = "PrivateData hides other users' jobs from you: run as root or SlurmUser"
        found = None
    result = reconcile(
        entries,
        None if found is None else found.tokens,
        queried_unix_s=now_unix_s if found is None else found.queried_unix_s,
        min_job_age_s=0.0 if found is None else found.min_job_age_s,
        settle_s=SETTLE_S,
    )
    out.update(
        kept=result.kept,
        refused=result.refused,
        unchecked=result.unchecked,
        min_job_age_s=None if found is None else found.min_job_age_s,
        _counted=result.entries,
    )
    return out


def _last_seen_unix_s(hook: dict[str, Any]) -> float | None:
    """When the hook was last known to see a submission (or to start, if it saw none)."""
    stats = hook["stats"] or {}
    for key in ("last_call_unix_s", "started_unix_s"):
        value = stats.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _check_submissions(
    hook: dict[str, Any], now_unix_s: float, submit_times: SubmitTimes | None
) -> dict[str, Any]:
    """Jobs submitted after the hook's last call, asked of squeue only when the hook looks
    idle (no call for IDLE_S) or absent; the common case costs nothing."""
    out: dict[str, Any] = {"checked": False, "after_unix_s": None, "jobs": None, "error": None}
    last = _last_seen_unix_s(hook)
    idle = last is None or now_unix_s - last > IDLE_S or hook["state"] != "ok"
    if not idle or submit_times is None:
        return out
    after = max(last or 0.0, now_unix_s - IDLE_S)
    out.update(checked=True, after_unix_s=after)
    try:
        times = submit_times()
    except subprocess.TimeoutExpired:
        out["error"] = f"squeue did not answer within {SQUEUE_TIMEOUT_S:g} s"
        return out
    except (OSError, subprocess.SubprocessError) as exc:
        out["error"] = str(exc) or type(exc).__name__
        return out
    # squeue shows whole seconds and the job record is made just after the hook returns.
    out["jobs"] = sum(1 for t in times if t > after + 2.0)
    return out


# -- verdicts ---------------------------------------------------------------------------------


def _ago(now: float, t: float | None) -> str:
    return "never" if t is None else format_age(now - t)


@dataclass(frozen=True, slots=True)
class _Facts:
    """The parts of a status document the verdict rules read."""

    doc: dict[str, Any]
    now: float
    conf: dict[str, Any]
    hook: dict[str, Any]
    stats: dict[str, Any]
    store: dict[str, Any]
    journal: dict[str, Any]
    dec: dict[str, Any]
    sub: dict[str, Any]
    slurm: dict[str, Any]
    log: str
    submitted: str
    """``; squeue shows N job(s) ... that it did not see``, or empty."""

    @classmethod
    def of(cls, doc: dict[str, Any]) -> _Facts:
        now = doc["generated_unix_s"]
        sub = doc["submissions"]
        submitted = ""
        if sub["checked"] and sub["jobs"]:
            submitted = (
                f"; squeue shows {sub['jobs']} job(s) submitted since "
                f"{_ago(now, sub['after_unix_s'])} that it did not see"
            )
        return cls(
            doc=doc,
            now=now,
            conf=doc["conf"],
            hook=doc["hook"],
            stats=doc["hook"]["stats"] or {},
            store=doc["store"],
            journal=doc["journal"],
            dec=doc["decisions"],
            sub=sub,
            slurm=doc["slurm"],
            log=doc["conf"]["slurmctld_log"],
            submitted=submitted,
        )

    @property
    def journal_read(self) -> bool:
        """The journal is configured, readable and written."""
        j = self.journal
        return j["path"] is not None and not j["error"] and bool(j["files"])


Rule = Callable[[_Facts], Verdict | None]
"""One health rule: its verdict, or None when it has nothing to say."""


def _hook_state(f: _Facts) -> Verdict | None:
    hook, log, submitted = f.hook, f.log, f.submitted
    if hook["state"] == "disabled":
        return Verdict(
            "info", "hook", "HookStatsFile is empty in coda.conf: the hook keeps no counters"
        )
    if hook["state"] == "missing":
        return Verdict(
            "error",
            "hook",
            f"the hook has not written stats at {hook['path']}: is JobSubmitPlugins=coda "
            f"set and slurmctld restarted?{submitted}",
        )
    if hook["state"] == "unreadable":
        return Verdict("error", "hook", f"cannot read {hook['path']}: {hook['error']}")
    if hook["state"] == "stale":
        return Verdict(
            "error",
            "hook",
            f"the hook last wrote {hook['path']} {_ago(f.now, f.stats.get('written_unix_s'))} "
            f"(every {f.conf['reload_interval_s']:g} s when running): slurmctld is stopped or "
            f"job_submit/coda is not loaded; grep 'job_submit/coda' {log}{submitted}",
        )
    if submitted:
        return Verdict(
            "error",
            "hook",
            f"no hook call for {_ago(f.now, _last_seen_unix_s(hook)).removesuffix(' ago')}"
            f"{submitted}: check JobSubmitPlugins in slurm.conf and grep "
            f"'job_submit/coda' {log}",
        )
    return None


def _slurm_unasked(f: _Facts) -> Verdict | None:
    if not f.slurm["error"]:
        return None
    return Verdict(
        "info",
        "decisions",
        f"could not ask Slurm which decisions it kept ({f.slurm['error']}): "
        "submissions it refused after the hook are counted as jobs",
    )


def _squeue_unasked(f: _Facts) -> Verdict | None:
    if not (f.sub["checked"] and f.sub["error"]):
        return None
    down = f.hook["state"] in ("missing", "stale")
    return Verdict(
        "info",
        "hook",
        f"could not ask squeue about recent submissions: {f.sub['error']}"
        + ("; is slurmctld running?" if down else ""),
    )


def _hook_fail_open(f: _Facts) -> Verdict | None:
    fail_open = int(f.stats.get("fail_open") or 0)
    if not fail_open:
        return None
    over = int(f.stats.get("over_budget") or 0)
    last = f.dec["fail_open"]["last_error"]
    return Verdict(
        "warn",
        "hook",
        f"{fail_open} job(s) passed unchanged after a hook failure since slurmctld "
        f"started ({over} over HookBudgetMs)"
        + (f"; last: {last}" if last else "")
        + f"; see grep 'job passes unchanged' {f.log}",
    )


def _hook_slow(f: _Facts) -> Verdict | None:
    p99_us = f.stats.get("p99_us")
    budget_us = f.conf["hook_budget_ms"] * 1000.0
    if not (isinstance(p99_us, int | float) and p99_us > budget_us / 2):
        return None
    return Verdict(
        "warn",
        "hook",
        f"p99 in-hook time {p99_us / 1000:.1f} ms is over half of HookBudgetMs="
        f"{f.conf['hook_budget_ms']:g}: slower calls pass jobs unchanged",
    )


def _hook_store_error(f: _Facts) -> Verdict | None:
    if not f.stats.get("store_error"):
        return None
    return Verdict(
        "error", "store", f"the hook cannot read the profile store: {f.stats['store_error']}"
    )


def _hook_journal_write(f: _Facts) -> Verdict | None:
    jstats = f.stats.get("journal") or {}
    if jstats.get("error"):
        return Verdict(
            "error",
            "journal",
            f"the hook cannot write {jstats.get('path')}: {jstats['error']} "
            f"({jstats.get('dropped', 0)} decision(s) not journaled)",
        )
    if jstats.get("dropped"):
        return Verdict(
            "warn",
            "journal",
            f"{jstats['dropped']} decision(s) were not journaled since slurmctld "
            f"started; see 'cannot write DecisionJournal' in {f.log}",
        )
    return None


def _store_state(f: _Facts) -> Verdict | None:
    store = f.store
    if not store["readable"]:
        return Verdict(
            "error",
            "store",
            f"cannot read the profile store {store['path']}: {store['error']} (the hook "
            "keeps serving the profiles it last read)",
        )
    if store["profiles"] == 0 and not store["unusable"]:
        return Verdict(
            "info",
            "store",
            "no profiles yet: GPU jobs keep their own value, DefaultCpusPerGpu or Slurm's "
            "default until coda-node or an admin publishes one",
        )
    return None


def _store_unusable(f: _Facts) -> Verdict | None:
    if not f.store["unusable"]:
        return None
    return Verdict(
        "warn",
        "store",
        f"{f.store['unusable']} profile file(s) unusable: `coda-slurm profiles list` says why",
    )


def _journal_state(f: _Facts) -> Verdict | None:
    journal = f.journal
    if journal["path"] is None:
        return Verdict(
            "info",
            "journal",
            "DecisionJournal is empty in coda.conf: no history here; decisions are only "
            f"in {f.log}",
        )
    if journal["error"]:
        return Verdict("error", "journal", f"cannot read {journal['path']}: {journal['error']}")
    if journal["files"]:
        return None
    gpu_jobs = int(f.stats.get("gpu_jobs") or 0)
    if gpu_jobs:
        return Verdict(
            "warn",
            "journal",
            f"the hook decided {gpu_jobs} GPU job(s) but {journal['path']} does not "
            f"exist: see 'cannot write DecisionJournal' in {f.log}",
        )
    return Verdict(
        "info",
        "journal",
        f"no decision journal at {journal['path']} yet (no GPU job decided since "
        "the plugin started)",
    )


def _journal_malformed(f: _Facts) -> Verdict | None:
    if not (f.journal_read and f.journal["malformed"]):
        return None
    return Verdict(
        "warn",
        "journal",
        f"{f.journal['malformed']} unreadable line(s) in {f.journal['path']} skipped",
    )


def _journal_unread(f: _Facts) -> Verdict | None:
    if not (f.journal_read and f.journal["unread_bytes"]):
        return None
    return Verdict(
        "warn",
        "journal",
        f"{f.journal['unread_bytes']:,} bytes at the start of {f.journal['path']} (or its .1) "
        f"not read: the file is longer than twice JournalMaxBytes={f.journal['max_bytes']}, "
        "the size the hook rotates it at",
    )


def _journal_newer_format(f: _Facts) -> Verdict | None:
    if not (f.journal_read and f.journal["newer_format"]):
        return None
    return Verdict(
        "warn",
        "journal",
        f"{f.journal['newer_format']} entries were written by a newer coda and "
        "skipped: upgrade coda-slurm on this host",
    )


def _journal_rotated_away(f: _Facts) -> Verdict | None:
    journal = f.journal
    if not f.journal_read:
        return None
    oldest = journal["oldest_unix_s"]
    files = journal["files"]
    rotated = any(str(rotated_path(Path(p))) in files for p in files)
    if not rotated or oldest is None or oldest <= f.doc["since_unix_s"]:
        return None
    return Verdict(
        "warn",
        "journal",
        f"the journal reaches back only {_ago(f.now, oldest).removesuffix(' ago')}, "
        f"not {format_duration(f.doc['since_s'])}: older decisions were rotated "
        f"away; raise JournalMaxBytes (now {journal['max_bytes']})",
    )


def _controller_files(f: _Facts) -> Verdict | None:
    """A controller other than the one in control whose hook stats are not current: its
    slurmctld is down, or its files are on a disk this host does not see."""
    controllers = f.doc.get("controllers") or []
    if len(controllers) < 2:
        return None
    quiet = [
        c
        for c in controllers
        if c["hook"] is not f.hook and c["hook"]["state"] in ("missing", "stale", "unreadable")
    ]
    if not quiet:
        return None
    said = "; ".join(f"{c['host']} ({c['role']}): {_file_state(f.now, c['hook'])}" for c in quiet)
    return Verdict(
        "warn",
        "hook",
        f"{said}: is its slurmctld running (scontrol ping)? Every controller's HookStatsFile "
        "and DecisionJournal must be on storage this host reads for status to show it",
    )


def _file_state(now: float, hook: dict[str, Any]) -> str:
    if hook["state"] == "missing":
        return f"no hook stats at {hook['path']}"
    if hook["state"] == "stale":
        written = (hook["stats"] or {}).get("written_unix_s")
        return f"hook stats at {hook['path']} last written {_ago(now, written)}"
    return f"cannot read {hook['path']}: {hook['error']}"


def _controllers_unread(f: _Facts) -> Verdict | None:
    error = f.doc.get("controllers_error")
    if not error:
        return None
    return Verdict("info", "conf", f"{error}: only this host's files are shown")


def _mode(f: _Facts) -> Verdict | None:
    if f.conf["mode"] == "off":
        return Verdict("warn", "conf", "Mode=off in coda.conf: coda changes no job")
    if f.conf["mode"] == "advise":
        would = f.dec["advise_would_return"]
        return Verdict(
            "info",
            "conf",
            "Mode=advise: no job was changed; Mode=enforce would have returned "
            f"{would['cores']} core(s) from {would['jobs']} job(s) in this window",
        )
    return None


RULES: tuple[Rule, ...] = (
    _hook_state,
    _slurm_unasked,
    _squeue_unasked,
    _hook_fail_open,
    _hook_slow,
    _hook_store_error,
    _hook_journal_write,
    _store_state,
    _store_unusable,
    _journal_state,
    _journal_malformed,
    _journal_unread,
    _journal_newer_format,
    _journal_rotated_away,
    _controller_files,
    _controllers_unread,
    _mode,
)
"""The health rules, in the order their verdicts are shown."""


def verdicts(doc: dict[str, Any]) -> list[Verdict]:
    """What needs the admin's attention, in plain words (pure: reads ``doc`` only): the
    verdict of each of :data:`RULES` that has one, led by ``ok`` when none warns."""
    facts = _Facts.of(doc)
    out = [v for rule in RULES if (v := rule(facts)) is not None]
    if not any(v.level in ("warn", "error") for v in out):
        out.insert(0, Verdict("ok", "all", "nothing needs attention"))
    return out


# -- rendering --------------------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    """``86400`` -> ``1d``, ``5400`` -> ``1.5h``."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNIT_S[unit] and seconds % (_UNIT_S[unit] / 2) == 0:
            return f"{seconds / _UNIT_S[unit]:g}{unit}"
    return f"{seconds:g}s"


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _us(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.0f} µs" if value < 1000 else f"{value / 1000:.1f} ms"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _per_gpu(value: float | None) -> str:
    return "-" if value is None else f"{value:g}/GPU"


_ACTION_ROWS = (
    ("set", "set from a profile"),
    ("default", "DefaultCpusPerGpu"),
    ("raise", "raised the user's value, no profile yet"),
    ("lower", "lowered the user's value"),
    ("replace", "replaced the user's value"),
    ("keep", "kept the user's value"),
    ("advise", "advised only (Mode=advise)"),
    ("skip", "left alone, no confident profile"),
    ("reject", "refused, bad coda: directive"),
)

_LEVEL_COLOUR = {"ok": "green", "info": "blue", "warn": "yellow", "error": "red"}


def _controller_label(c: dict[str, Any]) -> str:
    """``ctl1 (primary, this host): `` as the lines of one controller start."""
    return f"{c['host']} ({c['role']}{', this host' if c['this_host'] else ''}): "


def _several(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The controllers shown one by one: all of them when there are several, else none."""
    controllers = doc.get("controllers") or []
    return controllers if len(controllers) > 1 else []


def _hook_lines(doc: dict[str, Any]) -> list[str]:
    several = _several(doc)
    if not several:
        return _hook_lines_of(doc, doc["hook"], "")
    return [line for c in several for line in _hook_lines_of(doc, c["hook"], _controller_label(c))]


def _hook_lines_of(doc: dict[str, Any], hook: dict[str, Any], label: str) -> list[str]:
    now, conf = doc["generated_unix_s"], doc["conf"]
    stats = hook["stats"] or {}
    if not stats:
        if hook["state"] == "disabled":
            return [f"Hook     {label}no stats (HookStatsFile is empty)"]
        return [f"Hook     {label}no stats at {hook['path']} ({hook['error'] or hook['state']})"]
    return [
        f"Hook     {label}{stats.get('calls', 0)} calls since "
        f"{_when(stats.get('started_unix_s'))}: "
        f"{stats.get('gpu_jobs', 0)} GPU jobs, {stats.get('changed', 0)} changed, "
        f"{stats.get('rejected', 0)} rejected"
        + (f", {stats['cpu_jobs']} CPU jobs recorded" if stats.get("cpu_jobs") else "")
        + f"; last call "
        f"{_ago(now, stats.get('last_call_unix_s'))}",
        f"         in-hook p50 {_us(stats.get('p50_us'))}, p99 {_us(stats.get('p99_us'))} "
        f"(budget {conf['hook_budget_ms']:g} ms); fail-open {stats.get('fail_open', 0)} "
        f"({stats.get('over_budget', 0)} over budget)",
        f"         stats written {_ago(now, stats.get('written_unix_s'))}; coda.conf loaded "
        f"{_ago(now, stats.get('conf_loaded_unix_s'))}; profile store read "
        f"{_ago(now, stats.get('store_refreshed_unix_s'))}",
    ]


def _store_lines(doc: dict[str, Any]) -> list[str]:
    now, store = doc["generated_unix_s"], doc["store"]
    if not store["readable"]:
        return [f"Store    {store['path']}: unreadable ({store['error']})"]
    text = f"Store    {store['path']}: {store['profiles']} profiles"
    if store["profiles"]:
        text += (
            f", newest written {_ago(now, store['newest_updated_unix_s'])}, oldest "
            f"{_ago(now, store['oldest_updated_unix_s'])}"
        )
    if store.get("starter"):
        text += f", {store['starter']} of them the starter table's (priors, not measured)"
    if store["unusable"]:
        text += f", {store['unusable']} unusable"
    return [text]


def _journal_lines(doc: dict[str, Any]) -> list[str]:
    several = _several(doc)
    if not several:
        dec = doc["decisions"]
        return _journal_lines_of(doc, doc["journal"], dec["decisions"], dec.get("updates"), "")
    return [
        line
        for c in several
        for line in _journal_lines_of(
            doc, c["journal"], c["decisions"], c.get("updates"), _controller_label(c)
        )
    ]


def _journal_lines_of(
    doc: dict[str, Any],
    journal: dict[str, Any],
    decisions: int,
    updates: int | None,
    label: str,
) -> list[str]:
    now = doc["generated_unix_s"]
    if journal["path"] is None:
        return [f"Journal  {label}off (DecisionJournal is empty)"]
    if journal["error"]:
        return [f"Journal  {label}{journal['path']}: unreadable ({journal['error']})"]
    if not journal["files"]:
        return [f"Journal  {label}{journal['path']}: not written yet"]
    window = format_duration(doc["since_s"])
    text = f"Journal  {label}{journal['path']}: {decisions} decisions in the last {window}"
    if updates:
        text += f", {updates} pending job(s) decided again after an update"
    if journal["oldest_unix_s"] is not None:
        text += f" (oldest entry {_ago(now, journal['oldest_unix_s'])})"
    return [text]


def _decision_lines(doc: dict[str, Any]) -> list[str]:
    dec, journal = doc["decisions"], doc["journal"]
    lines = [f"Jobs in the last {format_duration(doc['since_s'])}"]
    rows = []
    for action, label in _ACTION_ROWS:
        slot = dec["by_action"].get(action)
        if slot:
            rows.append([f"  {action}", label, str(slot["jobs"]), str(slot["gpus"])])
    if dec["fail_open"]["jobs"]:
        rows.append(
            ["  fail-open", "passed unchanged, hook failed", str(dec["fail_open"]["jobs"]), "-"]
        )
    if rows:
        lines.append(format_table(["  ACTION", "", "JOBS", "GPUS"], rows, right={2, 3}))
        if dec["by_src"]:
            lines.append(f"  by source: {_sources_line(dec['by_src'])}")
        if dec["would"]:
            woulds = ", ".join(f"{k} {v}" for k, v in dec["would"].items())
            lines.append(f"  advise would have: {woulds}")
    elif journal["error"]:
        # Not "none": the journal is there, this user cannot read it (see Journal above).
        lines.append(f"  not known: the decision journal is unreadable ({journal['error']})")
    else:
        lines.append("  no GPU job decided")
    return lines + _slurm_lines(doc["slurm"])


def _slurm_lines(slurm: dict[str, Any]) -> list[str]:
    lines = []
    if slurm["refused"]:
        lines.append(
            f"  {_n(slurm['refused'], 'decision')} {'was' if slurm['refused'] == 1 else 'were'} "
            "for submissions Slurm refused after the hook (not counted)"
        )
    if slurm["unchecked"] and slurm["asked"]:
        age = slurm["min_job_age_s"]
        lines.append(
            f"  {_n(slurm['unchecked'], 'decision')} counted without Slurm's word: decided in "
            f"the last {slurm['settle_s']:g} s"
            + (f" or before MinJobAge={age:g} s, for jobs it no longer holds" if age else "")
        )
    return lines


def _core_lines(dec: dict[str, Any]) -> list[str]:
    avg = dec["asked_vs_given"]
    ret = dec["returned"]
    add = dec["added"]
    none = dec["no_user_value"]
    lines = ["Cores"]
    if avg["jobs"]:
        lines.append(
            f"  asked for a value: {_n(avg['jobs'], 'job')}, {_n(avg['gpus'], 'GPU')}; asked "
            f"{avg['asked_cores']} cores ({_per_gpu(avg['asked_cores_per_gpu'])}), given "
            f"{avg['given_cores']} ({_per_gpu(avg['given_cores_per_gpu'])})"
        )
    else:
        lines.append("  asked for a value: no jobs")
    lines.append(
        f"  returned to the cluster: {_n(ret['cores'], 'core')} from {_n(ret['jobs'], 'job')} "
        "(lowered or replaced)"
    )
    lines.append(
        f"  added to starving jobs: {_n(add['cores'], 'core')} for {_n(add['jobs'], 'job')} "
        "(replaced or raised)"
    )
    if none["jobs"]:
        kept = none["jobs"] - none["given_jobs"]
        lines.append(
            f"  asked for none: {_n(none['jobs'], 'job')}; coda set "
            f"{_n(none['given_cores'], 'core')} "
            f"({_per_gpu(none['given_cores_per_gpu'])}) on {none['given_jobs']}, {kept} kept "
            "Slurm's default"
        )
    would = dec["advise_would_return"]
    if would["jobs"] or dec["advise_would_add"]["jobs"]:
        lines.append(
            f"  Mode=advise: enforce would have returned {would['cores']} cores from "
            f"{_n(would['jobs'], 'job')} and added {dec['advise_would_add']['cores']}"
        )
    return lines


def _profile_lines(doc: dict[str, Any]) -> list[str]:
    now, profiles = doc["generated_unix_s"], doc["profiles"]
    lines = [f"Profiles ({len(profiles)})"]
    if not profiles:
        return [*lines, "  none"]
    rows = [
        [
            f"  {p['signature']}",
            str(p["cpus_per_gpu"]),
            f"{p['confidence']:.2f}",
            str(p["n_samples"]),
            format_age(now - p["updated_unix_s"]),
            str(p["jobs"]),
            _source_cell(p["source"]),
        ]
        for p in profiles[:PROFILE_ROWS]
    ]
    headers = ["  SIGNATURE", "CORES/GPU", "CONFIDENCE", "SAMPLES", "UPDATED", "JOBS", "SOURCE"]
    lines.append(format_table(headers, rows, right={1, 2, 3, 5}))
    if len(profiles) > PROFILE_ROWS:
        lines.append(f"  ... and {len(profiles) - PROFILE_ROWS} more (`coda-slurm profiles list`)")
    return lines


def _verdict_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["Verdict"]
    for v in doc["verdicts"]:
        level = click.style(f"{v['level']:<5}", fg=_LEVEL_COLOUR[v["level"]], bold=True)
        lines.append(f"  {level} {v['message']}")
    return lines


def render(doc: dict[str, Any]) -> str:
    """The screen (plain text; colour is added by click only on a terminal): a title line,
    then blocks of lines separated by an empty one."""
    conf = doc["conf"]
    title = (
        f"coda-slurm status: last {format_duration(doc['since_s'])}, Mode={conf['mode']} "
        f"UserValue={conf['user_value']} ({conf['path']})"
    )
    blocks = (
        [title],
        _hook_lines(doc) + _store_lines(doc) + _journal_lines(doc),
        _decision_lines(doc),
        _core_lines(doc["decisions"]),
        _profile_lines(doc),
        _verdict_lines(doc),
    )
    return "\n\n".join("\n".join(block) for block in blocks)


# -- the command ------------------------------------------------------------------------------


def _load(conf_path: Path) -> CodaConfig:
    try:
        return load_config(conf_path)
    except ConfigError as exc:
        raise CliError(f"cannot load {conf_path}", exc.message) from exc


@click.command("status")
@conf_option()
@click.option(
    "--since",
    "since",
    default="1d",
    show_default=True,
    help="How far back to sum decisions: 1d, 6h, 30m, 2w ...",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(conf_path: Path | None, since: str, as_json: bool) -> None:
    """What the submit hook did and how it is doing: profiles, jobs right-sized, cores
    asked vs given and returned, hook health."""
    try:
        since_s = parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    path = conf_path if conf_path is not None else default_conf_path()
    cfg = _load(path)
    doc = collect_status(cfg, path, since_s, time.time(), squeue_submit_times, slurm_tokens)
    if as_json:
        emit_json(doc)
        return
    click.echo(render(doc))


def _sources_line(by_src: Mapping[str, int]) -> str:
    """``by_src`` for a person: the priors (``prior:NAME``) summed into one item that names
    the most used."""
    priors = sorted(
        ((n, k[len("prior:") :]) for k, n in by_src.items() if k.startswith("prior:")),
        key=lambda item: (-item[0], item[1]),
    )
    items = [f"{k} {v}" for k, v in by_src.items() if not k.startswith("prior:")]
    if priors:
        named = ", ".join(f"{name} {n}" for n, name in priors[:5])
        more = f", {len(priors) - 5} more" if len(priors) > 5 else ""
        items.append(f"prior {sum(n for n, _ in priors)} ({named}{more})")
    return ", ".join(items)


def _source_cell(source: str) -> str:
    """A profile's source for the table: ``starter (prior)`` for a table figure."""
    if source == STARTER_SOURCE:
        return "starter (prior)"
    return source if len(source) <= 32 else source[:31] + "…"
