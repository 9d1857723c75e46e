"""A real Slurm cluster on this machine, for the demo and the tests.

Starts munged, slurmctld and slurmd from Debian's packages in a private directory:
random ports, fake GPUs (character devices ``c 195 N`` as the NVIDIA driver makes
them; a gres.conf line without ``File=`` makes the node INVAL), and job_submit/coda
loaded from the directory we install it into (``PluginDir`` takes a colon list, so
nothing is written to system directories). Nothing here is a mock: jobs are real
Slurm jobs and ``scontrol show job`` reads slurmctld's own record.

One node by default, on 127.0.0.1.  With ``nodes`` > 1 every node is its own ``slurmd -N
gpuNN`` in its own network namespace (``coda-gpuNN``), joined by a veth pair to a bridge
(``coda-br0``, 10.77.0.1/24, where slurmctld listens) and reaching nothing else: node i has
10.77.0.(10+i).  Debian builds Slurm with multiple-slurmd, so each slurmd keeps its own
spool, log and pid file (``%n`` in slurm.conf) and its own cgroup v1 tree
(``CgroupPrepend`` defaults to ``/slurm_%n``: ``/sys/fs/cgroup/<controller>/slurm_gpuNN``).
Each node has its own coda.conf (its ``NodeName``, state and run directories; one shared
profile store).  The bridge and namespace names are host-wide: a multi-node cluster holds
the host's confined-cluster slot, as a confined one does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_plugin.devtools.accounting import DevAccounting
from slurm_plugin.devtools.procs import free_ports, pid_alive, reap, stop_pid
from slurm_plugin.hook.install import (
    SLURM_PLUGIN_PROBE,
    find_system_plugin_dir,
    install_plugin,
    plugin_dir_candidates,
)
from slurm_plugin.slurm.scontrol import parse_scontrol_line

NODE_NAME = "gpu01"
"""The first node's name; a one-node cluster's only node."""
BRIDGE = "coda-br0"
NETNS_PREFIX = "coda-"
"""A node's network namespace, and the host end of its veth pair, is ``coda-<node>``."""
NETWORK_PREFIX = "10.77.0"
CTLD_ADDR = f"{NETWORK_PREFIX}.1"
"""The bridge's address in the host's namespace: slurmctld as the nodes reach it."""
NETWORK_BITS = 24
STATE_FILE = "cluster.json"
# Slurm's daemons keep their own idea of time-outs; these bound our waiting only.
START_TIMEOUT_S = 30.0
DEV_HOOK_BUDGET_MS = 2000.0
"""HookBudgetMs in a dev cluster's coda.conf: a loaded 2-vCPU machine can hold a submission
past the production default (20 ms) without the hook being at fault."""


# slurm.conf of the dev cluster; DevCluster._write_configs fills in the fields.
SLURM_CONF_TEMPLATE = """# Written by coda dev-cluster; a private {shape} cluster.
ClusterName=coda-dev
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={slurmd_pid}
SlurmctldLogFile={ctld_log}
SlurmdLogFile={slurmd_log}
SlurmctldDebug=info
SlurmdDebug=info
PluginDir={plugin_dirs}
{submit}SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes={gres_types}
ProctrackType={proctrack}
TaskPlugin={task}
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
{accounting}JobCompType=jobcomp/none
JobAcctGatherType={acct}
ReturnToService=2
MailProg=/bin/true
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
{node_lines}PartitionName=gpu Nodes={node_list} Default=YES MaxTime=INFINITE State=UP{def_cpg}
{extra_partitions}"""


class DevClusterError(RuntimeError):
    """The local cluster could not be started, queried or stopped; says why."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Shape of the fake GPU node (CPUs may exceed the host's: config_overrides)."""

    cpus: int = 32
    sockets: int = 2
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


@dataclass(slots=True)
class DevCluster:
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
    _prometheus_port: int | None = field(default=None, init=False, repr=False)

    # -- paths ---------------------------------------------------------------
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
        if self.nodes == 1:
            return "127.0.0.1"
        return f"{NETWORK_PREFIX}.{10 + self.node_names.index(name) + 1}"

    def slurmd_log(self, name: str = NODE_NAME) -> Path:
        if self.nodes == 1:
            return self.root / "log" / "slurmd.log"
        return self.root / "log" / f"slurmd-{name}.log"

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients talking to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        env["CODA_CONF"] = str(self.coda_conf)
        return env

    # -- lifecycle -----------------------------------------------------------
    def up(self) -> None:
        """Write the configuration, start the three daemons, wait for an idle node."""
        self._check_can_start()
        self._prepare_root()
        install_plugin(self.plugin_dir, source=self.plugin_file)
        self._make_gpu_devices()
        # slurmctld, slurmd; with Prometheus: each node's metrics, then Prometheus's web.
        ports = free_ports(2 + (self.nodes + 1 if self.prometheus else 0))
        metrics_ports = dict(zip(self.node_names, ports[2 : 2 + self.nodes], strict=False))
        self._write_configs(ctld_port=ports[0], slurmd_port=ports[1], metrics_ports=metrics_ports)
        self._prometheus_port = ports[-1] if self.prometheus else None
        pids: dict[str, int] = {}
        self._save_state(pids)  # so down() undoes the network even if munged fails
        if self.nodes > 1:
            self._make_network()
        pids["munged"] = self._start_munged()
        self._save_state(pids)  # so down() stops munged even if slurmctld fails to start
        if self.accounting:
            self._accounting().start(self.env)
        if self.ctld_pre_exec:
            with open(self.root / "log" / "slurmctld-pre.log", "ab") as out:
                subprocess.run(
                    self.ctld_pre_exec,
                    env={**self.env, **self.ctld_env},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    cwd=self.root,
                    timeout=600,
                    check=False,
                )
        pids["slurmctld"] = ctld = self._spawn(
            ["slurmctld", "-D", "-f", str(self.slurm_conf)],
            self.ctld_stderr,
            extra_env=self.ctld_env,
        )
        self._save_state(pids)
        if self.cgroups or self.nodes > 1:  # the slot lives as long as this slurmctld
            CGROUP_SLOT.write_text(f"{pids['slurmctld']} {self.root}")
        self._wait_for(lambda: self._ctld_answers(ctld), "slurmctld to answer")
        pids.update(self._start_slurmds())
        self._save_state(pids)
        self._wait_for(
            lambda: all(s.startswith("IDLE") for s in self.node_states().values()),
            "every node to be IDLE",
        )
        if self.coda_nodes:
            pids.update(self._start_coda_nodes())
            self._save_state(pids)
        if self.prometheus:
            pids["prometheus"] = self._start_prometheus(metrics_ports)
            self._save_state(pids)

    def _check_can_start(self) -> None:
        """Raise DevClusterError unless the tools are installed, the node count is one
        ``up`` starts and no cluster runs in the root."""
        tools = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol"]
        if self.nodes > 1:
            tools += ["ip", "nsenter"]
        if self.prometheus:
            if not self.coda_nodes:
                raise DevClusterError("prometheus scrapes the nodes' coda-node", "none runs")
            tools.append("prometheus")
        for tool in tools:
            if shutil.which(tool) is None:
                raise DevClusterError(
                    f"{tool} not found",
                    "install Debian's munge slurmctld slurmd slurm-client iproute2 "
                    "util-linux prometheus packages",
                )
        if self.nodes < 1 or self.nodes > 99:
            raise DevClusterError(f"cannot start {self.nodes} nodes", "1 to 99")
        if self.is_running():
            raise DevClusterError(f"a dev cluster is already running in {self.root}")

    def _prepare_root(self) -> None:
        """Stop what an earlier cluster in the root left running and make its folders; a
        confined or multi-node cluster also takes the host's slot and clears the host."""
        _stop_leftovers(self.root)
        for sub in ("etc", "munge", "log", "state", "spool", "dev", "run", "plugins", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.profile_store.mkdir(mode=0o755, exist_ok=True)
        if self.cgroups or self.nodes > 1:
            # One confined or multi-node dev cluster per host: its trees are
            # /sys/fs/cgroup/*/slurm_gpuNN and its bridge and namespaces have fixed names,
            # shared with clusters in the test roots (tests/slurm-root).  Wait for the
            # host's slot, then clear what a cluster that was never stopped left there,
            # which would otherwise be mistaken for ours.
            _take_cgroup_slot(self.root)
            _kill_cgroup_jobs()
            _remove_network()

    def _start_slurmds(self) -> dict[str, int]:
        """One slurmd per node; their pids by the name the state file keeps."""
        if self.nodes == 1:
            pid = self._spawn(
                ["slurmd", "-D", "-f", str(self.slurm_conf), "-N", NODE_NAME],
                self.root / "log" / "slurmd.stderr",
            )
            return {"slurmd": pid}
        pids: dict[str, int] = {}
        for name in self.node_names:
            # nsenter execs slurmd in the node's network namespace only: the mounts
            # (the cgroup hierarchies under /sys) stay the host's, which `ip netns
            # exec` would replace with a fresh sysfs.
            pids[f"slurmd-{name}"] = self._spawn(
                [
                    "nsenter",
                    f"--net=/run/netns/{NETNS_PREFIX}{name}",
                    "slurmd",
                    "-D",
                    "-f",
                    str(self.slurm_conf),
                    "-N",
                    name,
                ],
                self.root / "log" / f"slurmd-{name}.stderr",
            )
        return pids

    def _start_coda_nodes(self) -> dict[str, int]:
        """One ``coda-node run`` per node with its node's coda.conf; pids by name."""
        pids: dict[str, int] = {}
        for name in self.node_names:
            for d in (self.node_state_dir_of(name), self.node_runtime_dir_of(name)):
                d.mkdir(parents=True, exist_ok=True)
            pids[f"coda-node-{name}"] = self._spawn(
                [
                    sys.executable,
                    "-m",
                    "coda_node.cli",
                    "run",
                    "--conf",
                    str(self.node_coda_conf(name)),
                ],
                self.root / "log" / f"coda-node-{name}.log",
            )
        return pids

    def down(self) -> None:
        """Stop the daemons this cluster started (slurmd, slurmctld, munged), and the jobs
        that still run: they outlive slurmd (slurmstepd is their parent)."""
        state = self._load_state()
        confined = bool(state.get("cgroups"))
        networked = bool(state.get("network"))
        if confined or networked:
            # The slot names slurmctld, which stops first: hold it in this process until the
            # trees and the network are gone, so that the next cluster does not start meanwhile.
            with contextlib.suppress(OSError):
                if CGROUP_SLOT.read_text().partition(" ")[2] == str(self.root):
                    CGROUP_SLOT.write_text(f"{os.getpid()} {self.root}")
        pids = state.get("pids", {})
        try:
            for name, pid in pids.items():
                if name.startswith("coda-node-"):  # first: it puts the jobs' cgroups back
                    stop_pid(int(pid))
            if self.is_running():
                # End them while Slurm can.
                self.run(["scancel", "--full", "-u", "root"], check=False, timeout_s=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and (
                    _cgroup_tasks() if confined else _job_processes(self.slurm_conf)
                ):
                    time.sleep(0.2)
        finally:
            # Whatever failed above, the daemons stop and the host's slot is given back.
            try:
                slurmds = [n for n in pids if n == "slurmd" or n.startswith("slurmd-")]
                for name in ("prometheus", *slurmds, "slurmctld", "munged"):
                    pid = pids.get(name)
                    if pid:
                        stop_pid(int(pid))
                self._accounting().stop()
                # What scancel did not end (another user's job, a job Slurm lost track of).
                _kill_job_processes(self.slurm_conf)
                if confined:
                    _kill_cgroup_jobs()
                if networked:
                    _remove_network()
            finally:
                if confined or networked:
                    _release_cgroup_slot(self.root)
        state_path = self.root / STATE_FILE
        if state_path.exists():
            state_path.unlink()

    def is_running(self) -> bool:
        state = self._load_state()
        pid = state.get("pids", {}).get("slurmctld")
        return bool(pid) and pid_alive(int(pid))

    def status(self) -> dict[str, object]:
        state = self._load_state()
        pids = state.get("pids", {})
        alive = {name: pid_alive(int(pid)) for name, pid in pids.items()}
        names = state.get("nodes") or [NODE_NAME]
        states = (
            self.node_states(names) if alive.get("slurmctld") else dict.fromkeys(names, "unknown")
        )
        return {
            "root": str(self.root),
            "slurm_conf": str(self.slurm_conf),
            "coda_conf": str(self.coda_conf),
            "cgroups": bool(state.get("cgroups")),
            "accounting": self._accounting().status(),
            "prometheus": self.prometheus_url() if alive.get("prometheus") else None,
            "daemons": alive,
            "node": NODE_NAME,
            "node_state": states.get(NODE_NAME, "unknown"),
            "nodes": states,
        }

    # -- Slurm client helpers used by the demo and the tests -----------------
    def run(
        self,
        argv: list[str],
        *,
        check: bool = True,
        timeout_s: float = 30.0,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            argv,
            env=self.env,
            capture_output=True,
            # Job names and comments are users' bytes, not always UTF-8.
            encoding="utf-8",
            errors="replace",
            timeout=timeout_s,
            input=input_text,
            cwd=self.root / "tmp",
        )
        if check and proc.returncode != 0:
            raise DevClusterError(
                f"{' '.join(argv)} exited {proc.returncode}", proc.stderr.strip() or "no stderr"
            )
        return proc

    def sbatch(self, args: list[str], script: str) -> tuple[int, str]:
        """Submit ``script`` with ``args``; return (job id, sbatch's stderr)."""
        path = self.root / "tmp" / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        proc = self.run(["sbatch", "--parsable", *args, str(path)])
        return int(proc.stdout.strip().split(";")[0]), proc.stderr

    def show_job(self, job_id: int) -> dict[str, str]:
        """``scontrol -o show job`` as a dict of its Key=Value fields."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout.strip()
        return parse_scontrol_line(out)

    def node_state(self, name: str = NODE_NAME) -> str:
        return self.node_states([name]).get(name, "unknown")

    def node_states(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """Slurm's state of each node (``unknown`` where scontrol does not say)."""
        wanted = list(names) if names is not None else self.node_names
        found = dict.fromkeys(wanted, "unknown")
        proc = self.run(["scontrol", "-o", "show", "node"], check=False)
        if proc.returncode == 0:
            for line in proc.stdout.splitlines():
                fields = parse_scontrol_line(line.strip())
                if fields.get("NodeName") in found:
                    found[fields["NodeName"]] = fields.get("State", "unknown")
        return found

    # -- internals -----------------------------------------------------------
    def _make_gpu_devices(self) -> None:
        for index in range(self.node.gpus):
            dev = self.root / "dev" / f"nvidia{index}"
            if not dev.exists():
                # Major 195 is the NVIDIA driver's; slurmd stats File= entries and
                # only accepts character devices.
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, index))

    def _write_configs(
        self, *, ctld_port: int, slurmd_port: int, metrics_ports: Mapping[str, int]
    ) -> None:
        host = socket.gethostname().split(".")[0]
        node = self._declared_node()
        proctrack, task, acct, accounting = self._plugin_types()
        r = self.root
        if self.nodes == 1:
            ctld_addr = "127.0.0.1"
            spool, slurmd_pid, slurmd_log = f"{r}/spool", f"{r}/run/slurmd.pid", self.slurmd_log()
        else:
            ctld_addr = CTLD_ADDR
            spool, slurmd_pid = f"{r}/spool/%n", f"{r}/run/slurmd-%n.pid"
            slurmd_log = r / "log" / "slurmd-%n.log"
            for name in self.node_names:
                (r / "spool" / name).mkdir(parents=True, exist_ok=True)
        gres_types, node_gres = _gres_lists(node)
        node_lines = self._node_lines(node, node_gres, host, slurmd_port)
        node_list = NODE_NAME if self.nodes == 1 else f"gpu[01-{self.nodes:02d}]"
        if self.nodes > 1:
            self._write_task_prolog()
            node_lines = f"TaskProlog={self.task_prolog}\n{node_lines}"
        self.slurm_conf.write_text(
            SLURM_CONF_TEMPLATE.format(
                shape="one-node" if self.nodes == 1 else f"{self.nodes}-node",
                host=host,
                ctld_addr=ctld_addr,
                ctld_port=ctld_port,
                slurmd_port=slurmd_port,
                munge_socket=self.munge_socket,
                root=r,
                spool=spool,
                slurmd_pid=slurmd_pid,
                ctld_log=self.ctld_log,
                slurmd_log=slurmd_log,
                plugin_dirs=f"{self.plugin_dir}:{system_plugin_dir()}",
                submit=f"JobSubmitPlugins={self.job_submit_plugins}\n"
                if self.job_submit_plugins
                else "",
                gres_types=gres_types,
                proctrack=proctrack,
                task=task,
                accounting=accounting,
                acct=acct,
                node_lines=node_lines,
                node_list=node_list,
                def_cpg=f" DefCpuPerGPU={self.def_cpu_per_gpu}" if self.def_cpu_per_gpu else "",
                extra_partitions=self.extra_partitions,
            )
        )
        (self.etc / "gres.conf").write_text(gres_conf(node, r / "dev", node_list))
        cgroup_conf = "CgroupPlugin=cgroup/v1\n"
        if self.cgroups:
            cgroup_conf += "CgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n"
        (self.etc / "cgroup.conf").write_text(cgroup_conf)
        self._write_node_coda_confs(metrics_ports)

    def _declared_node(self) -> NodeSpec:
        """The node shape slurm.conf declares: ``node``, or with cgroups this host's CPUs
        on one socket (ConstrainCores writes real cpusets: a node bigger than the host
        would be folded onto its CPUs)."""
        if self.cgroups:
            return replace(self.node, cpus=os.cpu_count() or 1, sockets=1)
        return self.node

    def _plugin_types(self) -> tuple[str, str, str, str]:
        """``ProctrackType``, ``TaskPlugin``, ``JobAcctGatherType`` and the accounting
        lines of slurm.conf (with accounting: slurmdbd.conf written, its ports picked)."""
        if self.cgroups:
            proctrack, task, acct = (
                "proctrack/cgroup",
                "task/cgroup,task/affinity",
                "jobacct_gather/cgroup",
            )
        else:
            proctrack, task, acct = "proctrack/linuxproc", "task/none", "jobacct_gather/none"
        accounting = "AccountingStorageType=accounting_storage/none\n"
        if self.accounting:
            accounting = self._accounting().configure()
            acct = acct if self.cgroups else "jobacct_gather/linux"  # sacct's TRESUsageIn*
        return proctrack, task, acct, accounting

    def _node_lines(self, node: NodeSpec, node_gres: str, host: str, slurmd_port: int) -> str:
        """slurm.conf's ``NodeName=`` line of every node."""
        cores_per_socket = node.cpus // node.sockets
        extra = f" Feature={node.features}" if node.features else ""
        if node.restricted_cores_per_gpu:
            extra += f" RestrictedCoresPerGPU={node.restricted_cores_per_gpu}"
        return "".join(
            f"NodeName={name} NodeAddr={self.node_addr(name)} NodeHostname={host} "
            f"Port={slurmd_port} Sockets={node.sockets} CoresPerSocket={cores_per_socket} "
            f"ThreadsPerCore=1 RealMemory={node.real_memory_mb} Gres={node_gres}{extra} "
            "State=UNKNOWN\n"
            for name in self.node_names
        )

    def _write_task_prolog(self) -> None:
        """A multi-node cluster's TaskProlog: slurmd runs it before every task (the batch
        script's too) and exports what it prints; SLURMD_NODENAME is the task's node."""
        self.task_prolog.write_text(
            "#!/bin/sh\n# Written by coda dev-cluster: each node's progress directory.\n"
            f'case "$SLURMD_NODENAME" in\n'
            f"  {NODE_NAME}) echo export CODA_PROGRESS_DIR={self.progress_dir} ;;\n"
            f'  *) echo "export CODA_PROGRESS_DIR={self.root}/nodes/$SLURMD_NODENAME/progress" ;;\n'
            "esac\n"
        )
        self.task_prolog.chmod(0o755)

    def _write_node_coda_confs(self, metrics_ports: Mapping[str, int]) -> None:
        """Each node's coda.conf: the shared store, hook files and journal, its own name
        and folders, and its metrics port where it serves one."""
        for name in self.node_names:
            metrics = f"NodeMetricsPort={metrics_ports[name]}\n" if name in metrics_ports else ""
            self.node_coda_conf(name).write_text(
                f"# Written by coda dev-cluster.\nProfileStore={self.profile_store}\n"
                f"ReloadIntervalS=1\nHookStatsFile={self.hook_stats_file}\n"
                # A dev cluster shares its machine with builds and tests: a decision that a
                # busy CPU slowed past the production budget is still the decision.
                f"HookBudgetMs={DEV_HOOK_BUDGET_MS:g}\n"
                f"DecisionJournal={self.decision_journal}\n"
                f"NodeName={name}\nNodeStateDir={self.node_state_dir_of(name)}\n"
                f"NodeRuntimeDir={self.node_runtime_dir_of(name)}\nNodeIntervalS=1\n"
                f"NodeProgressDir={self.node_progress_dir_of(name)}\n"
                f"{metrics}{self.coda_conf_extra}"
            )

    def _make_network(self) -> None:
        """The bridge (slurmctld's address) and one namespace with a veth pair per node."""
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{CTLD_ADDR}/{NETWORK_BITS}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for name in self.node_names:
            ns = f"{NETNS_PREFIX}{name}"
            _ip("netns", "add", ns)
            _ip("link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", ns, "master", BRIDGE, "up")
            _ip("addr", "add", f"{self.node_addr(name)}/{NETWORK_BITS}", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)

    def _start_prometheus(self, metrics_ports: Mapping[str, int]) -> int:
        """Debian's prometheus with its own config and data under the root, scraping each
        node's coda-node (label ``node``); returns its pid once it answers ``/-/ready``."""
        d = self.prometheus_dir
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
        url = f"http://127.0.0.1:{self._prometheus_port}"
        pid = self._spawn(
            [
                "prometheus",
                f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self._prometheus_port}",
                f"--web.external-url={url}",
            ],
            self.root / "log" / "prometheus.log",
        )

        def ready() -> bool:
            if not pid_alive(pid):
                raise DevClusterError(
                    "prometheus exited", f"see {self.root / 'log' / 'prometheus.log'}"
                )
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        self._wait_for(ready, "prometheus to be ready")
        return pid

    def _start_munged(self) -> int:
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        pid_file = self.root / "munge" / "munged.pid"
        # --force: we run as root with the socket outside /run/munge.
        subprocess.run(
            [
                "munged",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={pid_file}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                "--force",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        return int(pid_file.read_text().strip())

    def _spawn(
        self, argv: list[str], stderr_path: Path, extra_env: Mapping[str, str] | None = None
    ) -> int:
        env = {**self.env, **(extra_env or {})}
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                cwd=self.root,
            )
        return proc.pid

    def _accounting(self) -> DevAccounting:
        return DevAccounting(self.root, self.etc, self.munge_socket)

    def _ctld_answers(self, pid: int) -> bool:
        if not pid_alive(pid):  # a fatal error at start: no use waiting
            raise DevClusterError("slurmctld exited", f"see {self.ctld_log} and {self.ctld_stderr}")
        return self._scontrol_ok()

    def _scontrol_ok(self) -> bool:
        return self.run(["scontrol", "ping"], check=False, timeout_s=5).returncode == 0

    def _wait_for(self, predicate, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise DevClusterError(
            f"timed out waiting for {what}",
            f"see {self.ctld_log} and {self.root / 'log'}",
        )

    def _save_state(self, pids: Mapping[str, int]) -> None:
        state = {
            "pids": dict(pids),
            "cgroups": self.cgroups,
            "network": self.nodes > 1,
            "nodes": self.node_names,
            "prometheus_port": self._prometheus_port,
        }
        (self.root / STATE_FILE).write_text(json.dumps(state))

    def _load_state(self) -> dict:
        path = self.root / STATE_FILE
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}


def system_plugin_dir(candidates: Sequence[Path] | None = None) -> Path:
    """Slurm's own plugin directory: the first candidate that holds select/cons_tres.

    The dev cluster's ``PluginDir`` lists it after the directory job_submit/coda is
    installed into.
    """
    found = find_system_plugin_dir(candidates)
    if found is not None:
        return found
    if candidates is None:
        candidates = plugin_dir_candidates(sysconfig.get_config_var("MULTIARCH"))
    raise DevClusterError(
        f"no Slurm plugin directory found (no {SLURM_PLUGIN_PROBE} in "
        f"{', '.join(str(d) for d in candidates)})",
        "install Debian's slurmctld package",
    )


def parse_slurm_version(text: str) -> tuple[int, int]:
    """(major, minor) from ``slurmctld -V``: ``slurm-wlm 22.05.8`` -> (22, 5)."""
    words = text.split()
    parts = words[-1].split(".") if words else []
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        raise DevClusterError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(parts[0]), int(parts[1])


def slurm_version() -> tuple[int, int]:
    """(major, minor) of the slurmctld on PATH, the one a dev cluster starts."""
    try:
        proc = subprocess.run(
            ["slurmctld", "-V"], capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
    except FileNotFoundError:
        raise DevClusterError("slurmctld not found", "install Debian's slurmctld package") from None
    return parse_slurm_version(proc.stdout)


def _gres_lists(node: NodeSpec) -> tuple[str, str]:
    """slurm.conf's ``GresTypes`` and the node's ``Gres``: its GPUs, then ``extra_gres``."""
    extra_gres = [g.strip() for g in node.extra_gres.split(",") if g.strip()]
    gres_types = ",".join(["gpu", *dict.fromkeys(g.split(":")[0] for g in extra_gres)])
    node_gres = ",".join([f"gpu:{node.gpu_type}:{node.gpus}", *extra_gres])
    return gres_types, node_gres


def gres_conf(node: NodeSpec, dev: Path, node_list: str = NODE_NAME) -> str:
    """gres.conf for the node's fake GPUs, spread evenly over its sockets with the cores
    of each (``Cores=``), as on a real node: Slurm places ``--gpus-per-socket`` jobs by it.
    Every node of ``node_list`` (a Slurm host list) has the same devices.
    """
    per_socket = max(1, -(-node.gpus // node.sockets))
    cores_per_socket = node.cpus // node.sockets
    lines = []
    for first in range(0, node.gpus, per_socket):
        last = min(first + per_socket, node.gpus) - 1
        socket = first // per_socket
        cores = f"{socket * cores_per_socket}-{(socket + 1) * cores_per_socket - 1}"
        lines.append(
            f"NodeName={node_list} Name=gpu Type={node.gpu_type} "
            f"File={dev}/nvidia[{first}-{last}] Cores={cores}\n"
        )
    return "".join(lines)


CGROUP_V1 = Path("/sys/fs/cgroup")


def node_names(nodes: int) -> list[str]:
    """The dev cluster's node names: gpu01, gpu02, ..."""
    return [f"gpu{i:02d}" for i in range(1, nodes + 1)]


def _cgroup_trees() -> list[Path]:
    """Every dev cluster node's v1 tree (``slurm_gpuNN``), of this cluster or one that was
    never stopped: the host's slot says no other dev cluster owns them."""
    return [p for p in CGROUP_V1.glob("*/slurm_gpu[0-9][0-9]") if p.is_dir()]


def _cgroup_dirs(tree: Path) -> list[Path]:
    """``tree`` and every directory under it, deepest first. Job cgroups vanish while they
    are walked (slurmstepd removes them as jobs end): os.walk skips what it cannot list,
    where Path.rglob (Python 3.11) raises FileNotFoundError."""
    dirs = [Path(top) for top, _, _ in os.walk(tree)]
    return sorted(dirs, key=lambda p: -len(p.parts))


def _cgroup_tasks() -> set[int]:
    pids: set[int] = set()
    for tree in _cgroup_trees():
        for d in _cgroup_dirs(tree):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (d / "tasks").read_text().split())
    return pids


def _kill_cgroup_jobs() -> None:
    """Kill what is left in the confined dev cluster's cgroup tree and remove the tree."""
    deadline = time.monotonic() + 10
    while (pids := _cgroup_tasks()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for tree in _cgroup_trees():
        for d in _cgroup_dirs(tree):  # the tree itself last
            with contextlib.suppress(OSError):
                d.rmdir()


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *args]
    if netns is not None:
        # nsenter enters the network namespace only; `ip -n` also makes / a slave mount,
        # which fails where / is no mount point (a chroot: the Slurm version roots).
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise DevClusterError(f"ip {' '.join(args)} exited {proc.returncode}", proc.stderr.strip())


def _remove_network() -> None:
    """Delete the dev cluster's namespaces (their veth pairs go with them) and bridge."""
    if shutil.which("ip") is None:
        return  # nothing made them here
    listing = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    for line in listing.stdout.splitlines():
        ns = line.split(" ", 1)[0]
        if ns.startswith(f"{NETNS_PREFIX}gpu"):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _job_processes(slurm_conf: Path) -> set[int]:
    """The processes of this cluster's jobs: its slurmstepds (started by its slurmd, with
    its ``SLURM_CONF``), everything below them, and job processes that left their tree
    (``SLURM_JOB_ID`` set, this ``SLURM_CONF``). An admin's shell that exported the
    cluster's ``SLURM_CONF`` is neither."""
    conf = str(slurm_conf)
    children: dict[int, list[int]] = {}
    parent: dict[int, int] = {}
    stepds: set[int] = set()
    roots: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdecimal():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 2 or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(pid)
        parent[pid] = int(fields[1])
        if cmdline.startswith(b"slurmstepd"):
            stepds.add(pid)
        env = _environ(pid)
        if env.get("SLURM_CONF") != conf:
            continue
        if cmdline.startswith(b"slurmstepd") or "SLURM_JOB_ID" in env:
            roots.add(pid)
    # From 24.11 slurmstepd no longer carries SLURM_CONF: it is the slurmstepd whose child
    # is one of this cluster's job processes.
    roots |= {parent[pid] for pid in roots if parent.get(pid) in stepds}
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    found.discard(os.getpid())
    return found


def _kill_job_processes(slurm_conf: Path) -> None:
    """SIGKILL every process of this cluster's jobs (:func:`_job_processes`)."""
    deadline = time.monotonic() + 10
    while (pids := _job_processes(slurm_conf)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        for pid in pids:
            reap(pid)


CGROUP_SLOT = Path(os.environ.get("CODA_CGROUP_SLOT", "/dev/shm/coda-dev-cluster-cgroups"))
"""Who holds the host's one confined-cluster slot: ``<pid> <root>``.  /dev/shm is shared
with the test roots (their /dev is the host's), so a cluster there waits for ours."""
CGROUP_SLOT_WAIT_S = float(os.environ.get("CODA_CGROUP_SLOT_WAIT_S", "900"))


def _take_cgroup_slot(root: Path) -> None:
    """Claim the confined-cluster slot for ``root``; wait while a live process holds it."""
    deadline = time.monotonic() + CGROUP_SLOT_WAIT_S
    mine = f"{os.getpid()} {root}"
    while True:
        try:
            fd = os.open(CGROUP_SLOT, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = CGROUP_SLOT.read_text()
            except FileNotFoundError:
                continue
            pid_text, _, held_root = holder.partition(" ")
            if held_root == str(root) or not pid_text.isdigit() or not pid_alive(int(pid_text)):
                if held_root and held_root != str(root):
                    _stop_leftovers(Path(held_root))
                with contextlib.suppress(FileNotFoundError):
                    CGROUP_SLOT.unlink()  # ours from before, or its holder is gone
                continue
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"another confined dev cluster holds {CGROUP_SLOT}",
                    f"pid {pid_text}, cluster {held_root}; stop it or remove the file",
                ) from None
            time.sleep(1.0)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        return


def _stop_leftovers(root: Path) -> None:
    """Stop what the cluster in ``root`` left running when it was never stopped: its slurmd
    and coda-node outlive a crashed slurmctld, and would act on the next cluster's node
    trees.  Only processes whose command line names ``root`` (a pid may have been reused)."""
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return
    for pid in state.get("pids", {}).values():
        try:
            cmdline = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if os.fsencode(str(root)) in cmdline:
            stop_pid(int(pid))
    _kill_job_processes(root / "etc" / "slurm.conf")


def _cgroup_slot_holder() -> tuple[int, str] | None:
    """(pid, cluster root) of the live process holding the confined-cluster slot."""
    try:
        pid_text, _, held_root = CGROUP_SLOT.read_text().partition(" ")
    except OSError:
        return None
    if not pid_text.isdigit() or not pid_alive(int(pid_text)):
        return None
    return int(pid_text), held_root


def _release_cgroup_slot(root: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        if CGROUP_SLOT.read_text().partition(" ")[2] == str(root):
            CGROUP_SLOT.unlink()


DEFAULT_ROOT = Path(os.environ.get("CODA_DEV_CLUSTER", f"/tmp/coda-dev-cluster-{os.getuid()}"))


def _say_if_waiting_for_slot(root: Path) -> None:
    """Tell the user when another confined cluster holds the host's slot ``up`` waits for."""
    import click

    holder = _cgroup_slot_holder()
    if holder is not None and holder[1] != str(root):
        click.echo(
            f"# waiting for the confined cluster of pid {holder[0]} ({holder[1]}) "
            f"to stop (at most {CGROUP_SLOT_WAIT_S:g} s)",
            err=True,
        )


def two_node_try_args(node_cpus: int, def_cpu_per_gpu: int | None) -> list[str]:
    """The ``sbatch`` arguments ``dev-cluster up --nodes N`` suggests: one GPU on each of
    two nodes, with ``--cpus-per-gpu`` when the partition's DefCpuPerGPU asks for more CPUs
    than a node has (with cgroups a node has this host's CPUs), so that Slurm runs it."""
    args = ["-N2", "--gpus-per-node=1"]
    if def_cpu_per_gpu is not None and def_cpu_per_gpu > node_cpus:
        args.append(f"--cpus-per-gpu={max(node_cpus, 1)}")
    return args


def _say_started(cluster: DevCluster) -> None:
    """What ``dev-cluster up`` prints once the cluster runs: the exports on stdout, its
    nodes and how to try it on stderr."""
    import click

    click.echo(f"export SLURM_CONF={cluster.slurm_conf}")
    cpus = os.cpu_count() if cluster.cgroups else cluster.node.cpus
    for name in cluster.node_names:
        click.echo(
            f"# node {name} ({cluster.node_addr(name)}): {cpus} CPUs, "
            f"{cluster.node.gpus} x gpu:{cluster.node.gpu_type}",
            err=True,
        )
    click.echo(f"# profiles in {cluster.profile_store}; logs in {cluster.root / 'log'}", err=True)
    if cluster.prometheus:
        click.echo(
            f"# prometheus at {cluster.prometheus_url()} scrapes every node's coda-node; "
            f"try `curl -s {cluster.prometheus_url()}/api/v1/query?query=coda_node_jobs`",
            err=True,
        )
    if cluster.nodes > 1:
        click.echo(f"export CODA_CONF={cluster.coda_conf}")
        try_args = " ".join(two_node_try_args(cpus, cluster.def_cpu_per_gpu))
        click.echo(
            "# each node's coda-node runs with its own coda.conf "
            f"({cluster.etc}/coda-gpuNN.conf; {cluster.coda_conf} for {NODE_NAME}); "
            f"try `sbatch {try_args} --wrap 'srun sleep 300'` and "
            f"`coda-node status --conf {cluster.node_coda_conf(cluster.node_names[1])}`",
            err=True,
        )
    elif cluster.cgroups:
        click.echo(f"export CODA_CONF={cluster.coda_conf}")
        click.echo(
            "# jobs run in real cgroups: start `coda-node run` (as root) and try "
            "`coda-node limit <job> --cores 1`, `coda-node status`, `coda-node release "
            "<job>`; `dev-cluster down` ends the jobs and frees the host's slot",
            err=True,
        )


def _status_lines(root: Path, info: Mapping[str, Any]) -> list[str]:
    """``dev-cluster status`` as text: each daemon and node, then the exports."""
    daemons = info["daemons"] or {}
    if not daemons:
        return [f"no dev cluster in {root}"]
    lines = [
        f"{name:17} {'running' if alive else 'stopped'}"
        for name, alive in {**daemons, **info["accounting"]}.items()
    ]
    lines += [f"{name:17} {state}" for name, state in info["nodes"].items()]
    if info["prometheus"]:
        lines.append(f"{'prometheus url':17} {info['prometheus']}")
    lines.append(f"{'cgroups':17} {'confined' if info['cgroups'] else 'not confined'}")
    lines.append(f"export SLURM_CONF={info['slurm_conf']}")
    if info["cgroups"]:
        lines.append(f"export CODA_CONF={info['coda_conf']}")
    return lines


def _cli():  # built lazily: importing this module must stay cheap for the tests
    import click

    from coda_common.cli import CliError
    from slurm_plugin.devtools.accounting import AccountingError

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def dev_cluster() -> None:
        """A private Slurm (munge, slurmctld, slurmd per node) with fake GPUs on this host."""

    dir_option = click.option(
        "--dir",
        "root",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_ROOT,
        show_default=True,
        help="Where the cluster keeps its config, state and logs.",
    )

    @dev_cluster.command()
    @dir_option
    @click.option("--no-plugin", is_flag=True, help="Start without job_submit/coda.")
    @click.option(
        "--cgroups",
        is_flag=True,
        help="Confine jobs with real cgroups (v1: proctrack/cgroup, task/cgroup, "
        "ConstrainCores) on this host's own CPUs, for coda-node; one such cluster per host.",
    )
    @click.option(
        "--nodes",
        type=click.IntRange(1, 99),
        default=1,
        show_default=True,
        help="GPU nodes. More than one: each in its own network namespace on 10.77.0.0/24, "
        "confined (--cgroups) and with its own running coda-node; one such cluster per host.",
    )
    @click.option(
        "--accounting",
        is_flag=True,
        help="Add slurmdbd on a private MariaDB server (sacct, GPU TRES, AdminComment).",
    )
    @click.option(
        "--prometheus",
        is_flag=True,
        help="With --nodes N > 1: each coda-node serves /metrics and Debian's prometheus "
        "scrapes them (web on 127.0.0.1, a free port; data under --dir).",
    )
    def up(
        root: Path, no_plugin: bool, cgroups: bool, nodes: int, accounting: bool, prometheus: bool
    ) -> None:
        """Start the cluster and print the SLURM_CONF (and CODA_CONF) to export."""
        multi = nodes > 1
        if prometheus and not multi:
            raise CliError("cannot start prometheus", "it scrapes the nodes of --nodes N > 1")
        cgroups = cgroups or multi
        cluster = DevCluster(
            root,
            job_submit_plugins="" if no_plugin else "coda",
            cgroups=cgroups,
            accounting=accounting,
            nodes=nodes,
            coda_nodes=multi,
            prometheus=prometheus,
        )
        if cgroups:
            _say_if_waiting_for_slot(root)
        try:
            cluster.up()
        except (DevClusterError, AccountingError, OSError, subprocess.SubprocessError) as exc:
            raise CliError("cannot start the dev cluster", str(exc)) from exc
        _say_started(cluster)

    @dev_cluster.command()
    @dir_option
    def down(root: Path) -> None:
        """Stop the cluster's daemons."""
        DevCluster(root).down()
        click.echo(f"stopped the dev cluster in {root}", err=True)

    @dev_cluster.command()
    @dir_option
    @click.option("--json", "as_json", is_flag=True)
    def status(root: Path, as_json: bool) -> None:
        """Say whether the cluster runs, and its node's state."""
        info = DevCluster(root).status()
        if as_json:
            click.echo(json.dumps(info, indent=2))
            return
        for line in _status_lines(root, info):
            click.echo(line)

    return dev_cluster


def main(argv: list[str] | None = None) -> int:
    from coda_common.cli import run_cli

    return run_cli(_cli(), "dev-cluster", argv)


if __name__ == "__main__":
    raise SystemExit(main())
