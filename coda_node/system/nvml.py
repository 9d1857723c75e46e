"""The node daemon's one NVML choke point.

Every call into NVML goes through :meth:`Nvml._call`, which initialises the library lazily,
turns "not supported on this GPU/driver" into :data:`NA` and a missing or broken library into
:class:`NvmlUnavailable` (nvitop's ``nvmlQuery`` and its ``NA`` value do the same). Importing
this module or constructing :class:`Nvml` neither imports ``pynvml`` nor touches the driver.

Readings are in the units their names carry; ``None`` means "not available here" (the GPU or
driver does not support the query, or we lack permission), never zero.

Slurm's GRES index is mapped to an NVML device through the ``/dev/nvidiaN`` minor number
(:meth:`Nvml.minor_to_index`): NVML enumerates by PCI bus id unless ``CUDA_DEVICE_ORDER`` says
otherwise, and nothing promises that this matches the order of the device files.

Not thread-safe: one daemon thread owns one :class:`Nvml`.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final


class _NotAvailable:
    """Type of :data:`NA`: a query this GPU or driver cannot answer."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NA"

    def __bool__(self) -> bool:
        return False


NA: Final = _NotAvailable()
"""What :meth:`Nvml._call` returns for NOT_SUPPORTED, NO_PERMISSION and FUNCTION_NOT_FOUND."""

# NVML's pcie throughput is in KB/s: nvml.h, nvmlDeviceGetPcieThroughput,
# "@param value Reference in which to return throughput in KB/s".
_BYTES_PER_KB: Final = 1024

_DEFAULT_RETRY_INTERVAL_S: Final = 60.0

# Error codes (pynvml.NVML_ERROR_*), by name so that this module never imports pynvml.
# A query this GPU/driver/user cannot answer: the field is "not available", nothing is wrong.
_NA_ERRORS: Final = ("NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND")
# The library as a whole is gone: nothing on this node can be read until it comes back.
_LIBRARY_ERRORS: Final = (
    "UNINITIALIZED",
    "LIBRARY_NOT_FOUND",
    "DRIVER_NOT_LOADED",
    "LIB_RM_VERSION_MISMATCH",
)
# Calls whose failure means NVML cannot be used at all, whatever the error code.
_INIT_FUNCTIONS: Final = frozenset({"nvmlInit", "nvmlDeviceGetCount"})


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node; ``reason`` says why in plain words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _DeviceError(Exception):
    """One GPU failed a query in a way that makes its whole reading untrustworthy."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_mem_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. ``index`` is NVML's; ``minor`` is N in ``/dev/nvidiaN``.

    ``processes`` is empty both when none run and when the driver cannot list them.
    """

    index: int
    minor: int | None
    uuid: str | None
    pci_bus_id: str | None
    name: str | None
    util_pct: float | None
    mem_util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    pcie_rx_bytes_per_s: float | None
    pcie_tx_bytes_per_s: float | None
    processes: tuple[GpuProcess, ...]

    @classmethod
    def unreadable(cls, index: int) -> GpuSample:
        """A GPU that answered nothing we can trust (lost, needs a reset, ...)."""
        return cls(index, None, None, None, None, None, None, None, None, None, None, ())


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    available: bool
    detail: str
    driver_version: str | None
    gpu_count: int


def _text(value: Any) -> str | None:
    """pynvml returns str since 11.x and bytes before; NA stays None."""
    if value is NA or value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _plain_reason(fn_name: str, code_name: str | None, message: str) -> str:
    """A reason an admin can act on, for an error that makes NVML unusable."""
    if code_name == "LIBRARY_NOT_FOUND":
        return "NVML library not found (libnvidia-ml.so.1); is the NVIDIA driver installed?"
    if code_name == "DRIVER_NOT_LOADED":
        return "NVIDIA kernel driver not loaded (nvidia module); is the GPU driver running?"
    if code_name == "LIB_RM_VERSION_MISMATCH":
        return (
            "NVML library and NVIDIA kernel driver versions differ; "
            "reload the nvidia module or reboot after the driver upgrade"
        )
    if code_name == "NO_PERMISSION":
        return f"no permission to use NVML ({fn_name}); can this user open /dev/nvidia*?"
    if code_name == "UNINITIALIZED":
        return f"NVML was shut down underneath us ({fn_name}: {message})"
    return f"NVML unusable ({fn_name}: {message})"


class Nvml:
    """Lazy, failure-tolerant access to NVML for sampling GPUs.

    ``lib`` is the ``pynvml`` module or a double with its surface (tests/node/nvml_double.py);
    by default ``pynvml`` is imported on first use. After a failed initialisation NVML is
    tried again at most once per ``retry_interval_s`` of ``clock``.
    """

    def __init__(
        self,
        lib: Any | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_interval_s: float = _DEFAULT_RETRY_INTERVAL_S,
    ) -> None:
        self._lib: Any | None = lib
        self._clock = clock
        self._retry_interval_s = retry_interval_s
        self._initialised = False
        self._failure: str | None = None
        self._failed_at_s = 0.0
        self._device_count = 0
        self._driver_version: str | None = None
        self._handles: dict[int, Any] = {}
        self._na_codes: frozenset[int] = frozenset()
        self._library_codes: frozenset[int] = frozenset()
        self._names_by_code: dict[int, str] = {}
        self._codes_indexed = False
        self.last_errors: dict[int, str] = {}
        """NVML index -> what went wrong with that GPU in the latest sample() or
        minor_to_index(); each of them replaces it."""

    # -- the choke point ---------------------------------------------------------------

    def _call(self, fn_name: str, *args: Any) -> Any:
        """Call ``lib.<fn_name>(*args)``: the only place that calls into NVML.

        Returns the result, or :data:`NA` when this GPU/driver/user cannot answer. Raises
        :class:`NvmlUnavailable` when NVML as a whole cannot be used, :class:`_DeviceError`
        when one GPU fails (GPU_IS_LOST, RESET_REQUIRED, ...).
        """
        if fn_name not in _INIT_FUNCTIONS and fn_name != "nvmlShutdown":
            self._ensure_initialised()
        lib = self._library()
        try:
            return getattr(lib, fn_name)(*args)
        except lib.NVMLError as err:
            code = getattr(err, "value", None)
            code_name = self._names_by_code.get(code) if isinstance(code, int) else None
            message = str(err)
            if fn_name in _INIT_FUNCTIONS or code in self._library_codes:
                raise NvmlUnavailable(_plain_reason(fn_name, code_name, message)) from err
            if code in self._na_codes:
                return NA
            raise _DeviceError(f"{message} ({fn_name})") from err
        except self._mismatch_error(lib):
            # pynvml raises this instead of FUNCTION_NOT_FOUND for unversioned wrappers
            # (e.g. nvmlDeviceGetComputeRunningProcesses -> _v3) on an older driver.
            return NA

    def _library(self) -> Any:
        if self._lib is None:
            try:
                self._lib = importlib.import_module("pynvml")
            except ImportError as err:
                raise NvmlUnavailable("pynvml not installed (pip install nvidia-ml-py)") from err
        if not self._codes_indexed:
            self._index_error_codes(self._lib)
        return self._lib

    def _index_error_codes(self, lib: Any) -> None:
        names = {
            getattr(lib, attr): attr.removeprefix("NVML_ERROR_")
            for attr in dir(lib)
            if attr.startswith("NVML_ERROR_") and isinstance(getattr(lib, attr), int)
        }
        self._names_by_code = names
        self._na_codes = frozenset(c for c, n in names.items() if n in _NA_ERRORS)
        self._library_codes = frozenset(c for c, n in names.items() if n in _LIBRARY_ERRORS)
        self._codes_indexed = True

    @staticmethod
    def _mismatch_error(lib: Any) -> type[Exception]:
        found = getattr(lib, "NVMLLibraryMismatchError", None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
        return _NeverRaised

    def _ensure_initialised(self) -> None:
        if self._initialised:
            return
        now_s = self._clock()
        if self._failure is not None and now_s - self._failed_at_s < self._retry_interval_s:
            raise NvmlUnavailable(self._failure)
        try:
            self._library()
            self._call("nvmlInit")
            self._initialised = True
            count = self._call("nvmlDeviceGetCount")
        except NvmlUnavailable as err:
            self._mark_failed(err.reason, now_s)
            raise
        self._device_count = int(count)
        self._handles = {}
        self._failure = None
        try:
            self._driver_version = _text(self._checked("nvmlSystemGetDriverVersion"))
        except _DeviceError:
            self._driver_version = None

    def _mark_failed(self, reason: str, now_s: float) -> None:
        if self._initialised:
            self._initialised = False
            # Already broken: the reason we keep is the first one.
            with contextlib.suppress(NvmlUnavailable, _DeviceError):
                self._call("nvmlShutdown")
        self._failure = reason
        self._failed_at_s = now_s
        self._device_count = 0
        self._handles = {}
        self._driver_version = None

    def _checked(self, fn_name: str, *args: Any) -> Any:
        """_call, but a library-wide failure after init also resets our state."""
        try:
            return self._call(fn_name, *args)
        except NvmlUnavailable as err:
            if self._initialised:
                self._mark_failed(err.reason, self._clock())
            raise

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._checked("nvmlDeviceGetHandleByIndex", index)
            if handle is NA:
                # Inside a container or a device cgroup, GPUs we may not open say NO_PERMISSION.
                raise _DeviceError("no permission to open this GPU (nvmlDeviceGetHandleByIndex)")
            self._handles[index] = handle
        return handle

    # -- public API --------------------------------------------------------------------

    def status(self) -> NvmlStatus:
        """Whether NVML works here and, if not, why. Never raises."""
        try:
            self._ensure_initialised()
        except NvmlUnavailable as err:
            return NvmlStatus(False, err.reason, None, 0)
        count = self._device_count
        driver = self._driver_version or "unknown"
        detail = f"NVML ready, driver {driver}, {count} GPU{'s' if count != 1 else ''}"
        return NvmlStatus(True, detail, self._driver_version, count)

    def sample(self) -> list[GpuSample]:
        """One reading per NVML device; [] when NVML is unavailable (see :meth:`status`)."""
        self.last_errors = {}
        try:
            self._ensure_initialised()
            samples = []
            for index in range(self._device_count):
                try:
                    samples.append(self._sample_device(index))
                except _DeviceError as err:
                    self.last_errors[index] = str(err)
                    samples.append(GpuSample.unreadable(index))
        except NvmlUnavailable:
            return []
        return samples

    def minor_to_index(self) -> dict[int, int]:
        """``/dev/nvidiaN`` minor number -> NVML index, for every GPU that reports one."""
        self.last_errors = {}
        mapping: dict[int, int] = {}
        try:
            self._ensure_initialised()
            for index in range(self._device_count):
                try:
                    minor = self._checked("nvmlDeviceGetMinorNumber", self._handle(index))
                except _DeviceError as err:
                    self.last_errors[index] = str(err)
                    continue
                if minor is not NA:
                    mapping[int(minor)] = index
        except NvmlUnavailable:
            return {}
        return mapping

    def shutdown(self) -> None:
        """Release NVML if we initialised it; the next call initialises it again."""
        if not self._initialised:
            return
        self._initialised = False
        self._handles = {}
        self._device_count = 0
        # If the driver went away first there is nothing left to release.
        with contextlib.suppress(NvmlUnavailable, _DeviceError):
            self._call("nvmlShutdown")

    # -- one device --------------------------------------------------------------------

    def _sample_device(self, index: int) -> GpuSample:
        handle = self._handle(index)
        lib = self._library()
        minor = self._checked("nvmlDeviceGetMinorNumber", handle)
        pci = self._checked("nvmlDeviceGetPciInfo", handle)
        util = self._checked("nvmlDeviceGetUtilizationRates", handle)
        mem = self._checked("nvmlDeviceGetMemoryInfo", handle)
        rx_kb_per_s = self._checked(
            "nvmlDeviceGetPcieThroughput", handle, lib.NVML_PCIE_UTIL_RX_BYTES
        )
        tx_kb_per_s = self._checked(
            "nvmlDeviceGetPcieThroughput", handle, lib.NVML_PCIE_UTIL_TX_BYTES
        )
        procs = self._checked("nvmlDeviceGetComputeRunningProcesses", handle)
        return GpuSample(
            index=index,
            minor=None if minor is NA else int(minor),
            uuid=_text(self._checked("nvmlDeviceGetUUID", handle)),
            pci_bus_id=None if pci is NA else _text(pci.busId),
            name=_text(self._checked("nvmlDeviceGetName", handle)),
            util_pct=None if util is NA else float(util.gpu),
            mem_util_pct=None if util is NA else float(util.memory),
            mem_used_bytes=None if mem is NA else int(mem.used),
            mem_total_bytes=None if mem is NA else int(mem.total),
            pcie_rx_bytes_per_s=_kb_to_bytes(rx_kb_per_s),
            pcie_tx_bytes_per_s=_kb_to_bytes(tx_kb_per_s),
            processes=() if procs is NA else tuple(_process(p) for p in procs),
        )


class _NeverRaised(Exception):
    """Stands in for NVMLLibraryMismatchError when the library has none."""


def _kb_to_bytes(kb_per_s: Any) -> float | None:
    return None if kb_per_s is NA else float(kb_per_s) * _BYTES_PER_KB


def _process(proc: Any) -> GpuProcess:
    # usedGpuMemory is None where the driver cannot tell (pynvml maps
    # NVML_VALUE_NOT_AVAILABLE to None, e.g. under Windows WDDM).
    used = proc.usedGpuMemory
    return GpuProcess(pid=int(proc.pid), used_mem_bytes=None if used is None else int(used))
