"""The daemons of a dev cluster and how they are started: munged, one slurmd per node (in
its network namespace on a multi-node cluster), one coda-node per node, and Prometheus;
each in its own session, its output in the cluster's ``log`` folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from slurm_plugin.devtools.layout import (
    CTLD_ENV,
    NODE_NAME,
    START_TIMEOUT_S,
    ClusterLayout,
    DevClusterError,
)
from slurm_plugin.devtools.network import NETNS_PREFIX
from slurm_plugin.devtools.procs import pid_alive

__all__ = ["Daemons"]

_SET_HOSTNAME_AND_EXEC = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
)


class Daemons:
    """Starts the daemons of the cluster ``c`` describes; each ``start_*`` returns pids."""

    def __init__(self, c: ClusterLayout, prometheus_port: int | None = None) -> None:
        self.c = c
        self.prometheus_port = prometheus_port

    def start_slurmds(self) -> dict[str, int]:
        """One slurmd per node; their pids by the name the state file keeps."""
        if not self.c.networked:
            pid = self.spawn(
                ["slurmd", "-D", "-f", str(self.c.slurm_conf), "-N", NODE_NAME],
                self.c.root / "log" / "slurmd.stderr",
            )
            return {"slurmd": pid}
        pids: dict[str, int] = {}
        for name in self.c.node_names:
            # nsenter execs slurmd in the node's network namespace only: the mounts
            # (the cgroup hierarchies under /sys) stay the host's, which `ip netns
            # exec` would replace with a fresh sysfs.
            pids[f"slurmd-{name}"] = self.spawn(
                [
                    "nsenter",
                    f"--net=/run/netns/{NETNS_PREFIX}{name}",
                    "slurmd",
                    "-D",
                    "-f",
                    str(self.c.slurm_conf),
                    "-N",
                    name,
                ],
                self.c.root / "log" / f"slurmd-{name}.stderr",
            )
        return pids

    def start_slurmctld(self, name: str) -> int:
        """Controller ``name`` of a high-availability cluster: in its own network namespace
        and UTS namespace, whose host name is ``name`` (slurmctld knows which SlurmctldHost
        it is by its host name alone: ``_controller_index`` in src/slurmctld/controller.c),
        with its own slurm.conf (pid and log file); ``CTLD_ENV`` names it in its
        environment, which the process ``scontrol reconfigure`` starts from Slurm 23.11 on
        inherits."""
        return self.spawn(
            [
                "nsenter",
                f"--net=/run/netns/{NETNS_PREFIX}{name}",
                "unshare",
                "--uts",
                sys.executable,
                "-c",
                _SET_HOSTNAME_AND_EXEC,
                name,
                "slurmctld",
                "-D",
                "-f",
                str(self.c.ctld_conf_of(name)),
            ],
            self.c.root / "log" / f"slurmctld-{name}.stderr",
            extra_env={**self.c.ctld_env, CTLD_ENV: name},
        )

    def start_coda_nodes(self) -> dict[str, int]:
        """One ``coda-node run`` per node with its node's coda.conf; pids by name."""
        pids: dict[str, int] = {}
        for name in self.c.node_names:
            for d in (self.c.node_state_dir_of(name), self.c.node_runtime_dir_of(name)):
                d.mkdir(parents=True, exist_ok=True)
            pids[f"coda-node-{name}"] = self.spawn(
                [
                    sys.executable,
                    "-m",
                    "coda_node.cli",
                    "run",
                    "--conf",
                    str(self.c.node_coda_conf(name)),
                ],
                self.c.root / "log" / f"coda-node-{name}.log",
            )
        return pids

    def start_prometheus(self, metrics_ports: Mapping[str, int]) -> int:
        """Debian's prometheus with its own config and data under the root, scraping each
        node's coda-node (label ``node``); returns its pid once it answers ``/-/ready``."""
        d = self.c.prometheus_dir
        (d / "data").mkdir(parents=True, exist_ok=True)
        targets = "".join(
            f"      - targets: ['127.0.0.1:{port}']\n        labels: {{node: {name}}}\n"
            for name, port in metrics_ports.items()
        )
        (d / "prometheus.yml").write_text(
            "# Written by coda dev-cluster: every node's coda-node.\n"
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: coda-node\n    static_configs:\n{targets}"
        )
        url = f"http://127.0.0.1:{self.prometheus_port}"
        pid = self.spawn(
            [
                "prometheus",
                f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                f"--web.external-url={url}",
            ],
            self.c.root / "log" / "prometheus.log",
        )

        def ready() -> bool:
            if not pid_alive(pid):
                raise DevClusterError(
                    "prometheus exited", f"see {self.c.root / 'log' / 'prometheus.log'}"
                )
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        self.wait_for(ready, "prometheus to be ready")
        return pid

    def start_munged(self) -> int:
        key = self.c.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        pid_file = self.c.root / "munge" / "munged.pid"
        # --force: we run as root with the socket outside /run/munge.
        subprocess.run(
            [
                "munged",
                f"--socket={self.c.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={pid_file}",
                f"--log-file={self.c.root / 'log' / 'munged.log'}",
                f"--seed-file={self.c.root / 'munge' / 'munged.seed'}",
                "--force",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        return int(pid_file.read_text().strip())

    def spawn(
        self, argv: list[str], stderr_path: Path, extra_env: Mapping[str, str] | None = None
    ) -> int:
        env = {**self.c.env, **(extra_env or {})}
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                cwd=self.c.root,
            )
        return proc.pid

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        """Return once ``predicate()`` holds; DevClusterError after START_TIMEOUT_S."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise DevClusterError(
            f"timed out waiting for {what}",
            f"see {self.c.ctld_log} and {self.c.root / 'log'}",
        )
