"""What a hold buys and what it costs: the CPU jobs held back for one DNN job, judged once
they have shown (``min_gain_per_hold``) and priced after every step (``gpu_worth_cores``).
A hold that fails either is given back whole and that DNN job is not shielded for
``retest_s``. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from coda_node.policy.contention.jobs import ContentionOutput, CpuJob, DnnJob, throttle_share
from coda_node.policy.contention.part import Part
from coda_node.policy.contention.state import Hold, Throttled


@dataclass(eq=False)
class Holds(Part):
    """Per shielded DNN job its hold until judged, and the DNN jobs not shielded now."""

    holds: dict[int, Hold] = field(default_factory=dict, init=False)
    """Per DNN job shielded now: its hold, until judged (``min_gain_per_hold``)."""
    unshielded: dict[int, float] = field(default_factory=dict, init=False)
    """DNN jobs whose hold bought too little: since when (not shielded for ``retest_s``)."""

    @property
    def judging(self) -> bool:
        """Whether holds are judged at all (either test is on)."""
        return self.params.min_gain_per_hold > 0 or self.params.gpu_worth_cores > 0

    def near_slowdowns(self, job: DnnJob, dnn: Mapping[int, DnnJob]) -> dict[int, float]:
        """The slowdowns of the DNN jobs on ``job``'s sockets (itself included)."""
        out = {}
        for d in dnn.values():
            v = self.victims.get(d.job_id)
            if d.sockets & job.sockets and v is not None and v.slowdown is not None:
                out[d.job_id] = max(0.0, v.slowdown)
        return out

    def is_unshielded(self, now_s: float, job_id: int) -> bool:
        since = self.unshielded.get(job_id)
        if since is None:
            return False
        if now_s - since < self.params.retest_s:
            return True
        del self.unshielded[job_id]
        return False

    def stepped_for(self, job: DnnJob, dnn: Mapping[int, DnnJob]) -> None:
        """A step was just taken for ``job``: its hold starts (or grows) and waits to show."""
        hold = self.holds.get(job.job_id)
        if hold is None:
            hold = self.holds[job.job_id] = Hold(self.near_slowdowns(job, dnn))
        hold.quiet_ticks = 0
        hold.priced = False

    def judge(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        exhausted_for: set[int],
        out: ContentionOutput,
    ) -> None:
        """Judge each hold once it has shown (see the package docstring): give it back
        whole if it bought less than ``min_gain_per_hold`` per CPU job held back, or if
        the GPU time it gives back is worth less than the cores it holds back."""
        p = self.params
        for victim, hold in sorted(self.holds.items()):
            held = {j: t for j, t in self.throttled.items() if t.for_job == victim and t.level > 0}
            if not held:
                del self.holds[victim]
                continue
            if hold.judged and (hold.priced or p.gpu_worth_cores <= 0):
                continue
            hold.quiet_ticks += 1
            now = self.near_slowdowns(dnn[victim], dnn)
            for d, b in hold.before.items():
                hold.before[d] = max(b, now.get(d, b))
            v = self.victims.get(victim)
            if v is None or v.slowdown is None or hold.quiet_ticks <= p.smooth_ticks:
                continue
            if v.slowdown > p.trigger_slowdown and victim not in exhausted_for:
                continue
            why = self._verdict(victim, hold, held, now, dnn, cpu)
            if why is None:
                continue
            self.unshielded[victim] = now_s
            del self.holds[victim]
            for j, t in sorted(held.items()):
                self.ladder.release_all(now_s, j, t, why, out)

    def _verdict(
        self,
        victim: int,
        hold: Hold,
        held: Mapping[int, Throttled],
        now: Mapping[int, float],
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
    ) -> str | None:
        """Why the hold is given back (None: it stays): the benefit test the first time it
        is judged, then the price."""
        p = self.params
        first = not hold.judged
        hold.judged = hold.priced = True
        gain = sum(b - now[d] for d, b in hold.before.items() if d in now)
        kept = {
            j: throttle_share(self.ladder.throttle(t), cpu[j].allocated_cores)
            for j, t in held.items()
        }
        cost = sum(1.0 - q for q in kept.values())
        if first and cost > 0 and gain / cost < p.min_gain_per_hold:
            return (
                f"holding back {cost:.3g} CPU job(s) took only {gain:.1%} off the slowdown "
                f"of job {victim} and its neighbours; not shielded for {p.retest_s:g} s"
            )
        if p.gpu_worth_cores > 0:
            gpu_gain = sum(dnn[d].gpus * (b - now[d]) for d, b in hold.before.items() if d in now)
            core_cost = sum(cpu[j].allocated_cores * (1.0 - q) for j, q in kept.items())
            if core_cost > gpu_gain * p.gpu_worth_cores:
                return (
                    f"holding back {core_cost:.3g} cores gave back only {gpu_gain:.3g} "
                    f"GPUs to job {victim} and its neighbours (worth "
                    f"{gpu_gain * p.gpu_worth_cores:.3g} cores); not shielded for "
                    f"{p.retest_s:g} s"
                )
        return None
