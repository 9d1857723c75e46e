"""What a confined or multi-node dev cluster holds of the host: the one slot such a cluster
takes (its cgroup v1 trees, bridge and namespace names are host-wide), and the job processes
and cgroup trees a cluster leaves behind, found and ended."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from slurm_plugin.devtools.layout import CTLD_ENV, STATE_FILE, DevClusterError
from slurm_plugin.devtools.procs import pid_alive, reap, stop_pid

__all__ = [
    "CGROUP_SLOT",
    "CGROUP_SLOT_WAIT_S",
    "cgroup_slot_holder",
    "cgroup_tasks",
    "controller_pids",
    "job_processes",
    "kill_cgroup_jobs",
    "kill_job_processes",
    "release_cgroup_slot",
    "stop_leftovers",
    "take_cgroup_slot",
]

CGROUP_V1 = Path("/sys/fs/cgroup")


def _cgroup_trees() -> list[Path]:
    """Every dev cluster node's v1 tree (``slurm_gpuNN``), of this cluster or one that was
    never stopped: the host's slot says no other dev cluster owns them."""
    return [p for p in CGROUP_V1.glob("*/slurm_gpu[0-9][0-9]") if p.is_dir()]


def _cgroup_dirs(tree: Path) -> list[Path]:
    """``tree`` and every directory under it, deepest first. Job cgroups vanish while they
    are walked (slurmstepd removes them as jobs end): os.walk skips what it cannot list,
    where Path.rglob (Python 3.11) raises FileNotFoundError."""
    dirs = [Path(top) for top, _, _ in os.walk(tree)]
    return sorted(dirs, key=lambda p: -len(p.parts))


def cgroup_tasks() -> set[int]:
    pids: set[int] = set()
    for tree in _cgroup_trees():
        for d in _cgroup_dirs(tree):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "tasks").read_text().split())
    return pids


def kill_cgroup_jobs() -> None:
    """Kill what is left in the confined dev cluster's cgroup tree and remove the tree."""
    deadline = time.monotonic() + 10
    while (pids := cgroup_tasks()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for tree in _cgroup_trees():
        for d in _cgroup_dirs(tree):  # the tree itself last
            with contextlib.suppress(OSError):
                d.rmdir()


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def job_processes(slurm_conf: Path) -> set[int]:
    """The processes of this cluster's jobs: its slurmstepds (started by its slurmd, with
    its ``SLURM_CONF``), everything below them, and job processes that left their tree
    (``SLURM_JOB_ID`` set, this ``SLURM_CONF``). An admin's shell that exported the
    cluster's ``SLURM_CONF`` is neither."""
    conf = str(slurm_conf)
    children: dict[int, list[int]] = {}
    parent: dict[int, int] = {}
    stepds: set[int] = set()
    roots: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdecimal():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 2 or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(pid)
        parent[pid] = int(fields[1])
        if cmdline.startswith(b"slurmstepd"):
            stepds.add(pid)
        env = _environ(pid)
        if env.get("SLURM_CONF") != conf:
            continue
        if cmdline.startswith(b"slurmstepd") or "SLURM_JOB_ID" in env:
            roots.add(pid)
    # From 24.11 slurmstepd no longer carries SLURM_CONF: it is the slurmstepd whose child
    # is one of this cluster's job processes.
    roots |= {parent[pid] for pid in roots if parent.get(pid) in stepds}
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    found.discard(os.getpid())
    return found


def controller_pids(slurm_conf: Path, env_key: str = CTLD_ENV) -> dict[str, int]:
    """The slurmctlds of a high-availability cluster (``slurm_conf``) by controller name:
    the processes whose environment names one (``env_key``, set when the dev cluster started
    it and inherited by the process ``scontrol reconfigure`` starts in its place) and whose
    command line reads a slurm.conf beside ``slurm_conf``."""
    etc = os.fsencode(str(slurm_conf.parent) + "/")
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdecimal():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if not cmdline.startswith(b"slurmctld") or etc not in cmdline:
            continue
        env = _environ(int(entry.name))
        if env.get(env_key) and pid_alive(int(entry.name)):
            found[env[env_key]] = int(entry.name)
    return found


def kill_job_processes(slurm_conf: Path) -> None:
    """SIGKILL every process of this cluster's jobs (:func:`job_processes`)."""
    deadline = time.monotonic() + 10
    while (pids := job_processes(slurm_conf)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        for pid in pids:
            reap(pid)


CGROUP_SLOT = Path(os.environ.get("CODA_CGROUP_SLOT", "/dev/shm/coda-dev-cluster-cgroups"))
"""Who holds the host's one confined-cluster slot: ``<pid> <root>``.  /dev/shm is shared
with the test roots (their /dev is the host's), so a cluster there waits for ours."""
CGROUP_SLOT_WAIT_S = float(os.environ.get("CODA_CGROUP_SLOT_WAIT_S", "900"))


def take_cgroup_slot(root: Path) -> None:
    """Claim the confined-cluster slot for ``root``; wait while a live process holds it."""
    deadline = time.monotonic() + CGROUP_SLOT_WAIT_S
    mine = f"{os.getpid()} {root}"
    while True:
        try:
            fd = os.open(CGROUP_SLOT, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = CGROUP_SLOT.read_text()
            except FileNotFoundError:
                continue
            pid_text, _, held_root = holder.partition(" ")
            if held_root == str(root) or not pid_text.isdigit() or not pid_alive(int(pid_text)):
                if held_root and held_root != str(root):
                    stop_leftovers(Path(held_root))
                with contextlib.suppress(FileNotFoundError):
                    CGROUP_SLOT.unlink()  # ours from before, or its holder is gone
                continue
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"another confined dev cluster holds {CGROUP_SLOT}",
                    f"pid {pid_text}, cluster {held_root}; stop it or remove the file",
                ) from None
            time.sleep(1.0)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        return


def stop_leftovers(root: Path) -> None:
    """Stop what the cluster in ``root`` left running when it was never stopped: its slurmd
    and coda-node outlive a crashed slurmctld, and would act on the next cluster's node
    trees.  Only processes whose command line names ``root`` (a pid may have been reused)."""
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return
    for pid in state.get("pids", {}).values():
        try:
            cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if os.fsencode(str(root)) in cmdline:
            stop_pid(int(pid))
    for pid in controller_pids(root / "etc" / "slurm.conf").values():
        stop_pid(pid)
    kill_job_processes(root / "etc" / "slurm.conf")


def cgroup_slot_holder() -> tuple[int, str] | None:
    """(pid, cluster root) of the live process holding the confined-cluster slot."""
    try:
        pid_text, _, held_root = CGROUP_SLOT.read_text().partition(" ")
    except OSError:
        return None
    if not pid_text.isdigit() or not pid_alive(int(pid_text)):
        return None
    return int(pid_text), held_root


def release_cgroup_slot(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        if CGROUP_SLOT.read_text().partition(" ")[2] == str(root):
            CGROUP_SLOT.unlink()
