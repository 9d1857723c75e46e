"""The Grafana dashboard against the server it is written for: Debian's ``prometheus``
scrapes every node's coda-node on a three-node cluster while a GPU job that reports its
progress runs, and every query in ``docs/grafana-coda-node.json`` returns data through
Prometheus's HTTP API (``/api/v1/query``).

A query may come back empty only where the data cannot exist here, said per query in
``EMPTY_WITHOUT``: this machine has no NVIDIA GPU (NVML), no uncore IMC counters and no
resctrl, and the throttle panel shows throttled jobs only (``> 0``). On a machine that has
the capability (``coda_node_capability_available`` says so) those queries must return data
too.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_common.store.profiles import Profile, ProfileStore
from slurm_plugin.devtools.cluster import DevCluster, NodeSpec
from tests.conftest import require_slurm, started
from tests.node.test_multinode_slurm import _multinode_reason
from tests.node.test_node_loop_slurm import LOOP_CONF, _train_script

pytestmark = [pytest.mark.slurm, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana-coda-node.json"
NODES = ("gpu01", "gpu02", "gpu03")
JOB_NODE = "gpu02"
"""Where the unknown workload (profiled online, reporting progress) runs."""
KNOWN_NODE = "gpu03"
"""Where a workload with a profile (a prediction: the predicted-cores series) runs."""
DATA_TIMEOUT_S = 60.0
MBM = "memory-bandwidth monitoring"

EMPTY_WITHOUT: dict[str, str | None] = {
    # query (as in the dashboard, $instance -> .*) -> the capability whose absence empties
    # it (coda_node_capability_available{capability=...}); None: empty by design here.
    'coda_node_job_gpu_utilization_ratio{instance=~".*"}': "GPUs (NVML)",
    'coda_node_gpu_utilization_ratio{instance=~".*"}': "GPUs (NVML)",
    'coda_node_gpu_pcie_rx_bytes_per_second{instance=~".*"}': "GPUs (NVML)",
    'coda_node_gpu_pcie_tx_bytes_per_second{instance=~".*"}': "GPUs (NVML)",
    'coda_node_memory_bandwidth_bytes_per_second{instance=~".*"}': "uncore memory bandwidth",
    'coda_node_job_memory_bandwidth_bytes_per_second{instance=~".*"}': MBM,
    # Only throttled jobs are drawn; nothing crowds the GPU job here.
    'coda_node_job_throttle_level{instance=~".*"} > 0': None,
}


def _dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return [e.replace("$instance", ".*") for e in exprs]


def _query(url: str, expr: str) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    require_slurm()
    reason = _multinode_reason()
    if reason:
        pytest.skip(reason)
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: bash scripts/setup installs Debian's package")
    root = tmp_path_factory.mktemp("prometheus")
    c = DevCluster(
        root,
        node=NodeSpec(gpus=2),
        cgroups=True,
        nodes=len(NODES),
        coda_nodes=True,
        prometheus=True,
        def_cpu_per_gpu=2,
        coda_conf_extra=LOOP_CONF,
    )
    yield from started(c)


def test_every_dashboard_query_returns_data_from_prometheus(cluster: DevCluster) -> None:
    url = cluster.prometheus_url()
    assert url is not None
    queries = _dashboard_queries()
    assert len(queries) == 20
    unknown = set(EMPTY_WITHOUT) - set(queries)
    assert not unknown, f"EMPTY_WITHOUT names queries the dashboard no longer has: {unknown}"

    # Written first: the hook sees it at its next store reload (ReloadIntervalS=1).
    written_unix_s = time.time()
    ProfileStore(cluster.profile_store).write(
        Profile(
            signature="workload:0:prom-known",
            workload="prom-known",
            cpus_per_gpu=2,
            confidence=0.95,
            n_samples=8,
            updated_unix_s=written_unix_s,
            source="test",
        )
    )

    # Every node's coda-node is a target, up, with its node label.
    def targets_up() -> dict[str, str]:
        with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=10) as resp:
            active = json.load(resp)["data"]["activeTargets"]
        return {t["labels"]["node"]: t["health"] for t in active}

    deadline = time.monotonic() + 20
    while targets_up() != dict.fromkeys(NODES, "up") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert targets_up() == dict.fromkeys(NODES, "up")
    info = _query(url, "coda_node_info")
    assert {s["metric"]["node"] for s in info} == set(NODES)

    # A GPU job of an unknown workload that reports its progress (the job series, probing,
    # events, progress), and one of a known workload (the hook's prediction).
    job_out = cluster.root / "prometheus-job.out"
    job_id, _ = cluster.sbatch(
        ["--gpus=1", "-c", "2", "-w", JOB_NODE, f"--output={job_out}", "-J", "train"],
        _train_script(cluster, loaders=1, work=2000, gpu_ms=10),
    )
    time.sleep(max(0.0, written_unix_s + 2.0 - time.time()))  # a reload past the write
    known_out = cluster.root / "prometheus-known.out"
    known_id, _ = cluster.sbatch(
        [
            "--gpus=1",
            "-w",
            KNOWN_NODE,
            f"--output={known_out}",
            "--comment=coda:workload=prom-known",
        ],
        "#!/bin/sh\nsleep 300\n",
    )

    assert "src=profile" in cluster.show_job(known_id)["AdminComment"]

    caps = {
        s["metric"]["capability"]: s["value"][1] == "1"
        for s in _query(url, "max by (capability) (coda_node_capability_available)")
    }
    expected_empty = {
        q for q, cap in EMPTY_WITHOUT.items() if cap is None or not caps.get(cap, False)
    }
    results: dict[str, list[dict]] = {}
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while True:
        results = {q: _query(url, q) for q in queries}
        missing = {q for q, r in results.items() if not r} - expected_empty
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not missing, f"no data for {sorted(missing)} (capabilities: {caps})"
    jobs = _query(url, f'coda_node_job_allocated_cores{{job_id="{job_id}"}}')
    assert [s["metric"]["node"] for s in jobs] == [JOB_NODE]
    gpu_jobs = _query(url, 'sum by (node) (coda_node_jobs{kind="dnn"})')
    assert {s["metric"]["node"]: float(s["value"][1]) for s in gpu_jobs} == {
        "gpu01": 0.0,
        "gpu02": 1.0,
        "gpu03": 1.0,
    }
