"""``coda.conf`` keys: the submit hook's decision (what it sets, when it keeps a user's
value, how sure a profile must be), the partitions it acts on, and what it logs and records
(``Mode`` ... ``SlurmConf``)."""

from coda_common.config.keys import key
from coda_common.config.values import (
    abs_path_or_none,
    cpus_or_share,
    float_range,
    interval_s,
    ints,
    one_of,
    partition_list,
    path_or_none,
    positive_float,
    prior_aliases,
    signature_ignore,
    yes_no,
)
from coda_common.signature import DEFAULT_SPEC

MODE = key(
    "Mode",
    "enforce|advise|off",
    "enforce",
    one_of("enforce", "advise", "off"),
    "enforce: rewrite --cpus-per-gpu; advise: record and log the decision but leave the "
    "job unchanged; off: do nothing.",
)

USER_VALUE = key(
    "UserValue",
    "keep|lower|replace",
    "keep",
    one_of("keep", "lower", "replace"),
    "What to do when the user gave --cpus-per-gpu or --cpus-per-task: keep it, lower it "
    "to the profile's value when that is smaller, or replace it with the profile's value.",
)

USER_MESSAGE = key(
    "UserMessage",
    "all|batch|none",
    "batch",
    one_of("all", "batch", "none"),
    "Which submissions get coda's line on the submitting command's stderr: all (sbatch, "
    "srun and salloc), batch (sbatch only: interactive stderr stays the program's), or "
    "none. The decision is in slurmctld's log and the job's AdminComment whatever this "
    "says, and a refused submission always gets its reason.",
)

MIN_CPUS_PER_GPU = key(
    "MinCpusPerGpu", "int", "1", ints(1), "Smallest --cpus-per-gpu CODA sets (1 or more)."
)

MAX_CPUS_PER_GPU = key(
    "MaxCpusPerGpu",
    "int",
    "64",
    ints(1),
    "Largest --cpus-per-gpu CODA sets (MinCpusPerGpu or more).",
)

DEFAULT_CPUS_PER_GPU = key(
    "DefaultCpusPerGpu",
    "int, share or empty",
    "",
    cpus_or_share,
    "--cpus-per-gpu for workloads without a confident profile: a number, or share (the "
    "node's cores per GPU: the fewest CPUs per GPU among the slurm.conf nodes that can "
    "hold the job's GPUs); empty leaves Slurm's DefCpuPerGPU in charge.",
)

UNPROFILED_USER_VALUE = key(
    "UnprofiledUserValue",
    "keep|raise",
    "keep",
    one_of("keep", "raise"),
    "What to do with a user's own --cpus-per-gpu or --cpus-per-task when the workload "
    "has no confident profile: keep it, or raise it to DefaultCpusPerGpu when it is "
    "lower, so a first run is not starved of cores and coda-node can profile it from "
    "above its sweet spot. raise needs DefaultCpusPerGpu.",
)

MIN_CONFIDENCE = key(
    "MinConfidence",
    "float",
    "0.8",
    float_range(0, 1),
    "A profile is used only when its confidence is at least this (0..1).",
)

MULTI_NODE_GPU_CAP = key(
    "MultiNodeGpuCap",
    "int",
    "2",
    ints(1),
    "Multi-node jobs whose profile has no measured multi-node figure: per-GPU CPU demand is "
    "scaled as if a node had at most this many GPUs (CODA: multi-node demand is at most the "
    "1-node-2-GPU demand, read per node; a value of at least the GPUs per node reads it per "
    "GPU and leaves the single-node figure unscaled).",
)

MULTI_NODE_MIN_SAMPLES = key(
    "MultiNodeMinSamples",
    "int",
    "2",
    ints(1),
    "Multi-node jobs: a profile's measured multi-node figure (the cores per GPU the "
    "workload's multi-node runs used per node, as coda-node saw them; the p90 of the last "
    "16 per-node figures) replaces the MultiNodeGpuCap rule once it holds at least this many "
    "per-node figures: ceil(figure x (1 + MultiNodeMargin)), within MinCpusPerGpu, "
    "MaxCpusPerGpu and the node cap. It is used even when the profile's single-node "
    "confidence is below MinConfidence.",
)

MULTI_NODE_MARGIN = key(
    "MultiNodeMargin",
    "float",
    "0.1",
    float_range(0, 1),
    "Headroom on a measured multi-node figure (0..1): a multi-node job gets "
    "ceil(figure x (1 + this)) cores per GPU (MultiNodeMinSamples).",
)

PRIORS_FROM_NAMES = key(
    "PriorsFromNames",
    "yes|no",
    "yes",
    yes_no,
    "A GPU job without a confident profile of its own gets at least the cores per GPU of "
    "the global profile (workload:*:NAME) its coda:workload= name, job name or batch "
    "script names as a whole word (case-insensitive; - _ . alike; the script's first 48 "
    "KiB and last 16 KiB), within MinCpusPerGpu, MaxCpusPerGpu, the node cap and the "
    "user-value rules; never fewer than without it. Its record says src=prior:NAME.",
)

PRIOR_ALIASES = key(
    "PriorAliases",
    "list of NAME:ALIAS",
    "",
    prior_aliases,
    "Other spellings that name a global profile as a prior, e.g. "
    "resnet50:resnet-50,resnet50:rn50 (letters, digits, - _ . ; at least 2 characters "
    "and one letter each).",
)

HOOK_BUDGET_MS = key(
    "HookBudgetMs",
    "float",
    "20",
    positive_float,
    "Time budget of the submit hook in milliseconds (> 0).",
)

SIGNATURE_IGNORE = key(
    "SignatureIgnore",
    "@sets and patterns",
    DEFAULT_SPEC,
    signature_ignore,
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

RELOAD_INTERVAL_S = key(
    "ReloadIntervalS",
    "float",
    "5",
    interval_s,
    "Seconds between checks for a changed profile store, coda.conf or slurm.conf (0.1 to 86400).",
)

PARTITIONS = key(
    "Partitions",
    "list",
    "",
    partition_list,
    "Comma-separated partitions CODA manages; empty = all partitions.",
)

EXCLUDE_PARTITIONS = key(
    "ExcludePartitions",
    "list",
    "",
    partition_list,
    "Comma-separated partitions CODA never touches (wins over Partitions).",
)

LOG_LEVEL = key(
    "LogLevel",
    "error|info|verbose|debug",
    "info",
    one_of("error", "info", "verbose", "debug"),
    "How much the hook writes to slurmctld's log.",
)

HOOK_STATS_FILE = key(
    "HookStatsFile",
    "path or empty",
    "/var/lib/coda/hook-stats.json",
    abs_path_or_none,
    "Where the hook writes its counters (calls, p50/p99 time, fail-open count) every "
    "ReloadIntervalS, for coda-slurm status; empty = do not write them. %h is the "
    "controller's SlurmctldHost name; with several SlurmctldHost each controller writes "
    "its own file, a path without %h getting .NAME before its extension.",
)

DECISION_JOURNAL = key(
    "DecisionJournal",
    "path or empty",
    "/var/lib/coda/decisions.jsonl",
    abs_path_or_none,
    "Where the hook appends one JSON line per decision (for coda-slurm status), flushed "
    "at least once a second; empty = keep no journal. %h and several SlurmctldHost as "
    "for HookStatsFile.",
)

JOURNAL_MAX_BYTES = key(
    "JournalMaxBytes",
    "int",
    "8388608",
    ints(65536, 999_999_999),
    "Size at which DecisionJournal is rotated to DecisionJournal.1 (the previous .1 is "
    "dropped); 65536 or more.",
)

SLURM_CONF = key(
    "SlurmConf",
    "path or empty",
    "",
    path_or_none,
    "slurm.conf to read node shapes and partitions from (read again when it changes); "
    "empty = the slurm.conf beside coda.conf; a relative path is relative to coda.conf's "
    "directory.",
)
