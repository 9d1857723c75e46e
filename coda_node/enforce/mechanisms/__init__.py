"""The enforcement mechanisms, one module each, listed once here in the order the enforcer
applies them: ``cpuset``, then ``quota``, then ``rdt``.

Everything that names the mechanisms (the enforcer's steps, the state file's records,
coda.conf's NodeEnforce check, ``coda-node check`` and the status screen's capabilities
(:func:`probe`), ``coda-node limit``'s options, the status events) reads this list. A
mechanism is a :class:`~coda_node.enforce.mechanisms.base.Mechanism` subclass;
:func:`register` adds one after the others, :func:`unregister` takes it out again. coda.conf
is read below coda-node (coda_common), so the registry hands it the names NodeEnforce
accepts (:func:`coda_common.config.codaconf.set_node_mechanisms`); its built-in list is
this one's first three, for a reader without coda-node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coda_common.config.codaconf import set_node_mechanisms
from coda_node.enforce.mechanisms.base import Mechanism
from coda_node.enforce.mechanisms.cpuset import Cpuset
from coda_node.enforce.mechanisms.quota import Quota
from coda_node.enforce.mechanisms.rdt import Rdt
from coda_node.system.capability import Capability
from coda_node.system.check import probe_all
from coda_node.system.paths import SystemRoot

if TYPE_CHECKING:
    from coda_node.system.nvml import Nvml

_REGISTRY: dict[str, type[Mechanism]] = {}
_OWNER: dict[str, str] = {}
"""Record key -> the mechanism whose record has it."""


def register(kind: type[Mechanism]) -> None:
    """Add ``kind`` after the mechanisms listed so far. Its name, the keys of its record
    and its ``coda-node limit`` options must be new: a record's keys share one JSON object
    with the others', and the options one command."""
    if kind.name in _REGISTRY:
        raise ValueError(f"a mechanism named {kind.name!r} is already registered")
    keys = kind.record.field_names()
    clash = sorted(key for key in keys if key in _OWNER)
    if clash:
        raise ValueError(f"{kind.name}: record keys {', '.join(clash)} are another's")
    taken = {word for other in _REGISTRY.values() for word in _option_words(other)}
    clash = sorted(_option_words(kind) & taken)
    if clash:
        raise ValueError(f"{kind.name}: limit options {', '.join(clash)} are another's")
    _REGISTRY[kind.name] = kind
    _OWNER.update(dict.fromkeys(keys, kind.name))
    set_node_mechanisms(_REGISTRY)


def _option_words(kind: type[Mechanism]) -> set[str]:
    """The flags and parameter names of ``kind``'s ``coda-node limit`` options."""
    return {word for o in kind.limit_options for word in (*o.opts, o.name or "")} - {""}


def unregister(name: str) -> None:
    """Take the mechanism ``name`` out of the list (records of it are no longer read)."""
    kind = _REGISTRY.pop(name)
    for key in kind.record.field_names():
        del _OWNER[key]
    set_node_mechanisms(_REGISTRY)


def registered() -> tuple[type[Mechanism], ...]:
    """Every mechanism, in the order they are applied."""
    return tuple(_REGISTRY.values())


def get(name: str) -> type[Mechanism]:
    """The mechanism ``name``; KeyError for a name not registered."""
    return _REGISTRY[name]


def owner(key: str) -> str | None:
    """The name of the mechanism whose record has the field ``key``; None if none has."""
    return _OWNER.get(key)


def names() -> tuple[str, ...]:
    """The mechanisms' names, in the order they are applied."""
    return tuple(_REGISTRY)


def probe(
    root: SystemRoot,
    *,
    slurm: bool = True,
    env: dict[str, str] | None = None,
    nvml: Nvml | None = None,
    node_name: str | None = None,
) -> list[Capability]:
    """``coda-node check``'s rows: the node's (:func:`coda_node.system.check.probe_all`,
    with its keywords) and every mechanism's ``probe`` in the order they are applied,
    those that limit through a job's cgroups before the Slurm job cgroups row."""
    kinds = registered()
    return probe_all(
        root,
        cgroup_limits=[c for kind in kinds if kind.through_cgroups for c in kind.probe(root)],
        limits=[c for kind in kinds if not kind.through_cgroups for c in kind.probe(root)],
        slurm=slurm,
        env=env,
        nvml=nvml,
        node_name=node_name,
    )


for _kind in (Cpuset, Quota, Rdt):
    register(_kind)
