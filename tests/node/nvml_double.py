"""An NVML double with pynvml's surface, for hardware-free tests of coda_node.system.nvml.

:class:`FakeNvml` instances look like the ``pynvml`` module: the same function names and
parameter lists, the real ``pynvml.NVMLError`` (so ``NVMLError(code)`` gives the same
per-code subclass) and the real ``NVML_*`` constants. Return values are pynvml's own ctypes
structures where pynvml returns one. tests/node/test_nvml.py checks the surface against pynvml.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

# Every function coda_node.system.nvml may call; test_nvml checks each against pynvml's signature.
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
)

GIB = 1024**3


@dataclass
class FakeGpu:
    """One GPU as NVML would report it; PCIe throughput in NVML's unit, KB/s."""

    minor: int
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA A100-SXM4-40GB"
    pci_bus_id: str = "00000000:07:00.0"
    util_pct: int = 0
    mem_util_pct: int = 0
    mem_used_bytes: int = 0
    mem_total_bytes: int = 40 * GIB
    pcie_rx_kb_per_s: int = 0
    pcie_tx_kb_per_s: int = 0
    # (pid, used GPU memory in bytes or None where the driver cannot tell)
    processes: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass(frozen=True)
class FakeHandle:
    """Stands in for pynvml's c_nvmlDevice_t pointer."""

    index: int


class FakeNvml:
    """A pynvml module double: configurable GPUs, injected errors and call counts.

    ``fail(fn_name, code, index)`` makes ``fn_name`` raise ``NVMLError(code)`` (for GPU
    ``index``, or for every call when ``index`` is None) until ``heal`` removes it.
    ``as_bytes`` returns name, UUID, driver version and busId as bytes, like pynvml < 11.
    """

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        as_bytes: bool = False,
    ) -> None:
        self.gpus = list(gpus or [])
        self.driver_version = driver_version
        self.as_bytes = as_bytes
        self.calls: Counter[str] = Counter()
        self.errors: dict[tuple[str, int | None], int] = {}
        self.init_refcount = 0

    def __getattr__(self, name: str) -> Any:
        # NVML_ERROR_* constants and the NVMLError_* subclasses are pynvml's own.
        if name.startswith(("NVML_ERROR_", "NVMLError_")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def __dir__(self) -> list[str]:
        errors = [n for n in dir(pynvml) if n.startswith(("NVML_ERROR_", "NVMLError_"))]
        return sorted({*super().__dir__(), *errors})

    # -- configuration -------------------------------------------------------------

    def fail(self, fn_name: str, code: int, index: int | None = None) -> None:
        self.errors[(fn_name, index)] = code

    def heal(self, fn_name: str, index: int | None = None) -> None:
        self.errors.pop((fn_name, index), None)

    # -- helpers -------------------------------------------------------------------

    def _enter(self, fn_name: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls[fn_name] += 1
        index = None if handle is None else handle.index
        code = self.errors.get((fn_name, index), self.errors.get((fn_name, None)))
        if code is not None:
            raise pynvml.NVMLError(code)
        if fn_name != "nvmlInit" and self.init_refcount == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.index]

    def _gpu(self, fn_name: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._enter(fn_name, handle)
        assert gpu is not None
        return gpu

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.as_bytes else value

    # -- pynvml's surface ------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.init_refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.init_refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._str(self.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", FakeHandle(index))
        return FakeHandle(index)

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", handle).minor

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str | bytes:
        return self._str(self._gpu("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        return self._str(self._gpu("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        if self.as_bytes:
            # Before pynvml 11 the struct handed back busId as the raw c_char array: bytes.
            return SimpleNamespace(busId=gpu.pci_bus_id.encode(), busIdLegacy=b"")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_pct, memory=gpu.mem_util_pct)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.mem_total_bytes - gpu.mem_used_bytes
        return pynvml.c_nvmlMemory_t(total=gpu.mem_total_bytes, free=free, used=gpu.mem_used_bytes)

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", device)
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kb_per_s
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kb_per_s
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in gpu.processes
        ]
