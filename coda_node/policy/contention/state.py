"""What the eliminator keeps between ticks: per DNN job its rates and baseline, per CPU
job its place on the ladder, per shielded DNN job its hold, and the baseline probe under
way. Pure records; the classes beside this module act on them."""

from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass, field

from coda_node.policy.contention.jobs import Throttle


@dataclass(slots=True)
class Victim:
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
class Hold:
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
class BaselineProbe:
    """CPU jobs capped at their floor so one DNN job's uncontended rate can be measured."""

    victim: int
    started_s: float
    caps: dict[int, Throttle]
    rates: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Throttled:
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


throttled_fields = operator.attrgetter(*Throttled.__slots__)
"""All of a :class:`Throttled`'s fields, as a tuple (for :meth:`Eliminator.state_key`)."""
