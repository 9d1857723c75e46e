"""A job slimmed to fewer cores keeps the CPUs nearest its GPUs (sysfs ``local_cpulist``).

The sysfs trees here are laid out as the kernel's: ``/sys/devices/pci<dom>:<bus>/...`` holds
each device's directory with ``local_cpulist`` and ``numa_node``, and
``/sys/bus/pci/devices/<address>`` is a symlink to it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coda_node.enforce.state import Limit
from coda_node.policy.targets import JobFacts, choose_cpus, plan
from coda_node.system.paths import SystemRoot
from coda_node.system.topology import GpuLocality, pci_address
from tests.node.node_fixtures import PCI_BUS_IDS, FakeNode, build_node


def put_device(root: Path, address: str, local_cpulist: str | None, numa_node: int = -1) -> None:
    """One PCI device under a root port, as sysfs shows it."""
    domain, bus = address.split(":")[:2]
    real = root / f"sys/devices/pci{domain}:{bus[:1]}0/{domain}:{bus[:1]}0:01.0/{address}"
    real.mkdir(parents=True)
    if local_cpulist is not None:
        (real / "local_cpulist").write_text(local_cpulist + "\n")
    (real / "numa_node").write_text(f"{numa_node}\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, links), links / address)


@pytest.mark.parametrize(
    "bus_id,address",
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML: 8-digit domain, upper-case hex
        ("0000:3b:00.0", "0000:3b:00.0"),  # already as sysfs names it
        ("3B:00.0", "0000:3b:00.0"),  # no domain: domain 0
        ("00010000:01:00.0", "10000:01:00.0"),  # a VMD domain keeps all its digits
        (" 00000000:07:00.1\n", "0000:07:00.1"),
        ("GPU-5a1e", None),
        ("00000000:3B:00.9", None),  # functions are 0-7
        ("", None),
        (None, None),
    ],
)
def test_pci_address_is_spelled_as_sysfs_spells_it(bus_id: str | None, address: str | None) -> None:
    assert pci_address(bus_id) == address


def test_local_cpus_come_from_the_devices_local_cpulist(tmp_path: Path) -> None:
    put_device(tmp_path, "0000:07:00.0", "0-15,32-47", numa_node=0)
    put_device(tmp_path, "0000:87:00.0", "16-31,48-63", numa_node=1)
    put_device(tmp_path, "0000:90:00.0", None)  # an old kernel without the file
    put_device(tmp_path, "0000:b7:00.0", "garbage")
    loc = GpuLocality(SystemRoot(tmp_path))

    assert loc.local_cpus("00000000:07:00.0") == frozenset([*range(16), *range(32, 48)])
    assert loc.local_cpus("00000000:87:00.0") == frozenset([*range(16, 32), *range(48, 64)])
    assert loc.local_cpus("00000000:90:00.0") is None
    assert loc.local_cpus("00000000:B7:00.0") is None
    assert loc.local_cpus("00000000:99:00.0") is None  # no such device
    assert loc.local_cpus(None) is None
    # Two GPUs on different sockets: both sockets' CPUs; unknown GPUs add nothing.
    both = ("00000000:07:00.0", "00000000:87:00.0", "00000000:99:00.0", None)
    assert loc.near_cpus(both) == frozenset(range(64))
    assert loc.near_cpus(("00000000:99:00.0",)) == frozenset()
    assert loc.near_cpus(()) == frozenset()


def test_a_devices_locality_is_read_once(tmp_path: Path) -> None:
    put_device(tmp_path, "0000:07:00.0", "0-3")
    loc = GpuLocality(SystemRoot(tmp_path))
    assert loc.near_cpus(("00000000:07:00.0",)) == frozenset(range(4))
    (tmp_path / "sys/bus/pci/devices/0000:07:00.0/local_cpulist").write_text("4-7\n")
    assert loc.near_cpus(("00000000:07:00.0",)) == frozenset(range(4))
    assert loc.local_cpus("00000000:07:00.0") == frozenset(range(4))


@pytest.mark.parametrize(
    "allocated,cores,near,kept",
    [
        # Nothing known about locality: the lowest-numbered CPUs, as before.
        ({0, 1, 32, 33}, 2, set(), {0, 1}),
        # The GPU is on the second socket (32-63): its CPUs first.
        ({0, 1, 32, 33}, 2, set(range(32, 64)), {32, 33}),
        ({0, 1, 32, 33}, 3, set(range(32, 64)), {0, 32, 33}),
        # Fewer near CPUs in the allocation than wanted: all of them, then the lowest others.
        ({4, 5, 6, 40}, 2, set(range(32, 64)), {4, 40}),
        # Near CPUs outside the allocation are never taken.
        ({0, 1, 2}, 2, {7, 8}, {0, 1}),
        # A single-socket node lists every CPU as local: no change.
        ({3, 9, 12}, 1, set(range(16)), {3}),
        ({3, 9, 12}, 5, {12}, {3, 9, 12}),
    ],
)
def test_choose_cpus_keeps_the_cpus_near_the_gpus_first(
    allocated: set[int], cores: int, near: set[int], kept: set[int]
) -> None:
    got = choose_cpus(frozenset(allocated), cores, frozenset(near))
    assert got == frozenset(kept)
    assert got == choose_cpus(frozenset(allocated), cores, frozenset(near))  # stable


def test_a_cores_limit_keeps_the_cpus_near_the_gpus() -> None:
    facts = {
        7: JobFacts(7, frozenset({0, 1, 32, 33}), True, near_cpus=frozenset(range(32, 64))),
        8: JobFacts(8, frozenset({2, 3, 34, 35}), True),
    }
    targets, problems = plan(facts, {7: Limit(cores=2), 8: Limit(cores=2)})
    assert problems == []
    assert targets[7].cpus == frozenset({32, 33})
    assert targets[8].cpus == frozenset({2, 3})


def _numa_node(node: FakeNode, socket_of_gpu: dict[int, int]) -> None:
    """Two sockets, CPUs 0-31 and 32-63; NVML GPU i on ``socket_of_gpu[i]``."""
    for i, socket in socket_of_gpu.items():
        cpus = "0-31" if socket == 0 else "32-63"
        put_device(node.root, f"0000:{PCI_BUS_IDS[i].lower()}:00.0", cpus, numa_node=socket)


def test_the_daemon_slims_a_job_to_the_cpus_on_its_gpus_socket(tmp_path: Path) -> None:
    # Job 5001 holds CPUs 0-1,32 and Slurm's GPUs 0 and 1, which NVML lists as 2 and 3.
    node = build_node(tmp_path)
    refs = node.expected_gpu_refs(5001)
    assert [nvml for _, _, nvml in refs] == [2, 3]
    _numa_node(node, {i: (1 if i in (2, 3) else 0) for i in range(8)})
    node.set_limits({5001: Limit(cores=1)})
    daemon = node.daemon()

    report = daemon.tick()

    assert report.results[5001].applied == ["cpuset 32"]
    assert node.cpuset_texts(5001)["."] == "32\n"
    # Restored exactly as Slurm set it when the limit goes.
    node.set_limits({})
    daemon.tick()
    assert node.cpuset_texts(5001)["."] == "0-1,32\n"


def test_without_sysfs_locality_the_daemon_keeps_the_lowest_cpus(tmp_path: Path) -> None:
    node = build_node(tmp_path)
    node.set_limits({5001: Limit(cores=1)})
    report = node.daemon().tick()
    assert report.results[5001].applied == ["cpuset 0"]
