"""The files a dev cluster's daemons read: slurm.conf, gres.conf and cgroup.conf, a
multi-node cluster's TaskProlog, and each node's coda.conf."""

from __future__ import annotations

import os
import re
import socket
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm_plugin.devtools.layout import (
    CTLD_ADDR,
    NODE_NAME,
    ClusterLayout,
    DevClusterError,
    NodeSpec,
)
from slurm_plugin.hook.install import (
    SLURM_PLUGIN_PROBE,
    find_system_plugin_dir,
    plugin_dir_candidates,
)

DEV_HOOK_BUDGET_MS = 2000.0
"""HookBudgetMs in a dev cluster's coda.conf: a loaded 2-vCPU machine can hold a submission
past the production default (20 ms) without the hook being at fault."""


# slurm.conf of the dev cluster; ConfigWriter.write fills in the fields.
SLURM_CONF_TEMPLATE = """# Written by coda dev-cluster; a private {shape} cluster.
ClusterName=coda-dev
{ctld_hosts}
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
SlurmctldTimeout={ctld_timeout_s}
SlurmdTimeout=30
MinJobAge=300{conf_extra}
{node_lines}PartitionName=gpu Nodes={node_list} Default=YES MaxTime=INFINITE State=UP{def_cpg}
{extra_partitions}"""


class ConfigWriter:
    """Writes the configuration of the cluster ``c`` describes into its ``etc``."""

    def __init__(self, c: ClusterLayout) -> None:
        self.c = c

    def write(self, *, ctld_port: int, slurmd_port: int, metrics_ports: Mapping[str, int]) -> None:
        host = socket.gethostname().split(".")[0]
        node = self._declared_node()
        proctrack, task, acct, accounting = self._plugin_types()
        r = self.c.root
        if not self.c.networked:
            ctld_addr = "127.0.0.1"
            spool, slurmd_pid, slurmd_log = f"{r}/spool", f"{r}/run/slurmd.pid", self.c.slurmd_log()
        else:
            ctld_addr = CTLD_ADDR
            spool, slurmd_pid = f"{r}/spool/%n", f"{r}/run/slurmd-%n.pid"
            slurmd_log = r / "log" / "slurmd-%n.log"
            for name in self.c.node_names:
                (r / "spool" / name).mkdir(parents=True, exist_ok=True)
        gres_types, node_gres = _gres_lists(node)
        node_lines = self._node_lines(node, node_gres, host, slurmd_port)
        node_list = NODE_NAME if self.c.nodes == 1 else f"gpu[01-{self.c.nodes:02d}]"
        if self.c.nodes > 1:
            self._write_task_prolog()
            node_lines = f"TaskProlog={self.c.task_prolog}\n{node_lines}"
        self.c.slurm_conf.write_text(
            SLURM_CONF_TEMPLATE.format(
                shape="one-node" if self.c.nodes == 1 else f"{self.c.nodes}-node",
                ctld_hosts=self._ctld_hosts(host, ctld_addr),
                ctld_timeout_s=self.c.ctld_timeout_s,
                ctld_port=ctld_port,
                slurmd_port=slurmd_port,
                munge_socket=self.c.munge_socket,
                root=r,
                spool=spool,
                slurmd_pid=slurmd_pid,
                ctld_log=self.c.ctld_log,
                slurmd_log=slurmd_log,
                plugin_dirs=f"{self.c.plugin_dir}:{system_plugin_dir()}",
                submit=f"JobSubmitPlugins={self.c.job_submit_plugins}\n"
                if self.c.job_submit_plugins
                else "",
                gres_types=gres_types,
                proctrack=proctrack,
                task=task,
                accounting=accounting,
                acct=acct,
                node_lines=node_lines,
                node_list=node_list,
                def_cpg=f" DefCpuPerGPU={self.c.def_cpu_per_gpu}" if self.c.def_cpu_per_gpu else "",
                extra_partitions=self.c.extra_partitions,
                conf_extra="\n" + self.c.slurm_conf_extra.rstrip("\n")
                if self.c.slurm_conf_extra
                else "",
            )
        )
        self._write_controller_confs()
        (self.c.etc / "gres.conf").write_text(gres_conf(node, r / "dev", node_list))
        cgroup_conf = "CgroupPlugin=cgroup/v1\n"
        if self.c.cgroups:
            cgroup_conf += "CgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n"
        (self.c.etc / "cgroup.conf").write_text(cgroup_conf)
        self._write_node_coda_confs(metrics_ports)

    def _write_controller_confs(self) -> None:
        """Each controller's copy of slurm.conf, with its own SlurmctldPidFile and
        SlurmctldLogFile (:meth:`ClusterLayout.ctld_conf_of`)."""
        text = self.c.slurm_conf.read_text()
        for name in self.c.controller_names:
            own = re.sub(
                r"^SlurmctldPidFile=.*$",
                f"SlurmctldPidFile={self.c.root}/run/slurmctld-{name}.pid",
                text,
                flags=re.M,
            )
            own = re.sub(
                r"^SlurmctldLogFile=.*$",
                f"SlurmctldLogFile={self.c.ctld_log_of(name)}",
                own,
                flags=re.M,
            )
            self.c.ctld_conf_of(name).write_text(own)

    def _ctld_hosts(self, host: str, ctld_addr: str) -> str:
        """slurm.conf's ``SlurmctldHost`` lines: this host, or each controller of a
        high-availability cluster by its own name and address, primary first."""
        names = self.c.controller_names
        if not names:
            return f"SlurmctldHost={host}({ctld_addr})"
        return "\n".join(f"SlurmctldHost={n}({self.c.ctld_addr(n)})" for n in names)

    def _declared_node(self) -> NodeSpec:
        """The node shape slurm.conf declares: ``node``, or with cgroups this host's CPUs
        on one socket (ConstrainCores writes real cpusets: a node bigger than the host
        would be folded onto its CPUs)."""
        if self.c.cgroups:
            return replace(self.c.node, cpus=os.cpu_count() or 1, sockets=1)
        return self.c.node

    def _plugin_types(self) -> tuple[str, str, str, str]:
        """``ProctrackType``, ``TaskPlugin``, ``JobAcctGatherType`` and the accounting
        lines of slurm.conf (with accounting: slurmdbd.conf written, its ports picked)."""
        if self.c.cgroups:
            proctrack, task, acct = (
                "proctrack/cgroup",
                "task/cgroup,task/affinity",
                "jobacct_gather/cgroup",
            )
        else:
            proctrack, task, acct = "proctrack/linuxproc", "task/none", "jobacct_gather/none"
        accounting = "AccountingStorageType=accounting_storage/none\n"
        if self.c.accounting:
            accounting = self.c._accounting().configure()
            acct = acct if self.c.cgroups else "jobacct_gather/linux"  # sacct's TRESUsageIn*
        return proctrack, task, acct, accounting

    def _node_lines(self, node: NodeSpec, node_gres: str, host: str, slurmd_port: int) -> str:
        """slurm.conf's ``NodeName=`` line of every node."""
        cores_per_socket = node.cpus // node.sockets // node.threads_per_core
        extra = f" Feature={node.features}" if node.features else ""
        if node.restricted_cores_per_gpu:
            extra += f" RestrictedCoresPerGPU={node.restricted_cores_per_gpu}"
        return "".join(
            f"NodeName={name} NodeAddr={self.c.node_addr(name)} NodeHostname={host} "
            f"Port={slurmd_port} Sockets={node.sockets} CoresPerSocket={cores_per_socket} "
            f"ThreadsPerCore={node.threads_per_core} RealMemory={node.real_memory_mb} "
            f"Gres={node_gres}{extra} State=UNKNOWN\n"
            for name in self.c.node_names
        )

    def _write_task_prolog(self) -> None:
        """A multi-node cluster's TaskProlog: slurmd runs it before every task (the batch
        script's too) and exports what it prints; SLURMD_NODENAME is the task's node."""
        c = self.c
        c.task_prolog.write_text(
            "#!/bin/sh\n# Written by coda dev-cluster: each node's progress directory.\n"
            f'case "$SLURMD_NODENAME" in\n'
            f"  {NODE_NAME}) echo export CODA_PROGRESS_DIR={c.progress_dir} ;;\n"
            f'  *) echo "export CODA_PROGRESS_DIR={c.root}/nodes/$SLURMD_NODENAME/progress" ;;\n'
            "esac\n"
        )
        c.task_prolog.chmod(0o755)

    def _write_node_coda_confs(self, metrics_ports: Mapping[str, int]) -> None:
        """Each node's coda.conf: the shared store, hook files and journal, its own name
        and folders, and its metrics port where it serves one."""
        for name in self.c.node_names:
            metrics = f"NodeMetricsPort={metrics_ports[name]}\n" if name in metrics_ports else ""
            self.c.node_coda_conf(name).write_text(
                f"# Written by coda dev-cluster.\nProfileStore={self.c.profile_store}\n"
                f"ReloadIntervalS=1\nHookStatsFile={self.c.hook_stats_file}\n"
                # A dev cluster shares its machine with builds and tests: a decision that a
                # busy CPU slowed past the production budget is still the decision.
                f"HookBudgetMs={DEV_HOOK_BUDGET_MS:g}\n"
                f"DecisionJournal={self.c.decision_journal}\n"
                f"NodeName={name}\nNodeStateDir={self.c.node_state_dir_of(name)}\n"
                f"NodeRuntimeDir={self.c.node_runtime_dir_of(name)}\nNodeIntervalS=1\n"
                f"NodeProgressDir={self.c.node_progress_dir_of(name)}\n"
                f"{metrics}{self.c.coda_conf_extra}"
            )


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
    cores_per_socket = node.cpus // node.sockets // node.threads_per_core  # Cores= counts cores
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
