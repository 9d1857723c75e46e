"""The one root every node-side system path goes through.

Production uses ``/``; tests point it at a fixture tree laid out like the kernel's
(``sys/fs/cgroup``, ``sys/fs/resctrl``, ``proc``, ``dev``), as node_exporter's
``--path.sysfs`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SystemRoot:
    root: Path = Path("/")

    def path(self, absolute: str) -> Path:
        """``/sys/fs/cgroup`` -> ``<root>/sys/fs/cgroup``."""
        return self.root / absolute.lstrip("/")

    @property
    def proc(self) -> Path:
        return self.path("/proc")

    @property
    def sys(self) -> Path:
        return self.path("/sys")

    @property
    def dev(self) -> Path:
        return self.path("/dev")
