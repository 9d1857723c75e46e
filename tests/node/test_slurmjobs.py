"""Slurm's record of the node's jobs: its JSON as each release prints it, whose record the
daemon takes, and asking slurmctld little.

The fixtures in ``tests/data/slurm_json`` are real output (``capture.py`` there): a node of
2 sockets x 8 cores x 2 threads, a hostile GPU job by ``nobody`` whose name and comment
hold `` UserId=0(root)``, `` JobState=RUNNING``, `` AdminComment=coda:sig=workload:*:...``,
a newline with ``Nodes=gpu01 CPU_IDs=0-31`` after it and a non-UTF-8 byte, a root GPU job
the hook recorded, a CPU job and a pending job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from coda_node.system.cpulist import format_cpulist, parse_cpulist
from coda_node.system.slurmjobs import (
    NodeLayout,
    SlurmJobs,
    SlurmQueryError,
    allocated_cpus,
    hook_record,
    parse_gres,
    parse_job,
    parse_node_layout,
    query_jobs,
)

DATA = Path(__file__).parents[1] / "data" / "slurm_json"
RELEASES = sorted(p.name.removesuffix("-squeue.json") for p in DATA.glob("*-squeue.json"))
NODE = "gpu01"
HOSTILE, GPU, CPU, PENDING = 1, 2, 3, 4
LAYOUT = NodeLayout(NODE, cores_per_socket=8, threads_per_core=2)
# What scontrol -d prints as CPU_IDs for each job in every capture.
CPU_IDS = {HOSTILE: "0-1", GPU: "2-5", CPU: "6-7,16-17"}


def _read(name: str) -> str:
    # As make_runner hands it over: the job name holds a byte that is not UTF-8.
    return (DATA / name).read_bytes().decode("utf-8", errors="replace")


class FixtureSlurm:
    """Answers coda-node's commands from one release's captured output, as that release
    does: 22.05's scontrol has no --json and its squeue prints every job."""

    def __init__(self, release: str) -> None:
        self.release = release
        self.calls: list[list[str]] = []
        self.fail: str | None = None

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SlurmQueryError(f"{argv[0]} exited 1 ({self.fail})")
        if argv[:2] == ["squeue", "--json"]:
            return _read(f"{self.release}-squeue.json")
        if argv[0] == "scontrol" and "--json" in argv:
            if self.release == "22.05":
                raise SlurmQueryError("scontrol exited 1 (scontrol: unrecognized option '--json')")
            return _read(f"{self.release}-node.json")
        if argv == ["sinfo", "--json"]:
            return _read(f"{self.release}-node.json")
        raise AssertionError(f"not a command coda-node runs: {argv}")


def _jobs(release: str) -> dict[int, object]:
    records = query_jobs(FixtureSlurm(release), [HOSTILE, GPU, CPU, PENDING])
    return {j: parse_job(r, NODE, LAYOUT) for j, r in records.items()}


# -- the reader, on every release captured -------------------------------------------------


def test_fixtures_cover_the_supported_releases() -> None:
    assert {"22.05", "24.11", "26.05"} <= set(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_node_layout_from_slurms_node_record(release: str) -> None:
    jobs = SlurmJobs(NODE, FixtureSlurm(release))
    assert jobs.layout() == LAYOUT


@pytest.mark.parametrize("release", RELEASES)
def test_cpu_ids_are_the_ones_scontrol_prints(release: str) -> None:
    text = _read(f"{release}-scontrol.txt")
    for job_id, cpus in CPU_IDS.items():
        # The first CPU_IDs after the job's own JobId= is Slurm's (the hostile comment
        # prints a second one further on).
        block = text[text.index(f"JobId={job_id} ") :]
        assert re.search(r" Nodes=gpu01 CPU_IDs=(\S+)", block).group(1) == cpus  # type: ignore[union-attr]
    got = {j: format_cpulist(job.cpu_ids) for j, job in _jobs(release).items() if job}
    assert got == CPU_IDS


@pytest.mark.parametrize("release", RELEASES)
def test_what_the_daemon_sees_of_a_hostile_job(release: str) -> None:
    job = _jobs(release)[HOSTILE]
    assert job is not None
    assert (job.uid, job.user, job.state, job.partition) == (65534, "nobody", "RUNNING", "gpu")
    assert job.cpu_ids == parse_cpulist("0-1")  # not the CPU_IDs=0-31 of its comment
    assert job.gpu_indices == (0, 1) and job.is_dnn
    assert job.name.startswith("evil\N{REPLACEMENT CHARACTER} UserId=0(root)")
    # Whatever the comment says, the record is the hook's own or none (no hook in the
    # capture), and never the shared key the comment names.
    if job.admin_record is not None:
        assert job.admin_record["sig"].startswith("script:65534:")
    assert job.record_problem is None


@pytest.mark.parametrize("release", RELEASES)
def test_the_hooks_record_and_the_rest_of_a_job(release: str) -> None:
    jobs = _jobs(release)
    gpu, cpu = jobs[GPU], jobs[CPU]
    assert gpu is not None and cpu is not None
    assert gpu.admin_record is not None and gpu.admin_record["sig"] == "workload:0:resnet"
    assert (gpu.uid, gpu.user, gpu.gpu_indices, gpu.num_nodes) == (0, "root", (2,), 1)
    assert cpu.admin_record is None and not cpu.is_dnn and cpu.gres == ()
    assert jobs[PENDING] is None  # holds nothing on any node yet


@pytest.mark.parametrize("release", RELEASES)
def test_allocated_cpus_asks_slurm_now(release: str) -> None:
    slurm = FixtureSlurm(release)
    got = allocated_cpus(slurm, NODE, [HOSTILE, CPU, PENDING, 999])
    assert {j: format_cpulist(c) for j, c in got.items()} == {
        HOSTILE: CPU_IDS[HOSTILE],
        CPU: CPU_IDS[CPU],
    }
    assert allocated_cpus(slurm, "gpu02", [HOSTILE]) == {}
    jobs = SlurmJobs(NODE, slurm)
    assert jobs.allocated_cpus([GPU]) == {GPU: parse_cpulist(CPU_IDS[GPU])}
    slurm.fail = "Unable to contact slurm controller"
    with pytest.raises(SlurmQueryError, match="Unable to contact"):
        jobs.allocated_cpus([GPU])


def test_22_05_layout_comes_from_sinfo_once_scontrol_says_it_has_no_json() -> None:
    slurm = FixtureSlurm("22.05")
    jobs = SlurmJobs(NODE, slurm, refresh_s=0)
    jobs.layout()
    jobs.layout()
    assert [c[0] for c in slurm.calls] == ["scontrol", "sinfo", "sinfo"]


# -- the shapes of each release, by hand ---------------------------------------------------


def _record(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "job_id": 9,
        "user_id": 1001,
        "user_name": "alice",
        "job_state": "RUNNING",
        "name": "train",
        "partition": "gpu",
        "admin_comment": "",
        "gres_detail": [],
        "node_count": 1,
        "job_resources": {
            "allocated_nodes": [
                {"nodename": NODE, "sockets": {"1": {"cores": {"3": "allocated_and_in_use"}}}}
            ]
        },
    }
    base.update(fields)
    return base


LATER_RESOURCES = {
    "nodes": {
        "allocation": [
            {"index": 0, "name": "gpu00", "sockets": []},
            {
                "index": 1,
                "name": NODE,
                "sockets": [
                    {"index": 1, "cores": [{"index": 3, "status": ["ALLOCATED", "IN_USE"]}]},
                    {"index": 0, "cores": [{"index": 0, "status": ["UNALLOCATED"]}]},
                ],
            },
        ]
    }
}


@pytest.mark.parametrize(
    ("fields", "expect"),
    [
        ({}, ("RUNNING", {"RUNNING"}, 1, "22-23")),
        (
            {
                "job_state": ["COMPLETED", "COMPLETING"],
                "node_count": {"set": True, "infinite": False, "number": 2},
                "user_id": 1001,
                "job_resources": LATER_RESOURCES,
                "gres_detail": ["", "gpu:1(IDX:3)"],
            },
            ("COMPLETED", {"COMPLETED", "COMPLETING"}, 2, "22-23"),
        ),
        (
            {"node_count": {"set": False, "infinite": False, "number": 0}},
            ("RUNNING", {"RUNNING"}, 1, "22-23"),
        ),
    ],
    ids=["22.05", "later", "unset-count"],
)
def test_record_shapes(fields: dict[str, object], expect: tuple[object, ...]) -> None:
    job = parse_job(_record(**fields), NODE, LAYOUT)
    assert job is not None
    assert (job.state, set(job.states), job.num_nodes, format_cpulist(job.cpu_ids)) == expect
    assert job.active
    if "gres_detail" in fields:
        assert job.gpu_indices == (3,)  # the entry of this node, the job's second


@pytest.mark.parametrize(
    "fields",
    [
        {"user_id": "0"},
        {"user_id": None},
        {"job_state": 3},
        {"name": ["x"]},
        {"job_resources": {"nodes": "gpu01"}},
        {"job_resources": {"allocated_nodes": [{"nodename": NODE, "sockets": {"x": {}}}]}},
        {
            "job_resources": {
                "allocated_nodes": [
                    {"nodename": NODE, "sockets": {"0": {"cores": {"8": "allocated"}}}}
                ]
            }
        },
    ],
)
def test_records_that_do_not_read_are_errors_not_guesses(fields: dict[str, object]) -> None:
    with pytest.raises(SlurmQueryError):
        parse_job(_record(**fields), NODE, LAYOUT)


def test_a_document_with_errors_or_no_json_is_an_error() -> None:
    bad = json.dumps({"jobs": [], "errors": [{"description": "Invalid user"}]})
    with pytest.raises(SlurmQueryError, match="Invalid user"):
        query_jobs(lambda argv: bad, [1])
    with pytest.raises(SlurmQueryError, match="no JSON"):
        query_jobs(lambda argv: "JobId=1 UserId=root(0)", [1])
    with pytest.raises(SlurmQueryError, match="two records"):
        query_jobs(lambda argv: json.dumps({"jobs": [_record(), _record()]}), [9])
    with pytest.raises(SlurmQueryError, match="no node named"):
        parse_node_layout(json.dumps({"nodes": []}), NODE)


def test_a_job_id_slurm_no_longer_knows_is_no_record() -> None:
    def run(argv: Sequence[str]) -> str:
        raise SlurmQueryError("squeue exited 1 (slurm_load_jobs error: Invalid job id specified)")

    assert query_jobs(run, [5]) == {}


# -- whose record ------------------------------------------------------------------------

OWN = "coda:sig=workload:1001:resnet;cpg=3;was=;action=set;src=profile;gpn=2;nodes=1"


@pytest.mark.parametrize(
    ("comment", "sig", "problem"),
    [
        ("", None, None),
        ("maintenance window", None, None),
        (OWN, "workload:1001:resnet", None),
        ("site note " + OWN, "workload:1001:resnet", None),
        (
            OWN.replace("workload:1001:resnet", "script:1001:0123456789abcdef"),
            "script:1001:0123456789abcdef",
            None,
        ),
        # The hook appends: the last record is the hook's.
        (OWN.replace("1001", "2002") + " " + OWN, "workload:1001:resnet", None),
        (OWN + " " + OWN.replace("1001", "2002"), None, "not a key of the job's owner"),
        (OWN.replace("workload:1001:", "workload:*:"), None, "not a key of the job's owner"),
        (OWN.replace("workload:1001:", "workload:0:"), None, "not a key of the job's owner"),
        (OWN.replace("workload:1001:", "workload:01001:"), None, "not a key of the job's owner"),
        (OWN.replace("workload:1001:resnet", "1001"), None, "not a key of the job's owner"),
        ("coda:sig=workload:1001:x;cpg=1", None, "unreadable coda record"),
    ],
)
def test_only_the_owners_record_is_taken(
    comment: str, sig: str | None, problem: str | None
) -> None:
    record, why = hook_record(comment, 1001)
    assert (record["sig"] if record else None) == sig
    assert (why is None) if problem is None else (problem in (why or ""))


def test_a_refused_record_leaves_the_job_shown_but_without_a_signature() -> None:
    shared = OWN.replace("workload:1001:", "workload:*:")
    job = parse_job(_record(admin_comment=shared), NODE, LAYOUT)
    assert job is not None and job.admin_record is None
    assert job.record_problem is not None and "workload:*:resnet" in job.record_problem


def test_the_raw_record_and_the_account_are_kept_for_the_jobs_summary() -> None:
    job = parse_job(
        _record(admin_comment="site note " + OWN + " more", account="vision\nteam"), NODE, LAYOUT
    )
    assert job is not None and job.admin_record is not None
    assert job.record_text == OWN  # the token alone, as it stands in AdminComment
    assert job.account == "vision\nteam"  # kept as text; a summary leaves it out (clean_text)
    refused = parse_job(
        _record(admin_comment=OWN.replace("workload:1001:", "workload:*:")), NODE, LAYOUT
    )
    assert refused is not None and refused.record_text is None and refused.account is None


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("gpu:a100:2(IDX:0-1)", [("gpu", "a100", 2, (0, 1))]),
        ("gpu:2(IDX:1,3)", [("gpu", None, 2, (1, 3))]),
        (
            "gpu:a100:1(IDX:0),gpu:v100:1(IDX:3)",
            [("gpu", "a100", 1, (0,)), ("gpu", "v100", 1, (3,))],
        ),
        # A GRES without device files (count-only: PcieSpreadGres, MemBwSpreadGres), as
        # squeue --json gives it (read from a real slurmctld in test_placement_membw_slurm).
        ("membw(CNT:60)", [("membw", None, 60, ())]),
        (
            "gpu:a100:1(IDX:1),membw(CNT:5)",
            [("gpu", "a100", 1, (1,)), ("membw", None, 5, ())],
        ),
        ("gpu:a100:2(IDX:0-1),pcie(CNT:1)", [("gpu", "a100", 2, (0, 1)), ("pcie", None, 1, ())]),
        ("", []),
    ],
)
def test_parse_gres(text: str, expect: list[tuple[object, ...]]) -> None:
    assert [(g.name, g.type, g.count, g.indices) for g in parse_gres(text)] == expect


# -- asking slurmctld little -------------------------------------------------------------


class Runner:
    """squeue --json for jobs 1..64 on gpu01 (one core each), sinfo for the node."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SlurmQueryError(f"{argv[0]} exited 1 (Unable to contact slurm controller)")
        if argv[0] == "sinfo" or argv[0] == "scontrol":
            node = {"name": NODE, "cores": 64, "threads": 1}
            return json.dumps({"nodes": [node], "errors": []})
        jobs = []
        for j in range(1, 65):
            res = {
                "allocated_nodes": [
                    {"nodename": NODE, "sockets": {"0": {"cores": {str(j - 1): "allocated"}}}}
                ]
            }
            jobs.append(_record(job_id=j, job_resources=res))
        return json.dumps({"jobs": jobs, "errors": []})

    def job_queries(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "squeue"]


def test_new_jobs_are_asked_together_and_once_while_they_run() -> None:
    run = Runner()
    jobs = SlurmJobs(NODE, run, refresh_s=300, clock=lambda: 0.0)
    for _ in range(5):
        assert set(jobs.get({1, 2, 3})) == {1, 2, 3}
    assert run.job_queries() == [["squeue", "--json", "--all", "--jobs=1,2,3"]]
    jobs.get({1, 2, 3, 4})
    assert run.job_queries()[-1][-1] == "--jobs=4"


def test_slurmctld_down_costs_one_call_per_tick_not_one_per_job() -> None:
    run = Runner(fail=True)
    jobs = SlurmJobs(NODE, run, clock=lambda: 0.0)
    assert jobs.get(set(range(1, 33))) == {}
    assert len(run.calls) == 1
    assert jobs.last_error is not None and "Unable to contact" in jobs.last_error


def test_known_jobs_stay_known_while_slurmctld_is_down() -> None:
    now = [0.0]
    run = Runner()
    jobs = SlurmJobs(NODE, run, refresh_s=10, clock=lambda: now[0])
    jobs.get({1, 2})
    run.fail = True
    now[0] = 60.0  # both records are due for a refresh
    assert set(jobs.get({1, 2, 3})) == {1, 2}
    assert len(run.job_queries()) == 2  # once at first, then one failed refresh


def test_a_job_that_ended_is_dropped_and_asked_again_if_its_cgroup_stays() -> None:
    now = [0.0]
    run = Runner()
    jobs = SlurmJobs(NODE, run, refresh_s=10, clock=lambda: now[0])
    assert set(jobs.get({1, 100})) == {1}  # Slurm lists no job 100
    now[0] = 60.0
    assert set(jobs.get({1, 100})) == {1}
    assert run.job_queries()[-1][-1] == "--jobs=1,100"


@pytest.mark.parametrize(
    "damage",
    [
        {"gres_detail": ["gpu:a100:2(IDX:5-1)"]},
        {"gres_detail": ["gpu:a100:99999999(IDX:0-99999999)"]},
        {"job_resources": {"allocated_nodes": True}},
        {"job_resources": {"allocated_nodes": -1}},
        {
            "job_resources": {
                "nodes": {"allocation": [{"index": -(1 << 70), "name": NODE, "sockets": []}]}
            }
        },
    ],
    ids=["gres-backwards", "gres-huge", "nodes-true", "nodes-number", "position-huge"],
)
def test_one_jobs_record_that_does_not_read_leaves_the_other_jobs_known(
    damage: dict[str, object],
) -> None:
    """Slurm's JSON of one job damaged (a range that runs backwards, a number where a list
    belongs): that job is left out and named in last_error; the daemon's tick goes on for
    every other job."""
    run = Runner()
    clean = run.__call__

    def damaged(argv: Sequence[str]) -> str:
        out = clean(argv)
        if argv[0] != "squeue":
            return out
        doc = json.loads(out)
        doc["jobs"][1].update(damage)
        return json.dumps(doc)

    jobs = SlurmJobs(NODE, damaged, clock=lambda: 0.0)
    assert set(jobs.get({1, 2, 3})) == {1, 3}
    assert jobs.last_error is not None and jobs.last_error.startswith("job 2: ")
