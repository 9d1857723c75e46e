"""The contention eliminator: shield DNN jobs from the CPU jobs beside them. Pure.

Each tick, each training DNN job's rate is compared with its own uncontended baseline: the
median of its rates over *quiet* ticks (training at its whole allocation, not probed, no
CPU job drawing on its sockets, nothing throttled there). When the rate (mean of the last
``smooth_ticks``) is more than ``trigger_slowdown`` below the baseline while CPU jobs on the
same socket draw memory bandwidth or CPU, the CPU job that draws most is throttled one step:

* **MBA** (Intel RDT memory-bandwidth allocation) where the node has it: the CPU job's
  bandwidth is aimed at ``mba_fractions`` of what it drew before the first step. MBA's
  percentage is only a request (caps overshooting 3-4x are reported against
  intel-cmt-cat), so the loop closes on *measured* bandwidth: while the job still draws
  more than ``overshoot`` times the aim, the MBA value is lowered further in
  ``mba_correction_pct`` steps, down to the floor.
* **L3 ways** (Intel RDT cache allocation, CAT) where the node has it, once MBA is at its
  floor (or first, without MBA or without the job's bandwidth): the job may allocate lines
  only in ``l3_way_fractions`` of the cache's ways, down to ``floor_l3_ways``. A job limited
  to a few ways can no longer evict the DNN job's lines from the others (Intel SDM vol. 3B,
  "Cache Allocation Technology"; kernel ``Documentation/filesystems/resctrl.rst``).
* **CPU quota** last, or alone without RDT: the job is capped at ``quota_fractions`` of its
  allocated cores.

One step per victim per tick, and a job that was just stepped is not stepped again for
``step_s`` (its effect needs a tick to show). Release is one step at a time, each after
``release_hold_s`` with no victim on the job's sockets (every DNN job there within
``release_slowdown`` of its baseline, or not training), in reverse order (CPU quota first,
then L3 ways, then MBA); a job throttled again soon after a release waits twice as long
before the next one (up to 8x), which damps oscillation. A CPU job is never throttled
below ``floor_fraction`` of its allocation (quota), ``floor_mba_pct`` (MBA) or
``floor_l3_ways`` (CAT; never below the hardware's ``min_cbm_bits`` either); DNN jobs are
never throttled.

**Attribution.** Without per-job bandwidth "draws most" means "uses most CPU", and a
compute-bound job uses many cores and draws little. So with ``min_effect_per_core`` set, a
job is judged by its effect: from its first step for a DNN job it alone is stepped for
that job; at its floor the DNN job must be ``min_effect_per_core`` less slowed per core
held back (unless back under the trigger already). If not, it is *unproven* (a saturated
bus hides any one job's share): given back whole as soon as no DNN job beside it is past
the trigger, and if the DNN job then slows by less than ``min_effect_per_core`` of the
trigger per core given back, it is *innocent* and left alone for ``retest_s``.

**Baseline probe.** A DNN job that starts beside busy CPU jobs never has a quiet tick, so
it would never get a baseline and never be shielded (the simulator showed this to be the
common case on a full cluster). When a training job has gone
``baseline_probe_after_s`` without a baseline while CPU jobs draw on its sockets, those
CPU jobs are capped at their floor for a short measurement (at most
``baseline_probe_max_s``, one probe per node at a time, and again for the same job only
after ``baseline_probe_every_s``): the job's rate once the caps have had ``step_s`` to
show is its baseline. The caps are then lifted at once; if the job then runs more than
``trigger_slowdown`` below that baseline, the ladder above takes over as usual.

**Baseline reset.** A job still more than ``trigger_slowdown`` below its baseline after
``baseline_reset_s`` with every CPU job beside it at its floor is slowed by itself, not by
them: its median rate over that time becomes its baseline (event ``baseline-reset``), so
the CPU jobs are released as usual and throttled again only below the new baseline.

**What a hold buys** (``min_gain_per_hold``, 0 = off). Once the CPU jobs held back for a
DNN job have shown their effect (it is back under the trigger, or every job beside it is
at its floor, and ``smooth_ticks`` ticks have passed since the last step), the DNN jobs on
those sockets must together be at least ``min_gain_per_hold`` less slowed per whole CPU job
held back (the sum of 1 - share over the jobs held), measured from the worst slowdown since
the first step. A hold that buys less is given back whole and that DNN job is not shielded
for ``retest_s`` (docs/evaluation.md, "The eliminator's trade-off": on the traces the
simulator replays, much of the CPU time the eliminator takes goes to holds that buy a DNN
job a few points).

**What a hold costs** (``gpu_worth_cores``, 0 = off). The same hold is also priced: the GPU
time it gives back (each DNN job on those sockets: its GPUs times the points of slowdown
taken off since the worst before the hold) must be worth, at ``gpu_worth_cores`` cores per
GPU, the cores it holds back (each CPU job: its allocated cores times the share of them it
is held back from). Unlike the benefit test, which is taken once, the price is taken again
after every further step for that DNN job, so a hold that grows (a CPU job beside it speeds
up, another arrives) is priced as it stands. A hold that costs more than it gives back is
given back whole and that DNN job is not shielded for ``retest_s``: on the traces the
simulator replays, a CPU pod of weeks held back for two one-GPU jobs was the largest single
cost of the shield (docs/evaluation.md, "The eliminator's trade-off").

**Where each part lives.** :mod:`.eliminator` ticks and composes the rest:
:mod:`.baseline` (baseline, probe, reset), :mod:`.ladder` (the steps down and back up, MBA's
correction), :mod:`.attribution` (who pays), :mod:`.holds` (what a hold buys and costs),
:mod:`.release` (when a held job is given back). :mod:`.params` holds the settings,
:mod:`.jobs` a tick's inputs and outputs, :mod:`.state` what is kept between ticks,
:mod:`.pcie` the PCIe-heavy pairs.
"""

from coda_node.policy.contention.eliminator import CLOCK_SLACK_S, Eliminator
from coda_node.policy.contention.jobs import (
    ContentionOutput,
    CpuJob,
    DnnJob,
    Throttle,
    throttle_share,
    tighter,
)
from coda_node.policy.contention.params import (
    GPU_WORTH_CORES,
    GPU_WORTH_CORES_SPREAD,
    ContentionParams,
    gpu_worth_cores,
    params_from_config,
    quota_ladder,
)
from coda_node.policy.contention.pcie import PCIE_HEAVY_BYTES_PER_S, PcieUse, pcie_pairs

__all__ = [
    "CLOCK_SLACK_S",
    "GPU_WORTH_CORES",
    "GPU_WORTH_CORES_SPREAD",
    "PCIE_HEAVY_BYTES_PER_S",
    "ContentionOutput",
    "ContentionParams",
    "CpuJob",
    "DnnJob",
    "Eliminator",
    "PcieUse",
    "Throttle",
    "gpu_worth_cores",
    "params_from_config",
    "pcie_pairs",
    "quota_ladder",
    "throttle_share",
    "tighter",
]
