"""``scontrol -o`` text: the one reader of its one-line ``Key=Value`` records.

Pure: the dev cluster (its jobs' and nodes' records) and ``coda-slurm reserve`` (nodes and
partitions) pass the text of ``scontrol -o show ...`` here. Job records are free text a
user can shape (a job name or comment holding `` Key=Value``), so a reader that must not
be fooled by one takes Slurm's JSON instead (:mod:`coda_common.slurm.slurmjson`).
"""

from __future__ import annotations

FREE_TEXT_KEYS = frozenset({"AdminComment", "Comment", "SystemComment", "Reason"})
"""Fields whose values are people's text (blanks and ``word=...`` in them)."""


def parse_scontrol_line(line: str) -> dict[str, str]:
    """Split ``scontrol -o`` output (``Key=Value`` separated by spaces) into a dict.

    Values may contain spaces only in a few fields (Reason, Comment...). A token
    without ``=`` continues the previous value, and so does one whose key does not start
    with a capital inside a free-text field (scontrol's keys all do): ``AdminComment=site:lua
    coda:sig=...`` is one value.
    """
    fields: dict[str, str] = {}
    last: str | None = None
    for token in line.split(" "):
        if not token:
            continue
        key, sep, value = token.partition("=")
        if last in FREE_TEXT_KEYS and not key[:1].isupper():
            fields[last] += " " + token
        elif sep and key and key[0].isalpha():
            fields[key] = value
            last = key
        elif last is not None:
            fields[last] += " " + token
    return fields


def scontrol_records(text: str, first_key: str) -> list[dict[str, str]]:
    """``scontrol -o`` lines that start with ``first_key=`` (skips "No jobs in the system")."""
    return [
        parse_scontrol_line(line) for line in text.splitlines() if line.startswith(f"{first_key}=")
    ]
