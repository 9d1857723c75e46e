"""Slurm's hostlist expressions (``gpu[01-04,07],login1``): count and expand them, and
split a comma list outside brackets (``gpu[1,3],x``; a GRES list's ``(IDX:0,2)``)."""

from __future__ import annotations

import re

__all__ = ["count_hostlist", "expand_hostlist", "split_outside"]

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_MAX_HOSTS = 10_000_000


def split_outside(text: str, opening: str, closing: str, *, what: str = "list") -> list[str]:
    """``text`` split at commas outside ``opening``/``closing`` (``gpu[1,3],x`` -> 2 items;
    ``gpu:2(IDX:0,2),mps`` with parentheses -> 2 items). Raises ValueError on nesting or
    unbalanced brackets."""
    depth = 0
    start = 0
    items: list[str] = []
    for i, c in enumerate(text):
        if c == opening:
            depth += 1
            if depth > 1:
                raise ValueError(f"nested {opening!r} in {what} {text!r}")
        elif c == closing:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {closing!r} in {what} {text!r}")
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced {opening!r} in {what} {text!r}")
    items.append(text[start:])
    return items


def count_hostlist(expr: str) -> int:
    """Number of hosts in a Slurm hostlist expression (``gpu[01-04,07],login1`` is 6).

    Raises ValueError on unbalanced brackets or bad ranges.
    """
    total = 0
    items = split_outside(expr, "[", "]", what="host list")
    for item in items:
        if not item:
            continue
        hosts = 1
        for m in _BRACKET.finditer(item):
            in_bracket = 0
            for part in m.group(1).split(","):
                r = _RANGE.fullmatch(part.strip())
                if r is None:
                    raise ValueError(f"bad range {part!r} in host list {expr!r}")
                low = int(r.group(1))
                high = int(r.group(2)) if r.group(2) is not None else low
                if high < low:
                    raise ValueError(f"descending range {part!r} in host list {expr!r}")
                in_bracket += high - low + 1
            hosts *= in_bracket
        total += hosts
        if total > _MAX_HOSTS:
            raise ValueError(f"host list {expr!r} names more than {_MAX_HOSTS} hosts")
    return total


def expand_hostlist(expr: str) -> list[str]:
    """The names in a Slurm hostlist expression, in order (``gpu[01-02],x`` is
    ``["gpu01", "gpu02", "x"]``; zero padding follows the range's first number). Also
    expands gres.conf ``File=/dev/nvidia[0-3]``. Raises ValueError as :func:`count_hostlist`.
    """
    count_hostlist(expr)  # validates and bounds the size before we build anything
    items = split_outside(expr, "[", "]", what="host list")
    names: list[str] = []
    for item in filter(None, items):
        partial = [""]
        pos = 0
        for m in _BRACKET.finditer(item):
            choices: list[str] = []
            for part in m.group(1).split(","):
                r = _RANGE.fullmatch(part.strip())
                assert r is not None  # count_hostlist checked
                width = len(r.group(1))
                low = int(r.group(1))
                high = int(r.group(2)) if r.group(2) is not None else low
                choices += [str(n).zfill(width) for n in range(low, high + 1)]
            prefix = item[pos : m.start()]
            partial = [p + prefix + c for p in partial for c in choices]
            pos = m.end()
        names += [p + item[pos:] for p in partial]
    return names
