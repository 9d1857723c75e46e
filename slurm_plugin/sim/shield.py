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
    run = _Settling(mix, params, tick_s=tick_s, settle_s=settle_s, every_tick=every_tick)
    run.warm_up(params.baseline_min_ticks if baseline_ticks is None else baseline_ticks)
    return run.run()


def _progress(rate: float | None, phase: str) -> Progress:
    return Progress(rate=rate, source="gpu_util", phase=phase, age_s=1e6, level=rate)


class _Settling:
    """One :func:`settle`: the eliminator, the shares it leaves the CPU jobs, and the sums
    over the ticks so far."""

    def __init__(
        self,
        mix: NodeMix,
        params: ContentionParams,
        *,
        tick_s: float,
        settle_s: float,
        every_tick: bool,
    ) -> None:
        self.mix = mix
        self.tick_s = tick_s
        self.every_tick = every_tick
        self.elim = Eliminator(params, mba=mix.rdt, quota=True)
        self.n_dnn, n_cpu = len(mix.dnn), len(mix.cpu)
        self.cores = [c for c, _ in mix.cpu]
        self.shares = [1.0] * n_cpu
        self.now = 0.0
        self.ticks = max(2, round(settle_s / tick_s))
        self.quiet_ticks = (
            math.ceil((params.release_hold_s + params.step_s) / tick_s) + params.smooth_ticks
        )
        # A job without a baseline gets one from a baseline probe: no steady state before it.
        self.pending_probe_ticks = 0
        if params.baseline_probe_after_s > 0 and not all(has for _, has in mix.dnn):
            probe_s = params.baseline_probe_after_s + params.baseline_probe_max_s
            self.pending_probe_ticks = math.ceil(probe_s / tick_s) + params.smooth_ticks
        self.half = self.ticks // 2
        self.share_sum = [0.0] * n_cpu
        self.slow_sum = [0.0] * self.n_dnn
        self.first_half: list[tuple[float, ...]] = []
        self.events = 0
        self.last_event = 0
        self.seen_shares: list[float] = []
        self.slow: tuple[float, ...] = ()
        self.dnn: dict[int, DnnJob] = {}
        self.cpu: dict[int, CpuJob] = {}
        # The eliminator's inputs follow the shares alone (it reads them and keeps nothing of
        # them): the DNN jobs built once per set of slowdowns (the pressure saturates: many
        # shares give the same), a CPU job only when its share changed.
        self.dnn_at: dict[tuple[float, ...], dict[int, DnnJob]] = {}
        self.fixed_key: tuple[object, ...] | None = None
        # The first tick of the steady state: ``quiet_ticks`` (times the backoff) after the
        # last throttle or release, and past a pending baseline probe.
        self.steady_from = max(self.quiet_ticks, self.pending_probe_ticks) + 1

    def warm_up(self, warm_ticks: int) -> None:
        """Jobs that had a quiet period on this node before the CPU jobs came learn their
        baseline first; the others start training with CPU jobs already drawing."""
        mix = self.mix
        warm_dnn = {
            i: DnnJob(
                i,
                _SOCKETS,
                _progress(100.0 if has else None, "train" if has else "warmup"),
                gpus=mix.gpus(i),
            )
            for i, (_, has) in enumerate(mix.dnn)
        }
        for _ in range(warm_ticks):
            self.elim.step(self.now, warm_dnn, {})
            self.now += self.tick_s

    def run(self) -> Settled:
        k = 0
        while k < self.ticks:
            if k >= self.steady_from:
                # Nothing changed for longer than the next release could take: steady state.
                rest = self.ticks - max(k, self.half)
                for j in range(len(self.shares)):
                    self.share_sum[j] += self.shares[j] * rest
                for i, s in enumerate(slowdowns(self.mix, self.shares)):
                    self.slow_sum[i] += s * rest
                break
            k = self._tick(k)
        n = self.ticks - self.half
        steady = tuple(s / n for s in self.slow_sum)
        transient = tuple(
            max(0.0, sum([s[i] - steady[i] for s in self.first_half]) * self.tick_s)
            for i in range(self.n_dnn)
        )
        return Settled(
            cpu_share=tuple(s / n for s in self.share_sum),
            dnn_slowdown=steady,
            dnn_transient_s=transient,
            events=self.events,
        )

    def _cpu_job(self, j: int, share: float) -> CpuJob:
        c, bw = self.mix.cpu[j]
        return CpuJob(
            self.n_dnn + j,
            _SOCKETS,
            allocated_cores=c,
            cpu_rate_cores=c * share,
            mem_bw_bytes_per_s=c * bw * share if self.mix.rdt else None,
        )

    def _inputs(self) -> None:
        """The eliminator's readings at the current shares, rebuilt only where they changed."""
        shares, seen = self.shares, self.seen_shares
        if shares == seen:
            return
        self.fixed_key = None
        slow = self.slow = slowdowns(self.mix, shares)
        got = self.dnn_at.get(slow)
        if got is None:
            got = self.dnn_at[slow] = {
                i: DnnJob(
                    i, _SOCKETS, _progress(100.0 * (1.0 - slow[i]), "train"), gpus=self.mix.gpus(i)
                )
                for i in range(self.n_dnn)
            }
        self.dnn = got
        for j, q in enumerate(shares):
            if not seen or q != seen[j]:
                self.cpu[self.n_dnn + j] = self._cpu_job(j, q)
        self.seen_shares = list(shares)

    def _tick(self, k: int) -> int:
        """Run tick ``k``; the next tick to run (past those counted without running)."""
        self._inputs()
        elim = self.elim
        out = elim.step(self.now, self.dnn, self.cpu)
        if out.events:
            acted = sum(1 for e in out.events if e.action.startswith(("throttle", "release")))
            self.events += acted
            if acted:
                self.last_event = k
        throttles = out.throttles
        for j, c in enumerate(self.cores):
            t = throttles.get(self.n_dnn + j)
            self.shares[j] = 1.0 if t is None else _share(t, c)
        backoff = max([t.backoff for t in elim.throttled.values()], default=1)
        self.steady_from = (
            max(self.last_event + self.quiet_ticks * backoff, self.pending_probe_ticks) + 1
        )
        # This tick at the current shares (count(k, k + 1), spelt out: most ticks are run).
        if k < self.half:
            self.first_half.append(self.slow)
        else:
            for j, q in enumerate(self.shares):
                self.share_sum[j] += q
            for i, s in enumerate(self.slow):
                self.slow_sum[i] += s
        k += 1
        stepped_s = self.now
        self.now += self.tick_s
        if self.every_tick or out.events or self.shares != self.seen_shares:
            self.fixed_key = None
            return k
        return self._skip(k, stepped_s)

    def _skip(self, k: int, stepped_s: float) -> int:
        """The step at ``stepped_s`` changed neither its inputs nor, if its state is the one
        the step before left, the eliminator: the next steps repeat it until one of its
        waits ends. They are counted, not run (the same sums, tick by tick, as running them
        would give); the next tick to run."""
        key = self.elim.state_key()
        if key != self.fixed_key:
            self.fixed_key = key
            return k
        deadline_s = self.elim.next_deadline_s(stepped_s) - CLOCK_SLACK_S
        first = k
        while k < min(self.ticks, self.steady_from) and self.now < deadline_s:
            k += 1
            self.now += self.tick_s
        self._count(first, k)
        return k

    def _count(self, first: int, end: int) -> None:
        """Add ticks ``first`` to ``end`` - 1 at the current shares, one tick at a time (the
        same sums, rounding included, whether the ticks were run or skipped)."""
        if first < self.half:
            self.first_half.extend([self.slow] * (min(end, self.half) - first))
        n = end - max(first, self.half)
        for sums, values in ((self.share_sum, self.shares), (self.slow_sum, self.slow)):
            for j, v in enumerate(values):
                total = sums[j]
                for _ in range(n):
                    total += v
                sums[j] = total


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
