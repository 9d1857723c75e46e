"""Slurm's configuration file syntax, which slurm.conf and coda.conf share (as do
``cgroup.conf`` and ``gres.conf``): ``#`` comments outside double quotes, lines continued
with ``\\``, ``Key=Value`` pairs whose values may be ``"quoted"``, and the error that names
the file and line.

Only :func:`read_text` touches files; everything else is pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["ConfigError", "logical_lines", "read_text", "tokenize"]


class ConfigError(ValueError):
    """An invalid configuration; ``str()`` is ``source:line: message`` (or
    ``source: message`` when no line applies)."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _strip_comment(line: str) -> str:
    """``line`` without its comment: ``#`` outside double quotes, not preceded by ``\\``."""
    if "#" not in line:
        return line
    in_quotes = False
    prev = ""
    for i, c in enumerate(line):
        if c == '"':
            in_quotes = not in_quotes
        elif c == "#" and not in_quotes and prev != "\\":
            return line[:i]
        prev = c
    return line


def logical_lines(text: str, source: str) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` of each non-blank logical line: comments stripped,
    ``\\``-continued lines joined as Slurm does (backslash dropped, next line appended
    as is), CR before LF dropped."""
    pending: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.split("\n"), 1):
        if raw.endswith("\r"):
            raw = raw[:-1]
        bad = _CONTROL.search(raw)
        if bad is not None:
            raise ConfigError(source, lineno, f"control character {bad.group()!a} in the file")
        line = _strip_comment(raw).rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = "".join(pending).strip()
        pending = []
        if joined:
            yield start, joined
    if pending:
        joined = "".join(pending).strip()
        if joined:
            yield start, joined


def tokenize(line: str, source: str, lineno: int) -> list[tuple[str, str]]:
    """The ``Key=Value`` pairs of one logical line; values may be ``"quoted"``."""
    pairs: list[tuple[str, str]] = []
    i = 0
    n = len(line)
    while i < n:
        if line[i] in " \t":
            i += 1
            continue
        eq = line.find("=", i)
        space = min((j for j in (line.find(" ", i), line.find("\t", i)) if j >= 0), default=n)
        if eq < 0 or eq > space:
            word = line[i:space]
            raise ConfigError(source, lineno, f"expected Key=Value, got {word!r}")
        key = line[i:eq]
        if not key:
            raise ConfigError(source, lineno, "missing key before '='")
        i = eq + 1
        if i < n and line[i] == '"':
            end = line.find('"', i + 1)
            if end < 0:
                raise ConfigError(source, lineno, f"unterminated quote in the value of {key}")
            value = line[i + 1 : end]
            i = end + 1
            if i < n and line[i] not in " \t":
                raise ConfigError(
                    source, lineno, f"unexpected text after the quoted value of {key}"
                )
        else:
            end = i
            while end < n and line[end] not in " \t":
                end += 1
            value = line[i:end].replace("\\#", "#")
            if '"' in value:
                raise ConfigError(source, lineno, f"stray quote in the value of {key}")
            i = end
        pairs.append((key, value))
    return pairs


MAX_CONF_FILE_BYTES = 64 << 20
"""The most a configuration file holds (a slurm.conf of ten thousand nodes is a few MB)."""


def read_text(path: Path, source: str | None = None) -> str:
    """The UTF-8 text of ``path``; ConfigError when unreadable, larger than
    :data:`MAX_CONF_FILE_BYTES` (not read further) or not UTF-8."""
    source = source or str(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONF_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_CONF_FILE_BYTES:
        raise ConfigError(
            source, None, f"larger than {MAX_CONF_FILE_BYTES} bytes: not a configuration file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(source, lineno, "not valid UTF-8") from None
