"""``coda.conf`` keys: coda-node's contention eliminator: its trigger and release, its
baseline probe and reset, and the ladder it throttles CPU jobs down (``NodeContention*``,
``NodeBaseline*``, ``NodeReleaseHoldS``, ``NodeThrottle*``)."""

from coda_common.config.keys import key
from coda_common.config.values import (
    float_at_least_0,
    float_range,
    or_none,
    percent,
    positive_float,
    yes_no,
)

NODE_CONTENTION = key(
    "NodeContention",
    "yes|no",
    "yes",
    yes_no,
    "coda-node: throttle CPU jobs that slow a DNN job on the same socket (MBA, else CPU quota).",
)

NODE_CONTENTION_TRIGGER_PCT = key(
    "NodeContentionTriggerPct",
    "float",
    "10",
    percent(99),
    "coda-node: throttle when a DNN job runs this % below its uncontended baseline (1..99).",
)

NODE_CONTENTION_RELEASE_PCT = key(
    "NodeContentionReleasePct",
    "float",
    "5",
    percent(99),
    "coda-node: release one step when every DNN job nearby is within this % of its "
    "baseline (< NodeContentionTriggerPct).",
)

NODE_BASELINE_PROBE_AFTER_S = key(
    "NodeBaselineProbeAfterS",
    "float",
    "60",
    float_at_least_0,
    "coda-node: a DNN job that has trained this long beside drawing CPU jobs without an "
    "uncontended baseline gets one measured by capping those CPU jobs at their floor for "
    "up to 20 s (0 = never).",
)

NODE_BASELINE_RESET_S = key(
    "NodeBaselineResetS",
    "float",
    "60",
    float_at_least_0,
    "coda-node: a DNN job still slowed after this long with every CPU job beside it at "
    "its floor gets its rate there as its new baseline, and the CPU jobs are released "
    "(0 = never: they stay at their floor while the job stays slow).",
)

NODE_RELEASE_HOLD_S = key(
    "NodeReleaseHoldS",
    "float",
    "30",
    positive_float,
    "coda-node: seconds between two release steps of a throttled CPU job (> 0).",
)

NODE_THROTTLE_FLOOR_PCT = key(
    "NodeThrottleFloorPct",
    "float",
    "10",
    percent(100),
    "coda-node: a throttled CPU job keeps at least this % of its cores (quota) or of "
    "memory bandwidth (MBA) (1..100).",
)

NODE_THROTTLE_MIN_EFFECT_PCT = key(
    "NodeThrottleMinEffectPct",
    "float",
    "5",
    float_range(0, 100),
    "coda-node: a CPU job held at its floor must cut the DNN job's slowdown by this % "
    "per core held back, or it is given back whole; if that does not slow the DNN job "
    "either, it is left alone for 30 min (0 = throttle by CPU use or bandwidth alone).",
)

NODE_THROTTLE_STEP_PCT = key(
    "NodeThrottleStepPct",
    "float or empty",
    "10",
    or_none(percent(50)),
    "coda-node: each step of a CPU job's quota takes this % of its cores more, down to "
    "NodeThrottleFloorPct (10: 90 %, 80 %, ...); empty = steps to 75 %, 50 % and 25 %.",
)

NODE_THROTTLE_MIN_GAIN_PCT = key(
    "NodeThrottleMinGainPct",
    "float",
    "20",
    float_range(0, 100),
    "coda-node: once the CPU jobs held back for a DNN job have shown their effect, the "
    "DNN jobs beside them must be this many points of slowdown less slowed per whole CPU "
    "job held back, or all of them are given back and that DNN job is not shielded for "
    "30 min (0 = no such test).",
)

NODE_THROTTLE_GPU_WORTH_CORES = key(
    "NodeThrottleGpuWorthCores",
    "float or empty",
    "",
    or_none(float_range(0, 10000)),
    "coda-node: the price of a hold, taken after every step for a DNN job: the GPU time "
    "the CPU jobs held back give back (the DNN jobs' GPUs times the points of slowdown "
    "taken off) must be worth, at this many cores per GPU, the cores held back, or all "
    "of them are given back and that DNN job is not shielded for 30 min (0 = no such "
    "test); empty = 10 on a node the submit hook spreads memory-bound CPU jobs over "
    "(MemBwSpreadGres: a partition of the node, not excluded, has that GRES on every "
    "node), else 14.",
)
