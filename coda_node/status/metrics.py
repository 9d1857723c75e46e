"""coda-node's Prometheus endpoint (``NodeMetricsPort``; off by default, on 127.0.0.1).

One custom collector turns the daemon's latest view into metrics on each scrape, through
the same :func:`coda_node.status.document.build_status` that ``coda-node status`` uses, so the
screen, ``--json`` and Prometheus show the same numbers and nothing is counted twice
(prometheus_client's "custom collectors" pattern: https://prometheus.github.io/
client_python/collector/custom/). Names follow Prometheus' conventions: ``coda_node_``
prefix, base units in the name (``_bytes_per_second``, ``_cores``, ``_ratio``,
``_seconds``), counters ending in ``_total``.

Cardinality: per-job series carry ``job_id``, ``user`` and ``kind``; a node runs tens of
jobs at most, and a job's series end with the job. The job-end counters (what the jobs that
ended here added up to since the daemon started, from their summaries) carry ``user`` and
``account`` only, at most 500 pairs (the daemon counts later pairs under ``other``).
Label values are escaped by prometheus_client's exposition; a value longer than
:data:`MAX_LABEL_CHARS` or not printable is shown as ``unknown``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from coda_node.status.document import build_status

JOB_LABELS = ("job_id", "user", "kind")
JOB_END_LABELS = ("user", "account")
MAX_LABEL_CHARS = 128

METRIC_NAMES = (
    # per node
    "coda_node_info",
    "coda_node_cores",
    "coda_node_gpu_utilization_ratio",
    "coda_node_gpu_pcie_rx_bytes_per_second",
    "coda_node_gpu_pcie_tx_bytes_per_second",
    "coda_node_memory_bandwidth_bytes_per_second",
    "coda_node_pcie_bandwidth_bytes_per_second",
    "coda_node_capability_available",
    "coda_node_jobs",
    "coda_node_jobs_throttled",
    "coda_node_jobs_probing",
    "coda_node_last_tick_timestamp_seconds",
    "coda_node_tick_cpu_seconds",
    # per job
    "coda_node_job_allocated_cores",
    "coda_node_job_predicted_cores",
    "coda_node_job_in_force_cores",
    "coda_node_job_cpu_usage_cores",
    "coda_node_job_gpu_utilization_ratio",
    "coda_node_job_progress_iterations_per_second",
    "coda_node_job_memory_bandwidth_bytes_per_second",
    "coda_node_job_pcie_bytes_per_second",
    "coda_node_job_throttle_level",
    "coda_node_job_profile_state",
    # counters (exposed with a _total suffix)
    "coda_node_events_total",
    "coda_node_ticks_total",
    "coda_node_tick_errors_total",
    # job-end counters, by user and account
    "coda_node_jobs_ended_total",
    "coda_node_jobs_ended_gpu_seconds_total",
    "coda_node_jobs_ended_gpu_wait_seconds_total",
    "coda_node_jobs_ended_idle_core_seconds_total",
    "coda_node_jobs_ended_probe_seconds_total",
    "coda_node_jobs_ended_throttled_seconds_total",
)
"""Every metric family the exporter emits (the Grafana dashboard may use only these)."""


class StatusCollector(Collector):
    """Metrics built from ``view()`` (the daemon's view with its counters) on each scrape."""

    def __init__(self, view: Callable[[], Mapping[str, Any]], interval_s: float) -> None:
        self._view = view
        self._interval_s = interval_s

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        doc = build_status(
            view,
            state_path="(daemon memory)",
            written_unix_s=view.get("sampled_unix_s"),
            format_version=None,
            now_unix_s=time.time(),
            interval_s=self._interval_s,
        )
        yield from _node_metrics(doc)
        yield from _job_metrics(doc)
        yield from _counters(doc)
        yield from _job_end_counters(view.get("job_end"))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _node_metrics(doc: Mapping[str, Any]) -> Iterator[Metric]:
    daemon, node = doc["daemon"], doc["node"]
    info = _gauge("coda_node_info", "coda-node on this node (value 1).", ("node", "version"))
    info.add_metric([daemon["node_name"] or "", daemon["version"] or ""], 1.0)
    yield info
    if node["cores"] is not None:
        yield GaugeMetricFamily("coda_node_cores", "CPU cores online.", value=node["cores"])
    yield from _gpu_metrics(node)
    yield from _socket_metrics(node)
    caps = _gauge(
        "coda_node_capability_available",
        "1 when the capability is usable here (coda-node check), else 0.",
        ("capability",),
    )
    for c in node["capabilities"]:
        caps.add_metric([c["name"]], 1.0 if c["available"] else 0.0)
    yield caps
    yield from _job_and_tick_metrics(doc)


def _gpu_metrics(node: Mapping[str, Any]) -> Iterator[Metric]:
    """Per-GPU utilisation and PCIe rates, as NVML reports them."""
    util = _gauge(
        "coda_node_gpu_utilization_ratio", "GPU utilisation (NVML), 0..1.", ("gpu", "model")
    )
    rx = _gauge(
        "coda_node_gpu_pcie_rx_bytes_per_second", "PCIe receive rate of a GPU (NVML).", ("gpu",)
    )
    tx = _gauge(
        "coda_node_gpu_pcie_tx_bytes_per_second", "PCIe transmit rate of a GPU (NVML).", ("gpu",)
    )
    for g in node["gpus"]:
        gpu = str(g["index"])
        if g["util_pct"] is not None:
            util.add_metric([gpu, g["name"] or ""], g["util_pct"] / 100.0)
        if g["pcie_rx_bytes_per_s"] is not None:
            rx.add_metric([gpu], g["pcie_rx_bytes_per_s"])
        if g["pcie_tx_bytes_per_s"] is not None:
            tx.add_metric([gpu], g["pcie_tx_bytes_per_s"])
    yield from (util, rx, tx)


def _socket_metrics(node: Mapping[str, Any]) -> Iterator[Metric]:
    """Per-socket DRAM and PCIe traffic from the uncore counters."""
    bw = _gauge(
        "coda_node_memory_bandwidth_bytes_per_second",
        "DRAM traffic of a socket, read + write (uncore IMC counters).",
        ("socket",),
    )
    for m in node["mem_bw"]:
        if m["bytes_per_s"] is not None:
            bw.add_metric([str(m["socket"])], m["bytes_per_s"])
    yield bw
    pcie = _gauge(
        "coda_node_pcie_bandwidth_bytes_per_second",
        "PCIe traffic of a socket: in (devices to the socket) or out (uncore IIO counters).",
        ("socket", "direction"),
    )
    for p in node.get("pcie_bw") or []:
        for direction in ("in", "out"):
            value = p.get(f"{direction}_bytes_per_s")
            if value is not None:
                pcie.add_metric([str(p["socket"]), direction], value)
    yield pcie


def _job_and_tick_metrics(doc: Mapping[str, Any]) -> Iterator[Metric]:
    """Job counts (by kind, throttled, probing) and the daemon's last tick."""
    daemon, jobs = doc["daemon"], doc["jobs"]
    by_kind = _gauge("coda_node_jobs", "Jobs on the node, by kind.", ("kind",))
    for kind in ("dnn", "cpu", "unknown"):
        by_kind.add_metric([kind], float(sum(1 for j in jobs if j["kind"] == kind)))
    yield by_kind
    yield GaugeMetricFamily(
        "coda_node_jobs_throttled",
        "CPU jobs throttled now (contention elimination).",
        value=sum(1 for j in jobs if j["throttle_level"] > 0),
    )
    yield GaugeMetricFamily(
        "coda_node_jobs_probing",
        "GPU jobs being probed now (online profiling).",
        value=sum(1 for j in jobs if j["profile_state"] == "probing"),
    )
    if doc["state"]["written_unix_s"] is not None:
        yield GaugeMetricFamily(
            "coda_node_last_tick_timestamp_seconds",
            "Unix time of the daemon's last sample.",
            value=doc["state"]["written_unix_s"],
        )
    if daemon["tick_cpu_s"] is not None:
        yield GaugeMetricFamily(
            "coda_node_tick_cpu_seconds",
            "CPU time the daemon's last tick took.",
            value=daemon["tick_cpu_s"],
        )


_JOB_GAUGES = (
    # (metric, help, field of the status document's job, scale)
    ("coda_node_job_allocated_cores", "Cores Slurm allocated to the job.", "cores_allocated", 1.0),
    (
        "coda_node_job_predicted_cores",
        "Cores the submit hook predicted (cores per GPU x GPUs on the node).",
        "cores_predicted",
        1.0,
    ),
    (
        "coda_node_job_in_force_cores",
        "Cores the job may use now: its cpuset, or its CPU quota when lower.",
        "cores_in_force",
        1.0,
    ),
    ("coda_node_job_cpu_usage_cores", "CPU the job used, in cores.", "cpu_rate_cores", 1.0),
    (
        "coda_node_job_gpu_utilization_ratio",
        "Mean utilisation of the job's GPUs, 0..1.",
        "gpu_util_pct",
        0.01,
    ),
    (
        "coda_node_job_memory_bandwidth_bytes_per_second",
        "The job's memory bandwidth (resctrl MBM), where measured.",
        "mem_bw_bytes_per_s",
        1.0,
    ),
    (
        "coda_node_job_pcie_bytes_per_second",
        "PCIe traffic of the job's GPUs, rx + tx.",
        "pcie_bytes_per_s",
        1.0,
    ),
    (
        "coda_node_job_throttle_level",
        "Steps the job is throttled down (MBA, then L3 ways, then CPU quota); 0 = not throttled.",
        "throttle_level",
        1.0,
    ),
)


def _job_metrics(doc: Mapping[str, Any]) -> Iterator[Metric]:
    jobs = doc["jobs"]
    for name, help_text, key, scale in _JOB_GAUGES:
        g = _gauge(name, help_text, JOB_LABELS)
        for j in jobs:
            if j[key] is not None:
                g.add_metric(_job_labels(j), float(j[key]) * scale)
        yield g
    rate = _gauge(
        "coda_node_job_progress_iterations_per_second",
        "Training iterations per second the job reports (progress file).",
        JOB_LABELS,
    )
    for j in jobs:
        p = j["progress"]
        if p and p["source"] == "iterations" and p["rate"] is not None:
            rate.add_metric(_job_labels(j), p["rate"])
    yield rate
    state = _gauge(
        "coda_node_job_profile_state",
        "1 for the job's profile state (known, waiting, probing, probed, confident, skipped).",
        (*JOB_LABELS, "state"),
    )
    for j in jobs:
        if j["profile_state"] is not None:
            state.add_metric([*_job_labels(j), j["profile_state"]], 1.0)
    yield state


def _job_labels(j: Mapping[str, Any]) -> list[str]:
    return [str(j["job_id"]), j["user"] or "", j["kind"]]


def _counters(doc: Mapping[str, Any]) -> Iterator[Metric]:
    daemon = doc["daemon"]
    events = CounterMetricFamily(
        "coda_node_events", "Decisions and changes since the daemon started.", labels=["action"]
    )
    for action, n in sorted(daemon["events_total"].items()):
        events.add_metric([action], float(n))
    yield events
    if daemon["ticks_total"] is not None:
        yield CounterMetricFamily(
            "coda_node_ticks", "Ticks since the daemon started.", value=daemon["ticks_total"]
        )
    if daemon["tick_errors_total"] is not None:
        yield CounterMetricFamily(
            "coda_node_tick_errors",
            "Ticks that failed (logged) since the daemon started.",
            value=daemon["tick_errors_total"],
        )


_JOB_END_COUNTERS = (
    # (metric, help, field of a job-end row)
    (
        "coda_node_jobs_ended_gpu_seconds",
        "GPU-seconds of the GPU jobs that ended here (GPUs x time coda-node sampled them).",
        "gpu_s",
    ),
    (
        "coda_node_jobs_ended_gpu_wait_seconds",
        "GPU-seconds the ended jobs' GPUs waited on their CPUs (under 80 % busy while the "
        "job used 90 % or more of its cores).",
        "gpu_wait_s",
    ),
    (
        "coda_node_jobs_ended_idle_core_seconds",
        "Core-seconds the ended GPU jobs held but did not use.",
        "idle_core_s",
    ),
    ("coda_node_jobs_ended_probe_seconds", "Seconds the ended jobs were probed.", "probe_s"),
    (
        "coda_node_jobs_ended_throttled_seconds",
        "Seconds the ended CPU jobs were throttled.",
        "throttled_s",
    ),
)


def _label(value: object) -> str:
    """A label value from a name someone chose: printable, bounded, else ``unknown``."""
    if isinstance(value, str) and value and len(value) <= MAX_LABEL_CHARS and value.isprintable():
        return value
    return "unknown"


def _job_end_counters(rows: object) -> Iterator[Metric]:
    """The job-end counters from the daemon's rows (SummaryRecorder's JobEndCounters)."""
    rows = rows if isinstance(rows, list) else []
    ended = CounterMetricFamily(
        "coda_node_jobs_ended",
        "Jobs that ended here and got a summary, since the daemon started.",
        labels=[*JOB_END_LABELS, "kind"],
    )
    families = [
        (CounterMetricFamily(name, help_text, labels=list(JOB_END_LABELS)), key)
        for name, help_text, key in _JOB_END_COUNTERS
    ]
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        labels = [_label(row.get("user")), _label(row.get("account"))]
        for kind, n in sorted((row.get("jobs") or {}).items()):
            ended.add_metric([*labels, _label(kind)], float(n))
        for family, key in families:
            value = row.get(key)
            if isinstance(value, int | float):
                family.add_metric(labels, float(value))
    yield ended
    for family, _key in families:
        yield family


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on the daemon's stderr (the journal)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape; daemon threads, so a stuck scraper never holds up an exit."""

    daemon_threads = True


class MetricsServer:
    """The HTTP server thread serving ``/metrics``."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(
    view: Callable[[], Mapping[str, Any]], port: int, address: str, *, interval_s: float = 1.0
) -> MetricsServer:
    """Serve the metrics of ``view()`` on ``address:port`` (port 0: any free port).
    Raises OSError when the address cannot be bound.

    The server is built here from prometheus_client's WSGI app, as its own
    ``start_http_server`` does, because that function returns the server only from
    prometheus_client 0.17 on and Debian 12 ships 0.16."""
    registry = CollectorRegistry()
    registry.register(StatusCollector(view, interval_s))
    # An IPv6 address needs an AF_INET6 socket; the class attribute is what
    # socketserver reads, so each server gets its own subclass.
    family, _, _, _, sockaddr = socket.getaddrinfo(address, port)[0]

    class _Server(_ThreadingServer):
        address_family = family

    server = make_server(
        sockaddr[0], port, make_wsgi_app(registry), _Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name="coda-node-metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)
