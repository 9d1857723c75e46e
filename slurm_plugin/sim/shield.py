"""The contention eliminator on a simulated node: coda-node's own policy, ticked.

When the jobs on a node change, :func:`settle` replays what coda-node's
:class:`coda_node.policy.contention.Eliminator` would do there: tick after tick it reads the DNN
jobs' progress (slowed by the memory-bandwidth pressure the CPU jobs put on the node) and
the CPU jobs' CPU use and bandwidth (shrunk by the throttles it set), and applies its
throttles. The loop runs for ``settle_s`` simulated seconds; the steady state is the mean
over the second half (the eliminator may keep stepping a job up and down: the mean is what
the jobs get), and the first half's extra slowdown is the transient the DNN jobs pay.

Between the eliminator's actions most ticks repeat the one before: the same readings, and a
state the tick left as it found it (:meth:`~coda_node.policy.contention.Eliminator.state_key`).
Such ticks are counted, not run, until the next of the eliminator's waits ends
(:meth:`~coda_node.policy.contention.Eliminator.next_deadline_s`); the result is the same,
to the bit, as ticking every one (``every_tick=True``).

The result depends only on the node's mix of jobs, so it is memoised on that mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coda_node.policy.contention import (
    CLOCK_SLACK_S,
    ContentionParams,
    CpuJob,
    DnnJob,
    Eliminator,
    Throttle,
    throttle_share,
)
from coda_node.policy.observe import Progress

_SOCKETS = frozenset({0})


@dataclass(frozen=True, slots=True)
class NodeMix:
    """What the eliminator's outcome on one node depends on."""

    dnn: tuple[tuple[float, bool], ...]
    """Per DNN job: (slowdown at full pressure, whether it has a quiet baseline)."""
    cpu: tuple[tuple[int, float], ...]
    """Per CPU job: (cores, memory bandwidth per busy core in bytes/s)."""
    node_bw_bytes_per_s: float
    exponent: float
    rdt: bool = False
    """Per-job bandwidth (MBM) and MBA exist: the eliminator sees bandwidth and caps it."""
    dnn_gpus: tuple[int, ...] = ()
    """Per DNN job: the GPUs it trains on, on all its nodes (empty: one each)."""

    def gpus(self, i: int) -> int:
        return self.dnn_gpus[i] if self.dnn_gpus else 1


@dataclass(frozen=True, slots=True)
class Settled:
    cpu_share: tuple[float, ...]
    """Per CPU job: the share of its cores it may use (1 = not throttled), steady state."""
    dnn_slowdown: tuple[float, ...]
    """Per DNN job: its slowdown in the steady state."""
    dnn_transient_s: tuple[float, ...]
    """Per DNN job: extra slowdown × seconds before the steady state (lost work)."""
    events: int
    """Throttle/release decisions the eliminator took."""


def pressure(mix: NodeMix, shares: tuple[float, ...] | list[float]) -> float:
    drawn = sum(c * bw * q for (c, bw), q in zip(mix.cpu, shares, strict=True))
    return min(1.0, drawn / mix.node_bw_bytes_per_s)


def slowdowns(mix: NodeMix, shares: tuple[float, ...] | list[float]) -> tuple[float, ...]:
    p = pressure(mix, shares) ** mix.exponent
    return tuple(min(0.95, s * p) for s, _ in mix.dnn)


def settle(
    mix: NodeMix,
    params: ContentionParams,
    *,
    tick_s: float = 2.0,
    settle_s: float = 900.0,
    baseline_ticks: int | None = None,
    every_tick: bool = False,
) -> Settled:
    """Run the eliminator over ``mix`` (see the module docstring). Ticks in which it can only
    repeat itself are counted without being run, unless ``every_tick``: the result is the
    same either way."""
    elim = Eliminator(params, mba=mix.rdt, quota=True)
    n_dnn, n_cpu = len(mix.dnn), len(mix.cpu)
    cores = [c for c, _ in mix.cpu]
    shares = [1.0] * n_cpu
    warm = params.baseline_min_ticks if baseline_ticks is None else baseline_ticks
    now = 0.0

    def progress(rate: float | None, phase: str) -> Progress:
        return Progress(rate=rate, source="gpu_util", phase=phase, age_s=1e6, level=rate)

    # Jobs that had a quiet period on this node before the CPU jobs came learn their
    # baseline first; the others start training with CPU jobs already drawing.
    warm_dnn = {
        i: DnnJob(
            i,
            _SOCKETS,
            progress(100.0 if has else None, "train" if has else "warmup"),
            gpus=mix.gpus(i),
        )
        for i, (_, has) in enumerate(mix.dnn)
    }
    for _ in range(warm):
        elim.step(now, warm_dnn, {})
        now += tick_s
    ticks = max(2, round(settle_s / tick_s))
    quiet_ticks = math.ceil((params.release_hold_s + params.step_s) / tick_s) + params.smooth_ticks
    # A job without a baseline gets one from a baseline probe: no steady state before it.
    pending_probe_ticks = 0
    if params.baseline_probe_after_s > 0 and not all(has for _, has in mix.dnn):
        probe_s = params.baseline_probe_after_s + params.baseline_probe_max_s
        pending_probe_ticks = math.ceil(probe_s / tick_s) + params.smooth_ticks
    half = ticks // 2
    share_sum = [0.0] * n_cpu
    slow_sum = [0.0] * n_dnn
    first_half: list[tuple[float, ...]] = []
    events = 0
    last_event = 0
    seen_shares: list[float] = []
    slow: tuple[float, ...] = ()
    dnn: dict[int, DnnJob] = {}
    cpu: dict[int, CpuJob] = {}
    # The eliminator's inputs follow the shares alone (it reads them and keeps nothing of
    # them): the DNN jobs built once per set of slowdowns (the pressure saturates: many
    # shares give the same), a CPU job only when its share changed.
    dnn_at: dict[tuple[float, ...], dict[int, DnnJob]] = {}

    def cpu_job(j: int, share: float) -> CpuJob:
        c, bw = mix.cpu[j]
        return CpuJob(
            n_dnn + j,
            _SOCKETS,
            allocated_cores=c,
            cpu_rate_cores=c * share,
            mem_bw_bytes_per_s=c * bw * share if mix.rdt else None,
        )

    fixed_key: tuple[object, ...] | None = None
    # The first tick of the steady state: ``quiet_ticks`` (times the backoff) after the last
    # throttle or release, and past a pending baseline probe.
    steady_from = max(quiet_ticks, pending_probe_ticks) + 1

    def count(first: int, end: int) -> None:
        """Add ticks ``first`` to ``end`` - 1 at the current shares, one tick at a time (the
        same sums, rounding included, whether the ticks were run or skipped)."""
        if first < half:
            first_half.extend([slow] * (min(end, half) - first))
        n = end - max(first, half)
        for sums, values in ((share_sum, shares), (slow_sum, slow)):
            for j, v in enumerate(values):
                total = sums[j]
                for _ in range(n):
                    total += v
                sums[j] = total

    k = 0
    while k < ticks:
        if k >= steady_from:
            # Nothing changed for longer than the next release could take: steady state.
            rest = ticks - max(k, half)
            for j in range(n_cpu):
                share_sum[j] += shares[j] * rest
            for i, s in enumerate(slowdowns(mix, shares)):
                slow_sum[i] += s * rest
            break
        if shares != seen_shares:
            fixed_key = None
            slow = slowdowns(mix, shares)
            got = dnn_at.get(slow)
            if got is None:
                got = dnn_at[slow] = {
                    i: DnnJob(
                        i, _SOCKETS, progress(100.0 * (1.0 - slow[i]), "train"), gpus=mix.gpus(i)
                    )
                    for i in range(n_dnn)
                }
            dnn = got
            for j, q in enumerate(shares):
                if not seen_shares or q != seen_shares[j]:
                    cpu[n_dnn + j] = cpu_job(j, q)
            seen_shares = list(shares)
        out = elim.step(now, dnn, cpu)
        if out.events:
            acted = sum(1 for e in out.events if e.action.startswith(("throttle", "release")))
            events += acted
            if acted:
                last_event = k
        throttles = out.throttles
        for j, c in enumerate(cores):
            t = throttles.get(n_dnn + j)
            shares[j] = 1.0 if t is None else _share(t, c)
        backoff = max([t.backoff for t in elim.throttled.values()], default=1)
        steady_from = max(last_event + quiet_ticks * backoff, pending_probe_ticks) + 1
        # This tick at the current shares (count(k, k + 1), spelt out: most ticks are run).
        if k < half:
            first_half.append(slow)
        else:
            for j, q in enumerate(shares):
                share_sum[j] += q
            for i, s in enumerate(slow):
                slow_sum[i] += s
        k += 1
        stepped_s = now
        now += tick_s
        if every_tick or out.events or shares != seen_shares:
            fixed_key = None
            continue
        # This step changed neither its inputs nor, if its state is the one the step before
        # left, the eliminator: the next steps repeat it until one of its waits ends. They
        # are counted, not run (the same sums, tick by tick, as running them would give).
        key = elim.state_key()
        if key != fixed_key:
            fixed_key = key
            continue
        deadline_s = elim.next_deadline_s(stepped_s) - CLOCK_SLACK_S
        first = k
        while k < min(ticks, steady_from) and now < deadline_s:
            k += 1
            now += tick_s
        count(first, k)
    n = ticks - half
    steady = tuple(s / n for s in slow_sum)
    transient = tuple(
        max(0.0, sum([s[i] - steady[i] for s in first_half]) * tick_s) for i in range(n_dnn)
    )
    return Settled(
        cpu_share=tuple(s / n for s in share_sum),
        dnn_slowdown=steady,
        dnn_transient_s=transient,
        events=events,
    )


def _share(t: Throttle | None, cores: int) -> float:
    """The share of its cores (and, memory-bound, of its bandwidth) a throttled job keeps.
    MBA caps bandwidth, not cores; modelled as that share of a memory-bound job's progress
    and draw (a compute-bound job barely notices, but also barely draws)."""
    return throttle_share(t, cores)


class Shield:
    """Memoised :func:`settle` for one simulation run."""

    def __init__(self, params: ContentionParams, *, tick_s: float = 2.0, settle_s: float = 900.0):
        self.params = params
        self.tick_s = tick_s
        self.settle_s = settle_s
        self._memo: dict[NodeMix, Settled] = {}
        self.settles = 0
        self.lookups = 0

    def __call__(self, mix: NodeMix) -> Settled:
        self.lookups += 1
        got = self._memo.get(mix)
        if got is None:
            self.settles += 1
            got = self._memo[mix] = settle(
                mix, self.params, tick_s=self.tick_s, settle_s=self.settle_s
            )
        return got
