"""The cores of a pending job an update changed, decided again inside slurmctld.

``job_modify`` runs under slurmctld's job write lock and sees only the update message
(``job_record_t`` is slurmctld-internal), so it only notices an update that calls for a new
decision (:func:`slurm_plugin.decision.redecide.update_triggers`) and queues the job id
here.  :class:`ModifyWorker`'s thread, holding none of slurmctld's locks, then reads the job
through libslurm's public API (``slurm_load_job``, which waits for the job read lock and so
for the update that queued it to finish), decides its cores again
(:func:`~slurm_plugin.decision.redecide.redecide`) and writes them back with
``slurm_update_job`` as SlurmUser.  That update comes back through ``job_modify`` carrying
cores, so it queues nothing.

Bounded: at most :data:`MAX_QUEUED` jobs wait (one entry per job); a job queued again while
waiting is read once.  Failures are logged and leave the job as Slurm has it.  The thread is
a daemon thread: ``scontrol reconfigure`` (which from 23.11 execs a new slurmctld) or a
shutdown never waits for it beyond :meth:`ModifyWorker.stop`'s short join, and jobs still
queued then keep the cores they have.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from slurm_plugin.decision.redecide import NO_VAL, PendingJob, Redecision

__all__ = ["MAX_QUEUED", "ModifyWorker", "load_job", "update_job"]

MAX_QUEUED = 1024
"""Jobs waiting for a re-decision, at most; more are logged and left as Slurm has them."""
STOP_JOIN_S = 1.0
"""How long :meth:`ModifyWorker.stop` waits for the thread (slurmctld shutting down)."""

JOB_STATE_BASE = 0xFF
JOB_PENDING = 0


def _text(ffi: Any, ptr: Any) -> str | None:
    # Job fields are bytes from users' clients; keep undecodable bytes.
    return None if ptr == ffi.NULL else ffi.string(ptr).decode("utf-8", "surrogateescape")


def load_job(ffi: Any, lib: Any, job_id: int) -> PendingJob | str:
    """Job ``job_id`` as slurmctld holds it, or why it cannot be read (Slurm's words)."""
    out = ffi.new("job_info_msg_t **")
    rc = lib.coda_job_load(job_id, out)
    if rc != 0:
        return f"cannot read the job: {ffi.string(lib.coda_strerror(rc)).decode()}"
    msg = out[0]
    try:
        if msg == ffi.NULL or msg.record_count != 1:
            return "the job id names no single job"
        j = msg.job_array[0]
        return PendingJob(
            job_id=job_id,
            uid=j.user_id,
            pending=(j.job_state & JOB_STATE_BASE) == JOB_PENDING,
            in_array=j.array_job_id != 0 or j.het_job_id != 0,
            name=_text(ffi, j.name),
            partition=_text(ffi, j.partition),
            admin_comment=_text(ffi, j.admin_comment),
            comment=_text(ffi, j.comment),
            cpus_per_tres=_text(ffi, j.cpus_per_tres),
            tres_per_node=_text(ffi, j.tres_per_node),
            tres_per_job=_text(ffi, j.tres_per_job),
            tres_per_task=_text(ffi, j.tres_per_task),
            tres_per_socket=_text(ffi, j.tres_per_socket),
            num_nodes=j.num_nodes,
            num_tasks=j.num_tasks,
            ntasks_per_node=j.ntasks_per_node,
            cpus_per_task=j.cpus_per_task,
        )
    finally:
        lib.coda_job_free(msg)


def update_job(ffi: Any, lib: Any, job_id: int, redecision: Redecision) -> str | None:
    """Write ``redecision`` into job ``job_id``; None, or Slurm's words for why not."""
    rc = lib.coda_job_update(
        job_id,
        redecision.cpus_per_tres.encode("utf-8", "surrogateescape"),
        redecision.admin_comment.encode("utf-8", "surrogateescape"),
        NO_VAL if redecision.min_cpus is None else redecision.min_cpus,
    )
    return None if rc == 0 else ffi.string(lib.coda_strerror(rc)).decode()


class ModifyWorker:
    """The queue of jobs whose cores are decided again, and the thread that does it.

    ``work(job_id)`` does one job (read, decide, write, journal, log) and must not raise
    for a job's sake; ``log(level, message)`` is the hook's.  The thread starts with the
    first job queued.
    """

    def __init__(
        self,
        work: Callable[[int], None],
        log: Callable[[str, str], None],
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self._work = work
        self._log = log
        self._max = max_queued
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dropped = 0
        self.done = 0

    def notice(self, job_id: int) -> bool:
        """Queue ``job_id`` (called under slurmctld's job write lock: no I/O, no wait);
        False when it was not queued (stopping, or the queue is full)."""
        with self._cond:
            if self._stopping:
                return False
            if job_id in self._queued:
                return True
            if len(self._queue) >= self._max:
                self.dropped += 1
                return False
            self._queue.append(job_id)
            self._queued.add(job_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="coda-modify", daemon=True)
                self._thread.start()
            self._cond.notify()
        return True

    def _next(self) -> int | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            job_id = self._queue.popleft()
            self._queued.discard(job_id)
            return job_id

    def _run(self) -> None:
        while True:
            job_id = self._next()
            if job_id is None:
                return
            try:
                self._work(job_id)
            except Exception as exc:  # the thread outlives any one job
                self._log("error", f"job {job_id}: {type(exc).__name__}: {exc}; job left as is")
            self.done += 1

    def stop(self, timeout_s: float = STOP_JOIN_S) -> None:
        """Stop taking jobs and let the thread end (waits at most ``timeout_s``)."""
        with self._cond:
            self._stopping = True
            left = len(self._queue)
            self._queue.clear()
            self._queued.clear()
            self._cond.notify_all()
        if left:
            self._log("info", f"{left} updated job(s) not decided again (stopping)")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
