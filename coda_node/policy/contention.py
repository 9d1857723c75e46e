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
"""

from __future__ import annotations

import math
import operator
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from coda_common.config.codaconf import CodaConfig
from coda_node.policy.allocator import Event
from coda_node.policy.observe import Progress

CLOCK_SLACK_S = 1e-6
"""How far two clocks may disagree by rounding on when a wait ends
(:meth:`Eliminator.next_deadline_s`)."""


@dataclass(frozen=True, slots=True)
class ContentionParams:
    """The eliminator's settings. These defaults are the mechanism's (a 25 % floor on 75/50/25 %
    quota steps, no hold test), which the unit tests exercise; coda-node and the simulator
    build theirs from coda.conf (:func:`params_from_config`), whose defaults differ
    (docs/config.md)."""

    enabled: bool = True
    trigger_slowdown: float = 0.10
    release_slowdown: float = 0.05
    smooth_ticks: int = 2
    baseline_min_ticks: int = 5
    baseline_ticks: int = 300
    contender_cpu_fraction: float = 0.25
    """A CPU job draws when it uses this share of its allocated cores..."""
    contender_mem_bw_bytes_per_s: float = 1e9
    """... or this much memory bandwidth."""
    quota_fractions: tuple[float, ...] = (0.75, 0.5, 0.25)
    mba_fractions: tuple[float, ...] = (0.7, 0.5, 0.3)
    overshoot: float = 1.25
    mba_correction_pct: int = 10
    floor_fraction: float = 0.25
    floor_mba_pct: int = 25
    step_s: float = 2.0
    release_hold_s: float = 30.0
    max_backoff: int = 8
    baseline_probe_after_s: float = 60.0
    """Contended training time without a baseline before a baseline probe (0 = never)."""
    baseline_probe_max_s: float = 20.0
    baseline_probe_every_s: float = 1800.0
    baseline_reset_s: float = 60.0
    """A job still slowed after this long with every CPU job beside it at its floor gets its
    rate there as its new baseline (0 = never): the old one no longer holds."""
    l3_way_fractions: tuple[float, ...] = (0.5, 0.25)
    """CAT ladder: the share of the cache's ways a throttled CPU job may allocate in."""
    floor_l3_ways: int = 2
    """Fewest L3 ways a CPU job is limited to (never below the hardware's minimum)."""
    min_effect_per_core: float = 0.05
    """Attribution: once a CPU job stepped to its floor has had ``smooth_ticks`` ticks to
    show, the DNN job it was taken for must be this share less slowed per core held back
    (0.05: holding back 4 cores must bring a 20 % slowdown to 16 % or less), unless it is
    back under the trigger already. Otherwise the job is *unproven*: given back whole as
    soon as no DNN job beside it is past the trigger, and if the DNN job then gets slower
    by less than this share of the trigger per core given back, it is left alone for
    ``retest_s``. 0 = no test: contenders are stepped by their draw alone."""
    retest_s: float = 1800.0
    """How long a CPU job found not to slow anyone is left alone before it may be tried
    again (it may have changed phase)."""
    min_gain_per_hold: float = 0.0
    """Benefit test of a whole hold (see the module docstring): 0.2 = holding one whole CPU
    job back must take 20 points off the slowdowns of the DNN jobs beside it. 0 = no test."""
    gpu_worth_cores: float = 0.0
    """Price test of a whole hold: the GPU time it gives back (each DNN job's GPUs times the
    points of slowdown taken off) times this must be at least the cores it holds back.
    0 = no test."""


def quota_ladder(step_fraction: float, floor_fraction: float) -> tuple[float, ...]:
    """The quota steps ``1 - step, 1 - 2 step, ...`` above the floor (which is the last)."""
    out: list[float] = []
    k = 1
    while round(1.0 - k * step_fraction, 6) > floor_fraction:
        out.append(round(1.0 - k * step_fraction, 6))
        k += 1
    return tuple(out)


GPU_WORTH_CORES = 14.0
"""The price of a hold when ``NodeThrottleGpuWorthCores`` is empty, on a node whose CPU jobs
are packed as Slurm places them (docs/evaluation.md, the eliminator's trade-off)."""
GPU_WORTH_CORES_SPREAD = 10.0
"""The same on a node whose memory-bound CPU jobs are spread by ``MemBwSpreadGres``: fewer of
them share a bus with a DNN job, and a lower price keeps the gain for less CPU work."""


def gpu_worth_cores(cfg: CodaConfig, *, membw_spread: bool = False) -> float:
    """``NodeThrottleGpuWorthCores``, or when it is empty the default for a node whose
    memory-bound CPU jobs are spread (``membw_spread``) or not."""
    if cfg.node_throttle_gpu_worth_cores is not None:
        return cfg.node_throttle_gpu_worth_cores
    return GPU_WORTH_CORES_SPREAD if membw_spread else GPU_WORTH_CORES


def params_from_config(cfg: CodaConfig, *, membw_spread: bool = False) -> ContentionParams:
    """The eliminator's settings from coda.conf's ``Node*`` keys; ``membw_spread``: this
    node carries ``MemBwSpreadGres`` (see :func:`gpu_worth_cores`)."""
    ladder = ContentionParams().quota_fractions
    if cfg.node_throttle_step_pct is not None:
        ladder = quota_ladder(
            cfg.node_throttle_step_pct / 100.0, cfg.node_throttle_floor_pct / 100.0
        )
    return ContentionParams(
        enabled=cfg.node_contention,
        trigger_slowdown=cfg.node_contention_trigger_pct / 100.0,
        release_slowdown=cfg.node_contention_release_pct / 100.0,
        release_hold_s=cfg.node_release_hold_s,
        baseline_probe_after_s=cfg.node_baseline_probe_after_s,
        baseline_reset_s=cfg.node_baseline_reset_s,
        floor_fraction=cfg.node_throttle_floor_pct / 100.0,
        floor_mba_pct=max(1, round(cfg.node_throttle_floor_pct)),
        step_s=max(2.0 * cfg.node_interval_s, 1.0),
        min_effect_per_core=cfg.node_throttle_min_effect_pct / 100.0,
        min_gain_per_hold=cfg.node_throttle_min_gain_pct / 100.0,
        gpu_worth_cores=gpu_worth_cores(cfg, membw_spread=membw_spread),
        quota_fractions=ladder,
    )


@dataclass(frozen=True, slots=True)
class DnnJob:
    job_id: int
    sockets: frozenset[int]
    progress: Progress
    probing: bool = False
    """Its cores are being probed: its rate is low on purpose."""
    gpus: int = 1
    """The GPUs it trains on, on all its nodes (a synchronous job runs at the pace of its
    slowest node, so a hold on one node speeds all of them): what the price test
    (``gpu_worth_cores``) weighs its slowdown by."""


@dataclass(frozen=True, slots=True)
class CpuJob:
    job_id: int
    sockets: frozenset[int]
    allocated_cores: int
    cpu_rate_cores: float | None
    mem_bw_bytes_per_s: float | None


@dataclass(frozen=True, slots=True)
class Throttle:
    quota_cores: float | None = None
    mem_bw_pct: int | None = None
    reason: str = ""
    l3_ways: int | None = None
    """L3 ways the job may allocate in (CAT); None: the whole cache."""


@dataclass(slots=True)
class _Victim:
    rates: deque[float]
    baseline: deque[float]
    slowdown: float | None = None
    contended_since_s: float | None = None
    """Since when it has trained without a baseline beside drawing CPU jobs."""
    last_probe_s: float | None = None
    floor_since_s: float | None = None
    """Since when every CPU job beside it has been at its floor while it stays slowed."""
    floor_rates: list[float] = field(default_factory=list)
    """Its rates since then (after ``step_s`` for the last step to show)."""


@dataclass(slots=True)
class _Hold:
    """CPU jobs held back for one DNN job, from its first step until it is judged."""

    before: dict[int, float]
    """The slowdowns of the DNN jobs on its sockets at the first step, raised to the worst
    seen since (the first step comes while the smoothed rate still half-shows the onset)."""
    quiet_ticks: int = 0
    """Ticks since the last step taken for it."""
    judged: bool = False
    priced: bool = False
    """Its price test (``gpu_worth_cores``) was taken after its last step."""


@dataclass(slots=True)
class _BaselineProbe:
    """CPU jobs capped at their floor so one DNN job's uncontended rate can be measured."""

    victim: int
    started_s: float
    caps: dict[int, Throttle]
    rates: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Throttled:
    mba_step: int
    """Steps down the MBA ladder (0 = no cap; len(mba_fractions) + 1 = the floor)."""
    quota_step: int
    """Steps down the CPU-quota ladder, taken after MBA's and L3's (or alone without RDT)."""
    before_draw: float
    """What the job drew before the first step (bytes/s with MBA, cores without)."""
    last_change_s: float
    mba_pct: int | None = None
    quota_cores: float | None = None
    backoff: int = 1
    released_s: float | None = None
    """When the last release step was taken."""
    quiet_since_s: float | None = None
    """Since when the job has stayed quiet (None: it draws)."""
    for_job: int | None = None
    l3_step: int = 0
    """Steps down the L3-ways ladder (CAT), taken after MBA's floor, before quota."""
    l3_ways: int | None = None
    test_victim: int | None = None
    """Attribution under way: the DNN job the first step was taken for..."""
    test_slowdown: float = 0.0
    """... its slowdown then ..."""
    test_ticks: int = 0
    """... and the ticks since."""
    unproven: bool = False
    """At its floor it showed no effect while the DNN job stayed slowed (a saturated memory
    bus hides any one job's share): judged again when it is released."""
    return_slowdown: float | None = None
    """Released as unproven: the DNN job's slowdown just before, and ..."""
    return_cores: float = 0.0
    """... the cores given back."""

    @property
    def level(self) -> int:
        """Steps taken on all three ladders (each step count is >= 0: level > 0 when any
        is non-zero, which the hot loops test directly)."""
        return self.mba_step + self.l3_step + self.quota_step

    @property
    def mechanism(self) -> str:
        """``mba``, ``l3``, ``quota`` or their combination in ladder order
        (``mba+l3+quota``); ``quota`` when nothing is applied."""
        used = [
            name
            for name, step in (
                ("mba", self.mba_step),
                ("l3", self.l3_step),
                ("quota", self.quota_step),
            )
            if step
        ]
        return "+".join(used) or "quota"


_throttled_fields = operator.attrgetter(*_Throttled.__slots__)
"""All of a :class:`_Throttled`'s fields, as a tuple (for :meth:`Eliminator.state_key`)."""


@dataclass(slots=True)
class ContentionOutput:
    throttles: dict[int, Throttle] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class Eliminator:
    def __init__(
        self,
        params: ContentionParams | None = None,
        *,
        mba: bool = False,
        quota: bool = True,
        l3_ways: int | None = None,
        l3_min_ways: int = 1,
    ) -> None:
        self.params = params or ContentionParams()
        self.mba = mba
        """Whether memory-bandwidth allocation can be applied on this node."""
        self.quota = quota
        """Whether CPU quota can be applied (after MBA's and L3's floors, or alone)."""
        self.l3_ways = l3_ways
        """The ways of the L3 cache when CAT can be applied here (cbm_mask's bits); None:
        no cache allocation."""
        self.l3_min_ways = l3_min_ways
        """The fewest ways a CAT mask may have here (info/L3/min_cbm_bits)."""
        self.victims: dict[int, _Victim] = {}
        self.throttled: dict[int, _Throttled] = {}
        self._unresolved: dict[int, float] = {}
        self.probe: _BaselineProbe | None = None
        """The baseline probe under way on this node, if any."""
        self.innocent: dict[int, float] = {}
        """CPU jobs whose first step did not speed up the DNN job it was for: since when."""
        self.holds: dict[int, _Hold] = {}
        """Per DNN job shielded now: its hold, until judged (``min_gain_per_hold``)."""
        self.unshielded: dict[int, float] = {}
        """DNN jobs whose hold bought too little: since when (not shielded for
        ``retest_s``)."""
        self._given: dict[int, tuple[tuple[object, ...], Throttle]] = {}
        """Per throttled CPU job: the throttle a step last gave out and what it was built
        from (its limits and the DNN job it shields), to give out again while unchanged."""

    # -- the view ---------------------------------------------------------------
    def dnn_status(self, job_id: int) -> dict[str, object] | None:
        v = self.victims.get(job_id)
        if v is None:
            return None
        base = self._baseline(v)
        return {
            "baseline": base,
            "baseline_ticks": len(v.baseline),
            "slowdown": v.slowdown,
        }

    def adopt_baseline(self, job_id: int, baseline: float, ticks: int) -> bool:
        """Take a baseline a previous run of the daemon measured (its state file's view), so
        a restart does not leave the job unshielded until it is measured again. Counts as
        at most ``baseline_min_ticks`` ticks, so this run's own quiet ticks soon outweigh
        it. False (nothing taken) for a job this run already knows or a value not usable."""
        p = self.params
        if job_id in self.victims or not baseline > 0 or ticks < p.baseline_min_ticks:
            return False
        v = self.victims[job_id] = _Victim(
            rates=deque(maxlen=p.smooth_ticks), baseline=deque(maxlen=p.baseline_ticks)
        )
        v.baseline.extend([baseline] * p.baseline_min_ticks)
        return True

    def probing_baseline_of(self) -> int | None:
        """The DNN job whose baseline is being measured now, if any."""
        return None if self.probe is None else self.probe.victim

    def cpu_status(self, job_id: int) -> dict[str, object] | None:
        t = self.throttled.get(job_id)
        if t is None:
            return None
        return {
            "mechanism": t.mechanism,
            "level": t.level,
            "mem_bw_pct": t.mba_pct,
            "l3_ways": t.l3_ways,
            "l3_ways_total": self.l3_ways,
            "quota_cores": t.quota_cores,
            "for_job": t.for_job,
        }

    def _baseline(self, v: _Victim) -> float | None:
        if len(v.baseline) < self.params.baseline_min_ticks:
            return None
        return statistics.median(v.baseline)

    # -- replaying it faster: its state and its clock ----------------------------------
    def state_key(self) -> tuple[object, ...]:
        """Everything a step reads of this eliminator's own state, as one comparable value
        (a hold's tick count only up to where it stops mattering). Two steps with the same
        inputs from states with equal keys act alike until :meth:`next_deadline_s`: a
        replay (the simulator's) may skip the ticks in between."""
        hold_ticks = self.params.smooth_ticks + 1
        # tuple([...]) rather than tuple(generator): the same value, built faster.
        victims = tuple(
            [
                (
                    j,
                    tuple(v.rates),
                    tuple(v.baseline),
                    v.slowdown,
                    v.contended_since_s,
                    v.last_probe_s,
                    v.floor_since_s,
                    tuple(v.floor_rates),
                )
                for j, v in sorted(self.victims.items())
            ]
        )
        throttled = tuple([(j, *_throttled_fields(t)) for j, t in sorted(self.throttled.items())])
        probe = self.probe
        return (
            victims,
            throttled,
            tuple(sorted(self._unresolved.items())),
            None
            if probe is None
            else (probe.victim, probe.started_s, tuple(sorted(probe.caps)), tuple(probe.rates)),
            tuple(sorted(self.innocent.items())),
            tuple(
                [
                    (
                        j,
                        tuple(sorted(h.before.items())),
                        min(h.quiet_ticks, hold_ticks),
                        h.judged,
                        h.priced,
                    )
                    for j, h in sorted(self.holds.items())
                ]
            ),
            tuple(sorted(self.unshielded.items())),
        )

    def next_deadline_s(self, now_s: float) -> float:
        """The earliest moment after ``now_s`` at which one of this eliminator's waits may
        end and change what a step does (a step's, a release's, a retest's, a baseline
        probe's); inf: none pending. Each timestamp it keeps, paired with every wait it is
        compared against."""
        p = self.params
        ends: list[float] = [s + p.release_hold_s for s in self._unresolved.values()]
        ends += (s + p.retest_s for s in self.innocent.values())
        ends += (s + p.retest_s for s in self.unshielded.values())
        for v in self.victims.values():
            if v.contended_since_s is not None:
                ends.append(v.contended_since_s + p.baseline_probe_after_s)
            if v.last_probe_s is not None:
                ends.append(v.last_probe_s + p.baseline_probe_every_s)
            if v.floor_since_s is not None:
                ends += (v.floor_since_s + p.step_s, v.floor_since_s + p.baseline_reset_s)
        for t in self.throttled.values():
            if t.level == 0:
                continue  # its release time matters only to a step that throttles it again
            last = t.last_change_s
            ends += (last + p.step_s, last + p.release_hold_s, last + p.release_hold_s * t.backoff)
            if t.quiet_since_s is not None:
                ends.append(t.quiet_since_s + p.release_hold_s)
        if self.probe is not None:
            started = self.probe.started_s
            ends += (started + p.step_s, started + p.baseline_probe_max_s)
        # A wait that ends within a hair of ``now_s`` may or may not have shown yet.
        after = now_s - CLOCK_SLACK_S
        return min((e for e in ends if e > after), default=math.inf)

    # -- one tick -----------------------------------------------------------------
    def step(
        self, now_s: float, dnn: Mapping[int, DnnJob], cpu: Mapping[int, CpuJob]
    ) -> ContentionOutput:
        p = self.params
        out = ContentionOutput()
        for kept, live in (
            (self.victims, dnn),
            (self.throttled, cpu),
            (self.innocent, cpu),
            (self.holds, dnn),
            (self.unshielded, dnn),
            (self._given, cpu),
        ):
            if kept and not kept.keys() <= live.keys():
                for gone in kept.keys() - live.keys():
                    del kept[gone]
        if not p.enabled:
            self.throttled.clear()
            self.probe = None
            return out
        self._probe_tick(now_s, dnn, cpu, out)
        # The contenders: jobs that use ``contender_mem_bw_bytes_per_s`` of memory bandwidth
        # or ``contender_cpu_fraction`` of their allocated cores.
        bw_min_bytes_per_s, cpu_fraction = p.contender_mem_bw_bytes_per_s, p.contender_cpu_fraction
        drawing: dict[int, CpuJob] = {}
        for j, c in cpu.items():
            bw, rate = c.mem_bw_bytes_per_s, c.cpu_rate_cores
            if (bw is not None and bw >= bw_min_bytes_per_s) or (
                rate is not None and rate >= cpu_fraction * max(1, c.allocated_cores)
            ):
                drawing[j] = c
        held_sockets: set[int] = set()
        for j, t in self.throttled.items():
            if t.mba_step or t.l3_step or t.quota_step:  # level > 0
                c = cpu[j]  # the clean-up above left only jobs still running
                held_sockets.update(c.sockets)
                # A capped job that still uses its cap draws, however small the cap.
                if not self._quiet(c, t):
                    drawing[j] = c
        hot_sockets = {s for c in drawing.values() for s in c.sockets}
        victims: list[tuple[float, DnnJob]] = []
        measured = None if self.probe is None else self.probe.victim
        min_ticks = p.baseline_min_ticks
        for job_id, job in sorted(dnn.items()):
            v = self.victims.get(job_id)
            if v is None:
                v = self.victims[job_id] = _Victim(
                    rates=deque(maxlen=p.smooth_ticks), baseline=deque(maxlen=p.baseline_ticks)
                )
            v.slowdown = None
            prog = job.progress
            if not prog.training or job.probing:
                v.rates.clear()
                continue
            assert prog.rate is not None
            v.rates.append(prog.rate)
            if job_id == measured:
                continue  # its rate is being measured (see _probe_tick)
            quiet = not (job.sockets & hot_sockets) and not (job.sockets & held_sockets)
            if quiet:
                v.baseline.append(prog.rate)
            base = statistics.median(v.baseline) if len(v.baseline) >= min_ticks else None
            if base is None or base <= 0:
                if base is None and not quiet:
                    self._maybe_start_probe(now_s, job, v, drawing, out)
                else:
                    v.contended_since_s = None
                continue
            v.contended_since_s = None
            v.slowdown = 1.0 - (sum(v.rates) / len(v.rates)) / base
            if v.slowdown > p.trigger_slowdown:
                victims.append((v.slowdown, job))
        stepped: set[int] = set()
        slowed = {job.job_id for _, job in victims}
        for job_id, v in self.victims.items():
            if job_id not in slowed:
                v.floor_since_s = None
                v.floor_rates.clear()
        if p.min_effect_per_core > 0:
            self._judge_return(now_s, cpu, out)
            self._attribute(now_s, cpu, stepped, out)
        judging = p.min_gain_per_hold > 0 or p.gpu_worth_cores > 0
        exhausted_for: set[int] = set()
        if len(victims) > 1:
            victims.sort(key=lambda x: (-x[0], x[1].job_id))
        for slowdown, job in victims:
            if judging and self._unshielded(now_s, job.job_id):
                continue
            before = len(stepped)
            exhausted = self._protect(now_s, job, slowdown, drawing, stepped, out)
            if exhausted:
                exhausted_for.add(job.job_id)
            if judging and len(stepped) > before:
                hold = self.holds.get(job.job_id)
                if hold is None:
                    hold = self.holds[job.job_id] = _Hold(self._near_slowdowns(job, dnn))
                hold.quiet_ticks = 0
                hold.priced = False
            self._check_stale_baseline(now_s, job, exhausted, out)
        if judging:
            self._judge_holds(now_s, dnn, cpu, exhausted_for, out)
        self._verify(now_s, cpu, stepped, out)
        self._release(now_s, dnn, cpu, stepped, out)
        throttles, given = out.throttles, self._given
        for job_id, t in self.throttled.items():
            if t.mba_step or t.l3_step or t.quota_step:  # level > 0
                limits = (t.quota_cores, t.mba_pct, t.l3_ways, t.for_job)
                last = given.get(job_id)
                if last is None or last[0] != limits:
                    last = given[job_id] = (
                        limits,
                        Throttle(
                            quota_cores=t.quota_cores,
                            mem_bw_pct=t.mba_pct,
                            reason=f"contention: shielding job {t.for_job}",
                            l3_ways=t.l3_ways,
                        ),
                    )
                throttles[job_id] = last[1]
        if self.probe is not None:
            for job_id, cap in self.probe.caps.items():
                if job_id in cpu:
                    out.throttles[job_id] = _tighter(out.throttles.get(job_id), cap)
        return out

    # -- what a hold buys: its benefit test --------------------------------------
    def _near_slowdowns(self, job: DnnJob, dnn: Mapping[int, DnnJob]) -> dict[int, float]:
        """The slowdowns of the DNN jobs on ``job``'s sockets (itself included)."""
        out = {}
        for d in dnn.values():
            v = self.victims.get(d.job_id)
            if d.sockets & job.sockets and v is not None and v.slowdown is not None:
                out[d.job_id] = max(0.0, v.slowdown)
        return out

    def _unshielded(self, now_s: float, job_id: int) -> bool:
        since = self.unshielded.get(job_id)
        if since is None:
            return False
        if now_s - since < self.params.retest_s:
            return True
        del self.unshielded[job_id]
        return False

    def _judge_holds(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        exhausted_for: set[int],
        out: ContentionOutput,
    ) -> None:
        """Judge each hold once it has shown (see the module docstring): give it back
        whole if it bought less than ``min_gain_per_hold`` per CPU job held back."""
        p = self.params
        for victim, hold in sorted(self.holds.items()):
            held = {j: t for j, t in self.throttled.items() if t.for_job == victim and t.level > 0}
            if not held:
                del self.holds[victim]
                continue
            if hold.judged and (hold.priced or p.gpu_worth_cores <= 0):
                continue
            hold.quiet_ticks += 1
            now = self._near_slowdowns(dnn[victim], dnn)
            for d, b in hold.before.items():
                hold.before[d] = max(b, now.get(d, b))
            v = self.victims.get(victim)
            if v is None or v.slowdown is None or hold.quiet_ticks <= p.smooth_ticks:
                continue
            if v.slowdown > p.trigger_slowdown and victim not in exhausted_for:
                continue
            first = not hold.judged
            hold.judged = hold.priced = True
            gain = sum(b - now[d] for d, b in hold.before.items() if d in now)
            kept = {
                j: throttle_share(self._throttle(t), cpu[j].allocated_cores)
                for j, t in held.items()
            }
            cost = sum(1.0 - q for q in kept.values())
            why = None
            if first and cost > 0 and gain / cost < p.min_gain_per_hold:
                why = (
                    f"holding back {cost:.3g} CPU job(s) took only {gain:.1%} off the slowdown "
                    f"of job {victim} and its neighbours; not shielded for {p.retest_s:g} s"
                )
            elif p.gpu_worth_cores > 0:
                gpu_gain = sum(
                    dnn[d].gpus * (b - now[d]) for d, b in hold.before.items() if d in now
                )
                core_cost = sum(cpu[j].allocated_cores * (1.0 - q) for j, q in kept.items())
                if core_cost > gpu_gain * p.gpu_worth_cores:
                    why = (
                        f"holding back {core_cost:.3g} cores gave back only {gpu_gain:.3g} "
                        f"GPUs to job {victim} and its neighbours (worth "
                        f"{gpu_gain * p.gpu_worth_cores:.3g} cores); not shielded for "
                        f"{p.retest_s:g} s"
                    )
            if why is None:
                continue
            self.unshielded[victim] = now_s
            del self.holds[victim]
            for j, t in sorted(held.items()):
                self._release_all(now_s, j, t, why, out)

    # -- who pays: attribution ---------------------------------------------
    def _attribute(
        self, now_s: float, cpu: Mapping[int, CpuJob], stepped: set[int], out: ContentionOutput
    ) -> None:
        """Judge each throttled job by its effect. The test starts at its first step and ends
        when the DNN job it was for is back under the trigger (it helped), or when the job
        has been at its floor for ``smooth_ticks`` ticks: then the DNN job must be less
        slowed by ``min_effect_per_core`` per core held back, or the CPU job is released
        and left alone. Judged at the floor, not after one step: on a saturated memory bus
        one step of the job that fills it shows nothing yet."""
        p = self.params
        # Each job is judged on its own (no event, nothing shared): in any order.
        for job_id, t in self.throttled.items():
            if t.test_victim is None or not (t.mba_step or t.l3_step or t.quota_step):
                t.test_victim = None
                continue
            victim, before = t.test_victim, t.test_slowdown
            v = self.victims.get(victim)
            if v is None or v.slowdown is None or before <= 0:
                t.test_victim = None  # nothing to judge by (it ended or stopped training)
                continue
            if v.slowdown <= p.trigger_slowdown:
                t.test_victim = None  # it helped
                continue
            c = cpu[job_id]
            if not self._at_floor(t, c):
                t.test_ticks = 0
                continue
            t.test_ticks += 1
            if t.test_ticks < p.smooth_ticks:
                continue
            t.test_victim = None
            kept = throttle_share(self._throttle(t), c.allocated_cores)
            held_cores = c.allocated_cores * (1.0 - kept)
            if held_cores <= 0:
                continue
            effect = (before - v.slowdown) / before / held_cores
            t.unproven = effect < p.min_effect_per_core

    def _judge_return(self, now_s: float, cpu: Mapping[int, CpuJob], out: ContentionOutput) -> None:
        """An unproven job released whole: if the DNN job it was held for got slower by
        less than ``min_effect_per_core`` of the trigger per core given back, it is not
        what slows it and is left alone for ``retest_s``."""
        p = self.params
        returned = [(j, t) for j, t in self.throttled.items() if t.return_slowdown is not None]
        for job_id, t in sorted(returned):
            assert t.return_slowdown is not None
            t.test_ticks += 1
            if t.test_ticks < p.smooth_ticks:
                continue
            before, t.return_slowdown = t.return_slowdown, None
            v = self.victims.get(t.for_job) if t.for_job is not None else None
            if v is None or v.slowdown is None or t.return_cores <= 0:
                continue
            effect = (v.slowdown - before) / p.trigger_slowdown / t.return_cores
            if effect >= p.min_effect_per_core:
                continue  # it does slow it: the ladder takes it again if needed
            self.innocent[job_id] = now_s
            out.events.append(
                Event(
                    job_id,
                    "innocent",
                    f"giving back {t.return_cores:.3g} cores moved job {t.for_job} only "
                    f"from {before:.0%} to {v.slowdown:.0%} below its baseline: not what "
                    f"slows it; not throttled for {p.retest_s:g} s",
                    {"victim": t.for_job, "before": round(before, 4)},
                )
            )

    def _at_floor(self, t: _Throttled, c: CpuJob) -> bool:
        """Nothing left to step on this job's ladder."""
        p = self.params
        if self.quota:
            floor_cores = max(0.1, p.floor_fraction * c.allocated_cores)
            return t.quota_cores is not None and t.quota_cores <= floor_cores + 1e-9
        return t.mba_pct is not None and t.mba_pct <= p.floor_mba_pct

    def _release_all(
        self, now_s: float, job_id: int, t: _Throttled, why: str, out: ContentionOutput
    ) -> None:
        victim = t.for_job
        t.mba_step = t.l3_step = t.quota_step = 0
        t.mba_pct = t.l3_ways = None
        t.quota_cores = None
        t.test_victim = None
        t.last_change_s = now_s
        t.released_s = now_s
        out.events.append(Event(job_id, "release", f"released: {why}", {"victim": victim}))

    @staticmethod
    def _throttle(t: _Throttled) -> Throttle:
        return Throttle(quota_cores=t.quota_cores, mem_bw_pct=t.mba_pct, l3_ways=t.l3_ways)

    # -- the baseline probe ----------------------------------------------------------
    def _maybe_start_probe(
        self,
        now_s: float,
        job: DnnJob,
        v: _Victim,
        drawing: Mapping[int, CpuJob],
        out: ContentionOutput,
    ) -> None:
        p = self.params
        if p.baseline_probe_after_s <= 0:
            return
        if v.contended_since_s is None:
            v.contended_since_s = now_s
        if self.probe is not None or now_s - v.contended_since_s < p.baseline_probe_after_s:
            return
        if v.last_probe_s is not None and now_s - v.last_probe_s < p.baseline_probe_every_s:
            return
        near = sorted(
            (c for c in drawing.values() if c.sockets & job.sockets), key=lambda c: c.job_id
        )
        caps = {c.job_id: self._floor_cap(c, job.job_id) for c in near}
        caps = {j: cap for j, cap in caps.items() if cap is not None}
        if not caps:
            return
        v.last_probe_s = now_s
        self.probe = _BaselineProbe(job.job_id, now_s, caps)
        out.events.append(
            Event(
                job.job_id,
                "baseline-probe",
                f"no uncontended baseline after {now_s - v.contended_since_s:.0f} s beside "
                f"CPU job(s) {', '.join(str(j) for j in caps)}: capping them at their floor "
                f"for up to {p.baseline_probe_max_s:g} s to measure one",
                {"cpu_jobs": sorted(caps)},
            )
        )

    def _floor_cap(self, c: CpuJob, victim: int) -> Throttle | None:
        p = self.params
        reason = f"contention: measuring job {victim}'s baseline"
        if self.quota:
            floor_cores = round(max(0.1, p.floor_fraction * c.allocated_cores), 2)
            return Throttle(quota_cores=floor_cores, reason=reason)
        if self.mba and c.mem_bw_bytes_per_s is not None:
            return Throttle(mem_bw_pct=p.floor_mba_pct, reason=reason)
        return None

    def _probe_tick(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        out: ContentionOutput,
    ) -> None:
        """Measure the victim of the probe under way, and end the probe when done."""
        probe = self.probe
        if probe is None:
            return
        p = self.params
        job = dnn.get(probe.victim)
        v = self.victims.get(probe.victim)
        training = (
            job is not None
            and v is not None
            and job.progress.training
            and not job.probing
            and job.progress.rate is not None
        )
        if training and now_s - probe.started_s >= p.step_s:
            assert job is not None and job.progress.rate is not None
            probe.rates.append(job.progress.rate)
        done = len(probe.rates) >= p.baseline_min_ticks
        if not (done or not training or now_s - probe.started_s >= p.baseline_probe_max_s):
            return
        self.probe = None
        if done and v is not None:
            v.baseline.extend(probe.rates)
            v.contended_since_s = None
            base = statistics.median(probe.rates)
            what = f"baseline {base:.4g} measured over {len(probe.rates)} ticks"
        elif not training:
            what = "the job stopped training; no baseline"
        else:
            what = f"only {len(probe.rates)} tick(s) measured in {p.baseline_probe_max_s:g} s"
        out.events.append(
            Event(
                probe.victim,
                "baseline-probe-end",
                f"{what}; caps on CPU job(s) {', '.join(str(j) for j in probe.caps)} lifted",
                {"rates": [round(r, 4) for r in probe.rates]},
            )
        )

    def _quiet(self, c: CpuJob, t: _Throttled) -> bool:
        """A throttled job that uses less than half of what it may (its cap, or what makes
        a job a contender): it has stopped drawing, whatever its cap."""
        if c.cpu_rate_cores is None:
            return False
        may = self.params.contender_cpu_fraction * max(1, c.allocated_cores)
        if t.quota_cores is not None:
            may = min(may, t.quota_cores)
        return c.cpu_rate_cores < 0.5 * may

    def _draw_of(self, c: CpuJob, mechanism: str) -> float:
        if mechanism == "mba":
            return c.mem_bw_bytes_per_s or 0.0
        return c.cpu_rate_cores or 0.0

    def _protect(
        self,
        now_s: float,
        job: DnnJob,
        slowdown: float,
        drawing: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> bool:
        """Step the contender that draws most; True when every contender near the job is
        already at its floor (nothing left to take)."""
        p = self.params
        near = [c for c in drawing.values() if c.sockets & job.sockets]
        if not near:
            last = self._unresolved.get(job.job_id)
            if last is None or now_s - last >= p.release_hold_s:
                self._unresolved[job.job_id] = now_s
                out.events.append(
                    Event(
                        job.job_id,
                        "contention-unexplained",
                        f"rate {slowdown:.0%} below its baseline, but no CPU job draws on "
                        f"socket(s) {sorted(job.sockets)}",
                        {"slowdown": round(slowdown, 3)},
                    )
                )
            return False
        # One suspect at a time: while a job's effect is being judged for this DNN job, it
        # alone is stepped, so no other job's step is credited to it.
        throttled = self.throttled
        suspect = [
            c
            for c in near
            if (t := throttled.get(c.job_id)) is not None
            and t.test_victim == job.job_id
            and t.level > 0
        ]
        if suspect:
            near = suspect
        by_bw = all(c.mem_bw_bytes_per_s is not None for c in near)
        near.sort(
            key=lambda c: (
                -(c.mem_bw_bytes_per_s or 0.0) if by_bw else -(c.cpu_rate_cores or 0.0),
                c.job_id,
            )
        )
        for c in near:
            if self._exempt(now_s, c.job_id):
                continue
            if c.job_id in stepped:
                return False  # one step per tick for a job; let it show
            t = self.throttled.get(c.job_id)
            if t is not None and t.level > 0 and now_s - t.last_change_s < p.step_s:
                return False
            if t is not None and t.test_victim is not None and self._at_floor(t, c):
                return False  # being judged at its floor: step no other job meanwhile
            if self._step_down(now_s, c, job, slowdown, out):
                stepped.add(c.job_id)
                return False
        return True  # every contender is at its floor: nothing more to take

    def _exempt(self, now_s: float, job_id: int) -> bool:
        """Not to be stepped now: found not to slow anyone lately, or being judged."""
        t = self.throttled.get(job_id)
        if t is not None and t.return_slowdown is not None:
            return True
        since = self.innocent.get(job_id)
        if since is not None:
            if now_s - since < self.params.retest_s:
                return True
            del self.innocent[job_id]
        return False

    def _check_stale_baseline(
        self, now_s: float, job: DnnJob, exhausted: bool, out: ContentionOutput
    ) -> None:
        """A job that stays slowed with every CPU job beside it at its floor is not slowed
        by them: its own speed changed (a new phase, a longer sequence length, a slower
        input pipeline), and its old baseline would hold the CPU jobs at their floor for
        as long as it runs. Its rate at the floor is the best it gets here, so that becomes
        its baseline; the usual release follows, and a throttle again only if the CPU jobs
        then slow it below *that*."""
        p = self.params
        v = self.victims[job.job_id]
        if not exhausted or p.baseline_reset_s <= 0:
            v.floor_since_s = None
            v.floor_rates.clear()
            return
        if v.floor_since_s is None:
            v.floor_since_s = now_s
            v.floor_rates.clear()
        if now_s - v.floor_since_s < p.step_s or not v.rates:
            return  # the last step has not shown yet
        v.floor_rates.append(v.rates[-1])
        if (
            now_s - v.floor_since_s < p.baseline_reset_s
            or len(v.floor_rates) < p.baseline_min_ticks
        ):
            return
        old = self._baseline(v)
        new = statistics.median(v.floor_rates)
        v.baseline.clear()
        v.baseline.extend(v.floor_rates[-p.baseline_ticks :])
        held = now_s - v.floor_since_s
        v.floor_since_s = None
        v.floor_rates.clear()
        out.events.append(
            Event(
                job.job_id,
                "baseline-reset",
                f"still {1.0 - new / old:.0%} below its baseline {old:.4g} after {held:.0f} s "
                f"with every CPU job beside it at its floor: not their doing; its rate there, "
                f"{new:.4g}, is its baseline from now on (the CPU jobs are released step by "
                "step)"
                if old
                else f"baseline {new:.4g} measured with every CPU job beside it at its floor",
                {"old_baseline": old, "new_baseline": new, "held_s": round(held, 1)},
            )
        )

    def _step_down(
        self, now_s: float, c: CpuJob, victim: DnnJob, slowdown: float, out: ContentionOutput
    ) -> bool:
        """One step down the job's ladder: MBA (where RDT and per-job bandwidth are
        there) to its floor, then L3 ways (where CAT is there) to their floor, then CPU
        quota to its floor. False when nothing is left."""
        p = self.params
        t = self.throttled.get(c.job_id)
        use_mba = self.mba and c.mem_bw_bytes_per_s is not None
        if t is None or t.level == 0:
            t = _Throttled(
                mba_step=0,
                quota_step=0,
                before_draw=self._draw_of(c, "mba" if use_mba else "quota"),
                last_change_s=now_s,
                backoff=t.backoff if t is not None else 1,
                released_s=t.released_s if t is not None else None,
            )
            if (
                t.released_s is not None
                and now_s - t.released_s >= 4 * p.release_hold_s * t.backoff
            ):
                t.backoff = 1  # quiet for long after the last release: start afresh
            self.throttled[c.job_id] = t
        if t.released_s is not None and now_s - t.released_s < p.release_hold_s * t.backoff:
            # Throttled again soon after a release: the release was premature. Wait longer
            # before the next one (damps throttle/release oscillation).
            t.backoff = min(p.max_backoff, t.backoff * 2)
        t.for_job = victim.job_id
        if p.min_effect_per_core > 0 and t.level == 0:
            t.test_victim, t.test_slowdown, t.test_ticks = victim.job_id, slowdown, 0
        floor_cores = max(0.1, p.floor_fraction * c.allocated_cores)
        if (
            use_mba
            and t.quota_step == 0
            and t.l3_step == 0
            and (t.mba_pct is None or t.mba_pct > p.floor_mba_pct)
        ):
            t.mba_step += 1
            pct = self._mba_at(t.mba_step)
            if t.mba_pct is not None:
                pct = min(pct, t.mba_pct - p.mba_correction_pct)
            t.mba_pct = max(p.floor_mba_pct, pct)
            what = f"memory bandwidth capped at MB {t.mba_pct}%"
        elif (
            self.l3_ways is not None
            and t.quota_step == 0
            and (t.l3_ways or self.l3_ways) > self._l3_floor()
        ):
            t.l3_step += 1
            # Each step takes at least one way (a small cache rounds two fractions alike).
            ways = min(self._l3_at(t.l3_step), (t.l3_ways or self.l3_ways) - 1)
            t.l3_ways = max(self._l3_floor(), ways)
            what = f"L3 limited to {t.l3_ways} of {self.l3_ways} ways"
            if t.mba_step:
                what += f" (MB {t.mba_pct}% was not enough)"
        elif self.quota and (t.quota_cores is None or t.quota_cores > floor_cores + 1e-9):
            t.quota_step += 1
            quota = self._quota_at(t.quota_step, c.allocated_cores)
            if t.quota_cores is not None:
                quota = min(quota, t.quota_cores)
            t.quota_cores = quota
            what = f"CPU capped at {t.quota_cores:g} of {c.allocated_cores} cores"
            tried = []
            if t.mba_step:
                tried.append(f"MB {t.mba_pct}%")
            if t.l3_step:
                tried.append(f"L3 {t.l3_ways} of {self.l3_ways} ways")
            if tried:
                what += (
                    f" ({' and '.join(tried)} {'was' if len(tried) == 1 else 'were'} not enough)"
                )
        else:
            return False
        t.last_change_s = now_s
        reading: dict[str, object] = {
            "victim": victim.job_id,
            "slowdown": round(slowdown, 3),
            "level": t.level,
            "cpu_rate_cores": c.cpu_rate_cores,
            "mem_bw_bytes_per_s": c.mem_bw_bytes_per_s,
        }
        if self.l3_ways is not None:
            reading["l3_ways"] = t.l3_ways
        out.events.append(
            Event(
                c.job_id,
                "throttle",
                f"{what}: job {victim.job_id} runs {slowdown:.0%} below its baseline "
                f"(trigger {p.trigger_slowdown:.0%}) while this job draws " + _draw_text(c),
                reading,
            )
        )
        return True

    def _l3_floor(self) -> int:
        """The fewest ways the ladder goes to: ``floor_l3_ways``, at least the hardware's
        minimum, at most the whole cache (then CAT has no step to take)."""
        assert self.l3_ways is not None
        return min(self.l3_ways, max(self.params.floor_l3_ways, self.l3_min_ways))

    def _l3_at(self, step: int) -> int:
        """The ways of ``step`` on the L3 ladder (step >= 1)."""
        assert self.l3_ways is not None
        p = self.params
        if step <= len(p.l3_way_fractions):
            return max(self._l3_floor(), round(self.l3_ways * p.l3_way_fractions[step - 1]))
        return self._l3_floor()

    def _mba_at(self, step: int) -> int:
        """The MB value of ``step`` on the MBA ladder (None-free: step >= 1)."""
        p = self.params
        if step <= len(p.mba_fractions):
            return max(p.floor_mba_pct, round(100 * p.mba_fractions[step - 1]))
        return p.floor_mba_pct

    def _quota_at(self, step: int, allocated_cores: int) -> float:
        p = self.params
        floor_cores = max(0.1, p.floor_fraction * allocated_cores)
        if step <= len(p.quota_fractions):
            return round(max(floor_cores, p.quota_fractions[step - 1] * allocated_cores), 2)
        return round(floor_cores, 2)

    def _verify(
        self, now_s: float, cpu: Mapping[int, CpuJob], stepped: set[int], out: ContentionOutput
    ) -> None:
        """MBA: lower the cap while the measured bandwidth overshoots the aim."""
        p = self.params
        for job_id, t in self.throttled.items():
            if t.mba_step == 0 or t.l3_step or t.quota_step or job_id in stepped:
                continue
            if now_s - t.last_change_s < p.step_s or t.mba_pct is None:
                continue
            bw = cpu[job_id].mem_bw_bytes_per_s
            if bw is None or t.before_draw <= 0:
                continue
            aim = t.before_draw * self._mba_at(t.mba_step) / 100.0
            if bw <= p.overshoot * aim or t.mba_pct <= p.floor_mba_pct:
                continue
            old = t.mba_pct
            t.mba_pct = max(p.floor_mba_pct, old - p.mba_correction_pct)
            t.last_change_s = now_s
            stepped.add(job_id)
            out.events.append(
                Event(
                    job_id,
                    "throttle-correct",
                    f"MB {old}% still lets it draw {bw / 1e9:.2f} GB/s, over "
                    f"{p.overshoot:g}x the aim of {aim / 1e9:.2f} GB/s; MB lowered to "
                    f"{t.mba_pct}%",
                    {
                        "victim": t.for_job,
                        "mem_bw_bytes_per_s": bw,
                        "aim_bytes_per_s": aim,
                        "mb_pct": t.mba_pct,
                    },
                )
            )

    def _release(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> None:
        # Unproven jobs go first, whole and one at a time, so that the judgement of each
        # (_judge_return) sees its effect alone.
        returning = unproven = False
        for t in self.throttled.values():
            returning = returning or t.return_slowdown is not None
            unproven = unproven or (t.unproven and t.level > 0)
        if returning:
            return  # one job given back at a time: no release until it is judged
        for job_id, t in sorted(self.throttled.items()):
            if (
                not (t.mba_step or t.l3_step or t.quota_step)  # level 0
                or job_id in stepped
                or returning
                or (unproven and not t.unproven)
            ):
                continue
            c = cpu[job_id]
            hold = self._release_hold(now_s, t, c, dnn)
            if hold is None:
                continue
            hold_s, quiet = hold
            if now_s - t.last_change_s < hold_s:
                continue
            if t.unproven:
                self._give_back_unproven(now_s, job_id, t, c, out)
                returning = True
                continue
            self._release_step(now_s, job_id, t, c, hold_s, quiet, out)

    def _release_hold(
        self, now_s: float, t: _Throttled, c: CpuJob, dnn: Mapping[int, DnnJob]
    ) -> tuple[float, bool] | None:
        """How long ``t`` must have stayed unchanged before its next release step, and
        whether that is because the job went quiet; None while a DNN job beside it still
        needs it held back."""
        p = self.params
        if not self._quiet(c, t):
            t.quiet_since_s = None
        elif t.quiet_since_s is None:
            t.quiet_since_s = now_s
        if t.quiet_since_s is not None and now_s - t.quiet_since_s >= p.release_hold_s:
            # The job went quiet: nothing to shield from; release at the base pace.
            return p.release_hold_s, True
        hold_s = p.release_hold_s * t.backoff
        # An unproven job is given back as soon as no DNN job beside it is past the
        # trigger: it is more likely innocent than not.
        enough = p.release_slowdown
        if t.unproven:
            hold_s, enough = p.step_s, p.trigger_slowdown
        for d in dnn.values():
            v = self.victims.get(d.job_id)
            if not (d.sockets & c.sockets) or v is None or v.slowdown is None:
                continue
            if v.slowdown > enough:
                return None
        return hold_s, False

    def _give_back_unproven(
        self, now_s: float, job_id: int, t: _Throttled, c: CpuJob, out: ContentionOutput
    ) -> None:
        """Release an unproven job whole and remember the DNN job's slowdown, so the next
        ticks judge whether giving it back slowed that job (:meth:`_judge_return`)."""
        v = self.victims.get(t.for_job) if t.for_job is not None else None
        kept = throttle_share(self._throttle(t), c.allocated_cores)
        cores = c.allocated_cores * (1.0 - kept)
        self._release_all(
            now_s,
            job_id,
            t,
            "holding it back showed no effect on a DNN job still slowed; given back "
            "whole to see whether that slows it",
            out,
        )
        t.unproven = False
        if v is not None and v.slowdown is not None:
            t.return_slowdown, t.return_cores, t.test_ticks = v.slowdown, cores, 0

    def _release_step(
        self,
        now_s: float,
        job_id: int,
        t: _Throttled,
        c: CpuJob,
        hold_s: float,
        quiet: bool,
        out: ContentionOutput,
    ) -> None:
        """One step back up the ladder, in reverse: quota first, then L3 ways, then MBA."""
        p = self.params
        released = "quota" if t.quota_step else "l3" if t.l3_step else "mba"
        if released == "quota":
            t.quota_step -= 1
            t.quota_cores = (
                self._quota_at(t.quota_step, c.allocated_cores) if t.quota_step else None
            )
        elif released == "l3":
            t.l3_step -= 1
            t.l3_ways = self._l3_at(t.l3_step) if t.l3_step else None
        else:
            t.mba_step -= 1
            t.mba_pct = self._mba_at(t.mba_step) if t.mba_step else None
        t.last_change_s = now_s
        t.released_s = now_s
        why = (
            f"the job has been quiet for {hold_s:g} s"
            if quiet
            else f"no DNN job on its socket(s) is more than "
            f"{p.release_slowdown:.0%} below its baseline for {hold_s:g} s"
        )
        out.events.append(
            Event(
                job_id,
                "release" if t.level == 0 else "release-step",
                f"{self._released_what(t, released)}: {why}",
                {
                    "victim": t.for_job,
                    "level": t.level,
                    "cpu_rate_cores": c.cpu_rate_cores,
                }
                | ({"l3_ways": t.l3_ways} if self.l3_ways is not None else {}),
            )
        )

    def _released_what(self, t: _Throttled, released: str) -> str:
        """What a release step left in place, for its event."""
        if t.level == 0:
            return "released"
        if released == "l3":
            return (
                f"L3 limit raised to {t.l3_ways} of {self.l3_ways} ways"
                if t.l3_ways is not None
                else f"L3 limit lifted (all {self.l3_ways} ways)"
            )
        if t.quota_cores is not None:
            return f"CPU cap raised to {t.quota_cores:g} cores"
        if t.l3_ways is not None:
            return f"CPU cap lifted (L3 stays at {t.l3_ways} of {self.l3_ways} ways)"
        return f"memory bandwidth cap raised to MB {t.mba_pct}%"


def throttle_share(t: Throttle | None, allocated_cores: float) -> float:
    """The share of its cores (or of its bandwidth, under MBA) a throttled job keeps: what
    a job whose progress follows its cores or its bandwidth is slowed to."""
    if t is None:
        return 1.0
    share = 1.0
    if t.quota_cores is not None:
        share = min(share, t.quota_cores / max(allocated_cores, 1))
    if t.mem_bw_pct is not None:
        share = min(share, t.mem_bw_pct / 100.0)
    return share


def _tighter(a: Throttle | None, b: Throttle) -> Throttle:
    """The stricter of two throttles on one CPU job (each limit the lower one)."""
    if a is None:
        return b

    def low(x: float | None, y: float | None) -> float | None:
        return y if x is None else x if y is None else min(x, y)

    mb = low(a.mem_bw_pct, b.mem_bw_pct)
    ways = low(a.l3_ways, b.l3_ways)
    return Throttle(
        quota_cores=low(a.quota_cores, b.quota_cores),
        mem_bw_pct=None if mb is None else int(mb),
        reason=b.reason,
        l3_ways=None if ways is None else int(ways),
    )


def _draw_text(c: CpuJob) -> str:
    parts = []
    if c.mem_bw_bytes_per_s is not None:
        parts.append(f"{c.mem_bw_bytes_per_s / 1e9:.2f} GB/s")
    if c.cpu_rate_cores is not None:
        parts.append(f"{c.cpu_rate_cores:.2f} cores")
    return " and ".join(parts) or "an unknown amount"


@dataclass(frozen=True, slots=True)
class PcieUse:
    """One DNN job's PCIe traffic and the PCIe switches its GPUs hang off."""

    job_id: int
    switches: frozenset[str]
    bytes_per_s: float


PCIE_HEAVY_BYTES_PER_S = 8e9
"""CODA measured AlexNet and ResNet-50 moving 8-12 GB/s over PCIe, and 5-10 % slowdown
when two such jobs share a PCIe switch; a job at or above this rate counts as heavy."""


def pcie_pairs(
    uses: Mapping[int, PcieUse], heavy_bytes_per_s: float = PCIE_HEAVY_BYTES_PER_S
) -> list[tuple[int, int, str]]:
    """Pairs of heavy DNN jobs behind one PCIe switch: ``(job, other job, switch)``, each
    pair once, for placement (coda-node reports them; it cannot move a running job)."""
    heavy = sorted(
        (u for u in uses.values() if u.bytes_per_s >= heavy_bytes_per_s), key=lambda u: u.job_id
    )
    out = []
    for i, a in enumerate(heavy):
        for b in heavy[i + 1 :]:
            shared = sorted(a.switches & b.switches)
            if shared:
                out.append((a.job_id, b.job_id, shared[0]))
    return out
