"""A daemon started before Slurm's cgroup tree exists keeps what it adopted from its last
run.

slurmd makes its cgroup tree with the node's first job, so a coda-node restarted on a node
whose tree is missing (or not yet mounted) finds none and looks again every tick
(``Daemon._rediscover``). When the tree appears, the daemon builds its adaptive loop anew;
the DNN jobs' online profiles in progress and their uncontended baselines, which ``start()``
took from the state file's last view, must come into that loop too, or a job half-way
through its probes is profiled from scratch (its probe budget granted twice) and stays
unshielded until its baseline is measured again.

The node and the DNN job's side of the loop are :mod:`tests.node.test_daemon_loop_fixture`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.node.test_daemon_loop_fixture import DNN, Sim, _curve_rate
from tests.node.test_daemon_probe_restart import Run

BASELINE = 87.5  # iterations/s: the last run's baseline, unlike anything this run measures


def _step(sim: Sim, cores: int | None = None) -> None:
    """One second of training on the job's cpuset (``cores`` when the tree is hidden)."""
    sim.advance()
    sim.write_progress(DNN, _curve_rate(cores or len(sim.cpuset(DNN)), 2))
    sim.tick()


def test_probes_and_baselines_adopted_at_start_survive_the_slurm_tree_appearing(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path)
    run.until_mid_probe(probes=2)
    sim = run.sim
    before = sim.daemon.loop.allocator.records[DNN]
    probes_before, samples_before = before.probes, list(before.samples)
    assert probes_before >= 2 and samples_before

    # The last run's view also holds a baseline for the job (as after quiet ticks).
    path = sim.daemon.state_file.view_path
    data = json.loads(path.read_text())
    (job,) = [j for j in data["view"]["jobs"] if j["job_id"] == DNN]
    job["contention"] = {"baseline": BASELINE, "baseline_ticks": 20, "slowdown": None}
    path.write_text(json.dumps(data))

    # The daemon restarts while Slurm's tree is gone from the cpuset hierarchy.
    left_on = len(sim.cpuset(DNN))  # the probe the last run left applied
    slurm = sim.node.cg / "cpuset/slurm"
    hidden = sim.node.cg / "cpuset/not-yet"
    slurm.rename(hidden)
    sim.new_daemon()
    assert not sim.daemon.layout.has_slurm
    # Without the tree profiling is off, so the profile waits in the view read at start.
    assert DNN not in sim.daemon.loop.allocator.records
    _step(sim, cores=left_on)  # a tick without the tree: it observes through squeue only
    assert not sim.daemon.layout.has_slurm

    hidden.rename(slurm)  # slurmd makes its tree
    _step(sim)
    assert sim.daemon.layout.has_slurm
    rec = sim.daemon.loop.allocator.records.get(DNN)
    status = sim.daemon.loop.eliminator.dnn_status(DNN) or {}
    # Both, so that a failure shows what each lost: the probe count and the baseline.
    assert (rec.probes if rec else None, status.get("baseline")) == (
        probes_before,
        pytest.approx(BASELINE),
    )
    assert rec is not None
    assert list(rec.samples)[: len(samples_before)] == samples_before
    assert rec.below_s >= before.below_s  # the time already spent below counts
