"""Slurm's view of the jobs on this node: user, CPUs, GPUs and the submit hook's record.

The daemon finds jobs in the cgroup tree (local, free) and asks slurmctld about the jobs it
has not seen yet, all of them in one ``squeue --json --jobs=<ids>`` per tick (one RPC per job
start, not one per tick), so a thousand nodes ticking every few seconds put no load on the
controller. Where Slurm keeps no cgroups (``proctrack/linuxproc``) the job ids come from
``squeue -w <node>`` instead.

**Structured records only.** ``scontrol -o show job`` prints free text unquoted: a job name
or ``--comment`` holding `` AdminComment=...``, `` UserId=0(root)``, a newline and
``Nodes=... CPU_IDs=...`` reads as those fields. Slurm's JSON keeps every field in its own
string, so nothing a user typed can pose as another field. The shapes differ between
releases (22.05's ``openapi/v0.0.38`` against the ``data_parser`` of 23.02 and later:
counts as plain integers or as ``{"set", "infinite", "number"}``, ``job_state`` a string or
a list, ``job_resources`` keyed by socket and core or listing them); the readers below take
each. 22.05's ``squeue --json`` ignores ``--jobs`` and prints every job; later releases
filter. Output that is not UTF-8 (a job name may hold any byte) is read with replacement
characters.

**Whose record.** The hook writes its record (``coda:sig=<key>;...``) into the job's
``AdminComment``, which only the hook and Slurm operators can set. The daemon profiles a
job and publishes what it learns under the record's key only when that key is a key of the
job's owner (``workload:<uid>:``, ``script:<uid>:``, ``name:<uid>:`` with the job's real
``user_id``): a record naming a shared key (``workload:*:``) or another user's is refused,
logged, and the job is shown but not profiled.

CPUs: Slurm allocates cores; ``job_resources`` names each by socket and core index on the
node, and :func:`cpus_on_node` numbers them as ``scontrol -d`` prints ``CPU_IDs``:
``(socket x cores per socket + core) x threads per core + thread``, with the node's shape
from Slurm's own node record (``scontrol show node --json``; ``sinfo --json`` on 22.05).
These are Slurm's abstract ids, equal to the kernel's on nodes without hyper-threads or
where the kernel numbers a core's threads next to each other.

GPUs: ``gres_detail`` gives each node's GRES with Slurm's device indices
(``gpu:a100:2(IDX:0-1)``). An index counts the node's GPU ``File=`` entries in gres.conf
order; coda-node maps it to the device node ``/dev/nvidiaN`` and from there, by the
device's **minor number**, to NVML's device (NVML's index order is PCI order and need not
match; see :meth:`coda_node.nvml.Nvml.minor_to_index`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coda_node.cpulist import parse_cpulist
from coda_node.paths import SystemRoot
from slurm_plugin.conf import expand_hostlist, split_outside
from slurm_plugin.policy import ADMIN_PREFIX, parse_admin_record

log = logging.getLogger(__name__)

SCONTROL_TIMEOUT_S = 10.0

# States in which a job can hold processes on a node (a base state, or the COMPLETING /
# CONFIGURING flag that later releases list beside it).
ACTIVE_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"})


class SlurmQueryError(RuntimeError):
    """A Slurm command failed or printed something we cannot read; says which and why."""


Runner = Callable[[Sequence[str]], str]
"""Runs a Slurm client command and returns its stdout; raises SlurmQueryError."""


def make_runner(env: Mapping[str, str] | None = None) -> Runner:
    """A runner for the real Slurm commands (``SLURM_CONF`` from ``env``)."""

    def run(argv: Sequence[str]) -> str:
        try:
            proc = subprocess.run(
                list(argv),
                env=dict(env) if env is not None else None,
                capture_output=True,
                timeout=SCONTROL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmQueryError(f"{argv[0]} failed ({exc})") from None
        # A job name or comment may hold any byte: never fail on what a user typed.
        stdout = proc.stdout.decode("utf-8", errors="replace")
        if proc.returncode != 0:
            stderr = proc.stderr.decode("utf-8", errors="replace")
            lines = [s for s in (stderr or stdout).strip().splitlines() if s.strip()]
            # Slurm's clients end with the cause, or with "Try ... --help" after it.
            causes = [s for s in lines if not s.startswith("Try ")] or lines
            why = causes[-1] if causes else ""
            raise SlurmQueryError(
                f"{' '.join(argv)} exited {proc.returncode}" + (f" ({why})" if why else "")
            )
        return stdout

    return run


# -- Slurm's JSON, every supported release ---------------------------------------------


def _number(value: object, what: str) -> int | None:
    """A count as Slurm's JSON gives it: a plain integer (22.05) or ``{"set": .., "infinite":
    .., "number": ..}`` (23.02 and later); None when unset or infinite."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlurmQueryError(f"{what}: expected a number, got {value!r}")
    return value


def _text(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmQueryError(f"{what}: expected a string, got {type(value).__name__}")
    return value


def _names(value: object, what: str) -> tuple[str, ...]:
    """``"RUNNING"`` (22.05) or ``["RUNNING", "COMPLETING"]`` (later: the base state, then
    its flags)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SlurmQueryError(f"{what}: expected a string or a list of strings, got {value!r}")


def _entries(value: object, what: str) -> list[tuple[int, Any]]:
    """(index, item) of ``{"0": item, ...}`` (22.05) or ``[{"index": 0, ...}, ...]`` (later)."""
    out: list[tuple[int, Any]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise SlurmQueryError(f"{what}: index {key!r} is not a number")
            out.append((int(key), item))
    elif isinstance(value, list):
        for item in value:
            index = _number(item.get("index") if isinstance(item, Mapping) else None, what)
            if index is None:
                raise SlurmQueryError(f"{what}: an entry without an index: {item!r}")
            out.append((index, item))
    elif value is not None:
        raise SlurmQueryError(f"{what}: expected a list or an object, got {value!r}")
    return out


def _document(text: str, argv: Sequence[str]) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmQueryError(f"{' '.join(argv)} printed no JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise SlurmQueryError(f"{' '.join(argv)} printed JSON that is not an object")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        why = (
            first.get("description") or first.get("error") if isinstance(first, Mapping) else first
        )
        raise SlurmQueryError(f"{' '.join(argv)} reported an error ({why})")
    return doc


def query_jobs(runner: Runner, job_ids: Iterable[int]) -> dict[int, Mapping[str, Any]]:
    """Slurm's JSON record of each of ``job_ids`` it knows, in one ``squeue`` call (22.05
    answers with every job; only the ones asked for are kept)."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    argv = ["squeue", "--json", "--all", "--jobs=" + ",".join(map(str, sorted(wanted)))]
    try:
        text = runner(argv)
    except SlurmQueryError as exc:
        if "Invalid job id" in str(exc):
            return {}  # a single id Slurm no longer knows (or never did)
        raise
    jobs = _document(text, argv).get("jobs")
    if not isinstance(jobs, list):
        raise SlurmQueryError(f"{' '.join(argv)} printed no job list")
    out: dict[int, Mapping[str, Any]] = {}
    for record in jobs:
        if not isinstance(record, Mapping):
            raise SlurmQueryError(f"{' '.join(argv)}: a job record that is not an object")
        job_id = _number(record.get("job_id"), "job_id")
        if job_id is None or job_id not in wanted:
            continue
        if job_id in out:
            raise SlurmQueryError(f"{' '.join(argv)}: two records for job {job_id}")
        out[job_id] = record
    return out


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """How Slurm numbers a node's CPUs (its node record: ``CoresPerSocket``,
    ``ThreadsPerCore``)."""

    name: str
    cores_per_socket: int
    threads_per_core: int


NODE_JSON_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("scontrol", "show", "node", "{node}", "--json"),  # 23.02 and later: this node only
    ("sinfo", "--json"),  # 22.05: scontrol has no --json; sinfo prints every node
)


def parse_node_layout(text: str, node_name: str, argv: Sequence[str] = ("node",)) -> NodeLayout:
    """``node_name``'s layout from ``scontrol show node --json`` or 22.05's ``sinfo --json``."""
    nodes = _document(text, argv).get("nodes")
    if not isinstance(nodes, list):
        raise SlurmQueryError(f"{' '.join(argv)} printed no node list")
    for node in nodes:
        if isinstance(node, Mapping) and node.get("name") == node_name:
            cores = _number(node.get("cores"), f"node {node_name} cores")
            threads = _number(node.get("threads"), f"node {node_name} threads")
            if not cores or not threads or cores < 1 or threads < 1:
                raise SlurmQueryError(
                    f"node {node_name}: Slurm gives {cores} cores per socket and {threads} "
                    "threads per core"
                )
            return NodeLayout(node_name, cores, threads)
    raise SlurmQueryError(f"Slurm has no node named {node_name!r} ({' '.join(argv)})")


def query_node_layout(runner: Runner, node_name: str) -> tuple[NodeLayout, int]:
    """``node_name``'s layout and which of :data:`NODE_JSON_COMMANDS` gave it."""
    errors: list[str] = []
    for n, template in enumerate(NODE_JSON_COMMANDS):
        argv = [a.format(node=node_name) for a in template]
        try:
            return parse_node_layout(runner(argv), node_name, argv), n
        except SlurmQueryError as exc:
            errors.append(str(exc))
    raise SlurmQueryError("; ".join(errors))


def query_active_jobs(runner: Runner) -> list[Mapping[str, Any]]:
    """Slurm's JSON record of every job it holds (pending, running and the other states
    ``squeue`` shows by default), in every partition, in one ``squeue`` call."""
    argv = ["squeue", "--json", "--all"]
    jobs = _document(runner(argv), argv).get("jobs")
    if not isinstance(jobs, list) or not all(isinstance(j, Mapping) for j in jobs):
        raise SlurmQueryError(f"{' '.join(argv)} printed no list of job records")
    return jobs


def job_states(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The job's base state, then its flags (``("RUNNING",)``, ``("PENDING", ...)``)."""
    return _names(record.get("job_state"), "job_state")


def job_text(record: Mapping[str, Any], key: str) -> str:
    """A text field of a job record (``""`` when unset); SlurmQueryError if not text."""
    return _text(record.get(key), key)


def allocated_nodes(record: Mapping[str, Any]) -> dict[str, tuple[int, frozenset[tuple[int, int]]]]:
    """Node name -> (the node's position in the job, the (socket, core) pairs allocated
    there), for every node the job holds cores on; empty when it holds nothing (yet)."""
    res = record.get("job_resources")
    names: set[str] = set()
    if isinstance(res, Mapping):
        if "allocated_nodes" in res:
            names = {
                n.get("nodename") for n in res["allocated_nodes"] or [] if isinstance(n, Mapping)
            }
        elif isinstance(res.get("nodes"), Mapping):
            names = {
                n.get("name")
                for _, n in _entries(
                    res["nodes"].get("allocation"), "job_resources.nodes.allocation"
                )
                if isinstance(n, Mapping)
            }
    out = {}
    for name in sorted(n for n in names if isinstance(n, str)):
        found = allocated_cores(record, name)
        if found is not None and found[1]:
            out[name] = found
    return out


def gpus_on_node(record: Mapping[str, Any], position: int) -> int:
    """GPUs the job holds on the node at ``position`` of its allocation (``gres_detail``)."""
    details = record.get("gres_detail") or []
    if not isinstance(details, list):
        raise SlurmQueryError("gres_detail is not a list")
    if position >= len(details):
        return 0
    gres = parse_gres(_text(details[position], "gres_detail"))
    return sum(g.count for g in gres if g.name == "gpu")


def allocated_cores(
    record: Mapping[str, Any], node_name: str
) -> tuple[int, frozenset[tuple[int, int]]] | None:
    """(the node's position in the job, the (socket, core) pairs allocated there), from
    ``job_resources``; None when the job holds nothing on ``node_name`` (or nothing yet)."""
    res = record.get("job_resources")
    if not res:
        return None
    if not isinstance(res, Mapping):
        raise SlurmQueryError(f"job_resources is not an object: {res!r}")
    nodes = res.get("nodes")
    if "allocated_nodes" in res:  # 22.05: [{"nodename", "sockets": {"0": {"cores": ...}}}]
        entries = list(enumerate(res["allocated_nodes"] or []))
        name_key = "nodename"
    elif isinstance(nodes, Mapping):  # later: {"allocation": [{"index", "name", ...}]}
        entries = _entries(nodes.get("allocation"), "job_resources.nodes.allocation")
        name_key = "name"
    else:
        raise SlurmQueryError(f"job_resources of a shape not known here: {sorted(res)}")
    for position, node in entries:
        if not isinstance(node, Mapping) or node.get(name_key) != node_name:
            continue
        cores: set[tuple[int, int]] = set()
        for socket, sock in _entries(node.get("sockets"), f"{node_name} sockets"):
            core_map = sock.get("cores") if isinstance(sock, Mapping) else None
            for core, status in _entries(core_map, f"{node_name} socket {socket} cores"):
                if isinstance(status, Mapping):
                    status = status.get("status")
                # 22.05: "allocated" / "allocated_and_in_use"; later: ["ALLOCATED", ...]
                names = _names(status, f"{node_name} core {socket}:{core} status")
                if any(s.upper().startswith("ALLOCATED") for s in names):
                    cores.add((socket, core))
        return position, frozenset(cores)
    return None


def cpus_on_node(
    record: Mapping[str, Any], node_name: str, layout: NodeLayout
) -> frozenset[int] | None:
    """The CPUs of a job record on ``node_name``, numbered as ``scontrol -d`` prints
    ``CPU_IDs``; None when the job holds nothing there."""
    found = allocated_cores(record, node_name)
    return None if found is None else _cpu_ids(found[1], layout)


def _cpu_ids(cores: frozenset[tuple[int, int]], layout: NodeLayout) -> frozenset[int]:
    # Slurm's job_info.c: core bit (socket x cores per socket + core), each expanded to
    # its node's threads per core.
    cps, tpc = layout.cores_per_socket, layout.threads_per_core
    cpus: set[int] = set()
    for socket, core in cores:
        if core >= cps:
            raise SlurmQueryError(
                f"core {core} of socket {socket} on {layout.name}, which has {cps} per socket"
            )
        first = (socket * cps + core) * tpc
        cpus.update(range(first, first + tpc))
    return frozenset(cpus)


def allocated_cpus(
    runner: Runner, node_name: str, job_ids: Iterable[int]
) -> dict[int, frozenset[int]]:
    """The CPUs Slurm allocated on ``node_name`` to each of ``job_ids`` (the ids ``scontrol
    -d show job`` prints as ``CPU_IDs``), asked of slurmctld now: one ``squeue`` call for
    all of them and one for the node's layout, nothing cached. A job Slurm does not know,
    or that holds nothing on the node, is left out. Raises SlurmQueryError when Slurm
    cannot be asked or answers with something unreadable."""
    found = _cores_on_node(query_jobs(runner, job_ids), node_name)
    if not found:
        return {}
    return _allocations(found, query_node_layout(runner, node_name)[0])


def _cores_on_node(
    records: Mapping[int, Mapping[str, Any]], node_name: str
) -> dict[int, frozenset[tuple[int, int]]]:
    out = {}
    for job_id, record in records.items():
        found = allocated_cores(record, node_name)
        if found is not None and found[1]:
            out[job_id] = found[1]
    return out


def _allocations(
    cores: Mapping[int, frozenset[tuple[int, int]]], layout: NodeLayout
) -> dict[int, frozenset[int]]:
    return {job_id: _cpu_ids(c, layout) for job_id, c in cores.items()}


# -- the daemon's view of a job ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmGres:
    """One GRES entry of a job on a node: ``gpu:a100:2(IDX:0-1)``."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...]


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


_GRES_ITEM = re.compile(r"([^:,()]+)(?::([^:,()]+))?(?::(\d+))?(?:\(IDX:([0-9,\-]*)\))?")


def parse_gres(text: str) -> tuple[SlurmGres, ...]:
    """``gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3)`` (a node's entry of ``gres_detail``)."""
    out: list[SlurmGres] = []
    # Commas also separate indices inside (IDX:0,2); split only outside parentheses.
    try:
        items = split_outside(text, "(", ")", what="GRES")
    except ValueError as exc:
        raise SlurmQueryError(str(exc)) from None
    for item in filter(None, (s.strip() for s in items)):
        m = _GRES_ITEM.fullmatch(item)
        if m is None:
            raise SlurmQueryError(f"cannot read GRES {item!r}")
        name, second, count, idx = m.groups()
        gtype = second
        if count is None and second is not None and second.isdigit():
            gtype, count = None, second
        indices = tuple(sorted(parse_cpulist(idx))) if idx else ()
        out.append(SlurmGres(name, gtype, int(count) if count else len(indices), indices))
    return tuple(out)


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


def parse_job(record: Mapping[str, Any], node_name: str, layout: NodeLayout) -> SlurmJob | None:
    """One job record of ``squeue --json``; None when the job holds nothing on
    ``node_name``."""
    job_id = _number(record.get("job_id"), "job_id")
    if job_id is None:
        raise SlurmQueryError("a job record without a job_id")
    where = f"job {job_id}"
    found = allocated_cores(record, node_name)
    if found is None:
        return None
    position, cores = found
    cpu_ids = _cpu_ids(cores, layout)
    details = record.get("gres_detail") or []
    if not isinstance(details, list):
        raise SlurmQueryError(f"{where}: gres_detail is not a list")
    gres = (
        parse_gres(_text(details[position], f"{where} gres_detail"))
        if position < len(details)
        else ()
    )
    uid = _number(record.get("user_id"), f"{where} user_id")
    if uid is None:
        raise SlurmQueryError(f"{where}: no user_id")
    states = _names(record.get("job_state"), f"{where} job_state")
    admin_record, problem = hook_record(
        _text(record.get("admin_comment"), f"{where} admin_comment"), uid
    )
    cpt = _text(record.get("cpus_per_tres"), f"{where} cpus_per_tres")
    return SlurmJob(
        job_id=job_id,
        name=_text(record.get("name"), f"{where} name"),
        user=_text(record.get("user_name"), f"{where} user_name") or str(uid),
        uid=uid,
        state=states[0] if states else "UNKNOWN",
        partition=_text(record.get("partition"), f"{where} partition"),
        cpu_ids=cpu_ids,
        gres=gres,
        admin_record=admin_record,
        cpus_per_tres=cpt or None,
        num_nodes=_number(record.get("node_count"), f"{where} node_count") or 1,
        states=frozenset(states),
        record_problem=problem,
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

    def on_node(self) -> set[int]:
        """Job ids squeue places on this node (used where Slurm keeps no cgroups). ``%A``
        prints the job id alone, one per line: there is no free text to mistake for it."""
        out = self._run(["squeue", "-h", "-w", self.node_name, "-t", "R,S,CG", "-o", "%A"])
        ids: set[int] = set()
        for line in out.split():
            if not line.isdigit():
                raise SlurmQueryError(f"squeue printed {line[:40]!r} where a job id belongs")
            ids.add(int(line))
        return ids

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
        found = _cores_on_node(query_jobs(self._run, job_ids), self.node_name)
        return _allocations(found, self.layout()) if found else {}

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
