"""The memory-bandwidth spread of CPU-only jobs against a real slurmctld and two slurmds.

Two 32-CPU nodes, each in its own network namespace, with a count-only ``membw:100`` GRES
(100 units of 1 GB/s). The profile store holds what coda-node records of a CPU workload
(``cpu_usage``): ``stream`` draws 5 GB/s per CPU, ``compile`` 0.5 GB/s. With
``MemBwSpreadGres=membw`` a 12-CPU ``stream`` job asks for 60 units, so Slurm puts a second
one on the other node; without it, Slurm packs both on the first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.store.profiles import CpuUsageRecord, ProfileStore
from coda_node.system.slurmjobs import SlurmJobs, make_runner
from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, NodeSpec
from tests.conftest import LogWatch, cancel_all, gres, require_slurm, started
from tests.controller.test_placement_slurm import wait_state
from tests.controller.test_submit_slurm import wait_for_reload
from tests.node.test_multinode_slurm import _multinode_reason

pytestmark = pytest.mark.slurm

SCRIPT = "#!/bin/sh\nsleep 300\n"
GB = 1e9
CONF = "MemBwSpreadGres=membw\n"
STREAM = ["-c", "12", "--comment=coda:workload=stream"]


@pytest.fixture(scope="module")
def mcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _multinode_reason()
    if reason:
        pytest.skip(reason)
    cluster = DevCluster(
        tmp_path_factory.mktemp("slurm-membw"),
        node=NodeSpec(cpus=32, gpus=2, extra_gres="membw:100"),
        nodes=2,
        coda_conf_extra=CONF,
    )
    for c in started(cluster):
        store = ProfileStore(c.profile_store)
        # What coda-node's merge of its measurements leaves (shared keys: any user's
        # coda:workload=NAME job reads them).
        for name, bw in (("stream", 5 * GB), ("compile", 0.5 * GB)):
            store.merge_cpu_usage(f"workload:*:{name}", CpuUsageRecord(bw, 40, time.time()))
        wait_for_reload(c, min_profiles=2)
        yield c


@pytest.fixture(autouse=True)
def _cancel_jobs(mcluster: DevCluster) -> Iterator[None]:
    yield
    cancel_all(mcluster)


def submit(cluster: DevCluster, args: list[str]) -> tuple[int, dict[str, str], str]:
    job_id, said = cluster.sbatch(args, SCRIPT)
    return job_id, cluster.show_job(job_id), said


def running_on(cluster: DevCluster, job_id: int) -> str:
    return wait_state(cluster, job_id, "RUNNING", timeout_s=40)["NodeList"]


def test_memory_bound_cpu_jobs_are_spread_over_nodes(mcluster: DevCluster) -> None:
    first, fields, said = submit(mcluster, STREAM)
    assert fields["TresPerNode"] == gres("gres:membw:60")
    assert gres("gres:membw:60") + " per node (memory-bound: 5.0 GB/s per CPU" in said
    record = parse_admin_record(fields["AdminComment"])
    assert (record["sig"], record["membw"], record["gpn"]) == ("workload:0:stream", "60", "0")
    first_node = running_on(mcluster, first)
    # What coda-node on that node reads of it: a CPU job, its record, the GRES it holds
    # (squeue --json says "membw(CNT:60)" for a GRES without device files).
    slurm = SlurmJobs(first_node, make_runner(mcluster.env))
    seen = slurm.get({first}).get(first)
    assert slurm.last_error is None and seen is not None, slurm.last_error
    assert not seen.is_dnn and seen.admin_record is not None
    assert seen.admin_record["sig"] == "workload:0:stream"
    assert [(g.name, g.count) for g in seen.gres] == [("membw", 60)]

    # 20 of the first node's 32 CPUs are free, but only 40 of its 100 bandwidth units.
    second, fields, _ = submit(mcluster, STREAM)
    assert fields["TresPerNode"] == gres("gres:membw:60")
    second_node = running_on(mcluster, second)
    assert {first_node, second_node} == {"gpu01", "gpu02"}

    # A compute-bound job asks for nothing and still fits beside either.
    light, fields, said = submit(mcluster, ["-c", "12", "--comment=coda:workload=compile"])
    assert fields.get("TresPerNode") in (None, "", "(null)")
    assert "membw" not in said
    assert "membw" not in parse_admin_record(fields["AdminComment"])
    running_on(mcluster, light)

    # A third stream job has no node with 60 units left: it waits for one.
    third, _, _ = submit(mcluster, STREAM)
    wait_state(mcluster, third, "PENDING", "Resources")
    mcluster.run(["scancel", str(first)])
    assert running_on(mcluster, third) == first_node


def test_unmeasured_cpu_job_gets_a_record_for_the_node_daemon(mcluster: DevCluster) -> None:
    job_id, fields, said = submit(mcluster, ["-c", "4", "--job-name=fresh"])
    assert fields.get("TresPerNode") in (None, "", "(null)")
    assert "coda:" not in said
    record = parse_admin_record(fields["AdminComment"])
    assert record["sig"].startswith("script:0:") and record["action"] == "skip"
    running_on(mcluster, job_id)


def test_repeated_cpu_jobs_are_answered_alike_and_not_counted_as_gpu_jobs(
    mcluster: DevCluster,
) -> None:
    # The second and third submissions match the first byte for byte: the hook's decision
    # memo answers them. Each gets the GRES and a record with its own token.
    wait_for_reload(mcluster)
    before = json.loads(mcluster.hook_stats_file.read_text())
    args = [*STREAM, "--hold", "--job-name=repeat-cpu"]
    answers = [submit(mcluster, args) for _ in range(3)]
    assert [f["TresPerNode"] for _, f, _ in answers] == [gres("gres:membw:60")] * 3
    records = [parse_admin_record(f["AdminComment"]) for _, f, _ in answers]
    assert len({r.pop("tok") for r in records}) == 3
    assert records[0] == records[1] == records[2] and records[0]["membw"] == "60"
    assert len({said for _, _, said in answers}) == 1
    wait_for_reload(mcluster)
    after = json.loads(mcluster.hook_stats_file.read_text())
    assert after["cpu_jobs"] - before.get("cpu_jobs", 0) == 3
    assert after["gpu_jobs"] == before["gpu_jobs"]  # coda-slurm status counts GPU jobs
    journal = mcluster.decision_journal
    text = journal.read_text() if journal.exists() else ""
    assert "repeat-cpu" not in text


def test_predict_shows_the_request_the_hook_makes(mcluster: DevCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    coda_slurm = str(Path(sys.executable).with_name("coda-slurm"))
    out = mcluster.run([coda_slurm, "predict", "--json", *STREAM, str(script)]).stdout
    predicted = json.loads(out)
    job_id, _ = mcluster.sbatch(["--hold", *STREAM], SCRIPT)
    assert predicted["tres_per_node_after"] == mcluster.show_job(job_id)["TresPerNode"]
    assert predicted["tres_per_node_after"] == gres("gres:membw:60")


def test_without_the_spread_slurm_packs_them(mcluster: DevCluster) -> None:
    original = mcluster.coda_conf.read_text()
    log = LogWatch(mcluster.ctld_log)
    try:
        rewrite(mcluster, original.replace(CONF, ""))
        log.wait_for(r"job_submit/coda: reloaded ")
        first, fields, _ = submit(mcluster, STREAM)
        second, _, _ = submit(mcluster, STREAM)
        assert fields.get("TresPerNode") in (None, "", "(null)")
        assert "AdminComment" not in fields or "coda:sig=" not in fields["AdminComment"]
        assert running_on(mcluster, first) == running_on(mcluster, second)
    finally:
        log = LogWatch(mcluster.ctld_log)
        rewrite(mcluster, original)
        log.wait_for(r"job_submit/coda: reloaded ")


def rewrite(cluster: DevCluster, text: str) -> None:
    cluster.coda_conf.write_text(text)
    os.utime(cluster.coda_conf, ns=(time.time_ns(), time.time_ns()))
