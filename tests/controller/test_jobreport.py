"""``coda-slurm job``'s pure parts: sacct's values, the verdict, the table; and the sacct
trace reader on names that hold the delimiter and line breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_plugin.cli.jobreport import (
    SACCT_FIELDS,
    ReportError,
    build_report,
    gpu_wait_verdict,
    parse_duration_s,
    parse_structured,
    render,
)
from slurm_plugin.sim.traces import load_sacct


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:01.661", 1.661),
        ("59:59.000", 3599.0),
        ("01:02:03", 3723.0),
        ("1-01:02:03", 90123.0),
        ("", None),
        ("INVALID", None),
    ],
)
def test_slurm_cpu_times(text: str, seconds: float | None) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(
    ("samples", "state", "verdict", "why"),
    [
        (None, "COMPLETED", "unknown", "no job summary"),
        (None, "RUNNING", "unknown", "reported nothing"),
        ({"gpu_util_pct": None}, "RUNNING", "unknown", "no GPU utilisation"),
        (
            {"gpu_util_pct": 95.0, "cpu_rate_cores": 4.0, "cores_in_force": 4},
            "RUNNING",
            "no",
            "95%",
        ),
        (
            {"gpu_util_pct": 40.0, "cpu_rate_cores": 3.9, "cores_in_force": 4},
            "RUNNING",
            "yes",
            "3.9 of its 4",
        ),
        (
            {"gpu_util_pct": 40.0, "cpu_rate_cores": 1.0, "cores_in_force": 4},
            "RUNNING",
            "no",
            "to spare",
        ),
    ],
)
def test_gpus_waiting_on_cpu(samples, state: str, verdict: str, why: str) -> None:
    out = gpu_wait_verdict(samples, state)
    assert out["verdict"] == verdict
    assert why in out["why"]


def _line(**values: str) -> str:
    base = dict.fromkeys(SACCT_FIELDS, "")
    base.update(values)
    base["JobIDRaw"] = base["JobIDRaw"] or base["JobID"]
    return "|".join(base[f] for f in SACCT_FIELDS)


def _report(admin_comment: str, name: str = "train") -> dict:
    text = "\n".join(
        [
            _line(
                JobID="7",
                State="COMPLETED",
                User="alice",
                NNodes="1",
                ElapsedRaw="100",
                AllocCPUS="8",
                ReqTRES="billing=1,cpu=1,gres/gpu=2,node=1",
                AllocTRES="billing=8,cpu=8,gres/gpu:a100=2,node=1",
                TotalCPU="06:40.000",
            ),
            _line(JobID="7.batch", TotalCPU="06:40.000", TRESUsageInTot="cpu=00:06:00,energy=0"),
        ]
    )
    return build_report(7, parse_structured(text, 7), name, admin_comment)


RECORD = "coda:sig=workload:1000:r50;cpg=4;was=cpg:2;action=raise;src=default;gpn=2;nodes=1;tok=ab"


def test_report_reads_the_record_the_allocation_and_the_cpu_time() -> None:
    report = _report(f'{RECORD} coda: --cpus-per-gpu=4 for workload "r50"')
    assert report["coda"]["record"] == RECORD
    assert report["coda"]["message"] == 'coda: --cpus-per-gpu=4 for workload "r50"'
    assert (report["coda"]["action"], report["coda"]["cpus_per_gpu"]) == ("raise", 4)
    assert report["allocated"] == {
        "gpus": 2,
        "cores": 8,
        "tres": "billing=8,cpu=8,gres/gpu:a100=2,node=1",
    }
    assert report["used"]["cpu_s"] == 400.0  # TotalCPU: the finished steps' rusage
    assert report["used"]["mean_cores"] == 4.0
    assert report["used"]["cpu_efficiency_pct"] == 50.0
    text = render(report)
    assert "4 cores per GPU (raise, from DefaultCpusPerGpu); the user asked 2 cores per GPU" in text
    assert "Asked                2 GPUs, 2 cores per GPU" in text


def test_report_of_a_job_the_hook_left_alone_and_a_hostile_name() -> None:
    report = _report("", name="a|b\nc\x1b[31m")
    assert report["coda"] is None
    lines = render(report).splitlines()
    assert lines[0] == "Job                  7 a|b\\nc\\x1b[31m (alice, )"
    assert "no coda record" in render(report)
    assert "1 cores" in render(report)  # ReqTRES's, without the hook's record of the request


@pytest.mark.parametrize(
    ("tokens", "said"),
    [
        (";membw=60", "CPU-only job, memory-bound: 60 units of memory bandwidth per node"),
        ("", "CPU-only job: recorded so coda-node measures its memory bandwidth"),
    ],
)
def test_report_of_a_cpu_only_jobs_record(tokens: str, said: str) -> None:
    record = f"coda:sig=workload:1000:stream;cpg=;was=;action=skip;src=none;gpn=0;nodes=1{tokens}"
    report = _report(f"{record};tok=ab")
    assert report["coda"]["mem_bw_units"] == (60 if tokens else None)
    assert said in render(report)


def test_a_job_sacct_does_not_list() -> None:
    with pytest.raises(ReportError, match="no job 8"):
        parse_structured(_line(JobID="7") + "\n", 8)


def test_an_array_task_is_found_by_its_own_id() -> None:
    text = (
        _line(JobIDRaw="125", JobID="123_2")
        + "\n"
        + _line(JobIDRaw="125.batch", JobID="123_2.batch")
    )
    record = parse_structured(text, 125)
    assert record.job["JobID"] == "123_2"
    assert len(record.steps) == 1


SACCT_HEADER = "JobID|JobName|User|Partition|Submit|Start|End|State|NNodes|AllocTRES|ReqTRES"


@pytest.mark.parametrize("trailing", ["", "|"])
def test_sacct_trace_reads_names_with_the_delimiter_and_line_breaks(
    tmp_path: Path, trailing: str
) -> None:
    rows = [
        ("1", "plain", "2024-03-01T10:00:00", "2024-03-01T10:00:10", "cpu=8,gres/gpu=2,node=1"),
        ("2", "a|b", "2024-03-01T10:00:05", "2024-03-01T10:01:05", "cpu=4,gres/gpu=1,node=1"),
        ("3", "x\ny|z\n", "2024-03-01T10:00:07", "2024-03-01T10:00:09", "cpu=1,node=1"),
    ]
    lines = [SACCT_HEADER + trailing]
    for job_id, name, start, end, tres in rows:
        lines.append(
            f"{job_id}|{name}|alice|gpu|2024-03-01T09:59:00|{start}|{end}|COMPLETED|1|{tres}|{tres}"
            + trailing
        )
    export = tmp_path / "sacct.txt"
    export.write_text("\n".join(lines) + "\n")
    trace = load_sacct(export)
    assert trace.gpus.tolist() == [2, 1, 0]
    assert trace.duration_s.tolist() == [10.0, 60.0, 2.0]
    assert sorted(trace.workload_names) == ["alice/a|b", "alice/plain", "alice/x\ny|z"]


def test_report_of_a_job_sized_by_a_prior_names_it() -> None:
    record = RECORD.replace("src=default", "src=prior:alexnet").replace("cpg=4", "cpg=19")
    text = render(_report(record))
    assert 'from the prior "alexnet" the job names' in text
