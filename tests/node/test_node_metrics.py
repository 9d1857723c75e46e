"""coda-node's Prometheus endpoint, scraped from a daemon running on the fixture node, and
the Grafana dashboard that reads it."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from coda_common.config.codaconf import CodaConfig, load_config, parse_config
from coda_common.slurm.conffile import ConfigError
from coda_node.cli import cli
from coda_node.daemon.service import Daemon
from coda_node.enforce.state import Limit
from coda_node.status.metrics import METRIC_NAMES
from coda_node.system.nvml import Nvml
from tests.node.node_fixtures import FakeNode, build_node

DOCS = Path(__file__).resolve().parents[2] / "docs"
DNN, CPU = 5001, 5002

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> tuple[set[str], Samples]:
    """(metric family names, {(sample name, sorted labels): value}) of the live endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families, samples = set(), {}
    for family in text_string_to_metric_families(text):
        families.add(family.name + ("_total" if family.type == "counter" else ""))
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def _job(name: str, job_id: int, user: str, kind: str, **extra: str) -> tuple[str, tuple]:
    labels = {"job_id": str(job_id), "user": user, "kind": kind, **extra}
    return name, tuple(sorted(labels.items()))


class Running:
    """A daemon running its loop (``Daemon.run``) on a fixture node, in a thread."""

    def __init__(self, node: FakeNode, cfg: CodaConfig) -> None:
        self.node = node
        self.daemon = Daemon(
            cfg,
            runner=node.slurm,
            nvml=Nvml(lib=node.nvml_lib),
            cpuset_writer=node.cpuset_writer,
            quota_writer=node.quota_writer,
        )
        self.daemon.start()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.daemon.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def wait_ticks(self, n: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        start = self.daemon.ticks_total
        while self.daemon.ticks_total < start + n:
            assert time.monotonic() < deadline, "the daemon did not tick"
            time.sleep(0.05)


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    node = build_node(tmp_path, jobs=4)
    conf = node.coda_conf.read_text().replace("NodeIntervalS=5\n", "NodeIntervalS=0.1\n")
    node.coda_conf.write_text(conf)
    return node


@pytest.fixture
def metrics_port() -> int:
    return _free_port()


@pytest.fixture
def running(node: FakeNode, metrics_port: int) -> Iterator[Running]:
    cfg = replace(load_config(node.coda_conf), node_metrics_port=metrics_port)
    with Running(node, cfg) as r:
        r.wait_ticks(1)
        node.set_limits({CPU: Limit(quota_cores=2.5, reason="admin: noisy ETL")})
        r.wait_ticks(2)
        yield r


def test_the_endpoint_reports_what_status_reports(running: Running, metrics_port: int) -> None:
    families, samples = _scrape(metrics_port)
    # Every metric the exporter declares is there, and nothing else under coda_node_.
    assert {f for f in families if f.startswith("coda_node_")} == set(METRIC_NAMES)
    status = CliRunner().invoke(cli, ["status", "--json", "--conf", str(running.node.coda_conf)])
    assert status.exit_code == 0, status.output
    doc = json.loads(status.output)
    jobs = {j["job_id"]: j for j in doc["jobs"]}

    # Per job: the numbers of `coda-node status --json`, labelled job_id/user/kind.
    dnn = ("alice", "dnn")
    assert jobs[DNN]["cores_allocated"] == 24 and jobs[DNN]["cores_predicted"] == 24
    assert samples[_job("coda_node_job_allocated_cores", DNN, *dnn)] == 24
    assert samples[_job("coda_node_job_predicted_cores", DNN, *dnn)] == 24
    assert samples[_job("coda_node_job_in_force_cores", DNN, *dnn)] == 24
    assert samples[_job("coda_node_job_gpu_utilization_ratio", DNN, *dnn)] == pytest.approx(
        jobs[DNN]["gpu_util_pct"] / 100
    )
    cpu = ("bob", "cpu")
    assert samples[_job("coda_node_job_allocated_cores", CPU, *cpu)] == 8
    assert jobs[CPU]["cores_in_force"] == 2.5
    assert samples[_job("coda_node_job_in_force_cores", CPU, *cpu)] == 2.5
    assert samples[_job("coda_node_job_throttle_level", CPU, *cpu)] == 0
    assert _job("coda_node_job_predicted_cores", CPU, *cpu) not in samples  # no prediction
    assert samples[_job("coda_node_job_profile_state", DNN, *dnn, state="known")] == 1
    # Per node.
    assert samples[("coda_node_cores", ())] == 64
    assert samples[("coda_node_jobs", (("kind", "dnn"),))] == 2
    assert samples[("coda_node_jobs", (("kind", "cpu"),))] == 2
    assert samples[("coda_node_jobs_throttled", ())] == 0
    assert samples[("coda_node_jobs_probing", ())] == 0
    gpu2 = (("gpu", "2"), ("model", "NVIDIA A100-SXM4-80GB"))
    assert samples[("coda_node_gpu_utilization_ratio", gpu2)] == pytest.approx(0.3)
    assert samples[("coda_node_gpu_pcie_rx_bytes_per_second", (("gpu", "2"),))] == 2_048_000
    assert samples[("coda_node_capability_available", (("capability", "CPU quota"),))] == 1
    rdt = (("capability", "memory-bandwidth control"),)
    assert samples[("coda_node_capability_available", rdt)] == 0
    # Counters: since the daemon started, not just the events the view keeps.
    assert samples[("coda_node_events_total", (("action", "quota"),))] == 1
    assert samples[("coda_node_ticks_total", ())] >= 3
    assert samples[("coda_node_tick_errors_total", ())] == 0
    assert time.time() - samples[("coda_node_last_tick_timestamp_seconds", ())] < 5
    # The status screen names the endpoint.
    assert doc["daemon"]["metrics"] == f"http://127.0.0.1:{metrics_port}/metrics"


def test_a_scrape_between_ticks_sees_the_counters_as_of_now(
    running: Running, metrics_port: int
) -> None:
    _, before = _scrape(metrics_port)
    running.wait_ticks(3)
    _, after = _scrape(metrics_port)
    assert after[("coda_node_ticks_total", ())] >= before[("coda_node_ticks_total", ())] + 3


def test_the_endpoint_listens_on_localhost_only_and_goes_with_the_daemon(
    node: FakeNode, metrics_port: int
) -> None:
    cfg = replace(load_config(node.coda_conf), node_metrics_port=metrics_port)
    with Running(node, cfg) as r:
        r.wait_ticks(1)
        assert r.daemon.metrics_server is not None
        assert r.daemon.metrics_server.address == ("127.0.0.1", metrics_port)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", metrics_port), 2):
        pass


def test_off_by_default(node: FakeNode) -> None:
    assert CodaConfig().node_metrics_port == 0
    assert CodaConfig().node_metrics_address == "127.0.0.1"
    with Running(node, load_config(node.coda_conf)) as r:
        r.wait_ticks(2)
        assert r.daemon.metrics_server is None
        assert r.daemon.state.view["daemon"]["metrics"] == "off (NodeMetricsPort=0)"


def test_a_port_in_use_is_reported_and_the_daemon_goes_on(
    node: FakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = replace(load_config(node.coda_conf), node_metrics_port=port)
        with Running(node, cfg) as r:
            r.wait_ticks(2)
            said = r.daemon.state.view["daemon"]["metrics"]
    assert said.startswith(f"failed: cannot listen on 127.0.0.1:{port} (Address already in use")
    assert f"metrics: {said}" in caplog.text


def test_the_coda_conf_keys_are_checked() -> None:
    cfg, _ = parse_config("NodeMetricsPort=9464\nNodeMetricsAddress=::\n")
    assert (cfg.node_metrics_port, cfg.node_metrics_address) == (9464, "::")
    for bad in ("NodeMetricsPort=65536", "NodeMetricsPort=-1", "NodeMetricsAddress=gpu01"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            parse_config(bad + "\n")


# --------------------------------------------------------------------------------------------
# The Grafana dashboard


def test_the_dashboard_queries_only_metrics_the_exporter_emits(
    running: Running, metrics_port: int
) -> None:
    dashboard = json.loads((DOCS / "grafana-coda-node.json").read_text())
    exprs = [
        t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", []) if "expr" in t
    ]
    queries = [v["query"] for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    used = {m for e in exprs + [str(q) for q in queries] for m in re.findall(r"coda_node_\w+", e)}
    families, _ = _scrape(metrics_port)
    assert used and used <= families, used - families
    # The panels the issue names are there.
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "GPU utilisation per job",
        "Throttle level per job",
        "Cores allocated, predicted and in force",
        "Events per second by action",
    ):
        assert wanted in titles


def test_status_says_what_a_hold_is_priced_at_and_why(node: FakeNode) -> None:
    """The price follows the GRES slurm.conf gives this node for MemBwSpreadGres."""
    with Running(node, load_config(node.coda_conf)) as r:
        r.wait_ticks(2)
        packed = r.daemon.state.view["daemon"]["contention"]
    assert packed == "on (a hold priced at 14 cores a GPU, CPU jobs not spread)"
    slurm_conf = node.etc / "slurm.conf"
    text = slurm_conf.read_text().replace("GresTypes=gpu\n", "GresTypes=gpu,membw\n")
    slurm_conf.write_text(re.sub(r"( Gres=\S+)", r"\1,membw:200", text, count=1))
    node.coda_conf.write_text(node.coda_conf.read_text() + "MemBwSpreadGres=membw\n")
    with Running(node, load_config(node.coda_conf)) as r:
        r.wait_ticks(2)
        spread = r.daemon.state.view["daemon"]["contention"]
    assert spread == (
        "on (a hold priced at 10 cores a GPU, membw spreads memory-bound CPU jobs here (gpu,cpu))"
    )
