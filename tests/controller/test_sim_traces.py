"""Trace loaders of the what-if simulator (slurm_plugin.sim.traces).

The Philly-derived and Muri traces ship in the package (slurm_plugin/sim/data), so the tests
that read them always run. The Alibaba trace is not shipped (its terms do not grant
redistribution): its tests read it where `coda-slurm simulate` finds it (the folders of
``trace_dirs``, e.g. ``<repo>/../shared/data`` beside a source checkout) and skip, saying
why, where it is absent. Expected counts are recomputed here with a plain csv pass, not
taken from the loader.
"""

from __future__ import annotations

import csv
import gzip
import math
import re
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from slurm_plugin.sim.traces import (
    PACKAGED_TRACES,
    SACCT_COMMAND,
    NodeSpec,
    Trace,
    TraceError,
    alibaba_instructions,
    load_alibaba,
    load_muri,
    load_philly,
    load_sacct,
    load_trace,
    muri_stage_times,
    synthetic,
    trace_dirs,
    trace_file,
    uniform_nodes,
)

ALIBABA = Path("alibaba-gpu-v2023") / "openb_pod_list_default.csv"
ALIBABA_NODES = Path("alibaba-gpu-v2023") / "openb_node_list_gpu_node.csv"
ALIBABA_NO_TIMES = Path("alibaba-gpu-v2023") / "openb_pod_list_multigpu50.csv"
PHILLY = Path("philly-pollux") / "philly.csv"
MURI = Path("muri") / "cluster_trace.csv"


def shared(relative: Path) -> Path:
    path = trace_file(relative)
    if path is None:
        pytest.skip(
            f"public trace {relative} not installed (not shipped; to install it: "
            f"{alibaba_instructions()})"
        )
    return path


def rows_of(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_common(trace: Trace) -> None:
    trace.validate()
    assert trace.submit_s.dtype == np.float64
    assert trace.submit_s[0] == 0.0
    assert np.all(np.diff(trace.submit_s) >= 0)
    assert np.all(trace.duration_s > 0)
    assert trace.source and "\n" not in trace.source
    assert trace.notes


def note_with(trace: Trace, *words: str) -> str:
    found = [n for n in trace.notes if all(w in n for w in words)]
    assert found, f"no note with {words} in {trace.notes}"
    return found[0]


# ---------------------------------------------------------------------------------- Alibaba


def test_alibaba_default_matches_a_plain_csv_pass() -> None:
    pods = shared(ALIBABA)
    rows = rows_of(pods)
    ran = [
        r
        for r in rows
        if r["scheduled_time"] and int(r["deletion_time"]) > int(r["scheduled_time"])
    ]
    never = sum(1 for r in rows if not r["scheduled_time"])
    gpu_rows = [r for r in ran if int(r["num_gpu"]) > 0]
    shared_gpu = sum(1 for r in gpu_rows if int(r["gpu_milli"]) < 1000)
    cpus_per_gpu = [math.ceil(int(r["cpu_milli"]) / 1000) / int(r["num_gpu"]) for r in gpu_rows]

    trace = load_alibaba(pods)
    check_common(trace)
    assert trace.name == "alibaba-gpu-v2023"
    assert len(trace) == len(ran)
    summary = trace.summary()
    assert summary["gpu_jobs"] == len(gpu_rows)
    assert summary["cpu_jobs"] == len(ran) - len(gpu_rows)
    assert summary["median_cpus_per_gpu"] == statistics.median(cpus_per_gpu)
    assert summary["gpu_size_mix"] == dict(Counter(int(r["num_gpu"]) for r in gpu_rows))
    # Durations exclude the queueing in Alibaba's cluster.
    expected_gpu_s = sum(
        int(r["num_gpu"]) * (int(r["deletion_time"]) - int(r["scheduled_time"])) for r in ran
    )
    assert summary["gpu_hours"] == pytest.approx(expected_gpu_s / 3600)
    assert np.all(trace.cpus >= 1)
    assert np.all(trace.nodes == 1)
    assert np.all(trace.workload == -1)
    assert f"{never:,} pods never scheduled" in note_with(trace, "never scheduled")
    assert f"{shared_gpu:,} pods with gpu_milli < 1000" in note_with(trace, "GPU sharing")
    note_with(trace, "rounded up to whole cores")


def test_alibaba_node_inventory() -> None:
    pods = shared(ALIBABA)
    nodes = rows_of(shared(ALIBABA_NODES))
    trace = load_alibaba(pods)
    assert trace.node_specs is not None
    assert len(trace.node_specs) == 1213 == len(nodes)
    assert sum(n.gpus for n in trace.node_specs) == sum(int(r["gpu"]) for r in nodes)
    first = nodes[0]
    assert trace.node_specs[0] == NodeSpec(
        first["sn"], int(first["cpu_milli"]) // 1000, int(first["gpu"]), first["model"]
    )
    assert Counter(n.gpu_model for n in trace.node_specs) == Counter(r["model"] for r in nodes)
    assert trace.summary()["inventory_nodes"] == 1213
    # An explicit node list wins; without one next to the pods file there is no inventory.
    explicit = load_alibaba(pods, shared(ALIBABA_NODES))
    assert explicit.node_specs == trace.node_specs


def test_alibaba_file_without_times_is_refused() -> None:
    with pytest.raises(TraceError) as err:
        load_alibaba(shared(ALIBABA_NO_TIMES))
    text = str(err.value)
    assert "openb_pod_list_multigpu50.csv" in text
    assert "no creation/deletion times" in text
    for column in ("creation_time", "scheduled_time", "deletion_time"):
        assert column in text


ALIBABA_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_alibaba_small_file_spec_sharing_and_sorting(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(
        ALIBABA_HEADER
        + "p0,3152,1,1,460,V100M16|V100M32,BE,Running,500,900,510\n"  # shared GPU, typed
        + "p1,88000,1,8,1000,,LS,Succeeded,100,400,100\n"
        + "p2,0,1,0,0,,BE,Running,300,350,300\n"  # CPU-only, cpu_milli 0
        + "p3,4000,1,1,1000,T4,BE,Pending,200,260,\n"  # never scheduled
        + "p4,4000,1,1,1000,,BE,Failed,250,260,260\n"  # ran 0 s
    )
    trace = load_alibaba(pods)
    check_common(trace)
    assert trace.name == "alibaba-gpu-v2023:pods"
    assert trace.node_specs is None
    note_with(trace, "no node inventory")
    assert trace.submit_s.tolist() == [0.0, 200.0, 400.0]  # creation 100, 300, 500
    assert trace.duration_s.tolist() == [300.0, 50.0, 390.0]
    assert trace.gpus.tolist() == [8, 0, 1]
    assert trace.cpus.tolist() == [88, 1, 4]
    assert trace.gpu_model_names == ["V100M16|V100M32"]
    assert trace.gpu_model.tolist() == [-1, -1, 0]
    assert "1 pod never scheduled" in note_with(trace, "never scheduled")
    note_with(trace, "1 pod with deletion_time <= scheduled_time")
    note_with(trace, "1 pod with gpu_milli < 1000")
    note_with(trace, "1 pod with cpu_milli = 0")
    note_with(trace, "1 pod with a GPU type constraint")


def test_alibaba_bad_cell_names_line_and_column(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(
        ALIBABA_HEADER
        + "p0,4000,1,1,1000,,BE,Running,0,10,0\n"
        + "p1,4000,1,two,1000,,BE,Running,0,10,0\n"
    )
    with pytest.raises(TraceError, match=r"pods\.csv:3: column 'num_gpu': 'two'"):
        load_alibaba(pods)
    pods.write_text(ALIBABA_HEADER + "p0,4000,1,1,1000,,BE,Running,0,10\n")
    with pytest.raises(TraceError, match=r"pods\.csv:2: 10 fields, expected 11"):
        load_alibaba(pods)
    with pytest.raises(TraceError, match=r"nope\.csv: no such file"):
        load_alibaba(tmp_path / "nope.csv")


# ----------------------------------------------------------------------------------- Philly


def test_philly_matches_a_plain_csv_pass() -> None:
    path = shared(PHILLY)
    rows = rows_of(path)
    kept = [r for r in rows if float(r["duration"]) > 0 and int(r["num_gpus"]) > 0]
    trace = load_philly(path)
    check_common(trace)
    assert trace.name == "philly"
    assert len(trace) == len(kept)
    assert trace.summary()["gpu_size_mix"] == dict(Counter(int(r["num_gpus"]) for r in kept))
    assert np.all(trace.cpus == -1) and np.all(trace.nodes == 1)
    assert np.all(trace.workload == -1) and np.all(trace.gpu_model == -1)
    assert trace.summary()["median_cpus_per_gpu"] is None
    first = min(r["timestamp"] for r in kept)  # ISO strings sort like times
    last = max(r["timestamp"] for r in kept)
    span = np.datetime64(last) - np.datetime64(first)
    assert trace.submit_s[-1] == span.astype("timedelta64[s]").astype(float)
    assert trace.duration_s.sum() == pytest.approx(sum(float(r["duration"]) for r in kept))
    assert f"{len(rows) - len(kept)} jobs with duration <= 0" in note_with(trace, "duration <= 0")
    note_with(trace, "sorted by submit time")
    note_with(trace, "more than 8 GPUs")


def test_philly_drops_and_bad_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-09 07:00:55,0.0,1,0.0,a\n"
        "2017-10-09 06:59:55,10.0,0,0.0,b\n"
        "2017-10-09 06:00:55,20.0,2,40.0,b\n"
    )
    trace = load_philly(path)
    assert trace.submit_s.tolist() == [0.0, 3660.0]
    assert trace.gpus.tolist() == [2, 1]
    note_with(trace, "1 job with duration <= 0 dropped")
    note_with(trace, "1 job with num_gpus <= 0 dropped")
    path.write_text(
        "timestamp,duration,num_gpus\n2017-10-09 07:01:55,66.0,1\n2017-10-32 07:01:55,66.0,1\n"
    )
    with pytest.raises(TraceError, match=r"philly\.csv:3: column 'timestamp': '2017-10-32"):
        load_philly(path)
    path.write_text("timestamp,num_gpus\n2017-10-09 07:01:55,1\n")
    with pytest.raises(TraceError, match=r"missing column\(s\) duration"):
        load_philly(path)


@pytest.mark.parametrize("gpus", ["4294967298", "1e23"])
def test_philly_gpu_count_beyond_any_job_names_the_cell(tmp_path: Path, gpus: str) -> None:
    # 4294967298 is 2 once cut to 32 bits: read, it would replay as a 2-GPU job.
    path = tmp_path / "philly.csv"
    path.write_text(f"timestamp,duration,num_gpus\n2017-10-09 07:01:55,66.0,{gpus}\n")
    with pytest.raises(TraceError, match=r"philly\.csv:2: column 'num_gpus': .*at most"):
        load_philly(path)


# ------------------------------------------------------------------------------------- Muri


def test_muri_times_are_ms_converted_to_s() -> None:
    path = shared(MURI)
    rows = rows_of(path)
    trace = load_muri(path)
    check_common(trace)
    assert trace.name == "muri"
    assert len(trace) == len(rows)
    # duration ≈ iterations x iteration_time [ms]: the evidence that durations are ms.
    ratio = statistics.median(
        float(r["duration"]) / (int(r["iterations"]) * float(r["iteration_time"])) for r in rows
    )
    assert 0.9 < ratio < 1.1
    note_with(trace, "read as ms")
    submits_ms = sorted(int(r["submit_time"]) for r in rows)
    assert trace.submit_s[-1] == (submits_ms[-1] - submits_ms[0]) / 1000
    assert trace.duration_s.sum() == pytest.approx(sum(float(r["duration"]) for r in rows) / 1000)
    assert trace.workload_names == sorted({r["model_name"] for r in rows})
    assert Counter(trace.workload_names[w] for w in trace.workload) == Counter(
        r["model_name"] for r in rows
    )
    assert trace.summary()["gpu_size_mix"] == dict(Counter(int(r["num_gpu"]) for r in rows))
    assert np.all(trace.cpus == -1)


def test_muri_stage_times_are_per_model_medians() -> None:
    path = shared(MURI)
    rows = rows_of(path)
    stages = muri_stage_times(path)
    assert set(stages) == {r["model_name"] for r in rows}
    for model in ("resnet18", "bert"):
        mine = [r for r in rows if r["model_name"] == model]
        expected = tuple(
            statistics.median(float(r[f"resource_time_{k}"]) for r in mine) for k in range(3)
        )
        assert stages[model] == pytest.approx(expected)
    # The data stage dominates the CPU-bound models, the GPU stage the language models.
    assert stages["resnet18"][0] > stages["resnet18"][1]
    assert stages["gpt2"][1] > stages["gpt2"][0]
    one_gpu = muri_stage_times(path, num_gpu=1)
    assert all(comm == 0 for _, _, comm in one_gpu.values())


def test_muri_seconds_file_and_unknown_unit(tmp_path: Path) -> None:
    path = tmp_path / "muri.csv"
    head = "job_id,num_gpu,submit_time,iterations,model_name,duration,iteration_time\n"
    path.write_text(head + "0,1,10,1000,bert,200,200\n1,2,0,1000,gpt2,400,400\n")
    trace = load_muri(path)  # 1000 iterations x 200 ms = 200 s: durations are in s
    assert trace.duration_s.tolist() == [400.0, 200.0]
    assert trace.submit_s.tolist() == [0.0, 10.0]
    note_with(trace, "duration read as s")
    path.write_text(head + "0,1,10,1000,bert,20,200\n")
    with pytest.raises(TraceError, match="cannot tell the time unit"):
        load_muri(path)


# ------------------------------------------------------------------------------------ sacct

SACCT_HEADER = "JobID|JobName|User|Partition|Submit|Start|End|State|NNodes|AllocTRES|ReqTRES"


def write_sacct(tmp_path: Path, *lines: str, header: str = SACCT_HEADER) -> Path:
    path = tmp_path / "march.txt"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_sacct_export(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path,
        "100|train|alice|gpu|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T11:05:00|"
        "COMPLETED|1|billing=8,cpu=8,gres/gpu=2,mem=64G,node=1|billing=8,cpu=8,gres/gpu=2,node=1",
        "100.batch|batch||gpu|2024-03-01T10:00:00|2024-03-01T10:05:00|2024-03-01T11:05:00|"
        "COMPLETED|1|cpu=8,gres/gpu=2,mem=64G,node=1|",
        "101|train|alice|gpu|2024-03-01T10:30:00|Unknown|Unknown|CANCELLED by 1000|1||"
        "cpu=4,gres/gpu=1,node=1",
        "102|bert|bob|gpu|2024-03-01T09:00:00|2024-03-01T09:00:10|2024-03-01T12:00:10|"
        "TIMEOUT|2|billing=64,cpu=64,gres/gpu:a100=8,gres/gpu=8,mem=512G,node=2|cpu=64",
        "103_[4-9]|sweep|carol|gpu|2024-03-01T09:30:00|None|Unknown|PENDING|1||cpu=2,gres/gpu=1",
        "103_1|sweep|carol|gpu|2024-03-01T09:30:00|2024-03-01T09:31:00|2024-03-01T09:41:00|"
        "FAILED|1|cpu=2,gres/gpu:v100=1,node=1|cpu=2,gres/gpu:v100=1",
        "104|prep|alice|cpu|2024-03-01T10:40:00|2024-03-01T10:41:00|2024-03-01T10:41:00|"
        "COMPLETED|1|cpu=16,mem=8G,node=1|cpu=16",
        "105|train|alice|gpu|2024-03-01T11:00:00|2024-03-01T11:00:00|Unknown|RUNNING|1|"
        "cpu=8,gres/gpu=2,node=1|cpu=8,gres/gpu=2",
        "106|train|alice|gpu|2024-03-01T11:10:00|2024-03-01T11:20:00|2024-03-01T11:50:00|"
        "COMPLETED|1||cpu=6,gres/gpu=1,node=1",
    )
    trace = load_sacct(path)
    check_common(trace)
    assert trace.name == "sacct:march.txt"
    # Kept: 102 (09:00), 103_1 (09:30), 100 (10:00), 106 (11:10).
    assert trace.submit_s.tolist() == [0.0, 1800.0, 3600.0, 7800.0]
    assert trace.duration_s.tolist() == [10800.0, 600.0, 3600.0, 1800.0]
    assert trace.gpus.tolist() == [8, 1, 2, 1]
    assert trace.cpus.tolist() == [64, 2, 8, 6]
    assert trace.nodes.tolist() == [2, 1, 1, 1]
    assert [trace.gpu_model_names[m] if m >= 0 else None for m in trace.gpu_model] == [
        "a100",
        "v100",
        None,
        None,
    ]
    names = [trace.workload_names[w] for w in trace.workload]
    assert names == ["bob/bert", "carol/sweep", "alice/train", "alice/train"]
    note_with(trace, "1 job step (JobID with '.') skipped")
    note_with(trace, "1 job that never started")
    note_with(trace, "1 pending array-task range (")
    note_with(trace, "1 job without an End")
    note_with(trace, "1 job that ran 0 s")
    note_with(trace, "1 job with an empty AllocTRES used ReqTRES")
    assert "COMPLETED 2" in note_with(trace, "job states")


def test_sacct_cpus_columns_without_tres(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path,
        "7|job|ann|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:01:00|4|gpu:a100:2",
        header="JobID|JobName|User|Submit|Start|End|AllocCPUS|AllocGRES",
    )
    trace = load_sacct(path)
    assert trace.cpus.tolist() == [4] and trace.gpus.tolist() == [2]
    assert trace.gpu_model_names == ["a100"]
    assert trace.nodes.tolist() == [1]
    note_with(trace, "without a node count")


def test_sacct_missing_column_names_it_and_the_command(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path,
        "1|a|u|2024-03-01T10:00:00|2024-03-01T10:00:00|cpu=1",
        header="JobID|JobName|User|Submit|Start|AllocTRES",
    )
    with pytest.raises(TraceError) as err:
        load_sacct(path)
    text = str(err.value)
    assert "march.txt:1:" in text
    assert "missing column(s) End" in text
    assert SACCT_COMMAND in text
    path = write_sacct(
        tmp_path, "1|a|2024-03-01T10:00:00|x|y", header="JobID|JobName|Submit|Start|End"
    )
    with pytest.raises(TraceError, match="AllocTRES or ReqTRES"):
        load_sacct(path)


def test_sacct_malformed_lines_name_the_line(tmp_path: Path) -> None:
    good = (
        "1|a|u|gpu|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:01:00|COMPLETED|1|"
        "cpu=1,gres/gpu=1|cpu=1"
    )
    path = write_sacct(tmp_path, good, "2|b|u|gpu|2024-03-01T10:00:00|COMPLETED")
    with pytest.raises(TraceError, match=r"march\.txt:3: 6 fields, expected 11"):
        load_sacct(path)
    path = write_sacct(tmp_path, good, good.replace("2024-03-01T10:01:00", "yesterday"))
    with pytest.raises(TraceError, match=r"march\.txt:3: column 'End': 'yesterday'"):
        load_sacct(path)
    path = write_sacct(tmp_path, good, good.replace("gres/gpu=1", "gres/gpu=two"))
    with pytest.raises(TraceError, match=r"march\.txt:3: column 'AllocTRES': .*'two'"):
        load_sacct(path)


def test_sacct_nothing_ran_is_an_error(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path, "1|a|u|gpu|2024-03-01T10:00:00|Unknown|Unknown|PENDING|1||cpu=1,gres/gpu=1"
    )
    with pytest.raises(TraceError, match=r"no job that ran in 1 data line \(1 job that never"):
        load_sacct(path)


def test_sacct_trailing_delimiter_of_sacct_p(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path,
        "1|a|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:30|cpu=3|",
        header="JobID|JobName|Submit|Start|End|AllocTRES|",
    )
    trace = load_sacct(path)
    assert trace.cpus.tolist() == [3] and trace.gpus.tolist() == [0]
    assert trace.workload_names == ["a"]


GOOD_SACCT = (
    "1|a|u|gpu|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:01:00|COMPLETED|1|"
    "cpu=1,gres/gpu=1|cpu=1"
)


def test_a_damaged_gzip_export_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "march.txt.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match=r"march\.txt\.gz: not a readable .*gzip"):
        load_sacct(path)
    whole = gzip.compress(f"{SACCT_HEADER}\n{GOOD_SACCT}\n".encode())
    path.write_bytes(whole[: len(whole) // 2])  # cut off mid-stream
    with pytest.raises(TraceError, match=r"march\.txt\.gz: not a readable .*gzip"):
        load_sacct(path)


def test_a_time_with_a_utc_offset_names_the_cell(tmp_path: Path) -> None:
    path = write_sacct(tmp_path, GOOD_SACCT.replace("10:01:00", "10:01:00+05:00"))
    with pytest.raises(TraceError, match=r"march\.txt:2: column 'End': '2024-03-01T10:01:00\+05"):
        load_sacct(path)


@pytest.mark.parametrize(
    ("old", "new", "column"),
    [
        ("gres/gpu=1", "gres/gpu=99999999999999999999999", "AllocTRES"),
        ("gres/gpu=1", "gres/gpu=4294967298", "AllocTRES"),
        ("cpu=1,", "cpu=99999999999999999999999,", "AllocTRES"),
        ("|1|cpu", "|99999999999999999999|cpu", "NNodes"),
    ],
)
def test_a_count_beyond_any_cluster_names_the_cell(
    tmp_path: Path, old: str, new: str, column: str
) -> None:
    path = write_sacct(tmp_path, GOOD_SACCT.replace(old, new, 1))
    with pytest.raises(TraceError, match=rf"march\.txt:2: column '{column}': .*at most"):
        load_sacct(path)


# -------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_seeds_differ() -> None:
    a = synthetic(20_000, n_gpus=512, seed=7)
    b = synthetic(20_000, n_gpus=512, seed=7)
    c = synthetic(20_000, n_gpus=512, seed=8)
    for field in ("submit_s", "duration_s", "gpus", "cpus", "nodes", "workload"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.workload_names == b.workload_names
    assert not np.array_equal(a.duration_s, c.duration_s)
    assert not np.array_equal(a.gpus, c.gpus)


def test_synthetic_mix_and_offered_load() -> None:
    n_gpus = 1024
    trace = synthetic(50_000, n_gpus=n_gpus, seed=3, load=0.7)
    check_common(trace)
    offered = float(np.sum(trace.gpus * trace.duration_s)) / (n_gpus * trace.submit_s[-1])
    assert offered == pytest.approx(0.7, rel=0.2)
    gpu = trace.gpus > 0
    assert np.mean(~gpu) == pytest.approx(0.3, abs=0.02)
    sizes = Counter(trace.gpus[gpu].tolist())
    assert set(sizes) == {1, 2, 4, 8, 16, 32}
    assert sizes[1] / gpu.sum() == pytest.approx(0.6 * 0.95, abs=0.02)
    assert (sizes[16] + sizes[32]) / gpu.sum() == pytest.approx(0.05, abs=0.01)
    assert np.array_equal(trace.nodes, np.maximum(trace.gpus // 8, 1))
    assert set(trace.cpus[~gpu].tolist()) == set(range(1, 17))
    per_gpu = trace.cpus[gpu] / trace.gpus[gpu]
    uncapped = per_gpu[trace.cpus[gpu] < 96 * trace.nodes[gpu]]
    assert set(uncapped.tolist()) <= {2, 4, 6, 8, 10, 12, 16}
    assert np.all(trace.cpus <= 96 * trace.nodes)
    assert trace.duration_s.mean() == pytest.approx(3600, rel=0.15)
    popularity = np.bincount(trace.workload, minlength=200)
    assert popularity.argmax() == 0 and popularity[0] > 10 * popularity[100]
    assert trace.workload_names[:2] == ["w0000", "w0001"]
    assert trace.node_specs == uniform_nodes(128, 96, 8)


def test_synthetic_makes_one_million_jobs() -> None:
    # How long it takes is bench/bench_simulate.py's figure (setup_s), not a test's.
    trace = synthetic(1_000_000, n_gpus=10_000, seed=1)
    assert len(trace) == 1_000_000


def test_synthetic_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        synthetic(10, n_gpus=100, seed=1)
    with pytest.raises(ValueError, match="largest synthetic job"):
        synthetic(10, n_gpus=16, seed=1)
    with pytest.raises(ValueError, match="cpu_job_fraction"):
        synthetic(10, n_gpus=64, seed=1, cpu_job_fraction=1.0)


# ------------------------------------------------------------------------ Trace and helpers


def small_trace() -> Trace:
    return synthetic(100, n_gpus=64, seed=2)


def test_validate_catches_inconsistent_arrays() -> None:
    good = small_trace()
    good.validate()
    cases = {
        "submit_s has 100": lambda t: setattr(t, "duration_s", t.duration_s[:-1]),
        "sorted by submit time": lambda t: t.submit_s.__setitem__(5, 1e12),
        "duration_s must be > 0": lambda t: t.duration_s.__setitem__(3, 0.0),
        "gpus must be >= 0": lambda t: t.gpus.__setitem__(3, -1),
        "nodes must be >= 1": lambda t: t.nodes.__setitem__(3, 0),
        "cpus must be >= 1 or -1": lambda t: t.cpus.__setitem__(3, 0),
        "workload must be -1 or an index below 200": lambda t: t.workload.__setitem__(3, 200),
        "gpu_model must be -1 or an index below 0": lambda t: t.gpu_model.__setitem__(3, 0),
        "dtype float32": lambda t: setattr(t, "submit_s", t.submit_s.astype(np.float32)),
    }
    for message, damage in cases.items():
        trace = small_trace()
        damage(trace)
        with pytest.raises(TraceError, match=message):
            trace.validate()


def test_head_and_summary() -> None:
    trace = small_trace()
    head = trace.head(10)
    head.validate()
    assert len(head) == 10
    assert np.array_equal(head.gpus, trace.gpus[:10])
    assert "first 10 of 100 jobs" in head.notes[-1]
    assert len(trace.head(1000)) == 100
    summary = trace.summary()
    assert summary["jobs"] == 100
    assert summary["gpu_jobs"] + summary["cpu_jobs"] == 100
    assert summary["inventory_gpus"] == 64


def test_uniform_nodes() -> None:
    nodes = uniform_nodes(3, 64, 4, "A100")
    assert nodes == [NodeSpec(f"node000{i}", 64, 4, "A100") for i in range(3)]
    with pytest.raises(ValueError, match="n_nodes"):
        uniform_nodes(0, 64, 4)


# ------------------------------------------------------------------------------- load_trace


def test_philly_and_muri_ship_in_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh install: no admin folder, no user folder, nothing beside the checkout.
    monkeypatch.setenv("CODA_TRACE_DIR", str(tmp_path))
    assert trace_dirs() == [tmp_path, PACKAGED_TRACES]
    assert trace_file(PHILLY) == PACKAGED_TRACES / "philly-pollux" / "philly.csv.gz"
    assert trace_file(MURI) == PACKAGED_TRACES / "muri" / "cluster_trace.csv"
    assert len(load_trace(" Philly ")) > 80_000
    assert load_trace("muri").name == "muri"
    for folder in ("philly-pollux", "muri"):
        assert "Apache License" in (PACKAGED_TRACES / folder / "LICENSE").read_text()
        assert folder in (PACKAGED_TRACES / "README.md").read_text()


def test_an_admins_copy_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / MURI
    own.parent.mkdir(parents=True)
    own.write_text("num_gpu,submit_time,model_name,duration\n1,0,bert,5000\n")
    monkeypatch.setenv("CODA_TRACE_DIR", str(tmp_path))
    assert trace_file(MURI) == own
    assert len(load_trace("muri")) == 1
    # Without CODA_TRACE_DIR the user's own folder comes first.
    monkeypatch.delenv("CODA_TRACE_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert trace_dirs()[0] == tmp_path / "xdg" / "coda-slurm" / "traces"
    assert trace_dirs()[-1] == PACKAGED_TRACES


def test_load_trace_bare_alibaba_uses_an_installed_copy() -> None:
    shared(ALIBABA)
    assert load_trace("alibaba").name == "alibaba-gpu-v2023"


def test_alibaba_absent_says_where_to_get_it_and_where_to_put_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODA_TRACE_DIR", str(tmp_path))
    with pytest.raises(TraceError) as err:
        load_trace("alibaba")
    text = str(err.value)
    assert "not shipped" in text and "research or study" in text
    dest = tmp_path / "alibaba-gpu-v2023"
    for name in ("openb_pod_list_default.csv", "openb_node_list_gpu_node.csv"):
        assert f"curl -fLo {dest / name} https://raw.githubusercontent.com/alibaba/" in text
        assert f"cluster-trace-gpu-v2023/csv/{name}" in text
    assert f"mkdir -p {dest}" in text and "alibaba:PATH" in text


def test_load_trace_explicit_files(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(ALIBABA_HEADER + "p0,4000,1,1,1000,,BE,Running,0,10,0\n")
    assert len(load_trace(f"alibaba:{pods}")) == 1
    philly = tmp_path / "p.csv"
    philly.write_text("timestamp,duration,num_gpus\n2017-10-09 07:01:55,66.0,1\n")
    assert load_trace(f"philly:{philly}").name == "philly"
    muri = tmp_path / "m.csv"
    muri.write_text("num_gpu,submit_time,model_name,duration\n1,0,bert,5000\n")
    assert load_trace(f"muri:{muri}").duration_s.tolist() == [5.0]
    sacct = write_sacct(
        tmp_path,
        "1|a|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:30|cpu=3",
        header="JobID|JobName|Submit|Start|End|AllocTRES",
    )
    assert load_trace(f"sacct:{sacct}").name == "sacct:march.txt"


def test_load_trace_synthetic_options() -> None:
    trace = load_trace("synthetic:2k,gpus=64,seed=5,load=0.5")
    assert len(trace) == 2000
    assert trace.node_specs is not None and len(trace.node_specs) == 8
    same = synthetic(2000, n_gpus=64, seed=5, load=0.5)
    assert np.array_equal(trace.submit_s, same.submit_s)
    default = load_trace("synthetic:1_000")
    assert len(default) == 1000
    assert sum(n.gpus for n in default.node_specs or []) == 10_000
    many = load_trace("synthetic:300,gpus=64,cpu_jobs=0,workloads=5,cores_per_node=128")
    assert np.all(many.gpus > 0) and len(many.workload_names) == 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "unknown kind ''"),
        ("slurm:x.txt", "unknown kind 'slurm'; forms: alibaba"),
        ("sacct", "sacct needs the export file"),
        ("sacct:", "nothing after ':'"),
        ("synthetic", "synthetic needs a job count"),
        ("synthetic:many", "'many' is not a number"),
        ("synthetic:gpus=8", "the first item after 'synthetic:' is the job count"),
        ("synthetic:100,colour=red", "'colour=red' is not KEY=VALUE with KEY one of gpus"),
        ("synthetic:100,gpus=lots", "gpus='lots' is not a whole number"),
        ("synthetic:100,gpus=12", "multiple of gpus_per_node"),
    ],
)
def test_load_trace_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        load_trace(spec)


def test_load_trace_missing_file_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODA_TRACE_DIR", str(tmp_path))
    monkeypatch.setattr("slurm_plugin.sim.traces.PACKAGED_TRACES", tmp_path / "package")
    with pytest.raises(TraceError) as err:
        load_trace("philly")
    text = str(err.value)
    assert str(PHILLY) in text and str(tmp_path) in text and str(tmp_path / "package") in text
    assert "CODA_TRACE_DIR" in text and "philly:PATH" in text
    with pytest.raises(TraceError, match=r"gone\.txt: no such file"):
        load_trace(f"sacct:{tmp_path / 'gone.txt'}")


def test_sacct_typed_gpus_without_a_total(tmp_path: Path) -> None:
    path = write_sacct(
        tmp_path,
        "1|mix|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:30|"
        "cpu=12,gres/gpu:a100=2,gres/gpu:v100=1,gres/gpumem=80G",
        header="JobID|JobName|Submit|Start|End|AllocTRES",
    )
    trace = load_sacct(path)
    assert trace.gpus.tolist() == [3]
    assert trace.gpu_model_names == ["a100|v100"]
    note_with(trace, "1 held several types")


def test_alibaba_nothing_ran_is_an_error(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(ALIBABA_HEADER + "p0,4000,1,1,1000,,BE,Pending,0,10,\n")
    with pytest.raises(TraceError, match=r"pods\.csv: no jobs left after filtering: 1 pod never"):
        load_alibaba(pods)
