"""The daemon's Prometheus endpoint (NodeMetricsPort): started by ``coda-node run`` only,
and the words the view shows for it. A port that cannot be bound is logged and shown; the
daemon goes on without metrics (they observe, the daemon enforces)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coda_common.config.codaconf import CodaConfig

if TYPE_CHECKING:
    from coda_node.status.metrics import MetricsServer

log = logging.getLogger("coda-node")


class MetricsEndpoint:
    """The metrics server, if one is up, and its state in words for the view."""

    def __init__(self, cfg: CodaConfig, view: Callable[[], dict[str, Any]]) -> None:
        self.cfg = cfg
        self._view = view
        self.server: MetricsServer | None = None
        self.state = (
            "off (NodeMetricsPort=0)"
            if not cfg.node_metrics_port
            else "not served (only `coda-node run` serves it)"
        )

    def serve(self) -> tuple[str, int] | None:
        """Start the endpoint when NodeMetricsPort is set; the address it listens on, or
        None."""
        port = self.cfg.node_metrics_port
        if not port or self.server is not None:
            return self.server.address if self.server else None
        from coda_node.status.metrics import start_metrics_server

        addr = self.cfg.node_metrics_address
        try:
            self.server = start_metrics_server(
                self._view, port, addr, interval_s=self.cfg.node_interval_s
            )
        except OSError as exc:
            self.state = f"failed: cannot listen on {addr}:{port} ({exc.strerror or exc})"
            log.error("metrics: %s", self.state)
            return None
        host, bound = self.server.address
        self.state = f"http://{host}:{bound}/metrics"
        log.info("metrics: %s", self.state)
        return self.server.address

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
