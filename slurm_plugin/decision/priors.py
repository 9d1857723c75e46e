"""Priors from names: a never-seen workload whose script names a model the site has a
profile for starts from that profile's cores per GPU.  Pure and stdlib-only.

Every global profile ``workload:*:NAME`` (``coda-slurm profiles import``, the starter
table of ``coda-slurm profiles starter``) is a *prior* for a GPU job that has no confident
profile of its own, when the job's text names NAME: the ``coda:workload=`` name, the job
name, or the batch script (``srun python train.py --arch alexnet``, ``--model=bert-base``,
``model_name: vit_b_16``, ``from_pretrained("gpt2")``).  coda.conf ``PriorAliases`` adds
other spellings of a NAME; ``PriorsFromNames=no`` turns it off.

Matching.  Text and names are compared in lower case, with ``-``, ``_`` and ``.``
equivalent.  A *word* is a run of ASCII letters and digits; NAME's words (split at ``-``
``_`` ``.``) must appear in the text as whole words in a row, joined by one of ``-`` ``_``
``.``: ``resnet50`` matches ``--arch ResNet50`` and ``torchvision.models.resnet50`` but not
``resnet50x4`` or ``resnet-50`` (an alias covers that), ``bert`` matches
``bert-base-uncased``, ``vit-b-16`` matches ``vit_b_16``.  A NAME without a letter, with
fewer than two characters, or with a character other than letters, digits, ``-``, ``_``
and ``.`` is never matched.

Bounded work on hostile text.  Job text is the user's: the scan reads at most
:data:`SCAN_HEAD_CHARS` from the start of a script and :data:`SCAN_TAIL_CHARS` from its
end (where a launcher's command line usually is), whatever the script's size.  Words are
found by one ``bytes.translate`` and one ``split`` (no regular expression); one-word names
are a set intersection; a several-word name is checked only when its first word is in the
text, as a substring of the text's distinct joined runs of words, at most
:data:`MAX_PHRASE_CHECKS` of them per job.  So a job costs at most a fixed amount however
large or adversarial its script and however many profiles the site holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from coda_common.signature import normalize_name
from coda_common.store.request import ProfileView

__all__ = [
    "GLOBAL_PREFIX",
    "MAX_PHRASE_CHECKS",
    "SCAN_HEAD_CHARS",
    "SCAN_TAIL_CHARS",
    "PriorIndex",
    "index_for",
    "named",
    "scan_text",
]

GLOBAL_PREFIX = "workload:*:"
"""Store keys of the profiles that serve as priors (``coda_common.signature.global_key``)."""

SCAN_HEAD_CHARS = 48 * 1024
"""Characters read from the start of a script."""
SCAN_TAIL_CHARS = 16 * 1024
"""Characters read from the end of a script longer than head and tail together."""
MAX_PHRASE_CHECKS = 32
"""Several-word names checked per job, at most (their first word must be in the text)."""


def _table(joiner: int) -> bytes:
    """A ``bytes.translate`` table: ASCII letters to lower case, digits kept, ``-`` ``_``
    ``.`` to ``joiner``, every other byte (non-ASCII ones included) to a blank."""
    out = bytearray(b" " * 256)
    for c in range(256):
        if 48 <= c <= 57 or 97 <= c <= 122:
            out[c] = c
        elif 65 <= c <= 90:
            out[c] = c + 32
        elif c in b"-_.":
            out[c] = joiner
    return bytes(out)


_WORDS = _table(ord(" "))
"""Splits text into words."""
_RUNS = _table(ord("-"))
"""Splits text into runs of words joined by ``-`` (each of ``-`` ``_`` ``.`` as ``-``)."""


def scan_text(job_name: str | None, script: str | None, workload: str | None) -> bytes:
    """The job's text a prior may be named in, bounded: the ``coda:workload=`` name, the job
    name, and the script's first :data:`SCAN_HEAD_CHARS` and last :data:`SCAN_TAIL_CHARS`
    characters, one per line, as UTF-8 (undecodable bytes as they came)."""
    if script and len(script) > SCAN_HEAD_CHARS + SCAN_TAIL_CHARS:
        script = f"{script[:SCAN_HEAD_CHARS]}\n{script[-SCAN_TAIL_CHARS:]}"
    # The job name is what the user typed: bound it like the script's head.
    text = f"{workload or ''}\n{(job_name or '')[:SCAN_HEAD_CHARS]}\n{script or ''}"
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates that did not come from bytes
        return text.encode("utf-8", "surrogatepass")


class PriorIndex:
    """The priors of one profile snapshot: which profile NAMEs each spelling stands for."""

    __slots__ = ("_firsts", "_phrases", "_single", "views")

    def __init__(
        self,
        views: Mapping[str, ProfileView],
        aliases: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.views: dict[str, ProfileView] = dict(views)
        """Profile NAME -> its global profile."""
        spellings: dict[tuple[str, ...], set[str]] = {}
        for name in self.views:
            words = normalize_name(name)
            if words is not None:
                spellings.setdefault(words, set()).add(name)
        for alias, name in aliases:
            words = normalize_name(alias)
            if words is not None and name in self.views:
                spellings.setdefault(words, set()).add(name)
        single: dict[bytes, tuple[str, ...]] = {}
        phrases: dict[bytes, list[tuple[bytes, tuple[str, ...]]]] = {}
        for words, names in spellings.items():
            ordered = tuple(sorted(names))
            if len(words) == 1:
                single[words[0].encode()] = ordered
            else:
                # Looked up as "-w1-w2-" in the text's runs of joined words (see match()).
                needle = ("-" + "-".join(words) + "-").encode()
                phrases.setdefault(words[0].encode(), []).append((needle, ordered))
        self._single = single
        self._phrases = phrases
        self._firsts = frozenset(single) | frozenset(phrases)

    def match(self, text: bytes) -> tuple[str, ...]:
        """The profile NAMEs ``text`` (from :func:`scan_text`) names, sorted."""
        if not self._firsts:
            return ()
        # translate() and split() are single passes in C, whatever the text holds.
        # One pass over the words in C; the result is the few words that start a name.
        hits = self._firsts.intersection(text.translate(_WORDS).split())
        if not hits:
            return ()  # the common case: nothing in the text is the start of any name
        found: set[str] = set()
        single, phrases = self._single, self._phrases
        for word in hits:
            if word in single:
                found.update(single[word])
        firsts = sorted(w for w in hits if w in phrases)
        if firsts:
            # Every run of words joined by - _ ., as "-w1-w2-...-" with one dash between
            # words (a doubled joiner stays doubled), set apart by NULs, which no name
            # holds: a several-word name is named where "-its-words-" is a substring of
            # "-run1-\0-run2-\0...".  join() and substring search are linear and run in C.
            blob = b"-" + b"-\0-".join(text.translate(_RUNS).split()) + b"-"
            checks = 0
            for first in firsts:
                for needle, names in self._phrases[first]:
                    if checks >= MAX_PHRASE_CHECKS:
                        return tuple(sorted(found))
                    checks += 1
                    if needle in blob:
                        found.update(names)
        return tuple(sorted(found))


_EMPTY = PriorIndex({})
_index_memo: tuple[Mapping[str, ProfileView], tuple[tuple[str, str], ...], PriorIndex] | None = None


def index_for(
    profiles: Mapping[str, ProfileView], aliases: tuple[tuple[str, str], ...] = ()
) -> PriorIndex:
    """The :class:`PriorIndex` of ``profiles``' global profiles with ``aliases``, built once
    per snapshot object (the store's cache hands out the same immutable mapping until a
    profile changes; the submit hook builds it on its reload thread, right after a refresh).
    A caller whose mapping changes in place (the simulator's store) must not change its
    global profiles after the first call."""
    global _index_memo
    memo = _index_memo
    if memo is not None and memo[0] is profiles and memo[1] == aliases:
        return memo[2]
    views = {
        key[len(GLOBAL_PREFIX) :]: view
        for key, view in profiles.items()
        if key.startswith(GLOBAL_PREFIX)
    }
    index = PriorIndex(views, aliases) if views else _EMPTY
    _index_memo = (profiles, aliases, index)
    return index


def named(
    profiles: Mapping[str, ProfileView],
    aliases: tuple[tuple[str, str], ...],
    job_name: str | None,
    script: str | None,
    workload: str | None,
) -> tuple[tuple[str, ...], Mapping[str, ProfileView]]:
    """``(NAMEs, their global profiles by NAME)`` of the priors a job's text names: what
    :func:`index_for` and :func:`scan_text` give :meth:`PriorIndex.match`, in one call (the
    submit hook runs it cold on every job without a profile, where each call costs)."""
    memo = _index_memo
    if memo is not None and memo[0] is profiles and memo[1] == aliases:
        index = memo[2]
    else:
        index = index_for(profiles, aliases)
    if not index._firsts:
        return (), index.views
    return index.match(scan_text(job_name, script, workload)), index.views
