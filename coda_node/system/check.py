"""``coda-node check``: which node capabilities are usable here, and why not. The probes of
what the enforcement mechanisms need are here too; each mechanism's ``probe`` calls its own
(:mod:`coda_node.enforce.mechanisms`).

Missing hardware is a state, not a crash: every probe returns a :class:`Capability`
with a reason an admin can act on. Probes only read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from coda_node.system.capability import Capability
from coda_node.system.paths import SystemRoot

if TYPE_CHECKING:
    from coda_node.system.nvml import Nvml
    from coda_node.system.slurmjobs import Runner


def _mounts(root: SystemRoot) -> list[tuple[str, str, str, str]]:
    """(device, mount point, fs type, options) from /proc/self/mounts."""
    try:
        text = root.path("/proc/self/mounts").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[0], parts[1], parts[2], parts[3]))
    return out


def _cgroup_mounts(root: SystemRoot) -> tuple[list[str], set[str]]:
    """The cgroup v2 mount points, and the controllers mounted on cgroup v1."""
    mounts = _mounts(root)
    v2 = [m[1] for m in mounts if m[2] == "cgroup2"]
    v1 = {opt for m in mounts if m[2] == "cgroup" for opt in m[3].split(",")}
    return v2, v1


def probe_cpuset_control(root: SystemRoot) -> Capability:
    """Whether a job's cpuset can be changed: the cgroup cpuset controller."""
    v2, v1 = _cgroup_mounts(root)
    if "cpuset" in v1:
        return Capability("cpuset control", True, "cgroup v1 cpuset controller mounted")
    if not v2:
        return Capability("cpuset control", False, "no cgroup cpuset controller mounted")
    try:
        have = root.path(v2[0] + "/cgroup.controllers").read_text().split()
    except OSError:
        have = []
    ok = "cpuset" in have
    return Capability(
        "cpuset control",
        ok,
        "cgroup v2, cpuset controller " + ("enabled" if ok else "not enabled at the root"),
    )


def probe_cpu_quota(root: SystemRoot) -> Capability:
    """Whether a job's CPU time can be capped: the cgroup cpu controller."""
    v2, v1 = _cgroup_mounts(root)
    if "cpu" in v1 or v2:
        where = "v1 cpu" if "cpu" in v1 else "v2"
        return Capability("CPU quota", True, f"cgroup {where} controller")
    return Capability("CPU quota", False, "no cgroup cpu controller mounted")


def probe_slurm_tree(root: SystemRoot, node_name: str | None = None) -> Capability:
    from coda_node.system.cgroups import discover_layout

    layout = discover_layout(root, node_name)
    if layout.has_slurm:
        where = ", ".join(str(p) for p in layout.slurm_dirs)
        return Capability("Slurm job cgroups", True, f"cgroup v{layout.version}: {where}")
    return Capability(
        "Slurm job cgroups",
        False,
        f"{layout.reason or 'none found'}; without them coda-node observes but changes nothing "
        "(cgroup.conf ConstrainCores=yes and TaskPlugin=task/cgroup create them)",
    )


def probe_slurm_jobs(root: SystemRoot, node_name: str, runner: Runner) -> Capability:
    """Whether coda-node sees the jobs Slurm runs on ``node_name``: every directory under
    Slurm's v2 scope is a job it can name (``job_<id>``, or a SLUID that Slurm's record
    names), and the tree holds jobs whenever ``squeue`` lists running ones here. Either
    failing is a problem, not an idle node."""
    from coda_node.system.cgroups import discover_layout, scan_jobs
    from coda_node.system.slurmjobs import SlurmJobs, SlurmQueryError

    name = "Slurm jobs seen"
    layout = discover_layout(root, node_name)
    slurm = SlurmJobs(node_name, runner)
    try:
        running = slurm.on_node(states="R")
    except SlurmQueryError as exc:
        return Capability(name, False, f"cannot ask squeue for this node's jobs ({exc})")
    if not layout.has_slurm:
        if running:
            detail = (
                f"squeue lists running job(s) {_ids(running)} on {node_name}, but there is "
                f"no Slurm cgroup tree ({layout.reason}): coda-node observes them only"
            )
            return Capability(name, False, detail)
        return Capability(name, True, f"no job runs on {node_name}")
    scan = scan_jobs(layout, detail=lambda _job: "cpus", resolve=slurm.job_ids_of_dirs)
    problems = [f"{d.path} is no job coda-node can name ({d.why})" for d in scan.unattributed]
    problems += [f"job {j}: cannot read its cgroup ({why})" for j, why in scan.unreadable.items()]
    if slurm.sluid_error:
        problems.append(slurm.sluid_error)
    if running and not (scan.jobs or scan.unreadable):
        where = ", ".join(map(str, layout.slurm_dirs))
        problems.append(
            f"squeue lists running job(s) {_ids(running)} on {node_name}, but Slurm's cgroup "
            f"tree ({where}) holds no job: coda-node cannot see or change them"
        )
    if problems:
        return Capability(name, False, "; ".join(problems), problem=True)
    if not scan.jobs:
        return Capability(name, True, f"no job runs on {node_name}")
    found = ", ".join(f"{j} ({job.path.name})" for j, job in sorted(scan.jobs.items()))
    return Capability(name, True, f"job(s) {found} in cgroup v{layout.version}")


def _ids(job_ids: set[int]) -> str:
    return ", ".join(map(str, sorted(job_ids)))


def probe_resctrl(root: SystemRoot) -> list[Capability]:
    from coda_node.system.resctrl import discover

    info = discover(root)
    if not info.mounted or not info.usable:
        why = info.reason or "resctrl unusable"
        return [
            Capability("memory-bandwidth control", False, f"Intel RDT MBA: {why}"),
            Capability("cache allocation", False, f"Intel RDT CAT: {why}"),
            Capability("memory-bandwidth monitoring", False, f"Intel RDT MBM: {why}"),
        ]
    rows = []
    if info.mb is not None:
        unit = "MBps (mba_MBps)" if info.mb.mba_mbps else "percent"
        rows.append(
            Capability(
                "memory-bandwidth control",
                True,
                f"resctrl MB in {unit}, steps of {info.mb.bandwidth_gran} from "
                f"{info.mb.min_bandwidth}; {info.max_ctrl_groups} control groups free by "
                f"design (num_closids={info.num_closids})",
            )
        )
    else:
        rows.append(
            Capability("memory-bandwidth control", False, info.mb_reason or "no MB resource")
        )
    if info.l3 is not None:
        rows.append(
            Capability(
                "cache allocation",
                True,
                f"resctrl L3, {info.l3.cbm_bits} ways (cbm_mask {info.l3.cbm_mask:x}), at least "
                f"{info.l3.min_cbm_bits} per group",
            )
        )
    else:
        rows.append(Capability("cache allocation", False, info.l3_reason or "no L3 resource"))
    if info.mbm and info.mon is not None:
        rows.append(
            Capability(
                "memory-bandwidth monitoring",
                True,
                f"resctrl L3_MON, {info.mon.num_rmids} RMIDs: " + ", ".join(info.mon.mon_features),
            )
        )
    else:
        rows.append(
            Capability("memory-bandwidth monitoring", False, info.mbm_reason or "no MBM events")
        )
    return rows


def probe_uncore(root: SystemRoot) -> list[Capability]:
    from coda_node.system.perf import probe_perf

    return probe_perf(root)


def probe_gpus(root: SystemRoot, nvml: Nvml | None = None) -> Capability:
    """``nvml``: the daemon's own handle (one choke point); None opens and closes one."""
    from coda_node.system.nvml import Nvml

    devs = sorted(p.name for p in root.dev.glob("nvidia[0-9]*"))
    if nvml is not None:
        st = nvml.status()
    else:
        own = Nvml()
        try:
            st = own.status()
        finally:
            own.shutdown()
    detail = st.detail
    if not st.available:
        detail += f"; /dev/nvidia* device nodes: {len(devs)}"
    return Capability("GPUs (NVML)", st.available and st.gpu_count > 0, detail)


def probe_slurm_commands(env: dict[str, str] | None = None) -> Capability:
    """``scontrol ping``: can this node ask slurmctld about its jobs?"""
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        return Capability("Slurm commands", False, "scontrol not found on PATH (slurm-client)")
    try:
        proc = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=10, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Capability("Slurm commands", False, f"scontrol ping failed ({exc})")
    text = (proc.stdout or proc.stderr).strip().splitlines()
    first = text[0] if text else f"exit {proc.returncode}"
    ok = proc.returncode == 0 and "UP" in first
    return Capability("Slurm commands", ok, first if ok else f"slurmctld unreachable: {first}")


def probe_all(
    root: SystemRoot,
    *,
    cgroup_limits: Sequence[Capability] = (),
    limits: Sequence[Capability] = (),
    slurm: bool = True,
    env: dict[str, str] | None = None,
    nvml: Nvml | None = None,
    node_name: str | None = None,
) -> list[Capability]:
    """Every capability row: ``cgroup_limits`` (the rows of the enforcement mechanisms that
    limit a job through its Slurm cgroups), the Slurm tree's, ``limits`` (the other
    mechanisms' rows), then what the node measures with; ``slurm=False`` skips asking
    slurmctld (fixture trees); ``nvml``: the daemon's NVML handle, so the GPU row says what
    the daemon sees; ``node_name``: only this node's Slurm tree
    (:func:`coda_node.system.cgroups.discover_layout`)."""
    rows = [
        *cgroup_limits,
        probe_slurm_tree(root, node_name),
        *limits,
        *probe_uncore(root),
        probe_gpus(root, nvml),
    ]
    if slurm:
        rows.append(probe_slurm_commands(env))
    return rows
