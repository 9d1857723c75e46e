"""Where job summaries (:mod:`coda_common.store.jobsummary`) are kept: ``JobSummaryDir``.

Layout (root-owned, like the profile store; a user cannot write a summary)::

    <dir>/<YYYY-MM-DD>/<writer>.jsonl   the summaries of jobs that ended that day (UTC),
                                        one JSON line each, appended by one writer: a node
                                        (ProfilePublish=store) or the collector (munge)

One writer per file, appends of whole lines with one ``write(2)`` on ``O_APPEND``: nodes
sharing the directory over NFS never write the same file. A reader takes whole lines only,
so a line a crash cut short is named and skipped.

Retention: :meth:`SummaryStore.prune` removes day directories older than
``JobSummaryRetentionDays`` and then the oldest days until the whole is under
``JobSummaryMaxBytes`` (the current day is kept whatever its size).

Reading is hostile-input safe: files that are not regular, not owned by a trusted uid, or
group/other-writable are refused; lines longer than :data:`MAX_LINE_BYTES`, files larger
than :data:`MAX_FILE_BYTES`, damaged lines and lines of a newer format are named and
skipped; nothing stops a scan.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coda_common.config.codaconf import CodaConfig
from coda_common.store.jobsummary import JobSummary, SummaryFormatError, summary_from_json_line
from coda_common.store.profiles import default_trusted_uids

MAX_LINE_BYTES = 16 * 1024
"""A summary line is about 900 bytes; a longer one is not ours."""
MAX_FILE_BYTES = 512 * 1024 * 1024
"""One writer's day: ~500,000 summaries."""
READ_CHUNK_BYTES = 1 << 20
MAX_PROBLEMS_KEPT = 100
"""Problems a scan keeps word for word (all are counted)."""

PRUNE_EVERY_S = 3600.0
"""A writer prunes the store at most this often (:meth:`SummaryStore.prune_if_due`)."""
PRUNE_STAMP = ".pruned"
"""The file whose mtime says when the store was last pruned, by any writer sharing it."""

_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_WRITER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.jsonl")


class SummaryStoreError(OSError):
    """A summary could not be written; the message names the file."""


@dataclass(slots=True)
class ScanProblems:
    """What a scan skipped: a count, and the first :data:`MAX_PROBLEMS_KEPT` in words."""

    count: int = 0
    kept: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.count += 1
        if len(self.kept) < MAX_PROBLEMS_KEPT:
            self.kept.append(f"{where}: {why}")


def day_of(unix_s: float) -> str:
    """The UTC day a summary ending at ``unix_s`` is filed under."""
    return dt.datetime.fromtimestamp(unix_s, dt.UTC).strftime("%Y-%m-%d")


def _day_start_s(day: str) -> float:
    return dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()


class SummaryStore:
    """The summaries under ``root``; ``trusted_uids`` as the profile store's."""

    def __init__(
        self,
        root: Path,
        *,
        retention_days: int = 90,
        max_bytes: int = 1 << 30,
        owner_uid: int | None = None,
    ) -> None:
        self.root = root
        self.retention_days = retention_days
        self.max_bytes = max_bytes
        self.trusted_uids = default_trusted_uids(owner_uid)

    # -- writes -----------------------------------------------------------------------------

    def append(self, summaries: Iterable[JobSummary], writer: str) -> list[Path]:
        """Append ``summaries`` to ``<day>/<writer>.jsonl``, one write per file; returns
        the files written. SummaryStoreError names the file that failed."""
        if not _WRITER_RE.fullmatch(writer):
            raise ValueError(f"writer name {writer[:70]!r} is not [A-Za-z0-9._-], 1..64")
        by_day: dict[str, list[bytes]] = {}
        for s in summaries:
            by_day.setdefault(day_of(s.end_unix_s), []).append(s.to_json_line())
        written = []
        for day, lines in sorted(by_day.items()):
            path = self.root / day / f"{writer}.jsonl"
            self._append_lines(path, b"".join(lines))
            written.append(path)
        return written

    def _append_lines(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise SummaryStoreError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise SummaryStoreError(errno.EINVAL, f"{path} is not a plain file")
            if st.st_size > MAX_FILE_BYTES:
                raise SummaryStoreError(errno.EFBIG, f"{path} is over {MAX_FILE_BYTES} bytes")
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except SummaryStoreError:
            raise
        except OSError as exc:
            raise SummaryStoreError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def prune(self, now_s: float) -> list[str]:
        """Remove whole days past retention, then the oldest days until the store is
        under ``max_bytes``; the current day is kept. Returns the days removed."""
        days = self.days()
        today = day_of(now_s)
        cutoff = _day_start_s(today) - self.retention_days * 86400.0
        removed = [d for d in days if d != today and _day_start_s(d) < cutoff]
        kept = [d for d in days if d not in removed]
        sizes = {d: self._day_bytes(d) for d in kept}
        total = sum(sizes.values())
        for d in kept:
            if total <= self.max_bytes or d == today:
                break
            removed.append(d)
            total -= sizes[d]
        for d in removed:
            shutil.rmtree(self.root / d, ignore_errors=True)
        return removed

    def prune_if_due(self, now_s: float, every_s: float = PRUNE_EVERY_S) -> list[str] | None:
        """:meth:`prune` where the store was last pruned ``every_s`` ago or more (or never),
        by whichever writer: :data:`PRUNE_STAMP`'s mtime, set now, says when. None when
        not due or the store does not exist yet; OSError when the stamp cannot be set."""
        stamp = self.root / PRUNE_STAMP
        try:
            last_s = os.stat(stamp, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            last_s = None
        if last_s is not None and 0 <= now_s - last_s < every_s:
            return None
        if not self.root.is_dir():
            return None
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(stamp, flags, 0o644)
        try:
            os.utime(fd, (now_s, now_s))
        finally:
            os.close(fd)
        return self.prune(now_s)

    def _day_bytes(self, day: str) -> int:
        total = 0
        try:
            with os.scandir(self.root / day) as it:
                for e in it:
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            return 0
        return total

    # -- reads ------------------------------------------------------------------------------

    def days(self) -> list[str]:
        """The day directories, oldest first (none when the store does not exist)."""
        try:
            with os.scandir(self.root) as it:
                return sorted(
                    e.name
                    for e in it
                    if _DAY_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
                )
        except FileNotFoundError:
            return []

    def scan(
        self,
        since_s: float | None = None,
        until_s: float | None = None,
        problems: ScanProblems | None = None,
    ) -> Iterator[JobSummary]:
        """Every summary that ended in ``[since_s, until_s)`` (either bound open when
        None), later copies of one job on one node replacing earlier ones is left to the
        caller (:func:`latest`). Skipped lines and files go to ``problems``."""
        problems = problems if problems is not None else ScanProblems()
        first = day_of(since_s) if since_s is not None else None
        last = day_of(until_s) if until_s is not None else None
        for day in self.days():
            if (first is not None and day < first) or (last is not None and day > last):
                continue
            for s in self._scan_day(day, problems):
                if since_s is not None and s.end_unix_s < since_s:
                    continue
                if until_s is not None and s.end_unix_s >= until_s:
                    continue
                yield s

    def find_job(self, job_id: int, around_s: float | None = None) -> list[JobSummary]:
        """The summaries of job ``job_id`` (one per node), looking in the days around
        ``around_s`` (its end; a day either side) or, without it, in every day."""
        problems = ScanProblems()
        if around_s is None:
            found = [s for s in self.scan(problems=problems) if s.job_id == job_id]
        else:
            found = [
                s
                for s in self.scan(around_s - 86400.0, around_s + 86400.0, problems)
                if s.job_id == job_id
            ]
        return latest(found)

    def _scan_day(self, day: str, problems: ScanProblems) -> Iterator[JobSummary]:
        try:
            with os.scandir(self.root / day) as it:
                names = sorted(e.name for e in it)
        except OSError as exc:
            problems.add(str(self.root / day), f"cannot list: {exc.strerror}")
            return
        for name in names:
            path = self.root / day / name
            if not _FILE_RE.fullmatch(name):
                problems.add(str(path), "not a summary file name (<writer>.jsonl); left alone")
                continue
            yield from self._scan_file(path, problems)

    def _scan_file(self, path: Path, problems: ScanProblems) -> Iterator[JobSummary]:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            return
        except OSError as exc:
            why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            problems.add(str(path), f"not read: {why}")
            return
        with os.fdopen(fd, "rb", buffering=0) as f:
            st = os.fstat(f.fileno())
            why = self._refusal(st)
            if why:
                problems.add(str(path), f"not read: {why}")
                return
            yield from _lines(f, path, problems)

    def _refusal(self, st: os.stat_result) -> str | None:
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid not in self.trusted_uids:
            return f"owned by uid {st.st_uid}, not a trusted uid"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"group/other-writable (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_size > MAX_FILE_BYTES:
            return f"{st.st_size} bytes, over {MAX_FILE_BYTES}"
        return None


def _lines(f: object, path: Path, problems: ScanProblems) -> Iterator[JobSummary]:
    """The summaries of an open file, read in chunks; over-long, damaged or newer lines are
    named (path:line) and skipped, and a last line without its newline is a cut write."""
    read = f.read  # type: ignore[attr-defined]
    buf = b""
    lineno = 0
    skipping = False  # inside an over-long line
    total = 0
    while True:
        chunk = read(READ_CHUNK_BYTES)
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_FILE_BYTES:
            problems.add(str(path), f"grew past {MAX_FILE_BYTES} bytes while read; rest skipped")
            return
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            lineno += 1
            if skipping:
                skipping = False
                continue
            yield from _one(line, path, lineno, problems)
        buf = buf[start:]
        if len(buf) > MAX_LINE_BYTES:
            if not skipping:
                problems.add(f"{path}:{lineno + 1}", f"line over {MAX_LINE_BYTES} bytes")
            skipping = True
            buf = b""
    if buf and not skipping:
        problems.add(f"{path}:{lineno + 1}", "last line has no end (a write cut short)")


def _one(line: bytes, path: Path, lineno: int, problems: ScanProblems) -> Iterator[JobSummary]:
    if not line.strip():
        return
    if len(line) > MAX_LINE_BYTES:
        problems.add(f"{path}:{lineno}", f"line over {MAX_LINE_BYTES} bytes")
        return
    try:
        yield summary_from_json_line(line)
    except SummaryFormatError as exc:
        problems.add(f"{path}:{lineno}", str(exc))


def latest(summaries: Iterable[JobSummary]) -> list[JobSummary]:
    """One summary per (job, node, start): the last one written (a node that restarted
    and wrote its job again, a drop collected twice)."""
    out: dict[tuple[int, str, float], JobSummary] = {}
    for s in summaries:
        out[(s.job_id, s.node, round(s.start_unix_s, 3))] = s
    return list(out.values())


def store_for(cfg: CodaConfig) -> SummaryStore:
    """The summary store coda.conf names (``JobSummaryDir`` and its retention keys)."""
    return SummaryStore(
        cfg.summary_dir,
        retention_days=cfg.job_summary_retention_days,
        max_bytes=cfg.job_summary_max_mib << 20,
    )
