"""What a dev cluster is made of and where its files and nodes are: its settings, the
folders and files under its root, its nodes' names and addresses, and the environment
Slurm's clients need to reach it (:class:`slurm_plugin.devtools.cluster.DevCluster` starts
it)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from slurm_plugin.devtools.accounting import DevAccounting

NODE_NAME = "gpu01"
"""The first node's name; a one-node cluster's only node."""
NETWORK_PREFIX = "10.77.0"
CTLD_ADDR = f"{NETWORK_PREFIX}.1"
"""The bridge's address in the host's namespace: slurmctld as the nodes reach it."""
CTLD_ADDR_OFFSET = 2
"""A high-availability cluster's controller i (from 0) has 10.77.0.(2+i); nodes start at .11."""
CTLD_ENV = "CODA_DEV_SLURMCTLD"
"""In a high-availability cluster's slurmctld environment: the controller's name."""
STATE_FILE = "cluster.json"
# Slurm's daemons keep their own idea of time-outs; these bound our waiting only.
START_TIMEOUT_S = 30.0


class DevClusterError(RuntimeError):
    """The local cluster could not be started, queried or stopped; says why."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Shape of the fake GPU node (CPUs may exceed the host's: config_overrides)."""

    cpus: int = 32
    sockets: int = 2
    threads_per_core: int = 1
    """Hardware threads per core: ``cpus`` counts threads, as slurm.conf's ``CPUs=`` does."""
    gpus: int = 4
    gpu_type: str = "a100"
    real_memory_mb: int = 64000
    extra_gres: str = ""
    """More count-only GRES on the node, e.g. ``pcie:1`` (added to GresTypes too)."""
    features: str = ""
    """The node's ``Feature=`` list, e.g. ``gpu_a100,nvme``; empty = none."""
    restricted_cores_per_gpu: int = 0
    """The node's ``RestrictedCoresPerGPU`` (Slurm 24.05 on; 22.05's slurmctld refuses the
    key); 0 = not written."""


def node_names(nodes: int) -> list[str]:
    """The dev cluster's node names: gpu01, gpu02, ..."""
    return [f"gpu{i:02d}" for i in range(1, nodes + 1)]


def controller_names(controllers: int) -> list[str]:
    """A high-availability dev cluster's controller names, primary first: ctl1, ctl2, ..."""
    return [f"ctl{i}" for i in range(1, controllers + 1)]


@dataclass(slots=True)
class ClusterLayout:
    """A dev cluster's settings and the places they put things."""

    root: Path
    node: NodeSpec = field(default_factory=NodeSpec)
    job_submit_plugins: str = "coda"
    def_cpu_per_gpu: int | None = 4
    coda_conf_extra: str = ""
    ctld_env: dict[str, str] = field(default_factory=dict)
    """Extra environment for slurmctld and ``ctld_pre_exec`` only (fault-injection tests)."""
    plugin_file: Path | None = None
    """The job_submit_coda.so ``up`` installs; None = the one built with the package."""
    ctld_pre_exec: tuple[str, ...] = ()
    """A command run just before slurmctld starts, as systemd's ``ExecStartPre=-``: its
    exit status is ignored, its output goes to ``log/slurmctld-pre.log``."""
    extra_partitions: str = ""
    """More ``PartitionName=`` lines over the node (e.g. one with ``OverSubscribe=FORCE``)."""
    slurm_conf_extra: str = ""
    """More slurm.conf lines, before the node and partition lines (e.g. a site's
    ``EpilogSlurmctld=``)."""
    cgroups: bool = False
    """Real cgroup confinement (proctrack/cgroup, task/cgroup+affinity, ConstrainCores):
    the node then declares this host's real CPUs so Slurm's cpusets are not folded."""
    accounting: bool = False
    """slurmdbd on a private MariaDB (slurm_plugin.devtools.accounting): sacct, GPU TRES."""
    nodes: int = 1
    """GPU nodes: 1 on 127.0.0.1, or more, each in its own network namespace."""
    coda_nodes: bool = False
    """Also start one ``coda-node run`` per node (with its node's coda.conf)."""
    prometheus: bool = False
    """Each coda-node serves ``/metrics`` (``NodeMetricsPort``, a free port on 127.0.0.1:
    the daemons run in the host's namespace) and Debian's ``prometheus`` scrapes them every
    second (``prometheus/`` under the root: its config and data; web on 127.0.0.1)."""
    controllers: int = 1
    """slurmctlds: 1 in the host's namespaces, or a primary and backups (``SlurmctldHost``
    listed once each), each in its own network and UTS namespace with its own host name
    (ctl1, ctl2, ...) and address, sharing StateSaveLocation, coda.conf and the store."""
    ctld_timeout_s: int = 30
    """slurm.conf's ``SlurmctldTimeout``: how long a backup waits for a silent primary."""

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def coda_conf(self) -> Path:
        return self.etc / "coda.conf"

    @property
    def profile_store(self) -> Path:
        return self.root / "profiles"

    @property
    def hook_stats_file(self) -> Path:
        return self.root / "hook-stats.json"

    @property
    def decision_journal(self) -> Path:
        return self.root / "decisions.jsonl"

    @property
    def node_state_dir(self) -> Path:
        return self.root / "coda-node"

    @property
    def node_runtime_dir(self) -> Path:
        return self.root / "coda-node-run"

    @property
    def progress_dir(self) -> Path:
        return self.root / "progress"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def ctld_log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    @property
    def ctld_stderr(self) -> Path:
        return self.root / "log" / "slurmctld.stderr"

    @property
    def node_names(self) -> list[str]:
        return node_names(self.nodes)

    @property
    def controller_names(self) -> list[str]:
        """The controllers of a high-availability cluster, primary first; none else."""
        return controller_names(self.controllers) if self.controllers > 1 else []

    @property
    def networked(self) -> bool:
        """Whether the daemons live in network namespaces on the bridge (10.77.0.0/24)."""
        return self.nodes > 1 or self.controllers > 1

    def ctld_addr(self, name: str) -> str:
        """The address controller ``name`` of a high-availability cluster listens on."""
        return f"{NETWORK_PREFIX}.{CTLD_ADDR_OFFSET + self.controller_names.index(name)}"

    def ctld_log_of(self, name: str) -> Path:
        """Controller ``name``'s own log."""
        return self.root / "log" / f"slurmctld-{name}.log"

    def ctld_conf_of(self, name: str) -> Path:
        """The slurm.conf controller ``name`` runs with: the cluster's, but for its own pid
        and log files, which on real hosts are the same paths on two disks (a slurmctld
        kills the process its SlurmctldPidFile names when it starts)."""
        return self.etc / f"slurm-{name}.conf"

    def node_coda_conf(self, name: str) -> Path:
        """The coda.conf of node ``name``'s coda-node: the cluster's own for the first node."""
        return self.coda_conf if name == NODE_NAME else self.etc / f"coda-{name}.conf"

    def node_state_dir_of(self, name: str) -> Path:
        return self.node_state_dir if name == NODE_NAME else self.root / "nodes" / name / "state"

    def node_runtime_dir_of(self, name: str) -> Path:
        return self.node_runtime_dir if name == NODE_NAME else self.root / "nodes" / name / "run"

    def node_progress_dir_of(self, name: str) -> Path:
        """Where node ``name``'s coda-node keeps its jobs' progress files: node-local, as
        ``/run/coda-node/progress`` is on a real node (a daemon forgets the files of jobs
        that are not on its node)."""
        return self.progress_dir if name == NODE_NAME else self.root / "nodes" / name / "progress"

    @property
    def prometheus_dir(self) -> Path:
        return self.root / "prometheus"

    def prometheus_url(self) -> str | None:
        """The Prometheus server's base URL (``http://127.0.0.1:PORT``) while it runs."""
        port = self._load_state().get("prometheus_port")
        return f"http://127.0.0.1:{port}" if port else None

    @property
    def task_prolog(self) -> Path:
        """A multi-node cluster's TaskProlog: points each task at its node's progress dir."""
        return self.etc / "task-prolog.sh"

    def node_addr(self, name: str) -> str:
        """The address slurmctld reaches node ``name`` at."""
        if not self.networked:
            return "127.0.0.1"
        return f"{NETWORK_PREFIX}.{10 + self.node_names.index(name) + 1}"

    def slurmd_log(self, name: str = NODE_NAME) -> Path:
        if not self.networked:
            return self.root / "log" / "slurmd.log"
        return self.root / "log" / f"slurmd-{name}.log"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients talking to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        env["CODA_CONF"] = str(self.coda_conf)
        return env

    def _load_state(self) -> dict:
        """What ``up`` recorded of the running cluster (its daemons' pids); empty if none."""
        path = self.root / STATE_FILE
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _accounting(self) -> DevAccounting:
        return DevAccounting(self.root, self.etc, self.munge_socket)
