"""``coda.conf``: CODA's configuration file, in Slurm's own syntax; and the node shapes
of ``slurm.conf``.

Syntax (as in ``cgroup.conf`` or ``gres.conf``)::

    # comment
    Mode=advise            # keys are case-insensitive
    ProfileStore="/var/lib/coda/profiles"
    Partitions=gpu,gpu-long  MinConfidence=0.9     # several pairs on one line are fine

``#`` starts a comment outside double quotes (``\\#`` is a literal ``#``); a line ending
in ``\\`` continues on the next.  Unknown keys are errors (``coda.conf:7: unknown key
...``); a key given twice keeps the last value and produces a warning.  :data:`CONFIG_KEYS`
documents every key.

Only :func:`load_config` and :func:`read_slurm_nodes` read files; everything else is pure.
"""

from __future__ import annotations

import glob
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, NamedTuple

from slurm_plugin.signature import (
    DEFAULT_IGNORE,
    DEFAULT_SPEC,
    ScriptIgnore,
    SignatureIgnoreError,
    parse_script_ignore,
)

__all__ = [
    "CONFIG_KEYS",
    "CodaConfig",
    "ConfigError",
    "KeySpec",
    "NodeShape",
    "count_hostlist",
    "expand_hostlist",
    "load_config",
    "make_node_cap",
    "make_node_share",
    "max_cpus_per_gpu_on_any_node",
    "node_share_cpus_per_gpu",
    "parse_config",
    "read_slurm_nodes",
    "split_outside",
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
    """Documentation of one ``coda.conf`` key: ``(type, default, help)``."""

    type: str
    """Value syntax, e.g. ``int``, ``float``, ``path``, ``enforce|advise|off``, ``list``."""
    default: str
    """The default as it would be written in the file (``""`` = empty)."""
    help: str


CONFIG_KEYS: dict[str, KeySpec] = {
    "ProfileStore": KeySpec(
        "path",
        "/var/lib/coda/profiles",
        "Directory of the workload profile store (absolute path).",
    ),
    "ProfilePublish": KeySpec(
        "store|munge",
        "store",
        "How coda-node hands a probing run's samples to the controller: store, merged straight "
        "into ProfileStore (which the node daemon must be able to write as root); munge, "
        "written as a munge credential into ProfileDropDir, where coda-slurm profiles collect "
        "on the controller checks and merges it (NFS with root_squash).",
    ),
    "ProfileDropDir": KeySpec(
        "path",
        "/var/spool/coda/drop",
        "ProfilePublish=munge: the directory the node daemons drop credentials into and "
        "coda-slurm profiles collect reads (absolute path; root-owned, mode 1733 or 1777).",
    ),
    "MungeSocket": KeySpec(
        "path",
        "/run/munge/munge.socket.2",
        "ProfilePublish=munge: munged's socket, for munge on the nodes and unmunge on the "
        "controller (absolute path).",
    ),
    "ProfileDropUids": KeySpec(
        "list",
        "0",
        "coda-slurm profiles collect: uids whose credentials are accepted (comma-separated "
        "numbers; the uid coda-node runs as).",
    ),
    "ProfileDropHosts": KeySpec(
        "list",
        "",
        "coda-slurm profiles collect: hosts a credential may come from (munge's ENCODE_HOST): "
        "addresses, CIDR networks or host names, comma-separated; empty = the NodeAddr and "
        "NodeHostName of every node scontrol show node lists.",
    ),
    "ProfileDropTtlS": KeySpec(
        "int",
        "3600",
        "ProfilePublish=munge: seconds a dropped credential stays valid; one not collected "
        "by then is refused as expired (1..86400; munged refuses more than its --max-ttl, "
        "3600 by default).",
    ),
    "Mode": KeySpec(
        "enforce|advise|off",
        "enforce",
        "enforce: rewrite --cpus-per-gpu; advise: record and log the decision but leave the "
        "job unchanged; off: do nothing.",
    ),
    "UserValue": KeySpec(
        "keep|lower|replace",
        "keep",
        "What to do when the user gave --cpus-per-gpu or --cpus-per-task: keep it, lower it "
        "to the profile's value when that is smaller, or replace it with the profile's value.",
    ),
    "MinCpusPerGpu": KeySpec("int", "1", "Smallest --cpus-per-gpu CODA sets (1 or more)."),
    "MaxCpusPerGpu": KeySpec(
        "int", "64", "Largest --cpus-per-gpu CODA sets (MinCpusPerGpu or more)."
    ),
    "DefaultCpusPerGpu": KeySpec(
        "int, share or empty",
        "",
        "--cpus-per-gpu for workloads without a confident profile: a number, or share (the "
        "node's cores per GPU: the fewest CPUs per GPU among the slurm.conf nodes that can "
        "hold the job's GPUs); empty leaves Slurm's DefCpuPerGPU in charge.",
    ),
    "UnprofiledUserValue": KeySpec(
        "keep|raise",
        "keep",
        "What to do with a user's own --cpus-per-gpu or --cpus-per-task when the workload "
        "has no confident profile: keep it, or raise it to DefaultCpusPerGpu when it is "
        "lower, so a first run is not starved of cores and coda-node can profile it from "
        "above its sweet spot. raise needs DefaultCpusPerGpu.",
    ),
    "MinConfidence": KeySpec(
        "float", "0.8", "A profile is used only when its confidence is at least this (0..1)."
    ),
    "MultiNodeGpuCap": KeySpec(
        "int",
        "2",
        "Multi-node jobs: per-GPU CPU demand is scaled as if a node had at most this many "
        "GPUs (CODA: multi-node demand is at most the 1-node-2-GPU demand).",
    ),
    "HookBudgetMs": KeySpec("float", "20", "Time budget of the submit hook in milliseconds (> 0)."),
    "HookFastPath": KeySpec(
        "yes|no",
        "yes",
        "yes: a job whose decision fields (user, name, partition, GPU and CPU requests, comment, "
        "script, --prefer) match one already decided under the same coda.conf and profiles is "
        "answered by the plugin's C side without entering Python (same fields, message, log "
        "line and journal entry); no: every GPU job goes through Python.",
    ),
    "SignatureIgnore": KeySpec(
        "@sets and patterns",
        DEFAULT_SPEC,
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
    ),
    "ReloadIntervalS": KeySpec(
        "float", "5", "Seconds between checks for a changed profile store or coda.conf (> 0)."
    ),
    "Partitions": KeySpec(
        "list", "", "Comma-separated partitions CODA manages; empty = all partitions."
    ),
    "ExcludePartitions": KeySpec(
        "list", "", "Comma-separated partitions CODA never touches (wins over Partitions)."
    ),
    "LogLevel": KeySpec(
        "error|info|verbose|debug", "info", "How much the hook writes to slurmctld's log."
    ),
    "HookStatsFile": KeySpec(
        "path or empty",
        "/var/lib/coda/hook-stats.json",
        "Where the hook writes its counters (calls, p50/p99 time, fail-open count) every "
        "ReloadIntervalS, for coda-slurm status; empty = do not write them.",
    ),
    "DecisionJournal": KeySpec(
        "path or empty",
        "/var/lib/coda/decisions.jsonl",
        "Where the hook appends one JSON line per decision (for coda-slurm status), flushed "
        "at least once a second; empty = keep no journal.",
    ),
    "JournalMaxBytes": KeySpec(
        "int",
        "8388608",
        "Size at which DecisionJournal is rotated to DecisionJournal.1 (the previous .1 is "
        "dropped); 65536 or more.",
    ),
    "SlurmConf": KeySpec(
        "path or empty",
        "",
        "slurm.conf to read node shapes from; empty = the slurm.conf beside coda.conf; a "
        "relative path is relative to coda.conf's directory.",
    ),
    # -- submit hook placement; every switch is off by default --------------
    "PcieSpreadGres": KeySpec(
        "name or empty",
        "",
        "Count-only GRES (its per-node count = the node's PCIe domains) that PCIe-heavy "
        "multi-GPU jobs get one unit of, so Slurm never puts more of them on a node than it "
        "has domains; empty = off.",
    ),
    "PcieHeavyBytesPerS": KeySpec(
        "float",
        "8e9",
        "A multi-GPU job is PCIe-heavy when its measured PCIe traffic per GPU times its GPUs "
        "per node reaches this many bytes/s (CODA: AlexNet/ResNet50 at 8-12 GB/s) (> 0).",
    ),
    "PreferGpuTypes": KeySpec(
        "list",
        "",
        "GPU types, fastest first (e.g. h100,a100,v100): a job that names no GPU type gets "
        "--prefer toward the type it gains most from, or away from the newest when it gains "
        "little; empty = off.",
    ),
    "PreferGpuFeatures": KeySpec(
        "list of type:feature",
        "",
        "Node feature --prefer names for each type of PreferGpuTypes (e.g. "
        "h100:gpu_h100,a100:gpu_a100); a type not listed uses its own name as the feature.",
    ),
    "CpuJobPartitions": KeySpec(
        "list",
        "",
        "CPU-only jobs submitted without --partition get this partition list (e.g. "
        "batch,gpu_spare; Slurm starts them in whichever can run them first); empty = off.",
    ),
    # -- coda-slurm reserve: spare cores of GPU nodes for CPU jobs ---------
    "ReservePartitions": KeySpec(
        "list",
        "",
        "coda-slurm reserve: CPU partitions over GPU nodes whose MaxCPUsPerNode it keeps at "
        "the cores GPU jobs do not need; empty = off.",
    ),
    "ReserveIntervalS": KeySpec(
        "float", "60", "coda-slurm reserve: seconds between two passes of the loop (> 0)."
    ),
    "ReserveMinCpus": KeySpec(
        "int",
        "1",
        "coda-slurm reserve: MaxCPUsPerNode is never set below this (0 closes the partition "
        "to new CPU work when GPU jobs need every core).",
    ),
    "ReserveCpusPerGpu": KeySpec(
        "float or empty",
        "",
        "coda-slurm reserve: cores an idle GPU keeps reserved when no GPU job is pending; "
        "empty = the largest DefCpuPerGPU of the GPU partitions over the same nodes, else 4.",
    ),
    "ReserveStateFile": KeySpec(
        "path",
        "/var/lib/coda/reserve.json",
        "coda-slurm reserve: where each partition's original MaxCPUsPerNode is saved before "
        "the first change, for --revert.",
    ),
    "ColocateMargin": KeySpec(
        "float",
        "0.05",
        "coda-slurm colocate: a pair is reported as gaining from sharing a GPU only when its "
        "predicted speedup is at least 1 + this (0..1).",
    ),
    # -- coda-node, the daemon on each GPU node --------------------------------------
    "NodeName": KeySpec(
        "name or empty",
        "",
        "coda-node: this node's NodeName in slurm.conf; empty = the short host name.",
    ),
    "NodeStateDir": KeySpec(
        "path",
        "/var/lib/coda-node",
        "coda-node: directory of its state file (everything it changed, so that a restart or "
        "coda-node restore can put jobs back) and of admin limits. Written only when what "
        "it changed changes.",
    ),
    "NodeRuntimeDir": KeySpec(
        "path",
        "/run/coda-node",
        "coda-node: directory of view.json, the last tick's view that coda-node status "
        "reads, rewritten every tick: keep it on tmpfs (/run) so that a node does not write "
        "it to disk every second. A restart of the daemon reads it back (what each job's "
        "profiling had reached); a reboot may clear it.",
    ),
    "NodeIntervalS": KeySpec(
        "float", "1", "coda-node: seconds between two sample-plan-enforce passes (> 0)."
    ),
    "NodeRoot": KeySpec(
        "path",
        "/",
        "coda-node: system root every /sys, /proc and /dev path is read under (tests point "
        "it at a fixture tree).",
    ),
    "NodeEnforce": KeySpec(
        "list",
        "cpuset,quota,rdt",
        "coda-node: mechanisms the daemon may use (cpuset, quota, rdt); empty = observe only, "
        "change nothing.",
    ),
    "NodeProgressDir": KeySpec(
        "path",
        "/run/coda-node/progress",
        "coda-node: directory of the per-job progress files jobs may write (created root-owned "
        "0755; one file per job, owned by the job's user).",
    ),
    "NodeProfile": KeySpec(
        "yes|no",
        "yes",
        "coda-node: profile GPU jobs of unknown workloads online (probe core counts inside "
        "their allocation) and publish the profile to ProfileStore.",
    ),
    "NodeProbeWarmupS": KeySpec(
        "float",
        "300",
        "coda-node: seconds after a job starts before it is probed or gets a baseline (>= 0).",
    ),
    "NodeProbeSettleS": KeySpec(
        "float", "30", "coda-node: seconds a probe waits after changing cores before measuring."
    ),
    "NodeProbeMeasureS": KeySpec(
        "float", "60", "coda-node: seconds a probe measures (three samples) (> 0)."
    ),
    "NodeProbeMaxJobs": KeySpec("int", "1", "coda-node: jobs probed at once on a node (0 = none)."),
    "NodeProbeBudgetS": KeySpec(
        "float",
        "900",
        "coda-node: most seconds one job spends below its allocation while probed (> 0).",
    ),
    "NodeProbeMaxSlowdownPct": KeySpec(
        "float",
        "50",
        "coda-node: a probe slower than this % below the job's full-allocation rate ends at "
        "once, and fewer cores are not tried (1..99).",
    ),
    "NodeContention": KeySpec(
        "yes|no",
        "yes",
        "coda-node: throttle CPU jobs that slow a DNN job on the same socket (MBA, else CPU "
        "quota).",
    ),
    "NodeContentionTriggerPct": KeySpec(
        "float",
        "10",
        "coda-node: throttle when a DNN job runs this % below its uncontended baseline (1..99).",
    ),
    "NodeContentionReleasePct": KeySpec(
        "float",
        "5",
        "coda-node: release one step when every DNN job nearby is within this % of its "
        "baseline (< NodeContentionTriggerPct).",
    ),
    "NodeBaselineProbeAfterS": KeySpec(
        "float",
        "60",
        "coda-node: a DNN job that has trained this long beside drawing CPU jobs without an "
        "uncontended baseline gets one measured by capping those CPU jobs at their floor for "
        "up to 20 s (0 = never).",
    ),
    "NodeBaselineResetS": KeySpec(
        "float",
        "60",
        "coda-node: a DNN job still slowed after this long with every CPU job beside it at "
        "its floor gets its rate there as its new baseline, and the CPU jobs are released "
        "(0 = never: they stay at their floor while the job stays slow).",
    ),
    "NodeReleaseHoldS": KeySpec(
        "float",
        "30",
        "coda-node: seconds between two release steps of a throttled CPU job (> 0).",
    ),
    "NodeThrottleFloorPct": KeySpec(
        "float",
        "25",
        "coda-node: a throttled CPU job keeps at least this % of its cores (quota) or of "
        "memory bandwidth (MBA) (1..100).",
    ),
    "NodeThrottleMinEffectPct": KeySpec(
        "float",
        "5",
        "coda-node: a CPU job held at its floor must cut the DNN job's slowdown by this % "
        "per core held back, or it is given back whole; if that does not slow the DNN job "
        "either, it is left alone for 30 min (0 = throttle by CPU use or bandwidth alone).",
    ),
    "NodeJobMemBw": KeySpec(
        "yes|no",
        "yes",
        "coda-node: measure each CPU job's memory bandwidth with its own resctrl monitoring "
        "group (Intel RDT MBM, one RMID per job), so contention control can cap the job that "
        "draws most with MBA; no = contention control does without MBA.",
    ),
    "NodeMetricsPort": KeySpec(
        "int",
        "0",
        "coda-node: TCP port of its Prometheus endpoint (/metrics); 0 = no endpoint (0..65535).",
    ),
    "NodeMetricsAddress": KeySpec(
        "address",
        "127.0.0.1",
        "coda-node: address the Prometheus endpoint listens on (0.0.0.0 or :: = every "
        "interface; keep 127.0.0.1 unless the scraper is elsewhere).",
    ),
    "NodeUsageFlushS": KeySpec(
        "float",
        "600",
        "coda-node: seconds between two writes of a running job's GPU usage record to its "
        "profile (also written when the job ends); 0 = only when the job ends.",
    ),
    "NodeUsageMinTicks": KeySpec(
        "int",
        "30",
        "coda-node: ticks of GPU usage a job must have collected before a usage record is "
        "written (1 or more).",
    ),
}

_MODES = ("enforce", "advise", "off")
_NODE_MECHANISMS = ("cpuset", "quota", "rdt")
_NODE_DIRS = {
    "NodeStateDir": "node_state_dir",
    "NodeRuntimeDir": "node_runtime_dir",
    "NodeRoot": "node_root",
}
_USER_VALUES = ("keep", "lower", "replace")
_UNPROFILED_USER_VALUES = ("keep", "raise")
_LOG_LEVELS = ("error", "info", "verbose", "debug")


@dataclass(frozen=True, slots=True)
class CodaConfig:
    """Parsed ``coda.conf``; defaults as in :data:`CONFIG_KEYS`."""

    profile_store: Path = Path("/var/lib/coda/profiles")
    profile_publish: str = "store"
    """``store`` or ``munge`` (lower case)."""
    profile_drop_dir: Path = Path("/var/spool/coda/drop")
    munge_socket: Path = Path("/run/munge/munge.socket.2")
    profile_drop_uids: tuple[int, ...] = (0,)
    profile_drop_hosts: tuple[str, ...] = ()
    """Addresses, CIDR networks or host names; empty = the nodes scontrol lists."""
    profile_drop_ttl_s: int = 3600
    mode: str = "enforce"
    """``enforce``, ``advise`` or ``off`` (lower case)."""
    user_value: str = "keep"
    """``keep``, ``lower`` or ``replace`` (lower case)."""
    min_cpus_per_gpu: int = 1
    max_cpus_per_gpu: int = 64
    default_cpus_per_gpu: int | Literal["share"] | None = None
    """A number, ``"share"`` (the node's cores per GPU, from slurm.conf) or None."""
    unprofiled_user_value: str = "keep"
    """``keep`` or ``raise``: a user's lower value is raised to the default without a profile."""
    min_confidence: float = 0.8
    multi_node_gpu_cap: int = 2
    hook_budget_ms: float = 20.0
    hook_fast_path: bool = True
    signature_ignore: ScriptIgnore = DEFAULT_IGNORE
    """What the workload signature leaves out of a script (``SignatureIgnore``)."""
    reload_interval_s: float = 5.0
    partitions: tuple[str, ...] = ()
    """Managed partitions; empty = all."""
    exclude_partitions: tuple[str, ...] = ()
    log_level: str = "info"
    hook_stats_file: Path | None = Path("/var/lib/coda/hook-stats.json")
    """None = the hook keeps its counters in memory only."""
    decision_journal: Path | None = Path("/var/lib/coda/decisions.jsonl")
    """None = no decision journal."""
    journal_max_bytes: int = 8 * 1024 * 1024
    slurm_conf: Path | None = None
    """None = the slurm.conf beside coda.conf (:func:`load_config` fills it in)."""
    pcie_spread_gres: str | None = None
    """Count-only GRES PCIe-heavy jobs request one unit of; None = off."""
    pcie_heavy_bytes_per_s: float = 8e9
    prefer_gpu_types: tuple[str, ...] = ()
    """Lower-case GPU types, fastest first; empty = no --prefer."""
    prefer_gpu_features: tuple[tuple[str, str], ...] = ()
    """``(type, node feature)`` pairs; a type not listed is its own feature."""
    cpu_job_partitions: tuple[str, ...] = ()
    """Partition list for CPU-only jobs submitted without one; empty = off."""
    reserve_partitions: tuple[str, ...] = ()
    """Spare CPU partitions coda-slurm reserve manages; empty = off."""
    reserve_interval_s: float = 60.0
    reserve_min_cpus: int = 1
    reserve_cpus_per_gpu: float | None = None
    """None = DefCpuPerGPU of the GPU partitions over the same nodes, else 4."""
    reserve_state_file: Path = Path("/var/lib/coda/reserve.json")
    node_name: str | None = None
    """None = the short host name."""
    node_state_dir: Path = Path("/var/lib/coda-node")
    node_runtime_dir: Path = Path("/run/coda-node")
    node_interval_s: float = 1.0
    node_root: Path = Path("/")
    node_enforce: tuple[str, ...] = ("cpuset", "quota", "rdt")
    node_progress_dir: Path = Path("/run/coda-node/progress")
    node_profile: bool = True
    node_probe_warmup_s: float = 300.0
    node_probe_settle_s: float = 30.0
    node_probe_measure_s: float = 60.0
    node_probe_max_jobs: int = 1
    node_probe_budget_s: float = 900.0
    node_probe_max_slowdown_pct: float = 50.0
    node_contention: bool = True
    node_contention_trigger_pct: float = 10.0
    node_contention_release_pct: float = 5.0
    node_release_hold_s: float = 30.0
    node_baseline_probe_after_s: float = 60.0
    node_baseline_reset_s: float = 60.0
    node_throttle_floor_pct: float = 25.0
    node_throttle_min_effect_pct: float = 5.0
    node_job_mem_bw: bool = True
    node_metrics_port: int = 0
    node_metrics_address: str = "127.0.0.1"
    colocate_margin: float = 0.05
    node_usage_flush_s: float = 600.0
    """0 = write usage records only when the job ends."""
    node_usage_min_ticks: int = 30


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


# ---------------------------------------------------------------------- value parsing

_INT = re.compile(r"\+?[0-9]{1,9}")
_FLOAT = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?")


def _int(key: str, value: str, low: int, high: int = MAX_CPUS) -> int:
    if _INT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{key} must be {low}..{high}, got {number}")
    return number


def _float(key: str, value: str) -> float:
    if _FLOAT.fullmatch(value) is None:
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def _positive_float(key: str, value: str) -> float:
    number = _float(key, value)
    if not number > 0:
        raise ValueError(f"{key} must be greater than 0, got {value}")
    return number


def _choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    lowered = value.lower()
    if lowered not in choices:
        raise ValueError(f"{key} must be one of {'|'.join(choices)}, got {value!r}")
    return lowered


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


_GRES_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_FEATURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _convert(key: str, value: str) -> tuple[str, object]:
    """``(CodaConfig field, typed value)`` for canonical ``key``; ValueError if invalid."""
    if key == "ProfileStore":
        if not value:
            raise ValueError("ProfileStore needs a value")
        path = Path(value)
        if not path.is_absolute():
            raise ValueError(f"ProfileStore must be an absolute path, got {value!r}")
        return "profile_store", path
    if key == "ProfilePublish":
        return "profile_publish", _choice(key, value, ("store", "munge"))
    if key in ("ProfileDropDir", "MungeSocket"):
        path = Path(value)
        if not value or not path.is_absolute():
            raise ValueError(f"{key} must be an absolute path, got {value!r}")
        return _snake(key), path
    if key == "ProfileDropUids":
        uids = _partition_list(key, value)
        if not uids:
            raise ValueError("ProfileDropUids needs at least one uid")
        return "profile_drop_uids", tuple(_int(key, uid, 0, 2**31 - 1) for uid in uids)
    if key == "ProfileDropHosts":
        return "profile_drop_hosts", _partition_list(key, value)
    if key == "ProfileDropTtlS":
        return "profile_drop_ttl_s", _int(key, value, 1, 86400)
    if key == "Mode":
        return "mode", _choice(key, value, _MODES)
    if key == "UserValue":
        return "user_value", _choice(key, value, _USER_VALUES)
    if key == "MinCpusPerGpu":
        return "min_cpus_per_gpu", _int(key, value, 1)
    if key == "MaxCpusPerGpu":
        return "max_cpus_per_gpu", _int(key, value, 1)
    if key == "DefaultCpusPerGpu":
        if value.lower() == "share":
            return "default_cpus_per_gpu", "share"
        return "default_cpus_per_gpu", _int(key, value, 1) if value else None
    if key == "UnprofiledUserValue":
        return "unprofiled_user_value", _choice(key, value, _UNPROFILED_USER_VALUES)
    if key == "MinConfidence":
        number = _float(key, value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"MinConfidence must be 0..1, got {value}")
        return "min_confidence", number
    if key == "MultiNodeGpuCap":
        return "multi_node_gpu_cap", _int(key, value, 1)
    if key == "HookBudgetMs":
        return "hook_budget_ms", _positive_float(key, value)
    if key == "SignatureIgnore":
        try:
            return "signature_ignore", parse_script_ignore(value)
        except SignatureIgnoreError as exc:
            raise ValueError(str(exc)) from None
    if key == "ReloadIntervalS":
        return "reload_interval_s", _positive_float(key, value)
    if key == "Partitions":
        return "partitions", _partition_list(key, value)
    if key == "ExcludePartitions":
        return "exclude_partitions", _partition_list(key, value)
    if key == "LogLevel":
        return "log_level", _choice(key, value, _LOG_LEVELS)
    if key == "HookStatsFile":
        if value and not Path(value).is_absolute():
            raise ValueError(f"HookStatsFile must be an absolute path, got {value!r}")
        return "hook_stats_file", Path(value) if value else None
    if key == "DecisionJournal":
        if value and not Path(value).is_absolute():
            raise ValueError(f"DecisionJournal must be an absolute path, got {value!r}")
        return "decision_journal", Path(value) if value else None
    if key == "JournalMaxBytes":
        return "journal_max_bytes", _int(key, value, 65536, 999_999_999)
    if key == "SlurmConf":
        return "slurm_conf", Path(value) if value else None
    if key == "PcieSpreadGres":
        if value and (not _GRES_NAME.fullmatch(value) or value.lower() == "gpu"):
            raise ValueError(
                f"PcieSpreadGres must be a GRES name (letters, digits, _) other than gpu, "
                f"got {value!r}"
            )
        return "pcie_spread_gres", value or None
    if key == "PcieHeavyBytesPerS":
        return "pcie_heavy_bytes_per_s", _positive_float(key, value)
    if key == "PreferGpuTypes":
        types = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
        bad = [t for t in types if not _FEATURE_NAME.fullmatch(t)]
        if bad:
            raise ValueError(f"PreferGpuTypes: {bad[0]!r} is not a GPU type name")
        if len(types) == 1:
            raise ValueError(
                "PreferGpuTypes needs at least two GPU types, fastest first (one type "
                "leaves nothing to prefer)"
            )
        return "prefer_gpu_types", types
    if key == "PreferGpuFeatures":
        pairs: dict[str, str] = {}
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            gpu_type, sep, feature = item.partition(":")
            gpu_type = gpu_type.strip().lower()
            feature = feature.strip()
            if not sep or not _FEATURE_NAME.fullmatch(gpu_type):
                raise ValueError(f"PreferGpuFeatures: expected type:feature, got {item!r}")
            if not _FEATURE_NAME.fullmatch(feature):
                # --prefer takes a feature expression; & | , [ ] * ( ) would change it.
                raise ValueError(
                    f"PreferGpuFeatures: {feature!r} is not a node feature name "
                    "(letters, digits, _ . -)"
                )
            pairs[gpu_type] = feature
        return "prefer_gpu_features", tuple(pairs.items())
    if key == "CpuJobPartitions":
        return "cpu_job_partitions", _partition_list(key, value)
    if key == "ReservePartitions":
        return "reserve_partitions", _partition_list(key, value)
    if key == "ReserveIntervalS":
        return "reserve_interval_s", _positive_float(key, value)
    if key == "ReserveMinCpus":
        return "reserve_min_cpus", _int(key, value, 0)
    if key == "ReserveCpusPerGpu":
        return "reserve_cpus_per_gpu", _positive_float(key, value) if value else None
    if key == "ReserveStateFile":
        if not value or not Path(value).is_absolute():
            raise ValueError(f"ReserveStateFile must be an absolute path, got {value!r}")
        return "reserve_state_file", Path(value)
    if key == "NodeName":
        if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError(f"NodeName {value!r} is not a Slurm node name")
        return "node_name", value or None
    if key in _NODE_DIRS:
        path = Path(value)
        if not value or not path.is_absolute():
            raise ValueError(f"{key} must be an absolute path, got {value!r}")
        return _NODE_DIRS[key], path
    if key == "NodeIntervalS":
        return "node_interval_s", _positive_float(key, value)
    if key == "NodeEnforce":
        items = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
        bad = [v for v in items if v not in _NODE_MECHANISMS]
        if bad:
            raise ValueError(
                f"NodeEnforce: unknown mechanism {bad[0]!r} (choose from "
                + ", ".join(_NODE_MECHANISMS)
                + ")"
            )
        return "node_enforce", items
    if key == "NodeProgressDir":
        path = Path(value)
        if not value or not path.is_absolute():
            raise ValueError(f"{key} must be an absolute path, got {value!r}")
        return "node_progress_dir", path
    if key in ("NodeProfile", "NodeContention", "NodeJobMemBw", "HookFastPath"):
        return _snake(key), _choice(key, value, ("yes", "no")) == "yes"
    if key == "NodeProbeMaxJobs":
        return "node_probe_max_jobs", _int(key, value, 0)
    if key == "NodeProbeWarmupS":
        number = _float(key, value)
        if number < 0:
            raise ValueError(f"{key} must be 0 or more, got {value}")
        return "node_probe_warmup_s", number
    if key in ("NodeProbeSettleS", "NodeBaselineProbeAfterS", "NodeBaselineResetS"):
        number = _float(key, value)
        if number < 0:
            raise ValueError(f"{key} must be 0 or more, got {value}")
        return _snake(key), number
    if key == "NodeThrottleMinEffectPct":
        number = _float(key, value)
        if not 0.0 <= number <= 100.0:
            raise ValueError(f"{key} must be 0..100, got {value}")
        return "node_throttle_min_effect_pct", number
    if key in ("NodeProbeMeasureS", "NodeProbeBudgetS", "NodeReleaseHoldS"):
        return _snake(key), _positive_float(key, value)
    if key in (
        "NodeProbeMaxSlowdownPct",
        "NodeContentionTriggerPct",
        "NodeContentionReleasePct",
        "NodeThrottleFloorPct",
    ):
        number = _float(key, value)
        high = 100.0 if key == "NodeThrottleFloorPct" else 99.0
        if not 0.0 < number <= high:
            raise ValueError(f"{key} must be more than 0 and at most {high:g}, got {value}")
        return _snake(key), number
    if key == "NodeMetricsPort":
        return "node_metrics_port", _int(key, value, 0, 65535)
    if key == "NodeMetricsAddress":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{key} must be an IP address, got {value!r}") from None
        return "node_metrics_address", value
    if key == "ColocateMargin":
        number = _float(key, value)
        if not 0.0 <= number <= 1.0:
            raise ValueError(f"ColocateMargin must be 0..1, got {value}")
        return "colocate_margin", number
    if key == "NodeUsageFlushS":
        number = _float(key, value)
        if number < 0:
            raise ValueError(f"{key} must be 0 or more, got {value}")
        return "node_usage_flush_s", number
    if key == "NodeUsageMinTicks":
        return "node_usage_min_ticks", _int(key, value, 1, 999_999_999)
    raise AssertionError(f"no converter for {key}")  # CONFIG_KEYS and _convert disagree


def _snake(key: str) -> str:
    """``NodeProbeBudgetS`` -> ``node_probe_budget_s``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


_CANONICAL = {key.lower(): key for key in CONFIG_KEYS}


def _unknown_key_message(key: str) -> str:
    import difflib  # error path only: keep the import off slurmctld's start-up

    close = difflib.get_close_matches(key.lower(), list(_CANONICAL), n=1)
    hint = f" (did you mean {_CANONICAL[close[0]]}?)" if close else ""
    return f"unknown key {key!r}{hint}"


def parse_config(text: str, source: str = "coda.conf") -> tuple[CodaConfig, list[str]]:
    """Parse the text of a ``coda.conf``: ``(config, warnings)``.

    Raises :class:`ConfigError` (``source:line: message``) for unknown keys, malformed
    lines and invalid values; warnings (same prefix) report keys given more than once and
    partitions both managed and excluded.  ``SlurmConf`` is returned as written (None when
    empty); :func:`load_config` resolves it.
    """
    seen: dict[str, tuple[str, int]] = {}
    warnings: list[str] = []
    for lineno, line in _logical_lines(text, source):
        for key, value in _tokenize(line, source, lineno):
            canonical = _CANONICAL.get(key.lower())
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
        try:
            name, typed = _convert(key, value)
        except ValueError as exc:
            raise ConfigError(source, lineno, str(exc)) from None
        values[name] = typed
        lines[key] = lineno
    config = CodaConfig(**values)  # type: ignore[arg-type]

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
    return config, warnings


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


_NODENAME_LINE = re.compile(r"\s*nodename\s*=", re.IGNORECASE)
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


def _gres_gpus(gres: str) -> int:
    """GPUs in a node's ``Gres=`` value (``gpu:a100:4,gpu:v100:2(S:0-1),shard:8`` is 6)."""
    total = 0
    for item in gres.split(","):
        item = item.strip()
        paren = item.find("(")
        if paren >= 0:
            item = item[:paren]
        fields = item.split(":")
        if fields[0] == "gres" and len(fields) > 1:
            del fields[0]
        if fields[0] != "gpu":
            continue
        count = 1
        if len(fields) > 1:
            m = _GRES_COUNT.fullmatch(fields[-1])
            if m is not None:
                count = int(m.group(1)) * _GRES_MULT[m.group(2).lower()]
            elif len(fields) > 2 or not fields[-1]:
                raise ValueError(f"bad GPU count in Gres={gres!r}")
        total += count
    return total


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
    cpus = _node_int(params, "cpus", 0) or _node_int(params, "procs", 0)
    if not cpus:
        # As Slurm: SocketsPerBoard, when given, wins over Sockets (the total).
        boards = _node_int(params, "boards", 1)
        per_board = _node_int(params, "socketsperboard", 0)
        sockets = boards * per_board if per_board else _node_int(params, "sockets", 1)
        cpus = (
            sockets
            * _node_int(params, "corespersocket", 1)
            * _node_int(params, "threadspercore", 1)
        )
    gpus = _gres_gpus(params["gres"]) if params.get("gres") else 0
    feature_list = params.get("feature") or params.get("features") or ""
    features = tuple(dict.fromkeys(f.strip() for f in feature_list.split(",") if f.strip()))
    return NodeShape(names, cpus, gpus, count_hostlist(names), features)


def _read_slurm_file(
    path: Path,
    base_dir: Path,
    nodes: list[NodeShape],
    defaults: dict[str, str],
    stack: tuple[Path, ...],
) -> None:
    if len(stack) > _MAX_INCLUDE_DEPTH:
        raise ConfigError(str(path), None, "Include nested too deeply")
    resolved = path.resolve()
    if resolved in stack:
        raise ConfigError(str(path), None, "Include loop")
    stack = (*stack, resolved)
    source = str(path)
    for lineno, line in _logical_lines(_read_text(path), source):
        include = _INCLUDE_LINE.fullmatch(line)
        if include is not None:
            for included in _include_targets(include.group(1).strip(), base_dir, source, lineno):
                _read_slurm_file(included, base_dir, nodes, defaults, stack)
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


def _include_targets(spec: str, base_dir: Path, source: str, lineno: int) -> list[Path]:
    if len(spec) >= 2 and spec[0] == '"' and spec[-1] == '"':
        spec = spec[1:-1]
    target = Path(spec)
    if not target.is_absolute():
        target = base_dir / target
    if glob.has_magic(str(target)):
        return [Path(p) for p in sorted(glob.glob(str(target)))]
    if not target.is_file():
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


def max_cpus_per_gpu_on_any_node(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """The largest ``cpus // gpus_per_node`` over nodes with at least ``gpus_per_node``
    GPUs: the most CPUs per GPU any node can give such a job.  None when no node fits (or
    there is no node information, or ``gpus_per_node`` < 1)."""
    if gpus_per_node < 1:
        return None
    best: int | None = None
    for node in nodes:
        if node.gpus >= gpus_per_node:
            per_gpu = node.cpus // gpus_per_node
            if best is None or per_gpu > best:
                best = per_gpu
    return best


def node_share_cpus_per_gpu(nodes: Iterable[NodeShape], gpus_per_node: int) -> int | None:
    """``DefaultCpusPerGpu=share``: the fewest ``cpus // gpus`` over the nodes with at least
    ``gpus_per_node`` GPUs, i.e. each GPU's even share of its node's cores on the leanest node
    that could run the job (so the job fits on any of them beside jobs sized the same way).
    None when no node fits, or there is no node information."""
    if gpus_per_node < 1:
        return None
    shares = [node.cpus // node.gpus for node in nodes if node.gpus >= gpus_per_node]
    return max(1, min(shares)) if shares else None


def make_node_share(nodes: Iterable[NodeShape]) -> Callable[[int], int | None]:
    """A fast ``node_share(gpus_per_node)`` for :func:`slurm_plugin.policy.decide`: the
    answers of :func:`node_share_cpus_per_gpu` precomputed for every GPU count."""
    shapes = tuple(nodes)
    most_gpus = max((node.gpus for node in shapes), default=0)
    table = {gpn: node_share_cpus_per_gpu(shapes, gpn) for gpn in range(1, most_gpus + 1)}
    return table.get


def make_node_cap(nodes: Iterable[NodeShape]) -> Callable[[int], int | None]:
    """A fast ``node_cap(gpus_per_node)`` for :func:`slurm_plugin.policy.decide`: the
    answers of :func:`max_cpus_per_gpu_on_any_node` precomputed for every GPU count."""
    shapes = tuple(nodes)
    most_gpus = max((node.gpus for node in shapes), default=0)
    table: dict[int, int | None] = {
        gpn: max_cpus_per_gpu_on_any_node(shapes, gpn) for gpn in range(1, most_gpus + 1)
    }
    return table.get
