"""The decision journal: one JSON line per submit-hook decision, for ``coda-slurm status``.

job_submit/coda appends what it decided for every GPU job (and every refusal or fail-open)
to ``DecisionJournal`` in coda.conf, so the controller can answer "what did coda do in the
last day" without slurmdbd.

Cost on the submit path: :meth:`DecisionJournal.record` appends one tuple of references to a
deque (thread-safe without a lock) and nothing else; encoding and writing happen on a flusher
thread that wakes every :data:`FLUSH_INTERVAL_S` and writes everything pending with one
``write(2)`` to an ``O_APPEND`` descriptor; :meth:`DecisionJournal.stop` (slurmctld shutting
down) writes the rest. A slurmctld crash therefore loses at most the last second of entries.
The file is not fsync'ed: a power loss may also lose what the kernel had not written back.

Rotation: when a flush would take the file past ``max_bytes`` (``JournalMaxBytes``), the
file is renamed to ``<path>.1`` (dropping the previous ``.1``) and a new file is started, so
at most about twice ``max_bytes`` is on disk. A file renamed or deleted by someone else
(logrotate) is noticed at the next flush and a new one is opened.

Errors (a missing directory, a full disk) never reach the job: the entries are dropped and
counted, and the first occurrence of each distinct error is logged once.

Line format, version :data:`JOURNAL_VERSION` (keys may be added, never renamed)::

    {"v": 1, "t": 1732240285.262, "job_id": null, "job": "train.sh", "uid": 1000,
     "sig": "workload:1000:resnet50", "profile": "workload:*:resnet50", "action": "lower",
     "would": null, "src": "global", "gpn": 2, "nodes": 1, "gpus": 2, "was": "cpg:10",
     "cpg": 6, "asked_cores": 20, "given_cores": 12, "hook_us": 41.3, "fail_open": false,
     "tok": "18a2f0c4e1b3d5a7"}

    t            unix time of the submission (seconds)
    job_id       the job id when job_desc carried one; null for sbatch/salloc/srun
                 submissions, whose id slurmctld assigns after job_submit returns
    job, uid     the job name (at most 128 characters) and the submitting user
    sig          workload signature (coda_common.signature); profile: the signature of the
                 profile that decided (src profile or global), else null
    action       the Decision's action (slurm_plugin.decision.decide.ACTIONS); null when the hook
                 failed before deciding; would: the action enforce would take (advise)
    src, gpn, nodes, was, cpg
                 as in the job's admin record (policy.py); gpus = gpn * nodes
    asked_cores  cores the user asked for (--cpus-per-gpu N: N * gpus; --cpus-per-task N:
                 N * tasks per node * nodes); null when the user asked for none
    given_cores  cores the job leaves the hook with: cpg * gpus when the hook wrote a value,
                 else asked_cores (null: Slurm's DefCpuPerGPU or its default applies)
    hook_us      time spent in job_submit (microseconds)
    fail_open    the job passed unchanged because the hook failed or ran over
                 HookBudgetMs; error then says why
    tok          the decision's token, which also ends the admin record written into the job
                 (``;tok=``); null when the hook wrote no record. slurmctld may still refuse
                 a submission after job_submit: the decisions it kept are the ones whose
                 token a job of Slurm's holds (:func:`reconcile`, ``coda-slurm status``)
    update       only on the re-decision of a pending job's cores after an update changed
                 its GPUs, tasks, nodes or partition (slurm_plugin.hook.modify): what
                 changed, in words; was_tok: the token of the record it replaced (the
                 submission's entry, which counts as kept while the job holds this one's)
                 Such entries are not counted as decisions (summarize_decisions: updates)
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import threading
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from coda_common.store.profiles import workload_of_signature
from slurm_plugin.decision.decide import (
    NO_VAL,
    Decision,
    JobRequest,
    job_tasks_per_node,
    parse_admin_record,
)

__all__ = [
    "FLUSH_INTERVAL_S",
    "JOURNAL_VERSION",
    "DecisionJournal",
    "JournalRead",
    "PendingEntry",
    "Reconciled",
    "format_token",
    "journal_entry",
    "pending_entry",
    "read_journal",
    "reconcile",
    "rotated_path",
    "summarize_decisions",
]

JOURNAL_VERSION = 1
FLUSH_INTERVAL_S = 1.0
"""Longest an entry waits in memory: what a slurmctld crash can lose."""
JOB_NAME_MAX_CHARS = 128
_WRITING = frozenset({"set", "default", "raise", "lower", "replace"})

LogFn = Callable[[str, str], None]
"""``log(level, message)``, level ``"error"`` or ``"info"`` (the hook's ``_log_named``)."""

PendingEntry = tuple[
    float,
    int,
    int,
    str | None,
    int,
    int,
    str | None,
    str | None,
    int,
    bool,
    str | None,
    int,
    str | None,
    str | None,
]
"""What the hook queues per decision, encoded later on the flusher thread: ``(t_unix_s,
job_id as in job_desc, uid, job_name, ntasks_per_node, num_tasks, action, admin_comment,
hook_ns, fail_open, error, token, update, was_tok)`` (token 0: none; update and was_tok
None but for a pending job's cores decided again after an update). Plain values only: holding the
JobRequest (and its script) or the Decision for a second would cost the submit path more
than the journal itself."""


class JobIdentity(Protocol):
    """What an entry names a job by: a :class:`JobRequest`, or the hook's plan of one."""

    @property
    def uid(self) -> int: ...
    @property
    def job_name(self) -> str | None: ...
    @property
    def ntasks_per_node(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...


def format_token(token: int) -> str:
    """A decision token as the admin record and the journal write it: 16 hex digits."""
    return f"{token:016x}"


def rotated_path(path: Path) -> Path:
    """Where the previous journal goes on rotation: ``<path>.1``."""
    return path.with_name(path.name + ".1")


def _int_field(fields: dict[str, str], key: str) -> int | None:
    value = fields.get(key, "")
    return int(value) if value.isdigit() else None


def pending_entry(
    t_unix_s: float,
    job_id: int,
    submit_uid: int,
    req: JobIdentity | None,
    decision: Decision | None,
    hook_ns: int,
    fail_open: bool,
    error: str | None = None,
    token: int = 0,
    update: str | None = None,
    was_tok: str | None = None,
) -> PendingEntry:
    """The :data:`PendingEntry` of one hook call; ``req`` is None when the hook failed before
    it read the job.  ``update``: what an update of the pending job changed, when this is
    the re-decision of its cores (``was_tok``: the token of the record it replaced)."""
    if req is None:
        req = JobRequest(uid=submit_uid)
    return (
        t_unix_s,
        job_id,
        req.uid,
        req.job_name,
        req.ntasks_per_node,
        req.num_tasks,
        None if decision is None else decision.action,
        None if decision is None else decision.admin_comment,
        hook_ns,
        fail_open,
        error,
        token,
        update,
        was_tok,
    )


def journal_entry(
    t_unix_s: float,
    job_id: int,
    uid: int,
    job_name: str | None,
    ntasks_per_node: int,
    num_tasks: int,
    action: str | None,
    admin_comment: str | None,
    hook_ns: int,
    fail_open: bool,
    error: str | None = None,
    token: int = 0,
    update: str | None = None,
    was_tok: str | None = None,
) -> dict[str, Any]:
    """The journal line (as a dict) of one :data:`PendingEntry`; pure (module docstring).

    ``job_id`` as job_desc holds it: NO_VAL (or 0) means Slurm has not assigned one yet.
    """
    entry = _bare_entry(t_unix_s, job_id, uid, job_name, action, hook_ns, fail_open, token)
    if error is not None:
        entry["error"] = error[:200]
    if update is not None:
        entry["update"] = update[:200]
        entry["was_tok"] = was_tok
    record: dict[str, str] = {}
    if admin_comment:
        with contextlib.suppress(ValueError):  # the hook wrote it: cannot be malformed
            record = parse_admin_record(admin_comment)
    if record:
        _add_record(entry, record, uid, ntasks_per_node, num_tasks, fail_open)
    return entry


def _bare_entry(
    t_unix_s: float,
    job_id: int,
    uid: int,
    job_name: str | None,
    action: str | None,
    hook_ns: int,
    fail_open: bool,
    token: int,
) -> dict[str, Any]:
    """Every key of a journal line, the admin record's fields still null; keys keep this
    order in the line."""
    return {
        "v": JOURNAL_VERSION,
        "t": round(t_unix_s, 3),
        "job_id": None if job_id in (NO_VAL, 0) else job_id,
        "job": None if job_name is None else job_name[:JOB_NAME_MAX_CHARS],
        "uid": uid,
        "sig": None,
        "profile": None,
        "action": action,
        "would": None,
        "src": None,
        "gpn": None,
        "nodes": None,
        "gpus": None,
        "was": None,
        "cpg": None,
        "asked_cores": None,
        "given_cores": None,
        "hook_us": round(hook_ns / 1000.0, 1),
        "fail_open": fail_open,
        "tok": format_token(token) if token else None,
    }


def _add_record(
    entry: dict[str, Any],
    record: dict[str, str],
    uid: int,
    ntasks_per_node: int,
    num_tasks: int,
    fail_open: bool,
) -> None:
    """Fill ``entry``'s record fields from the job's parsed admin record, in place."""
    sig = record["sig"]
    src = record["src"]
    gpn = _int_field(record, "gpn")
    nodes = _int_field(record, "nodes")
    gpus = gpn * nodes if gpn is not None and nodes is not None else None
    cpg = _int_field(record, "cpg")
    was = record["was"] or None
    profile = _profile_of(src, sig)
    asked = _asked_cores(was, gpus, nodes, uid, ntasks_per_node, num_tasks)
    applied = not fail_open and record["action"] in _WRITING
    given = cpg * gpus if applied and cpg is not None and gpus is not None else asked
    entry.update(
        sig=sig,
        profile=profile,
        would=record.get("would"),
        src=src,
        gpn=gpn,
        nodes=nodes,
        gpus=gpus,
        was=was,
        cpg=cpg,
        asked_cores=asked,
        given_cores=given,
    )


def _profile_of(src: str, sig: str) -> str | None:
    """The signature of the profile that decided: the job's own, its workload's global
    one, or the global one its text named (``prior:NAME``); None when no profile decided or
    the signature names no workload."""
    if src == "profile":
        return sig
    if src.startswith("prior:"):
        return f"workload:*:{src[len('prior:') :]}"
    if src == "global":
        name = workload_of_signature(sig)
        return f"workload:*:{name}" if name else None
    return None


def _asked_cores(
    was: str | None,
    gpus: int | None,
    nodes: int | None,
    uid: int,
    ntasks_per_node: int,
    num_tasks: int,
) -> int | None:
    """Cores the user asked for, from the record's ``was`` (``cpg:N`` or ``cpt:N``); None
    when the user asked for none or the job's size is unknown."""
    if was is None or gpus is None:
        return None
    kind, _, number = was.partition(":")
    if not number.isdigit():
        return None
    if kind == "cpg":
        return int(number) * gpus
    if kind == "cpt" and nodes is not None:
        tasks = JobRequest(uid=uid, ntasks_per_node=ntasks_per_node, num_tasks=num_tasks)
        return int(number) * job_tasks_per_node(tasks, nodes) * nodes
    return None


def _encode(item: PendingEntry) -> str:
    return json.dumps(journal_entry(*item), separators=(",", ":"))


class DecisionJournal:
    """Appends the hook's decisions to ``path`` (module docstring: format, cost, rotation).

    ``record()`` is the only method the submit path calls. ``start()`` runs the flusher
    thread; ``stop()`` ends it and writes what is pending. ``written``, ``dropped`` and
    ``error`` are read by the hook's stats file.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        log: LogFn,
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.log = log
        self.flush_interval_s = flush_interval_s
        self.written = 0
        self.dropped = 0
        self.error: str | None = None
        self._pending: deque[PendingEntry] = deque()
        self.record: Callable[[PendingEntry], None] = self._pending.append
        """Queue one :data:`PendingEntry`: the only call on the submit path (deque.append:
        atomic, no lock, no encoding)."""
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._size_bytes = 0
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the flusher -------------------------------------------------------------------

    def start(self) -> DecisionJournal:
        self._thread = threading.Thread(target=self._run, name="coda-journal", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the flusher thread, write what is pending, close the file."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._flush_guarded()
        with self._flush_lock:
            self._close()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self._flush_guarded()

    def _flush_guarded(self) -> None:
        try:
            self.flush()
        except Exception as exc:
            # Part of the hook's fail-open boundary (this thread runs inside slurmctld): a
            # bug costs the pending entries and one log line, never the thread.
            self._failed(f"{type(exc).__name__}: {exc}", 0)

    def flush(self) -> int:
        """Write every pending entry now; returns how many were written (0 on an error,
        which is logged once and counted in ``dropped``)."""
        with self._flush_lock:
            items: list[PendingEntry] = []
            with contextlib.suppress(IndexError):
                while True:
                    items.append(self._pending.popleft())
            if not items:
                return 0
            try:
                data = "".join(_encode(item) + "\n" for item in items).encode("utf-8")
            except (TypeError, ValueError) as exc:
                self._failed(f"cannot encode entries ({exc})", len(items))
                return 0
            try:
                self._append(data)
            except OSError as exc:
                self._close()  # reopen (and re-check the file) on the next flush
                self._failed(exc.strerror or str(exc), len(items))
                return 0
            self.written += len(items)
            if self.error is not None:
                self.error = None
                self.log("info", f"DecisionJournal {self.path}: writing again")
            return len(items)

    def _failed(self, why: str, n_items: int) -> None:
        self.dropped += n_items
        if why != self.error:  # once per distinct problem, not once a second
            self.error = why
            self.log(
                "error",
                f"cannot write DecisionJournal {self.path}: {why}; decisions are not "
                "journaled until this is fixed (jobs are not affected)",
            )

    def _append(self, data: bytes) -> None:
        self._open_current()
        if self._size_bytes > 0 and self._size_bytes + len(data) > self.max_bytes:
            self._close()
            os.replace(self.path, rotated_path(self.path))
            self._open_current()
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            self._size_bytes += n
            view = view[n:]

    def _open_current(self) -> None:
        if self._fd is not None:
            try:
                st = os.stat(self.path)
                same = (st.st_dev, st.st_ino) == self._ident
            except FileNotFoundError:
                same = False
            if same:
                return
            self._close()  # renamed or deleted under us (logrotate): start a new file
        # 0640: job names and uids, for root and slurmctld's group.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        st = os.fstat(fd)
        self._fd = fd
        self._ident = (st.st_dev, st.st_ino)
        self._size_bytes = st.st_size

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._ident = None


# -- reading it back (coda-slurm status) -----------------------------------------------


@dataclass(slots=True)
class JournalRead:
    """Entries of the journal (``<path>.1`` then ``<path>``) since a point in time."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    """The files that exist and were read, oldest first."""
    malformed: int = 0
    """Lines that are not a journal entry (skipped)."""
    newer_format: int = 0
    """Entries of a later format version (skipped: this coda-slurm is older than the hook)."""
    oldest_unix_s: float | None = None
    """The oldest entry in the files, in the window or not (how far back the journal reaches)."""
    unread_bytes: int = 0
    """Bytes at the start of files longer than ``max_file_bytes`` that were not read."""


def read_journal(
    path: Path, since_unix_s: float, *, max_file_bytes: int | None = None
) -> JournalRead:
    """Read the journal's entries with ``t >= since_unix_s``. Missing files are skipped
    (``files`` says which were there); other OSErrors are raised. A last line without its
    newline is being written and is left alone. Of a file longer than ``max_file_bytes``
    only its last ``max_file_bytes`` are read, from the first whole line on."""
    out = JournalRead()
    for p in (rotated_path(path), path):
        try:
            data = _journal_tail(p, max_file_bytes, out)
        except FileNotFoundError:
            continue
        out.files.append(p)
        lines = data.split(b"\n")
        for raw in lines[:-1]:  # the last piece is "" or a line still being written
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply
                out.malformed += 1
                continue
            t = entry.get("t") if isinstance(entry, dict) else None
            if not isinstance(t, int | float) or isinstance(t, bool) or math.isnan(t):
                out.malformed += 1
                continue
            version = entry.get("v")
            if not isinstance(version, int) or version < 1:
                out.malformed += 1
                continue
            if version > JOURNAL_VERSION:
                out.newer_format += 1
                continue
            if out.oldest_unix_s is None or t < out.oldest_unix_s:
                out.oldest_unix_s = float(t)
            if t >= since_unix_s:
                out.entries.append(entry)
    return out


def _journal_tail(path: Path, max_bytes: int | None, out: JournalRead) -> bytes:
    """The bytes of ``path``: its last ``max_bytes`` from the first whole line on when it is
    longer (what is left out is added to ``out.unread_bytes``). OSError for anything but a
    regular file (opened without blocking: a FIFO there must not hang the reader)."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        size = st.st_size
        if max_bytes is None or size <= max_bytes:
            return f.read()
        f.seek(size - max_bytes)
        data = f.read(max_bytes)
    cut = data.find(b"\n") + 1  # 0 when no line ends in the tail: nothing whole is left
    out.unread_bytes += size - max_bytes + (cut or len(data))
    return data[cut:] if cut else b""


@dataclass(slots=True)
class Reconciled:
    """Journal entries against the jobs Slurm holds (:func:`reconcile`)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    """What counts: every entry but those of refused submissions."""
    kept: int = 0
    """Entries whose token one of Slurm's jobs holds."""
    refused: int = 0
    """Entries of submissions slurmctld refused after the hook (left out of ``entries``)."""
    unchecked: int = 0
    """Entries with a token Slurm could not tell about: decided too recently, or so long ago
    that an ended job is no longer in slurmctld (counted, as kept ones are)."""


def reconcile(
    entries: Iterable[dict[str, Any]],
    slurm_tokens: Collection[str] | None,
    *,
    queried_unix_s: float,
    min_job_age_s: float,
    settle_s: float,
) -> Reconciled:
    """Which decisions Slurm kept; pure.

    ``slurm_tokens``: the tokens of the records in the admin comments of every job
    slurmctld held at ``queried_unix_s`` (None: Slurm was not asked).  An entry whose
    ``tok`` is among them is kept.  One that is not was refused when its job, had Slurm kept
    it, would have been there: its submission had returned (decided at least ``settle_s``
    before the query) and had not ended ``min_job_age_s`` (Slurm's MinJobAge) before it
    (a job ends after it is submitted, so one decided less than MinJobAge before the query is
    still held).  Otherwise it is unchecked, and counted.  Entries without a token (the hook
    failed open, refused a directive itself, or wrote no record) are counted as they are.
    """
    out = Reconciled()
    entries = list(entries)
    if slurm_tokens is not None:
        # A record an update's re-decision replaced is held through the one replacing it.
        held = set(slurm_tokens)
        for e in reversed(entries):
            was = e.get("was_tok")
            if isinstance(was, str) and e.get("tok") in held:
                held.add(was)
        slurm_tokens = held
    for e in entries:
        token = e.get("tok")
        if not isinstance(token, str):
            out.entries.append(e)
            continue
        age_s = queried_unix_s - float(e["t"])
        if slurm_tokens is not None and token in slurm_tokens:
            out.kept += 1
        elif slurm_tokens is not None and settle_s <= age_s < min_job_age_s:
            out.refused += 1
            continue
        else:
            out.unchecked += 1
        out.entries.append(e)
    return out


def _num(entry: dict[str, Any], key: str) -> int | None:
    value = entry.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _per_gpu(cores: int, gpus: int) -> float | None:
    return round(cores / gpus, 2) if gpus else None


@dataclass(slots=True)
class _JobsCores:
    """Jobs counted and the cores summed over them."""

    jobs: int = 0
    cores: int = 0

    def add(self, cores: int) -> None:
        self.jobs += 1
        self.cores += cores

    def to_json(self) -> dict[str, int]:
        return {"jobs": self.jobs, "cores": self.cores}


@dataclass(slots=True)
class _DecisionSums:
    """The running sums of :func:`summarize_decisions`, one journal entry at a time."""

    decisions: int = 0
    updates: int = 0
    """Pending jobs' cores decided again after an update (not counted in ``decisions``)."""
    first_unix_s: float | None = None
    last_unix_s: float | None = None
    by_action: dict[str, dict[str, int]] = field(default_factory=dict)
    by_src: Counter[str] = field(default_factory=Counter)
    would: Counter[str] = field(default_factory=Counter)
    profiles_used: Counter[str] = field(default_factory=Counter)
    asked_jobs: int = 0
    asked_gpus: int = 0
    asked_cores: int = 0
    given_cores: int = 0
    returned: _JobsCores = field(default_factory=_JobsCores)
    added: _JobsCores = field(default_factory=_JobsCores)
    advise_returned: _JobsCores = field(default_factory=_JobsCores)
    advise_added: _JobsCores = field(default_factory=_JobsCores)
    none_jobs: int = 0
    none_given_jobs: int = 0
    none_gpus: int = 0
    none_given_cores: int = 0
    fail_open: int = 0
    last_error: str | None = None
    last_error_unix_s: float | None = None
    hook_us: list[float] = field(default_factory=list)

    def add(self, e: dict[str, Any]) -> None:
        if e.get("update") is not None:
            self.updates += 1
            return
        self.decisions += 1
        t = float(e["t"])
        self.first_unix_s = t if self.first_unix_s is None else min(self.first_unix_s, t)
        self.last_unix_s = t if self.last_unix_s is None else max(self.last_unix_s, t)
        us = e.get("hook_us")
        if isinstance(us, int | float) and not isinstance(us, bool):
            self.hook_us.append(float(us))
        if e.get("fail_open"):
            self.fail_open += 1
            if self.last_error_unix_s is None or t >= self.last_error_unix_s:
                self.last_error_unix_s = t
                self.last_error = e.get("error") or None
            return
        action = e.get("action")
        if isinstance(action, str):
            self._add_decision(e, action)

    def _add_decision(self, e: dict[str, Any], action: str) -> None:
        gpus = _num(e, "gpus") or 0
        slot = self.by_action.setdefault(action, {"jobs": 0, "gpus": 0})
        slot["jobs"] += 1
        slot["gpus"] += gpus
        src = e.get("src")
        if isinstance(src, str):
            self.by_src[src] += 1
        if isinstance(e.get("would"), str):
            self.would[e["would"]] += 1
        if isinstance(e.get("profile"), str):
            self.profiles_used[e["profile"]] += 1
        asked = _num(e, "asked_cores")
        given = _num(e, "given_cores")
        if asked is not None and gpus:
            self._add_asked(e, action, gpus, asked, given)
        elif asked is None and action not in ("reject",):
            self.none_jobs += 1
            if given is not None and gpus:
                self.none_given_jobs += 1
                self.none_gpus += gpus
                self.none_given_cores += given

    def _add_asked(
        self, e: dict[str, Any], action: str, gpus: int, asked: int, given: int | None
    ) -> None:
        """A job whose user asked for ``asked`` cores."""
        self.asked_jobs += 1
        self.asked_gpus += gpus
        self.asked_cores += asked
        self.given_cores += given if given is not None else asked
        if given is not None and given < asked:
            self.returned.add(asked - given)
        elif given is not None and given > asked:
            self.added.add(given - asked)
        cpg = _num(e, "cpg")
        would_write = e.get("would") in ("raise", "lower", "replace")
        if action == "advise" and cpg is not None and would_write:
            would_give = cpg * gpus
            if would_give < asked:
                self.advise_returned.add(asked - would_give)
            elif would_give > asked:
                self.advise_added.add(would_give - asked)

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.hook_us)
        return {
            "decisions": self.decisions,
            "updates": self.updates,
            "first_unix_s": self.first_unix_s,
            "last_unix_s": self.last_unix_s,
            "by_action": dict(sorted(self.by_action.items())),
            "by_src": dict(sorted(self.by_src.items())),
            "would": dict(sorted(self.would.items())),
            "profiles_used": dict(sorted(self.profiles_used.items())),
            "asked_vs_given": {
                "jobs": self.asked_jobs,
                "gpus": self.asked_gpus,
                "asked_cores": self.asked_cores,
                "given_cores": self.given_cores,
                "asked_cores_per_gpu": _per_gpu(self.asked_cores, self.asked_gpus),
                "given_cores_per_gpu": _per_gpu(self.given_cores, self.asked_gpus),
            },
            "returned": self.returned.to_json(),
            "added": self.added.to_json(),
            "no_user_value": {
                "jobs": self.none_jobs,
                "given_jobs": self.none_given_jobs,
                "gpus": self.none_gpus,
                "given_cores": self.none_given_cores,
                "given_cores_per_gpu": _per_gpu(self.none_given_cores, self.none_gpus),
            },
            "advise_would_return": self.advise_returned.to_json(),
            "advise_would_add": self.advise_added.to_json(),
            "fail_open": {
                "jobs": self.fail_open,
                "last_error": self.last_error,
                "last_unix_s": self.last_error_unix_s,
            },
            "hook_us": {
                "p50": _percentile(ordered, 0.50),
                "p99": _percentile(ordered, 0.99),
                "max": ordered[-1] if ordered else None,
            },
        }


def summarize_decisions(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the hook did over ``entries`` (journal dicts), JSON-ready; pure.

    - ``by_action``: jobs and GPUs per action, fail-opens excluded (counted in ``fail_open``);
      ``by_src``: jobs per profile source; ``would``: advise entries per enforce action.
    - ``asked_vs_given``: jobs whose user asked for a core count: total cores asked and
      given, and per GPU (total cores / total GPUs).
    - ``returned``: cores given back, sum of (asked - given) over jobs that got fewer than
      they asked (lower, replace); ``added``: sum of (given - asked) over jobs that got more
      (replace or raise lifting a starving job). The two are never netted.
    - ``no_user_value``: jobs that asked for nothing: how many got a value from coda (set,
      default) and how many cores; the others keep Slurm's default.
    - ``advise_would_return`` / ``advise_would_add``: the same sums for Mode=advise entries.
    """
    sums = _DecisionSums()
    for e in entries:
        sums.add(e)
    return sums.to_json()
