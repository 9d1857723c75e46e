"""Slurm's view of the jobs on this node: user, CPUs, GPUs and the submit hook's record.

The daemon finds jobs in the cgroup tree (local, free) and asks slurmctld about each job
once, when it first appears (``scontrol -d -o show job <id>``: one RPC per job per node,
not one per tick), so a thousand nodes ticking every few seconds put no load on the
controller. Where Slurm keeps no cgroups (``proctrack/linuxproc``) the job ids come from
``squeue -w <node>`` instead.

GPUs: ``scontrol -d`` prints each node's GRES with Slurm's device indices
(``GRES=gpu:a100:2(IDX:0-1)``). An index counts the node's GPU ``File=`` entries in
gres.conf order; coda-node maps it to the device node ``/dev/nvidiaN`` and from there, by
the device's **minor number**, to NVML's device (NVML's index order is PCI order and need
not match; see :meth:`coda_node.nvml.Nvml.minor_to_index`).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coda_node.cpulist import parse_cpulist
from coda_node.paths import SystemRoot
from slurm_plugin.conf import expand_hostlist, split_outside
from slurm_plugin.policy import parse_admin_record

SCONTROL_TIMEOUT_S = 10.0

# States in which a job can hold processes on a node.
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
                text=True,
                timeout=SCONTROL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmQueryError(f"{argv[0]} failed ({exc})") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmQueryError(
                f"{' '.join(argv)} exited {proc.returncode}" + (f" ({why[-1]})" if why else "")
            )
        return proc.stdout

    return run


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
    user: str
    uid: int
    state: str
    partition: str
    cpu_ids: frozenset[int]
    """CPUs Slurm allocated to the job on this node (``CPU_IDs``; abstract ids, equal to
    the kernel's on nodes without hyper-threads or with Slurm's default numbering)."""
    gres: tuple[SlurmGres, ...]
    admin_record: Mapping[str, str] | None
    """The submit hook's ``coda:sig=...`` record, None when the hook did not see the job."""
    cpus_per_tres: str | None
    num_nodes: int = 1

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(i for g in self.gres if g.name == "gpu" for i in g.indices)

    @property
    def is_dnn(self) -> bool:
        """A GPU job: the kind CODA right-sizes and shields (everything else is a CPU job)."""
        return bool(self.gpu_indices) or any(g.name == "gpu" and g.count for g in self.gres)


_GRES_ITEM = re.compile(r"([^:,()]+)(?::([^:,()]+))?(?::(\d+))?(?:\(IDX:([0-9,\-]*)\))?")


def parse_gres(text: str) -> tuple[SlurmGres, ...]:
    """``gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3)`` (the per-node ``GRES=`` of ``scontrol -d``)."""
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


_NODE_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S+) Mem=\S+(?: GRES=(\S*))?")


def parse_job_line(line: str, node_name: str) -> SlurmJob | None:
    """One line of ``scontrol -d -o show job``; None when the job holds nothing on
    ``node_name``."""
    fields = dict(_fields(line))
    try:
        job_id = int(fields["JobId"])
    except (KeyError, ValueError):
        raise SlurmQueryError(f"no JobId in scontrol output: {line[:80]!r}") from None
    cpu_ids: frozenset[int] | None = None
    gres: tuple[SlurmGres, ...] = ()
    for m in _NODE_DETAIL.finditer(line):
        try:
            nodes = expand_hostlist(m.group(1))
        except ValueError as exc:
            raise SlurmQueryError(f"job {job_id}: {exc}") from None
        if node_name in nodes:
            cpu_ids = parse_cpulist(m.group(2))
            gres = parse_gres(m.group(3) or "")
            break
    if cpu_ids is None:
        return None
    user, uid = _user(fields.get("UserId", ""))
    record = None
    comment = fields.get("AdminComment", "")
    if "coda:sig=" in comment:
        try:
            record = parse_admin_record(comment)
        except ValueError:
            record = None  # someone else's text after ours; the job is still shown
    cpt = fields.get("CpusPerTres")
    return SlurmJob(
        job_id=job_id,
        name=fields.get("JobName", ""),
        user=user,
        uid=uid,
        state=fields.get("JobState", "UNKNOWN"),
        partition=fields.get("Partition", ""),
        cpu_ids=cpu_ids,
        gres=gres,
        admin_record=record,
        cpus_per_tres=cpt if cpt and cpt != "(null)" else None,
        num_nodes=_leading_int(fields.get("NumNodes", ""), 1),
    )


def _leading_int(value: str, default: int) -> int:
    """``2`` from ``2`` or ``2-4`` (a pending job's range); ``default`` when there is none."""
    m = re.match(r"\d+", value)
    return int(m.group()) if m else default


def _fields(line: str) -> list[tuple[str, str]]:
    # Values never contain blanks in -o output except Comment/AdminComment/Command, which
    # hold free text; keep everything up to the next " Key=" for those.
    out = []
    for m in re.finditer(r"(?:^|\s)([A-Za-z_/:]+)=(.*?)(?=\s[A-Za-z_/:]+=|\s*$)", line):
        out.append((m.group(1), m.group(2)))
    return out


def _user(value: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*)\((\d+)\)", value)
    if m is None:
        return value, -1
    return m.group(1), int(m.group(2))


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
        import time

        self.node_name = node_name
        self._run = runner
        self._refresh_s = refresh_s
        self._clock = clock or time.monotonic
        self._cache: dict[int, tuple[float, SlurmJob]] = {}
        self.last_error: str | None = None

    def on_node(self) -> set[int]:
        """Job ids squeue places on this node (used where Slurm keeps no cgroups)."""
        out = self._run(["squeue", "-h", "-w", self.node_name, "-t", "R,S,CG", "-o", "%A"])
        return {int(x) for x in out.split() if x.isdigit()}

    def get(self, job_ids: set[int]) -> dict[int, SlurmJob]:
        """Slurm's record of each of ``job_ids`` that is active on this node. A job Slurm
        no longer knows, or one that failed to load, is left out (``last_error`` says
        why) and asked again next time."""
        now = self._clock()
        for gone in set(self._cache) - job_ids:
            del self._cache[gone]
        out: dict[int, SlurmJob] = {}
        self.last_error = None
        for job_id in sorted(job_ids):
            cached = self._cache.get(job_id)
            if cached is None or now - cached[0] >= self._refresh_s:
                if self.last_error is not None:
                    # slurmctld failed once this tick: do not wait out a time-out per job;
                    # a record due for refresh is still served, the rest next tick.
                    if cached is not None:
                        out[job_id] = cached[1]
                    continue
                try:
                    job = self._query(job_id)
                except SlurmQueryError as exc:
                    self.last_error = str(exc)
                    if cached is not None:
                        out[job_id] = cached[1]
                    continue
                if job is None or job.state not in ACTIVE_STATES:
                    # Not (yet) running here as far as slurmctld knows: a job whose cgroup
                    # exists before its record says RUNNING is asked again next tick.
                    continue
                self._cache[job_id] = (now, job)
                cached = self._cache[job_id]
            out[job_id] = cached[1]
        return out

    def _query(self, job_id: int) -> SlurmJob | None:
        try:
            text = self._run(["scontrol", "-d", "-o", "show", "job", str(job_id)])
        except SlurmQueryError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        for line in text.splitlines():
            if line.startswith("JobId="):
                job = parse_job_line(line, self.node_name)
                if job is not None and job.job_id == job_id:
                    return job
        return None


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
