"""Which controller this is, and the files the hook of each controller writes.

slurm.conf may list several ``SlurmctldHost`` lines: the first is the primary, the others
backups. Each slurmctld loads job_submit/coda when it starts, a backup too while it stands
by, so every controller's hook writes its counters (``HookStatsFile``) and, once it holds
control, its decisions (``DecisionJournal``). Each controller therefore writes files of its
own, named by its host: ``%h`` in either path is the controller's name, and with more than
one controller a path without ``%h`` gets ``.NAME`` before its extension
(``decisions.jsonl`` -> ``decisions.ctl1.jsonl``). ``coda-slurm status`` reads every
controller's files from the same rule.

The controller's name is the ``SlurmctldHost`` entry its host name matches, short or long,
as slurmctld itself decides (``_controller_index`` in Slurm's src/slurmctld/controller.c;
``slurmctld -n`` is its nice value, not a name).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurmctld_hosts

__all__ = [
    "HOST_PLACEHOLDER",
    "Controllers",
    "host_file",
    "read_controllers",
    "this_controller",
]

HOST_PLACEHOLDER = "%h"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Controllers:
    """slurm.conf's controllers (primary first) and the one this process runs on."""

    hosts: tuple[str, ...]
    this: str
    """This host's controller name (its short host name where slurm.conf lists none)."""

    @property
    def several(self) -> bool:
        return len(self.hosts) > 1

    def file_of(self, path: Path | None, host: str | None = None) -> Path | None:
        """``path`` as controller ``host`` (default: this one) writes it."""
        if path is None:
            return None
        return host_file(path, host or self.this, several=self.several)

    def files(self, path: Path | None) -> dict[str, Path]:
        """Every controller's file of ``path`` by host: one per ``SlurmctldHost`` where
        they are per host, else the one file (under the one controller's name)."""
        if path is None:
            return {}
        hosts = self.hosts or (self.this,)
        if self.several or HOST_PLACEHOLDER in str(path):
            return {h: host_file(path, h, several=self.several) for h in hosts}
        return {hosts[0]: path}


def _safe(name: str) -> str:
    """A host name as one path component: anything but letters, digits, ``.-_`` becomes
    ``_`` (a name is slurm.conf's, and lands in a file name)."""
    safe = _UNSAFE.sub("_", name)
    return "_" + safe if safe in ("", ".", "..") else safe


def host_file(path: Path, host: str, *, several: bool) -> Path:
    """The file controller ``host`` writes for ``path``: ``%h`` replaced by the host; else,
    when there are ``several`` controllers, ``.host`` before the last extension (or at the
    end); else ``path``; pure."""
    name = _safe(host)
    text = str(path)
    if HOST_PLACEHOLDER in text:
        return Path(text.replace(HOST_PLACEHOLDER, name))
    if not several:
        return path
    stem, dot, ext = path.name.rpartition(".")
    if not dot or not stem:
        return path.with_name(f"{path.name}.{name}")
    return path.with_name(f"{stem}.{name}.{ext}")


def this_controller(hosts: Sequence[str], short: str, long: str) -> str:
    """The entry of ``hosts`` slurmctld on this host matches (its short or long host
    name), else the short name; pure."""
    for host in hosts:
        if host in (short, long):
            return host
    return short


def read_controllers(slurm_conf: Path | None) -> tuple[Controllers, str | None]:
    """The controllers of slurm.conf at ``slurm_conf`` and this host's name among them,
    and why slurm.conf could not be read (then: this host alone)."""
    long = socket.gethostname()
    short = long.split(".", 1)[0]
    hosts: tuple[str, ...] = ()
    error = None
    if slurm_conf is not None:
        try:
            hosts = read_slurmctld_hosts(slurm_conf)
        except (OSError, ConfigError) as exc:
            error = f"cannot read SlurmctldHost from {slurm_conf}: {exc}"
    return Controllers(hosts, this_controller(hosts, short, long)), error
