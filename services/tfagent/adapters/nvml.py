"""`NvmlGpuProbe`: discovery and sampling through NVML (`pynvml`, package `nvidia-ml-py`).

The pynvml module is a constructor parameter, so tests hand in a fake module at the library boundary and
`load_pynvml()` is the only place that imports the real one. Features a driver or GPU does not support
(MIG, NUMA, NVLink, per-process utilization, power) read as absent, never as an error.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from tfagent.core.inventory import GpuDevice, ModelCatalog, NodeInventory
from tfagent.core.usage import GpuSample, ProcessSample, UsageSample


class NvmlUnavailableError(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no GPU); the message says what to do."""


def load_pynvml() -> ModuleType:
    """Import the real pynvml and initialise NVML, or explain how to run without a GPU."""
    try:
        module = importlib.import_module("pynvml")
        module.nvmlInit()
    except Exception as error:
        raise NvmlUnavailableError(
            f"NVML is not available on this machine ({error}); install the NVIDIA driver, or run the agent "
            "with simulated GPUs: --fake-gpus H100:8 (TF_FAKE_GPUS)"
        ) from error
    return module


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


class NvmlGpuProbe:
    """A `GpuProbe` over an initialised pynvml module (real or fake)."""

    def __init__(self, nvml: ModuleType, node: str, catalog: ModelCatalog | None = None) -> None:
        self._nvml = nvml
        self._node = node
        self._catalog = catalog or ModelCatalog()
        self._handles: dict[str, Any] = {}
        self._last_process_sample_us: dict[str, int] = {}
        self._closed = False

    def discover(self) -> NodeInventory:
        nvml = self._nvml
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(handle)).lower() for handle in handles]
        gpus: list[GpuDevice] = []
        warnings: list[str] = []
        for index, (uuid, handle) in enumerate(zip(uuids, handles, strict=True)):
            product_name = _text(nvml.nvmlDeviceGetName(handle))
            capacity = self._catalog.capacity_of(product_name)
            if capacity.warning is not None and capacity.warning not in warnings:
                warnings.append(capacity.warning)
            peers = tuple(
                peer_uuid
                for peer_uuid, peer in zip(uuids, handles, strict=True)
                if peer_uuid != uuid and self._nvlinked(handle, peer)
            )
            gpus.append(
                GpuDevice(
                    uuid=uuid,
                    index=index,
                    model=capacity.model,
                    product_name=product_name,
                    tflops_milli=capacity.tflops_milli,
                    vram_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    numa_node=self._optional(nvml.nvmlDeviceGetNumaNodeId, handle),
                    nvlink_peers=peers,
                    mig_enabled=self._mig_enabled(handle),
                    capacity_source=capacity.source,
                )
            )
        self._handles = dict(zip(uuids, handles, strict=True))
        return NodeInventory(
            node=self._node,
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_version=_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion())),
            gpus=tuple(gpus),
            warnings=tuple(warnings),
        )

    def sample(self) -> UsageSample:
        if not self._handles:
            self.discover()
        nvml = self._nvml
        gpus: list[GpuSample] = []
        processes: list[ProcessSample] = []
        for uuid, handle in self._handles.items():
            gpus.append(
                GpuSample(
                    uuid=uuid,
                    utilization_percent=int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
                    temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                    power_mw=self._optional(nvml.nvmlDeviceGetPowerUsage, handle) or 0,
                    pcie_rx_kib_s=self._optional(
                        nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES
                    )
                    or 0,
                    pcie_tx_kib_s=self._optional(
                        nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES
                    )
                    or 0,
                )
            )
            processes.extend(self._processes(uuid, handle))
        return UsageSample(gpus=tuple(gpus), processes=tuple(processes))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._nvml.nvmlShutdown()

    def _processes(self, uuid: str, handle: Any) -> list[ProcessSample]:
        nvml = self._nvml
        running = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        compute_by_pid: dict[int, int] = {}
        since_us = self._last_process_sample_us.get(uuid, 0)
        for utilization in self._optional(nvml.nvmlDeviceGetProcessUtilization, handle, since_us) or []:
            compute_by_pid[int(utilization.pid)] = int(utilization.smUtil)
            since_us = max(since_us, int(utilization.timeStamp))
        self._last_process_sample_us[uuid] = since_us
        return [
            ProcessSample(
                gpu_uuid=uuid,
                pid=int(process.pid),
                memory_used_bytes=int(process.usedGpuMemory or 0),
                compute_percent=compute_by_pid.get(int(process.pid)),
            )
            for process in running
        ]

    def _nvlinked(self, handle: Any, peer: Any) -> bool:
        nvml = self._nvml
        status = self._optional(nvml.nvmlDeviceGetP2PStatus, handle, peer, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        return status is not None and status == nvml.NVML_P2P_STATUS_OK

    def _mig_enabled(self, handle: Any) -> bool:
        modes = self._optional(self._nvml.nvmlDeviceGetMigMode, handle)
        return modes is not None and int(modes[0]) == self._nvml.NVML_DEVICE_MIG_ENABLE

    def _optional(self, read: Any, *args: Any) -> Any:
        try:
            return read(*args)
        except self._nvml.NVMLError:
            return None
