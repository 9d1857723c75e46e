"""Release: a throttled CPU job is given back one step at a time, each after
``release_hold_s`` (times its backoff) with no DNN job beside it still slowed, or at the base
pace once it went quiet; an unproven job goes first, whole, so its return is judged alone.
Pure."""

from __future__ import annotations

from collections.abc import Mapping

from coda_node.policy.contention.jobs import ContentionOutput, CpuJob, DnnJob, throttle_share
from coda_node.policy.contention.part import Part
from coda_node.policy.contention.state import Throttled


class Release(Part):
    """When each throttled job's next release step is due, and taking it."""

    def release(
        self,
        now_s: float,
        dnn: Mapping[int, DnnJob],
        cpu: Mapping[int, CpuJob],
        stepped: set[int],
        out: ContentionOutput,
    ) -> None:
        # Unproven jobs go first, whole and one at a time, so that the judgement of each
        # (Attribution.judge_return) sees its effect alone.
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
            hold = self._hold(now_s, t, c, dnn)
            if hold is None:
                continue
            hold_s, quiet = hold
            if now_s - t.last_change_s < hold_s:
                continue
            if t.unproven:
                self._give_back_unproven(now_s, job_id, t, c, out)
                returning = True
                continue
            self.ladder.release_step(now_s, job_id, t, c, hold_s, quiet, out)

    def _hold(
        self, now_s: float, t: Throttled, c: CpuJob, dnn: Mapping[int, DnnJob]
    ) -> tuple[float, bool] | None:
        """How long ``t`` must have stayed unchanged before its next release step, and
        whether that is because the job went quiet; None while a DNN job beside it still
        needs it held back."""
        p = self.params
        if not self.ladder.quiet(c, t):
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
        self, now_s: float, job_id: int, t: Throttled, c: CpuJob, out: ContentionOutput
    ) -> None:
        """Release an unproven job whole and remember the DNN job's slowdown, so the next
        ticks judge whether giving it back slowed that job (Attribution.judge_return)."""
        v = self.victims.get(t.for_job) if t.for_job is not None else None
        kept = throttle_share(self.ladder.throttle(t), c.allocated_cores)
        cores = c.allocated_cores * (1.0 - kept)
        self.ladder.release_all(
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
