"""Which job a cgroup v2 directory is, whatever Slurm named it: ``job_<id>`` (Slurm 24.11,
and 26.05 with ``CgroupJobIdPaths=yes``) or the job's SLUID (26.05's default), mapped to the
job id by Slurm's own record (``squeue --json``, captured from 26.05 in
tests/data/slurm_json); a directory no job can be named for is reported, and so is a node
whose running jobs the tree does not show.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from coda_common.slurm.slurmjson import job_sluid
from coda_node.cli import main
from coda_node.sampling.snapshot import UNSEEN_CHECK_S, Sampler
from coda_node.system.cgroups import discover_layout, is_sluid, scan_jobs
from coda_node.system.check import probe_slurm_jobs
from coda_node.system.cpulist import parse_cpulist
from coda_node.system.nvml import Nvml
from coda_node.system.paths import SystemRoot
from coda_node.system.slurmjobs import SLUID_RETRY_S, SlurmJobs, SlurmQueryError
from tests.node.cgroup_fixtures import (
    SLURM_26_CPUS,
    SLURM_26_SLUIDS,
    V2_NODE,
    V2_SCOPE,
    build_v2_job_dirs,
    v2_dir,
)
from tests.node.nvml_double import FakeNvml

DATA = Path(__file__).parents[1] / "data" / "slurm_json"
RUNNING = (1, 2, 3)
JOB_ID_DIRS: dict[int, str | tuple[str, ...]] = {j: f"job_{j}" for j in RUNNING}
SLUID_DIRS: dict[int, str | tuple[str, ...]] = {j: SLURM_26_SLUIDS[j] for j in RUNNING}
# The directory name a sid guest's Slurm 26.05.5 gave its job: a SLUID no record here names.
GUEST_SLUID = "sEF9M8HXW6TK00"


class CapturedSlurm:
    """Slurm's answers from one release's capture (24.11 or 26.05): ``squeue --json``
    (every job; the capture's jobs 1-3 run on gpu01, 4 is pending), the node's record
    (``scontrol show node --json``) and ``squeue -h -w gpu01 -t R -o %A`` (the running
    ones, or ``running`` when set)."""

    def __init__(self, release: str, running: Sequence[int] = RUNNING) -> None:
        self.release = release
        self.running = tuple(running)
        self.calls: list[tuple[str, ...]] = []
        self.fail: str | None = None

    def __call__(self, argv: Sequence[str]) -> str:
        args = tuple(argv)
        self.calls.append(args)
        if self.fail is not None:
            raise SlurmQueryError(f"{args[0]} exited 1 ({self.fail})")
        if args[:2] == ("squeue", "--json"):
            return (DATA / f"{self.release}-squeue.json").read_bytes().decode(errors="replace")
        if args[:2] == ("squeue", "-h"):
            return "".join(f"{j}\n" for j in self.running)
        if args[:1] == ("scontrol",) and "--json" in args:
            return (DATA / f"{self.release}-node.json").read_text()
        raise AssertionError(f"not a command coda-node runs here: {args}")

    def json_calls(self) -> list[tuple[str, ...]]:
        return [a for a in self.calls if a[:2] == ("squeue", "--json")]


def _resolver(release: str = "26.05") -> tuple[SlurmJobs, CapturedSlurm]:
    slurm = CapturedSlurm(release)
    return SlurmJobs(V2_NODE, slurm), slurm


def _never(names: object) -> dict[str, int]:
    raise AssertionError(f"Slurm asked about {names}: every directory is job_<id>")


# -- the record ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "sluids"),
    [
        ("22.05", {}),
        ("24.11", {}),
        # data_parser/v0.0.45: the job's step_id object carries "sluid" beside "job_id".
        ("26.05", {**SLURM_26_SLUIDS, 4: "s1PDM89Q776M00"}),
    ],
)
def test_the_sluid_in_each_releases_squeue_json(release: str, sluids: dict[int, str]) -> None:
    text = (DATA / f"{release}-squeue.json").read_bytes().decode(errors="replace")
    records = json.loads(text)["jobs"]
    got = {r["job_id"]: job_sluid(r) for r in records if job_sluid(r) is not None}
    assert got == sluids
    assert all(is_sluid(s) for s in got.values())


@pytest.mark.parametrize(
    ("name", "sluid"),
    [
        (SLURM_26_SLUIDS[1], True),
        (GUEST_SLUID, True),
        ("job_3", False),
        ("system", False),
        ("s1PDM89Q77230", False),  # 12 digits
        ("s1PDM89Q772300x", False),
        ("S1PDM89Q772300", False),  # Slurm prints a lower-case "s"
        ("s1PDM89Q7723O0", False),  # O is no Crockford digit
    ],
)
def test_is_sluid(name: str, sluid: bool) -> None:
    assert is_sluid(name) is sluid


# -- the tree, as each Slurm names it ------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "dirs", "task_special"),
    [
        ("Slurm 24.11", JOB_ID_DIRS, False),
        ("Slurm 26.05, CgroupJobIdPaths=yes", JOB_ID_DIRS, True),
        ("Slurm 26.05, default cgroup.conf", SLUID_DIRS, True),
        (
            "CgroupJobIdPaths changed while jobs ran",
            {1: "job_1", 2: SLURM_26_SLUIDS[2], 3: SLURM_26_SLUIDS[3]},
            True,
        ),
    ],
)
def test_every_running_job_is_found_by_its_id(
    tmp_path: Path, what: str, dirs: dict[int, str | tuple[str, ...]], task_special: bool
) -> None:
    node = build_v2_job_dirs(tmp_path, dirs, task_special=task_special)
    layout = discover_layout(node.root, V2_NODE)
    slurm, answers = _resolver()
    scan = scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert scan.unattributed == (), what
    assert sorted(scan.jobs) == list(RUNNING), what
    for job_id, job in scan.jobs.items():
        assert job.path == node.cg(f"{V2_SCOPE}/{dirs[job_id]}")
        assert job.cpus == parse_cpulist(SLURM_26_CPUS[job_id])
        assert [s.name for s in job.steps] == ["batch"]
        assert job.steps[0].cpus == job.cpus  # from user/, task_special and all
        assert job.pids == (4000 + 10 * job_id - 1, 4000 + 10 * job_id)
    sluid_named = any(is_sluid(str(name)) for name in dirs.values())
    assert len(answers.json_calls()) == (1 if sluid_named else 0)
    if sluid_named:
        assert answers.json_calls()[0] == ("squeue", "--json", "--all", "--nodelist=gpu01")
    # The answer is kept: the next ticks ask nothing.
    scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert len(answers.json_calls()) == (1 if sluid_named else 0)


def test_job_id_dirs_never_ask_slurm(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, JOB_ID_DIRS)
    scan = scan_jobs(discover_layout(node.root, V2_NODE), resolve=_never)
    assert sorted(scan.jobs) == list(RUNNING) and scan.unattributed == ()


@pytest.mark.parametrize("dirs", [JOB_ID_DIRS, SLUID_DIRS], ids=["job-id", "sluid"])
def test_slurmds_own_directory_in_the_scope_is_no_job(
    tmp_path: Path, dirs: dict[int, str | tuple[str, ...]]
) -> None:
    # slurmd started without systemd (IgnoreSystemd=yes, by hand, in a container) lives in
    # the scope's slurmd/, beside system/: the scope's, not a job's, and not unattributed.
    node = build_v2_job_dirs(tmp_path, dirs)
    v2_dir(node.cg(V2_SCOPE) / "slurmd", "", "0-31", procs=(3900,), controllers="cpuset cpu")
    slurm, _ = _resolver()
    scan = scan_jobs(discover_layout(node.root, V2_NODE), resolve=slurm.job_ids_of_dirs)
    assert sorted(scan.jobs) == list(RUNNING) and scan.unattributed == ()


def test_sluid_dirs_without_slurms_record_are_reported_not_skipped(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    layout = discover_layout(node.root, V2_NODE)
    scan = scan_jobs(layout)
    assert scan.jobs == {}
    assert [d.path.name for d in scan.unattributed] == sorted(SLURM_26_SLUIDS.values())
    assert all("Slurm was not asked" in d.why for d in scan.unattributed)
    # Slurm before 26.05 has no SLUID in its record: nothing names them either.
    slurm, _ = _resolver("24.11")
    scan = scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert scan.jobs == {} and len(scan.unattributed) == 3
    assert all("does not name" in d.why for d in scan.unattributed)


def test_a_sluid_slurm_does_not_name_is_asked_again_only_after_a_while(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    cg = node.cg(V2_SCOPE)
    (cg / GUEST_SLUID / "step_batch/user/task_special").mkdir(parents=True)
    (cg / "stray").mkdir()
    layout = discover_layout(node.root, V2_NODE)
    now = [1000.0]
    answers = CapturedSlurm("26.05")
    slurm = SlurmJobs(V2_NODE, answers, clock=lambda: now[0])
    scan = scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert sorted(scan.jobs) == list(RUNNING)
    assert {d.path.name: d.why for d in scan.unattributed} == {
        GUEST_SLUID: "a SLUID that Slurm's record of this node's jobs does not name",
        "stray": "not a job directory as Slurm names one (job_<id> or a SLUID)",
    }
    assert len(answers.json_calls()) == 1
    now[0] += SLUID_RETRY_S - 1
    scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert len(answers.json_calls()) == 1
    now[0] += 1
    scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert len(answers.json_calls()) == 2


def test_slurm_unreachable_keeps_what_it_said_and_says_why(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, {1: SLURM_26_SLUIDS[1]})
    layout = discover_layout(node.root, V2_NODE)
    slurm, answers = _resolver()
    assert sorted(scan_jobs(layout, resolve=slurm.job_ids_of_dirs).jobs) == [1]
    build_v2_job_dirs(tmp_path, {2: SLURM_26_SLUIDS[2]})  # a job starts
    answers.fail = "Unable to contact slurm controller"
    scan = scan_jobs(layout, resolve=slurm.job_ids_of_dirs)
    assert sorted(scan.jobs) == [1]  # known from before: still seen (and put back at stop)
    assert [d.path.name for d in scan.unattributed] == [SLURM_26_SLUIDS[2]]
    assert slurm.sluid_error is not None
    assert "Unable to contact slurm controller" in slurm.sluid_error
    assert SLURM_26_SLUIDS[2] in slurm.sluid_error


def test_a_job_with_a_directory_of_each_name_is_read_once_and_the_other_reported(
    tmp_path: Path,
) -> None:
    # Its batch step started under CgroupJobIdPaths=yes, a later step after it was unset.
    node = build_v2_job_dirs(tmp_path, {**SLUID_DIRS, 2: ("job_2", SLURM_26_SLUIDS[2])})
    slurm, _ = _resolver()
    scan = scan_jobs(discover_layout(node.root, V2_NODE), resolve=slurm.job_ids_of_dirs)
    assert sorted(scan.jobs) == list(RUNNING)
    assert scan.jobs[2].path.name == "job_2"
    [extra] = scan.unattributed
    assert extra.path.name == SLURM_26_SLUIDS[2]
    assert "second directory of job 2" in extra.why and "CgroupJobIdPaths" in extra.why


# -- the daemon's sample ---------------------------------------------------------------------


def _sampler(node_root: Path, answers: CapturedSlurm, now: list[float]) -> Sampler:
    layout = discover_layout(SystemRoot(node_root), V2_NODE)
    return Sampler(
        root=SystemRoot(node_root),
        node_name=V2_NODE,
        layout=layout,
        slurm=SlurmJobs(V2_NODE, answers, clock=lambda: now[0]),
        nvml=Nvml(FakeNvml(gpus=[])),
        gres_conf=None,
        clock=lambda: now[0],
    )


def test_the_daemon_joins_sluid_named_jobs_with_slurms_record(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    answers = CapturedSlurm("26.05")
    snap = _sampler(node.base, answers, [0.0]).sample()
    assert snap.errors == ()
    assert sorted(snap.jobs) == list(RUNNING)
    for job_id, view in snap.jobs.items():
        assert view.slurm is not None and view.slurm.job_id == job_id
        assert view.cgroup is not None and view.cgroup.path.name == SLURM_26_SLUIDS[job_id]
        assert view.cpus_now == parse_cpulist(SLURM_26_CPUS[job_id])
    assert (snap.jobs[1].kind, snap.jobs[2].kind, snap.jobs[3].kind) == ("dnn", "dnn", "cpu")


def test_the_daemon_shows_an_unknown_directory_every_tick_and_logs_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    (node.cg(V2_SCOPE) / GUEST_SLUID).mkdir()
    now = [0.0]
    sampler = _sampler(node.base, CapturedSlurm("26.05"), now)
    with caplog.at_level(logging.INFO, logger="coda-node"):
        for _ in range(3):
            snap = sampler.sample()
            now[0] += 5
            [error] = snap.errors
            assert GUEST_SLUID in error and "no job coda-node can name" in error
            assert sorted(snap.jobs) == list(RUNNING)
        assert [r.getMessage() for r in caplog.records if GUEST_SLUID in r.getMessage()] == [error]
        (node.cg(V2_SCOPE) / GUEST_SLUID).rmdir()
        assert sampler.sample().errors == ()
    assert caplog.records[-1].getMessage() == f"resolved: {error}"


def test_running_jobs_the_tree_does_not_show_are_a_problem_not_an_idle_node(
    tmp_path: Path,
) -> None:
    node = build_v2_job_dirs(tmp_path, {})  # the scope is there; no job directory in it
    now = [0.0]
    answers = CapturedSlurm("26.05")
    sampler = _sampler(node.base, answers, now)
    assert sampler.sample().errors == ()  # a job just started may not have its cgroup yet
    now[0] += UNSEEN_CHECK_S / 2
    assert sampler.sample().errors == ()
    asked = [a for a in answers.calls if a[:2] == ("squeue", "-h")]
    assert asked == [("squeue", "-h", "-w", "gpu01", "-t", "R", "-o", "%A")]  # once a period
    now[0] += UNSEEN_CHECK_S / 2
    [error] = sampler.sample().errors
    assert error.startswith("squeue lists running job(s) 1, 2, 3 on gpu01")
    assert "holds no job" in error
    # The jobs end: idle, and no problem.
    answers.running = ()
    now[0] += UNSEEN_CHECK_S
    assert sampler.sample().errors == ()


# -- coda-node check -------------------------------------------------------------------------


def test_check_names_the_jobs_it_sees(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    row = probe_slurm_jobs(node.root, V2_NODE, CapturedSlurm("26.05"))
    assert row.available and not row.problem
    assert row.detail == (
        "job(s) 1 (s1PDM89Q772300), 2 (s1PDM89Q773700), 3 (s1PDM89Q774700) in cgroup v2"
    )


def test_check_fails_loudly_on_a_node_whose_jobs_it_cannot_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # 26.05's SLUID directories, and a Slurm whose record names no SLUID (as a 24.11
    # squeue would): none of the three running jobs can be named.
    node = build_v2_job_dirs(tmp_path / "node", SLUID_DIRS)
    conf = tmp_path / "coda.conf"
    conf.write_text(f"NodeName={V2_NODE}\nNodeRoot={node.base}\n")
    monkeypatch.setattr("coda_node.cli._jobs_runner", lambda _real: CapturedSlurm("24.11"))
    assert main(["check", "--conf", str(conf)]) == 1
    out, err = capsys.readouterr()
    [row] = [line for line in out.splitlines() if line.startswith("Slurm jobs seen")]
    assert row.split()[3] == "PROBLEM"
    assert "squeue lists running job(s) 1, 2, 3 on gpu01" in row
    for sluid in SLURM_26_SLUIDS.values():
        assert f"{sluid} is no job coda-node can name" in row
    assert err.startswith("coda-node: Slurm jobs seen (")

    assert main(["check", "--conf", str(conf), "--json"]) == 1
    rows = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert rows["Slurm jobs seen"]["problem"] is True

    # With 26.05's record the same node is fine.
    monkeypatch.setattr("coda_node.cli._jobs_runner", lambda _real: CapturedSlurm("26.05"))
    assert main(["check", "--conf", str(conf)]) == 0
    assert "job(s) 1 (s1PDM89Q772300)" in capsys.readouterr().out


def test_check_names_a_job_whose_cgroup_cannot_be_read_and_sees_the_others(
    tmp_path: Path,
) -> None:
    node = build_v2_job_dirs(tmp_path, SLUID_DIRS)
    cpus = node.cg(f"{V2_SCOPE}/{SLURM_26_SLUIDS[2]}/cpuset.cpus")
    cpus.write_text("garbage\n")
    row = probe_slurm_jobs(node.root, V2_NODE, CapturedSlurm("26.05"))
    assert row.problem
    assert row.detail == f"job 2: cannot read its cgroup ({cpus}: not a CPU list: 'garbage')"


def test_check_says_an_idle_node_is_idle(tmp_path: Path) -> None:
    node = build_v2_job_dirs(tmp_path, {})
    row = probe_slurm_jobs(node.root, V2_NODE, CapturedSlurm("26.05", running=()))
    assert (row.available, row.problem, row.detail) == (True, False, "no job runs on gpu01")
