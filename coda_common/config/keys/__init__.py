"""The ``coda.conf`` keys, one module per group of keys; :class:`KeySpec` is one key.
:class:`coda_common.config.codaconf.CodaConfig` makes each spec a field. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from coda_common.config.values import Parser


class KeySpec(NamedTuple):
    """One ``coda.conf`` key: how it is documented, read and stored."""

    name: str
    """The key as documented (the file's keys are matched case-insensitively)."""
    type: str
    """Value syntax, e.g. ``int``, ``float``, ``path``, ``enforce|advise|off``, ``list``."""
    default: str
    """The default as it would be written in the file (``""`` = empty)."""
    help: str
    parse: Callable[[str, str], Any]
    """``parse(key, value)`` -> the :class:`CodaConfig` value; ValueError (the message the
    user sees) when the value is invalid."""
    field: str = ""
    """The :class:`CodaConfig` field the key fills."""


def key(name: str, syntax: str, default: str, parse: Parser, help: str) -> KeySpec:
    """The spec of key ``name``: ``syntax`` and ``default`` as documented, ``parse`` its
    value parser, ``help`` its line in docs/config.md."""
    return KeySpec(name, syntax, default, help, parse)
