"""How a ``coda.conf`` value is read: one parser per syntax, ``parser(key, value)`` -> the
typed value, ValueError (the message the admin sees) when the value is invalid. Pure."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from coda_common.signature import (
    ScriptIgnore,
    SignatureIgnoreError,
    name_problem,
    parse_script_ignore,
)

MAX_CPUS = 65533
"""Largest CPU count a key may hold (Slurm keeps cpus_per_task in a uint16 below NO_VAL16)."""

MIN_INTERVAL_S = 0.1
"""Shortest wait between two passes of a loop a key may set, in seconds."""
MAX_INTERVAL_S = 86400
"""Longest wait between two passes of a loop a key may set, in seconds."""

Parser = Callable[[str, str], Any]
"""``parser(key, value)`` -> typed value; ValueError when invalid."""

_INT = re.compile(r"\+?[0-9]{1,9}")
_FLOAT = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?")
_GRES_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_FEATURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _int(key: str, value: str, low: int, high: int = MAX_CPUS) -> int:
    if _INT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{key} must be {low}..{high}, got {number}")
    return number


def ints(low: int, high: int = MAX_CPUS) -> Parser:
    """A whole number in ``low..high``."""
    return lambda key, value: _int(key, value, low, high)


def _float(key: str, value: str) -> float:
    if _FLOAT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def positive_float(key: str, value: str) -> float:
    number = _float(key, value)
    if not number > 0:
        raise ValueError(f"{key} must be greater than 0, got {value}")
    return number


def interval_s(key: str, value: str) -> float:
    """Seconds between two passes of a loop: from a tenth of a second (a shorter wait makes
    the loop spin, a core of the daemon it runs in gone) to a day (a thread waits no longer
    than that; far larger waits overflow its timer)."""
    number = _float(key, value)
    if not number >= MIN_INTERVAL_S:
        raise ValueError(f"{key} must be at least {MIN_INTERVAL_S}, got {value}")
    if number > MAX_INTERVAL_S:
        raise ValueError(f"{key} must be at most {MAX_INTERVAL_S} (a day), got {value}")
    return number


def float_at_least_0(key: str, value: str) -> float:
    number = _float(key, value)
    if number < 0:
        raise ValueError(f"{key} must be 0 or more, got {value}")
    return number


def float_range(low: int, high: int) -> Parser:
    """A number in ``low..high``, both ends included."""

    def parse(key: str, value: str) -> float:
        number = _float(key, value)
        if not low <= number <= high:
            raise ValueError(f"{key} must be {low}..{high}, got {value}")
        return number

    return parse


def percent(high: float) -> Parser:
    """A percentage above 0 and at most ``high``."""
    return positive_at_most(high)


def positive_at_most(high: float) -> Parser:
    """A number above 0 and at most ``high``."""

    def parse(key: str, value: str) -> float:
        number = _float(key, value)
        if not 0.0 < number <= high:
            raise ValueError(f"{key} must be more than 0 and at most {high:g}, got {value}")
        return number

    return parse


def or_none(parse: Parser) -> Parser:
    """``parse``, or None for an empty value."""
    return lambda key, value: parse(key, value) if value else None


def _choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    lowered = value.lower()
    if lowered not in choices:
        raise ValueError(f"{key} must be one of {'|'.join(choices)}, got {value!r}")
    return lowered


def one_of(*choices: str) -> Parser:
    """One of ``choices``, any case; the lower-case choice."""
    return lambda key, value: _choice(key, value, choices)


def yes_no(key: str, value: str) -> bool:
    return _choice(key, value, ("yes", "no")) == "yes"


def abs_path(key: str, value: str) -> Path:
    path = Path(value)
    if not value or not path.is_absolute():
        raise ValueError(f"{key} must be an absolute path, got {value!r}")
    return path


def profile_store(key: str, value: str) -> Path:
    if not value:
        raise ValueError(f"{key} needs a value")
    return abs_path(key, value)


def abs_path_or_none(key: str, value: str) -> Path | None:
    return abs_path(key, value) if value else None


def path_or_none(key: str, value: str) -> Path | None:
    return Path(value) if value else None


def partition_list(key: str, value: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if any(c.isspace() for c in part):
            raise ValueError(f"{key}: partition name {part!r} contains blanks")
        if part not in names:
            names.append(part)
    return tuple(names)


def uids(key: str, value: str) -> tuple[int, ...]:
    uids = partition_list(key, value)
    if not uids:
        raise ValueError(f"{key} needs at least one uid")
    return tuple(_int(key, uid, 0, 2**31 - 1) for uid in uids)


def cpus_or_share(key: str, value: str) -> int | Literal["share"] | None:
    if value.lower() == "share":
        return "share"
    return _int(key, value, 1) if value else None


def signature_ignore(key: str, value: str) -> ScriptIgnore:
    try:
        return parse_script_ignore(value)
    except SignatureIgnoreError as exc:
        raise ValueError(str(exc)) from None


def gres_name(key: str, value: str) -> str | None:
    if value and (not _GRES_NAME.fullmatch(value) or value.lower() == "gpu"):
        raise ValueError(
            f"{key} must be a GRES name (letters, digits, _) other than gpu, got {value!r}"
        )
    return value or None


def gpu_types(key: str, value: str) -> tuple[str, ...]:
    types = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [t for t in types if not _FEATURE_NAME.fullmatch(t)]
    if bad:
        raise ValueError(f"{key}: {bad[0]!r} is not a GPU type name")
    if len(types) == 1:
        raise ValueError(
            f"{key} needs at least two GPU types, fastest first (one type leaves nothing to prefer)"
        )
    return types


def gpu_features(key: str, value: str) -> tuple[tuple[str, str], ...]:
    pairs: dict[str, str] = {}
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        gpu_type, sep, feature = item.partition(":")
        gpu_type = gpu_type.strip().lower()
        feature = feature.strip()
        if not sep or not _FEATURE_NAME.fullmatch(gpu_type):
            raise ValueError(f"{key}: expected type:feature, got {item!r}")
        if not _FEATURE_NAME.fullmatch(feature):
            # --prefer takes a feature expression; & | , [ ] * ( ) would change it.
            raise ValueError(
                f"{key}: {feature!r} is not a node feature name (letters, digits, _ . -)"
            )
        pairs[gpu_type] = feature
    return tuple(pairs.items())


def prior_aliases(key: str, value: str) -> tuple[tuple[str, str], ...]:
    """``NAME:ALIAS,NAME:ALIAS,...`` as ``((alias, name), ...)`` in lower case, each pair
    once, in the order written."""
    pairs: dict[tuple[str, str], None] = {}
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        name, sep, alias = (part.strip().lower() for part in item.partition(":"))
        if not sep or not name or not alias:
            raise ValueError(f"{key}: expected NAME:ALIAS, got {item!r}")
        for what, text in (("NAME", name), ("ALIAS", alias)):
            problem = name_problem(text)
            if problem is not None:
                raise ValueError(f"{key}: {what} {text!r} in {item!r} {problem}")
        pairs[(alias, name)] = None
    return tuple(pairs)


def node_name(key: str, value: str) -> str | None:
    if value and not _NODE_NAME.fullmatch(value):
        raise ValueError(f"{key} {value!r} is not a Slurm node name")
    return value or None


def ip_address(key: str, value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{key} must be an IP address, got {value!r}") from None
    return value
