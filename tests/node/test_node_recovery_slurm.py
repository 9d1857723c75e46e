"""coda-node puts every job back, whatever happens to the daemon or its state file, on real
Slurm jobs confined by real cgroups (v1 cpuset and cpu; the cpu controller mounted alone,
so a CPU quota lives in coda's own ``/sys/fs/cgroup/cpu/coda/job_<id>``).

Each test drives the real ``coda-node`` command as a process, as an operator would, and
checks what a user of the job would notice: the job's ``cpuset.cpus`` and its CPU quota.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coda_common.config.codaconf import load_config
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import FORMAT_VERSION, STATE_FILE, Limit, StateFile, save_limits
from coda_node.system.cpulist import parse_cpulist
from slurm_plugin.devtools.cluster import DevCluster
from tests.conftest import cancel_all, require_slurm, started
from tests.node.test_node_slurm import (
    SLEEP,
    _allowed,
    _cgroup_v1_reason,
    _daemon_process,
    _node_cli,
    _start,
    _wait,
)

pytestmark = pytest.mark.slurm

CODA_CPU = Path("/sys/fs/cgroup/cpu/coda")


@pytest.fixture(scope="module")
def recovery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _cgroup_v1_reason()
    if reason:
        pytest.skip(reason)
    yield from started(DevCluster(tmp_path_factory.mktemp("recovery"), cgroups=True))


@pytest.fixture
def cluster(recovery_cluster: DevCluster) -> Iterator[DevCluster]:
    """The confined cluster with no job, no limit and no state left from another test."""
    yield recovery_cluster
    cancel_all(recovery_cluster)
    save_limits(recovery_cluster.node_state_dir, {})
    for leftover in recovery_cluster.node_state_dir.glob("state.json*"):
        leftover.unlink()


def _quota_us(job_id: int) -> int | None:
    """The job's CFS quota in µs per period; None when it has none (no coda cpu cgroup)."""
    try:
        return int((CODA_CPU / f"job_{job_id}" / "cpu.cfs_quota_us").read_text())
    except FileNotFoundError:
        return None


def _cpus(job_dir: Path) -> str:
    return (job_dir / "cpuset.cpus").read_text().strip()


def _limit(cluster: DevCluster, *args: str) -> None:
    out = _node_cli(cluster, *args)
    assert out.returncode == 0, out.stderr


def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def test_a_cpu_quota_that_replaced_a_cores_limit_is_lifted_on_release(
    cluster: DevCluster,
) -> None:
    job_id, d, _ = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    proc = _daemon_process(cluster)
    try:
        _limit(cluster, "limit", str(job_id), "--cores", "1")
        _wait(lambda: _cpus(d) == "0" and _quota_us(job_id) is None, "cpuset 0, no quota")
        # The same tick puts the cpuset back and sets the quota.
        _limit(cluster, "limit", str(job_id), "--cpu-quota", "0.5")
        _wait(lambda: _cpus(d) == "0-1" and _quota_us(job_id) == 50000, "cpuset 0-1, quota")
        _limit(cluster, "release", str(job_id))
        _wait(lambda: _quota_us(job_id) is None, "the quota to be lifted", 10)
        assert _cpus(d) == "0-1"
    finally:
        err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    out = _node_cli(cluster, "restore")
    assert out.returncode == 0, out.stderr
    assert _quota_us(job_id) is None and _cpus(d) == "0-1"
    assert StateFile(cluster.node_state_dir).load().changes == {}


# -- a damaged state file ---------------------------------------------------------------------


def _truncated(text: bytes) -> bytes:
    return text[: len(text) // 2]


def _half_written(text: bytes) -> bytes:
    # A writer killed after its first write(2) of a rewrite in place: the start of the file
    # and nothing after it (coda-node itself renames a complete file; an editor may not).
    return text[:20]


def _version(value: object) -> Callable[[bytes], bytes]:
    def damage(text: bytes) -> bytes:
        data = json.loads(text)
        data["format_version"] = value
        return json.dumps(data).encode()

    return damage


def _not_utf8(text: bytes) -> bytes:
    return text.replace(b'"changes"', b'"chan\xff\xfees"')


def _record(**fields: Any) -> Callable[[bytes], bytes]:
    """The job's record with ``fields`` of its cpuset snapshot replaced."""

    def damage(text: bytes) -> bytes:
        data = json.loads(text)
        (record,) = data["changes"].values()
        if "cpus" in fields:
            record["cpuset_original"]["cpus"]["."] = fields["cpus"]
            record["allocated_cpus"] = sorted(parse_cpulist(fields["cpus"]))
        return json.dumps(data).encode()

    return damage


NEWER = "format_version of a newer coda-node"

DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    # damage -> (how the state file is damaged, what the daemon repairs)
    "truncated": (_truncated, "every job"),
    "half-written": (_half_written, "every job"),
    "empty": (lambda _: b"", "every job"),
    'format_version "abc"': (_version("abc"), "every job"),
    "format_version -1": (_version(-1), "every job"),
    "format_version true": (_version(True), "every job"),
    "not UTF-8": (_not_utf8, "every job"),
    "not a state file": (lambda _: b"[1, 2, 3]", "every job"),
    # Not damaged, but this coda-node must not overwrite it (a downgrade): the jobs go back
    # all the same, and the file stays as the newer coda-node left it.
    NEWER: (_version(FORMAT_VERSION + 1), "every job"),
    "record names CPUs 0-63": (_record(cpus="0-63"), "the job"),
    "record disagrees with Slurm": (_record(cpus="1"), "the job"),
}


@pytest.mark.parametrize("then", ["restart", "coda-node restore"])
def test_a_damaged_state_file_puts_every_job_back_to_slurms_allocation(
    cluster: DevCluster, caplog: pytest.LogCaptureFixture, then: str
) -> None:
    """Each kind of damage, on a job slimmed to one core under a CPU quota whose limit the
    operator then released: the daemon (restarted, or ``coda-node restore``) never takes the
    shrunk cpuset for the allocation, never crashes, says what it did, and the job ends up
    with what Slurm allocated it (0-1) and no quota."""
    job_id, d, pids = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    state_file = cluster.node_state_dir / STATE_FILE
    cfg = load_config(cluster.coda_conf)
    seen: dict[str, tuple[str, str | None, str]] = {}
    for kind, (damage, scope) in DAMAGE.items():
        save_limits(cluster.node_state_dir, {job_id: Limit(cores=1, quota_cores=0.5)})
        first = Daemon(cfg)
        first.start()
        first.tick()
        assert (_cpus(d), _quota_us(job_id)) == ("0", 50000), kind
        del first  # killed: nothing put back
        save_limits(cluster.node_state_dir, {})  # released while the daemon was down
        state_file.write_bytes(damage(state_file.read_bytes()))
        left = state_file.read_bytes()
        caplog.clear()
        if kind == NEWER and then == "restart":
            # `run` refuses the file, but only after putting every job back.
            proc = _node_cli(cluster, "run")
            assert proc.returncode == 1, (kind, proc.stderr)
            assert "written by a newer coda-node" in proc.stderr, proc.stderr
            assert f"put jobs {job_id} back to Slurm's allocation" in proc.stderr, proc.stderr
            out = proc.stderr
        elif then == "restart":
            daemon = Daemon(cfg)
            daemon.start()
            report = daemon.tick()
            events = [e for e in daemon.state.view["events"] if e["job_id"] == job_id]
            assert [e["action"] for e in events][:1] == ["state-repair"], (kind, events)
            assert any(
                a.startswith("cpuset restored to 0-1") for a in report.results[job_id].applied
            )
            daemon.tick()  # and nothing flaps afterwards
            out = caplog.text
        else:
            proc = _node_cli(cluster, "restore")
            assert proc.returncode == 0, (kind, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert f"restored 1 job(s) ({job_id})" in proc.stdout, (kind, proc.stdout)
            out = proc.stderr
        seen[kind] = (_cpus(d), _quota_us(job_id), scope)
        assert any(
            why in out for why in ("damaged", "Slurm says", "does not have online", "newer")
        ), out
        assert {_allowed(t) for t in pids} == {"0-1"}, kind
        if kind == NEWER:
            assert state_file.read_bytes() == left
            state_file.unlink()  # what an operator does once the jobs are back
        else:
            assert StateFile(cluster.node_state_dir).load().repair == {}, kind
        assert not list(cluster.node_state_dir.glob(".*.tmp"))
    assert seen == {kind: ("0-1", None, scope) for kind, (_, scope) in DAMAGE.items()}


@pytest.mark.parametrize("left", ["newer", "damaged", "missing"])
def test_release_without_a_daemon_puts_the_job_back_whatever_the_state_file_says(
    cluster: DevCluster, left: str
) -> None:
    """A job slimmed to one core under a CPU quota, the daemon gone, and a state file this
    coda-node cannot use (or none): ``coda-node release`` itself gives the job back the
    CPUs Slurm allocated it and removes coda's cpu cgroup, and says so; a newer
    coda-node's file stays as it was."""
    job_id, d, pids = _start(cluster, ["--gpus=1", "-c2"], SLEEP)
    state_file = cluster.node_state_dir / STATE_FILE
    save_limits(cluster.node_state_dir, {job_id: Limit(cores=1, quota_cores=0.5)})
    proc = _daemon_process(cluster)
    try:
        _wait(lambda: (_cpus(d), _quota_us(job_id)) == ("0", 50000), "cpuset 0, quota")
    finally:
        _stop(proc, signal.SIGKILL)  # nothing put back
    assert (_cpus(d), _quota_us(job_id)) == ("0", 50000)
    if left == "newer":
        state_file.write_bytes(_version(FORMAT_VERSION + 1)(state_file.read_bytes()))
    elif left == "damaged":
        state_file.write_bytes(_truncated(state_file.read_bytes()))
    else:
        state_file.unlink()
    before = state_file.read_bytes() if state_file.exists() else None

    proc = _node_cli(cluster, "release", str(job_id))
    assert proc.returncode == 0, proc.stderr
    assert f"job {job_id}: limit removed" in proc.stdout
    assert f"job {job_id}: put back as Slurm set it (cpuset restored to 0-1" in proc.stdout
    assert "cpu quota released" in proc.stdout, proc.stdout
    assert "within" not in proc.stdout  # no promise of a daemon that is not there
    assert _cpus(d) == "0-1" and {_allowed(t) for t in pids} == {"0-1"}
    assert _quota_us(job_id) is None and not (CODA_CPU / f"job_{job_id}").exists()
    if left == "newer":
        assert state_file.read_bytes() == before
    # Nothing left to do: a second release says so and changes nothing.
    again = _node_cli(cluster, "release", str(job_id))
    assert again.returncode == 0, again.stderr
    assert f"job {job_id}: nothing of coda's on it to undo" in again.stdout, again.stdout
    assert _cpus(d) == "0-1"
