"""A fake `pynvml` module for the NVML adapter's tests: same function names, constants and error classes.

It behaves like the real library where the adapter relies on it: calls before `nvmlInit` fail, unsupported
features raise `NVMLError_NotSupported`, strings come back as `str` or `bytes` as configured, and
`nvmlDeviceGetProcessUtilization` returns only samples newer than the timestamp it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 (pynvml's own class name)
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_NotFound(NVMLError):  # noqa: N801, N818
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_FOUND)


@dataclass
class FakeGpu:
    """One GPU as the fake driver reports it; `None` for an optional feature means "not supported"."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    memory_used: int = 0
    bus_id: bytes = b"00000000:18:00.0"
    numa_node: int | None = 0
    mig_mode: int | None = None
    nvlink_group: int | None = None
    utilization: int = 0
    temperature: int = 40
    power_mw: int | None = 120_000
    pcie_rx_kib_s: int | None = 0
    pcie_tx_kib_s: int | None = 0
    processes: list[tuple[int, int]] = field(default_factory=list)
    process_utilization: list[tuple[int, int, int]] | None = None


@dataclass
class FakeDriver:
    """The state behind the fake module: the GPUs present, versions, and init/shutdown bookkeeping."""

    gpus: list[FakeGpu]
    driver_version: str = "570.86.15"
    cuda_version: int = 12080
    initialised: bool = False
    shutdowns: int = 0


def fake_pynvml(driver: FakeDriver) -> ModuleType:
    """A module object with pynvml's API over `driver`."""
    module = ModuleType("pynvml")

    def ready() -> None:
        if not driver.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def gpu(handle: Any) -> FakeGpu:
        ready()
        if not isinstance(handle, FakeGpu) or handle not in driver.gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle

    def supported(value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported()
        return value

    def nvml_init() -> None:
        driver.initialised = True

    def nvml_shutdown() -> None:
        ready()
        driver.initialised = False
        driver.shutdowns += 1

    def driver_version() -> str:
        ready()
        return driver.driver_version

    def cuda_version() -> int:
        ready()
        return driver.cuda_version

    def device_count() -> int:
        ready()
        return len(driver.gpus)

    def handle_by_index(index: int) -> FakeGpu:
        ready()
        return driver.gpus[index]

    def p2p_status(first: Any, second: Any, index: int) -> int:
        a, b = gpu(first), gpu(second)
        if index != module.NVML_P2P_CAPS_INDEX_NVLINK:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        linked = a.nvlink_group is not None and a.nvlink_group == b.nvlink_group
        return int(module.NVML_P2P_STATUS_OK if linked else module.NVML_P2P_STATUS_NOT_SUPPORTED)

    def pcie_throughput(handle: Any, counter: int) -> int:
        device = gpu(handle)
        return int(supported(device.pcie_rx_kib_s if counter == 1 else device.pcie_tx_kib_s))

    def process_utilization(handle: Any, since_us: int) -> list[SimpleNamespace]:
        samples = supported(gpu(handle).process_utilization)
        newer = [
            SimpleNamespace(pid=p, smUtil=s, memUtil=0, timeStamp=t) for p, s, t in samples if t > since_us
        ]
        if not newer:
            raise NVMLError_NotFound()
        return newer

    functions: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVMLError_NotSupported": NVMLError_NotSupported,
        "NVMLError_NotFound": NVMLError_NotFound,
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_PCIE_UTIL_TX_BYTES": 0,
        "NVML_PCIE_UTIL_RX_BYTES": 1,
        "NVML_P2P_CAPS_INDEX_NVLINK": 2,
        "NVML_P2P_STATUS_OK": 0,
        "NVML_P2P_STATUS_NOT_SUPPORTED": 5,
        "NVML_DEVICE_MIG_DISABLE": 0,
        "NVML_DEVICE_MIG_ENABLE": 1,
        "nvmlInit": nvml_init,
        "nvmlShutdown": nvml_shutdown,
        "nvmlSystemGetDriverVersion": driver_version,
        "nvmlSystemGetCudaDriverVersion": cuda_version,
        "nvmlDeviceGetCount": device_count,
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetUUID": lambda h: gpu(h).uuid,
        "nvmlDeviceGetName": lambda h: gpu(h).name,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            total=gpu(h).memory_total, used=gpu(h).memory_used, free=gpu(h).memory_total - gpu(h).memory_used
        ),
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=gpu(h).bus_id),
        "nvmlDeviceGetNumaNodeId": lambda h: supported(gpu(h).numa_node),
        "nvmlDeviceGetMigMode": lambda h: [supported(gpu(h).mig_mode), supported(gpu(h).mig_mode)],
        "nvmlDeviceGetP2PStatus": p2p_status,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=gpu(h).utilization, memory=0),
        "nvmlDeviceGetTemperature": lambda h, sensor: gpu(h).temperature,
        "nvmlDeviceGetPowerUsage": lambda h: supported(gpu(h).power_mw),
        "nvmlDeviceGetPcieThroughput": pcie_throughput,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu(h).processes
        ],
        "nvmlDeviceGetProcessUtilization": process_utilization,
    }
    for name, value in functions.items():
        setattr(module, name, value)
    return module
