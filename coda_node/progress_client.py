"""Report training progress to coda-node. STDLIB ONLY: no coda, no third-party imports.

This one file is meant to be copied into training environments that do not have coda
installed; keep it self-contained (Python >= 3.8 standard library).

    from progress_client import track      # or: from coda_node.progress_client import track

    for batch in track(loader):             # counts iterations, phase "train"
        ...
    for batch in track(val_loader, phase="val"):
        ...

coda-node creates ``/run/coda-node/progress/job_<SLURM_JOB_ID>`` (owned by the job's user)
shortly after the job starts; this module only ever opens it for writing, never creates
it, and writes one fixed-size 64-byte record ``"<iterations> <phase>\\n"`` padded with
spaces, in place. Nothing here raises into the training loop: while the file is missing
or unwritable it retries at most every 5 s, silently. Without a Slurm job (no
``SLURM_JOB_ID``) and no explicit path, every call is a no-op. In multi-process jobs only
node-local rank 0 (``LOCAL_RANK``, else ``SLURM_LOCALID``) reports unless a path is given.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

DEFAULT_DIR = "/run/coda-node/progress"
RECORD_BYTES = 64
RETRY_S = 5.0

_PHASE = re.compile(r"[a-z0-9_-]{1,16}")
_T = TypeVar("_T")


def _check_phase(phase: str) -> str:
    p = str(phase).lower()
    if not _PHASE.fullmatch(p):
        raise ValueError(f"invalid phase {phase!r}: use 1-16 of a-z 0-9 _ -")
    return p


def _path_from_env() -> str | None:
    rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")).strip()
    if rank not in ("", "0"):
        return None
    explicit = os.environ.get("CODA_PROGRESS_FILE")
    if explicit:
        return explicit
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    if not (job.isascii() and job.isdigit()):
        return None
    return os.path.join(os.environ.get("CODA_PROGRESS_DIR") or DEFAULT_DIR, f"job_{job}")


class Progress:
    """A cumulative iteration counter written to the job's coda-node progress file."""

    __slots__ = ("_count", "_due_s", "_phase", "_retry_s", "min_interval_s", "path")

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        min_interval_s: float = 0.5,
    ) -> None:
        self.path: str | None = os.fspath(path) if path is not None else _path_from_env()
        self.min_interval_s = float(min_interval_s)
        self._count = 0
        self._phase: str | None = None
        self._retry_s = 0.0
        self._due_s = 0.0 if self.path else math.inf

    @property
    def active(self) -> bool:
        """False when there is nowhere to report to (every call is then a no-op)."""
        return self.path is not None

    @property
    def iterations(self) -> int:
        return self._count

    @property
    def phase(self) -> str | None:
        return self._phase

    def step(self, n: int = 1) -> None:
        """Add ``n`` iterations; written at most every ``min_interval_s``."""
        self._count += n
        if time.monotonic() >= self._due_s:
            self._write()

    def set_phase(self, phase: str) -> None:
        """Set the phase ("train", "val", "checkpoint", ...) and write it now."""
        self._phase = _check_phase(phase)
        self._write()

    def flush(self) -> None:
        """Write the current count now (unless the file is in its 5 s retry pause)."""
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._retry_s:
            self._due_s = self._retry_s
            return
        line = f"{self._count} {self._phase}\n" if self._phase else f"{self._count}\n"
        data = line.encode("ascii").ljust(RECORD_BYTES, b" ")
        try:
            fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))  # never O_CREAT
            try:
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)
        except (OSError, ValueError):
            self._retry_s = self._due_s = now + RETRY_S
            return
        self._due_s = now + self.min_interval_s


_shared: Progress | None = None


def default_progress() -> Progress:
    """The process-wide Progress that :func:`track` uses when given none."""
    global _shared
    if _shared is None:
        _shared = Progress()
    return _shared


def track(
    iterable: Iterable[_T], *, phase: str = "train", progress: Progress | None = None
) -> Iterator[_T]:
    """Yield the items of ``iterable``, counting one iteration after each.

    The phase is set when iteration starts; the count is flushed when it ends.
    """
    phase = _check_phase(phase)  # a bad name fails here, not mid-epoch
    return _tracked(iterable, phase, progress if progress is not None else default_progress())


def _tracked(iterable: Iterable[_T], phase: str, progress: Progress) -> Iterator[_T]:
    progress.set_phase(phase)
    try:
        for item in iterable:
            yield item
            progress.step()
    finally:
        progress.flush()
