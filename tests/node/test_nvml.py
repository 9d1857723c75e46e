"""coda_node.system.nvml against an NVML double with pynvml's surface (and a real GPU where
present)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pynvml
import pytest

from coda_node.system.nvml import NA, GpuProcess, GpuSample, Nvml
from tests.node.nvml_double import FUNCTIONS, GIB, FakeGpu, FakeNvml

MINORS_OUT_OF_ORDER = [2, 0, 3, 1]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def four_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            minor=minor,
            uuid=f"GPU-{index}",
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
            util_pct=10 * (index + 1),
            mem_util_pct=5 * (index + 1),
            mem_used_bytes=(index + 1) * GIB,
            mem_total_bytes=80 * GIB,
            pcie_rx_kb_per_s=1000 * (index + 1),
            pcie_tx_kb_per_s=500 * (index + 1),
            processes=[(4000 + index, 512 * 1024**2)],
        )
        for index, minor in enumerate(MINORS_OUT_OF_ORDER)
    ]


def lost(sample: GpuSample) -> bool:
    return sample == GpuSample.unreadable(sample.index)


# -- the double cannot drift from pynvml ----------------------------------------------


@pytest.mark.parametrize("fn_name", FUNCTIONS)
def test_double_matches_pynvml_signature(fn_name: str) -> None:
    real = inspect.signature(getattr(pynvml, fn_name)).parameters.values()
    fake = inspect.signature(getattr(FakeNvml(), fn_name)).parameters.values()

    def shape(params: object) -> tuple[int, int]:
        ps = list(params)  # type: ignore[call-overload]
        required = sum(1 for p in ps if p.default is inspect.Parameter.empty)
        return required, len(ps)

    assert shape(fake) == shape(real)


def test_double_shares_pynvml_errors_and_constants() -> None:
    fake = FakeNvml()
    assert fake.NVMLError is pynvml.NVMLError
    assert fake.NVMLLibraryMismatchError is pynvml.NVMLLibraryMismatchError
    assert fake.NVML_PCIE_UTIL_RX_BYTES == pynvml.NVML_PCIE_UTIL_RX_BYTES
    assert fake.NVML_PCIE_UTIL_TX_BYTES == pynvml.NVML_PCIE_UTIL_TX_BYTES
    real_codes = {n: getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
    assert {n: getattr(fake, n) for n in dir(fake) if n.startswith("NVML_ERROR_")} == real_codes
    # pynvml turns a code into its own subclass in NVMLError.__new__.
    assert type(fake.NVMLError(fake.NVML_ERROR_GPU_IS_LOST)) is pynvml.NVMLError_GpuIsLost


# -- laziness -------------------------------------------------------------------------


def test_import_and_construction_touch_nothing() -> None:
    code = (
        "import sys\n"
        "from coda_node.system.nvml import Nvml\n"
        "Nvml()\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    fake = FakeNvml(four_gpus())
    Nvml(fake)
    assert fake.calls == {}


def test_init_once_and_handles_cached() -> None:
    fake = FakeNvml(four_gpus())
    nvml = Nvml(fake)
    for _ in range(3):
        assert len(nvml.sample()) == 4
    nvml.minor_to_index()
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetCount"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 4


# -- readings -------------------------------------------------------------------------


def test_minor_to_index_follows_minor_numbers_not_order() -> None:
    nvml = Nvml(FakeNvml(four_gpus()))
    assert nvml.minor_to_index() == {2: 0, 0: 1, 3: 2, 1: 3}
    assert [s.minor for s in nvml.sample()] == MINORS_OUT_OF_ORDER


def test_sample_reads_every_field_in_units() -> None:
    first = Nvml(FakeNvml(four_gpus())).sample()[0]
    assert first == GpuSample(
        index=0,
        minor=2,
        uuid="GPU-0",
        pci_bus_id="00000000:18:00.0",
        name="NVIDIA H100 80GB HBM3",
        util_pct=10.0,
        mem_util_pct=5.0,
        mem_used_bytes=GIB,
        mem_total_bytes=80 * GIB,
        pcie_rx_bytes_per_s=1000 * 1024.0,  # NVML reports KB/s
        pcie_tx_bytes_per_s=500 * 1024.0,
        processes=(GpuProcess(pid=4000, used_mem_bytes=512 * 1024**2),),
    )


def test_process_memory_unknown_is_none() -> None:
    gpus = four_gpus()
    gpus[1].processes = [(77, None), (78, 1024)]
    procs = Nvml(FakeNvml(gpus)).sample()[1].processes
    assert procs == (GpuProcess(77, None), GpuProcess(78, 1024))


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_names_as_str_or_bytes(as_bytes: bool) -> None:
    nvml = Nvml(FakeNvml(four_gpus(), as_bytes=as_bytes))
    s = nvml.sample()[3]
    assert (s.name, s.uuid, s.pci_bus_id) == ("NVIDIA H100 80GB HBM3", "GPU-3", "00000000:1B:00.0")
    assert nvml.status().driver_version == "550.54.15"


@pytest.mark.parametrize(
    ("fn_name", "code", "none_fields"),
    [
        (
            "nvmlDeviceGetPcieThroughput",
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            {"pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s"},
        ),
        (
            "nvmlDeviceGetUtilizationRates",
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            {"util_pct", "mem_util_pct"},
        ),
        (
            "nvmlDeviceGetMemoryInfo",
            pynvml.NVML_ERROR_NO_PERMISSION,
            {"mem_used_bytes", "mem_total_bytes"},
        ),
        ("nvmlDeviceGetMinorNumber", pynvml.NVML_ERROR_NOT_SUPPORTED, {"minor"}),
        ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, {"uuid"}),
    ],
)
def test_unsupported_query_is_none_and_the_rest_is_read(
    fn_name: str, code: int, none_fields: set[str]
) -> None:
    fake = FakeNvml(four_gpus())
    fake.fail(fn_name, code, index=2)
    nvml = Nvml(fake)
    samples = nvml.sample()
    assert nvml.last_errors == {}
    affected = samples[2]
    for name in GpuSample.__slots__:
        value = getattr(affected, name)
        assert (value is None) == (name in none_fields), name
    assert samples[1] == Nvml(FakeNvml(four_gpus())).sample()[1]


def test_processes_unsupported_is_empty() -> None:
    fake = FakeNvml(four_gpus())
    fake.fail("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NOT_SUPPORTED, index=0)
    sample = Nvml(fake).sample()[0]
    assert sample.processes == ()
    assert sample.util_pct == 10.0


def test_version_mismatch_wrapper_error_is_not_available() -> None:
    # pynvml's unversioned nvmlDeviceGetComputeRunningProcesses raises
    # NVMLLibraryMismatchError (not an NVMLError) when the driver lacks the _v3 symbol.
    fake = FakeNvml(four_gpus())

    def old_driver(handle: object) -> list[object]:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    fake.nvmlDeviceGetComputeRunningProcesses = old_driver  # type: ignore[method-assign]
    samples = Nvml(fake).sample()
    assert [s.processes for s in samples] == [(), (), (), ()]
    assert samples[0].util_pct == 10.0


@pytest.mark.parametrize(
    ("fn_name", "code", "expected"),
    [
        ("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        ("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        ("nvmlDeviceGetPciInfo", pynvml.NVML_ERROR_RESET_REQUIRED, "GPU requires restart"),
        ("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_one_broken_gpu_leaves_the_others(fn_name: str, code: int, expected: str) -> None:
    fake = FakeNvml(four_gpus())
    fake.fail(fn_name, code, index=1)
    nvml = Nvml(fake)
    samples = nvml.sample()
    healthy = Nvml(FakeNvml(four_gpus())).sample()
    assert [s.index for s in samples] == [0, 1, 2, 3]
    assert lost(samples[1])
    assert [samples[i] for i in (0, 2, 3)] == [healthy[i] for i in (0, 2, 3)]
    assert list(nvml.last_errors) == [1]
    assert expected in nvml.last_errors[1]
    assert nvml.status().available


def test_lost_gpu_left_out_of_minor_map() -> None:
    fake = FakeNvml(four_gpus())
    fake.fail("nvmlDeviceGetMinorNumber", pynvml.NVML_ERROR_GPU_IS_LOST, index=3)
    nvml = Nvml(fake)
    assert nvml.minor_to_index() == {2: 0, 0: 1, 3: 2}
    assert "GPU is lost" in nvml.last_errors[3]


def test_errors_clear_when_the_gpu_answers_again() -> None:
    fake = FakeNvml(four_gpus())
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, index=0)
    nvml = Nvml(fake)
    assert lost(nvml.sample()[0])
    fake.heal("nvmlDeviceGetMemoryInfo", index=0)
    assert nvml.sample()[0].mem_used_bytes == GIB
    assert nvml.last_errors == {}


# -- NVML unavailable -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn_name", "code", "reason"),
    [
        (
            "nvmlInit",
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "NVML library not found (libnvidia-ml.so.1); is the NVIDIA driver installed?",
        ),
        ("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA kernel driver not loaded"),
        ("nvmlInit", pynvml.NVML_ERROR_NO_PERMISSION, "no permission to use NVML (nvmlInit)"),
        ("nvmlInit", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
        ("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, "NVML unusable"),
    ],
)
def test_init_failure_is_a_state_with_a_reason(fn_name: str, code: int, reason: str) -> None:
    fake = FakeNvml(four_gpus())
    fake.fail(fn_name, code)
    nvml = Nvml(fake, clock=FakeClock())
    assert nvml.sample() == []
    assert nvml.minor_to_index() == {}
    status = nvml.status()
    assert not status.available
    assert reason in status.detail
    assert (status.driver_version, status.gpu_count) == (None, 0)
    # nvmlInit that succeeded before a later init step failed is balanced by a shutdown.
    assert fake.init_refcount == 0


def test_init_retried_once_per_interval() -> None:
    clock = FakeClock()
    fake = FakeNvml(four_gpus())
    fake.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    nvml = Nvml(fake, clock=clock, retry_interval_s=60.0)
    for _ in range(5):
        assert nvml.sample() == []
        nvml.status()
        clock.now_s += 10.0
    assert fake.calls["nvmlInit"] == 1  # 40 s after the failure
    fake.heal("nvmlInit")
    assert nvml.sample() == []  # 50 s: still waiting
    clock.now_s += 10.0
    assert len(nvml.sample()) == 4  # 60 s: one retry, and it works
    assert fake.calls["nvmlInit"] == 2
    status = nvml.status()
    assert status.available
    assert status.detail == "NVML ready, driver 550.54.15, 4 GPUs"


def test_driver_gone_after_init_becomes_unavailable_then_recovers() -> None:
    clock = FakeClock()
    fake = FakeNvml(four_gpus())
    nvml = Nvml(fake, clock=clock)
    assert len(nvml.sample()) == 4
    fake.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert nvml.sample() == []
    assert "driver not loaded" in nvml.status().detail
    fake.heal("nvmlDeviceGetUtilizationRates")
    clock.now_s += 60.0
    assert len(nvml.sample()) == 4
    assert fake.calls["nvmlInit"] == 2


def test_without_pynvml_status_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    nvml = Nvml()
    assert nvml.sample() == []
    assert nvml.status().detail == "pynvml not installed (pip install nvidia-ml-py)"


# -- shutdown -------------------------------------------------------------------------


def test_shutdown_only_when_initialised() -> None:
    fake = FakeNvml(four_gpus())
    nvml = Nvml(fake)
    nvml.shutdown()
    assert fake.calls["nvmlShutdown"] == 0
    nvml.sample()
    nvml.shutdown()
    nvml.shutdown()
    assert fake.calls["nvmlShutdown"] == 1
    assert fake.init_refcount == 0
    assert len(nvml.sample()) == 4  # initialises again
    assert fake.calls["nvmlInit"] == 2


def test_na_is_falsy_and_named() -> None:
    assert not NA
    assert repr(NA) == "NA"


# -- a real GPU -----------------------------------------------------------------------


@pytest.mark.gpu
def test_real_gpu() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        reason = Nvml().status().detail
        pytest.skip(f"NVML cannot initialise here: {reason} ({err})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        nvml = Nvml()
        samples = nvml.sample()
        assert [s.index for s in samples] == list(range(count))
        for s in samples:
            assert s.util_pct is not None
            assert 0.0 <= s.util_pct <= 100.0
            assert s.mem_total_bytes is not None and s.mem_total_bytes > 0
        assert sorted(nvml.minor_to_index().values()) == list(range(count))
        assert nvml.status().gpu_count == count
        nvml.shutdown()
    finally:
        pynvml.nvmlShutdown()
