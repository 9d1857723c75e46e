"""Fixture trees laid out like the kernel's cgroupfs with Slurm's job cgroups in them.

One builder per variant: cgroup v1 as Debian 12's Slurm 22.05 lays it out (cpu and cpuacct
co-mounted, as systemd mounts them), v1 with a multiple-slurmd ``slurm_<nodename>`` tree (each
controller mounted alone, as on the development host), cgroup v2 with
``<nodename>_slurmstepd.scope``, the same scope with its job directories named as Slurm 24.11
and 26.05 name them (``job_<id>`` or the job's SLUID), and hosts with no Slurm tree.
:class:`FakeKernel` stands in for the few kernel answers the tests depend on (pid moves, v1
cpuset nesting, controller files appearing on mkdir).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from coda_node.system.cgroups import format_cpulist, parse_cpulist
from coda_node.system.paths import SystemRoot

CGROUP = "sys/fs/cgroup"

MOUNTS_V1_DEBIAN = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,nodev,noexec,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,nodev,noexec,relatime,freezer 0 0
"""

MOUNTS_V1_SPLIT = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""

MOUNTS_V2 = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0
"""

_PID_FILES = ("tasks", "cgroup.procs", "cgroup.threads")


def put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _lines(pids: tuple[int, ...]) -> str:
    return "".join(f"{pid}\n" for pid in pids)


def v1_cpuset(d: Path, cpus: str, mems: str = "0", tasks: tuple[int, ...] = ()) -> None:
    """A v1 cpuset directory with the files the tests read (kernel prints a trailing \\n)."""
    put(d / "cpuset.cpus", cpus + "\n")
    put(d / "cpuset.mems", mems + "\n")
    put(d / "tasks", _lines(tasks))


def v1_cpu(d: Path, tasks: tuple[int, ...] = (), usage_ns: int | None = None) -> None:
    """A v1 cpu (optionally co-mounted cpuacct) directory."""
    put(d / "cpu.cfs_period_us", "100000\n")
    put(d / "cpu.cfs_quota_us", "-1\n")
    put(d / "tasks", _lines(tasks))
    if usage_ns is not None:
        put(d / "cpuacct.usage", f"{usage_ns}\n")


def proc_thread(
    base: Path, tid: int, comm: str, utime: int, stime: int, cgroup: str = "0::/\n"
) -> None:
    """/proc/<tid>/task/<tid>/stat (52 fields, proc(5)) and /proc/<tid>/cgroup."""
    tail = ["S", "1", str(tid), str(tid), "0", "-1", "4194560", "0", "0", "0", "0"]
    tail += [str(utime), str(stime), "0", "0", "20", "0", "1", "0", "100"]
    tail += ["0"] * (52 - 2 - len(tail))
    put(base / f"proc/{tid}/task/{tid}/stat", f"{tid} ({comm}) {' '.join(tail)}\n")
    put(base / f"proc/{tid}/cgroup", cgroup)


@dataclass
class CgroupFixture:
    base: Path
    kernel: FakeKernel = field(init=False)

    def __post_init__(self) -> None:
        self.kernel = FakeKernel(self.base)

    @property
    def root(self) -> SystemRoot:
        return SystemRoot(self.base)

    def cg(self, rel: str) -> Path:
        """``cpuset/slurm/uid_1000`` -> the fixture's /sys/fs/cgroup/cpuset/slurm/uid_1000."""
        return self.base / CGROUP / rel

    def rel(self, path: Path) -> str:
        """A fixture path as the host would name it: ``/sys/fs/cgroup/...``."""
        return "/" + path.relative_to(self.base).as_posix()

    def journal(self, journal: list[tuple[Path, bytes]]) -> list[tuple[str, bytes]]:
        """A writer's journal with host-style paths relative to /sys/fs/cgroup."""
        cg = self.base / CGROUP
        return [(path.relative_to(cg).as_posix(), data) for path, data in journal]

    def read(self, rel: str) -> str:
        return self.cg(rel).read_text()


def build_v1_debian(base: Path) -> CgroupFixture:
    """(a) cgroup v1, Slurm 22.05 as Debian 12 packages it (cpu,cpuacct co-mounted).

    Job 101 (uid 1000, a GPU job): steps extern, batch and 0 (with task_0 bound to CPUs 2-3);
    jobacct_gather/cgroup made its cpuacct tree. Job 202 (uid 1001, CPU only): extern and
    batch, no cpuacct tree; its tasks sit in slurmd.service's cpu cgroup (2202 in the root).
    """
    put(base / "proc/self/mounts", MOUNTS_V1_DEBIAN)
    cs = base / CGROUP / "cpuset"
    v1_cpuset(cs, "0-15", "0-1", (1,))
    v1_cpuset(cs / "slurm", "0-15", "0-1")
    v1_cpuset(cs / "slurm/uid_1000", "0-15", "0-1")
    j101 = cs / "slurm/uid_1000/job_101"
    v1_cpuset(j101, "0-3,8-11")
    v1_cpuset(j101 / "step_extern", "0-3,8-11", tasks=(1100,))
    v1_cpuset(j101 / "step_batch", "0-3,8-11", tasks=(1101, 1102))
    v1_cpuset(j101 / "step_0", "0-3,8-11", tasks=(1110,))
    v1_cpuset(j101 / "step_0/task_0", "2-3", tasks=(1111, 1112))
    v1_cpuset(cs / "slurm/uid_1001", "0-15", "0-1")
    j202 = cs / "slurm/uid_1001/job_202"
    v1_cpuset(j202, "4-7")
    v1_cpuset(j202 / "step_extern", "4-7", tasks=(2200,))
    v1_cpuset(j202 / "step_batch", "4-7", tasks=(2201, 2202))

    cpu = base / CGROUP / "cpu,cpuacct"
    v1_cpu(cpu, (1, 2202), usage_ns=999_000_000_000)
    v1_cpu(cpu / "system.slice", usage_ns=0)
    v1_cpu(cpu / "system.slice/slurmd.service", (2200, 2201), usage_ns=0)
    v1_cpu(cpu / "slurm", usage_ns=0)
    v1_cpu(cpu / "slurm/uid_1000", usage_ns=0)
    c101 = cpu / "slurm/uid_1000/job_101"
    v1_cpu(c101, usage_ns=123_456_789_000)
    v1_cpu(c101 / "step_extern", usage_ns=1_000)
    v1_cpu(c101 / "step_extern/task_0", (1100,), usage_ns=1_000)
    v1_cpu(c101 / "step_batch", usage_ns=100_000_000_000)
    v1_cpu(c101 / "step_batch/task_0", (1101, 1102), usage_ns=100_000_000_000)
    v1_cpu(c101 / "step_0", (1110,), usage_ns=23_456_788_000)
    v1_cpu(c101 / "step_0/task_0", (1111, 1112), usage_ns=23_456_000_000)

    fz = base / CGROUP / "freezer"
    for rel, tasks in [
        ("slurm/uid_1000/job_101/step_extern", (1100,)),
        ("slurm/uid_1000/job_101/step_batch", (1101, 1102)),
        ("slurm/uid_1000/job_101/step_0", (1110, 1111, 1112)),
        ("slurm/uid_1001/job_202/step_extern", (2200,)),
        ("slurm/uid_1001/job_202/step_batch", (2201, 2202)),
    ]:
        put(fz / rel / "tasks", _lines(tasks))
        put(fz / rel / "freezer.state", "THAWED\n")
    (base / CGROUP / "memory/slurm/uid_1000/job_101").mkdir(parents=True)

    for tid, step, task in [
        (1100, "extern", "/task_0"),
        (1101, "batch", "/task_0"),
        (1102, "batch", "/task_0"),
        (1110, "0", ""),
        (1111, "0", "/task_0"),
        (1112, "0", "/task_0"),
    ]:
        cg = f"/slurm/uid_1000/job_101/step_{step}"
        lines = f"4:cpu,cpuacct:{cg}{task}\n3:cpuset:{cg}\n"
        proc_thread(base, tid, "python3", 500, 50, lines)
    # 2201/2202: two threads of one process whose name has spaces and parentheses.
    for tid, comm, utime, stime, cpu_cg in [
        (2200, "sleep", 1, 2, "/system.slice/slurmd.service"),
        (2201, "my job (v2)", 300, 100, "/system.slice/slurmd.service"),
        (2202, "my job (v2)", 200, 0, "/"),
    ]:
        step = "extern" if tid == 2200 else "batch"
        lines = f"4:cpu,cpuacct:{cpu_cg}\n3:cpuset:/slurm/uid_1001/job_202/step_{step}\n"
        proc_thread(base, tid, comm, utime, stime, lines)
    return CgroupFixture(base)


def build_v1_multi_slurmd(base: Path, nodename: str = "gpu01") -> CgroupFixture:
    """(b) cgroup v1 with ``slurm_<nodename>`` (multiple-slurmd), controllers mounted alone."""
    put(base / "proc/self/mounts", MOUNTS_V1_SPLIT)
    cs = base / CGROUP / "cpuset"
    top = f"slurm_{nodename}"
    v1_cpuset(cs, "0-1")
    v1_cpuset(cs / top, "0-1")
    v1_cpuset(cs / top / "uid_0", "0-1")
    job = cs / top / "uid_0/job_7"
    v1_cpuset(job, "0-1")
    v1_cpuset(job / "step_extern", "0-1", tasks=(700,))
    v1_cpuset(job / "step_0+1", "1", tasks=(701,))
    v1_cpu(base / CGROUP / "cpu", (1, 700, 701))
    put(base / CGROUP / f"cpuacct/{top}/uid_0/job_7/cpuacct.usage", "42000\n")
    for tid in (700, 701):
        proc_thread(base, tid, "sleep", 0, 0, "1:cpu:/\n2:cpuacct:/\n3:cpuset:/\n")
    return CgroupFixture(base)


def v2_dir(
    d: Path,
    cpus: str = "",
    effective: str = "",
    procs: tuple[int, ...] = (),
    threads: tuple[int, ...] | None = None,
    controllers: str = "cpuset memory pids",
    subtree: str = "",
) -> None:
    put(d / "cgroup.controllers", controllers + "\n")
    put(d / "cgroup.subtree_control", subtree + "\n" if subtree else "\n")
    put(d / "cgroup.procs", _lines(procs))
    put(d / "cgroup.threads", _lines(procs if threads is None else threads))
    if "cpuset" in controllers.split():
        put(d / "cpuset.cpus", cpus + "\n")
        put(d / "cpuset.cpus.effective", effective + "\n")
        put(d / "cpuset.mems", "\n")
        put(d / "cpuset.mems.effective", "0\n")
    if "cpu" in controllers.split():
        put(d / "cpu.max", "max 100000\n")
    put(d / "cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n")


V2_NODE = "gpu01"
"""The node in the v2 fixture's scope name: Debian's Slurm names it
``<nodename>_slurmstepd.scope``."""
V2_SCOPE = f"system.slice/{V2_NODE}_slurmstepd.scope"


def build_v2(base: Path, *, cpu_delegated: bool = True) -> CgroupFixture:
    """(c) cgroup v2 as Slurm's cgroup/v2 plugin lays it out through systemd (measured on
    Debian 12, Slurm 22.05, ConstrainCores=yes)::

        system.slice/gpu01_slurmstepd.scope/
            system/                      idle slurmstepds
            job_<id>/                    cpuset.cpus = the job's CPUs
                step_<step>/             cpuset.cpus empty (effective: the job's)
                    slurm/               slurmstepd; cpuset.cpus empty
                    user/                cpuset.cpus = the step's CPUs
                        task_<n>/        the tasks; cpuset.cpus empty

    The cpu controller is enabled from the root down to every job (``cpu.max`` in each
    directory); ``cpu_delegated=False`` leaves it off in system.slice and below, as where no
    unit asked systemd for it. Job 301: steps extern, batch (task_0 has two threads) and 0
    (CPUs 0-1 of the job's 0-3, on its user/ level). Job 302's cpuset.cpus is empty
    everywhere (it inherits 0-7).
    """
    put(base / "proc/self/mounts", MOUNTS_V2)
    cg = base / CGROUP
    below = "cpuset cpu io memory pids" if cpu_delegated else "cpuset io memory pids"
    job_ctl = "cpuset cpu memory pids" if cpu_delegated else "cpuset memory pids"
    v2_dir(
        cg,
        controllers="cpuset cpu io memory hugetlb pids rdma misc",
        subtree="cpuset cpu io memory pids",
    )
    v2_dir(cg / "system.slice", "", "0-7", controllers="cpuset cpu io memory pids", subtree=below)
    scope = base / CGROUP / V2_SCOPE
    v2_dir(scope, "", "0-7", controllers=below, subtree=job_ctl)
    v2_dir(scope / "system", "", "0-7", procs=(3000,), controllers=job_ctl)

    def job_dir(
        d: Path,
        cpus: str,
        effective: str,
        procs: tuple[int, ...] = (),
        threads: tuple[int, ...] | None = None,
        subtree: str = job_ctl,
    ) -> None:
        v2_dir(d, cpus, effective, procs, threads, controllers=job_ctl, subtree=subtree)

    j301 = scope / "job_301"
    job_dir(j301, "0-3", "0-3")
    put(j301 / "cpu.stat", "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\n")
    # step -> (the step's CPUs, slurmstepd pid, {task dir: (cgroup.procs, cgroup.threads)})
    steps: list[tuple[str, str, int, dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]]]
    steps = [
        ("extern", "0-3", 3010, {"task_0": ((3011,), None)}),
        ("batch", "0-3", 3020, {"task_0": ((3021,), (3021, 3022))}),
        ("0", "0-1", 3030, {"task_0": ((3031,), None), "task_1": ((3032,), None)}),
    ]
    for step, cpus, stepd, tasks in steps:
        s = j301 / f"step_{step}"
        job_dir(s, "", "0-3")
        job_dir(s / "slurm", "", "0-3", (stepd,), subtree="")
        job_dir(s / "user", cpus, cpus)
        for name, (procs, threads) in tasks.items():
            job_dir(s / "user" / name, "", cpus, procs, threads=threads, subtree="")
    j302 = scope / "job_302"
    job_dir(j302, "", "0-7")
    put(j302 / "cpuset.mems", "0\n")
    job_dir(j302 / "step_batch", "", "0-7")
    job_dir(j302 / "step_batch/user", "", "0-7")
    job_dir(j302 / "step_batch/user/task_0", "", "0-7", (3121,), subtree="")
    for tid in (3000, 3010, 3011, 3020, 3021, 3022, 3030, 3031, 3032, 3121):
        proc_thread(base, tid, "x", 0, 0)
    return CgroupFixture(base)


SLURM_26_SLUIDS = {1: "s1PDM89Q772300", 2: "s1PDM89Q773700", 3: "s1PDM89Q774700"}
"""The running jobs of tests/data/slurm_json/26.05-squeue.json and their SLUIDs there."""
SLURM_26_CPUS = {1: "0-1", 2: "2-5", 3: "6-7,16-17"}
"""Their CPUs on gpu01 (CPU_IDs in 26.05-scontrol.txt)."""


def build_v2_job_dirs(
    base: Path, dirs: dict[int, str | tuple[str, ...]], *, task_special: bool = True
) -> CgroupFixture:
    """cgroup v2 with the jobs of the 26.05 capture (``SLURM_26_CPUS``) in directories
    named by ``dirs`` (job id -> name, or names where one job has two), as Slurm lays out a
    batch job on the QEMU guests (Debian's kernel, unified hierarchy)::

        system.slice/gpu01_slurmstepd.scope/
            system/                          idle slurmstepds
            <job_<id> or SLUID>/             cpuset.cpus = the job's CPUs
                step_batch/
                    slurm/                   slurmstepd
                    user/                    cpuset.cpus = the step's CPUs
                        task_0/              the batch script
                        task_special/        empty (26.05 makes it for the step's
                                             non-task processes)

    Slurm 24.11 names the job directories ``job_<id>``, 26.05 by the job's SLUID unless
    cgroup.conf sets ``CgroupJobIdPaths=yes``. The job's batch script is pid
    ``4000 + 10 x id``, its slurmstepd one less.
    """
    put(base / "proc/self/mounts", MOUNTS_V2)
    cg = base / CGROUP
    ctl = "cpuset cpu memory pids"
    v2_dir(cg, controllers="cpuset cpu io memory pids", subtree="cpuset cpu io memory pids")
    v2_dir(cg / "system.slice", "", "0-31", controllers=ctl, subtree=ctl)
    scope = cg / V2_SCOPE
    v2_dir(scope, "", "0-31", controllers=ctl, subtree=ctl)
    v2_dir(scope / "system", "", "0-31", procs=(3999,), controllers=ctl)
    for job_id, names in dirs.items():
        cpus = SLURM_26_CPUS[job_id]
        script = 4000 + 10 * job_id
        for name in (names,) if isinstance(names, str) else names:
            job = scope / name
            v2_dir(job, cpus, cpus, controllers=ctl, subtree=ctl)
            step = job / "step_batch"
            v2_dir(step, "", cpus, controllers=ctl, subtree=ctl)
            v2_dir(step / "slurm", "", cpus, (script - 1,), controllers=ctl)
            v2_dir(step / "user", cpus, cpus, controllers=ctl, subtree=ctl)
            v2_dir(step / "user/task_0", "", cpus, (script,), controllers=ctl)
            if task_special:
                v2_dir(step / "user/task_special", "", cpus, controllers=ctl)
        proc_thread(base, script, "job.sh", 0, 0)
    return CgroupFixture(base)


def build_no_slurm(base: Path, kind: str) -> CgroupFixture:
    """(d) no Slurm tree: ``v1`` (cpuset empty), ``v1-freezer-only`` (ConstrainCores=no),
    ``v2`` (pure v2, no slurmstepd.scope) or ``none`` (no cgroup filesystem)."""
    mounts = {
        "v1": MOUNTS_V1_SPLIT,
        "v1-freezer-only": MOUNTS_V1_SPLIT,
        "v2": MOUNTS_V2,
        "none": "proc /proc proc rw 0 0\n",
    }[kind]
    put(base / "proc/self/mounts", mounts)
    cg = base / CGROUP
    if kind.startswith("v1"):
        v1_cpuset(cg / "cpuset", "0-1")
        v1_cpu(cg / "cpu")
        (cg / "unified").mkdir()
    if kind == "v1-freezer-only":
        put(cg / "freezer/slurm/uid_0/job_5/step_batch/tasks", "500\n")
    if kind == "v2":
        v2_dir(cg, controllers="cpuset cpu memory pids", subtree="memory pids")
        v2_dir(cg / "system.slice", controllers="memory pids")
    return CgroupFixture(base)


# --------------------------------------------------------------------------------------------


class FakeKernel:
    """The kernel's answers the tests depend on, over plain files (pass its methods to writers).

    - pid files (``tasks``, ``cgroup.procs``): a write moves the thread out of every other
      cgroup of the hierarchy (ESRCH if /proc/<tid> is absent) and updates /proc/<tid>/cgroup;
    - v1 ``cpuset.cpus``: EACCES if not within the parent's, EBUSY if a child holds CPUs outside
      the new list, ENOSPC if empty while it has tasks; a zero-length write changes nothing;
    - v2 ``cgroup.subtree_control`` "+cpu": each child gets ``cpu.max``;
    - mkdir populates the hierarchy's control files; rmdir fails with EBUSY while tasks or
      child cgroups remain;
    - ``fail[path] = errno`` makes a write to ``path`` fail with that errno.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.fail: dict[Path, int] = {}
        self.mounts: list[tuple[Path, str, frozenset[str]]] = []
        for line in (base / "proc/self/mounts").read_text().splitlines():
            _, point, fs_type, options = line.split()[:4]
            if fs_type in ("cgroup", "cgroup2"):
                opts = frozenset(options.split(","))
                self.mounts.append((base / point.lstrip("/"), fs_type, opts))
        # longest mount point first, so /sys/fs/cgroup/cpuset wins over /sys/fs/cgroup
        self.mounts.sort(key=lambda m: len(m[0].parts), reverse=True)

    def _mount_of(self, path: Path) -> tuple[Path, str, frozenset[str]]:
        for mount in self.mounts:
            if path == mount[0] or mount[0] in path.parents:
                return mount
        raise AssertionError(f"{path} is on no cgroup mount")

    @staticmethod
    def _raise(err_no: int, path: Path) -> None:
        raise OSError(err_no, os.strerror(err_no), str(path))

    def write_file(self, path: Path, data: bytes) -> None:
        if path in self.fail:
            self._raise(self.fail[path], path)
        if not path.is_file():
            self._raise(errno.ENOENT, path)
        if not data:
            return
        text = data.decode().strip()
        mount, fs_type, options = self._mount_of(path)
        if path.name in _PID_FILES:
            self._move(int(text), path, mount, fs_type, options)
        elif path.name == "cpuset.cpus" and fs_type == "cgroup":
            self._check_v1_cpuset(path, parse_cpulist(text), mount)
            path.write_text(format_cpulist(parse_cpulist(text)) + "\n")
        elif path.name == "cgroup.subtree_control":
            self._subtree_control(path, text)
        else:
            path.write_text(text + "\n")

    def _check_v1_cpuset(self, path: Path, cpus: frozenset[int], mount: Path) -> None:
        d = path.parent
        if d != mount and not cpus <= parse_cpulist((d.parent / "cpuset.cpus").read_text()):
            self._raise(errno.EACCES, path)
        for child in d.iterdir():
            if child.is_dir() and not parse_cpulist((child / "cpuset.cpus").read_text()) <= cpus:
                self._raise(errno.EBUSY, path)
        if not cpus and (d / "tasks").read_text().split():
            self._raise(errno.ENOSPC, path)

    def _move(
        self, tid: int, path: Path, mount: Path, fs_type: str, options: frozenset[str]
    ) -> None:
        proc = self.base / "proc" / str(tid)
        if not proc.is_dir():
            self._raise(errno.ESRCH, path)
        for name in _PID_FILES:
            for other in mount.rglob(name):
                pids = other.read_text().split()
                if str(tid) in pids:
                    other.write_text(_lines(tuple(int(p) for p in pids if p != str(tid))))
        path.write_text(path.read_text() + f"{tid}\n")
        where = "/" + path.parent.relative_to(mount).as_posix().lstrip(".")
        cgroup_file = proc / "cgroup"
        lines = cgroup_file.read_text().splitlines() if cgroup_file.exists() else []
        controllers = set() if fs_type == "cgroup2" else options & {"cpu", "cpuacct", "cpuset"}
        out = []
        for line in lines:
            num, ctrl, _ = line.split(":", 2)
            mine = set(ctrl.split(",")) == controllers if controllers else ctrl == ""
            out.append(f"{num}:{ctrl}:{where}" if mine else line)
        cgroup_file.write_text("".join(f"{line}\n" for line in out))

    def _subtree_control(self, path: Path, text: str) -> None:
        d = path.parent
        enabled = path.read_text().split()
        available = (d / "cgroup.controllers").read_text().split()
        for token in text.split():
            name = token[1:]
            if name not in available:
                self._raise(errno.ENOENT, path)
            if token.startswith("+") and name not in enabled:
                enabled.append(name)
                for child in d.iterdir():
                    if child.is_dir():
                        ctl = child / "cgroup.controllers"
                        ctl.write_text(" ".join([*ctl.read_text().split(), name]) + "\n")
                        if name == "cpu" and not (child / "cpu.max").exists():
                            (child / "cpu.max").write_text("max 100000\n")
            elif token.startswith("-") and name in enabled:
                enabled.remove(name)
        path.write_text(" ".join(enabled) + "\n")

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)
        _, fs_type, options = self._mount_of(path)
        put(path / "tasks", "")
        put(path / "cgroup.procs", "")
        if fs_type == "cgroup" and "cpu" in options:
            put(path / "cpu.cfs_period_us", "100000\n")
            put(path / "cpu.cfs_quota_us", "-1\n")
        if fs_type == "cgroup" and "cpuset" in options:
            put(path / "cpuset.cpus", "\n")
            put(path / "cpuset.mems", "\n")

    def rmdir(self, path: Path) -> None:
        if not path.is_dir():
            self._raise(errno.ENOENT, path)
        for entry in path.iterdir():
            if entry.is_dir() or (entry.name in _PID_FILES and entry.read_text().split()):
                self._raise(errno.EBUSY, path)
        shutil.rmtree(path)
