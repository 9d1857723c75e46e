"""The one place coda talks to munge: ``munge`` and ``unmunge`` from Debian's munge package.

A munge credential carries a payload together with the uid and gid of the process that
encoded it, the address of the host it was encoded on (``ENCODE_HOST``), when, and for how
long it is valid (``TTL``). It is valid only where munged shares the cluster's key, which
every Slurm host already has (``AuthType=auth/munge``). munge(7) describes the format;
unmunge(1) lists the metadata keys and exit codes read here.

The CLIs rather than libmunge: they are installed wherever munged is, and a credential is
made once per probing run and read once per collector pass, so a process per call costs
nothing that matters.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Debian's munged socket (munged(8) ``--socket``).
DEFAULT_SOCKET = Path("/run/munge/munge.socket.2")

#: unmunge exit codes and STATUS values (munge.h ``munge_err_t``) read here.
EMUNGE_SUCCESS = 0
EMUNGE_SNAFU = 1
EMUNGE_NO_MEMORY = 5
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
EMUNGE_CRED_UNAUTHORIZED = 18
#: Exit codes that say munged could not be asked, rather than anything about the credential.
_UNAVAILABLE = (EMUNGE_SNAFU, EMUNGE_NO_MEMORY, EMUNGE_SOCKET, EMUNGE_TIMEOUT)
_BAD_CREDENTIAL = 8  # EMUNGE_BAD_CRED: what unmunge exits with for unreadable input

_CALL_TIMEOUT_S = 10.0


class MungeUnavailable(Exception):
    """munge/unmunge is not installed or munged does not answer; ``str()`` says which."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """What ``unmunge`` says of one credential.

    ``status`` is munge's error code (0: valid); for an expired, rewound or replayed
    credential munge still reports the metadata and payload, for an invalid one nothing
    (``uid`` None, ``payload`` empty).
    """

    status: int
    status_text: str
    uid: int | None = None
    gid: int | None = None
    encode_host: str | None = None
    """The encoding host's IPv4 address as munged resolved it (``ENCODE_HOST``, numeric)."""
    encode_time_unix_s: int | None = None
    ttl_s: int | None = None
    payload: bytes = b""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MungeUnavailable(f"{name} not found; install Debian's munge package")
    return path


def _call(argv: list[str], data: bytes, who: str) -> subprocess.CompletedProcess[bytes]:
    """Run munge's ``argv`` with ``data`` on stdin; MungeUnavailable when ``who`` does not
    answer in time or the binary cannot be run (ENOEXEC, EACCES, ...)."""
    try:
        return subprocess.run(
            argv, input=data, capture_output=True, timeout=_CALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise MungeUnavailable(f"{who} did not answer in {_CALL_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise MungeUnavailable(f"cannot run {argv[0]}: {exc}") from None


def encode(payload: bytes, socket: Path, *, ttl_s: int, restrict_uid: int | None = None) -> bytes:
    """A credential for ``payload`` from munged at ``socket``, valid ``ttl_s`` seconds;
    only a process of ``restrict_uid`` may decode it when given. Raises MungeUnavailable."""
    argv = [_tool("munge"), f"--socket={socket}", f"--ttl={ttl_s}"]
    if restrict_uid is not None:
        argv.append(f"--restrict-uid={restrict_uid}")
    done = _call(argv, payload, f"munge at {socket}")
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
        raise MungeUnavailable(f"munge --socket={socket}: {why}")
    return done.stdout


def decode(credential: bytes, socket: Path) -> Decoded:
    """Ask munged at ``socket`` what ``credential`` says. A credential munge refuses is a
    :class:`Decoded` with a non-zero ``status``; MungeUnavailable when munged cannot be asked."""
    argv = [_tool("unmunge"), f"--socket={socket}", "--numeric"]
    done = _call(argv, credential, f"unmunge at {socket}")
    err = done.stderr.decode("utf-8", "replace").strip().removeprefix("unmunge: Error: ")
    head, sep, payload = done.stdout.partition(b"\n\n")
    meta: dict[str, str] = {}
    for line in head.decode("ascii", "replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            meta[key.strip()] = value.strip()
    if done.returncode in _UNAVAILABLE:
        raise MungeUnavailable(f"unmunge --socket={socket}: {err}")
    if "STATUS" not in meta:
        # An unreadable credential (bad armor, cut short, not base64) or one for another
        # uid: no metadata at all.
        return Decoded(status=done.returncode or _BAD_CREDENTIAL, status_text=err)
    status = _int_or_none(meta["STATUS"])
    return Decoded(
        status=done.returncode if status is None else status,
        status_text=err or meta["STATUS"],
        uid=_int_or_none(meta.get("UID")),
        gid=_int_or_none(meta.get("GID")),
        encode_host=meta.get("ENCODE_HOST"),
        encode_time_unix_s=_int_or_none(meta.get("ENCODE_TIME")),
        ttl_s=_int_or_none(meta.get("TTL")),
        payload=payload if sep else b"",
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
