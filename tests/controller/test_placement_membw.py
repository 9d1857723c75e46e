"""The submit hook's memory-bandwidth spread for CPU-only jobs (``MemBwSpreadGres``): the
admin record that lets coda-node measure a CPU workload, the GRES units a measured
memory-bound one asks for, and the node and partition limits that keep Slurm from refusing
the job."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from coda_common.config.codaconf import CodaConfig, parse_config
from coda_common.signature import Directives, workload_signature
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.slurmconf import read_slurm_conf
from coda_common.store.usage import CpuUsageRecord
from slurm_plugin.config.nodecap import NodeCap, gres_units_per_node, gres_units_per_partition
from slurm_plugin.decision.decide import (
    Decision,
    JobRequest,
    ProfileView,
    decide,
    parse_admin_record,
)

UID = 1000
GB = 1e9
SCRIPT = "#!/bin/sh\n./stream --threads 12\n"
SIG = workload_signature(UID, "stream", SCRIPT, Directives()).key


def cpu_view(key: str, bw_per_cpu: float | None, name: str = "stream") -> ProfileView:
    record = None if bw_per_cpu is None else CpuUsageRecord(bw_per_cpu, 40, 1_700_000_000.0)
    return ProfileView(key, name, 1, 0.0, 0, None, (), record)


PROFILES = {
    SIG: cpu_view(SIG, 5 * GB),
    "workload:*:shared-etl": cpu_view("workload:*:shared-etl", 3 * GB, "shared-etl"),
}

ON = {"mem_bw_spread_gres": "membw"}


def cpu_job(**fields: Any) -> JobRequest:
    base: dict[str, Any] = {
        "uid": UID,
        "job_name": "stream",
        "script": SCRIPT,
        "cpus_per_task": 12,
    }
    base.update(fields)
    return JobRequest(**base)


def units_200(gres: str, partitions: str | None) -> int | None:
    return 200 if gres == "membw" else None


def decide_cpu(
    req: JobRequest,
    profiles: dict[str, ProfileView] | None = None,
    gres_units: Any = units_200,
    gres_sep: str = ":",
    **conf: Any,
) -> Decision:
    cfg = dataclasses.replace(CodaConfig(), **{**ON, **conf})
    return decide(
        req,
        cfg,
        PROFILES if profiles is None else profiles,
        lambda gpn: None,
        gres_units=gres_units,
        gres_sep=gres_sep,
    )


def test_off_by_default_a_cpu_job_gets_nothing() -> None:
    d = decide(cpu_job(), CodaConfig(), PROFILES, lambda gpn: None, gres_units=units_200)
    assert (d.action, d.admin_comment, d.tres_per_node, d.user_msg) == ("skip", None, None, None)


def test_measured_memory_bound_job_asks_for_its_bandwidth() -> None:
    # 5 GB/s per CPU x 12 CPUs = 60 GB/s = 60 units of 1 GB/s.
    d = decide_cpu(cpu_job())
    assert d.action == "skip"
    assert d.tres_per_node == "gres:membw:60"
    record = parse_admin_record(d.admin_comment or "")
    assert record["sig"] == SIG and record["membw"] == "60"
    assert (record["cpg"], record["gpn"], record["action"], record["src"]) == (
        "",
        "0",
        "skip",
        "none",
    )
    assert d.user_msg is not None and "gres:membw:60 per node" in d.user_msg
    assert "5.0 GB/s per CPU" in d.user_msg
    assert "membw=60" in d.log_msg and f"sig={SIG}" in d.log_msg


def test_cpus_per_node_come_from_tasks_and_cpus_per_task() -> None:
    # 4 tasks per node x 3 CPUs each = 12 CPUs; 2 nodes change nothing per node.
    d = decide_cpu(cpu_job(cpus_per_task=3, ntasks_per_node=4, min_nodes=2))
    assert d.tres_per_node == "gres:membw:60"
    assert parse_admin_record(d.admin_comment or "")["nodes"] == "2"
    # No -c: one CPU per task.
    d = decide_cpu(cpu_job(cpus_per_task=0xFFFE, num_tasks=8))
    assert d.tres_per_node == "gres:membw:40"


def test_unmeasured_job_gets_a_record_only() -> None:
    d = decide_cpu(cpu_job(job_name="other"))
    assert d.tres_per_node is None and d.user_msg is None
    record = parse_admin_record(d.admin_comment or "")
    assert "membw" not in record and record["sig"].startswith(f"script:{UID}:")
    assert "not measured yet" in d.log_msg


def test_compute_bound_job_asks_for_nothing() -> None:
    profiles = {SIG: cpu_view(SIG, 1.9 * GB)}  # below MemBwHeavyBytesPerSPerCpu=2e9
    d = decide_cpu(cpu_job(), profiles)
    assert d.tres_per_node is None and d.admin_comment is not None
    assert "not memory-bound (1.9 GB/s per CPU" in d.log_msg
    # The threshold is the admin's.
    d = decide_cpu(cpu_job(), profiles, mem_bw_heavy_bytes_per_s_per_cpu=1e9)
    assert d.tres_per_node == "gres:membw:23"  # 1.9 x 12 = 22.8, rounded up


def test_a_gpu_profile_without_cpu_usage_asks_for_nothing() -> None:
    profiles = {SIG: ProfileView(SIG, "stream", 8, 0.95, 12, None)}
    d = decide_cpu(cpu_job(), profiles)
    assert d.tres_per_node is None and "not measured yet" in d.log_msg


def test_shared_workload_profile_is_used() -> None:
    d = decide_cpu(cpu_job(job_name="etl", comment="coda:workload=shared-etl", cpus_per_task=4))
    assert d.tres_per_node == "gres:membw:12"
    assert parse_admin_record(d.admin_comment or "")["sig"] == f"workload:{UID}:shared-etl"


def test_an_absurd_measurement_asks_for_a_whole_node_and_no_more() -> None:
    profiles = {SIG: cpu_view(SIG, 1e308)}
    d = decide_cpu(cpu_job(cpus_per_task=64), profiles, gres_units=lambda gres, parts: 100)
    assert d.tres_per_node == "gres:membw:100"


def test_never_more_than_the_partitions_nodes_have() -> None:
    d = decide_cpu(cpu_job(cpus_per_task=64), gres_units=lambda gres, parts: 100)
    assert d.tres_per_node == "gres:membw:100"  # 320 GB/s wanted, 100 units per node


def test_a_partition_without_the_gres_everywhere_gets_none() -> None:
    seen: list[tuple[str, str | None]] = []

    def none(gres: str, parts: str | None) -> int | None:
        seen.append((gres, parts))
        return None

    d = decide_cpu(cpu_job(partition="batch"), gres_units=none)
    assert d.tres_per_node is None and d.admin_comment is not None
    assert seen == [("membw", "batch")]
    assert "not every node of partitions batch has membw" in d.log_msg


def test_existing_gres_request_kept_and_extended() -> None:
    d = decide_cpu(cpu_job(tres_per_node="gres:tmpfs:10"))
    assert d.tres_per_node == "gres:tmpfs:10,gres:membw:60"
    # A job that asked for the GRES itself keeps its own request.
    d = decide_cpu(cpu_job(tres_per_node="gres:membw:5"))
    assert d.tres_per_node is None and "asked for membw itself" in d.log_msg


def test_spelled_as_the_running_slurm_spells_a_gres() -> None:
    assert decide_cpu(cpu_job(), gres_sep="/").tres_per_node == "gres/membw:60"


@pytest.mark.parametrize(
    "req",
    [
        cpu_job(comment="coda:off"),
        cpu_job(comment="coda:bogus"),  # not refused on a CPU job, and not measured
    ],
)
def test_opt_out_and_malformed_directives_get_nothing(req: JobRequest) -> None:
    d = decide_cpu(req)
    assert (d.action, d.admin_comment, d.tres_per_node) == ("skip", None, None)


def test_excluded_partition_is_left_alone() -> None:
    d = decide_cpu(cpu_job(partition="debug"), exclude_partitions=("debug",))
    assert (d.admin_comment, d.tres_per_node) == (None, None)


def test_an_excluded_default_partition_is_left_alone() -> None:
    cfg = dataclasses.replace(CodaConfig(), exclude_partitions=("debug",), **ON)
    d = decide(
        cpu_job(), cfg, PROFILES, lambda gpn: None, gres_units=units_200, default_partition="debug"
    )
    assert (d.admin_comment, d.tres_per_node) == (None, None)
    # Another default partition: the job is spread.
    d = decide(
        cpu_job(), cfg, PROFILES, lambda gpn: None, gres_units=units_200, default_partition="gpu"
    )
    assert d.tres_per_node == "gres:membw:60"


def test_partitions_key_does_not_apply_to_cpu_jobs() -> None:
    d = decide_cpu(cpu_job(partition="gpu_spare"), partitions=("gpu",))
    assert d.tres_per_node == "gres:membw:60"


def test_advise_mode_writes_the_record_and_nothing_else() -> None:
    d = decide_cpu(cpu_job(), mode="advise")
    assert d.tres_per_node is None and d.user_msg is None
    assert parse_admin_record(d.admin_comment or "")["would-membw"] == "60"


def test_advise_mode_says_the_route_it_would_give() -> None:
    d = decide_cpu(cpu_job(), mode="advise", cpu_job_partitions=("batch", "gpu_spare"))
    assert d.partition is None and d.tres_per_node is None
    assert "would-part=batch,gpu_spare would-membw=60" in d.log_msg


def test_mode_off_writes_nothing() -> None:
    d = decide_cpu(cpu_job(), mode="off")
    assert (d.admin_comment, d.tres_per_node) == (None, None)


def test_routing_and_spread_together() -> None:
    seen: list[str | None] = []

    def units(gres: str, parts: str | None) -> int | None:
        seen.append(parts)
        return 200

    d = decide_cpu(cpu_job(), gres_units=units, cpu_job_partitions=("batch", "gpu_spare"))
    assert d.partition == "batch,gpu_spare"
    assert d.tres_per_node == "gres:membw:60"
    assert seen == ["batch,gpu_spare"]  # the cap is for the partitions the job is offered
    assert d.user_msg is not None
    assert d.user_msg.startswith("coda: CPU-only job offered partitions batch,gpu_spare")
    assert "part=batch,gpu_spare" in d.log_msg


def test_hostile_names_stay_out_of_the_record() -> None:
    d = decide_cpu(cpu_job(job_name="x;membw=9999 coda:sig=workload:0:root", script=None))
    record = parse_admin_record(d.admin_comment or "")
    assert record["sig"].startswith(f"name:{UID}:") and "membw" not in record
    assert " " not in (d.admin_comment or "")


# -------------------------------------------------------------------------------- coda.conf


def test_keys_parse_and_default_off() -> None:
    config, warnings = parse_config(
        "MemBwSpreadGres=membw MemBwHeavyBytesPerSPerCpu=3e9 MemBwUnitBytesPerS=5e8\n"
    )
    assert warnings == []
    assert config.mem_bw_spread_gres == "membw"
    assert (config.mem_bw_heavy_bytes_per_s_per_cpu, config.mem_bw_unit_bytes_per_s) == (3e9, 5e8)
    default = CodaConfig()
    assert default.mem_bw_spread_gres is None
    assert (default.mem_bw_heavy_bytes_per_s_per_cpu, default.mem_bw_unit_bytes_per_s) == (2e9, 1e9)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("MemBwSpreadGres=gpu", "other than gpu"),
        ("MemBwSpreadGres=membw:200", "must be a GRES name"),
        ("MemBwUnitBytesPerS=0", "MemBwUnitBytesPerS must be greater than 0"),
        ("MemBwHeavyBytesPerSPerCpu=2GB", "must be a number"),
    ],
)
def test_bad_keys_are_refused(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert needle in str(info.value)


# -------------------------------------------------------------------------------- slurm.conf

SLURM_CONF = """\
GresTypes=gpu,membw
NodeName=DEFAULT Gres=gpu:4,membw:200 CPUs=64
NodeName=gpu[01-02]
NodeName=gpu03 Gres=gpu:4,membw:150
NodeName=cpu[01-02] CPUs=128 Gres=
PartitionName=DEFAULT MaxTime=INFINITE
PartitionName=gpu Nodes=gpu[01-03] Default=YES
PartitionName=fast Nodes=gpu[01-02]
PartitionName=batch Nodes=cpu[01-02],gpu01
PartitionName=all Nodes=ALL
PartitionName=set Nodes=gpunodes
"""


@pytest.fixture
def cap(tmp_path: Path) -> NodeCap:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SLURM_CONF)
    return NodeCap.from_slurm_conf(conf, lambda level, msg: None)


@pytest.mark.parametrize(
    ("partitions", "units"),
    [
        ("fast", 200),
        ("gpu", 150),  # the smallest node of the partition
        (None, 150),  # no --partition: the Default=YES partition
        ("", 150),
        ("fast,gpu", 150),  # every partition the job may start in
        ("batch", None),  # cpu01 has no membw: Slurm would refuse the job there
        ("fast,batch", None),
        ("all", None),
        ("set", None),  # a NodeSet or feature name: not known here
        ("nosuch", None),
    ],
)
def test_gres_units_per_partition(cap: NodeCap, partitions: str | None, units: int | None) -> None:
    assert cap.gres_units("membw", partitions) == units
    assert cap.gres_units("pcie", partitions) is None


def test_slurm_conf_partitions_and_gres_are_read(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SLURM_CONF)
    nodes, partitions = read_slurm_conf(conf)
    assert [(n.names, n.gpus, n.gres) for n in nodes] == [
        ("gpu[01-02]", 4, (("membw", 200),)),
        ("gpu03", 4, (("membw", 150),)),
        ("cpu[01-02]", 0, ()),
    ]
    assert [(p.name, p.nodes, p.default) for p in partitions] == [
        ("gpu", "gpu[01-03]", True),
        ("fast", "gpu[01-02]", False),
        ("batch", "cpu[01-02],gpu01", False),
        ("all", "ALL", False),
        ("set", "gpunodes", False),
    ]
    per = gres_units_per_partition(nodes, partitions, "membw")
    assert per == {"gpu": 150, "fast": 200, "batch": None, "all": None, "set": None}
    assert gres_units_per_node(per, "gpu", None) == 150
    assert gres_units_per_node(per, None, None) is None  # no Default=YES partition
    assert gres_units_per_node(per, "gpu", "gpu,nosuch") is None


def test_unreadable_slurm_conf_never_asks(tmp_path: Path) -> None:
    messages: list[str] = []
    cap = NodeCap.from_slurm_conf(tmp_path / "missing.conf", lambda lvl, msg: messages.append(msg))
    assert cap.gres_units("membw", "gpu") is None and messages


def test_the_node_daemon_takes_the_record_the_hook_writes() -> None:
    # What slurmctld stores: the record, its token, the user's line after a blank.
    from coda_node.system.slurmjobs import hook_record

    for req in (cpu_job(), cpu_job(job_name="other"), cpu_job(comment="coda:workload=etl")):
        d = decide_cpu(req)
        stored = f"{d.admin_comment};tok=0123456789abcdef {d.user_msg or ''}".strip()
        record, problem = hook_record(stored, UID)
        assert problem is None and record is not None
        assert record["sig"] == parse_admin_record(d.admin_comment or "")["sig"]
        # Another user's job cannot carry it into their profile.
        assert hook_record(stored, UID + 1)[0] is None


@pytest.mark.parametrize(
    ("lines", "default", "nodes_of"),
    [
        # Slurm takes the last partition that says Default=YES.
        (
            "PartitionName=a Nodes=gpu01 Default=YES\nPartitionName=b Nodes=cpu01 Default=YES\n",
            "b",
            {"a": "gpu01", "b": "cpu01"},
        ),
        # Its boolean words, in any case.
        ("PartitionName=a Nodes=gpu01 Default=true\n", "a", {"a": "gpu01"}),
        ("PartitionName=a Nodes=gpu01 Default=1\nPartitionName=b Nodes=gpu01\n", "a", None),
        ("PartitionName=a Nodes=gpu01 Default=Up\n", "a", None),
        ("PartitionName=a Nodes=gpu01 Default=NO\n", None, None),
        # PartitionName=DEFAULT values hold for later lines that do not set their own.
        (
            "PartitionName=DEFAULT Nodes=gpu[01-02]\nPartitionName=a\n"
            "PartitionName=b Nodes=cpu01\n",
            None,
            {"a": "gpu[01-02]", "b": "cpu01"},
        ),
        (
            "PartitionName=DEFAULT Default=YES\nPartitionName=a Nodes=gpu01\n"
            "PartitionName=b Nodes=cpu01 Default=NO\n",
            "a",
            None,
        ),
    ],
)
def test_the_default_partition_is_slurms(
    tmp_path: Path, lines: str, default: str | None, nodes_of: dict[str, str] | None
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "NodeName=gpu[01-02] CPUs=64 Gres=gpu:4,membw:200\nNodeName=cpu01 CPUs=64\n" + lines
    )
    _, partitions = read_slurm_conf(conf)
    assert [p.name for p in partitions if p.default] == ([default] if default else [])
    if nodes_of is not None:
        assert {p.name: p.nodes for p in partitions} == nodes_of
    cap = NodeCap.from_slurm_conf(conf, lambda level, msg: None)
    want = None if default is None or "cpu01" in cap_nodes(partitions, default) else 200
    assert cap.gres_units("membw", None) == want


def cap_nodes(partitions: Any, name: str) -> str:
    return next(p.nodes for p in partitions if p.name == name)
