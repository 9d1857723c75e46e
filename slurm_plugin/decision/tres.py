"""Parse and edit Slurm TRES request strings (``tres_per_node``, ``cpus_per_tres`` ...).

The job_submit hook sees these strings as sbatch sent them.  Slurm 22.05 spells a GRES with
colons; Slurm 23.11 and later (24.11, 26.05) with a slash, and ``tres_per_task`` there also
carries ``-c`` as ``cpu=N`` and counts after ``=``::

    option                     22.05 (tres_per_* field)     24.11 / 26.05
    --gpus-per-node=2          node:  gres:gpu:2            node:  gres/gpu:2
    --gpus=a100:4              job:   gres:gpu:a100:4       job:   gres/gpu:a100:4
    --gpus-per-task=1 -c 9     task:  gres:gpu:1            task:  cpu=9,gres/gpu=1
    --cpus-per-gpu=3           cpus_per_tres: gres:gpu:3    cpus_per_tres: gres/gpu:3

Grammar accepted here (one *item*; items are separated by ``,`` or ``;``)::

    item  = [KIND (":" | "/")] NAME [":" TYPE] [(":" | "=") COUNT]
    KIND  = "gres" | "license" | "bb"           (absent: kind "")
    COUNT = DIGITS [k|m|g|t|p]                  (suffix is a binary multiplier, k = 1024)

A missing COUNT means 1 (``gres:gpu`` is one GPU).  With two fields after the kind the
second is the COUNT when it looks like one, else it is the TYPE (``gpu:a100`` = one A100,
``gpu:1g.10gb`` = one MIG slice).  Blank items (``"gres:gpu:1,"``) are skipped like
Slurm's tokenizer does.

What the hook writes follows the spelling of the job's own GPU request
(:func:`gres_separator`): a Slurm that sent ``gres/gpu`` refuses ``gres:gpu`` in
``cpus_per_tres`` ("Invalid Trackable RESource (TRES) specification").

Everything here is pure and runs on slurmctld's submit path: parsing is cached because the
same few strings (``gres:gpu:1``, ``gres/gpu:4`` ...) arrive over and over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = [
    "MAX_TRES_CHARS",
    "MAX_TRES_COUNT",
    "TresError",
    "TresItem",
    "cpus_per_gpu",
    "gpu_count",
    "gpu_types",
    "gres_separator",
    "parse_tres",
    "set_gpu_count",
    "task_cpus",
    "with_task_cpus",
]

MAX_TRES_CHARS = 4096
"""Longest TRES string accepted; longer ones are hostile or broken."""

MAX_TRES_COUNT = 1_000_000
"""Largest count accepted for one item (after the k/m/g suffix); above is invalid."""

_KINDS = frozenset({"gres", "license", "bb"})
_SPLIT = re.compile(r"[,;]")
# NAME / TYPE: letters, digits and the punctuation seen in GRES, MIG and license names
# (``a100_3g.20gb``, ``tesla-v100``, ``matlab@licsrv``).  No spaces, no control characters,
# nothing outside ASCII (surrogate-escaped bytes included).  Must start with a letter or
# digit; a TYPE must also contain a letter, so ``-1`` or ``2.5`` are bad counts, not types.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]*")
_HAS_LETTER = re.compile(r"[A-Za-z]")
_COUNT = re.compile(r"([0-9]{1,12})([kKmMgGtTpP]?)")
_SUFFIX_MULT = {
    "": 1,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "p": 1024**5,
}


@dataclass(frozen=True, slots=True)
class TresItem:
    """One item of a TRES string: ``gres:gpu:a100:2`` is ``("gres", "gpu", "a100", 2)``."""

    kind: str
    """``"gres"``, ``"license"``, ``"bb"`` or ``""`` when the item had no kind prefix."""
    name: str
    type: str | None
    count: int
    kind_sep: str = field(default="", compare=False)
    """How the kind was joined to the name: ``":"`` (22.05), ``"/"`` (23.11 on), ``""``."""

    @property
    def is_gpu(self) -> bool:
        """A GPU request: ``gres:gpu...`` or a bare ``gpu...`` item."""
        return self.name == "gpu" and (self.kind == "gres" or self.kind == "")


class TresError(ValueError):
    """A malformed TRES string; the message names the offending item."""


def _show(text: str, limit: int = 60) -> str:
    """``text`` quoted for an error message: escaped, never longer than ``limit``."""
    shown = ascii(text[:limit])
    return shown + "..." if len(text) > limit else shown


def _parse_count(field: str) -> int | None:
    """The value of a COUNT field, or None when ``field`` does not look like a count."""
    m = _COUNT.fullmatch(field)
    if m is None:
        return None
    return int(m.group(1)) * _SUFFIX_MULT[m.group(2).lower()]


def _is_type(field: str) -> bool:
    return _NAME.fullmatch(field) is not None and _HAS_LETTER.search(field) is not None


def _parse_item(raw: str) -> TresItem:
    body, eq, count_text = raw.partition("=")
    fields = body.split(":")
    head = fields[0]
    kind = kind_sep = ""
    if "/" in head:
        kind, _, head = head.partition("/")
        if kind not in _KINDS:
            raise TresError(f"unknown TRES kind in item {_show(raw)}")
        fields[0] = head
        kind_sep = "/"
    elif head in _KINDS and len(fields) > 1:
        kind = head
        kind_sep = ":"
        del fields[0]
    if eq:
        # NAME[:TYPE]=COUNT (tres_per_task from 23.11 on: cpu=3, gres/gpu:a100=1).  An empty
        # field before "=" is not Slurm's: ``-G=4`` arrives as ``gres:gpu:=4``, which Slurm
        # refuses, and must not read as four GPUs.
        if "" in fields[1:]:
            raise TresError(f"empty field before '=' in TRES item {_show(raw)}")
        if len(fields) > 2:
            raise TresError(f"too many fields in TRES item {_show(raw)}")
        fields.append(count_text)
        if len(fields) == 2:
            fields.insert(1, "")
    if len(fields) > 3:
        raise TresError(f"too many fields in TRES item {_show(raw)}")
    name = fields[0]
    if not name:
        raise TresError(f"empty name in TRES item {_show(raw)}")
    if _NAME.fullmatch(name) is None:
        raise TresError(f"invalid name in TRES item {_show(raw)}")
    type_: str | None = None
    count = 1
    if len(fields) == 2:
        parsed = _parse_count(fields[1])
        if parsed is not None:
            count = parsed
        elif _is_type(fields[1]):
            type_ = fields[1]
        else:
            raise TresError(f"invalid count or type in TRES item {_show(raw)}")
    elif len(fields) == 3:
        if fields[1] or not eq:
            type_ = fields[1]
            if not _is_type(type_):
                raise TresError(f"invalid type in TRES item {_show(raw)}")
        parsed = _parse_count(fields[2])
        if parsed is None:
            raise TresError(f"invalid count in TRES item {_show(raw)}")
        count = parsed
    if count > MAX_TRES_COUNT:
        raise TresError(f"count too large in TRES item {_show(raw)} (limit {MAX_TRES_COUNT})")
    return TresItem(kind, name, type_, count, kind_sep)


@lru_cache(maxsize=512)
def _parse_cached(s: str) -> tuple[TresItem, ...]:
    if len(s) > MAX_TRES_CHARS:
        raise TresError(f"TRES string too long ({len(s)} chars, limit {MAX_TRES_CHARS})")
    items: list[TresItem] = []
    for raw in _SPLIT.split(s):
        raw = raw.strip(" ")
        if raw:
            items.append(_parse_item(raw))
    return tuple(items)


def parse_tres(s: str | None) -> tuple[TresItem, ...]:
    """All items of the TRES string ``s`` in order; ``()`` for None or ``""``.

    Strict: raises :class:`TresError` for an empty name, a negative, non-numeric or huge
    count (> :data:`MAX_TRES_COUNT`), characters outside ``[A-Za-z0-9_.+@-]`` in a name or
    type (control characters, spaces, non-ASCII), a name or type not starting with a letter
    or digit, a type without a letter, more than three fields, an unknown
    ``KIND/`` prefix, or a string longer than :data:`MAX_TRES_CHARS`.
    """
    if not s:
        return ()
    return _parse_cached(s)


def gpu_count(s: str | None) -> int:
    """Total GPUs requested in ``s``, summed over all GPU types; 0 when none.

    Raises :class:`TresError` when ``s`` is malformed.
    """
    if not s:
        return 0
    return sum(item.count for item in _parse_cached(s) if item.is_gpu)


def gpu_types(s: str | None) -> tuple[str, ...]:
    """The distinct GPU types named in ``s`` in order of appearance (untyped ones omitted)."""
    types: list[str] = []
    for item in parse_tres(s):
        if item.is_gpu and item.type is not None and item.type not in types:
            types.append(item.type)
    return tuple(types)


def cpus_per_gpu(s: str | None) -> int | None:
    """The per-GPU CPU count in a ``cpus_per_tres`` string, or None when it has no GPU entry.

    ``--cpus-per-gpu=3`` arrives as ``"gres:gpu:3"``; the first GPU entry wins.
    """
    if not s:
        return None
    for item in _parse_cached(s):
        if item.is_gpu:
            return item.count
    return None


def gres_separator(*strings: str | None) -> str:
    """How this Slurm spells a GRES: ``"/"`` when the first GPU item among ``strings`` that
    names its kind says ``gres/gpu`` (23.11 and later), else ``":"`` (22.05).

    The job's own request comes from the running Slurm's sbatch, so its spelling is the one
    that Slurm accepts back.  Raises :class:`TresError` when a string is malformed.
    """
    for s in strings:
        for item in parse_tres(s):
            if item.is_gpu and item.kind_sep:
                return item.kind_sep
    return ":"


def set_gpu_count(s: str | None, count_per_gpu: int, sep: str = ":") -> str:
    """``cpus_per_tres`` string ``s`` with its GPU entry set to ``gres<sep>gpu:<count>``.

    ``sep`` is :func:`gres_separator` of the job's request.  The new entry takes the place
    of the first GPU entry (typed or not); further GPU entries are dropped; every other
    entry is kept verbatim and in order.  Without a GPU entry the new one is appended.
    Items are joined with ``,``.  Raises :class:`TresError` when ``s`` is malformed and
    :class:`ValueError` when ``count_per_gpu`` is not in ``1..MAX_TRES_COUNT`` or ``sep`` is
    neither ``":"`` nor ``"/"``.
    """
    if count_per_gpu < 1 or count_per_gpu > MAX_TRES_COUNT:
        raise ValueError(f"cpus per GPU must be 1..{MAX_TRES_COUNT}, got {count_per_gpu}")
    if sep not in (":", "/"):
        raise ValueError(f"GRES separator must be ':' or '/', got {sep!r}")
    entry = f"gres{sep}gpu:{count_per_gpu}"
    if not s:
        return entry
    out: list[str] = []
    placed = False
    for raw, item in _raw_items(s):
        if item.is_gpu:
            if not placed:
                out.append(entry)
                placed = True
        else:
            out.append(raw)
    if not placed:
        out.append(entry)
    return ",".join(out)


def task_cpus(s: str | None) -> int | None:
    """The ``cpu=N`` count in a ``tres_per_task`` string (``-c`` from 23.11 on), or None."""
    for item in parse_tres(s):
        if item.name == "cpu" and not item.kind:
            return item.count
    return None


def with_task_cpus(s: str | None, cpus: int) -> str | None:
    """``tres_per_task`` string ``s`` with its ``cpu=N`` item set to ``cpu=<cpus>``; None
    for None.

    Slurm 23.11 and later keep ``-c`` in ``tres_per_task`` as well as in ``cpus_per_task``:
    a job whose ``-c`` coda rewrites must have both rewritten, or Slurm still asks the node
    for the old count.  Other items are kept verbatim and in order (the hook's C side,
    ``coda_set_task_cpus``, does the same).
    """
    if not s:
        return None
    return ",".join(
        f"cpu={cpus}" if item.name == "cpu" and not item.kind else raw
        for raw, item in _raw_items(s)
    )


def _raw_items(s: str) -> list[tuple[str, TresItem]]:
    """Each non-blank item of ``s`` as written, with its parse (validates ``s``)."""
    items = _parse_cached(s)
    raws = [raw.strip(" ") for raw in _SPLIT.split(s)]
    return list(zip((r for r in raws if r), items, strict=True))
