"""Workload signatures: which profile a submitted job should be matched against.

A job names its workload explicitly with a directive in ``--comment``::

    sbatch --comment "coda:workload=resnet50" train.sh
    sbatch --comment "nightly run; coda:off" train.sh

Directives are tokens that start with ``coda:`` among any other comment text; tokens are
separated by whitespace, ``,`` or ``;``.  Known directives: ``coda:workload=NAME`` and
``coda:off``.  Anything else starting with ``coda:`` is an error the user sees.

Without a directive the signature is a hash of the job name and the batch script with its
``#SBATCH`` lines removed, so that changing resource options does not make a new workload.

Signature keys (also the profile store's keys)::

    workload:<uid>:<NAME>      --comment coda:workload=NAME        (source "comment")
    workload:*:<NAME>          an admin-imported profile any user may reference (global_key)
    script:<uid>:<16 hex>      sha256(job_name "\\0" stripped script)  (source "script")
    name:<uid>:<16 hex>        sha256(job_name), jobs without a script (srun/salloc)
                                                                        (source "name")

Keys never contain ``;``, ``=``, whitespace or non-ASCII characters.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "UNNAMED",
    "DirectiveError",
    "Directives",
    "Signature",
    "global_key",
    "parse_coda_directives",
    "quote_label",
    "strip_sbatch_lines",
    "workload_signature",
]

UNNAMED = "(unnamed)"
"""Workload label of a job without a name."""

# A directive token: "coda:" at the start of the comment or after a separator, then
# everything up to the next separator; a double-quoted part may hold separators
# (``coda:workload="a b"`` is one token, so the user sees the name they meant in the
# error).  Case-insensitive prefix and key.  Possessive quantifiers: no backtracking.
_DIRECTIVE = re.compile(r"(?:^|(?<=[\s,;]))coda:((?:[^\s,;\"]++|\"[^\"]*+\"?)*+)", re.IGNORECASE)
_WORKLOAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_SBATCH_LINE = re.compile(r"[ \t]*#SBATCH")


class DirectiveError(ValueError):
    """A malformed ``coda:`` directive in ``--comment``; the message is for the user."""


@dataclass(frozen=True, slots=True)
class Directives:
    """The ``coda:`` directives found in a job's ``--comment``."""

    workload: str | None = None
    """NAME from ``coda:workload=NAME``; None when absent."""
    off: bool = False
    """``coda:off`` was given: leave this job alone."""


NO_DIRECTIVES = Directives()


@dataclass(frozen=True, slots=True)
class Signature:
    """Which workload a job is, for profile lookups."""

    key: str
    """Profile store key, e.g. ``workload:1000:resnet50`` (see the module docstring)."""
    workload: str
    """Human-readable workload label: the directive's NAME, else the job name or
    ``(unnamed)``.  Not sanitised: it may hold any character the job name held."""
    source: str
    """``"comment"``, ``"script"`` or ``"name"``."""


def _escape_char(c: str) -> str:
    return '\\"' if c == '"' else ascii(c)[1:-1]


def quote_label(text: str, limit: int = 64) -> str:
    """``text`` double-quoted for a one-line message: at most ``limit`` characters (then
    ``...``), with quotes, backslashes and non-printable characters (control characters,
    surrogate-escaped bytes) escaped Python-style."""
    cut = text[:limit]
    if not cut.isprintable() or '"' in cut or "\\" in cut:
        cut = "".join(
            c if c.isprintable() and c != '"' and c != "\\" else _escape_char(c) for c in cut
        )
    return f'"{cut}..."' if len(text) > limit else f'"{cut}"'


def parse_coda_directives(comment: str | None) -> Directives:
    """The ``coda:`` directives in ``comment`` (``--comment``); non-coda text is ignored.

    Raises :class:`DirectiveError` for ``coda:workload=`` without a valid NAME (1-64 of
    ``[A-Za-z0-9._+-]``, starting with a letter or digit), two different workload names,
    ``coda:off=...``, a bare ``coda:`` or an unknown ``coda:KEY``.
    """
    if not comment:
        return NO_DIRECTIVES
    # Cheap pre-check: most comments hold no directive at all.
    if "coda:" not in comment and "coda:" not in comment.lower():
        return NO_DIRECTIVES
    workload: str | None = None
    off = False
    for m in _DIRECTIVE.finditer(comment):
        body = m.group(1)
        key, eq, value = body.partition("=")
        key = key.lower()
        if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
            value = value[1:-1]
        if key == "workload":
            if not eq or not value:
                raise DirectiveError(
                    "coda: missing workload name in --comment (write coda:workload=NAME)"
                )
            if _WORKLOAD_NAME.fullmatch(value) is None:
                raise DirectiveError(
                    f"coda: invalid workload name {quote_label(value)} in --comment "
                    "(use letters, digits, . _ + -, at most 64, starting with a letter or digit)"
                )
            if workload is not None and workload != value:
                raise DirectiveError(
                    f"coda: two workload names in --comment ({quote_label(workload)} and "
                    f"{quote_label(value)}); give one"
                )
            workload = value
        elif key == "off" and not eq:
            off = True
        elif not body:
            raise DirectiveError(
                "coda: empty directive in --comment (use coda:workload=NAME or coda:off)"
            )
        else:
            raise DirectiveError(
                f"coda: unknown directive {quote_label('coda:' + body)} in --comment "
                "(use coda:workload=NAME or coda:off)"
            )
    if workload is None and not off:
        return NO_DIRECTIVES
    return Directives(workload=workload, off=off)


def strip_sbatch_lines(script: str) -> str:
    """``script`` in canonical form for hashing.

    Drops lines whose first non-blank characters are ``#SBATCH`` (a shebang line stays),
    turns CRLF into LF, strips trailing whitespace from every line and drops trailing blank
    lines (the result has no final newline).  Linear time on any input.
    """
    # str.rstrip() also removes the CR of CRLF line ends.
    lines = script.split("\n")
    if "#SBATCH" in script:
        kept = [
            line.rstrip()
            for line in lines
            if "#SBATCH" not in line or _SBATCH_LINE.match(line) is None
        ]
    else:
        kept = [line.rstrip() for line in lines]
    return "\n".join(kept).rstrip("\n")


def _hash16(text: str) -> str:
    """First 16 hex digits of sha256 of ``text``; surrogate-escaped bytes hash as bytes."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # Lone surrogates that did not come from surrogateescape: still deterministic.
        data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:16]


def workload_signature(
    uid: int, job_name: str | None, script: str | None, directives: Directives
) -> Signature:
    """The signature of a job (see the module docstring for the key formats).

    A ``coda:workload=NAME`` directive wins; otherwise a batch job is identified by its name
    and its script without ``#SBATCH`` lines, and a job without a script (``srun``,
    ``salloc``; ``script`` None or empty) by its name alone.
    """
    if directives.workload is not None:
        name = directives.workload
        return Signature(f"workload:{uid}:{name}", name, "comment")
    label = job_name or UNNAMED
    if script:
        digest = _hash16(f"{job_name or ''}\0{strip_sbatch_lines(script)}")
        return Signature(f"script:{uid}:{digest}", label, "script")
    return Signature(f"name:{uid}:{_hash16(job_name or '')}", label, "name")


def global_key(signature: Signature) -> str | None:
    """``workload:*:<NAME>`` for a directive-named workload (admin-imported profiles any
    user may reference), else None.  Lookups try ``signature.key`` first, then this."""
    if signature.source != "comment":
        return None
    return f"workload:*:{signature.workload}"
