"""Parse and edit Slurm TRES request strings (``tres_per_node``, ``cpus_per_tres`` ...).

Slurm 22.05 hands the job_submit hook strings such as::

    tres_per_node  = "gres:gpu:2"                 # --gpus-per-node=2 / --gres=gpu:2
    tres_per_job   = "gres:gpu:a100:4"            # --gpus=a100:4
    cpus_per_tres  = "gres:gpu:3"                 # --cpus-per-gpu=3
    tres_per_node  = "gres:gpu:1g.10gb:3,gres:shard:4,license:foo:1"

Grammar accepted here (one *item*; items are separated by ``,`` or ``;``)::

    item  = [KIND (":" | "/")] NAME [":" TYPE] [":" COUNT]
    KIND  = "gres" | "license" | "bb"           (absent: kind "")
    COUNT = DIGITS [k|m|g|t|p]                  (suffix is a binary multiplier, k = 1024)

A missing COUNT means 1 (``gres:gpu`` is one GPU).  With two fields after the kind the
second is the COUNT when it looks like one, else it is the TYPE (``gpu:a100`` = one A100,
``gpu:1g.10gb`` = one MIG slice).  ``gres/gpu:2`` (the separator used by later Slurm
releases) is accepted too.  Blank items (``"gres:gpu:1,"``) are skipped like Slurm's
tokenizer does.

Everything here is pure and runs on slurmctld's submit path: parsing is cached because the
same few strings (``gres:gpu:1``, ``gres:gpu:4`` ...) arrive over and over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "MAX_TRES_CHARS",
    "MAX_TRES_COUNT",
    "TresError",
    "TresItem",
    "cpus_per_gpu",
    "gpu_count",
    "gpu_types",
    "parse_tres",
    "set_gpu_count",
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
    fields = raw.split(":")
    head = fields[0]
    kind = ""
    if "/" in head:
        kind, _, head = head.partition("/")
        if kind not in _KINDS:
            raise TresError(f"unknown TRES kind in item {_show(raw)}")
        fields[0] = head
    elif head in _KINDS and len(fields) > 1:
        kind = head
        del fields[0]
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
        type_ = fields[1]
        if not _is_type(type_):
            raise TresError(f"invalid type in TRES item {_show(raw)}")
        parsed = _parse_count(fields[2])
        if parsed is None:
            raise TresError(f"invalid count in TRES item {_show(raw)}")
        count = parsed
    if count > MAX_TRES_COUNT:
        raise TresError(f"count too large in TRES item {_show(raw)} (limit {MAX_TRES_COUNT})")
    return TresItem(kind, name, type_, count)


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


def set_gpu_count(s: str | None, count_per_gpu: int) -> str:
    """``cpus_per_tres`` string ``s`` with its GPU entry set to ``gres:gpu:<count_per_gpu>``.

    The new entry takes the place of the first GPU entry (typed or not); further GPU entries
    are dropped; every other entry is kept verbatim and in order.  Without a GPU entry the
    new one is appended.  Items are joined with ``,``.  Raises :class:`TresError` when ``s``
    is malformed and :class:`ValueError` when ``count_per_gpu`` is not in
    ``1..MAX_TRES_COUNT``.
    """
    if count_per_gpu < 1 or count_per_gpu > MAX_TRES_COUNT:
        raise ValueError(f"cpus per GPU must be 1..{MAX_TRES_COUNT}, got {count_per_gpu}")
    entry = f"gres:gpu:{count_per_gpu}"
    if not s:
        return entry
    items = _parse_cached(s)  # validates s
    out: list[str] = []
    placed = False
    raws = [raw.strip(" ") for raw in _SPLIT.split(s)]
    for raw, item in zip((r for r in raws if r), items, strict=True):
        if item.is_gpu:
            if not placed:
                out.append(entry)
                placed = True
        else:
            out.append(raw)
    if not placed:
        out.append(entry)
    return ",".join(out)
