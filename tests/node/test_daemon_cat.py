"""The daemon's contention loop on a node with L3 cache allocation (CAT) and no MBA.

Same node and jobs as tests/node/test_daemon_loop_fixture.py (job 5001: 2-GPU DNN job, job 5002:
a 16-core CPU job, one socket), with the ``cat_only`` resctrl variant mounted: a 20-way L3
with CAT, no MB, no monitoring. Between ticks the CPU job reacts to what the daemon
enforced, read back from the fixture files the daemon wrote: while it runs, it evicts the
DNN job's cache lines in proportion to the L3 ways its resctrl group lets it allocate in
(and to the share of its cores its CPU quota leaves it), and the DNN job's rate falls with
that.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from coda_node.daemon.service import TickReport
from coda_node.status.document import load_status
from coda_node.status.text import render
from coda_node.system.resctrl import parse_schemata
from tests.node import resctrl_fixtures
from tests.node.test_daemon_loop_fixture import CPU, CPU_CORES, DNN, R0, Sim, mount_resctrl

WAYS = resctrl_fixtures.CBM_LEN  # 20
S = 0.36
"""The DNN job's sensitivity: rate = R0 * (1 - S * ways / WAYS * cores / CPU_CORES): 36 %
slower beside the CPU job on the whole cache, 18 % at 10 ways, 9 % at 5 ways."""
ONSET = 12  # first tick whose second the CPU job runs in (baseline: ticks 5-11)


def _cat_sim(tmp_path: Path) -> tuple[Sim, resctrl_fixtures.FakeResctrl]:
    """The fixture node of test_daemon_loop_fixture, with a daemon that finds CAT only."""
    sim = Sim(tmp_path)
    fake = sim.rdt = mount_resctrl(sim.node, "cat_only")
    sim.new_daemon()
    return sim, fake


def _l3_group(fake: resctrl_fixtures.FakeResctrl, tids: set[int]) -> tuple[str, int] | None:
    """(coda group holding these threads, ways its L3 mask gives on domain 0)."""
    for group in sorted(fake.path.glob("coda_*")):
        if tids & {int(t) for t in (group / "tasks").read_text().split()}:
            mask = parse_schemata((group / "schemata").read_text())["L3"][0]
            return group.name, mask.bit_count()
    return None


def _step(sim: Sim, fake: resctrl_fixtures.FakeResctrl, running: bool) -> TickReport:
    sim.advance()
    in_group = _l3_group(fake, set(sim.node.jobs[CPU].all_tids))
    ways = in_group[1] if in_group else WAYS
    quota = sim.quota_cores(CPU)
    cores = min(float(CPU_CORES), quota if quota is not None else float(CPU_CORES))
    if not running:
        cores = 0.0
    sim.node.advance_cpu(CPU, int(cores * 1e9))
    sim.write_progress(DNN, R0 * (1.0 - S * ways / WAYS * cores / CPU_CORES))
    return sim.tick()


def test_cat_limits_the_cpu_job_to_the_low_ways_then_releases_them(tmp_path: Path) -> None:
    sim, fake = _cat_sim(tmp_path)
    elim = sim.daemon.loop.eliminator
    assert (elim.mba, elim.l3_ways, elim.l3_min_ways) == (False, WAYS, 1)
    assert sim.daemon.cat_unavailable is None
    assert sim.daemon.mba_unavailable is not None  # cat_only: no MB
    for _ in range(ONSET):
        _step(sim, fake, running=False)
    assert sim.baseline(DNN) == pytest.approx(R0)

    cpu_tids = {t for ts in sim.node.jobs[CPU].v1_threads.values() for t in ts}
    groups_seen: list[tuple[str, str]] = []
    for _ in range(20):
        _step(sim, fake, running=True)
        for name in sorted(p.name for p in fake.path.glob("coda_*")):
            entry = (name, fake.text(f"{name}/schemata"))
            if entry not in groups_seen:
                groups_seen.append(entry)
                assert {int(t) for t in fake.text(f"{name}/tasks").split()} == cpu_tids

    throttles = sim.events("throttle", CPU)
    assert throttles, sim.timeline
    assert ONSET <= throttles[0][0] <= ONSET + 2
    reasons = [e["reason"].split(":")[0] for _, e in throttles]
    # 20 -> 10 -> 5 ways; at 5 ways the DNN job is within the trigger: no more steps.
    assert reasons == ["L3 limited to 10 of 20 ways", "L3 limited to 5 of 20 ways"]
    assert all(e["reading"]["victim"] == DNN for _, e in throttles)
    # The low ways, in both L3 domains (Intel DDIO fills the top ways with PCIe input).
    assert groups_seen == [
        ("coda_l3w10", "L3:0=003ff;1=003ff\n"),
        ("coda_l3w5", "L3:0=0001f;1=0001f\n"),
    ]
    applied = [e["what"] for _, e in sim.timeline if e["job_id"] == CPU and "L3 cache" in e["what"]]
    assert applied == ["L3 cache 10 of 20 ways", "L3 cache 5 of 20 ways"]
    assert sim.events("L3 cache 10 of 20 ways", CPU)[0][1]["reason"] == (
        f"contention: shielding job {DNN}"
    )
    assert sim.quota_cores(CPU) is None  # CAT was enough: no CPU quota
    rate, base = sim.rate(DNN), sim.baseline(DNN)
    assert rate is not None and base is not None and rate >= 0.9 * base

    # What `coda-node status` shows for the CPU job: the mechanism and the ways.
    status = elim.cpu_status(CPU)
    assert status is not None
    assert (status["mechanism"], status["l3_ways"], status["l3_ways_total"]) == ("l3", 5, WAYS)
    doc = load_status(sim.daemon.state_file.view_path, interval_s=1.0)
    schema = Path(__file__).parents[2] / "docs" / "status.schema.json"
    jsonschema.validate(doc, json.loads(schema.read_text()))
    [cpu_row] = [j for j in doc["jobs"] if j["job_id"] == CPU]
    assert cpu_row["throttle"]["l3_ways"] == 5 and cpu_row["throttle_level"] == 2
    screen = render(doc, width=200)
    [line] = [x for x in screen.splitlines() if x.strip().startswith(str(CPU)) and "CPU" in x]
    assert "2 l3 L3 5/20 ways" in line

    # The CPU job stops: released one step per hold, in reverse, back to no group.
    quiet_from = sim.ticks
    for _ in range(30):
        _step(sim, fake, running=False)
    released = [
        (t, e)
        for t, e in sim.timeline
        if t >= quiet_from and e["job_id"] == CPU and e["what"] in ("release-step", "release")
    ]
    assert [e["reason"].split(":")[0] for _, e in released] == [
        "L3 limit raised to 10 of 20 ways",
        "released",
    ]
    assert released[1][0] - released[0][0] >= 5  # NodeReleaseHoldS=5
    writes = [
        e["what"]
        for t, e in sim.timeline
        if t >= quiet_from and e["job_id"] == CPU and e["what"].startswith("L3 cache")
    ]
    assert writes == ["L3 cache 10 of 20 ways", "L3 cache ways released"]
    assert sorted(p.name for p in fake.path.glob("coda_*")) == []
    assert cpu_tids <= {int(t) for t in fake.text("tasks").split()}
    assert CPU not in sim.daemon.state.changes
