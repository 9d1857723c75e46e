"""``coda.conf``: CODA's configuration file, in Slurm's own syntax
(:mod:`coda_common.slurm.conffile`).

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

Only :func:`load_config` touches files; everything else is pure.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

from coda_common.signature import (
    DEFAULT_SPEC,
    ScriptIgnore,
    SignatureIgnoreError,
    parse_script_ignore,
)
from coda_common.slurm.conffile import ConfigError, logical_lines, read_text, tokenize

__all__ = [
    "CONFIG_KEYS",
    "RETIRED_KEYS",
    "CodaConfig",
    "KeySpec",
    "load_config",
    "parse_config",
]

MAX_CPUS = 65533
"""Largest CPU count a key may hold (Slurm keeps cpus_per_task in a uint16 below NO_VAL16)."""


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
_NODE_MECHANISMS: list[str] = ["cpuset", "quota", "rdt"]
"""The names NodeEnforce accepts: coda-node's built-in enforcement mechanisms, for a reader
without coda-node (the controller); coda-node's registry of mechanisms
(coda_node.enforce.mechanisms) sets the list it has with :func:`set_node_mechanisms`."""


def set_node_mechanisms(names: Iterable[str]) -> None:
    """The names NodeEnforce accepts from now on, in the order they are applied."""
    _NODE_MECHANISMS[:] = names


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
    for lineno, line in logical_lines(text, source):
        for key, value in tokenize(line, source, lineno):
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


def load_config(path: Path, *, warnings: list[str] | None = None) -> CodaConfig:
    """Read and parse ``coda.conf`` at ``path``.

    Warnings (duplicate keys ...) are appended to ``warnings`` when a list is given.
    ``slurm_conf`` comes back resolved: ``<dir of path>/slurm.conf`` when not set, a
    relative value taken relative to ``path``'s directory.  Raises :class:`ConfigError`.
    """
    config, found = parse_config(read_text(path), str(path))
    if warnings is not None:
        warnings.extend(found)
    slurm_conf = config.slurm_conf
    if slurm_conf is None:
        slurm_conf = path.parent / "slurm.conf"
    elif not slurm_conf.is_absolute():
        slurm_conf = path.parent / slurm_conf
    return replace(config, slurm_conf=slurm_conf)
