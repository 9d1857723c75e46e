"""Slurm's record of the node's jobs: parsing scontrol's lines, and asking slurmctld little."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coda_node.slurmjobs import SlurmJobs, SlurmQueryError, parse_gres, parse_job_line

LINE = (
    "JobId={id} JobName=train UserId=alice(1001) GroupId=alice(1001) JobState=RUNNING "
    "Partition=gpu NumNodes=1 NumCPUs=6   Nodes=gpu01 CPU_IDs=0-2,8 Mem=0 "
    "GRES=gpu:a100:2(IDX:0,2) MinCPUsNode=1 "
    "AdminComment=coda:sig=workload:1001:resnet50;cpg=3;was=;action=set;src=profile;gpn=2;nodes=1 "
    "CpusPerTres=gres:gpu:3 Comment=free text with Key=like words"
)


def test_parse_job_line_on_this_node() -> None:
    job = parse_job_line(LINE.format(id=7), "gpu01")
    assert job is not None
    assert (job.job_id, job.user, job.uid, job.state) == (7, "alice", 1001, "RUNNING")
    assert job.cpu_ids == frozenset({0, 1, 2, 8})
    assert job.gpu_indices == (0, 2) and job.is_dnn
    assert job.admin_record is not None and job.admin_record["cpg"] == "3"
    assert job.cpus_per_tres == "gres:gpu:3"


def test_a_job_on_other_nodes_is_not_ours() -> None:
    assert parse_job_line(LINE.format(id=7), "gpu02") is None


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("gpu:a100:2(IDX:0-1)", [("gpu", "a100", 2, (0, 1))]),
        ("gpu:2(IDX:1,3)", [("gpu", None, 2, (1, 3))]),
        (
            "gpu:a100:1(IDX:0),gpu:v100:1(IDX:3)",
            [("gpu", "a100", 1, (0,)), ("gpu", "v100", 1, (3,))],
        ),
        ("", []),
    ],
)
def test_parse_gres(text: str, expect: list[tuple[object, ...]]) -> None:
    assert [(g.name, g.type, g.count, g.indices) for g in parse_gres(text)] == expect


class Runner:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if self.fail:
            raise SlurmQueryError("scontrol exited 1 (Unable to contact slurm controller)")
        return LINE.format(id=argv[-1]) + "\n"


def test_each_job_is_asked_once_while_it_runs() -> None:
    run = Runner()
    jobs = SlurmJobs("gpu01", run, refresh_s=300, clock=lambda: 0.0)
    for _ in range(5):
        assert set(jobs.get({1, 2, 3})) == {1, 2, 3}
    assert len(run.calls) == 3


def test_slurmctld_down_costs_one_call_per_tick_not_one_per_job() -> None:
    run = Runner(fail=True)
    jobs = SlurmJobs("gpu01", run, clock=lambda: 0.0)
    assert jobs.get(set(range(1, 33))) == {}
    assert len(run.calls) == 1
    assert jobs.last_error is not None and "Unable to contact" in jobs.last_error


def test_known_jobs_stay_known_while_slurmctld_is_down() -> None:
    now = [0.0]
    run = Runner()
    jobs = SlurmJobs("gpu01", run, refresh_s=10, clock=lambda: now[0])
    jobs.get({1, 2})
    run.fail = True
    now[0] = 60.0  # both records are due for a refresh
    assert set(jobs.get({1, 2, 3})) == {1, 2}
    assert len(run.calls) == 3  # two at first, then one failed refresh
