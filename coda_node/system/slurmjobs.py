"""Slurm's view of the jobs on this node: user, CPUs, GPUs and the submit hook's record.

The daemon finds jobs in the cgroup tree (local, free) and asks slurmctld about the jobs it
has not seen yet, all of them in one ``squeue --json --jobs=<ids>`` per tick (one RPC per job
start, not one per tick), so a thousand nodes ticking every few seconds put no load on the
controller. Where Slurm keeps no cgroups (``proctrack/linuxproc``) the job ids come from
``squeue -w <node>`` instead. Slurm's JSON records, of every supported release, are read by
:mod:`coda_common.slurm.slurmjson` (structured records only: nothing a user typed can pose as
another field); this module turns them into the daemon's :class:`SlurmJob`.

**Which job a cgroup is.** Slurm 26.05 names a job's cgroup v2 directory by the job's SLUID,
which holds no job id (see :mod:`coda_node.system.cgroups`). :meth:`SlurmJobs.job_ids_of_dirs`
maps it to the job id from Slurm's own record (``squeue --json --nodelist=<node>``, one call
when a directory of an unknown SLUID appears), never from anything a job's processes can
change (their environment names ``SLURM_JOB_ID`` too, but the job's user can rewrite it).

**Whose record.** The hook writes its record (``coda:sig=<key>;...``) into the job's
``AdminComment``, which only the hook and Slurm operators can set. The daemon profiles a
job and publishes what it learns under the record's key only when that key is a key of the
job's owner (``workload:<uid>:``, ``script:<uid>:``, ``name:<uid>:`` with the job's real
``user_id``): a record naming a shared key (``workload:*:``) or another user's is refused,
logged, and the job is shown but not profiled.

CPUs: numbered as ``scontrol -d`` prints ``CPU_IDs``
(:func:`coda_common.slurm.slurmjson.cpus_on_node`):
Slurm's abstract ids, equal to the kernel's on nodes without hyper-threads or where the
kernel numbers a core's threads next to each other.

GPUs: ``gres_detail`` gives each node's GRES with Slurm's device indices
(``gpu:a100:2(IDX:0-1)``). An index counts the node's GPU ``File=`` entries in gres.conf
order; coda-node maps it to the device node ``/dev/nvidiaN`` and from there, by the
device's **minor number**, to NVML's device (NVML's index order is PCI order and need not
match; see :meth:`coda_node.system.nvml.Nvml.minor_to_index`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coda_common.slurm.adminrecord import ADMIN_PREFIX, parse_admin_record
from coda_common.slurm.hostlist import expand_hostlist
from coda_common.slurm.slurmjson import (
    ACTIVE_STATES,
    NODE_JSON_COMMANDS,
    NodeLayout,
    Runner,
    SlurmGres,
    SlurmQueryError,
    allocated_cores,
    allocated_cpus,
    cores_on_node,
    cpu_ids_by_job,
    cpu_ids_of_cores,
    job_sluid,
    json_names,
    json_number,
    json_text,
    make_runner,
    parse_gres,
    parse_node_layout,
    query_jobs,
    query_node_jobs,
    query_node_layout,
)
from coda_node.system.paths import SystemRoot

__all__ = [
    "ACTIVE_STATES",
    "GresDevice",
    "NodeLayout",
    "Runner",
    "SlurmGres",
    "SlurmJob",
    "SlurmJobs",
    "SlurmQueryError",
    "allocated_cpus",
    "gres_gpu_devices",
    "hook_record",
    "make_runner",
    "parse_gres",
    "parse_job",
    "parse_node_layout",
    "query_jobs",
    "record_token",
]

log = logging.getLogger(__name__)

SLUID_RETRY_S = 60.0
"""How soon a SLUID Slurm's record did not name is asked about again: slurmctld knows a
job's SLUID from its submission, so one it does not name is no job of this node's now."""


# -- the daemon's view of a job ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: int
    name: str
    """The job's name as the user gave it: for people to read, never to decide on."""
    user: str
    uid: int
    state: str
    """Slurm's base state (``RUNNING``, ...)."""
    partition: str
    cpu_ids: frozenset[int]
    """CPUs Slurm allocated to the job on this node (numbered as ``CPU_IDs``; abstract ids,
    equal to the kernel's on nodes without hyper-threads or with Slurm's default
    numbering)."""
    gres: tuple[SlurmGres, ...]
    admin_record: Mapping[str, str] | None
    """The submit hook's ``coda:sig=...`` record when its key is one of the job owner's;
    None when the hook did not see the job or the record was refused (``record_problem``)."""
    cpus_per_tres: str | None
    num_nodes: int = 1
    states: frozenset[str] = frozenset()
    """The base state and its flags (``COMPLETING``, ...)."""
    record_problem: str | None = None
    """Why an ``AdminComment`` record was not taken as the hook's, if one was refused."""
    record_text: str | None = None
    """The hook's record as it stands in ``AdminComment`` (``coda:sig=...``, one token),
    where :attr:`admin_record` was taken from it."""
    account: str | None = None
    """Slurm's account of the job (as an admin or the user named it: text for people, never
    decided on)."""

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(i for g in self.gres if g.name == "gpu" for i in g.indices)

    @property
    def is_dnn(self) -> bool:
        """A GPU job: the kind CODA right-sizes and shields (everything else is a CPU job)."""
        return bool(self.gpu_indices) or any(g.name == "gpu" and g.count for g in self.gres)

    @property
    def active(self) -> bool:
        """In a state in which it can hold processes on a node."""
        return bool((self.states or {self.state}) & ACTIVE_STATES)


_OWNER_KEY = re.compile(r"(?:workload|script|name):([0-9]+):[^\s:*]+")


def hook_record(admin_comment: str, uid: int) -> tuple[dict[str, str] | None, str | None]:
    """(the submit hook's record, None) from a job's ``AdminComment`` when its key belongs
    to ``uid``; (None, why) when there is a record that is not taken; (None, None) when
    there is none.

    The hook appends its record to whatever the comment held, so the last one is the
    hook's. Only the hook and Slurm operators can write ``AdminComment``; the owner check
    still keeps a copied or hand-made record from putting a job's measurements under a
    shared key (``workload:*:``) or another user's.
    """
    start = admin_comment.rfind(ADMIN_PREFIX)
    if start < 0:
        return None, None
    try:
        record = parse_admin_record(admin_comment[start:])
    except ValueError as exc:
        return None, f"unreadable coda record in AdminComment ({exc})"
    key = record["sig"]
    m = _OWNER_KEY.fullmatch(key)
    if m is None or m.group(1) != str(uid):
        return None, f"coda record names {key!r}, not a key of the job's owner (uid {uid})"
    return record, None


def record_token(admin_comment: str) -> str | None:
    """The hook's record in ``admin_comment`` as it stands there: from its last
    ``coda:sig=`` to the next blank (what :func:`hook_record` parses)."""
    start = admin_comment.rfind(ADMIN_PREFIX)
    if start < 0:
        return None
    token = admin_comment[start:].split(None, 1)
    return token[0] if token else None


def parse_job(record: Mapping[str, Any], node_name: str, layout: NodeLayout) -> SlurmJob | None:
    """One job record of ``squeue --json``; None when the job holds nothing on
    ``node_name``."""
    job_id = json_number(record.get("job_id"), "job_id")
    if job_id is None:
        raise SlurmQueryError("a job record without a job_id")
    where = f"job {job_id}"
    found = allocated_cores(record, node_name)
    if found is None:
        return None
    position, cores = found
    cpu_ids = cpu_ids_of_cores(cores, layout)
    details = record.get("gres_detail") or []
    if not isinstance(details, list):
        raise SlurmQueryError(f"{where}: gres_detail is not a list")
    gres = (
        parse_gres(json_text(details[position], f"{where} gres_detail"))
        if position < len(details)
        else ()
    )
    uid = json_number(record.get("user_id"), f"{where} user_id")
    if uid is None:
        raise SlurmQueryError(f"{where}: no user_id")
    states = json_names(record.get("job_state"), f"{where} job_state")
    comment = json_text(record.get("admin_comment"), f"{where} admin_comment")
    admin_record, problem = hook_record(comment, uid)
    cpt = json_text(record.get("cpus_per_tres"), f"{where} cpus_per_tres")
    return SlurmJob(
        job_id=job_id,
        name=json_text(record.get("name"), f"{where} name"),
        user=json_text(record.get("user_name"), f"{where} user_name") or str(uid),
        uid=uid,
        state=states[0] if states else "UNKNOWN",
        partition=json_text(record.get("partition"), f"{where} partition"),
        cpu_ids=cpu_ids,
        gres=gres,
        admin_record=admin_record,
        cpus_per_tres=cpt or None,
        num_nodes=json_number(record.get("node_count"), f"{where} node_count") or 1,
        states=frozenset(states),
        record_problem=problem,
        record_text=record_token(comment) if admin_record is not None else None,
        account=json_text(record.get("account"), f"{where} account") or None,
    )


class SlurmJobs:
    """Slurm's record of each job on this node, fetched once per job and kept while the
    job runs (``refresh_s`` re-reads it, to see ``scontrol update``)."""

    def __init__(
        self,
        node_name: str,
        runner: Runner,
        *,
        refresh_s: float = 300.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.node_name = node_name
        self._run = runner
        self._refresh_s = refresh_s
        self._clock = clock or time.monotonic
        self._cache: dict[int, tuple[float, SlurmJob]] = {}
        self._layout: tuple[float, NodeLayout] | None = None
        self._node_command: int | None = None
        self.last_error: str | None = None
        self._sluids: dict[str, int] = {}
        """SLUID -> job id from Slurm's record; a SLUID is never reused (sluid.h)."""
        self._sluid_asked: dict[str, float] = {}
        """When each SLUID Slurm's record did not name was last asked about."""
        self.sluid_error: str | None = None
        """Why the last question about SLUIDs went unanswered, None when it was."""

    def on_node(self, states: str = "R,S,CG") -> set[int]:
        """Job ids squeue places on this node in ``states`` (used where Slurm keeps no
        cgroups, and to tell a node whose jobs coda-node cannot see from an idle one).
        ``%A`` prints the job id alone, one per line: there is no free text to mistake
        for it."""
        out = self._run(["squeue", "-h", "-w", self.node_name, "-t", states, "-o", "%A"])
        ids: set[int] = set()
        for line in out.split():
            if not line.isdigit():
                raise SlurmQueryError(f"squeue printed {line[:40]!r} where a job id belongs")
            ids.add(int(line))
        return ids

    def job_ids_of_dirs(self, sluids: Collection[str]) -> dict[str, int]:
        """The job id of each of ``sluids`` (the names of SLUID-named job cgroups here)
        that Slurm's record of this node's jobs names.

        Asks ``squeue`` only when one of them is new, or when one it did not name was
        last asked about ``SLUID_RETRY_S`` ago; an answer is kept while its directory
        stays (at stop the daemon puts jobs back from what it knows, without asking).
        A failed question leaves the unknown ones out and says why in ``sluid_error``.
        """
        present = set(sluids)
        for gone in set(self._sluids) - present:
            del self._sluids[gone]
        for gone in set(self._sluid_asked) - present:
            del self._sluid_asked[gone]
        now = self._clock()
        due = [
            n
            for n in sorted(present)
            if n not in self._sluids
            and (n not in self._sluid_asked or now - self._sluid_asked[n] >= SLUID_RETRY_S)
        ]
        if due:
            try:
                records = query_node_jobs(self._run, self.node_name)
                named = {}
                for record in records:
                    sluid = job_sluid(record)
                    job_id = json_number(record.get("job_id"), "job_id")
                    if sluid is not None and job_id is not None:
                        named[sluid] = job_id
            except SlurmQueryError as exc:
                self.sluid_error = f"cannot ask Slurm which jobs {', '.join(due)} are: {exc}"
            else:
                self.sluid_error = None
                for name in present:
                    if name in named:
                        self._sluids[name] = named[name]
                        self._sluid_asked.pop(name, None)
            for name in due:
                if name not in self._sluids:
                    self._sluid_asked[name] = now
        return {n: self._sluids[n] for n in sorted(present) if n in self._sluids}

    def layout(self) -> NodeLayout:
        """This node's layout in Slurm, read once and again after ``refresh_s``."""
        now = self._clock()
        if self._layout is not None and now - self._layout[0] < self._refresh_s:
            return self._layout[1]
        if self._node_command is not None:
            template = NODE_JSON_COMMANDS[self._node_command]
            argv = [a.format(node=self.node_name) for a in template]
            layout = parse_node_layout(self._run(argv), self.node_name, argv)
        else:
            layout, self._node_command = query_node_layout(self._run, self.node_name)
        self._layout = (now, layout)
        return layout

    def allocated_cpus(self, job_ids: Iterable[int]) -> dict[int, frozenset[int]]:
        """:func:`allocated_cpus` on this node, asked now (one ``squeue`` call; the node's
        layout may come from this object's cache)."""
        found = cores_on_node(query_jobs(self._run, job_ids), self.node_name)
        return cpu_ids_by_job(found, self.layout()) if found else {}

    def get(self, job_ids: set[int]) -> dict[int, SlurmJob]:
        """Slurm's record of each of ``job_ids`` that is active on this node. A job Slurm
        no longer knows, or one that failed to load, is left out (``last_error`` says
        why) and asked again next time."""
        now = self._clock()
        for gone in set(self._cache) - job_ids:
            del self._cache[gone]
        self.last_error = None
        due = sorted(
            j for j in job_ids if j not in self._cache or now - self._cache[j][0] >= self._refresh_s
        )
        records: dict[int, Mapping[str, Any]] = {}
        layout: NodeLayout | None = None
        if due:
            try:
                # One call for every job due: slurmctld failing costs one time-out per tick,
                # not one per job; a record due for refresh is still served meanwhile.
                records = query_jobs(self._run, due)
                layout = self.layout() if records else None
            except SlurmQueryError as exc:
                self.last_error = str(exc)
                due = []
            for job_id in due:
                record = records.get(job_id)
                try:
                    job = parse_job(record, self.node_name, layout) if record and layout else None
                except SlurmQueryError as exc:
                    self.last_error = f"job {job_id}: {exc}"
                    continue
                except (ValueError, TypeError, LookupError) as exc:
                    # A shape no reader above checks (a range that runs backwards, a number
                    # where a list belongs): this job's record alone is left out.
                    self.last_error = f"job {job_id}: Slurm's record does not read ({exc})"
                    continue
                if job is None or not job.active:
                    # Not (yet) running here as far as slurmctld knows: a job whose cgroup
                    # exists before its record says RUNNING is asked again next tick.
                    self._cache.pop(job_id, None)
                    continue
                if job.record_problem is not None:
                    log.warning(
                        "job=%d %s: shown, not profiled, nothing published for it",
                        job_id,
                        job.record_problem,
                    )
                self._cache[job_id] = (now, job)
        return {j: self._cache[j][1] for j in sorted(job_ids) if j in self._cache}


# -- GPUs: Slurm index -> device node -> minor number ----------------------------------


@dataclass(frozen=True, slots=True)
class GresDevice:
    index: int
    """Slurm's index of the device on this node (``IDX:`` in ``scontrol -d``)."""
    file: str
    minor: int | None
    """Minor number of the character device; None when the file is not one."""


def gres_gpu_devices(gres_conf: Path, node_name: str, root: SystemRoot) -> list[GresDevice]:
    """This node's GPU device files in Slurm's index order, from gres.conf ``File=``.

    Lines for other nodes are skipped; a line without ``NodeName`` applies to every node.
    With ``AutoDetect=nvml`` and no ``File=``, Slurm numbers GPUs in ``/dev/nvidiaN``
    order, so the device nodes present are used sorted by minor number.
    """
    files: list[str] = []
    autodetect = False
    try:
        text = gres_conf.read_text()
    except OSError:
        text = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kv = {k.lower(): v for k, _, v in (t.partition("=") for t in line.split())}
        if "autodetect" in kv and kv["autodetect"].lower() == "nvml":
            autodetect = True
        if kv.get("name") != "gpu" or "file" not in kv:
            continue
        nodes = kv.get("nodename")
        if nodes is not None:
            try:
                if node_name not in expand_hostlist(nodes):
                    continue
            except ValueError:
                continue
        try:
            files += expand_hostlist(kv["file"])
        except ValueError:
            continue
    if not files and autodetect:
        devs = [p for p in root.dev.glob("nvidia[0-9]*") if p.name[6:].isdigit()]
        files = [f"/dev/{p.name}" for p in sorted(devs, key=lambda p: int(p.name[6:]))]
    out = []
    for index, file in enumerate(files):
        out.append(GresDevice(index, file, _char_minor(root.path(file))))
    return out


def _char_minor(path: Path) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.minor(st.st_rdev) if stat.S_ISCHR(st.st_mode) else None
