"""Opt-in, exact training progress from jobs: one small file per job, read every tick.

A job that wants to (``coda_node/progress_client.py``, or one ``printf`` in a shell) writes
``<iterations> [<phase>]`` as the first line of ``/run/coda-node/progress/job_<id>``; the
daemon reads it each tick and turns the cumulative count into a rate.

Security model:

- The directory is created by the daemon, owned by root, mode 0755 (fixed if found
  otherwise), so no user can create, rename or delete anything in it: nobody can squat
  another job's name or swap a file for a symlink.
- :meth:`ProgressFiles.ensure` creates ``job_<id>`` (``O_CREAT|O_EXCL|O_NOFOLLOW``, empty,
  mode 0644) and chowns it to the job's uid (and gid if given): only the job's owner can
  write it. Something already there that is not a regular file owned by that uid is
  unlinked and recreated.
- :meth:`ProgressFiles.read` trusts only jobs it ensured in this process: it opens with
  ``O_NOFOLLOW``, requires (fstat) a regular file owned by the uid given to ``ensure``,
  reads at most 256 bytes and parses the first complete line. Content problems (empty,
  torn, garbage) give ``None``, never an exception.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from coda_node.system.paths import SystemRoot

log = logging.getLogger("coda-node")

DEFAULT_DIR = Path("/run/coda-node/progress")
READ_MAX_BYTES = 256
DIR_MODE = 0o755
FILE_MODE = 0o644

_NAME = re.compile(r"job_([0-9]+)")
_ITERATIONS = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE]\+?[0-9]+)?")
_PHASE = re.compile(r"[a-z0-9_-]{1,16}")


@dataclass(frozen=True, slots=True)
class ProgressReading:
    """One valid progress line as a job last wrote it."""

    iterations: float
    """Cumulative count the job reported (monotonic unless the job restarted)."""
    phase: str | None
    """``train``, ``val``, ... as reported (lower-cased), None if absent."""
    written_unix_s: float
    """The file's mtime."""


def parse_progress(data: bytes, written_unix_s: float) -> ProgressReading | None:
    """The first newline-terminated line as a reading; None for anything malformed."""
    line, newline, _ = data.partition(b"\n")
    if not newline:
        return None  # empty, or a write caught half way
    try:
        fields = line.decode("ascii").split()
    except UnicodeDecodeError:
        return None
    if not 1 <= len(fields) <= 2 or not _ITERATIONS.fullmatch(fields[0]):
        return None
    iterations = float(fields[0])
    if not math.isfinite(iterations):
        return None
    phase = fields[1].lower() if len(fields) == 2 else None
    if phase is not None and not _PHASE.fullmatch(phase):
        return None
    return ProgressReading(iterations, phase, written_unix_s)


class ProgressFiles:
    """The per-job progress files under one directory of a :class:`SystemRoot`."""

    def __init__(self, root: SystemRoot, directory: Path = DEFAULT_DIR) -> None:
        self.directory = root.path(str(directory))
        self._owners: dict[int, int] = {}
        """job id -> uid given to ensure(); read() trusts only these jobs."""
        self._logged: set[tuple[int, str]] = set()

    def path_for(self, job_id: int) -> Path:
        """The real path of the job's file on this root: ``<dir>/job_<id>``."""
        return Path(self._path_text(job_id))

    def _path_text(self, job_id: int) -> str:
        """:meth:`path_for` as a string: the loop reads every DNN job's file each tick, and
        building the ``Path`` cost more than the read (bench/bench_node_tick.py)."""
        return f"{os.fspath(self.directory)}/job_{int(job_id)}"

    def ensure(self, job_id: int, uid: int, gid: int | None = None) -> Path | None:
        """Create the job's file (empty, 0644, owned by ``uid``) unless a good one exists."""
        path = self.path_for(job_id)
        if self._owners.get(job_id) == uid and _is_owned_regular(path, uid):
            return path
        try:
            dir_fd = self._open_dir()
            try:
                _ensure_file(dir_fd, path.name, uid, gid)
            finally:
                os.close(dir_fd)
        except OSError as e:
            self._log_once(job_id, "ensure", "cannot create progress file %s: %s", path, e)
            return None
        self._owners[job_id] = uid
        return path

    def read(self, job_id: int) -> ProgressReading | None:
        """The job's last valid line; None if absent, malformed or not trustworthy."""
        uid = self._owners.get(job_id)
        if uid is None:
            return None
        path = self._path_text(job_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._log_once(job_id, "read", "cannot read progress file %s: %s", path, e)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                self._log_once(
                    job_id,
                    "owner",
                    "ignoring progress file %s: not a regular file owned by uid %d",
                    path,
                    uid,
                )
                return None
            first = os.pread(fd, READ_MAX_BYTES, 0)
            second = os.pread(fd, READ_MAX_BYTES, 0)
            written_unix_s = os.fstat(fd).st_mtime
        except OSError as e:
            if e.errno != errno.ENOENT:
                self._log_once(job_id, "read", "cannot read progress file %s: %s", path, e)
            return None
        finally:
            os.close(fd)
        if first != second:
            return None  # a write landed between the two reads: try again next tick
        return parse_progress(first, written_unix_s)

    def forget(self, live_job_ids: Collection[int]) -> int:
        """Delete the files of jobs not in ``live_job_ids``; return how many went."""
        live = set(live_job_ids)
        for job_id in [j for j in self._owners if j not in live]:
            del self._owners[job_id]
        self._logged = {key for key in self._logged if key[0] in live}
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        except OSError as e:
            log.warning("cannot list progress directory %s: %s", self.directory, e)
            return 0
        removed = 0
        for name in names:
            m = _NAME.fullmatch(name)
            if m is None or int(m.group(1)) in live:
                continue
            try:
                os.unlink(self.directory / name)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("cannot remove progress file %s: %s", self.directory / name, e)
                continue
            removed += 1
        return removed

    def _open_dir(self) -> int:
        """Open the directory (creating it and its parents 0755), root-owned and 0755."""
        missing = []
        d = self.directory
        while not os.path.lexists(d) and d != d.parent:
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, DIR_MODE)
                os.chmod(d, DIR_MODE)  # whatever the umask
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                os.fchown(fd, os.geteuid(), -1)
            if stat.S_IMODE(st.st_mode) != DIR_MODE:
                os.fchmod(fd, DIR_MODE)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _log_once(self, job_id: int, kind: str, msg: str, *args: object) -> None:
        if (job_id, kind) not in self._logged:
            self._logged.add((job_id, kind))
            log.warning(msg, *args)


def _is_owned_regular(path: Path, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid


def _ensure_file(dir_fd: int, name: str, uid: int, gid: int | None) -> None:
    """Leave a regular file owned by ``uid``; replace anything else; create if missing."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
            return
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
    try:
        os.fchown(fd, uid, -1 if gid is None else gid)
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
