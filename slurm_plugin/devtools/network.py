"""A multi-node or high-availability dev cluster's network: one namespace per node (and per
controller of a high-availability cluster), joined by veth pairs to a bridge in the host's
namespace where a lone slurmctld listens; the names are host-wide."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from slurm_plugin.devtools.layout import CTLD_ADDR, START_TIMEOUT_S, ClusterLayout, DevClusterError

__all__ = ["BRIDGE", "NETNS_PREFIX", "NETWORK_BITS", "make_network", "remove_network"]

BRIDGE = "coda-br0"
NETNS_PREFIX = "coda-"
"""A node's (or controller's) network namespace, and the host end of its veth pair, is
``coda-<name>``."""
NETWORK_BITS = 24


def make_network(c: ClusterLayout) -> None:
    """The bridge (a lone slurmctld's address) and one namespace with a veth pair per
    node and per controller of a high-availability cluster."""
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{CTLD_ADDR}/{NETWORK_BITS}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    addrs = {n: c.ctld_addr(n) for n in c.controller_names}
    addrs.update((n, c.node_addr(n)) for n in c.node_names)
    for name, addr in addrs.items():
        ns = f"{NETNS_PREFIX}{name}"
        _ip("netns", "add", ns)
        _ip("link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", ns, "master", BRIDGE, "up")
        _ip("addr", "add", f"{addr}/{NETWORK_BITS}", "dev", "eth0", netns=ns)
        _ip("link", "set", "eth0", "up", netns=ns)
        _ip("link", "set", "lo", "up", netns=ns)


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


def remove_network() -> None:
    """Delete the dev cluster's namespaces (their veth pairs go with them) and bridge."""
    if shutil.which("ip") is None:
        return  # nothing made them here
    listing = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    for line in listing.stdout.splitlines():
        ns = line.split(" ", 1)[0]
        if ns.startswith((f"{NETNS_PREFIX}gpu", f"{NETNS_PREFIX}ctl")):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
