"""Placement against a real slurmctld: what ``scontrol show job`` says Slurm will do.

One cluster for the module, configured for all three mechanisms: an 8-GPU node with a
count-only ``pcie:1`` GRES (one PCIe domain) and the node feature ``gpu_a100``, two CPU
partitions ``batch`` and ``gpu_spare`` over the node, and profiles with usage records.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.store.profiles import Profile, ProfileStore, UsageRecord
from slurm_plugin.decision.decide import parse_admin_record
from slurm_plugin.devtools.cluster import DevCluster, NodeSpec
from tests.conftest import LogWatch, cancel_all, gres, require_slurm, started
from tests.controller.test_submit_slurm import wait_for_reload

pytestmark = pytest.mark.slurm

SCRIPT = "#!/bin/sh\nsleep 300\n"
GB = 1e9
PLACEMENT_CONF = (
    "PcieSpreadGres=pcie\n"
    "PreferGpuTypes=a100,v100\n"
    # No node has gpu_v100: jobs that should go to a v100 must not get a --prefer that
    # Slurm would refuse.
    "PreferGpuFeatures=a100:gpu_a100,v100:gpu_v100\n"
    "CpuJobPartitions=batch,gpu_spare\n"
)


def _usage(model: str, iters: float, pcie: float | None) -> UsageRecord:
    return UsageRecord(model, 0.9, 0.4, pcie, iters, 30, time.time())


def _put_profiles(cluster: DevCluster) -> None:
    # a100 over v100: resnet50 2.5x and 6 GB/s per GPU over PCIe (2 GPUs: 12 GB/s, heavy);
    # gpt 1.67x (the median); bert 1.25x and light on PCIe.
    store = ProfileStore(cluster.profile_store)
    for name, a100, v100, pcie in (
        ("resnet50", 10.0, 4.0, 6 * GB),
        ("gpt", 10.0, 6.0, 0.5 * GB),
        ("bert", 10.0, 8.0, 0.3 * GB),
    ):
        store.write(
            Profile(
                signature=f"workload:*:{name}",
                workload=name,
                cpus_per_gpu=2,
                confidence=0.95,
                n_samples=8,
                updated_unix_s=time.time(),
                source="test",
                usage=(_usage("a100", a100, pcie), _usage("v100", v100, None)),
            )
        )


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    cluster = DevCluster(
        tmp_path_factory.mktemp("slurm-placement"),
        node=NodeSpec(gpus=8, extra_gres="pcie:1", features="gpu_a100,nvme"),
        extra_partitions=(
            "PartitionName=batch Nodes=gpu01 MaxTime=INFINITE State=UP\n"
            "PartitionName=gpu_spare Nodes=gpu01 MaxTime=INFINITE State=UP\n"
        ),
        coda_conf_extra=PLACEMENT_CONF,
    )
    for c in started(cluster):
        _put_profiles(c)
        wait_for_reload(c, min_profiles=3)
        yield c


@pytest.fixture(autouse=True)
def _cancel_jobs(pcluster: DevCluster) -> Iterator[None]:
    yield
    cancel_all(pcluster)


def submit(
    cluster: DevCluster, args: list[str], *, hold: bool = True
) -> tuple[int, dict[str, str], str]:
    job_id, said = cluster.sbatch((["--hold"] if hold else []) + args, SCRIPT)
    return job_id, cluster.show_job(job_id), said


def wait_state(
    cluster: DevCluster, job_id: int, state: str, reason: str | None = None, timeout_s: float = 20
) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        fields = cluster.show_job(job_id)
        if fields["JobState"] == state and (reason is None or fields.get("Reason") == reason):
            return fields
        shown = {k: fields.get(k) for k in ("JobState", "Reason", "TresPerNode", "Prefer")}
        assert time.monotonic() < deadline, (state, reason, shown)
        time.sleep(0.2)


def prefer(fields: dict[str, str]) -> str | None:
    value = fields.get("Prefer")
    return None if value in (None, "", "(null)") else value


# Typed, so the hook adds no --prefer: a pending job with --prefer shows Reason=Priority in
# Slurm 22.05 (it is tried with and then without the preferred features), not Resources.
HEAVY = ["--gres=gpu:a100:2", "--comment=coda:workload=resnet50"]
LIGHT = ["--gpus-per-node=2", "--comment=coda:workload=bert"]


# -------------------------------------------------------------------------------- PCIe spread


def test_pcie_heavy_jobs_do_not_share_a_pcie_domain(pcluster: DevCluster) -> None:
    heavy1, fields, said = submit(pcluster, HEAVY, hold=False)
    assert fields["TresPerNode"] == gres("gres:gpu:a100:2,gres:pcie:1")
    assert gres("gres:pcie:1") + " per node (PCIe-heavy workload" in said
    assert parse_admin_record(fields["AdminComment"])["pcie"] == "1"
    wait_state(pcluster, heavy1, "RUNNING")

    light, fields, _ = submit(pcluster, LIGHT, hold=False)
    assert fields["TresPerNode"] == gres("gres:gpu:2")
    wait_state(pcluster, light, "RUNNING")

    # 4 of 8 GPUs and 8 of 32 cores are free, but the node's one PCIe unit is taken.
    heavy2, fields, _ = submit(pcluster, HEAVY, hold=False)
    assert fields["TresPerNode"] == gres("gres:gpu:a100:2,gres:pcie:1")
    wait_state(pcluster, heavy2, "PENDING", "Resources")
    time.sleep(2)
    assert pcluster.show_job(heavy2)["JobState"] == "PENDING"

    # Another light job still starts beside them.
    light2, _, _ = submit(
        pcluster, ["--gpus-per-node=1", "--comment=coda:workload=gpt"], hold=False
    )
    pcluster.run(["scontrol", "top", str(light2)], check=False)  # ahead of the blocked heavy2
    wait_state(pcluster, light2, "RUNNING", timeout_s=40)

    # When the first heavy job ends, the second one gets the PCIe domain.
    pcluster.run(["scancel", str(heavy1)])
    wait_state(pcluster, heavy2, "RUNNING", timeout_s=40)


def test_pcie_spread_off_changes_nothing(pcluster: DevCluster) -> None:
    original = pcluster.coda_conf.read_text()
    log = LogWatch(pcluster.ctld_log)
    try:
        pcluster.coda_conf.write_text(original.replace("PcieSpreadGres=pcie", "PcieSpreadGres="))
        os.utime(pcluster.coda_conf, ns=(time.time_ns(), time.time_ns()))
        log.wait_for(r"job_submit/coda: reloaded ")
        _, fields, said = submit(pcluster, HEAVY)
        assert fields["TresPerNode"] == gres("gres:gpu:a100:2")
        assert "pcie" not in parse_admin_record(fields["AdminComment"])
        assert "pcie" not in said
    finally:
        log = LogWatch(pcluster.ctld_log)
        pcluster.coda_conf.write_text(original)
        os.utime(pcluster.coda_conf, ns=(time.time_ns(), time.time_ns()))
        log.wait_for(r"job_submit/coda: reloaded ")


# -------------------------------------------------------------------------------- --prefer


def test_prefer_set_for_untyped_gpu_job(pcluster: DevCluster) -> None:
    _, fields, said = submit(pcluster, ["--gpus-per-node=1", "--comment=coda:workload=resnet50"])
    assert prefer(fields) == "gpu_a100"
    assert parse_admin_record(fields["AdminComment"])["prefer"] == "gpu_a100"
    assert "--prefer=gpu_a100 (the workload gains more than most from a100" in said
    assert fields.get("Features") in (None, "(null)")  # never a hard constraint


def test_prefer_left_alone_for_typed_job_and_users_own(pcluster: DevCluster) -> None:
    _, typed, said = submit(pcluster, ["--gres=gpu:a100:1", "--comment=coda:workload=resnet50"])
    assert prefer(typed) is None
    assert "prefer" not in parse_admin_record(typed["AdminComment"])
    assert "--prefer" not in said
    _, own, _ = submit(
        pcluster, ["--gpus-per-node=1", "--prefer=nvme", "--comment=coda:workload=resnet50"]
    )
    assert prefer(own) == "nvme"


def test_prefer_for_a_feature_no_node_has_is_not_set(pcluster: DevCluster) -> None:
    """bert should leave the a100s to others, but no node has gpu_v100: Slurm would refuse
    a job preferring it, so the hook must leave the job as it was and let it run."""
    log = LogWatch(pcluster.ctld_log)
    job_id, fields, _ = submit(pcluster, ["--gpus-per-node=1", "--comment=coda:workload=bert"])
    assert prefer(fields) is None
    assert fields["JobState"] == "PENDING"  # accepted (held)
    log.wait_for(r"sig=workload:0:bert .* no-feature=gpu_v100")
    pcluster.run(["scontrol", "release", str(job_id)])
    wait_state(pcluster, job_id, "RUNNING")


# -------------------------------------------------------------------------------- CPU jobs


def test_cpu_job_without_partition_is_offered_the_route(pcluster: DevCluster) -> None:
    _, fields, said = submit(pcluster, ["--ntasks=2"])
    assert fields["Partition"] == "batch,gpu_spare"
    assert "CPU-only job offered partitions batch,gpu_spare" in said
    assert fields.get("AdminComment", "") == ""

    _, own, said = submit(pcluster, ["--ntasks=2", "-p", "batch"])
    assert own["Partition"] == "batch" and said.strip() == ""
    _, opted_out, _ = submit(pcluster, ["--ntasks=2", "--comment=coda:off"])
    assert opted_out["Partition"] == "gpu"  # slurm.conf's default partition

    # A GPU job without -p is not routed.
    _, gpu_job, _ = submit(pcluster, ["--gpus-per-node=1"])
    assert gpu_job["Partition"] == "gpu"


def test_routed_cpu_job_runs(pcluster: DevCluster) -> None:
    job_id, _, _ = submit(pcluster, ["--ntasks=1"], hold=False)
    fields = wait_state(pcluster, job_id, "RUNNING")
    assert fields["Partition"] in ("batch", "gpu_spare")


# -------------------------------------------------------------------------------- predict


@pytest.mark.parametrize(
    "args,field,shown",
    [
        (["--gpus-per-node=1", "--comment=coda:workload=resnet50"], "prefer", "Prefer"),
        (HEAVY, "tres_per_node", "TresPerNode"),
        (["--ntasks=2"], "partition", "Partition"),
    ],
)
def test_predict_shows_the_placement_the_hook_applies(
    pcluster: DevCluster, tmp_path: Path, args: list[str], field: str, shown: str
) -> None:
    """An admin checks a job with ``coda-slurm predict`` before it is submitted: what it
    shows for --prefer, the PCIe GRES and the CPU-job route is what slurmctld then does.
    The options go in as users type them (values as separate arguments, flags run
    together, ``-o`` in the script)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -o /dev/null\n#SBATCH -t 10\nsleep 300\n")
    typed = [a.replace("=", " ", 1) if a.startswith("--gpus") else a for a in args]
    argv = [w for a in typed for w in a.split(" ", 1)]
    out = pcluster.run(
        [
            str(Path(sys.executable).with_name("coda-slurm")),
            "predict",
            "--json",
            "-vQ",
            *argv,
            str(script),
        ]
    ).stdout
    predicted = json.loads(out)
    job_id, _ = pcluster.sbatch(["--hold", *args], script.read_text())
    fields = pcluster.show_job(job_id)
    assert predicted[f"{field}_after"] is not None
    assert predicted[f"{field}_after"] == fields[shown]
