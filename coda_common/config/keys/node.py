"""``coda.conf`` keys: coda-node, the daemon on each GPU node: where it reads and writes,
its tick, what it measures and exports. ``NodeEnforce`` is defined in
:mod:`coda_common.config.codaconf`, beside the check of its mechanisms."""

from coda_common.config.keys import key
from coda_common.config.values import (
    abs_path,
    float_at_least_0,
    interval_s,
    ints,
    ip_address,
    node_name,
    yes_no,
)

NODE_NAME = key(
    "NodeName",
    "name or empty",
    "",
    node_name,
    "coda-node: this node's NodeName in slurm.conf; empty = the short host name.",
)

NODE_STATE_DIR = key(
    "NodeStateDir",
    "path",
    "/var/lib/coda-node",
    abs_path,
    "coda-node: directory of its state file (everything it changed, so that a restart or "
    "coda-node restore can put jobs back) and of admin limits. Written only when what "
    "it changed changes.",
)

NODE_RUNTIME_DIR = key(
    "NodeRuntimeDir",
    "path",
    "/run/coda-node",
    abs_path,
    "coda-node: directory of view.json, the last tick's view that coda-node status "
    "reads, rewritten every tick: keep it on tmpfs (/run) so that a node does not write "
    "it to disk every second. A restart of the daemon reads it back (what each job's "
    "profiling had reached); a reboot may clear it.",
)

NODE_INTERVAL_S = key(
    "NodeIntervalS",
    "float",
    "1",
    interval_s,
    "coda-node: seconds between two sample-plan-enforce passes (0.1 to 86400).",
)

NODE_ROOT = key(
    "NodeRoot",
    "path",
    "/",
    abs_path,
    "coda-node: system root every /sys, /proc and /dev path is read under (tests point "
    "it at a fixture tree).",
)

NODE_PROGRESS_DIR = key(
    "NodeProgressDir",
    "path",
    "/run/coda-node/progress",
    abs_path,
    "coda-node: directory of the per-job progress files jobs may write (created root-owned "
    "0755; one file per job, owned by the job's user).",
)

NODE_JOB_MEM_BW = key(
    "NodeJobMemBw",
    "yes|no",
    "yes",
    yes_no,
    "coda-node: measure each CPU job's memory bandwidth with its own resctrl monitoring "
    "group (Intel RDT MBM, one RMID per job), so contention control can cap the job that "
    "draws most with MBA; no = contention control does without MBA.",
)

NODE_METRICS_PORT = key(
    "NodeMetricsPort",
    "int",
    "0",
    ints(0, 65535),
    "coda-node: TCP port of its Prometheus endpoint (/metrics); 0 = no endpoint (0..65535).",
)

NODE_METRICS_ADDRESS = key(
    "NodeMetricsAddress",
    "address",
    "127.0.0.1",
    ip_address,
    "coda-node: address the Prometheus endpoint listens on (0.0.0.0 or :: = every "
    "interface; keep 127.0.0.1 unless the scraper is elsewhere).",
)

NODE_USAGE_FLUSH_S = key(
    "NodeUsageFlushS",
    "float",
    "600",
    float_at_least_0,
    "coda-node: seconds between two writes of a running job's usage record (GPU usage, "
    "or a CPU job's memory bandwidth) to its profile (also written when the job ends); "
    "0 = only when the job ends.",
)

NODE_USAGE_MIN_TICKS = key(
    "NodeUsageMinTicks",
    "int",
    "30",
    ints(1, 999_999_999),
    "coda-node: undisturbed ticks a job must have collected before its usage record is "
    "written (1 or more).",
)
