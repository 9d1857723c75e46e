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
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_plugin.devtools.configs import ConfigWriter, gres_conf, system_plugin_dir
from slurm_plugin.devtools.daemons import Daemons
from slurm_plugin.devtools.hostslot import (
    CGROUP_SLOT,
    CGROUP_SLOT_WAIT_S,
    cgroup_slot_holder,
    cgroup_tasks,
    controller_pids,
    job_processes,
    kill_cgroup_jobs,
    kill_job_processes,
    release_cgroup_slot,
    stop_leftovers,
    take_cgroup_slot,
)
from slurm_plugin.devtools.layout import (
    NODE_NAME,
    START_TIMEOUT_S,
    STATE_FILE,
    ClusterLayout,
    DevClusterError,
    NodeSpec,
)
from slurm_plugin.devtools.network import make_network, remove_network
from slurm_plugin.devtools.procs import free_ports, pid_alive, reap, stop_pid
from slurm_plugin.hook.install import install_plugin, plugin_dir_candidates
from slurm_plugin.slurm.scontrol import parse_scontrol_line

__all__ = [
    "CGROUP_SLOT",
    "NODE_NAME",
    "DevCluster",
    "DevClusterError",
    "NodeSpec",
    "gres_conf",
    "main",
    "parse_scontrol_line",
    "parse_slurm_version",
    "plugin_dir_candidates",
    "slurm_version",
    "system_plugin_dir",
    "two_node_try_args",
]

# Slurm's daemons keep their own idea of time-outs; these bound our waiting only.


@dataclass(slots=True)
class DevCluster(ClusterLayout):
    """A private Slurm cluster on this machine: :meth:`up` starts it, :meth:`down` stops
    it, and the client helpers talk to it."""

    _prometheus_port: int | None = field(default=None, init=False, repr=False)

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
        daemons = Daemons(self, self._prometheus_port)
        pids: dict[str, int] = {}
        self._save_state(pids)  # so down() undoes the network even if munged fails
        if self.networked:
            make_network(self)
        pids["munged"] = daemons.start_munged()
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
        pids.update(self._start_controllers(daemons))
        ctld = pids["slurmctld"]
        self._save_state(pids)
        if self.cgroups or self.networked:  # the slot lives as long as this slurmctld
            CGROUP_SLOT.write_text(f"{pids['slurmctld']} {self.root}")
        daemons.wait_for(lambda: self._ctld_answers(ctld), "slurmctld to answer")
        pids.update(daemons.start_slurmds())
        self._save_state(pids)
        daemons.wait_for(
            lambda: all(s.startswith("IDLE") for s in self.node_states().values()),
            "every node to be IDLE",
        )
        if self.coda_nodes:
            pids.update(daemons.start_coda_nodes())
            self._save_state(pids)
        if self.prometheus:
            pids["prometheus"] = daemons.start_prometheus(metrics_ports)
            self._save_state(pids)

    def _start_controllers(self, daemons: Daemons) -> dict[str, int]:
        """slurmctld, or each controller of a high-availability cluster, the primary first
        (answering before a backup starts); their pids by the name the state file keeps
        (``slurmctld``: the primary's)."""
        if not self.controller_names:
            pid = daemons.spawn(
                ["slurmctld", "-D", "-f", str(self.slurm_conf)],
                self.ctld_stderr,
                extra_env=self.ctld_env,
            )
            return {"slurmctld": pid}
        pids: dict[str, int] = {}
        for name in self.controller_names:
            pids[f"slurmctld-{name}"] = pid = daemons.start_slurmctld(name)
            pids.setdefault("slurmctld", pid)
            daemons.wait_for(lambda n=name: self.controller_states().get(n) == "UP", f"{name}")
        return pids

    # -- a high-availability cluster's controllers ----------------------------
    def controller_pids(self) -> dict[str, int]:
        """The running slurmctld of each controller, by name (after ``scontrol
        reconfigure`` from Slurm 23.11 on, the process it started)."""
        return controller_pids(self.slurm_conf)

    def controller_states(self) -> dict[str, str]:
        """``scontrol ping``'s word (UP, DOWN) for each SlurmctldHost, by name."""
        proc = self.run(["scontrol", "ping"], check=False, timeout_s=30)
        return dict(re.findall(r"^Slurmctld\(\S+\) at (\S+) is (\w+)", proc.stdout, re.M))

    def kill_controller(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to controller ``name``'s slurmctld and wait until it is gone."""
        pid = self.controller_pids().get(name)
        if pid is None:
            raise DevClusterError(f"controller {name} is not running")
        os.kill(pid, sig)
        deadline = time.monotonic() + START_TIMEOUT_S
        while pid_alive(pid):
            if time.monotonic() > deadline:
                raise DevClusterError(f"controller {name} (pid {pid}) did not stop")
            time.sleep(0.1)
        reap(pid)

    def start_controller(self, name: str) -> int:
        """Start controller ``name`` again (as ``up`` did); returns its pid."""
        if name not in self.controller_names:
            raise DevClusterError(f"no controller {name}", ", ".join(self.controller_names))
        pid = Daemons(self).start_slurmctld(name)
        state = self._load_state()
        pids = {**state.get("pids", {}), f"slurmctld-{name}": pid}
        self._save_state(pids)
        return pid

    def _check_can_start(self) -> None:
        """Raise DevClusterError unless the tools are installed, the node count is one
        ``up`` starts and no cluster runs in the root."""
        tools = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol"]
        if self.networked:
            tools += ["ip", "nsenter", "unshare"]
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
        stop_leftovers(self.root)
        for sub in ("etc", "munge", "log", "state", "spool", "dev", "run", "plugins", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.profile_store.mkdir(mode=0o755, exist_ok=True)
        if self.cgroups or self.networked:
            # One confined or multi-node dev cluster per host: its trees are
            # /sys/fs/cgroup/*/slurm_gpuNN and its bridge and namespaces have fixed names,
            # shared with clusters in the test roots (tests/slurm-root).  Wait for the
            # host's slot, then clear what a cluster that was never stopped left there,
            # which would otherwise be mistaken for ours.
            take_cgroup_slot(self.root)
            kill_cgroup_jobs()
            remove_network()

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
                    cgroup_tasks() if confined else job_processes(self.slurm_conf)
                ):
                    time.sleep(0.2)
        finally:
            # Whatever failed above, the daemons stop and the host's slot is given back.
            try:
                slurmds = [n for n in pids if n == "slurmd" or n.startswith("slurmd-")]
                for name in ("prometheus", *slurmds, "slurmctld"):
                    pid = pids.get(name)
                    if pid:
                        stop_pid(int(pid))
                for pid in self.controller_pids().values():
                    stop_pid(pid)
                if pids.get("munged"):
                    stop_pid(int(pids["munged"]))
                self._accounting().stop()
                # What scancel did not end (another user's job, a job Slurm lost track of).
                kill_job_processes(self.slurm_conf)
                if confined:
                    kill_cgroup_jobs()
                if networked:
                    remove_network()
            finally:
                if confined or networked:
                    release_cgroup_slot(self.root)
        state_path = self.root / STATE_FILE
        if state_path.exists():
            state_path.unlink()

    def is_running(self) -> bool:
        state = self._load_state()
        pid = state.get("pids", {}).get("slurmctld")
        if state.get("controllers") and self.controller_pids():
            return True
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
        """slurm.conf, gres.conf, cgroup.conf and every node's coda.conf."""
        ConfigWriter(self).write(
            ctld_port=ctld_port, slurmd_port=slurmd_port, metrics_ports=metrics_ports
        )

    def _ctld_answers(self, pid: int) -> bool:
        if not pid_alive(pid):  # a fatal error at start: no use waiting
            raise DevClusterError("slurmctld exited", f"see {self.ctld_log} and {self.ctld_stderr}")
        return self._scontrol_ok()

    def _scontrol_ok(self) -> bool:
        return self.run(["scontrol", "ping"], check=False, timeout_s=5).returncode == 0

    def _save_state(self, pids: Mapping[str, int]) -> None:
        state = {
            "pids": dict(pids),
            "cgroups": self.cgroups,
            "network": self.networked,
            "controllers": self.controller_names,
            "nodes": self.node_names,
            "prometheus_port": self._prometheus_port,
        }
        (self.root / STATE_FILE).write_text(json.dumps(state))


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


DEFAULT_ROOT = Path(os.environ.get("CODA_DEV_CLUSTER", f"/tmp/coda-dev-cluster-{os.getuid()}"))


def _say_if_waiting_for_slot(root: Path) -> None:
    """Tell the user when another confined cluster holds the host's slot ``up`` waits for."""
    import click

    holder = cgroup_slot_holder()
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
    for name in cluster.controller_names:
        click.echo(
            f"# slurmctld {name} ({cluster.ctld_addr(name)}): log {cluster.ctld_log_of(name)}",
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
    dev_cluster.add_command(_up_command(dir_option))

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


def _up_command(dir_option):
    """``dev-cluster up``."""
    import click

    @click.command()
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
        "--backup",
        is_flag=True,
        help="A primary and a backup slurmctld (SlurmctldHost ctl1, ctl2), each in its own "
        "network and UTS namespace on 10.77.0.0/24; one such cluster per host.",
    )
    @click.option(
        "--prometheus",
        is_flag=True,
        help="With --nodes N > 1: each coda-node serves /metrics and Debian's prometheus "
        "scrapes them (web on 127.0.0.1, a free port; data under --dir).",
    )
    def up(
        root: Path,
        no_plugin: bool,
        cgroups: bool,
        nodes: int,
        accounting: bool,
        backup: bool,
        prometheus: bool,
    ) -> None:
        """Start the cluster and print the SLURM_CONF (and CODA_CONF) to export."""
        _cli_up(root, no_plugin, cgroups, nodes, accounting, prometheus, backup)

    return up


def _cli_up(
    root: Path,
    no_plugin: bool,
    cgroups: bool,
    nodes: int,
    accounting: bool,
    prometheus: bool,
    backup: bool = False,
) -> None:
    """``dev-cluster up``'s work: start the cluster the options describe and say so."""
    from coda_common.cli import CliError
    from slurm_plugin.devtools.accounting import AccountingError

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
        controllers=2 if backup else 1,
    )
    if cgroups or backup:
        _say_if_waiting_for_slot(root)
    try:
        cluster.up()
    except (DevClusterError, AccountingError, OSError, subprocess.SubprocessError) as exc:
        raise CliError("cannot start the dev cluster", str(exc)) from exc
    _say_started(cluster)


def main(argv: list[str] | None = None) -> int:
    from coda_common.cli import run_cli

    return run_cli(_cli(), "dev-cluster", argv)


if __name__ == "__main__":
    raise SystemExit(main())
