"""A whole GPU node for the daemon: cgroups, /proc, /dev/nvidia*, Slurm configs, scontrol, NVML.

:func:`build_node` lays out, under one fixture root, everything
:class:`coda_node.daemon.service.Daemon`
reads on a node like Slurm 22.05 sets it up (``proctrack/cgroup``, ``task/cgroup,task/affinity``,
``jobacct_gather/cgroup``), and gives the doubles it talks to:

- ``<tmp>/root``: ``/proc/self/mounts``; Slurm's job cgroups (v1, or v2 with
  ``gpu01_slurmstepd.scope``, CPUs on each job's and each step's ``user/`` level, the cpu
  controller enabled down to every job) with steps ``extern``, ``batch`` and ``0`` (two
  tasks); the jobs' threads in ``/proc``; ``/dev/nvidia0..N`` as real character devices (major 195);
- ``<tmp>/etc``: ``slurm.conf``, ``gres.conf`` and ``coda.conf`` (read with
  :func:`coda_common.config.codaconf.load_config`); ``<tmp>/state``: the daemon's state directory;
- :class:`FakeSlurm`: answers ``squeue --json``, ``squeue -w`` and ``sinfo --json`` like
  Slurm 22.05 does, and counts the calls;
- a :class:`~tests.node.nvml_double.FakeNvml` whose NVML index order (PCI order) is not the order
  of the device minors, as on real multi-GPU nodes;
- cgroup writers that go through :class:`~tests.node.cgroup_fixtures.FakeKernel` (v1 cpuset
  nesting, pid moves, controller files on mkdir) and a journal of every byte written.

Half the jobs are GPU jobs (``dnn``), half CPU jobs, alternating from the first job id. A
GPU job has 3 CPUs per CPU job's 1 (64 CPUs fit 32 jobs exactly), taken from a pool that
alternates the two halves of the node (``0,32,1,33,...``) so cpulists look like Slurm's
(``0-1,32``). Every fourth GPU job holds two GPUs, the others one; with more GPU jobs than
GPUs the GPUs are shared (the daemon does not check GRES exclusivity, so this only adds
load). Thread ids start above PID_MAX_LIMIT (4194304), so no id names a real thread even if
a writer without the fake affinity hooks reached sched_setaffinity(2).

gres.conf says ``File=/dev/nvidia[0-N]``, the path a production node has: NodeRoot re-roots
it like every other system path (:func:`coda_node.system.slurmjobs.gres_gpu_devices`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from coda_common.config.codaconf import CodaConfig, load_config
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import STATE_FILE, VIEW_FILE, Limit, save_limits
from coda_node.system.cgroups import (
    CgroupLayout,
    CpuQuotaWriter,
    CpusetWriter,
    format_cpulist,
    parse_cpulist,
)
from coda_node.system.nvml import Nvml
from coda_node.system.slurmjobs import SlurmQueryError
from tests.node.cgroup_fixtures import (
    CGROUP,
    MOUNTS_V1_DEBIAN,
    MOUNTS_V1_SPLIT,
    MOUNTS_V2,
    V2_SCOPE,
    CgroupFixture,
    proc_thread,
    put,
    v1_cpu,
    v1_cpuset,
    v2_dir,
)
from tests.node.nvml_double import GIB, FakeGpu, FakeNvml

NODE_NAME = "gpu01"
V2_JOB_SUBTREE = "cpuset cpu memory pids"
"""The controllers Slurm's scope enables for each job, and each job for its steps (v2)."""
# The NVIDIA driver's character-device major (Documentation/admin-guide/devices.txt: 195).
NVIDIA_MAJOR = 195
GPU_TYPE = "a100"
# NVML index (PCI bus order) -> /dev/nvidiaN minor. The driver numbers minors in its probe
# order, which need not be PCI order; this permutation moves every GPU.
NVML_MINORS = (2, 3, 0, 1, 6, 7, 4, 5)
# A DGX A100's GPU bus ids, in NVML (PCI) order.
PCI_BUS_IDS = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
FIRST_JOB_ID = 5001
TID_BASE = 4_200_000  # > PID_MAX_LIMIT (4194304): never a live thread
TIDS_PER_JOB = 16
USERS = (("alice", 1001), ("bob", 1002), ("carol", 1003), ("dave", 1004))
DNN_NAMES = ("resnet50", "bert-large", "llama-ft", "vit-b16")
CPU_NAMES = ("etl", "bwa-mem", "gromacs-prep", "pandas-agg")
JOB_USAGE_NS = 10_000_000_000  # job i starts with (i + 1) x this much CPU time

Kind = Literal["dnn", "cpu"]


def mknod_reason() -> str | None:
    """None when this process can make the character devices, else why not."""
    if os.geteuid() != 0:
        return "makes /dev/nvidia* character devices with mknod(2), which needs root"
    return None


# --------------------------------------------------------------------------------------------
# Jobs and their Slurm records


@dataclass
class FakeJob:
    """One job as Slurm placed it: its CPUs, GPUs (Slurm's GRES indices) and threads."""

    job_id: int
    index: int
    """Position on the node (0 = first job); fixes its thread ids and starting CPU time."""
    kind: Kind
    user: str
    uid: int
    name: str
    cpus: frozenset[int]
    gpus: tuple[int, ...]
    admin_comment: str | None
    task_cpus: tuple[frozenset[int], ...]
    """CPUs of step 0's tasks (task/affinity splits the allocation between them)."""
    later_steps: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Steps started after the job (:meth:`FakeNode.start_step`): step -> its threads."""
    account: str = ""
    """Slurm's account of the job (empty: none)."""
    num_nodes: int = 1
    """Nodes the job runs on (Slurm's ``node_count``); this node is one of them."""

    @property
    def partition(self) -> str:
        return "gpu" if self.kind == "dnn" else "cpu"

    def tid(self, k: int) -> int:
        return TID_BASE + self.index * TIDS_PER_JOB + k

    # Thread ids: 0 extern's sleep, 1-2 the batch script's two threads, 3 step 0's
    # slurmstepd, 4+2t and 5+2t task t's two threads; v2 adds the slurmstepds of extern
    # (12) and batch (13), which v1 keeps outside the job's cgroups.
    @property
    def v1_threads(self) -> dict[str, tuple[int, ...]]:
        """Directory (relative to the job's) -> thread ids in its ``tasks`` file."""
        out = {
            "step_extern": (self.tid(0),),
            "step_batch": (self.tid(1), self.tid(2)),
            "step_0": (self.tid(3),),
        }
        for t in range(len(self.task_cpus)):
            out[f"step_0/task_{t}"] = (self.tid(4 + 2 * t), self.tid(5 + 2 * t))
        out.update({f"step_{step}": tids for step, tids in self.later_steps.items()})
        return out

    @property
    def all_tids(self) -> tuple[int, ...]:
        tids = {t for ts in self.v1_threads.values() for t in ts}
        return tuple(sorted(tids | {self.tid(12), self.tid(13)}))


def squeue_record(job: FakeJob, cores_per_socket: int, node_name: str = NODE_NAME) -> dict:
    """One job of ``squeue --json`` as Slurm 22.05 prints it for a running job (the fields
    coda-node reads, shaped as in ``tests/data/slurm_json/22.05-squeue.json``)."""
    ngpus = len(job.gpus)
    sockets: dict[str, dict[str, dict[str, str]]] = {}
    for cpu in sorted(job.cpus):  # one thread per core on the fixture node
        socket, core = divmod(cpu, cores_per_socket)
        sockets.setdefault(str(socket), {"cores": {}})["cores"][str(core)] = "allocated"
    return {
        "account": job.account,
        "admin_comment": job.admin_comment or "",
        "comment": "",
        "command": f"/home/{job.user}/{job.name}.sh",
        "cpus_per_tres": f"gres:gpu:{max(1, len(job.cpus) // ngpus)}" if ngpus else "",
        "gres_detail": [f"gpu:{GPU_TYPE}:{ngpus}(IDX:{format_cpulist(job.gpus)})"] if ngpus else [],
        "group_id": job.uid,
        "job_id": job.job_id,
        "job_resources": {
            "nodes": node_name,
            "allocated_cores": len(job.cpus),
            "allocated_hosts": 1,
            "allocated_nodes": [
                {
                    "sockets": sockets,
                    "nodename": node_name,
                    "cpus_used": 0,
                    "memory_used": 0,
                    "memory_allocated": 0,
                }
            ],
        },
        "job_state": "RUNNING",
        "name": job.name,
        "nodes": node_name,
        "node_count": job.num_nodes,
        "partition": job.partition,
        "user_id": job.uid,
        "user_name": job.user,
    }


class FakeSlurm:
    """The Slurm client commands coda-node runs (a :data:`coda_node.system.slurmjobs.Runner`), as
    Slurm 22.05 answers them: ``squeue --json`` prints every job whatever ``--jobs`` says,
    ``scontrol`` has no ``--json`` and ``sinfo --json`` gives the node's layout.

    ``jobs`` are the jobs slurmctld knows; set ``error`` to make every command fail as it
    does when slurmctld cannot be reached. ``calls`` lists every argv, in order.
    """

    def __init__(self, node_name: str = NODE_NAME, cores_per_socket: int = 32) -> None:
        self.node_name = node_name
        self.cores_per_socket = cores_per_socket
        self.jobs: dict[int, FakeJob] = {}
        self.calls: list[tuple[str, ...]] = []
        self.error: str | None = None

    def __call__(self, argv: Sequence[str]) -> str:
        args = tuple(argv)
        self.calls.append(args)
        if self.error is not None:
            raise SlurmQueryError(f"{' '.join(args)} exited 1 ({self.error})")
        if args[:2] == ("squeue", "--json"):
            records = [
                squeue_record(job, self.cores_per_socket, self.node_name)
                for _, job in sorted(self.jobs.items())
            ]
            return json.dumps({"meta": {}, "errors": [], "jobs": records})
        if args[:1] == ("squeue",):
            return "".join(f"{job_id}\n" for job_id in sorted(self.jobs))
        if args == ("sinfo", "--json"):
            node = {"name": self.node_name, "cores": self.cores_per_socket, "threads": 1}
            return json.dumps({"meta": {}, "errors": [], "nodes": [node]})
        if args[:1] == ("scontrol",) and "--json" in args:
            # make_runner's message for 22.05's scontrol, which has no --json
            raise SlurmQueryError(
                f"{' '.join(args)} exited 1 (scontrol: unrecognized option '--json')"
            )
        raise SlurmQueryError(f"{args[0]}: not a command this fake answers ({args})")

    def scontrol_counts(self) -> Counter[int]:
        """Job id -> how many times slurmctld was asked about it (``squeue --json --jobs``)."""
        counts: Counter[int] = Counter()
        for a in self.calls:
            if a[:2] == ("squeue", "--json"):
                ids = next(x for x in a if x.startswith("--jobs=")).removeprefix("--jobs=")
                counts.update(int(j) for j in ids.split(","))
        return counts

    def squeue_calls(self) -> int:
        """``squeue -w <node>`` calls: listing the node's jobs without cgroups."""
        return sum(1 for a in self.calls if a[:1] == ("squeue",) and "--json" not in a)


# --------------------------------------------------------------------------------------------
# Thread affinity


class FakeAffinity:
    """sched_{get,set}affinity(2) over a dict; a thread not in it has exited (ESRCH)."""

    def __init__(self) -> None:
        self.masks: dict[int, frozenset[int]] = {}
        self.calls: list[tuple[int, str]] = []

    def get(self, tid: int) -> frozenset[int]:
        if tid not in self.masks:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        return self.masks[tid]

    def set(self, tid: int, cpus: frozenset[int]) -> None:
        self.calls.append((tid, format_cpulist(cpus)))
        if tid not in self.masks:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        self.masks[tid] = frozenset(cpus)


# --------------------------------------------------------------------------------------------
# The node


@dataclass
class FakeNode:
    tmp: Path
    root: Path
    version: Literal[1, 2]
    cpu_comounted: bool
    cgroups: CgroupFixture
    etc: Path
    state_dir: Path
    cfg: CodaConfig
    slurm: FakeSlurm
    nvml_lib: FakeNvml
    dev_minors: tuple[int, ...]
    """Minor number of /dev/nvidiaN, by N (= Slurm's index: gres.conf lists them in order)."""
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    affinity: FakeAffinity = field(default_factory=FakeAffinity)
    journal: list[tuple[Path, bytes]] = field(default_factory=list)
    """Every cgroup write the daemon's writers made, in order: (file, exact bytes)."""
    before_write: Callable[[Path, bytes], None] | None = None
    """Called before each cgroup write reaches the fake kernel (inject a crash, a race)."""

    # -- paths ---------------------------------------------------------------------------
    @property
    def coda_conf(self) -> Path:
        return self.etc / "coda.conf"

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def view_file(self) -> Path:
        """The daemon's last tick's view (NodeRuntimeDir/view.json)."""
        return self.cfg.node_runtime_dir / VIEW_FILE

    def view(self) -> dict[str, Any]:
        """The view in the view file, as ``coda-node status`` reads it."""
        return json.loads(self.view_file.read_text())["view"]

    @property
    def cg(self) -> Path:
        return self.root / CGROUP

    @property
    def cpu_mount(self) -> Path:
        """The v1 hierarchy with the cpu controller (the quota writer's)."""
        return self.cg / ("cpu,cpuacct" if self.cpu_comounted else "cpu")

    @property
    def cpuacct_mount(self) -> Path:
        return self.cg / ("cpu,cpuacct" if self.cpu_comounted else "cpuacct")

    def _v1_rel(self, job: FakeJob) -> str:
        return f"slurm/uid_{job.uid}/job_{job.job_id}"

    def job_dir(self, job_id: int) -> Path:
        """The job's cpuset directory (v1) or its directory (v2)."""
        job = self.jobs[job_id]
        if self.version == 2:
            return self.cg / V2_SCOPE / f"job_{job_id}"
        return self.cg / "cpuset" / self._v1_rel(job)

    def cpu_dir(self, job_id: int) -> Path:
        """Where a CPU quota of the job lives: Slurm's cpu,cpuacct directory (co-mounted),
        coda's own ``<cpu>/coda/job_<id>`` (v1) or the job's directory (v2)."""
        if self.version == 2:
            return self.job_dir(job_id)
        if self.cpu_comounted:
            return self.cpu_mount / self._v1_rel(self.jobs[job_id])
        return self.cpu_mount / "coda" / f"job_{job_id}"

    def quota_file(self, job_id: int) -> Path:
        return self.cpu_dir(job_id) / ("cpu.max" if self.version == 2 else "cpu.cfs_quota_us")

    def host_path(self, path: Path) -> str:
        """A fixture path as the host names it: ``/sys/fs/cgroup/...``."""
        return "/" + path.relative_to(self.root).as_posix()

    # -- reading the fixture -------------------------------------------------------------
    def cpuset_texts(self, job_id: int) -> dict[str, str]:
        """Every ``cpuset.cpus`` under the job: relative dir (``"."`` = the job) -> text."""
        top = self.job_dir(job_id)
        out = {}
        for path in sorted(top.rglob("cpuset.cpus")):
            rel = path.parent.relative_to(top).as_posix()
            out[rel] = path.read_text()
        return out

    def job_journal(self, job_id: int) -> list[tuple[str, bytes]]:
        """The journal's writes under the job's cpuset directory, relative to it."""
        top = self.job_dir(job_id)
        return [
            (path.relative_to(top).as_posix(), data)
            for path, data in self.journal
            if top in path.parents
        ]

    def proc_cgroup_texts(self, job_id: int) -> dict[int, str]:
        return {
            tid: (self.root / "proc" / str(tid) / "cgroup").read_text()
            for tid in self.jobs[job_id].all_tids
            if (self.root / "proc" / str(tid)).is_dir()
        }

    def expected_gpu_refs(self, job_id: int) -> list[tuple[int, int, int]]:
        """(Slurm index, device minor, NVML index) of each of the job's GPUs."""
        nvml_minors = [g.minor for g in self.nvml_lib.gpus]
        return [
            (s, self.dev_minors[s], nvml_minors.index(self.dev_minors[s]))
            for s in self.jobs[job_id].gpus
        ]

    # -- changing the node ---------------------------------------------------------------
    def set_limits(self, limits: Mapping[int, Limit]) -> None:
        """What ``coda-node limit`` / ``release`` write."""
        save_limits(self.state_dir, limits)

    def advance_cpu(self, job_id: int, ns: int) -> None:
        """The job burns ``ns`` more nanoseconds of CPU time (in its batch step)."""
        job = self.jobs[job_id]
        if self.version == 2:
            for path in (self.job_dir(job_id), self.job_dir(job_id) / "step_batch"):
                usec = _read_usage_usec(path / "cpu.stat") + ns // 1000
                put(path / "cpu.stat", _cpu_stat(usec))
            return
        top = self.cpuacct_mount / self._v1_rel(job)
        for path in (top, top / "step_batch"):
            usage = path / "cpuacct.usage"
            usage.write_text(f"{int(usage.read_text()) + ns}\n")

    def cpu_usage_ns(self, job_id: int) -> int:
        if self.version == 2:
            return _read_usage_usec(self.job_dir(job_id) / "cpu.stat") * 1000
        top = self.cpuacct_mount / self._v1_rel(self.jobs[job_id])
        return int((top / "cpuacct.usage").read_text())

    def add_job(
        self,
        kind: Kind,
        cpus: Iterable[int],
        gpus: Iterable[int] = (),
        *,
        job_id: int | None = None,
        name: str | None = None,
        admin_comment: str | None = "",
    ) -> FakeJob:
        """Start a job: its cgroups, threads and Slurm record (``admin_comment=""`` writes
        the hook's record for a GPU job; None writes none)."""
        index = max((j.index for j in self.jobs.values()), default=-1) + 1
        job_id = job_id if job_id is not None else FIRST_JOB_ID + index
        job = _make_job(job_id, index, kind, frozenset(cpus), tuple(gpus), name, admin_comment)
        self.jobs[job_id] = job
        self.slurm.jobs[job_id] = job
        if self.version == 2:
            _lay_out_v2_job(self, job)
        else:
            _lay_out_v1_job(self, job)
        return job

    def start_step(self, job_id: int, step: str) -> int:
        """slurmd starts step ``step`` (one thread, returned): it writes the job's whole
        allocation back into the job's cpuset, re-widening a job coda shrank, and makes the
        step's cgroup with the whole allocation (Slurm 22.05, task/cgroup)."""
        job = self.jobs[job_id]
        tid = job.tid(14 + len(job.later_steps))
        if tid >= job.tid(TIDS_PER_JOB):
            raise ValueError(f"job {job_id}: no thread ids left for another step")
        job.later_steps[step] = (tid,)
        cpus = format_cpulist(job.cpus)
        top = self.job_dir(job_id)
        (top / "cpuset.cpus").write_text(cpus + "\n")
        self.affinity.masks[tid] = job.cpus
        if self.version == 2:
            sub, ctl = V2_JOB_SUBTREE, V2_JOB_SUBTREE
            v2_dir(top / f"step_{step}", "", cpus, controllers=ctl, subtree=sub)
            v2_dir(top / f"step_{step}/user", cpus, cpus, controllers=ctl, subtree=sub)
            v2_dir(top / f"step_{step}/user/task_0", "", cpus, procs=(tid,), controllers=ctl)
            lines = _thread_cgroup_lines(self, job, f"step_{step}/user/task_0")
            proc_thread(self.root, tid, job.name[:15], 0, 0, lines)
            return tid
        v1_cpuset(top / f"step_{step}", cpus, "0-1", (tid,))
        acct = self.cpuacct_mount / self._v1_rel(job) / f"step_{step}"
        if self.cpu_comounted:
            v1_cpu(acct, (tid,), usage_ns=0)
        else:
            _v1_acct(acct, (tid,), 0)
            slurmd = self.cpu_mount / "system.slice/slurmd.service/tasks"
            slurmd.write_text(slurmd.read_text() + f"{tid}\n")
        proc_thread(
            self.root, tid, job.name[:15], 0, 0, _thread_cgroup_lines(self, job, f"step_{step}")
        )
        return tid

    def remove_job(self, job_id: int) -> None:
        """The job ends: its cgroups and threads go, and slurmctld forgets it."""
        job = self.jobs.pop(job_id)
        self.slurm.jobs.pop(job_id, None)
        if self.version == 2:
            shutil.rmtree(self.cg / V2_SCOPE / f"job_{job_id}")
        else:
            for mount in ("cpuset", "cpu,cpuacct", "cpuacct", "freezer", "memory"):
                d = self.cg / mount / self._v1_rel(job)
                if d.is_dir():
                    shutil.rmtree(d)
        gone = {str(t) for t in job.all_tids}
        # The kernel drops exited threads from every pid file (coda's own cgroups included).
        for name in ("tasks", "cgroup.procs", "cgroup.threads"):
            for pid_file in self.cg.rglob(name):
                pids = pid_file.read_text().split()
                if gone & set(pids):
                    pid_file.write_text("".join(f"{p}\n" for p in pids if p not in gone))
        for tid in job.all_tids:
            shutil.rmtree(self.root / "proc" / str(tid), ignore_errors=True)
            self.affinity.masks.pop(tid, None)

    # -- what the daemon is built with ---------------------------------------------------
    def write_file(self, path: Path, data: bytes) -> None:
        if self.before_write is not None:
            self.before_write(path, data)
        self.cgroups.kernel.write_file(path, data)

    def cpuset_writer(self, layout: CgroupLayout) -> CpusetWriter:
        return CpusetWriter(
            layout,
            journal=self.journal,
            write_file=self.write_file,
            get_affinity=self.affinity.get,
            set_affinity=self.affinity.set,
        )

    def quota_writer(self, layout: CgroupLayout) -> CpuQuotaWriter:
        return CpuQuotaWriter(
            layout,
            journal=self.journal,
            write_file=self.write_file,
            mkdir=self.cgroups.kernel.mkdir,
            rmdir=self.cgroups.kernel.rmdir,
        )

    def daemon(self, cfg: CodaConfig | None = None, *, start: bool = True, **extra: Any) -> Daemon:
        """A Daemon on this node (started, unless ``start=False``); ``extra`` are further
        Daemon arguments (``clock=``, ``pcie_bw=``, ...)."""
        d = Daemon(
            cfg or self.cfg,
            runner=self.slurm,
            nvml=Nvml(lib=self.nvml_lib),
            cpuset_writer=self.cpuset_writer,
            quota_writer=self.quota_writer,
            **extra,
        )
        if start:
            d.start()
        return d


def _cpu_stat(usage_usec: int) -> str:
    user = usage_usec * 4 // 5
    return f"usage_usec {usage_usec}\nuser_usec {user}\nsystem_usec {usage_usec - user}\n"


def _read_usage_usec(path: Path) -> int:
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise AssertionError(f"no usage_usec in {path}")


def _make_job(
    job_id: int,
    index: int,
    kind: Kind,
    cpus: frozenset[int],
    gpus: tuple[int, ...],
    name: str | None,
    admin_comment: str | None,
) -> FakeJob:
    user, uid = USERS[index % len(USERS)]
    names = DNN_NAMES if kind == "dnn" else CPU_NAMES
    name = name or names[(index // 2) % len(names)]
    if admin_comment == "":
        admin_comment = None
        if kind == "dnn":
            cpg = max(1, len(cpus) // max(1, len(gpus)))
            admin_comment = (
                f"coda:sig=workload:{uid}:{name};cpg={cpg};was=;action=set;src=profile;"
                f"gpn={len(gpus)};nodes=1"
            )
    ordered = sorted(cpus)
    ntasks = min(2, len(ordered))
    per = -(-len(ordered) // ntasks)
    task_cpus = tuple(frozenset(ordered[t * per : (t + 1) * per]) for t in range(ntasks))
    return FakeJob(job_id, index, kind, user, uid, name, cpus, gpus, admin_comment, task_cpus)


def _thread_cgroup_lines(node: FakeNode, job: FakeJob, rel: str) -> str:
    """/proc/<tid>/cgroup of a thread in the job's directory ``rel`` (proc(5))."""
    if node.version == 2:
        return f"0::/{V2_SCOPE}/job_{job.job_id}/{rel}\n"
    where = f"/{node._v1_rel(job)}/{rel}"
    step = where.split("/task_")[0]
    if node.cpu_comounted:
        cpu_lines = f"4:cpu,cpuacct:{where}\n"
    else:
        # Slurm makes no job directories in a cpu-only hierarchy: the threads stay where
        # slurmstepd was forked, slurmd.service.
        cpu_lines = f"5:cpuacct:{where}\n4:cpu:/system.slice/slurmd.service\n"
    return (
        f"12:freezer:{step}\n9:memory:{step}\n6:cpuset:{where}\n{cpu_lines}"
        "1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n"
    )


def _lay_out_v1_job(node: FakeNode, job: FakeJob) -> None:
    cpus = format_cpulist(job.cpus)
    top = node.cg / "cpuset" / node._v1_rel(job)
    uid_dir = top.parent
    if not uid_dir.is_dir():
        v1_cpuset(uid_dir, (uid_dir.parent / "cpuset.cpus").read_text().strip(), "0-1")
    v1_cpuset(top, cpus, "0-1")
    threads = job.v1_threads
    for rel, tids in threads.items():
        if rel.startswith("step_0/task_"):
            task_cpus = job.task_cpus[int(rel.rsplit("_", 1)[1])]
            v1_cpuset(top / rel, format_cpulist(task_cpus), "0-1", tids)
        else:
            v1_cpuset(top / rel, cpus, "0-1", tids)
        for tid in tids:
            node.affinity.masks[tid] = parse_cpulist((top / rel / "cpuset.cpus").read_text())
    # cpuacct (jobacct_gather/cgroup): the same tree, with CPU time per directory.
    usage_ns = (job.index + 1) * JOB_USAGE_NS
    acct = node.cpuacct_mount / node._v1_rel(job)
    per_dir = usage_ns // len(threads)
    for up in (acct.parent.parent, acct.parent):  # slurm/, uid_<uid>/
        if (up / "tasks").exists():
            continue
        if node.cpu_comounted:
            v1_cpu(up, usage_ns=0)
        else:
            _v1_acct(up, (), 0)
    if node.cpu_comounted:
        v1_cpu(acct, usage_ns=usage_ns)
        for rel, tids in threads.items():
            v1_cpu(acct / rel, tids, usage_ns=per_dir)
    else:
        _v1_acct(acct, (), usage_ns)
        for rel, tids in threads.items():
            _v1_acct(acct / rel, tids, per_dir)
    # The cpu hierarchy: threads outside Slurm's job directories stay in slurmd.service,
    # where slurmstepd was forked (every thread of the job when cpu is mounted alone).
    outside = job.all_tids if not node.cpu_comounted else (job.tid(12), job.tid(13))
    slurmd = node.cpu_mount / "system.slice/slurmd.service/tasks"
    slurmd.write_text(slurmd.read_text() + "".join(f"{t}\n" for t in outside))
    steps = {rel.split("/")[0] for rel in threads}
    for hierarchy, name in (("freezer", "freezer.state"), ("memory", "memory.limit_in_bytes")):
        base = node.cg / hierarchy / node._v1_rel(job)
        put(base / name, "THAWED\n" if hierarchy == "freezer" else f"{512 * GIB}\n")
        for step in sorted(steps):
            tids = tuple(t for rel, ts in threads.items() if rel.split("/")[0] == step for t in ts)
            put(base / step / "tasks", "".join(f"{t}\n" for t in tids))
            put(base / step / name, "THAWED\n" if hierarchy == "freezer" else f"{512 * GIB}\n")
    comm = {0: "sleep", 1: "bash", 2: "python3"}
    for rel, tids in threads.items():
        for tid in tids:
            k = tid - job.tid(0)
            lines = _thread_cgroup_lines(node, job, rel)
            proc_thread(node.root, tid, comm.get(k, job.name[:15]), 100 * k, 10 * k, lines)
    # v1 keeps extern's and batch's slurmstepd outside the job (in slurmd.service).
    for tid in (job.tid(12), job.tid(13)):
        proc_thread(node.root, tid, "slurmstepd", 1, 1, _slurmstepd_lines(node))


def _slurmstepd_lines(node: FakeNode) -> str:
    cpu = "4:cpu,cpuacct:/" if node.cpu_comounted else "5:cpuacct:/\n4:cpu:/"
    return (
        f"12:freezer:/\n9:memory:/\n6:cpuset:/\n{cpu}system.slice/slurmd.service\n"
        "0::/system.slice/slurmd.service\n"
    )


def _v1_acct(d: Path, tasks: tuple[int, ...], usage_ns: int) -> None:
    """A directory of a cpuacct-only hierarchy."""
    put(d / "cpuacct.usage", f"{usage_ns}\n")
    put(d / "tasks", "".join(f"{t}\n" for t in tasks))


def _lay_out_v2_job(node: FakeNode, job: FakeJob) -> None:
    cpus = format_cpulist(job.cpus)
    sub = ctl = V2_JOB_SUBTREE
    top = node.cg / V2_SCOPE / f"job_{job.job_id}"
    v2_dir(top, cpus, cpus, controllers=ctl, subtree=sub)
    put(top / "cpuset.mems", "0-1\n")
    usage_usec = (job.index + 1) * JOB_USAGE_NS // 1000
    put(top / "cpu.stat", _cpu_stat(usage_usec))
    # step -> (slurmstepd, {task dir under user/: (processes, threads)})
    steps: dict[str, tuple[int, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]] = {
        "extern": (job.tid(12), {"task_special": ((job.tid(0),), (job.tid(0),))}),
        "batch": (job.tid(13), {"task_0": ((job.tid(1),), (job.tid(1), job.tid(2)))}),
        "0": (
            job.tid(3),
            {
                f"task_{t}": ((job.tid(4 + 2 * t),), (job.tid(4 + 2 * t), job.tid(5 + 2 * t)))
                for t in range(len(job.task_cpus))
            },
        ),
    }
    for step, (stepd, tasks) in steps.items():
        s = top / f"step_{step}"
        # Slurm's cgroup/v2: the step's CPUs are on its user/ level, the step's own
        # cpuset.cpus is empty (as are slurm/ and the task directories).
        v2_dir(s, "", cpus, controllers=ctl, subtree=sub)
        put(s / "cpu.stat", _cpu_stat(usage_usec if step == "batch" else 0))
        v2_dir(s / "slurm", "", cpus, procs=(stepd,), controllers=ctl)
        v2_dir(s / "user", cpus, cpus, controllers=ctl, subtree=sub)
        node.affinity.masks[stepd] = job.cpus
        lines = _thread_cgroup_lines(node, job, f"step_{step}/slurm")
        proc_thread(node.root, stepd, "slurmstepd", 1, 1, lines)
        for name, (procs, threads) in tasks.items():
            v2_dir(s / "user" / name, "", cpus, procs=procs, threads=threads, controllers=ctl)
            lines = _thread_cgroup_lines(node, job, f"step_{step}/user/{name}")
            for tid in threads:
                node.affinity.masks[tid] = job.cpus
                proc_thread(node.root, tid, job.name[:15], 100, 10, lines)


# --------------------------------------------------------------------------------------------
# Building


def _cpu_pool(cpus: int) -> list[int]:
    """The node's CPUs alternating its two halves: 0, 32, 1, 33, ... on 64 CPUs."""
    half = cpus // 2
    pool = [c for i in range(half) for c in (i, i + half)]
    return pool + list(range(2 * half, cpus))


def _cpu_counts(cpus: int, kinds: Sequence[Kind]) -> list[int]:
    """CPUs per job: a GPU job weighs 3, a CPU job 1; every job gets at least one."""
    if len(kinds) > cpus:
        raise ValueError(f"{len(kinds)} jobs do not fit on {cpus} CPUs")
    weights = [3 if k == "dnn" else 1 for k in kinds]
    total = sum(weights) or 1
    counts = [max(1, cpus * w // total) for w in weights]
    while sum(counts) > cpus:
        counts[counts.index(max(counts))] -= 1
    for i in range(cpus - sum(counts)):
        counts[i % len(counts)] += 1
    return counts


def _gpu_sets(n_dnn: int, gpus: int) -> list[tuple[int, ...]]:
    """Slurm GPU indices of each GPU job, dealt in order: every fourth job holds two, the
    others one; once all GPUs are dealt, dealing starts again from GPU 0 (shared)."""
    out = []
    cursor = 0
    for g in range(n_dnn):
        n = 2 if g % 4 == 0 and gpus >= 2 else 1
        out.append(tuple(sorted({(cursor + k) % gpus for k in range(n)})))
        cursor += n
    return out


def _slurm_conf(cpus: int, gpus: int) -> str:
    sockets = 2 if cpus % 2 == 0 else 1
    gres = f" Gres=gpu:{GPU_TYPE}:{gpus}" if gpus else ""
    return f"""\
# slurm.conf of the fixture node (Slurm 22.05)
ClusterName=coda-fixture
SlurmctldHost=head01
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
NodeName={NODE_NAME} CPUs={cpus} Boards=1 SocketsPerBoard={sockets} \
CoresPerSocket={cpus // sockets} ThreadsPerCore=1 RealMemory=1024000{gres} State=UNKNOWN
PartitionName=gpu Nodes={NODE_NAME} Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes={NODE_NAME} MaxTime=INFINITE State=UP
"""


def _lay_out_cgroups(root: Path, version: int, cpu_comounted: bool, cpus: int) -> None:
    """/proc/self/mounts and the cgroup hierarchies above Slurm's jobs."""
    all_cpus = f"0-{cpus - 1}"
    cg = root / CGROUP
    if version == 2:
        put(root / "proc/self/mounts", MOUNTS_V2)
        v2_dir(
            cg,
            all_cpus,
            all_cpus,
            controllers="cpuset cpu io memory hugetlb pids rdma misc",
            subtree="cpuset cpu memory pids",
        )
        v2_dir(
            cg / "system.slice",
            "",
            all_cpus,
            controllers="cpuset cpu memory pids",
            subtree="cpuset cpu memory pids",
        )
        scope = cg / V2_SCOPE
        v2_dir(scope, "", all_cpus, controllers=V2_JOB_SUBTREE, subtree=V2_JOB_SUBTREE)
        v2_dir(scope / "system", "", all_cpus, procs=(TID_BASE - 1,), controllers=V2_JOB_SUBTREE)
        return
    put(root / "proc/self/mounts", MOUNTS_V1_DEBIAN if cpu_comounted else MOUNTS_V1_SPLIT)
    v1_cpuset(cg / "cpuset", all_cpus, "0-1", (1,))
    v1_cpuset(cg / "cpuset/slurm", all_cpus, "0-1")
    cpu = cg / ("cpu,cpuacct" if cpu_comounted else "cpu")
    usage_ns = 0 if cpu_comounted else None
    v1_cpu(cpu, (1,), usage_ns=usage_ns)
    v1_cpu(cpu / "system.slice", usage_ns=usage_ns)
    v1_cpu(cpu / "system.slice/slurmd.service", usage_ns=usage_ns)
    if not cpu_comounted:
        _v1_acct(cg / "cpuacct", (1,), 10**15)
        (cg / "unified").mkdir(parents=True, exist_ok=True)
    for hierarchy in ("freezer", "memory"):
        put(cg / hierarchy / "tasks", "1\n")


def build_node(
    tmp: Path,
    *,
    version: Literal[1, 2] = 1,
    cpus: int = 64,
    gpus: int = 8,
    jobs: int = 32,
    cpu_comounted: bool = False,
    enforce: str | None = None,
    nvml_minors: Sequence[int] | None = None,
    dev_minors: Sequence[int] | None = None,
) -> FakeNode:
    """A GPU node with ``jobs`` running jobs (see the module docstring).

    ``cpu_comounted``: v1 with cpu and cpuacct mounted together (systemd's default; Slurm's
    job directories then exist in the cpu hierarchy), else each controller alone (coda makes
    ``<cpu>/coda/job_<id>`` for a quota). ``enforce``: the ``NodeEnforce=`` value written to
    coda.conf (None: the key is left out, so the default). ``nvml_minors[i]``: the minor NVML
    reports for its GPU ``i`` (default :data:`NVML_MINORS`); ``dev_minors[n]``: the minor of
    ``/dev/nvidia<n>`` (default ``n``, as the driver makes them).

    Skips the calling test when not root (mknod).
    """
    reason = mknod_reason()
    if reason is not None:
        import pytest

        pytest.skip(reason)
    if gpus > len(PCI_BUS_IDS):
        raise ValueError(f"at most {len(PCI_BUS_IDS)} GPUs")
    nvml_minors = tuple(nvml_minors if nvml_minors is not None else NVML_MINORS[:gpus])
    if gpus != len(NVML_MINORS) and nvml_minors == NVML_MINORS[:gpus]:
        nvml_minors = tuple(reversed(range(gpus)))
    dev_minors = tuple(dev_minors if dev_minors is not None else range(gpus))
    if sorted(nvml_minors) != sorted(dev_minors) or len(dev_minors) != gpus:
        raise ValueError("nvml_minors and dev_minors must name the same minors, one per GPU")

    root = tmp / "root"
    etc = tmp / "etc"
    state_dir = tmp / "state"
    run_dir = tmp / "run"
    for d in (root, etc, state_dir, run_dir):
        d.mkdir(parents=True)

    # /dev: the GPUs' device nodes, as the driver makes them (crw-rw-rw-, major 195).
    (root / "dev").mkdir()
    for n, minor in enumerate(dev_minors):
        os.mknod(
            root / "dev" / f"nvidia{n}",
            0o666 | stat.S_IFCHR,
            os.makedev(NVIDIA_MAJOR, minor),
        )
    os.mknod(root / "dev/nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 255))

    # The CPUs the kernel has online (Documentation/ABI/testing/sysfs-devices-system-cpu).
    put(root / "sys/devices/system/cpu/online", f"0-{cpus - 1}\n")
    (etc / "slurm.conf").write_text(_slurm_conf(cpus, gpus))
    last = f"[0-{gpus - 1}]" if gpus > 1 else "0"
    gres_line = f"NodeName={NODE_NAME} Name=gpu Type={GPU_TYPE} File=/dev/nvidia{last}\n"
    (etc / "gres.conf").write_text(
        "# gres.conf of the fixture node\n" + (gres_line if gpus else "")
    )
    enforce_line = f"NodeEnforce={enforce}\n" if enforce is not None else ""
    (etc / "coda.conf").write_text(
        "# coda.conf of the fixture node\n"
        f"ProfileStore={tmp / 'profiles'}\n"
        "HookStatsFile=\n"
        f"NodeName={NODE_NAME}\n"
        f"NodeRoot={root}\n"
        f"NodeStateDir={state_dir}\n"
        f"NodeRuntimeDir={run_dir}\n"
        "NodeIntervalS=5\n"
        f"{enforce_line}"
    )
    cfg = load_config(etc / "coda.conf")

    nvml_lib = FakeNvml(
        [
            FakeGpu(
                minor=minor,
                uuid=f"GPU-{i:08x}-5a1e-4c0d-9e2f-0000000000{minor:02d}",
                name="NVIDIA A100-SXM4-80GB",
                pci_bus_id=f"00000000:{PCI_BUS_IDS[i]}:00.0",
                util_pct=10 + 10 * i,
                mem_util_pct=5 * i,
                mem_used_bytes=(i + 1) * GIB,
                mem_total_bytes=80 * GIB,
                pcie_rx_kb_per_s=1000 * i,
                pcie_tx_kb_per_s=500 * i,
            )
            for i, minor in enumerate(nvml_minors)
        ]
    )
    cpu_comounted = cpu_comounted and version == 1
    _lay_out_cgroups(root, version, cpu_comounted, cpus)
    node = FakeNode(
        tmp=tmp,
        root=root,
        version=version,
        cpu_comounted=cpu_comounted,
        cgroups=CgroupFixture(root),  # its FakeKernel reads the mounts just written
        etc=etc,
        state_dir=state_dir,
        cfg=cfg,
        slurm=FakeSlurm(NODE_NAME, cores_per_socket=cpus // (2 if cpus % 2 == 0 else 1)),
        nvml_lib=nvml_lib,
        dev_minors=dev_minors,
    )

    kinds: list[Kind] = ["dnn" if i % 2 == 0 and gpus else "cpu" for i in range(jobs)]
    counts = _cpu_counts(cpus, kinds)
    pool = _cpu_pool(cpus)
    gpu_sets = iter(_gpu_sets(kinds.count("dnn"), gpus))
    taken = 0
    for i, kind in enumerate(kinds):
        job_cpus = pool[taken : taken + counts[i]]
        taken += counts[i]
        gpu_idx = next(gpu_sets) if kind == "dnn" else ()
        # every eighth GPU job was submitted before the hook was installed: no record
        comment = None if kind == "dnn" and i % 16 == 14 else ""
        node.add_job(kind, job_cpus, gpu_idx, admin_comment=comment)
    return node
