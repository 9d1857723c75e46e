"""Slurm's JSON records of jobs and nodes (``squeue --json``, ``scontrol show node --json``)
and the runner of Slurm's client commands: the one reader both sides use, the node daemon
(:mod:`coda_node.system.slurmjobs`) and ``coda-slurm reserve``
(:mod:`slurm_plugin.reserve.cluster`).

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

CPUs: Slurm allocates cores; ``job_resources`` names each by socket and core index on the
node, and :func:`cpus_on_node` numbers them as ``scontrol -d`` prints ``CPU_IDs``:
``(socket x cores per socket + core) x threads per core + thread``, with the node's shape
from Slurm's own node record (``scontrol show node --json``; ``sinfo --json`` on 22.05).
These are Slurm's abstract ids, equal to the kernel's on nodes without hyper-threads or
where the kernel numbers a core's threads next to each other.

GPUs: ``gres_detail`` gives each node's GRES with Slurm's device indices
(``gpu:a100:2(IDX:0-1)``), read by :func:`parse_gres`.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coda_common.slurm.hostlist import split_outside
from coda_common.slurm.ranges import parse_ranges

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


def json_number(value: object, what: str) -> int | None:
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


def json_text(value: object, what: str) -> str:
    """A text field (``""`` when unset); SlurmQueryError when it is not text."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmQueryError(f"{what}: expected a string, got {type(value).__name__}")
    return value


def json_names(value: object, what: str) -> tuple[str, ...]:
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
            index = json_number(item.get("index") if isinstance(item, Mapping) else None, what)
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
        job_id = json_number(record.get("job_id"), "job_id")
        if job_id is None or job_id not in wanted:
            continue
        if job_id in out:
            raise SlurmQueryError(f"{' '.join(argv)}: two records for job {job_id}")
        out[job_id] = record
    return out


def query_node_jobs(runner: Runner, node_name: str) -> list[Mapping[str, Any]]:
    """Slurm's JSON record of every job ``squeue`` places on ``node_name`` (22.05, which
    ignores the filter, answers with every job), in one call."""
    argv = ["squeue", "--json", "--all", f"--nodelist={node_name}"]
    jobs = _document(runner(argv), argv).get("jobs")
    if not isinstance(jobs, list):
        raise SlurmQueryError(f"{' '.join(argv)} printed no job list")
    if not all(isinstance(record, Mapping) for record in jobs):
        raise SlurmQueryError(f"{' '.join(argv)}: a job record that is not an object")
    return jobs


def job_sluid(record: Mapping[str, Any]) -> str | None:
    """The job's SLUID (Slurm 26.05 and later), None before 26.05 or when unset.

    ``data_parser/v0.0.45`` (26.05) puts it in the job's ``step_id`` object beside the job
    id (``PARSER_ARRAY(SLURM_STEP_ID)``: ``"sluid"``, ``"job_id"``, ...; squeue(1) field
    ``Sluid``: "remains constant during the lifetime of the job"); an unset one dumps as
    ``""`` or null.
    """
    step_id = record.get("step_id")
    if not isinstance(step_id, Mapping):
        return None
    return json_text(step_id.get("sluid"), "step_id sluid") or None


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
            cores = json_number(node.get("cores"), f"node {node_name} cores")
            threads = json_number(node.get("threads"), f"node {node_name} threads")
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
    return json_names(record.get("job_state"), "job_state")


def job_text(record: Mapping[str, Any], key: str) -> str:
    """A text field of a job record (``""`` when unset); SlurmQueryError if not text."""
    return json_text(record.get(key), key)


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
    gres = parse_gres(json_text(details[position], "gres_detail"))
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
                names = json_names(status, f"{node_name} core {socket}:{core} status")
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
    return None if found is None else cpu_ids_of_cores(found[1], layout)


def cpu_ids_of_cores(cores: frozenset[tuple[int, int]], layout: NodeLayout) -> frozenset[int]:
    """The CPU ids (as ``CPU_IDs``) of (socket, core) pairs on a node of ``layout``."""
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
    found = cores_on_node(query_jobs(runner, job_ids), node_name)
    if not found:
        return {}
    return cpu_ids_by_job(found, query_node_layout(runner, node_name)[0])


def cores_on_node(
    records: Mapping[int, Mapping[str, Any]], node_name: str
) -> dict[int, frozenset[tuple[int, int]]]:
    """Job id -> the (socket, core) pairs each of ``records`` holds on ``node_name``; a job
    holding nothing there is left out."""
    out = {}
    for job_id, record in records.items():
        found = allocated_cores(record, node_name)
        if found is not None and found[1]:
            out[job_id] = found[1]
    return out


def cpu_ids_by_job(
    cores: Mapping[int, frozenset[tuple[int, int]]], layout: NodeLayout
) -> dict[int, frozenset[int]]:
    """Job id -> its CPU ids, from each job's (socket, core) pairs on a node of ``layout``."""
    return {job_id: cpu_ids_of_cores(c, layout) for job_id, c in cores.items()}


# -- GRES: a node's entry of gres_detail ------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmGres:
    """One GRES entry of a job on a node: ``gpu:a100:2(IDX:0-1)``."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...]


_GRES_ITEM = re.compile(
    r"([^:,()]+)(?::([^:,()]+))?(?::(\d+))?(?:\((?:IDX:([0-9,\-]*)|CNT:(\d+))\))?"
)


def parse_gres(text: str) -> tuple[SlurmGres, ...]:
    """``gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3),membw(CNT:60)`` (a node's entry of
    ``gres_detail``; a GRES without device files, e.g. a count-only one, shows its count
    as ``(CNT:N)``)."""
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
        name, second, count, idx, cnt = m.groups()
        gtype = second
        if count is None and second is not None and second.isdigit():
            gtype, count = None, second
        count = count or cnt
        indices = _gres_indices(idx) if idx else ()
        out.append(SlurmGres(name, gtype, int(count) if count else len(indices), indices))
    return tuple(out)


def _gres_indices(text: str) -> tuple[int, ...]:
    """``"0-1,3"`` (a GRES entry's ``IDX:``) -> (0, 1, 3); ValueError on anything else."""
    return tuple(sorted(parse_ranges(text, "GRES index list")))
