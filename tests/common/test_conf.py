"""coda.conf parsing (coda_common.config.codaconf) and slurm.conf node shapes
(coda_common.slurm.slurmconf)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from coda_common.config.codaconf import CONFIG_KEYS, CodaConfig, load_config, parse_config
from coda_common.slurm.conffile import ConfigError
from coda_common.slurm.hostlist import count_hostlist
from coda_common.slurm.slurmconf import NodeShape, read_slurm_nodes
from slurm_plugin.config.nodecap import NodeCap, max_cpus_per_gpu_on_any_node

# ------------------------------------------------------------------------- coda.conf


def test_empty_file_gives_defaults() -> None:
    config, warnings = parse_config("")
    assert config == CodaConfig()
    assert warnings == []
    assert config.mode == "enforce"
    assert config.user_value == "keep"
    assert config.profile_store == Path("/var/lib/coda/profiles")
    assert (config.min_cpus_per_gpu, config.max_cpus_per_gpu) == (1, 64)
    assert config.default_cpus_per_gpu is None
    assert config.min_confidence == 0.8
    assert config.multi_node_gpu_cap == 2
    assert config.hook_budget_ms == 20.0
    assert config.reload_interval_s == 5.0
    assert config.partitions == ()
    assert config.exclude_partitions == ()
    assert config.log_level == "info"
    assert config.slurm_conf is None


def test_every_key_documented_and_default_matches_dataclass() -> None:
    assert len(CONFIG_KEYS) == len(dataclasses.fields(CodaConfig))
    for key, spec in CONFIG_KEYS.items():
        assert spec.help and spec.type, key
        # Writing the documented default explicitly changes nothing.
        value = f'"{spec.default}"' if spec.default == "" else spec.default
        config, _ = parse_config(f"{key}={value}\n")
        assert config == CodaConfig(), key


FULL = """\
# CODA configuration
ProfileStore="/srv/coda/profiles"   # quoted path
mode=ADVISE
USERVALUE=lower
MinCpusPerGpu=2 MaxCpusPerGpu=32
DefaultCpusPerGpu=4
MinConfidence=0.9
MultiNodeGpuCap=4
HookBudgetMs=5.5
ReloadIntervalS=30
Partitions="gpu, gpu-long,gpu"
ExcludePartitions=debug
LogLevel=Verbose
SlurmConf=/etc/slurm/slurm.conf
"""


def test_full_config() -> None:
    config, warnings = parse_config(FULL)
    assert warnings == []
    assert config == CodaConfig(
        profile_store=Path("/srv/coda/profiles"),
        mode="advise",
        user_value="lower",
        min_cpus_per_gpu=2,
        max_cpus_per_gpu=32,
        default_cpus_per_gpu=4,
        min_confidence=0.9,
        multi_node_gpu_cap=4,
        hook_budget_ms=5.5,
        reload_interval_s=30.0,
        partitions=("gpu", "gpu-long"),
        exclude_partitions=("debug",),
        log_level="verbose",
        slurm_conf=Path("/etc/slurm/slurm.conf"),
    )


@pytest.mark.parametrize(
    ("text", "attr", "value"),
    [
        ("Mode=off", "mode", "off"),
        ("UserValue=replace", "user_value", "replace"),
        ("", "user_message", "batch"),
        ("UserMessage=all", "user_message", "all"),
        ("UserMessage=None", "user_message", "none"),
        ("DefaultCpusPerGpu=", "default_cpus_per_gpu", None),
        ('DefaultCpusPerGpu=""', "default_cpus_per_gpu", None),
        ("MinConfidence=0", "min_confidence", 0.0),
        ("MinConfidence=1", "min_confidence", 1.0),
        ("MinConfidence=.5", "min_confidence", 0.5),
        ("HookBudgetMs=1e-1", "hook_budget_ms", 0.1),
        ("Partitions=", "partitions", ()),
        ("Partitions=a,,b,", "partitions", ("a", "b")),
        ('ProfileStore="/path with spaces/p"', "profile_store", Path("/path with spaces/p")),
        (r"ProfileStore=/odd\#dir", "profile_store", Path("/odd#dir")),
        ('ProfileStore="/odd#dir" # comment', "profile_store", Path("/odd#dir")),
        ("MaxCpusPerGpu=4\\\n8", "max_cpus_per_gpu", 48),  # continuation: appended as is
        ("MinCpusPerGpu=2 \\\n  MaxCpusPerGpu=48", "max_cpus_per_gpu", 48),
        ("Mode=advise\r\n", "mode", "advise"),  # CRLF file
        ("  \t Mode=advise   ", "mode", "advise"),
        ("SlurmConf=", "slurm_conf", None),
        ("SlurmConf=conf/slurm.conf", "slurm_conf", Path("conf/slurm.conf")),
        ("NodeName=gpu-07", "node_name", "gpu-07"),
        ("NodeName=", "node_name", None),
        ("NodeStateDir=/run/coda", "node_state_dir", Path("/run/coda")),
        ("NodeRuntimeDir=/dev/shm/coda", "node_runtime_dir", Path("/dev/shm/coda")),
        ("NodeIntervalS=0.5", "node_interval_s", 0.5),
        ("NodeEnforce=", "node_enforce", ()),
        ("NodeEnforce=Quota,cpuset,quota", "node_enforce", ("quota", "cpuset")),
    ],
)
def test_values(text: str, attr: str, value: object) -> None:
    config, _ = parse_config(text)
    assert getattr(config, attr) == value


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("Mode=enforce\nFoo=1\n", 2, "unknown key 'Foo'"),
        ("\n\nModus=advise", 3, "did you mean Mode?"),
        ("Mode=fast", 1, "Mode must be one of enforce|advise|off"),
        ("Mode=", 1, "Mode must be one of"),
        ("UserValue=ignore", 1, "UserValue must be one of keep|lower|replace"),
        ("UserMessage=srun", 1, "UserMessage must be one of all|batch|none"),
        ("LogLevel=trace", 1, "LogLevel must be one of"),
        ("# x\nMinCpusPerGpu=0", 2, "MinCpusPerGpu must be 1..65533"),
        ("MinCpusPerGpu=-1", 1, "whole number"),
        ("MinCpusPerGpu=2.5", 1, "whole number"),
        ("MaxCpusPerGpu=99999999999", 1, "whole number"),
        ("MaxCpusPerGpu=70000", 1, "must be 1..65533"),
        ("MinCpusPerGpu=8\nMaxCpusPerGpu=4", 2, "MaxCpusPerGpu=4 is below MinCpusPerGpu=8"),
        ("MaxCpusPerGpu=4\nMinCpusPerGpu=8", 2, "is below"),
        ("MaxCpusPerGpu=16\n\nDefaultCpusPerGpu=32", 3, "DefaultCpusPerGpu=32 is outside"),
        ("DefaultCpusPerGpu=0", 1, "DefaultCpusPerGpu must be 1.."),
        ("MinConfidence=1.5", 1, "MinConfidence must be 0..1"),
        ("MinConfidence=nan", 1, "must be a number"),
        ("MinConfidence=-0.1", 1, "must be a number"),
        ("HookBudgetMs=0", 1, "HookBudgetMs must be greater than 0"),
        ("HookBudgetMs=inf", 1, "must be a number"),
        ("HookBudgetMs=1e999", 1, "must be a number"),  # would overflow to inf
        ("ReloadIntervalS=0.0", 1, "ReloadIntervalS must be at least 0.1"),
        # A wait this short makes the reloader spin: a core of slurmctld gone.
        ("ReloadIntervalS=1e-99", 1, "ReloadIntervalS must be at least 0.1"),
        ("NodeIntervalS=0.01", 1, "NodeIntervalS must be at least 0.1"),
        # A wait this long overflows the reloader thread's timer: it would end the thread.
        ("ReloadIntervalS=1e99", 1, "ReloadIntervalS must be at most 86400"),
        ("MultiNodeGpuCap=0", 1, "MultiNodeGpuCap must be 1.."),
        ("ProfileStore=relative/dir", 1, "absolute path"),
        ("ProfileStore=", 1, "ProfileStore needs a value"),
        ("Mode advise", 1, "expected Key=Value"),
        ("Mode=advise stray", 1, "expected Key=Value, got 'stray'"),
        ("=advise", 1, "missing key"),
        ('ProfileStore="/x', 1, "unterminated quote"),
        ('ProfileStore="/x"y', 1, "unexpected text after the quoted value"),
        ('ProfileStore=/x"y', 1, "stray quote"),
        ("Mode=advise\nMode=en\x01force", 2, "control character"),
        ("Partitions=gpu\x0bx", 1, "control character"),
        ("NodeEnforce=cpuset,mba", 1, "unknown mechanism 'mba'"),
        ("NodeStateDir=state", 1, "NodeStateDir must be an absolute path"),
        ("NodeRoot=", 1, "NodeRoot must be an absolute path"),
        ("NodeRuntimeDir=run", 1, "NodeRuntimeDir must be an absolute path"),
        ("NodeIntervalS=-1", 1, "must be"),
        # The daemon's wait between ticks cannot be longer than about 292 years.
        ("NodeIntervalS=1e10", 1, "NodeIntervalS must be at most 86400"),
        ('NodeName="gpu 01"', 1, "not a Slurm node name"),
    ],
)
def test_errors_carry_file_and_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/slurm/coda.conf")
    assert info.value.line == line
    assert str(info.value).startswith(f"/etc/slurm/coda.conf:{line}: ")
    assert fragment in str(info.value)


def test_duplicate_key_last_wins_with_warning() -> None:
    config, warnings = parse_config("Mode=advise\n# again\nmode=off\n", "c.conf")
    assert config.mode == "off"
    assert warnings == ["c.conf:3: Mode given again (first on line 1); the last value wins"]


def test_a_retired_key_loads_is_ignored_and_warned_about() -> None:
    """A site's coda.conf that still sets HookFastPath keeps loading, whatever the value."""
    config, warnings = parse_config("HookFastPath=no\nMode=advise\nhookfastpath=maybe\n", "c.conf")
    assert config == CodaConfig(mode="advise")
    assert warnings == [
        f"c.conf:{line}: HookFastPath no longer has an effect (every GPU job is decided by "
        "the hook's Python side); the line is ignored"
        for line in (1, 3)
    ]


def test_partition_both_managed_and_excluded_warns() -> None:
    config, warnings = parse_config("Partitions=gpu,a\nExcludePartitions=gpu\n", "c.conf")
    assert config.partitions == ("gpu", "a")
    assert len(warnings) == 1
    assert warnings[0].startswith("c.conf:2: partition 'gpu'")


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CodaConfig().mode = "off"  # type: ignore[misc]


def test_load_config_resolves_slurm_conf(tmp_path: Path) -> None:
    path = tmp_path / "coda.conf"
    path.write_text("Mode=advise\n")
    assert load_config(path).slurm_conf == tmp_path / "slurm.conf"
    path.write_text("SlurmConf=sub/slurm.conf\n")
    assert load_config(path).slurm_conf == tmp_path / "sub" / "slurm.conf"
    path.write_text("SlurmConf=/opt/slurm.conf\n")
    assert load_config(path).slurm_conf == Path("/opt/slurm.conf")


def test_load_config_reports_warnings(tmp_path: Path) -> None:
    path = tmp_path / "coda.conf"
    path.write_text("LogLevel=debug\nLogLevel=error\n")
    warnings: list[str] = []
    config = load_config(path, warnings=warnings)
    assert config.log_level == "error"
    assert warnings == [f"{path}:2: LogLevel given again (first on line 1); the last value wins"]


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.conf"
    with pytest.raises(ConfigError, match=r"nope\.conf: cannot read"):
        load_config(path)


def test_a_huge_conf_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "coda.conf"
    with path.open("wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB of zeros
    with pytest.raises(ConfigError, match=r"coda\.conf: larger than 67108864 bytes"):
        load_config(path)
    # A device that never ends is read no further than that either.
    with pytest.raises(ConfigError, match=r"larger than 67108864 bytes"):
        load_config(Path("/dev/zero"))


def test_load_config_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "coda.conf"
    path.write_bytes(b"Mode=advise\n# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:2: not valid UTF-8"


def test_load_config_error_uses_path_as_source(tmp_path: Path) -> None:
    path = tmp_path / "coda.conf"
    path.write_text("Mode=enforce\nBogus=1\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: unknown key 'Bogus'"):
        load_config(path)


# -------------------------------------------------------------------------- slurm.conf


@pytest.mark.parametrize(
    ("expr", "count"),
    [
        ("gpu01", 1),
        ("gpu[01-04]", 4),
        ("gpu[01-04,07]", 5),
        ("gpu[1-2]-ib[0-1]", 4),
        ("gpu[01-04],login1,cpu[1-10]", 15),
        ("a,b,c", 3),
        ("n[0-0]", 1),
    ],
)
def test_count_hostlist(expr: str, count: int) -> None:
    assert count_hostlist(expr) == count


@pytest.mark.parametrize("expr", ["gpu[01-04", "gpu01]", "gpu[4-1]", "gpu[a-b]", "x[[1]]"])
def test_count_hostlist_rejects(expr: str) -> None:
    with pytest.raises(ValueError):
        count_hostlist(expr)


SLURM_CONF = """\
ClusterName=test
SlurmctldHost=ctl
# defaults for the GPU nodes
NodeName=DEFAULT Sockets=2 CoresPerSocket=16 ThreadsPerCore=2 RealMemory=500000
NodeName=gpu[01-04] Gres=gpu:a100:4 State=UNKNOWN
NodeName=mig01 CPUs=64 Gres=gpu:1g.10gb:7,gpu:3g.40gb:2,shard:8
nodename=cpu[01-10] CPUs=128 Gres=""   # CPU-only
NodeName=DEFAULT Gres=gpu:2
NodeName=old[1-2] Sockets=1 CoresPerSocket=8 ThreadsPerCore=1
NodeName=board1 Boards=2 SocketsPerBoard=2 CoresPerSocket=4 ThreadsPerCore=1 \\
  Gres=gpu:v100:2(S:0-1),gpu:t4:1
PartitionName=gpu Nodes=gpu[01-04] Default=YES
Include nodes.d/*.conf
"""


def _write_cluster(tmp_path: Path) -> Path:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SLURM_CONF)
    (tmp_path / "nodes.d").mkdir()
    (tmp_path / "nodes.d" / "b.conf").write_text("NodeName=h100-[1-2] CPUs=96 Gres=gpu:h100:8\n")
    (tmp_path / "nodes.d" / "a.conf").write_text("Include extra.conf\n")  # relative to slurm.conf
    (tmp_path / "extra.conf").write_text("NodeName=tiny CPUs=4 Gres=gpu:4\n")
    return conf


def test_read_slurm_nodes(tmp_path: Path) -> None:
    nodes = read_slurm_nodes(_write_cluster(tmp_path))
    assert nodes == (
        NodeShape("gpu[01-04]", 64, 4, 4),
        NodeShape("mig01", 64, 9, 1, gres=(("shard", 8),)),
        NodeShape("cpu[01-10]", 128, 0, 10),
        NodeShape("old[1-2]", 8, 2, 2),  # later DEFAULT gives Gres=gpu:2
        NodeShape("board1", 16, 3, 1),
        # Includes follow in glob order, relative to slurm.conf's directory.
        NodeShape("tiny", 4, 4, 1),
        NodeShape("h100-[1-2]", 96, 8, 2),
    )


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("\nNodeName=n1 CPUs=lots\n", 2, "bad cpus value"),
        ("NodeName=n1 CPUs=4 Gres=gpu:a100:x\n", 1, "bad GPU count"),
        ("NodeName=n[1-\n", 1, "host list"),
        ("NodeName=n1 CPUs=4 Include\n", 1, "expected Key=Value"),
        ("Include missing.conf\n", 1, "Include missing.conf: no such file"),
        ("NodeName= CPUs=4\n", 1, "NodeName without a value"),
    ],
)
def test_read_slurm_nodes_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_slurm_nodes(conf)
    assert str(info.value).startswith(f"{conf}:{line}: ")
    assert fragment in str(info.value)


def test_include_loop_is_an_error(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("Include slurm.conf\n")
    with pytest.raises(ConfigError, match="Include loop"):
        read_slurm_nodes(conf)


def test_glob_include_without_matches_is_fine(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("Include none.d/*.conf\nNodeName=a CPUs=8 Gres=gpu:1\n")
    assert read_slurm_nodes(conf) == (NodeShape("a", 8, 1, 1),)


def test_missing_slurm_conf(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_slurm_nodes(tmp_path / "slurm.conf")


NODES = (
    NodeShape("gpu[01-04]", 64, 4, 4),
    NodeShape("h100", 96, 8, 1),
    NodeShape("small", 16, 2, 1),
    NodeShape("cpu", 128, 0, 10),
)


@pytest.mark.parametrize(
    ("gpus_per_node", "cap"),
    [
        (1, 96),  # cpu nodes do not count: no GPU
        (2, 48),
        (4, 24),
        (5, 19),
        (8, 12),
        (9, None),  # no node has 9 GPUs
        (0, None),
    ],
)
def test_max_cpus_per_gpu_on_any_node(gpus_per_node: int, cap: int | None) -> None:
    assert max_cpus_per_gpu_on_any_node(NODES, gpus_per_node) == cap
    assert NodeCap(NODES, "slurm.conf")(gpus_per_node) == cap


def test_no_node_info_means_no_cap() -> None:
    assert max_cpus_per_gpu_on_any_node((), 1) is None
    assert NodeCap((), "slurm.conf")(4) is None
