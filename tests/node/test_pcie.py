"""PCIe: heavy DNN jobs behind one PCIe switch are reported for placement (CODA: two jobs
moving 8-12 GB/s each slow each other by 5-10 % on a shared switch)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coda_common.config.codaconf import CodaConfig
from coda_node.daemon.adaptive import AdaptiveLoop
from coda_node.policy.contention import PcieUse, pcie_pairs
from coda_node.system.paths import SystemRoot

GB = 1e9


@pytest.mark.parametrize(
    ("uses", "pairs"),
    [
        ({1: ("sw1", 10), 2: ("sw1", 9)}, [(1, 2, "sw1")]),
        ({1: ("sw1", 10), 2: ("sw1", 3)}, []),  # one light job: no pair
        ({1: ("sw1", 10), 2: ("sw2", 12)}, []),  # heavy, but on different switches
        (
            {1: ("sw1", 8), 2: ("sw1", 8), 3: ("sw1", 11)},
            [(1, 2, "sw1"), (1, 3, "sw1"), (2, 3, "sw1")],
        ),
        ({1: ("", 12)}, []),
    ],
)
def test_heavy_jobs_on_one_switch_are_paired(uses: dict, pairs: list) -> None:
    given = {
        j: PcieUse(j, frozenset({sw}) if sw else frozenset(), gbps * GB)
        for j, (sw, gbps) in uses.items()
    }
    assert pcie_pairs(given) == pairs


def _device(root: Path, chain: list[str]) -> None:
    """sysfs: /sys/devices/pci0000:00/<chain...> and /sys/bus/pci/devices/<last> -> it."""
    real = root / "sys/devices/pci0000:00" / "/".join(chain)
    real.mkdir(parents=True)
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, links), links / chain[-1])


def test_the_switch_of_a_gpu_comes_from_its_sysfs_chain(tmp_path: Path) -> None:
    # Two GPUs behind one switch (upstream port 0000:01:00.0), one behind another switch,
    # one right under a root port.
    _device(tmp_path, ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:07:00.0"])
    _device(tmp_path, ["0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:0f:00.0"])
    _device(tmp_path, ["0000:00:02.0", "0000:40:00.0", "0000:41:08.0", "0000:47:00.0"])
    _device(tmp_path, ["0000:00:03.0", "0000:87:00.0"])
    loop = AdaptiveLoop(
        CodaConfig(profile_store=tmp_path / "store", node_progress_dir=Path("/progress")),
        SystemRoot(tmp_path),
        node_name="gpu01",
        mba=False,
    )
    # NVML spells bus ids with an 8-digit domain and upper-case hex.
    assert loop.switch_of("00000000:07:00.0") == "0000:01:00.0"
    assert loop.switch_of("00000000:0F:00.0") == "0000:01:00.0"
    assert loop.switch_of("00000000:47:00.0") == "0000:40:00.0"
    assert loop.switch_of("00000000:87:00.0") == "0000:00:03.0"
    assert loop.switch_of("00000000:99:00.0") is None  # not in sysfs
    assert loop.switch_of(None) is None
