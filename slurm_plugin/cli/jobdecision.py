"""Where ``coda-slurm job`` finds what the submit hook decided for a job, and whether its
GPUs waited on its CPUs once it has ended.

The hook writes its record into the job's ``AdminComment``. Another tool may replace that
value at job end (Princeton's jobstats epilog: ``sacctmgr update job ... set
AdminComment=JS1:...``), or a job_submit plugin after coda may replace it at submission, so
the record is looked for in three places, in this order, and the report names the one used:

1. ``admin_comment``: the job's ``AdminComment`` (sacct) holds a coda record;
2. ``summary``: a job summary coda-node wrote at the job's end
   (:mod:`coda_common.store.summaries`) holds the record as the node read it while the job
   ran;
3. ``journal``: the hook's decision journal (``DecisionJournal``) has exactly one entry for
   the job: the one whose token the job's record carried, else the one of the same user and
   job name decided within :data:`SUBMIT_MATCH_S` of the job's submit time. Two or more
   such entries are ambiguous: the report says so and takes none.

Pure: the caller reads sacct, the summary store and the journal.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from coda_common.store.jobsummary import JobSummary, wait_verdict
from slurm_plugin.decision.decide import parse_admin_record

SUBMIT_MATCH_S = 2.0
"""A journal entry and a job match by name when the entry's time is this close to the job's
submit time (sacct's Submit has whole seconds; the hook runs before slurmctld stamps it)."""

MAX_NAMESAKE_CHECKS = 20
"""Jobs submitted beside this one whose names are looked up; more count as namesakes."""

JOB_NAME_MAX_CHARS = 128
"""The journal keeps this much of a job's name (slurm_plugin.hook.journal)."""

SOURCE_WORDS = {
    "admin_comment": "the job's AdminComment",
    "summary": "coda-node's job summary",
    "journal": "the hook's decision journal",
}


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def from_admin_text(text: str) -> dict[str, Any] | None:
    """The hook's record in ``text`` (an admin comment, or a record alone) as the report's
    ``coda`` object, or None when it holds none."""
    try:
        fields = parse_admin_record(text)
    except ValueError:
        return None
    start = text.find("coda:sig=")
    end = next((i for i in range(start, len(text)) if text[i].isspace()), len(text))
    return {
        "record": text[start:end],
        "message": (text[:start] + text[end:]).strip() or None,
        "action": fields["action"],
        "would": fields.get("would"),
        "cpus_per_gpu": _int(fields["cpg"]),
        "source": fields["src"],
        "user_request": fields["was"] or None,
        "signature": fields["sig"],
        "gpus_per_node": _int(fields.get("gpn", "")),
        "nodes": _int(fields.get("nodes", "")),
        "mem_bw_units": _int(fields.get("membw", "")),
        "token": fields.get("tok"),
    }


def _text(value: Any) -> str:
    """A journal value as record text: no blanks, ``;`` or ``=`` (the record's syntax)."""
    if value is None or isinstance(value, bool):
        return ""
    text = str(value)
    return "" if any(c.isspace() or c in ";=" for c in text) else text


def from_journal_entry(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """A journal entry (a hook decision) as the report's ``coda`` object; None when the
    entry holds no decision (the hook failed open before deciding)."""
    if not isinstance(entry.get("action"), str) or not isinstance(entry.get("sig"), str):
        return None
    fields = [
        ("sig", entry.get("sig")),
        ("cpg", entry.get("cpg")),
        ("was", entry.get("was")),
        ("action", entry.get("action")),
        ("src", entry.get("src")),
    ]
    if entry.get("would"):
        fields.append(("would", entry.get("would")))
    fields += [("gpn", entry.get("gpn")), ("nodes", entry.get("nodes"))]
    if entry.get("tok"):
        fields.append(("tok", entry.get("tok")))
    coda = from_admin_text("coda:" + ";".join(f"{k}={_text(v)}" for k, v in fields))
    if coda is not None:
        coda["message"] = None
    return coda


def match_journal(
    entries: Iterable[Mapping[str, Any]],
    *,
    token: str | None,
    uid: int | None,
    job_name: str,
    submit_unix_s: float | None,
    namesakes: int = 1,
) -> tuple[Mapping[str, Any] | None, str]:
    """The one journal entry of a job and how it was matched (``token``, ``name and
    submit time``), or (None, why none was taken). ``namesakes``: the submissions of the
    same user and name within :data:`SUBMIT_MATCH_S` that Slurm's accounting holds, this
    one included; with more than one, an entry found by name could be another's (a job
    the hook journaled nothing for, ``coda:off``, matches its namesake's entry)."""
    entries = list(entries)
    if token:
        by_token = [e for e in entries if e.get("tok") == token]
        if len(by_token) == 1:
            return by_token[0], "token"
    if uid is None or submit_unix_s is None:
        return None, "no journal entry with its token, and no user or submit time to match"
    name = job_name[:JOB_NAME_MAX_CHARS]
    near = [
        e
        for e in entries
        if e.get("uid") == uid
        and e.get("job") == name
        and isinstance(e.get("t"), int | float)
        and abs(float(e["t"]) - submit_unix_s) <= SUBMIT_MATCH_S
    ]
    if len(near) == 1 and namesakes > 1:
        return None, (
            f"ambiguous: {namesakes} jobs of its user and name were submitted within "
            f"{SUBMIT_MATCH_S:g} s of it"
        )
    if len(near) == 1:
        return near[0], "name and submit time"
    if not near:
        return None, "no journal entry of its user and name at its submit time"
    return None, (
        f"ambiguous: {len(near)} journal entries of its user and name within "
        f"{SUBMIT_MATCH_S:g} s of its submit time"
    )


def admin_records(text: str) -> list[str]:
    """Every well-formed coda record in an admin comment. More than one means another
    writer (a site plugin copying users' text into the admin comment) put one there."""
    return [
        word
        for word in text.split()
        if word.startswith("coda:sig=") and from_admin_text(word) is not None
    ]


def _several_records(
    records: Sequence[str], journal_tokens: Collection[str] | None
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """An admin comment with several records: the one whose token the journal holds, when
    exactly one does; otherwise none (ambiguous)."""
    parsed = [from_admin_text(r) for r in records]
    held = f"the job's AdminComment holds {len(records)} coda records"
    known = [c for c in parsed if c and journal_tokens and c.get("token") in journal_tokens]
    if len(known) == 1:
        why = f"{held}; the decision journal holds this one's token"
        return known[0], {"source": "admin_comment", "why": why}
    why = f"ambiguous: {held}" + (
        "; the journal confirms none of them alone" if journal_tokens is not None else ""
    )
    return None, {"source": None, "why": why}


def choose_decision(
    admin_comment: str,
    summaries: Sequence[JobSummary],
    journal: tuple[Mapping[str, Any] | None, str] | None,
    journal_tokens: Collection[str] | None = None,
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the ``coda`` object, where it came from): ``{"source": "admin_comment" | "summary" |
    "journal" | None, "why": ...}``. ``journal`` is :func:`match_journal`'s answer, or None
    where no journal was read; ``journal_tokens``: the journal's tokens around the job's
    submission (read only when the admin comment holds several records)."""
    records = admin_records(admin_comment)
    if len(records) > 1:
        return _several_records(records, journal_tokens)
    coda = from_admin_text(admin_comment)
    if coda is not None:
        return coda, {"source": "admin_comment", "why": "the job's AdminComment holds it"}
    held = "the job's AdminComment holds no coda record" + (
        f" ({_shown(admin_comment)})" if admin_comment else ""
    )
    for s in sorted(summaries, key=lambda s: s.node):
        coda = from_admin_text(s.record or "")
        if coda is not None:
            return coda, {"source": "summary", "why": f"{held}; coda-node on {s.node} read it"}
    if journal is None:
        return None, {"source": None, "why": f"{held}; no summary holds it; no journal read"}
    entry, how = journal
    coda = from_journal_entry(entry) if entry is not None else None
    if coda is None:
        return None, {"source": None, "why": f"{held}; no summary holds it; journal: {how}"}
    return coda, {"source": "journal", "why": f"{held}; journal entry matched by {how}"}


def _shown(text: str, limit: int = 40) -> str:
    """An admin comment shown in a line: printable, cut to ``limit`` characters."""
    shown = text.encode("unicode_escape").decode("ascii")
    return repr(shown[:limit] + ("..." if len(shown) > limit else ""))


def summary_json(s: JobSummary) -> dict[str, Any]:
    """What coda-node saw and did on one node, for the report's ``summaries``."""
    return {
        "node": s.node,
        "start_unix_s": s.start_unix_s,
        "end_unix_s": s.end_unix_s,
        "sampled_s": s.sampled_s,
        "gpus": s.gpus,
        "gpu_model": s.gpu_model,
        "gpu_util_pct_mean": s.gpu_util_pct_mean,
        "gpu_wait_share": s.gpu_wait_share,
        "cores_allocated": s.cores_allocated,
        "cores_mean": s.cores_mean,
        "cpu_used_cores_mean": s.cpu_used_cores_mean,
        "idle_core_s": s.idle_core_s,
        "probes": s.probes,
        "probe_s": s.probe_s,
        "slim_s": s.slim_s,
        "throttled_s": s.throttled_s,
        "protected_s": s.protected_s,
        "profile_state": s.profile_state,
    }


def finished_verdict(summaries: Sequence[JobSummary]) -> dict[str, Any]:
    """The GPU-waiting verdict of an ended job from its summaries, naming the source."""
    verdict = dict(wait_verdict(summaries))
    nodes = ", ".join(sorted(s.node for s in summaries))
    verdict["why"] += f" (coda-node's job summaries: {nodes})"
    return verdict
