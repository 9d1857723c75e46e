"""``coda.conf`` keys: coda-node's online profiling, which probes core counts inside
running DNN jobs (``NodeProfile``, ``NodeProbe*``)."""

from coda_common.config.keys import key
from coda_common.config.values import float_at_least_0, ints, percent, positive_float, yes_no

NODE_PROFILE = key(
    "NodeProfile",
    "yes|no",
    "yes",
    yes_no,
    "coda-node: profile GPU jobs of unknown workloads online (probe core counts inside "
    "their allocation) and publish the profile to ProfileStore.",
)

NODE_PROBE_WARMUP_S = key(
    "NodeProbeWarmupS",
    "float",
    "300",
    float_at_least_0,
    "coda-node: seconds after a job starts before it is probed or gets a baseline (>= 0).",
)

NODE_PROBE_SETTLE_S = key(
    "NodeProbeSettleS",
    "float",
    "30",
    float_at_least_0,
    "coda-node: seconds a probe waits after changing cores before measuring.",
)

NODE_PROBE_MEASURE_S = key(
    "NodeProbeMeasureS",
    "float",
    "60",
    positive_float,
    "coda-node: seconds a probe measures (three samples) (> 0).",
)

NODE_PROBE_MAX_JOBS = key(
    "NodeProbeMaxJobs",
    "int",
    "1",
    ints(0),
    "coda-node: jobs probed at once on a node (0 = none).",
)

NODE_PROBE_BUDGET_S = key(
    "NodeProbeBudgetS",
    "float",
    "900",
    positive_float,
    "coda-node: most seconds one job spends below its allocation while probed (> 0).",
)

NODE_PROBE_MAX_SLOWDOWN_PCT = key(
    "NodeProbeMaxSlowdownPct",
    "float",
    "50",
    percent(99),
    "coda-node: a probe slower than this % below the job's full-allocation rate ends at "
    "once, and fewer cores are not tried (1..99).",
)
