"""``coda.conf`` keys: ``coda-slurm reserve`` (spare cores of GPU nodes for CPU jobs) and
``coda-slurm colocate`` (``Reserve*``, ``ColocateMargin``)."""

from coda_common.config.keys import key
from coda_common.config.values import (
    abs_path,
    float_range,
    interval_s,
    ints,
    or_none,
    partition_list,
    positive_float,
)

RESERVE_PARTITIONS = key(
    "ReservePartitions",
    "list",
    "",
    partition_list,
    "coda-slurm reserve: CPU partitions over GPU nodes whose MaxCPUsPerNode it keeps at "
    "the cores GPU jobs do not need; empty = off.",
)

RESERVE_INTERVAL_S = key(
    "ReserveIntervalS",
    "float",
    "60",
    interval_s,
    "coda-slurm reserve: seconds between two passes of the loop (0.1 to 86400).",
)

RESERVE_MIN_CPUS = key(
    "ReserveMinCpus",
    "int",
    "1",
    ints(0),
    "coda-slurm reserve: MaxCPUsPerNode is never set below this (0 closes the partition "
    "to new CPU work when GPU jobs need every core).",
)

RESERVE_CPUS_PER_GPU = key(
    "ReserveCpusPerGpu",
    "float or empty",
    "",
    or_none(positive_float),
    "coda-slurm reserve: cores an idle GPU keeps reserved when no GPU job is pending; "
    "empty = the largest DefCpuPerGPU of the GPU partitions over the same nodes, else 4.",
)

RESERVE_STATE_FILE = key(
    "ReserveStateFile",
    "path",
    "/var/lib/coda/reserve.json",
    abs_path,
    "coda-slurm reserve: where each partition's original MaxCPUsPerNode is saved before "
    "the first change, for --revert.",
)

COLOCATE_MARGIN = key(
    "ColocateMargin",
    "float",
    "0.05",
    float_range(0, 1),
    "coda-slurm colocate: a pair is reported as gaining from sharing a GPU only when its "
    "predicted speedup is at least 1 + this (0..1).",
)
