"""coda-node on a real cgroup v2 node: Slurm's cgroup/v2 plugin, real jobs, systemd.

These tests run inside the QEMU guest of tests/cgroup-v2-guest, once per configuration:
each supported Slurm (its Debian root, coda's packages installed there) with its slurmd
started by the guest's systemd (``CgroupPlugin=cgroup/v2``, ``ConstrainCores``), 26.05 with
``CgroupJobIdPaths`` no and yes, with ``IgnoreSystemd=yes`` and slurmd started by hand, and
with two slurmd on one node; ``bash scripts/test -m cgroup_v2_node`` boots it and runs them
there.  Elsewhere they skip with the reason.  Slurm's tree on such a node, for one batch
job (beside the jobs the scope holds Slurm's ``system/``, and ``slurmd/`` where slurmd was
started without systemd)::

    /sys/fs/cgroup/system.slice/<node>_slurmstepd.scope/job_<id>/   cpuset.cpus = allocation
        step_batch/                  cpuset.cpus empty (inherits)
            slurm/                   slurmstepd
            user/                    cpuset.cpus = allocation
                task_0/              the job's processes

From Slurm 26.05 the job's directory is its SLUID (``sEF9M8HXW6TK00/``) unless cgroup.conf
sets ``CgroupJobIdPaths=yes``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import coda_node.progress_client
from coda_common.config.codaconf import load_config
from coda_common.store.profiles import ProfileStore
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import Limit, StateFile, save_limits
from coda_node.system import cgroups
from coda_node.system.paths import SystemRoot

pytestmark = pytest.mark.cgroup_v2_node

NODE = os.environ.get("CODA_GUEST_NODE") or "coda-v2"
OTHER_NODE = os.environ.get("CODA_GUEST_OTHER_NODE") or None
"""A second slurmd on this node (multiple-slurmd), whose jobs coda-node for NODE leaves."""
ROOT = os.environ.get("CODA_GUEST_ROOT") or None
"""Where the guest's systemd finds this Slurm's root (it runs slurmd there)."""
NODE_TOOL = ["chroot", "/proc/1/root"] if ROOT else []
"""How the node's own systemctl and journalctl run: the guest's, outside this Slurm's root
(which may have no systemd of its own)."""
TREE_ONLY = os.environ.get("CODA_GUEST_TESTS") == "tree"
"""A configuration that differs from another of its Slurm only in how Slurm makes its tree
(``IgnoreSystemd=yes``, several slurmd): only the tests of how coda-node finds and changes
the tree run there; the daemon's lifecycle runs in the other."""
lifecycle = pytest.mark.skipif(
    TREE_ONLY, reason="the daemon's lifecycle runs in this Slurm's default configuration"
)
SLURM_CONF = Path("/etc/slurm/slurm.conf")
CODA_CONF = SLURM_CONF.with_name("coda.conf")
STATE_DIR = Path("/var/lib/coda-node-test")
RUN_DIR = Path("/run/coda-node-test")
SCOPE = Path(f"/sys/fs/cgroup/system.slice/{NODE}_slurmstepd.scope")
SLEEP = "#!/bin/bash\nsleep 600\n"
BUSY = "#!/bin/bash\nwhile :; do :; done\n"


def _guest_reason() -> str | None:
    if os.environ.get("CODA_CGROUP_V2_NODE") != "1":
        return "runs in the cgroup v2 guest: bash scripts/test -m cgroup_v2_node"
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "/sys/fs/cgroup is not the unified cgroup v2 hierarchy"
    return None


@pytest.fixture(scope="module")
def node() -> Iterator[None]:
    reason = _guest_reason()
    if reason:
        pytest.skip(reason)
    CODA_CONF.write_text(
        f"NodeName={NODE}\nNodeStateDir={STATE_DIR}\nNodeRuntimeDir={RUN_DIR}\n"
        f"NodeProgressDir={RUN_DIR / 'progress'}\nNodeIntervalS=1\n"
        f"ProfileStore={STATE_DIR / 'profiles'}\n"
        # The online profiler's probe, shortened so that one job is profiled in a test.
        "NodeProbeWarmupS=2\nNodeProbeSettleS=1\nNodeProbeMeasureS=4.5\n"
    )
    yield


@pytest.fixture
def clean(node: None) -> Iterator[None]:
    """No job, no limit and no state left from another test."""
    yield
    subprocess.run(["scancel", "-u", "root"], check=False)
    _wait(lambda: not _squeue(), "jobs to end")
    save_limits(STATE_DIR, {})
    # What `coda-node restore` does, in this process: a new one costs seconds under emulation.
    daemon = Daemon(load_config(CODA_CONF))
    daemon.start(put_back=True)
    daemon.restore()


# Under software emulation Python starts in seconds, not milliseconds: wait generously.
WAIT_S = 240.0


def _wait(pred, what: str, timeout_s: float = WAIT_S, detail=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.25)
    more = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out waiting for {what}{more}")


def _squeue() -> set[int]:
    out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def _node_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coda_node.cli", *args, "--conf", str(CODA_CONF)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _read(path: Path) -> str:
    return path.read_text().strip()


def _slurm_version() -> tuple[int, int]:
    out = subprocess.run(["scontrol", "--version"], capture_output=True, text=True).stdout
    major, minor = re.search(r"(\d+)\.(\d+)", out).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


@functools.cache
def _dirs_named_by_sluid() -> bool:
    """Whether Slurm names each job's directory by its SLUID: 26.05 on, unless cgroup.conf
    sets ``CgroupJobIdPaths=yes`` (cgroup.conf(5))."""
    conf = SLURM_CONF.with_name("cgroup.conf").read_text()
    ids = re.search(r"^\s*CgroupJobIdPaths\s*=\s*(\S+)", conf, re.M | re.I)
    return _slurm_version() >= (26, 5) and not (ids and ids.group(1).lower() == "yes")


def _sluid(job_id: int) -> str:
    out = subprocess.run(
        ["scontrol", "-d", "show", "job", str(job_id)], capture_output=True, text=True
    ).stdout
    found = re.search(r"\bSLUID=(\S+)", out)
    assert found, f"scontrol shows no SLUID for job {job_id}:\n{out}"
    return found.group(1)


_JOB_DIRS: dict[int, Path] = {}


def _job_dir(job_id: int, scope: Path = SCOPE) -> Path:
    """The job's directory, named as Slurm names it (its SLUID, or job_<id>)."""
    if job_id not in _JOB_DIRS:
        name = _sluid(job_id) if _dirs_named_by_sluid() else f"job_{job_id}"
        _JOB_DIRS[job_id] = scope / name
    return _JOB_DIRS[job_id]


def _task_pids(job_id: int, scope: Path = SCOPE) -> list[int]:
    pids: list[int] = []
    for procs in _job_dir(job_id, scope).glob("step_batch/user/task_*/cgroup.procs"):
        try:
            text = procs.read_text()
        except OSError:  # slurmstepd removes its transient task_special cgroup: ENOENT/ENODEV
            continue
        pids.extend(int(p) for p in text.split())
    return pids


def _allowed(pid: int) -> str:
    text = Path(f"/proc/{pid}/status").read_text()
    return re.search(r"^Cpus_allowed_list:\s*(\S+)", text, re.M).group(1)  # type: ignore[union-attr]


def _start(
    args: list[str], script: str = SLEEP, *, wait: bool = True, scope: Path = SCOPE
) -> tuple[int, list[int]]:
    """Submit; wait until the batch script runs in its cgroup (squeue says RUNNING before
    the cgroup has processes)."""
    proc = subprocess.run(
        # The checkout is read-only in the guest: the job works and writes in /tmp.
        ["sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args],
        input=script,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    if not wait:
        return job_id, []
    pids = _wait(lambda: _task_pids(job_id, scope), f"job {job_id} to run in its cgroup")
    return job_id, pids


def _daemon() -> Daemon:
    d = Daemon(load_config(CODA_CONF))
    d.start()
    return d


def _cpu_rate(job_id: int, seconds: float) -> float:
    """Cores' worth of CPU the job used over ``seconds`` (cpu.stat usage_usec)."""

    def usage_us() -> int:
        text = (_job_dir(job_id) / "cpu.stat").read_text()
        return int(re.search(r"^usage_usec (\d+)", text, re.M).group(1))  # type: ignore[union-attr]

    t0, u0 = time.monotonic(), usage_us()
    time.sleep(seconds)
    t1, u1 = time.monotonic(), usage_us()
    return (u1 - u0) / 1e6 / (t1 - t0)


def test_the_tree_is_slurms_cgroup_v2_layout(clean: None) -> None:
    job_id, pids = _start(["-c2"])
    job = _job_dir(job_id)
    # The directory is named as this Slurm and cgroup.conf say, and only so.
    assert job.is_dir()
    assert (SCOPE / f"job_{job_id}").is_dir() == (not _dirs_named_by_sluid())
    assert _read(job / "cpuset.cpus") == "0-1"
    assert _read(job / "step_batch" / "user" / "cpuset.cpus") == "0-1"
    assert _read(job / "step_batch" / "cpuset.cpus") == ""
    assert _read(job / "step_batch" / "user" / "task_0" / "cpuset.cpus.effective") == "0-1"
    assert "cpu" in _read(SCOPE / "cgroup.subtree_control").split()
    assert {_allowed(p) for p in pids} == {"0-1"}


def test_daemon_sees_each_job_with_the_cores_slurm_gave_it(clean: None) -> None:
    sleeper, _ = _start(["-c2", "-J", "train"])
    busy, _ = _start(["-c1", "-J", "etl"], BUSY)
    assert cgroups.discover_layout(SystemRoot(Path("/"))).version == 2
    daemon = _daemon()
    daemon.tick()
    time.sleep(1.5)
    report = daemon.tick()
    jobs = report.snapshot.jobs
    assert report.snapshot.errors == ()
    assert set(jobs) == _squeue() == {sleeper, busy}
    for job_id in (sleeper, busy):
        held = cgroups.parse_cpulist(_read(_job_dir(job_id) / "cpuset.cpus"))
        assert jobs[job_id].cpus_now == held
        assert jobs[job_id].cpus_now == jobs[job_id].slurm.cpu_ids  # type: ignore[union-attr]
    assert jobs[busy].cpu_rate_cores is not None and jobs[busy].cpu_rate_cores > 0.5
    assert jobs[sleeper].cpu_rate_cores is not None and jobs[sleeper].cpu_rate_cores < 0.2
    # `coda-node check` finds the same jobs in the same directories, and no problem.
    check = _node_cli("check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    rows = {row["name"]: row for row in json.loads(check.stdout)}
    named = ", ".join(f"{j} ({_job_dir(j).name})" for j in sorted((sleeper, busy)))
    assert rows["Slurm jobs seen"]["detail"] == f"job(s) {named} in cgroup v2"


def test_slimmed_and_restored_down_to_every_task(clean: None) -> None:
    job_id, pids = _start(["-c2"])
    daemon = _daemon()
    save_limits(STATE_DIR, {job_id: Limit(cores=1, reason="test")})
    report = daemon.tick()
    assert report.results[job_id].applied == ["cpuset 0"]
    task = _job_dir(job_id) / "step_batch" / "user" / "task_0"
    assert _read(task / "cpuset.cpus.effective") == "0"
    assert {_allowed(p) for p in pids} == {"0"}
    assert daemon.tick().results[job_id].applied == []  # only differences are written
    save_limits(STATE_DIR, {})
    assert daemon.tick().results[job_id].applied == ["cpuset restored to 0-1"]
    assert _read(_job_dir(job_id) / "cpuset.cpus") == "0-1"
    assert _read(_job_dir(job_id) / "step_batch" / "user" / "cpuset.cpus") == "0-1"
    assert _read(task / "cpuset.cpus.effective") == "0-1"
    assert {_allowed(p) for p in pids} == {"0-1"}
    assert StateFile(STATE_DIR).load().changes == {}


@lifecycle
def test_a_new_step_resets_the_job_cpuset_and_the_daemon_slims_it_again(clean: None) -> None:
    job_id, pids = _start(["-c2"])
    daemon = _daemon()
    save_limits(STATE_DIR, {job_id: Limit(cores=1)})
    daemon.tick()
    assert {_allowed(p) for p in pids} == {"0"}
    # slurmstepd of a new step writes Slurm's allocation back into the job's cpuset.
    step = subprocess.Popen(
        ["srun", f"--jobid={job_id}", "--overlap", "-n1", "-c1", "sleep", "30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: (_job_dir(job_id) / "step_0").is_dir(), "the new step")
        time.sleep(1.0)
        daemon.tick()
        assert _read(_job_dir(job_id) / "cpuset.cpus") == "0"
        assert {_allowed(p) for p in pids} == {"0"}
    finally:
        step.kill()
        step.wait(timeout=10)


def test_cpu_quota_caps_a_busy_job_and_release_frees_it(clean: None) -> None:
    job_id, _ = _start(["-c1"], BUSY)
    daemon = _daemon()
    daemon.tick()
    assert _cpu_rate(job_id, 2.0) > 0.6
    save_limits(STATE_DIR, {job_id: Limit(quota_cores=0.25)})
    assert daemon.tick().results[job_id].applied == ["cpu quota 0.25 cores"]
    assert _read(_job_dir(job_id) / "cpu.max").split()[0] == "25000"
    capped = _cpu_rate(job_id, 3.0)
    assert 0.1 < capped < 0.4, capped
    save_limits(STATE_DIR, {})
    assert daemon.tick().results[job_id].applied == ["cpu quota released"]
    assert _read(_job_dir(job_id) / "cpu.max").split()[0] == "max"
    assert _cpu_rate(job_id, 2.0) > 0.6


@pytest.mark.skipif(OTHER_NODE is None, reason="one slurmd on this node (no multiple-slurmd)")
def test_a_second_slurmds_jobs_are_left_to_it(clean: None) -> None:
    assert OTHER_NODE is not None
    theirs_scope = SCOPE.with_name(f"{OTHER_NODE}_slurmstepd.scope")
    partition = subprocess.run(
        ["sinfo", "-h", "-N", "-n", OTHER_NODE, "-o", "%R"], capture_output=True, text=True
    ).stdout.split()[0]
    ours, _ = _start(["-c2"])
    theirs, their_pids = _start(["-c2", "-p", partition, "-w", OTHER_NODE], scope=theirs_scope)
    assert _job_dir(theirs, theirs_scope).parent == theirs_scope
    layout = cgroups.discover_layout(SystemRoot(Path("/")), NODE)
    assert layout.slurm_dirs == (SCOPE,)
    daemon = _daemon()
    save_limits(STATE_DIR, {ours: Limit(cores=1), theirs: Limit(cores=1)})
    report = daemon.tick()
    assert report.snapshot.errors == ()
    assert set(report.snapshot.jobs) == {ours}
    assert report.results[ours].applied == ["cpuset 0"]
    assert theirs not in report.results
    assert _read(_job_dir(theirs, theirs_scope) / "cpuset.cpus") == "0-1"
    assert {_allowed(p) for p in their_pids} == {"0-1"}
    check = _node_cli("check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    rows = {row["name"]: row for row in json.loads(check.stdout)}
    assert (
        rows["Slurm jobs seen"]["detail"] == f"job(s) {ours} ({_job_dir(ours).name}) in cgroup v2"
    )


def _daemon_process() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "coda_node.cli", "run", "--conf", str(CODA_CONF)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_then_restore_puts_the_job_back_as_slurm_set_it(clean: None) -> None:
    job_id, pids = _start(["-c2"])
    limited = _node_cli("limit", str(job_id), "--cores", "1", "--cpu-quota", "0.5")
    assert limited.returncode == 0, limited.stderr
    proc = _daemon_process()
    try:
        _wait(lambda: _read(_job_dir(job_id) / "cpuset.cpus") == "0", "the daemon to slim")
        _wait(lambda: _read(_job_dir(job_id) / "cpu.max").split()[0] != "max", "the daemon's quota")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert _read(_job_dir(job_id) / "cpuset.cpus") == "0"
    out = _node_cli("restore")
    assert out.returncode == 0, out.stderr
    assert f"restored 1 job(s) ({job_id})" in out.stdout
    assert _read(_job_dir(job_id) / "cpuset.cpus") == "0-1"
    assert _read(_job_dir(job_id) / "cpu.max").split()[0] == "max"
    assert {_allowed(p) for p in pids} == {"0-1"}


@lifecycle
def test_sigterm_restores_every_job(clean: None) -> None:
    job_id, pids = _start(["-c2"])
    save_limits(STATE_DIR, {job_id: Limit(cpus=(1,))})
    proc = _daemon_process()
    try:
        _wait(lambda: _read(_job_dir(job_id) / "cpuset.cpus") == "1", "the daemon to slim")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert _read(_job_dir(job_id) / "cpuset.cpus") == "0-1"
    assert {_allowed(p) for p in pids} == {"0-1"}


@lifecycle
def test_status_shows_the_jobs_squeue_shows(clean: None) -> None:
    first, _ = _start(["-c1"])
    second, _ = _start(["-c2"])
    proc = _daemon_process()
    try:
        view = RUN_DIR / "view.json"

        def both_seen() -> bool:
            try:
                jobs = json.loads(view.read_text())["view"]["jobs"]
            except (OSError, ValueError, KeyError):
                return False
            return {j["job_id"] for j in jobs} == {first, second}

        _wait(both_seen, "the daemon's view of both jobs", detail=lambda: view.read_text())
        status = _node_cli("status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        view_json = json.loads(status.stdout)
        assert view_json["node"]["cgroup_version"] == 2
        jobs = {j["job_id"]: j for j in view_json["jobs"]}
        assert set(jobs) == _squeue() == {first, second}
        for job_id in (first, second):
            assert jobs[job_id]["cpus_now"] == _read(_job_dir(job_id) / "cpuset.cpus")
        text = _node_cli("status")
        assert text.returncode == 0, text.stdout + text.stderr
        assert "cgroup v2" in text.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


UNIT = Path("/run/systemd/system/coda-node.service")


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NODE_TOOL, "systemctl", *args], capture_output=True, text=True, timeout=120
    )


def _unit() -> str:
    """The coda-node package's unit, run by the node's systemd in this Slurm's root
    (RootDirectory=), with the tests' coda.conf; a checkout's code on PYTHONPATH where the
    tests import that (CODA_GUEST_CODE=checkout)."""
    unit = Path("/usr/lib/systemd/system/coda-node.service").read_text()
    unit = unit.replace("Restart=on-failure", "Restart=no")
    unit = unit.replace("coda-node run", f"coda-node run --conf {CODA_CONF}")
    unit = unit.replace("coda-node restore", f"coda-node restore --conf {CODA_CONF}")
    service = []
    if ROOT:
        service.append(f"RootDirectory={ROOT}\nMountAPIVFS=no")
    code = Path(coda_node.progress_client.__file__).parent.parent
    if "dist-packages" not in code.parts:
        service.append(f"Environment=PYTHONPATH={code}")
    return unit.replace("[Service]\n", "[Service]\n" + "".join(f"{s}\n" for s in service), 1)


@lifecycle
def test_the_systemd_unit_restores_a_job_after_the_daemon_is_killed(clean: None) -> None:
    UNIT.write_text(_unit())
    assert _systemctl("daemon-reload").returncode == 0
    job_id, pids = _start(["-c2"])
    save_limits(STATE_DIR, {job_id: Limit(cores=1)})
    try:
        assert _systemctl("start", "coda-node").returncode == 0
        _wait(
            lambda: _read(_job_dir(job_id) / "cpuset.cpus") == "0",
            "the unit's daemon to slim",
            detail=lambda: _systemctl("status", "coda-node").stdout,
        )
        killed = _systemctl("kill", "--signal=SIGKILL", "--kill-who=main", "coda-node")
        assert killed.returncode == 0, killed.stderr

        def journal() -> str:
            return subprocess.run(
                [*NODE_TOOL, "journalctl", "-u", "coda-node", "--no-pager", "-o", "cat"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout

        # ExecStopPost runs `coda-node restore`: the job is back as Slurm set it.
        _wait(
            lambda: _read(_job_dir(job_id) / "cpuset.cpus") == "0-1",
            "the unit's restore",
            detail=lambda: _systemctl("status", "coda-node").stdout + journal(),
        )
        assert {_allowed(p) for p in pids} == {"0-1"}

        # What the daemon and the restore said reached the journal.
        _wait(lambda: f"restored 1 job(s) ({job_id})" in journal(), "the restore in the journal")
        text = journal()
        assert "status=9/KILL" in text, text
        assert f"job={job_id}" in text, text
    finally:
        _systemctl("stop", "coda-node")
        UNIT.unlink(missing_ok=True)
        _systemctl("daemon-reload")


# A pipelined trainer on the node's fake GPU: loader processes prepare batches on the CPU,
# the "GPU step" (a sleep) consumes them; it reports iterations with the shipped client.
TRAIN = """\
import multiprocessing as mp, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress_client import Progress

def loader(q):
    while True:
        sum(i * i for i in range(20000))
        q.put(1)

if __name__ == "__main__":
    q = mp.Queue(maxsize=16)
    mp.Process(target=loader, args=(q,), daemon=True).start()
    p = Progress(min_interval_s=0.2)
    while True:
        q.get()
        time.sleep(0.01)
        p.step()
"""


def _events(job_id: int) -> list[dict]:
    view = StateFile(STATE_DIR, RUN_DIR).load().view
    return [e for e in view.get("events", []) if e["job_id"] == job_id]


@lifecycle
def test_the_online_profiler_probes_a_gpu_job_inside_its_allocation(clean: None) -> None:
    work = Path("/tmp/coda-train")
    work.mkdir(exist_ok=True)
    shutil.copy(coda_node.progress_client.__file__, work / "progress_client.py")
    (work / "train.py").write_text(TRAIN)
    sig = "workload:0:loader1"
    job_id, _ = _start(
        ["--gpus=1", "-c2", "--hold", f"--export=ALL,CODA_PROGRESS_DIR={RUN_DIR / 'progress'}"],
        f"#!/bin/bash\nexec /usr/bin/python3 {work}/train.py\n",
        wait=False,
    )
    # The submit hook's record of an unknown workload, as an operator can set it.
    record = f"coda:sig={sig};cpg=;was=;action=skip;src=none;gpn=1;nodes=1"
    for cmd in (["update", f"JobId={job_id}", f"AdminComment={record}"], ["release", str(job_id)]):
        done = subprocess.run(["scontrol", *cmd], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    pids = _wait(lambda: _task_pids(job_id), f"job {job_id} to run in its cgroup")
    proc = _daemon_process()
    try:
        # The probe confines the job, down to its tasks, to one of its two cores...
        _wait(
            lambda: _read(_job_dir(job_id) / "cpuset.cpus") in ("0", "1"),
            "the probe at one core",
            detail=lambda: json.dumps(_events(job_id)),
        )
        one = _read(_job_dir(job_id) / "cpuset.cpus")
        assert _read(_job_dir(job_id) / "step_batch" / "user" / "cpuset.cpus") == one
        assert {_allowed(p) for p in pids if Path(f"/proc/{p}").exists()} == {one}
        # ...then gives the whole allocation back and publishes both core counts.
        _wait(
            lambda: "probe-done" in [e["what"] for e in _events(job_id)],
            "the probe to end",
            detail=lambda: json.dumps(_events(job_id)),
        )
        _wait(lambda: _read(_job_dir(job_id) / "cpuset.cpus") == "0-1", "the allocation back")
        assert {_allowed(p) for p in _task_pids(job_id)} == {"0-1"}
        prof = ProfileStore(STATE_DIR / "profiles").read(sig)
        assert prof is not None
        assert {s.cores for s in prof.samples} == {1.0, 2.0}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
