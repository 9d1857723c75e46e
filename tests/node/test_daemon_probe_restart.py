"""A restarted coda-node goes on with the online profile of a DNN job where its last run left
it: the samples, the probe count and the time spent below the allocation come back
from the state file's view, so the job is not probed again from scratch and its probe time
budget (``NodeProbeBudgetS``) is not granted a second time.

The node and the jobs' side of the loop are those of :mod:`tests.node.test_daemon_loop_fixture`
(job 5001: 2 GPUs on 48 CPUs, its rate follows its cpuset along the modelled curve). The
restarts there are crashes: the old daemon does not put the job back, the new one's first
reconcile does.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from coda_node.policy.allocator import ProbeRecord
from tests.node.test_daemon_loop_fixture import DNN, Sim, _curve_rate

ALLOCATION = 48  # job 5001's CPUs


class Run:
    """A profiling run of job 5001, counting what the job lives through."""

    def __init__(self, tmp_path: Path, conf_extra: str = "") -> None:
        self.sim = Sim(tmp_path, dnn_src="none")
        if conf_extra:
            self.sim.new_daemon(conf_extra=conf_extra)
        self.below_s = 0.0
        """Seconds the job ran on fewer CPUs than its allocation, over every daemon."""

    def step(self) -> None:
        sim = self.sim
        sim.advance()
        cores = len(sim.cpuset(DNN))
        self.below_s += 1.0 if cores < ALLOCATION else 0.0
        sim.write_progress(DNN, _curve_rate(cores, 2))
        sim.tick()

    def record(self) -> ProbeRecord:
        return self.sim.daemon.loop.allocator.records[DNN]

    def until_published(self, limit: int = 300) -> None:
        for _ in range(limit):
            self.step()
            if self.sim.events("profile-publish"):
                return
        raise AssertionError(self.sim.timeline)

    def until_mid_probe(self, probes: int) -> None:
        """Until ``probes`` probes are done and the next one, below the allocation, has a
        window measured."""
        for _ in range(300):
            self.step()
            rec = self.sim.daemon.loop.allocator.records.get(DNN)
            if (
                rec is not None
                and rec.state == "probing"
                and rec.probes >= probes
                and rec.current is not None
                and rec.current < ALLOCATION
                and rec.windows_done >= 1
            ):
                return
        raise AssertionError(self.sim.timeline)

    def probed_counts(self, since_tick: int = 0) -> list[int]:
        return [e["reading"]["cores"] for t, e in self.sim.events("probe") if t >= since_tick]

    def garble_profiles_in_state_file(self) -> None:
        """The last view's profiles replaced by what this version cannot read."""
        path = self.sim.daemon.state_file.view_path
        data = json.loads(path.read_text())
        for job in data["view"]["jobs"]:
            job["profiling"] = {"state": "probing", "samples": "not a list"}
        path.write_text(json.dumps(data))


def test_a_restart_mid_probe_finishes_with_fewer_probes_than_from_scratch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = Run(tmp_path / "fresh")
    fresh.until_published()
    fresh_probes = fresh.record().probes

    run = Run(tmp_path / "restart")
    run.until_mid_probe(probes=2)
    before = run.record()
    samples_before = list(before.samples)
    probes_before = before.probes
    assert len(run.sim.cpuset(DNN)) < ALLOCATION  # the dying daemon leaves the probe applied
    caplog.set_level(logging.INFO, logger="coda-node")
    run.sim.new_daemon()
    assert f"online profiles from the last run: {DNN}=waiting ({probes_before} probes" in (
        caplog.text
    )
    adopted = run.record()
    assert adopted.samples == samples_before and adopted.probes == probes_before
    restart_tick = run.sim.ticks
    run.step()
    # The first tick puts the job back on its whole allocation (the interrupted probe's
    # partial window is dropped) and starts the next probe; it serves its settle first.
    assert len(run.sim.cpuset(DNN)) == ALLOCATION or run.probed_counts(restart_tick)

    run.until_published()
    rec = run.record()
    after = run.probed_counts(restart_tick)
    assert after and not set(after) & {c for c, _ in samples_before}, (after, samples_before)
    assert rec.probes - probes_before < fresh_probes
    # The profile published is as good as the uninterrupted run's, and published once.
    prof = run.sim.store.read(run.sim.signature)
    fresh_prof = fresh.sim.store.read(fresh.sim.signature)
    assert prof is not None and fresh_prof is not None
    assert abs(prof.cpus_per_gpu - fresh_prof.cpus_per_gpu) <= 1
    assert prof.confidence >= run.sim.cfg.min_confidence
    assert len(run.sim.events("profile-publish")) == 1
    assert run.sim.node.cpuset_texts(DNN)["."] == fresh.sim.node.cpuset_texts(DNN)["."]


BUDGET_S = 15.0  # one probe of SHORT_TIMES (settle 2 s + measure 6 s) fits, not two more


@pytest.mark.parametrize("view_readable", [True, False], ids=["adopted", "garbled"])
def test_time_below_the_allocation_before_a_restart_counts_against_the_budget(
    tmp_path: Path, view_readable: bool
) -> None:
    run = Run(tmp_path, conf_extra=f"NodeProbeBudgetS={BUDGET_S:g}\n")
    assert run.sim.cfg.node_probe_budget_s == BUDGET_S
    run.until_mid_probe(probes=2)
    spent_s = run.record().below_s
    assert 0 < spent_s < BUDGET_S
    if not view_readable:
        run.garble_profiles_in_state_file()
    run.sim.new_daemon()  # start() reads what it can and never fails on a bad profile
    run.until_published()
    rec = run.record()
    if view_readable:
        assert "time budget spent" in rec.why
        # The fixture's wall clock does not see the second between the dead daemon's last
        # view and the restart (a real one counts it: sampled_unix_s to now).
        assert run.below_s <= BUDGET_S + run.sim.cfg.node_interval_s
        assert rec.below_s <= BUDGET_S
    else:
        # Profiled afresh: the budget is granted again and the job pays for it.
        assert rec.below_s < run.below_s - spent_s + 1.0
        assert run.below_s > BUDGET_S + run.sim.cfg.node_interval_s


def test_a_job_done_before_the_restart_is_not_probed_or_published_again(tmp_path: Path) -> None:
    """Ended by its time budget with a profile that is not confident: from scratch, the
    restarted daemon would probe it again (only a confident profile stops that)."""
    run = Run(tmp_path, conf_extra="NodeProbeBudgetS=10\n")
    run.until_published()
    done = run.record()
    assert done.state == "done" and "budget" in done.why
    prof = run.sim.store.read(run.sim.signature)
    assert prof is not None and prof.confidence < run.sim.cfg.min_confidence
    n_samples = prof.n_samples
    run.sim.new_daemon()
    restart_tick = run.sim.ticks
    for _ in range(60):
        run.step()
        assert len(run.sim.cpuset(DNN)) == ALLOCATION
    rec = run.record()
    assert rec.state == "done" and rec.why == done.why and rec.probes == done.probes
    assert run.probed_counts(restart_tick) == []
    assert [t for t, _ in run.sim.events("profile-publish")] < [restart_tick]
    prof = run.sim.store.read(run.sim.signature)
    assert prof is not None and prof.n_samples == n_samples
    view = {j["job_id"]: j for j in run.sim.daemon.state.view["jobs"]}[DNN]
    assert view["profile_state"] == "probed"
    assert view["profiling"]["state"] == "done"


@pytest.mark.parametrize("stop", ["crash", "clean"])
def test_a_probe_a_dead_daemon_left_applied_counts_until_the_restart(
    tmp_path: Path, stop: str
) -> None:
    """The daemon was down 30 s before it started again. A crash left the probe applied all
    that time: it counts against the budget. A clean stop put the job back first: it does
    not."""
    run = Run(tmp_path)
    run.until_mid_probe(probes=2)
    spent_s = run.record().below_s
    if stop == "clean":
        run.sim.daemon.restore()
        assert len(run.sim.cpuset(DNN)) == ALLOCATION
    path = run.sim.daemon.state_file.view_path
    data = json.loads(path.read_text())
    data["view"]["sampled_unix_s"] -= 30.0
    path.write_text(json.dumps(data))
    run.sim.new_daemon()
    extra_s = run.record().below_s - spent_s
    if stop == "crash":
        assert 30.0 <= extra_s < 40.0
    else:
        assert extra_s == 0.0
