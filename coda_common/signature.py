"""Workload signatures: which profile a submitted job should be matched against.

A job names its workload explicitly with a directive in ``--comment``::

    sbatch --comment "coda:workload=resnet50" train.sh
    sbatch --comment "nightly run; coda:off" train.sh

Directives are tokens that start with ``coda:`` among any other comment text; tokens are
separated by whitespace, ``,`` or ``;``.  Known directives: ``coda:workload=NAME`` and
``coda:off``.  Anything else starting with ``coda:`` is an error the user sees.

Without a directive the signature is a hash of the job name and the batch script with its
``#SBATCH`` lines removed, so that changing resource options does not make a new workload,
and with the parts :class:`ScriptIgnore` names (coda.conf ``SignatureIgnore``) replaced by a
placeholder: what clients such as dask-jobqueue and submitit write anew into every script
(a scheduler address, a worker name, a job id in a path) does not make one either.

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
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "BUILTIN_SETS",
    "DEFAULT_IGNORE",
    "NO_IGNORE",
    "UNNAMED",
    "DirectiveError",
    "Directives",
    "ScriptIgnore",
    "Signature",
    "SignatureIgnoreError",
    "SignatureIgnoreTimeout",
    "global_key",
    "is_workload_name",
    "name_problem",
    "normalize_name",
    "parse_coda_directives",
    "parse_script_ignore",
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
    if len(comment) <= _CACHED_COMMENT_CHARS:
        return _directives_cached(comment)
    return _directives(comment)


_CACHED_COMMENT_CHARS = 256
"""Comments up to this long are parsed once each (the most recent 512): the same
``coda:workload=NAME`` comes with job after job, and the submit hook then skips the
regular expressions, which are slow while the CPU's caches are cold."""


@lru_cache(maxsize=512)
def _directives_cached(comment: str) -> Directives:
    # Directives are frozen: one object may be handed to many jobs.  A DirectiveError is
    # not cached; the comment is parsed again next time.
    return _directives(comment)


def _directives(comment: str) -> Directives:
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
            if not is_workload_name(value):
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


# -- parts of a script that do not make a new workload ----------------------------------------

PLACEHOLDER = "\0"
"""What an ignored part becomes before hashing: a NUL, which no script Slurm carries holds."""

BUILTIN_SETS: dict[str, tuple[str, ...]] = {
    # dask-jobqueue's SLURMCluster runs `python -m distributed.cli.dask_worker tcp://HOST:PORT
    # --name SLURMCluster-N --nthreads N --memory-limit M --nanny --death-timeout S ...`: the
    # scheduler's address and port, the worker's name and its size change with every cluster
    # and worker, and what a worker computes comes from the scheduler, not from its command.
    # The rest of the worker's command line is ignored (dask-cuda's worker too).
    "dask-jobqueue": (r"dask[-_](?:cuda[-_])?worker[ \t][^\n]*+",),
    # submitit writes `%j` into the paths of a single job and `%A_%a` into those of an array
    # (map_array), in #SBATCH lines and in its srun line: the same function either way.
    "submitit": (r"%A_%a|%j",),
    # Run ids tools put into paths: UUIDs (with or without dashes) and date-times
    # (Hydra's multirun/2026-01-31/12-00-00, strftime's 2026-01-31_12-00-00, ISO 8601), each
    # a whole word.  One pattern that starts with a character class, which the engine scans
    # for quickly; the look-behind after it makes the word start there.
    "run-ids": (
        r"[0-9a-f](?<![0-9A-Za-z][0-9a-f])(?:[0-9a-f]{7}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
        r"[0-9a-f]{12}|[0-9a-f]{31}|(?<=[12])[0-9]{3}-[01][0-9]-[0-3][0-9][T_/ -][0-2][0-9]"
        r"[-:][0-5][0-9][-:][0-6][0-9](?:\.[0-9]{1,9})?+)(?![0-9A-Za-z])",
    ),
}
"""The built-in sets ``SignatureIgnore`` names with ``@NAME``.  Each pattern has a literal or
a fixed-width class at each step and possessive repeats only, so one pass over a script is
linear in its length (tests/common/test_signature.py times a 1 MB hostile script)."""

DEFAULT_SPEC = "@builtin"
"""``SignatureIgnore``'s default: every built-in set (``@builtin`` names them all)."""

MAX_SCRIPT_CHARS = 64 * 1024
"""The patterns run on the first this many characters of a script (client-generated scripts
are short); the rest is hashed as written."""
ADMIN_MAX_LINES = 2048
"""An admin's patterns run on a script's first this many lines (within MAX_SCRIPT_CHARS)."""
ADMIN_MAX_LINE_CHARS = 1024
"""Longer lines are left as written by an admin's patterns (hashed as they are)."""
ADMIN_BUDGET_NS = 5_000_000
"""An admin's patterns stop, and the job passes unchanged (:class:`SignatureIgnoreTimeout`),
once they have taken this long on one script."""


class SignatureIgnoreError(ValueError):
    """A ``SignatureIgnore`` value that cannot be used; the message says why."""


class SignatureIgnoreTimeout(RuntimeError):
    """An admin's ``SignatureIgnore`` patterns took over :data:`ADMIN_BUDGET_NS` on one
    script; the hook lets the job pass unchanged."""


@dataclass(frozen=True, slots=True)
class ScriptIgnore:
    """Which parts of a batch script do not make a new workload (coda.conf
    ``SignatureIgnore``): each match becomes :data:`PLACEHOLDER` before the script is hashed.

    The patterns run on the first :data:`MAX_SCRIPT_CHARS` characters.  The built-in sets'
    patterns each make one pass (they are linear).  An admin's own patterns run line by line,
    on the first :data:`ADMIN_MAX_LINES` lines of at most :data:`ADMIN_MAX_LINE_CHARS`, and
    give up after :data:`ADMIN_BUDGET_NS` (:func:`parse_script_ignore` only accepts patterns
    that cannot backtrack into a repeat, so one line costs at most about its length squared).
    """

    spec: str = ""
    """The value as written in coda.conf (``""``: nothing is ignored)."""
    builtin: tuple[re.Pattern[str], ...] = ()
    admin: re.Pattern[str] | None = None

    def apply(self, script: str) -> str:
        """``script`` with every ignored part replaced by :data:`PLACEHOLDER`."""
        if not self.builtin and self.admin is None:
            return script
        head, tail = script[:MAX_SCRIPT_CHARS], script[MAX_SCRIPT_CHARS:]
        for pattern in self.builtin:
            head = pattern.sub(PLACEHOLDER, head)
        admin = self.admin
        if admin is not None:
            lines = head.split("\n", ADMIN_MAX_LINES)
            last = min(len(lines), ADMIN_MAX_LINES)  # lines[ADMIN_MAX_LINES]: the rest
            t0 = time.perf_counter_ns()
            sub = admin.sub
            for i in range(last):
                if len(lines[i]) <= ADMIN_MAX_LINE_CHARS:
                    lines[i] = sub(PLACEHOLDER, lines[i])
                    if time.perf_counter_ns() - t0 > ADMIN_BUDGET_NS:
                        raise SignatureIgnoreTimeout(
                            f"SignatureIgnore patterns took over {ADMIN_BUDGET_NS / 1e6:g} ms "
                            f"on this script (line {i + 1})"
                        )
            head = "\n".join(lines)
        return head + tail


NO_IGNORE = ScriptIgnore()


def _check_backtracking(tree: Any, pattern: str) -> None:
    """Refuse what makes a regular expression slow on hostile text: a repeat the engine can
    backtrack into (every ``*``, ``+``, ``{m,n}`` with n > m and n > 1 must be possessive:
    ``*+``, ``++``, ``{m,n}+``), back references and conditional groups."""
    from re import _constants as c  # the parser's opcodes (stdlib, private)

    for op, arg in tree:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            low, high, body = arg
            if high > 1 and high != low:
                raise SignatureIgnoreError(
                    f"SignatureIgnore: pattern {pattern!r} has a repeat that can backtrack; "
                    "make every repeat possessive (*+, ++, {m,n}+): the patterns run on "
                    "users' scripts inside slurmctld"
                )
            _check_backtracking(body, pattern)
        elif op == c.POSSESSIVE_REPEAT:
            _check_backtracking(arg[2], pattern)
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS, c.GROUPREF_IGNORE):
            raise SignatureIgnoreError(
                f"SignatureIgnore: pattern {pattern!r} refers back to a group; "
                "back references and conditional groups are not allowed"
            )
        elif op == c.SUBPATTERN:
            _check_backtracking(arg[-1], pattern)
        elif op == c.ATOMIC_GROUP:
            _check_backtracking(arg, pattern)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            _check_backtracking(arg[1], pattern)
        elif op == c.BRANCH:
            for branch in arg[1]:
                _check_backtracking(branch, pattern)


def parse_script_ignore(value: str) -> ScriptIgnore:
    """``SignatureIgnore``'s value: blank-separated items, each ``@NAME`` (a built-in set of
    :data:`BUILTIN_SETS`, or ``@builtin`` for all of them) or a regular expression (Python
    syntax; write a blank as ``\x20`` or ``[ ]``).  Raises :class:`SignatureIgnoreError`."""
    from re import _parser  # stdlib's own parser, to inspect an admin's pattern

    builtin: list[str] = []
    admin: list[str] = []
    for item in value.split():
        if item.startswith("@"):
            if item == "@builtin":
                names = tuple(p for patterns in BUILTIN_SETS.values() for p in patterns)
            else:
                names = BUILTIN_SETS.get(item[1:])
            if names is None:
                known = ", ".join("@" + n for n in BUILTIN_SETS)
                raise SignatureIgnoreError(
                    f"SignatureIgnore: unknown set {item!r} (@builtin, or one of {known})"
                )
            builtin += [p for p in names if p not in builtin]
            continue
        try:
            tree = _parser.parse(item)
            re.compile(item)
        except re.error as exc:
            raise SignatureIgnoreError(
                f"SignatureIgnore: {item!r} is not a regular expression ({exc})"
            ) from None
        _check_backtracking(tree, item)
        if re.compile(item).fullmatch(""):
            raise SignatureIgnoreError(
                f"SignatureIgnore: pattern {item!r} matches the empty text; it would ignore "
                "nothing but cost time on every line"
            )
        admin.append(item)
    return ScriptIgnore(
        " ".join(value.split()),
        tuple(re.compile(p) for p in builtin),
        re.compile("|".join(f"(?:{p})" for p in admin)) if admin else None,
    )


DEFAULT_IGNORE = parse_script_ignore(DEFAULT_SPEC)


def _hash16(text: str) -> str:
    """First 16 hex digits of sha256 of ``text``; surrogate-escaped bytes hash as bytes."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # Lone surrogates that did not come from surrogateescape: still deterministic.
        data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:16]


def workload_signature(
    uid: int,
    job_name: str | None,
    script: str | None,
    directives: Directives,
    ignore: ScriptIgnore = DEFAULT_IGNORE,
) -> Signature:
    """The signature of a job (see the module docstring for the key formats).

    A ``coda:workload=NAME`` directive wins; otherwise a batch job is identified by its name
    and its script without ``#SBATCH`` lines and with the parts ``ignore`` names replaced
    (coda.conf ``SignatureIgnore``), and a job without a script (``srun``, ``salloc``;
    ``script`` None or empty) by its name alone.  Raises :class:`SignatureIgnoreTimeout`
    when an admin's patterns run over their budget on ``script``.
    """
    if directives.workload is not None:
        name = directives.workload
        return Signature(f"workload:{uid}:{name}", name, "comment")
    label = job_name or UNNAMED
    if script:
        digest = _hash16(f"{job_name or ''}\0{ignore.apply(strip_sbatch_lines(script))}")
        return Signature(f"script:{uid}:{digest}", label, "script")
    return Signature(f"name:{uid}:{_hash16(job_name or '')}", label, "name")


# -- workload names as priors (slurm_plugin.decision.priors) ---------------------------------

_PRIOR_NAME_CHARS = re.compile(r"[a-z0-9._-]+")
_PRIOR_JOINERS = re.compile(r"[-_.]")


def normalize_name(name: str) -> tuple[str, ...] | None:
    """NAME's words in lower case (``Bert-Base_uncased`` -> ``("bert", "base", "uncased")``),
    or None when NAME can never be matched (:func:`name_problem`)."""
    low = name.lower()
    if name_problem(low) is not None:
        return None
    return tuple(_PRIOR_JOINERS.split(low))


def name_problem(name: str) -> str | None:
    """Why ``name`` can never be matched as a prior (a global profile's NAME or a
    ``PriorAliases`` spelling), or None when it can."""
    low = name.lower()
    if len(low) < 2:
        return "shorter than 2 characters"
    if not low.isascii() or _PRIOR_NAME_CHARS.fullmatch(low) is None:
        return "holds a character other than letters, digits, - _ ."
    if not any(c.isalpha() for c in low):
        return "has no letter"
    if any(not part for part in _PRIOR_JOINERS.split(low)):
        return "has an empty word (two of - _ . in a row, or one at an end)"
    return None


def is_workload_name(name: str) -> bool:
    """Whether ``coda:workload=NAME`` accepts ``name`` (1-64 of ``[A-Za-z0-9._+-]``,
    starting with a letter or digit)."""
    return _WORKLOAD_NAME.fullmatch(name) is not None


def global_key(signature: Signature) -> str | None:
    """``workload:*:<NAME>`` for a directive-named workload (admin-imported profiles any
    user may reference), else None.  Lookups try ``signature.key`` first, then this."""
    if signature.source != "comment":
        return None
    return f"workload:*:{signature.workload}"
