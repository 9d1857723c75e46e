"""``coda.conf``: CODA's configuration file, in Slurm's own syntax; and the node shapes
of ``slurm.conf``.

Syntax (as in ``cgroup.conf`` or ``gres.conf``)::

    # comment
    Mode=advise            # keys are case-insensitive
    ProfileStore="/var/lib/coda/profiles"
    Partitions=gpu,gpu-long  MinConfidence=0.9     # several pairs on one line are fine

``#`` starts a comment outside double quotes (``\\#`` is a literal ``#``); a line ending
in ``\\`` continues on the next.  Unknown keys are errors (``coda.conf:7: unknown key
...``); a key given twice keeps the last value and produces a warning.  Each key is
defined once, as a :class:`CodaConfig` field that carries its name, value syntax, default,
parser and help; :data:`CONFIG_KEYS` lists them.

Only :func:`load_config`, :func:`read_slurm_nodes`, :func:`read_slurm_conf`,
:func:`read_slurm_keys` and :func:`mtime_ns` touch files; everything else is pure.
"""

from __future__ import annotations

import glob
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

from coda_common.signature import (
    DEFAULT_SPEC,
    ScriptIgnore,
    SignatureIgnoreError,
    parse_script_ignore,
)

__all__ = [
    "CONFIG_KEYS",
    "RETIRED_KEYS",
    "CodaConfig",
    "ConfigError",
    "KeySpec",
    "NodeShape",
    "PartitionShape",
    "count_hostlist",
    "expand_hostlist",
    "gres_units_per_partition",
    "load_config",
    "parse_config",
    "read_slurm_conf",
    "read_slurm_keys",
    "read_slurm_nodes",
    "split_outside",
    "spread_partitions",
]

MAX_CPUS = 65533
"""Largest CPU count a key may hold (Slurm keeps cpus_per_task in a uint16 below NO_VAL16)."""

_MAX_INCLUDE_DEPTH = 16


class ConfigError(ValueError):
    """An invalid configuration; ``str()`` is ``source:line: message`` (or
    ``source: message`` when no line applies)."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


class KeySpec(NamedTuple):
    """One ``coda.conf`` key: how it is documented, read and stored."""

    name: str
    """The key as documented (the file's keys are matched case-insensitively)."""
    type: str
    """Value syntax, e.g. ``int``, ``float``, ``path``, ``enforce|advise|off``, ``list``."""
    default: str
    """The default as it would be written in the file (``""`` = empty)."""
    help: str
    parse: Callable[[str, str], Any]
    """``parse(key, value)`` -> the :class:`CodaConfig` value; ValueError (the message the
    user sees) when the value is invalid."""
    field: str = ""
    """The :class:`CodaConfig` field the key fills."""


# ---------------------------------------------------------------------- value parsing

Parser = Callable[[str, str], Any]
"""``parser(key, value)`` -> typed value; ValueError when invalid."""

_INT = re.compile(r"\+?[0-9]{1,9}")
_FLOAT = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?")
_GRES_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_FEATURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NODE_MECHANISMS = ("cpuset", "quota", "rdt")


def _int(key: str, value: str, low: int, high: int = MAX_CPUS) -> int:
    if _INT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{key} must be {low}..{high}, got {number}")
    return number


def _ints(low: int, high: int = MAX_CPUS) -> Parser:
    """A whole number in ``low..high``."""
    return lambda key, value: _int(key, value, low, high)


def _float(key: str, value: str) -> float:
    if _FLOAT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def _positive_float(key: str, value: str) -> float:
    number = _float(key, value)
    if not number > 0:
        raise ValueError(f"{key} must be greater than 0, got {value}")
    return number


def _float_at_least_0(key: str, value: str) -> float:
    number = _float(key, value)
    if number < 0:
        raise ValueError(f"{key} must be 0 or more, got {value}")
    return number


def _float_range(low: int, high: int) -> Parser:
    """A number in ``low..high``, both ends included."""

    def parse(key: str, value: str) -> float:
        number = _float(key, value)
        if not low <= number <= high:
            raise ValueError(f"{key} must be {low}..{high}, got {value}")
        return number

    return parse


def _percent(high: float) -> Parser:
    """A number above 0 and at most ``high``."""

    def parse(key: str, value: str) -> float:
        number = _float(key, value)
        if not 0.0 < number <= high:
            raise ValueError(f"{key} must be more than 0 and at most {high:g}, got {value}")
        return number

    return parse


def _or_none(parse: Parser) -> Parser:
    """``parse``, or None for an empty value."""
    return lambda key, value: parse(key, value) if value else None


def _choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    lowered = value.lower()
    if lowered not in choices:
        raise ValueError(f"{key} must be one of {'|'.join(choices)}, got {value!r}")
    return lowered


def _one_of(*choices: str) -> Parser:
    """One of ``choices``, any case; the lower-case choice."""
    return lambda key, value: _choice(key, value, choices)


def _yes_no(key: str, value: str) -> bool:
    return _choice(key, value, ("yes", "no")) == "yes"


def _abs_path(key: str, value: str) -> Path:
    path = Path(value)
    if not value or not path.is_absolute():
        raise ValueError(f"{key} must be an absolute path, got {value!r}")
    return path


def _profile_store(key: str, value: str) -> Path:
    if not value:
        raise ValueError(f"{key} needs a value")
    return _abs_path(key, value)


def _abs_path_or_none(key: str, value: str) -> Path | None:
    return _abs_path(key, value) if value else None


def _path_or_none(key: str, value: str) -> Path | None:
    return Path(value) if value else None


def _partition_list(key: str, value: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if any(c.isspace() for c in part):
            raise ValueError(f"{key}: partition name {part!r} contains blanks")
        if part not in names:
            names.append(part)
    return tuple(names)


def _uids(key: str, value: str) -> tuple[int, ...]:
    uids = _partition_list(key, value)
    if not uids:
        raise ValueError(f"{key} needs at least one uid")
    return tuple(_int(key, uid, 0, 2**31 - 1) for uid in uids)


def _cpus_or_share(key: str, value: str) -> int | Literal["share"] | None:
    if value.lower() == "share":
        return "share"
    return _int(key, value, 1) if value else None


def _signature_ignore(key: str, value: str) -> ScriptIgnore:
    try:
        return parse_script_ignore(value)
    except SignatureIgnoreError as exc:
        raise ValueError(str(exc)) from None


def _gres_name(key: str, value: str) -> str | None:
    if value and (not _GRES_NAME.fullmatch(value) or value.lower() == "gpu"):
        raise ValueError(
            f"{key} must be a GRES name (letters, digits, _) other than gpu, got {value!r}"
        )
    return value or None


def _gpu_types(key: str, value: str) -> tuple[str, ...]:
    types = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [t for t in types if not _FEATURE_NAME.fullmatch(t)]
    if bad:
        raise ValueError(f"{key}: {bad[0]!r} is not a GPU type name")
    if len(types) == 1:
        raise ValueError(
            f"{key} needs at least two GPU types, fastest first (one type leaves nothing to prefer)"
        )
    return types


def _gpu_features(key: str, value: str) -> tuple[tuple[str, str], ...]:
    pairs: dict[str, str] = {}
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        gpu_type, sep, feature = item.partition(":")
        gpu_type = gpu_type.strip().lower()
        feature = feature.strip()
        if not sep or not _FEATURE_NAME.fullmatch(gpu_type):
            raise ValueError(f"{key}: expected type:feature, got {item!r}")
        if not _FEATURE_NAME.fullmatch(feature):
            # --prefer takes a feature expression; & | , [ ] * ( ) would change it.
            raise ValueError(
                f"{key}: {feature!r} is not a node feature name (letters, digits, _ . -)"
            )
        pairs[gpu_type] = feature
    return tuple(pairs.items())


def _node_name(key: str, value: str) -> str | None:
    if value and not _NODE_NAME.fullmatch(value):
        raise ValueError(f"{key} {value!r} is not a Slurm node name")
    return value or None


def _mechanisms(key: str, value: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [v for v in items if v not in _NODE_MECHANISMS]
    if bad:
        raise ValueError(
            f"{key}: unknown mechanism {bad[0]!r} (choose from " + ", ".join(_NODE_MECHANISMS) + ")"
        )
    return items


def _ip_address(key: str, value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{key} must be an IP address, got {value!r}") from None
    return value


# ------------------------------------------------------------------------- the keys

_SPEC = "coda.conf"
"""Where a :class:`CodaConfig` field keeps its :class:`KeySpec` (field metadata)."""


def _key(name: str, syntax: str, default: str, parse: Parser, help: str) -> Any:
    """The :class:`CodaConfig` field of key ``name``: its default is ``default`` as read
    by ``parse``; :data:`CONFIG_KEYS` collects the specs."""
    spec = KeySpec(name, syntax, default, help, parse)
    return field(default=parse(name, default), metadata={_SPEC: spec})


@dataclass(frozen=True, slots=True)
class CodaConfig:
    """Parsed ``coda.conf``.  Each field is one key: its name in the file, value syntax,
    default as written in the file, parser (which checks bounds) and help text."""

    profile_store: Path = _key(
        "ProfileStore",
        "path",
        "/var/lib/coda/profiles",
        _profile_store,
        "Directory of the workload profile store (absolute path).",
    )
    profile_publish: str = _key(
        "ProfilePublish",
        "store|munge",
        "store",
        _one_of("store", "munge"),
        "How coda-node hands a probing run's samples and its jobs' usage records to the "
        "controller: store, merged straight "
        "into ProfileStore (which the node daemon must be able to write as root); munge, "
        "written as a munge credential into ProfileDropDir, where coda-slurm profiles collect "
        "on the controller checks and merges it (NFS with root_squash).",
    )
    """``store`` or ``munge`` (lower case)."""
    profile_drop_dir: Path = _key(
        "ProfileDropDir",
        "path",
        "/var/spool/coda/drop",
        _abs_path,
        "ProfilePublish=munge: the directory the node daemons drop credentials into and "
        "coda-slurm profiles collect reads (absolute path; root-owned, mode 1733 or 1777).",
    )
    munge_socket: Path = _key(
        "MungeSocket",
        "path",
        "/run/munge/munge.socket.2",
        _abs_path,
        "ProfilePublish=munge: munged's socket, for munge on the nodes and unmunge on the "
        "controller (absolute path).",
    )
    profile_drop_uids: tuple[int, ...] = _key(
        "ProfileDropUids",
        "list",
        "0",
        _uids,
        "coda-slurm profiles collect: uids whose credentials are accepted (comma-separated "
        "numbers; the uid coda-node runs as).",
    )
    profile_drop_hosts: tuple[str, ...] = _key(
        "ProfileDropHosts",
        "list",
        "",
        _partition_list,
        "coda-slurm profiles collect: hosts a credential may come from (munge's ENCODE_HOST): "
        "addresses, CIDR networks or host names, comma-separated; empty = the NodeAddr and "
        "NodeHostName of every node scontrol show node lists.",
    )
    """Addresses, CIDR networks or host names; empty = the nodes scontrol lists."""
    profile_drop_ttl_s: int = _key(
        "ProfileDropTtlS",
        "int",
        "3600",
        _ints(1, 86400),
        "ProfilePublish=munge: seconds a dropped credential stays valid; one not collected "
        "by then is refused as expired (1..86400; munged refuses more than its --max-ttl, "
        "3600 by default).",
    )
    mode: str = _key(
        "Mode",
        "enforce|advise|off",
        "enforce",
        _one_of("enforce", "advise", "off"),
        "enforce: rewrite --cpus-per-gpu; advise: record and log the decision but leave the "
        "job unchanged; off: do nothing.",
    )
    """``enforce``, ``advise`` or ``off`` (lower case)."""
    user_value: str = _key(
        "UserValue",
        "keep|lower|replace",
        "keep",
        _one_of("keep", "lower", "replace"),
        "What to do when the user gave --cpus-per-gpu or --cpus-per-task: keep it, lower it "
        "to the profile's value when that is smaller, or replace it with the profile's value.",
    )
    """``keep``, ``lower`` or ``replace`` (lower case)."""
    user_message: str = _key(
        "UserMessage",
        "all|batch|none",
        "batch",
        _one_of("all", "batch", "none"),
        "Which submissions get coda's line on the submitting command's stderr: all (sbatch, "
        "srun and salloc), batch (sbatch only: interactive stderr stays the program's), or "
        "none. The decision is in slurmctld's log and the job's AdminComment whatever this "
        "says, and a refused submission always gets its reason.",
    )
    """``all``, ``batch`` or ``none`` (lower case)."""
    min_cpus_per_gpu: int = _key(
        "MinCpusPerGpu", "int", "1", _ints(1), "Smallest --cpus-per-gpu CODA sets (1 or more)."
    )
    max_cpus_per_gpu: int = _key(
        "MaxCpusPerGpu",
        "int",
        "64",
        _ints(1),
        "Largest --cpus-per-gpu CODA sets (MinCpusPerGpu or more).",
    )
    default_cpus_per_gpu: int | Literal["share"] | None = _key(
        "DefaultCpusPerGpu",
        "int, share or empty",
        "",
        _cpus_or_share,
        "--cpus-per-gpu for workloads without a confident profile: a number, or share (the "
        "node's cores per GPU: the fewest CPUs per GPU among the slurm.conf nodes that can "
        "hold the job's GPUs); empty leaves Slurm's DefCpuPerGPU in charge.",
    )
    """A number, ``"share"`` (the node's cores per GPU, from slurm.conf) or None."""
    unprofiled_user_value: str = _key(
        "UnprofiledUserValue",
        "keep|raise",
        "keep",
        _one_of("keep", "raise"),
        "What to do with a user's own --cpus-per-gpu or --cpus-per-task when the workload "
        "has no confident profile: keep it, or raise it to DefaultCpusPerGpu when it is "
        "lower, so a first run is not starved of cores and coda-node can profile it from "
        "above its sweet spot. raise needs DefaultCpusPerGpu.",
    )
    """``keep`` or ``raise``: a user's lower value is raised to the default without a profile."""
    min_confidence: float = _key(
        "MinConfidence",
        "float",
        "0.8",
        _float_range(0, 1),
        "A profile is used only when its confidence is at least this (0..1).",
    )
    multi_node_gpu_cap: int = _key(
        "MultiNodeGpuCap",
        "int",
        "2",
        _ints(1),
        "Multi-node jobs: per-GPU CPU demand is scaled as if a node had at most this many "
        "GPUs (CODA: multi-node demand is at most the 1-node-2-GPU demand).",
    )
    hook_budget_ms: float = _key(
        "HookBudgetMs",
        "float",
        "20",
        _positive_float,
        "Time budget of the submit hook in milliseconds (> 0).",
    )
    signature_ignore: ScriptIgnore = _key(
        "SignatureIgnore",
        "@sets and patterns",
        DEFAULT_SPEC,
        _signature_ignore,
        "Parts of a batch script that do not make a new workload: each match becomes a "
        "placeholder before the script is hashed into the workload signature. Blank-separated "
        "items: @builtin (the three sets below), @dask-jobqueue (the dask worker's command "
        "line after the worker module: "
        "scheduler address, worker name, threads, memory), @submitit (%j and %A_%a in paths, "
        "so an array and a single job are one workload), @run-ids (UUIDs and date-times as "
        "words), or a regular expression (Python syntax, blanks as \\x20; every repeat "
        "possessive: *+, ++, {m,n}+; no back references), run line by line on lines of up to "
        "1024 characters, giving up (the job passes unchanged) after 5 ms on one script. "
        "Patterns see the first 64 KiB of a script; empty = hash scripts as written.",
    )
    """What the workload signature leaves out of a script (``SignatureIgnore``)."""
    reload_interval_s: float = _key(
        "ReloadIntervalS",
        "float",
        "5",
        _positive_float,
        "Seconds between checks for a changed profile store, coda.conf or slurm.conf (> 0).",
    )
    partitions: tuple[str, ...] = _key(
        "Partitions",
        "list",
        "",
        _partition_list,
        "Comma-separated partitions CODA manages; empty = all partitions.",
    )
    """Managed partitions; empty = all."""
    exclude_partitions: tuple[str, ...] = _key(
        "ExcludePartitions",
        "list",
        "",
        _partition_list,
        "Comma-separated partitions CODA never touches (wins over Partitions).",
    )
    log_level: str = _key(
        "LogLevel",
        "error|info|verbose|debug",
        "info",
        _one_of("error", "info", "verbose", "debug"),
        "How much the hook writes to slurmctld's log.",
    )
    hook_stats_file: Path | None = _key(
        "HookStatsFile",
        "path or empty",
        "/var/lib/coda/hook-stats.json",
        _abs_path_or_none,
        "Where the hook writes its counters (calls, p50/p99 time, fail-open count) every "
        "ReloadIntervalS, for coda-slurm status; empty = do not write them.",
    )
    """None = the hook keeps its counters in memory only."""
    decision_journal: Path | None = _key(
        "DecisionJournal",
        "path or empty",
        "/var/lib/coda/decisions.jsonl",
        _abs_path_or_none,
        "Where the hook appends one JSON line per decision (for coda-slurm status), flushed "
        "at least once a second; empty = keep no journal.",
    )
    """None = no decision journal."""
    journal_max_bytes: int = _key(
        "JournalMaxBytes",
        "int",
        "8388608",
        _ints(65536, 999_999_999),
        "Size at which DecisionJournal is rotated to DecisionJournal.1 (the previous .1 is "
        "dropped); 65536 or more.",
    )
    slurm_conf: Path | None = _key(
        "SlurmConf",
        "path or empty",
        "",
        _path_or_none,
        "slurm.conf to read node shapes and partitions from (read again when it changes); "
        "empty = the slurm.conf beside coda.conf; a relative path is relative to coda.conf's "
        "directory.",
    )
    """None = the slurm.conf beside coda.conf (:func:`load_config` fills it in)."""

    # -- submit hook placement; every switch is off by default
    pcie_spread_gres: str | None = _key(
        "PcieSpreadGres",
        "name or empty",
        "",
        _gres_name,
        "Count-only GRES (its per-node count = the node's PCIe domains) that PCIe-heavy "
        "multi-GPU jobs get one unit of, so Slurm never puts more of them on a node than it "
        "has domains; empty = off.",
    )
    """Count-only GRES PCIe-heavy jobs request one unit of; None = off."""
    pcie_heavy_bytes_per_s: float = _key(
        "PcieHeavyBytesPerS",
        "float",
        "8e9",
        _positive_float,
        "A multi-GPU job is PCIe-heavy when its measured PCIe traffic per GPU times its GPUs "
        "per node reaches this many bytes/s (CODA: AlexNet/ResNet50 at 8-12 GB/s) (> 0).",
    )
    prefer_gpu_types: tuple[str, ...] = _key(
        "PreferGpuTypes",
        "list",
        "",
        _gpu_types,
        "GPU types, fastest first (e.g. h100,a100,v100): a job that names no GPU type gets "
        "--prefer toward the type it gains most from, or away from the newest when it gains "
        "little; empty = off.",
    )
    """Lower-case GPU types, fastest first; empty = no --prefer."""
    prefer_gpu_features: tuple[tuple[str, str], ...] = _key(
        "PreferGpuFeatures",
        "list of type:feature",
        "",
        _gpu_features,
        "Node feature --prefer names for each type of PreferGpuTypes (e.g. "
        "h100:gpu_h100,a100:gpu_a100); a type not listed uses its own name as the feature.",
    )
    """``(type, node feature)`` pairs; a type not listed is its own feature."""
    mem_bw_spread_gres: str | None = _key(
        "MemBwSpreadGres",
        "name or empty",
        "",
        _gres_name,
        "Count-only GRES (its per-node count = the node's memory bandwidth in "
        "MemBwUnitBytesPerS units) that memory-bound CPU jobs ask for in proportion to their "
        "measured bandwidth; CPU-only jobs get a coda record so coda-node measures them; "
        "empty = off.",
    )
    """Count-only memory-bandwidth GRES of CPU-only jobs; None = off."""
    mem_bw_heavy_bytes_per_s_per_cpu: float = _key(
        "MemBwHeavyBytesPerSPerCpu",
        "float",
        "2e9",
        _positive_float,
        "A CPU job is memory-bound when its measured memory bandwidth per allocated CPU "
        "reaches this many bytes/s; lighter jobs ask for no MemBwSpreadGres (> 0).",
    )
    mem_bw_unit_bytes_per_s: float = _key(
        "MemBwUnitBytesPerS",
        "float",
        "1e9",
        _positive_float,
        "Bytes/s one unit of MemBwSpreadGres stands for (> 0).",
    )
    cpu_job_partitions: tuple[str, ...] = _key(
        "CpuJobPartitions",
        "list",
        "",
        _partition_list,
        "CPU-only jobs submitted without --partition get this partition list (e.g. "
        "batch,gpu_spare; Slurm starts them in whichever can run them first); empty = off.",
    )
    """Partition list for CPU-only jobs submitted without one; empty = off."""

    # -- coda-slurm reserve: spare cores of GPU nodes for CPU jobs
    reserve_partitions: tuple[str, ...] = _key(
        "ReservePartitions",
        "list",
        "",
        _partition_list,
        "coda-slurm reserve: CPU partitions over GPU nodes whose MaxCPUsPerNode it keeps at "
        "the cores GPU jobs do not need; empty = off.",
    )
    """Spare CPU partitions coda-slurm reserve manages; empty = off."""
    reserve_interval_s: float = _key(
        "ReserveIntervalS",
        "float",
        "60",
        _positive_float,
        "coda-slurm reserve: seconds between two passes of the loop (> 0).",
    )
    reserve_min_cpus: int = _key(
        "ReserveMinCpus",
        "int",
        "1",
        _ints(0),
        "coda-slurm reserve: MaxCPUsPerNode is never set below this (0 closes the partition "
        "to new CPU work when GPU jobs need every core).",
    )
    reserve_cpus_per_gpu: float | None = _key(
        "ReserveCpusPerGpu",
        "float or empty",
        "",
        _or_none(_positive_float),
        "coda-slurm reserve: cores an idle GPU keeps reserved when no GPU job is pending; "
        "empty = the largest DefCpuPerGPU of the GPU partitions over the same nodes, else 4.",
    )
    """None = DefCpuPerGPU of the GPU partitions over the same nodes, else 4."""
    reserve_state_file: Path = _key(
        "ReserveStateFile",
        "path",
        "/var/lib/coda/reserve.json",
        _abs_path,
        "coda-slurm reserve: where each partition's original MaxCPUsPerNode is saved before "
        "the first change, for --revert.",
    )
    colocate_margin: float = _key(
        "ColocateMargin",
        "float",
        "0.05",
        _float_range(0, 1),
        "coda-slurm colocate: a pair is reported as gaining from sharing a GPU only when its "
        "predicted speedup is at least 1 + this (0..1).",
    )

    # -- coda-node, the daemon on each GPU node
    node_name: str | None = _key(
        "NodeName",
        "name or empty",
        "",
        _node_name,
        "coda-node: this node's NodeName in slurm.conf; empty = the short host name.",
    )
    """None = the short host name."""
    node_state_dir: Path = _key(
        "NodeStateDir",
        "path",
        "/var/lib/coda-node",
        _abs_path,
        "coda-node: directory of its state file (everything it changed, so that a restart or "
        "coda-node restore can put jobs back) and of admin limits. Written only when what "
        "it changed changes.",
    )
    node_runtime_dir: Path = _key(
        "NodeRuntimeDir",
        "path",
        "/run/coda-node",
        _abs_path,
        "coda-node: directory of view.json, the last tick's view that coda-node status "
        "reads, rewritten every tick: keep it on tmpfs (/run) so that a node does not write "
        "it to disk every second. A restart of the daemon reads it back (what each job's "
        "profiling had reached); a reboot may clear it.",
    )
    node_interval_s: float = _key(
        "NodeIntervalS",
        "float",
        "1",
        _positive_float,
        "coda-node: seconds between two sample-plan-enforce passes (> 0).",
    )
    node_root: Path = _key(
        "NodeRoot",
        "path",
        "/",
        _abs_path,
        "coda-node: system root every /sys, /proc and /dev path is read under (tests point "
        "it at a fixture tree).",
    )
    node_enforce: tuple[str, ...] = _key(
        "NodeEnforce",
        "list",
        "cpuset,quota,rdt",
        _mechanisms,
        "coda-node: mechanisms the daemon may use (cpuset, quota, rdt); empty = observe only, "
        "change nothing.",
    )
    node_progress_dir: Path = _key(
        "NodeProgressDir",
        "path",
        "/run/coda-node/progress",
        _abs_path,
        "coda-node: directory of the per-job progress files jobs may write (created root-owned "
        "0755; one file per job, owned by the job's user).",
    )
    node_profile: bool = _key(
        "NodeProfile",
        "yes|no",
        "yes",
        _yes_no,
        "coda-node: profile GPU jobs of unknown workloads online (probe core counts inside "
        "their allocation) and publish the profile to ProfileStore.",
    )
    node_probe_warmup_s: float = _key(
        "NodeProbeWarmupS",
        "float",
        "300",
        _float_at_least_0,
        "coda-node: seconds after a job starts before it is probed or gets a baseline (>= 0).",
    )
    node_probe_settle_s: float = _key(
        "NodeProbeSettleS",
        "float",
        "30",
        _float_at_least_0,
        "coda-node: seconds a probe waits after changing cores before measuring.",
    )
    node_probe_measure_s: float = _key(
        "NodeProbeMeasureS",
        "float",
        "60",
        _positive_float,
        "coda-node: seconds a probe measures (three samples) (> 0).",
    )
    node_probe_max_jobs: int = _key(
        "NodeProbeMaxJobs",
        "int",
        "1",
        _ints(0),
        "coda-node: jobs probed at once on a node (0 = none).",
    )
    node_probe_budget_s: float = _key(
        "NodeProbeBudgetS",
        "float",
        "900",
        _positive_float,
        "coda-node: most seconds one job spends below its allocation while probed (> 0).",
    )
    node_probe_max_slowdown_pct: float = _key(
        "NodeProbeMaxSlowdownPct",
        "float",
        "50",
        _percent(99),
        "coda-node: a probe slower than this % below the job's full-allocation rate ends at "
        "once, and fewer cores are not tried (1..99).",
    )
    node_contention: bool = _key(
        "NodeContention",
        "yes|no",
        "yes",
        _yes_no,
        "coda-node: throttle CPU jobs that slow a DNN job on the same socket (MBA, else CPU "
        "quota).",
    )
    node_contention_trigger_pct: float = _key(
        "NodeContentionTriggerPct",
        "float",
        "10",
        _percent(99),
        "coda-node: throttle when a DNN job runs this % below its uncontended baseline (1..99).",
    )
    node_contention_release_pct: float = _key(
        "NodeContentionReleasePct",
        "float",
        "5",
        _percent(99),
        "coda-node: release one step when every DNN job nearby is within this % of its "
        "baseline (< NodeContentionTriggerPct).",
    )
    node_baseline_probe_after_s: float = _key(
        "NodeBaselineProbeAfterS",
        "float",
        "60",
        _float_at_least_0,
        "coda-node: a DNN job that has trained this long beside drawing CPU jobs without an "
        "uncontended baseline gets one measured by capping those CPU jobs at their floor for "
        "up to 20 s (0 = never).",
    )
    node_baseline_reset_s: float = _key(
        "NodeBaselineResetS",
        "float",
        "60",
        _float_at_least_0,
        "coda-node: a DNN job still slowed after this long with every CPU job beside it at "
        "its floor gets its rate there as its new baseline, and the CPU jobs are released "
        "(0 = never: they stay at their floor while the job stays slow).",
    )
    node_release_hold_s: float = _key(
        "NodeReleaseHoldS",
        "float",
        "30",
        _positive_float,
        "coda-node: seconds between two release steps of a throttled CPU job (> 0).",
    )
    node_throttle_floor_pct: float = _key(
        "NodeThrottleFloorPct",
        "float",
        "10",
        _percent(100),
        "coda-node: a throttled CPU job keeps at least this % of its cores (quota) or of "
        "memory bandwidth (MBA) (1..100).",
    )
    node_throttle_min_effect_pct: float = _key(
        "NodeThrottleMinEffectPct",
        "float",
        "5",
        _float_range(0, 100),
        "coda-node: a CPU job held at its floor must cut the DNN job's slowdown by this % "
        "per core held back, or it is given back whole; if that does not slow the DNN job "
        "either, it is left alone for 30 min (0 = throttle by CPU use or bandwidth alone).",
    )
    node_throttle_step_pct: float | None = _key(
        "NodeThrottleStepPct",
        "float or empty",
        "10",
        _or_none(_percent(50)),
        "coda-node: each step of a CPU job's quota takes this % of its cores more, down to "
        "NodeThrottleFloorPct (10: 90 %, 80 %, ...); empty = steps to 75 %, 50 % and 25 %.",
    )
    node_throttle_min_gain_pct: float = _key(
        "NodeThrottleMinGainPct",
        "float",
        "20",
        _float_range(0, 100),
        "coda-node: once the CPU jobs held back for a DNN job have shown their effect, the "
        "DNN jobs beside them must be this many points of slowdown less slowed per whole CPU "
        "job held back, or all of them are given back and that DNN job is not shielded for "
        "30 min (0 = no such test).",
    )
    node_throttle_gpu_worth_cores: float | None = _key(
        "NodeThrottleGpuWorthCores",
        "float or empty",
        "",
        _or_none(_float_range(0, 10000)),
        "coda-node: the price of a hold, taken after every step for a DNN job: the GPU time "
        "the CPU jobs held back give back (the DNN jobs' GPUs times the points of slowdown "
        "taken off) must be worth, at this many cores per GPU, the cores held back, or all "
        "of them are given back and that DNN job is not shielded for 30 min (0 = no such "
        "test); empty = 10 on a node the submit hook spreads memory-bound CPU jobs over "
        "(MemBwSpreadGres: a partition of the node, not excluded, has that GRES on every "
        "node), else 14.",
    )
    """None: :func:`coda_node.policy.contention.gpu_worth_cores` picks 10 or 14."""
    node_job_mem_bw: bool = _key(
        "NodeJobMemBw",
        "yes|no",
        "yes",
        _yes_no,
        "coda-node: measure each CPU job's memory bandwidth with its own resctrl monitoring "
        "group (Intel RDT MBM, one RMID per job), so contention control can cap the job that "
        "draws most with MBA; no = contention control does without MBA.",
    )
    node_metrics_port: int = _key(
        "NodeMetricsPort",
        "int",
        "0",
        _ints(0, 65535),
        "coda-node: TCP port of its Prometheus endpoint (/metrics); 0 = no endpoint (0..65535).",
    )
    node_metrics_address: str = _key(
        "NodeMetricsAddress",
        "address",
        "127.0.0.1",
        _ip_address,
        "coda-node: address the Prometheus endpoint listens on (0.0.0.0 or :: = every "
        "interface; keep 127.0.0.1 unless the scraper is elsewhere).",
    )
    node_usage_flush_s: float = _key(
        "NodeUsageFlushS",
        "float",
        "600",
        _float_at_least_0,
        "coda-node: seconds between two writes of a running job's usage record (GPU usage, "
        "or a CPU job's memory bandwidth) to its profile (also written when the job ends); "
        "0 = only when the job ends.",
    )
    """0 = write usage records only when the job ends."""
    node_usage_min_ticks: int = _key(
        "NodeUsageMinTicks",
        "int",
        "30",
        _ints(1, 999_999_999),
        "coda-node: undisturbed ticks a job must have collected before its usage record is "
        "written (1 or more).",
    )


CONFIG_KEYS: dict[str, KeySpec] = {
    spec.name: spec._replace(field=f.name)
    for f in fields(CodaConfig)
    for spec in (f.metadata[_SPEC],)
}
"""Every ``coda.conf`` key, in the order of :class:`CodaConfig`'s fields."""

RETIRED_KEYS: dict[str, str] = {
    "HookFastPath": "every GPU job is decided by the hook's Python side",
}
"""Keys coda.conf once had, with what holds now: a file that still sets one loads, with a
warning that the line has no effect (any value is accepted)."""


# ----------------------------------------------------------------------------- lexing

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _strip_comment(line: str) -> str:
    """``line`` without its comment: ``#`` outside double quotes, not preceded by ``\\``."""
    if "#" not in line:
        return line
    in_quotes = False
    prev = ""
    for i, c in enumerate(line):
        if c == '"':
            in_quotes = not in_quotes
        elif c == "#" and not in_quotes and prev != "\\":
            return line[:i]
        prev = c
    return line


def _logical_lines(text: str, source: str) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` of each non-blank logical line: comments stripped,
    ``\\``-continued lines joined as Slurm does (backslash dropped, next line appended
    as is), CR before LF dropped."""
    pending: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.split("\n"), 1):
        if raw.endswith("\r"):
            raw = raw[:-1]
        bad = _CONTROL.search(raw)
        if bad is not None:
            raise ConfigError(source, lineno, f"control character {bad.group()!a} in the file")
        line = _strip_comment(raw).rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = "".join(pending).strip()
        pending = []
        if joined:
            yield start, joined
    if pending:
        joined = "".join(pending).strip()
        if joined:
            yield start, joined


def _tokenize(line: str, source: str, lineno: int) -> list[tuple[str, str]]:
    """The ``Key=Value`` pairs of one logical line; values may be ``"quoted"``."""
    pairs: list[tuple[str, str]] = []
    i = 0
    n = len(line)
    while i < n:
        if line[i] in " \t":
            i += 1
            continue
        eq = line.find("=", i)
        space = min((j for j in (line.find(" ", i), line.find("\t", i)) if j >= 0), default=n)
        if eq < 0 or eq > space:
            word = line[i:space]
            raise ConfigError(source, lineno, f"expected Key=Value, got {word!r}")
        key = line[i:eq]
        if not key:
            raise ConfigError(source, lineno, "missing key before '='")
        i = eq + 1
        if i < n and line[i] == '"':
            end = line.find('"', i + 1)
            if end < 0:
                raise ConfigError(source, lineno, f"unterminated quote in the value of {key}")
            value = line[i + 1 : end]
            i = end + 1
            if i < n and line[i] not in " \t":
                raise ConfigError(
                    source, lineno, f"unexpected text after the quoted value of {key}"
                )
        else:
            end = i
            while end < n and line[end] not in " \t":
                end += 1
            value = line[i:end].replace("\\#", "#")
            if '"' in value:
                raise ConfigError(source, lineno, f"stray quote in the value of {key}")
            i = end
        pairs.append((key, value))
    return pairs


_CANONICAL = {key.lower(): key for key in CONFIG_KEYS}
_RETIRED = {key.lower(): key for key in RETIRED_KEYS}


def _unknown_key_message(key: str) -> str:
    import difflib  # error path only: keep the import off slurmctld's start-up

    close = difflib.get_close_matches(key.lower(), list(_CANONICAL), n=1)
    hint = f" (did you mean {_CANONICAL[close[0]]}?)" if close else ""
    return f"unknown key {key!r}{hint}"


def parse_config(text: str, source: str = "coda.conf") -> tuple[CodaConfig, list[str]]:
    """Parse the text of a ``coda.conf``: ``(config, warnings)``.

    Raises :class:`ConfigError` (``source:line: message``) for unknown keys, malformed
    lines and invalid values; warnings (same prefix) report keys given more than once,
    partitions both managed and excluded, and :data:`RETIRED_KEYS` (ignored).
    ``SlurmConf`` is returned as written (None when empty); :func:`load_config` resolves it.
    """
    seen: dict[str, tuple[str, int]] = {}
    warnings: list[str] = []
    for lineno, line in _logical_lines(text, source):
        for key, value in _tokenize(line, source, lineno):
            canonical = _CANONICAL.get(key.lower())
            if canonical is None and key.lower() in _RETIRED:
                retired = _RETIRED[key.lower()]
                warnings.append(
                    f"{source}:{lineno}: {retired} no longer has an effect "
                    f"({RETIRED_KEYS[retired]}); the line is ignored"
                )
                continue
            if canonical is None:
                raise ConfigError(source, lineno, _unknown_key_message(key))
            if canonical in seen:
                warnings.append(
                    f"{source}:{lineno}: {canonical} given again (first on line "
                    f"{seen[canonical][1]}); the last value wins"
                )
            seen[canonical] = (value, lineno)

    values: dict[str, object] = {}
    lines: dict[str, int] = {}
    for key, (value, lineno) in seen.items():
        spec = CONFIG_KEYS[key]
        try:
            values[spec.field] = spec.parse(key, value)
        except ValueError as exc:
            raise ConfigError(source, lineno, str(exc)) from None
        lines[key] = lineno
    config = CodaConfig(**values)
    _check_together(config, lines, source, warnings)
    return config, warnings


def _check_together(
    config: CodaConfig, lines: dict[str, int], source: str, warnings: list[str]
) -> None:
    """The rules that tie keys together; ``lines`` maps each key given to its line.
    Raises :class:`ConfigError`; appends warnings."""
    if config.max_cpus_per_gpu < config.min_cpus_per_gpu:
        line = max(lines.get("MaxCpusPerGpu", 0), lines.get("MinCpusPerGpu", 0)) or None
        raise ConfigError(
            source,
            line,
            f"MaxCpusPerGpu={config.max_cpus_per_gpu} is below "
            f"MinCpusPerGpu={config.min_cpus_per_gpu}",
        )
    default = config.default_cpus_per_gpu
    if isinstance(default, int) and not (
        config.min_cpus_per_gpu <= default <= config.max_cpus_per_gpu
    ):
        raise ConfigError(
            source,
            lines.get("DefaultCpusPerGpu"),
            f"DefaultCpusPerGpu={default} is outside "
            f"MinCpusPerGpu..MaxCpusPerGpu ({config.min_cpus_per_gpu}..{config.max_cpus_per_gpu})",
        )
    if config.unprofiled_user_value == "raise" and default is None:
        raise ConfigError(
            source,
            lines.get("UnprofiledUserValue"),
            "UnprofiledUserValue=raise needs DefaultCpusPerGpu (a number or share): "
            "there is nothing to raise a user's value to",
        )
    if config.node_contention_release_pct >= config.node_contention_trigger_pct:
        raise ConfigError(
            source,
            lines.get("NodeContentionReleasePct") or lines.get("NodeContentionTriggerPct"),
            f"NodeContentionReleasePct={config.node_contention_release_pct:g} must be below "
            f"NodeContentionTriggerPct={config.node_contention_trigger_pct:g} (hysteresis)",
        )
    unknown_types = [t for t, _ in config.prefer_gpu_features if t not in config.prefer_gpu_types]
    if unknown_types:
        raise ConfigError(
            source,
            lines.get("PreferGpuFeatures"),
            f"PreferGpuFeatures names GPU type {unknown_types[0]!r}, which is not in "
            f"PreferGpuTypes ({','.join(config.prefer_gpu_types) or 'empty'})",
        )
    for name in config.partitions:
        if name in config.exclude_partitions:
            warnings.append(
                f"{source}:{lines['ExcludePartitions']}: partition {name!r} is in both "
                "Partitions and ExcludePartitions; it is excluded"
            )


def _read_text(path: Path, source: str | None = None) -> str:
    """The UTF-8 text of ``path``; ConfigError when unreadable or not UTF-8."""
    source = source or str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(source, lineno, "not valid UTF-8") from None


def load_config(path: Path, *, warnings: list[str] | None = None) -> CodaConfig:
    """Read and parse ``coda.conf`` at ``path``.

    Warnings (duplicate keys ...) are appended to ``warnings`` when a list is given.
    ``slurm_conf`` comes back resolved: ``<dir of path>/slurm.conf`` when not set, a
    relative value taken relative to ``path``'s directory.  Raises :class:`ConfigError`.
    """
    config, found = parse_config(_read_text(path), str(path))
    if warnings is not None:
        warnings.extend(found)
    slurm_conf = config.slurm_conf
    if slurm_conf is None:
        slurm_conf = path.parent / "slurm.conf"
    elif not slurm_conf.is_absolute():
        slurm_conf = path.parent / slurm_conf
    return replace(config, slurm_conf=slurm_conf)


# --------------------------------------------------------------------------- slurm.conf


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One ``NodeName=`` line of slurm.conf: its host expression, CPUs and GPUs per node."""

    names: str
    """The NodeName value as written (``gpu[01-04]``)."""
    cpus: int
    """CPUs per node: ``CPUs=``, else Boards x Sockets x CoresPerSocket x ThreadsPerCore."""
    gpus: int
    """GPUs per node: all ``gpu`` entries of ``Gres=`` summed, typed or not."""
    count: int = 1
    """Number of nodes the host expression names."""
    features: tuple[str, ...] = ()
    """The node's ``Feature=`` (or ``Features=``) list; the hook only sets ``--prefer`` to
    one of these (Slurm rejects a job preferring a feature no node has)."""
    gres: tuple[tuple[str, int], ...] = ()
    """Every GRES of ``Gres=`` but ``gpu`` and its count per node (types summed), e.g.
    ``(("membw", 200), ("pcie", 2))``; an entry whose count cannot be read is left out."""
    restricted_cpus_per_gpu: int = 0
    """CPUs of the cores ``RestrictedCoresPerGPU=`` (Slurm 24.05 on) keeps for GPU jobs,
    per GPU: the cores times the CPUs Slurm counts per core; 0 when the line does not set it.
    slurm.conf(5): a job that asks for no GPU cannot use these cores; select/cons_tres gives
    a job holding g of the node's GPUs at most g times this many of them
    (``gres_filter.c``, ``max_res_cores = cnt_avail_total * res_cores_per_gpu``)."""

    def gpu_job_cpus(self, gpus: int) -> int:
        """The most CPUs a job holding ``gpus`` of this node's GPUs can get on it: all but
        the cores restricted to the node's other GPUs."""
        return self.cpus - self.restricted_cpus_per_gpu * max(0, self.gpus - gpus)

    @property
    def cpu_job_cpus(self) -> int:
        """The CPUs a job that asks for no GPU can use on this node: all but the
        restricted cores (never below 0)."""
        return max(0, self.cpus - self.restricted_cpus_per_gpu * self.gpus)

    @property
    def restriction_fits(self) -> bool:
        """False when ``RestrictedCoresPerGPU`` asks more cores than the node has: slurmctld
        then sets the node DOWN when it registers ("RestrictedCoresPerGPU: We can't restrict
        N core(s) per gpu"), so no job runs on it."""
        return self.restricted_cpus_per_gpu * self.gpus <= self.cpus


@dataclass(frozen=True, slots=True)
class PartitionShape:
    """One ``PartitionName=`` line of slurm.conf."""

    name: str
    nodes: str
    """The ``Nodes=`` value as written (``gpu[01-04]``, ``ALL``), or the
    ``PartitionName=DEFAULT`` line's; "" when none."""
    default: bool | None
    """The partition of jobs submitted without ``--partition`` (``Default=YES``; when
    several say so, the last). :func:`read_slurm_conf` gives True or False."""


_NODENAME_LINE = re.compile(r"\s*nodename\s*=", re.IGNORECASE)
_PARTITIONNAME_LINE = re.compile(r"\s*partitionname\s*=", re.IGNORECASE)
_INCLUDE_LINE = re.compile(r"\s*include\s+(.+)", re.IGNORECASE)
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_GRES_COUNT = re.compile(r"([0-9]{1,9})([kKmMgG]?)")
_GRES_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_MAX_HOSTS = 10_000_000


def split_outside(text: str, opening: str, closing: str, *, what: str = "list") -> list[str]:
    """``text`` split at commas outside ``opening``/``closing`` (``gpu[1,3],x`` -> 2 items;
    ``gpu:2(IDX:0,2),mps`` with parentheses -> 2 items). Raises ValueError on nesting or
    unbalanced brackets."""
    depth = 0
    start = 0
    items: list[str] = []
    for i, c in enumerate(text):
        if c == opening:
            depth += 1
            if depth > 1:
                raise ValueError(f"nested {opening!r} in {what} {text!r}")
        elif c == closing:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {closing!r} in {what} {text!r}")
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced {opening!r} in {what} {text!r}")
    items.append(text[start:])
    return items


def count_hostlist(expr: str) -> int:
    """Number of hosts in a Slurm hostlist expression (``gpu[01-04,07],login1`` is 6).

    Raises ValueError on unbalanced brackets or bad ranges.
    """
    total = 0
    items = split_outside(expr, "[", "]", what="host list")
    for item in items:
        if not item:
            continue
        hosts = 1
        for m in _BRACKET.finditer(item):
            in_bracket = 0
            for part in m.group(1).split(","):
                r = _RANGE.fullmatch(part.strip())
                if r is None:
                    raise ValueError(f"bad range {part!r} in host list {expr!r}")
                low = int(r.group(1))
                high = int(r.group(2)) if r.group(2) is not None else low
                if high < low:
                    raise ValueError(f"descending range {part!r} in host list {expr!r}")
                in_bracket += high - low + 1
            hosts *= in_bracket
        total += hosts
        if total > _MAX_HOSTS:
            raise ValueError(f"host list {expr!r} names more than {_MAX_HOSTS} hosts")
    return total


def expand_hostlist(expr: str) -> list[str]:
    """The names in a Slurm hostlist expression, in order (``gpu[01-02],x`` is
    ``["gpu01", "gpu02", "x"]``; zero padding follows the range's first number). Also
    expands gres.conf ``File=/dev/nvidia[0-3]``. Raises ValueError as :func:`count_hostlist`.
    """
    count_hostlist(expr)  # validates and bounds the size before we build anything
    items = split_outside(expr, "[", "]", what="host list")
    names: list[str] = []
    for item in filter(None, items):
        partial = [""]
        pos = 0
        for m in _BRACKET.finditer(item):
            choices: list[str] = []
            for part in m.group(1).split(","):
                r = _RANGE.fullmatch(part.strip())
                assert r is not None  # count_hostlist checked
                width = len(r.group(1))
                low = int(r.group(1))
                high = int(r.group(2)) if r.group(2) is not None else low
                choices += [str(n).zfill(width) for n in range(low, high + 1)]
            prefix = item[pos : m.start()]
            partial = [p + prefix + c for p in partial for c in choices]
            pos = m.end()
        names += [p + item[pos:] for p in partial]
    return names


def mtime_ns(path: Path) -> int | None:
    """``path``'s mtime in ns, or None when it cannot be stat'ed."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def gres_units_per_partition(
    nodes: Iterable[NodeShape], partitions: Iterable[PartitionShape], gres: str
) -> dict[str, int | None]:
    """Each partition's smallest per-node count of the count-only GRES ``gres`` over its
    nodes: the most units a job may ask per node and still be accepted wherever it could run
    there. None for a partition where that is not known or not safe: its ``Nodes=`` is
    empty or names a node slurm.conf does not define (a NodeSet, a feature), or one of its
    nodes lacks ``gres`` (Slurm refuses a job asking for a GRES no node of its partition
    has). Expands every host list once: run it off the hot path."""
    counts: dict[str, int] = {}
    unreadable = False
    for node in nodes:
        count = dict(node.gres).get(gres, 0)
        try:
            hosts = expand_hostlist(node.names)
        except ValueError:
            unreadable = True
            continue
        for host in hosts:
            counts[host] = count
    out: dict[str, int | None] = {}
    for part in partitions:
        least: int | None = None
        try:
            hosts = list(counts) if part.nodes.upper() == "ALL" else expand_hostlist(part.nodes)
        except ValueError:
            hosts = []
        if unreadable or not hosts:
            out[part.name] = None
            continue
        for host in hosts:
            count = counts.get(host, 0)
            if count < 1:
                least = None
                break
            least = count if least is None else min(least, count)
        out[part.name] = least
    return out


def spread_partitions(
    node_name: str,
    nodes: tuple[NodeShape, ...],
    partitions: tuple[PartitionShape, ...],
    gres: str,
    exclude: Iterable[str] = (),
) -> tuple[str, ...]:
    """The partitions holding node ``node_name`` in which the submit hook asks for the
    count-only GRES ``gres`` (:func:`gres_units_per_partition` knows a count for them), but
    those in ``exclude`` (``ExcludePartitions``)."""
    units = gres_units_per_partition(nodes, partitions, gres)
    skip = set(exclude)
    # A partition with a known count has a readable host list (ALL: every node).
    return tuple(
        p.name
        for p in partitions
        if p.name not in skip
        and units.get(p.name) is not None
        and (p.nodes.upper() == "ALL" or node_name in expand_hostlist(p.nodes))
    )


def _gres_gpus(gres: str) -> int:
    """GPUs in a node's ``Gres=`` value (``gpu:a100:4,gpu:v100:2(S:0-1),shard:8`` is 6)."""
    return _gres_counts(gres).get("gpu", 0)


def _gres_counts(gres: str) -> dict[str, int]:
    """Count per GRES name in a node's ``Gres=`` value, types summed
    (``gpu:a100:4,gpu:v100:2(S:0-1),shard:8`` is ``{"gpu": 6, "shard": 8}``). ValueError for
    a GPU count that cannot be read; another GRES whose count cannot be read is left out."""
    counts: dict[str, int] = {}
    for item in gres.split(","):
        item = item.strip()
        paren = item.find("(")
        if paren >= 0:
            item = item[:paren]
        fields = item.split(":")
        if fields[0] == "gres" and len(fields) > 1:
            del fields[0]
        name = fields[0]
        if not name:
            continue
        count = 1
        if len(fields) > 1:
            m = _GRES_COUNT.fullmatch(fields[-1])
            if m is not None:
                count = int(m.group(1)) * _GRES_MULT[m.group(2).lower()]
            elif len(fields) > 2 or not fields[-1]:
                if name == "gpu":
                    raise ValueError(f"bad GPU count in Gres={gres!r}")
                continue
        counts[name] = counts.get(name, 0) + count
    return counts


def _node_int(params: dict[str, str], key: str, default: int) -> int:
    value = params.get(key)
    if value is None or value == "":
        return default
    if not value.isdigit() or len(value) > 9:
        raise ValueError(f"bad {key} value {value!r}")
    return int(value)


def _node_shape(params: dict[str, str]) -> NodeShape:
    """Shape of one node line; ``params`` has lower-case keys, DEFAULT values merged."""
    names = params["nodename"]
    given_cpus = _node_int(params, "cpus", 0) or _node_int(params, "procs", 0)
    cores_per_socket = _node_int(params, "corespersocket", 1) or 1
    threads = _node_int(params, "threadspercore", 1) or 1
    # As Slurm: SocketsPerBoard, when given, wins over Sockets (the total).
    boards = _node_int(params, "boards", 1)
    per_board = _node_int(params, "socketsperboard", 0)
    sockets = boards * per_board if per_board else _node_int(params, "sockets", 0)
    if not sockets:
        # With CPUs= and no Sockets, as Slurm's read_config.c: CPUs / (cores x threads)
        # when that divides, else one socket per board.
        per_socket = cores_per_socket * threads
        if given_cpus and given_cpus % per_socket == 0:
            sockets = given_cpus // per_socket
        else:
            sockets = boards if given_cpus else 1
    cpus = given_cpus or sockets * cores_per_socket * threads
    counts = _gres_counts(params["gres"]) if params.get("gres") else {}
    gpus = counts.pop("gpu", 0)
    feature_list = params.get("feature") or params.get("features") or ""
    features = tuple(dict.fromkeys(f.strip() for f in feature_list.split(",") if f.strip()))
    # slurmctld counts a core as one CPU when the node has no more CPUs than cores
    # (node_conf.c: tpc), else as ThreadsPerCore CPUs.
    cpus_per_core = 1 if sockets * cores_per_socket >= cpus else threads
    restricted = _node_int(params, "restrictedcorespergpu", 0) * cpus_per_core
    return NodeShape(
        names,
        cpus,
        gpus,
        count_hostlist(names),
        features,
        tuple(sorted(counts.items())),
        restricted,
    )


def _read_slurm_file(
    path: Path,
    base_dir: Path,
    nodes: list[NodeShape],
    defaults: dict[str, str],
    stack: tuple[Path, ...],
    partitions: list[PartitionShape] | None = None,
    read: list[tuple[Path, int | None]] | None = None,
) -> None:
    if read is not None:
        read.append((path, mtime_ns(path)))  # before reading: an edit meanwhile is seen
    if len(stack) > _MAX_INCLUDE_DEPTH:
        raise ConfigError(str(path), None, "Include nested too deeply")
    try:
        resolved = path.resolve()
    except RuntimeError as exc:  # a symlink loop (Python 3.11)
        raise ConfigError(str(path), None, str(exc)) from None
    if resolved in stack:
        raise ConfigError(str(path), None, "Include loop")
    stack = (*stack, resolved)
    source = str(path)
    for lineno, line in _logical_lines(_read_text(path), source):
        include = _INCLUDE_LINE.fullmatch(line)
        if include is not None:
            targets = _include_targets(include.group(1).strip(), base_dir, source, lineno, read)
            for included in targets:
                _read_slurm_file(included, base_dir, nodes, defaults, stack, partitions, read)
            continue
        if partitions is not None and _PARTITIONNAME_LINE.match(line) is not None:
            _read_partition(line, source, lineno, partitions)
            continue
        if _NODENAME_LINE.match(line) is None:
            continue
        params = {key.lower(): value for key, value in _tokenize(line, source, lineno)}
        name = params.get("nodename", "")
        if not name:
            raise ConfigError(source, lineno, "NodeName without a value")
        if name.upper() == "DEFAULT":
            del params["nodename"]
            defaults.update(params)
            continue
        try:
            nodes.append(_node_shape({**defaults, **params}))
        except ValueError as exc:
            raise ConfigError(source, lineno, f"NodeName={name}: {exc}") from None


_SLURM_TRUE = frozenset({"yes", "up", "true", "1"})
"""What Slurm's slurm.conf parser takes for a true boolean (case-insensitive)."""


def _read_partition(line: str, source: str, lineno: int, partitions: list[PartitionShape]) -> None:
    params = {key.lower(): value for key, value in _tokenize(line, source, lineno)}
    name = params.get("partitionname", "")
    if not name:
        raise ConfigError(source, lineno, "PartitionName without a value")
    # PartitionName=DEFAULT is kept as a pseudo-partition that read_slurm_conf folds into
    # the later lines (its values are theirs unless they set their own, as in Slurm).
    partitions.append(PartitionShape(name, params.get("nodes", ""), _default(params)))


def _default(params: dict[str, str]) -> bool | None:
    """``Default=``: True, False, or None when the line does not set it."""
    value = params.get("default")
    return None if value is None else value.lower() in _SLURM_TRUE


def _fold_partition_defaults(lines: list[PartitionShape]) -> tuple[PartitionShape, ...]:
    """The partitions of ``lines`` with ``PartitionName=DEFAULT`` values filled in, and
    ``default`` True only for the last partition that says so (Slurm takes the last)."""
    nodes, default = "", None
    out: list[PartitionShape] = []
    for p in lines:
        if p.name.upper() == "DEFAULT":
            nodes = p.nodes or nodes
            default = p.default if p.default is not None else default
            continue
        out.append(
            PartitionShape(
                p.name, p.nodes or nodes, bool(p.default if p.default is not None else default)
            )
        )
    last = max((i for i, p in enumerate(out) if p.default), default=-1)
    return tuple(replace(p, default=(i == last)) for i, p in enumerate(out))


def _include_targets(
    spec: str,
    base_dir: Path,
    source: str,
    lineno: int,
    read: list[tuple[Path, int | None]] | None = None,
) -> list[Path]:
    """The files an ``Include`` line names. ``read`` also gets a glob's last folder without
    wildcards (a file or folder added there changes its mtime) and a missing file (its
    creation is a change), each with its mtime before the glob is expanded."""
    if len(spec) >= 2 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    target = Path(spec)
    if not target.is_absolute():
        target = base_dir / target
    if glob.has_magic(str(target)):
        if read is not None:
            folder = target.parent
            while glob.has_magic(str(folder)):
                folder = folder.parent
            read.append((folder, mtime_ns(folder)))
        return [Path(p) for p in sorted(glob.glob(str(target)))]
    if not target.is_file():
        if read is not None:
            read.append((target, mtime_ns(target)))
        raise ConfigError(source, lineno, f"Include {spec}: no such file")
    return [target]


def read_slurm_nodes(path: Path) -> tuple[NodeShape, ...]:
    """Node shapes from the ``NodeName=`` lines of slurm.conf at ``path``.

    ``NodeName=DEFAULT`` lines are not nodes: their values become defaults for later lines
    (as in Slurm).  ``Include FILE`` lines are followed (relative paths and globs relative
    to ``path``'s directory).  Other lines are ignored.  Raises :class:`ConfigError`.
    """
    nodes: list[NodeShape] = []
    _read_slurm_file(path, path.parent, nodes, {}, ())
    return tuple(nodes)


def read_slurm_conf(
    path: Path, read: list[tuple[Path, int | None]] | None = None
) -> tuple[tuple[NodeShape, ...], tuple[PartitionShape, ...]]:
    """The ``NodeName=`` lines (as :func:`read_slurm_nodes`) and the ``PartitionName=``
    lines of slurm.conf at ``path`` (``PartitionName=DEFAULT`` values filled in, not a
    partition itself).  ``read`` gets every path whose change could change the result,
    each with its mtime (:func:`mtime_ns`) taken before it was read: every file read (``path`` and
    what it includes), a missing included file and every folder an ``Include`` glob looked
    in, also when it raises.  Raises :class:`ConfigError`."""
    nodes: list[NodeShape] = []
    partitions: list[PartitionShape] = []
    _read_slurm_file(path, path.parent, nodes, {}, (), partitions, read)
    return tuple(nodes), _fold_partition_defaults(partitions)


_NESTED_LINES = frozenset({"nodename", "nodeset", "partitionname", "downnodes", "frontendname"})
"""slurm.conf lines whose other pairs belong to the line's object, not to slurm.conf."""


def read_slurm_keys(path: Path, names: Iterable[str]) -> dict[str, str]:
    """The values of the top-level keys ``names`` in slurm.conf at ``path``, by lower-case
    name (the last one given wins, as in Slurm); ``Include`` lines are followed as by
    :func:`read_slurm_conf`.  Raises :class:`ConfigError`."""
    wanted = {n.lower() for n in names}
    found: dict[str, str] = {}

    def read(file: Path, stack: tuple[Path, ...]) -> None:
        if len(stack) > _MAX_INCLUDE_DEPTH:
            raise ConfigError(str(file), None, "Include nested too deeply")
        resolved = file.resolve()
        if resolved in stack:
            raise ConfigError(str(file), None, "Include loop")
        source = str(file)
        for lineno, line in _logical_lines(_read_text(file), source):
            include = _INCLUDE_LINE.fullmatch(line)
            if include is not None:
                for target in _include_targets(
                    include.group(1).strip(), path.parent, source, lineno
                ):
                    read(target, (*stack, resolved))
                continue
            pairs = _tokenize(line, source, lineno)
            if pairs[0][0].lower() in _NESTED_LINES:
                continue
            found.update((k.lower(), v) for k, v in pairs if k.lower() in wanted)

    read(path, ())
    return found
