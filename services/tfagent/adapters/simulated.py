"""`SimulatedGpuProbe`: GPUs for machines without one (`--fake-gpus H100:8,A100-80G:4`).

Same port as NVML. Everything it reports is marked simulated (devices, inventory, driver version, product
names), and usage follows the allocations on each card: memory used is the VRAM the allocations hold,
utilization their share of the card's TFLOPS, with one synthetic process per allocation and GPU.
Deterministic: the same spec on the same node gives the same UUIDs and figures.
"""

from __future__ import annotations

import uuid as uuid_module
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from tfcommon.gpu_models import GPU_MODELS_BY_NAME

from tfagent.core.inventory import GpuDevice, ModelCatalog, NodeInventory
from tfagent.core.usage import GpuSample, ProcessSample, UsageSample, WorkerAllocation

SIMULATED_DRIVER_VERSION = "simulated"
SIMULATED_UUID_NAMESPACE = uuid_module.UUID("6f1c58d2-6c1e-4d55-9a43-2b0f1f3e7a10")
FIRST_SIMULATED_PID = 100_000
IDLE_TEMPERATURE_C = 32
IDLE_POWER_MW = 60_000
FULL_LOAD_POWER_MW = 700_000


class FakeGpuSpecError(ValueError):
    """A `--fake-gpus` value could not be parsed; the message names the bad part and the fix."""


@dataclass(frozen=True)
class FakeGpuGroup:
    """`count` simulated GPUs of one model from the GPU model table."""

    model: str
    count: int


def parse_fake_gpus(spec: str) -> tuple[FakeGpuGroup, ...]:
    """Parse `MODEL:N[,MODEL:N]`, e.g. `H100:8,A100-80G:4`; models are names from the GPU model table."""
    groups: list[FakeGpuGroup] = []
    known = ", ".join(sorted(GPU_MODELS_BY_NAME))
    for part in (p.strip() for p in spec.split(",")):
        model, _, count_text = part.partition(":")
        if not part or not count_text:
            raise FakeGpuSpecError(
                f"--fake-gpus: {part!r} is not MODEL:COUNT; write e.g. --fake-gpus H100:8,A100-80G:4"
            )
        if model not in GPU_MODELS_BY_NAME:
            raise FakeGpuSpecError(f"--fake-gpus: unknown model {model!r}; use one of {known}")
        if not count_text.isdigit() or int(count_text) < 1:
            raise FakeGpuSpecError(
                f"--fake-gpus: count {count_text!r} for {model} must be a positive integer"
            )
        groups.append(FakeGpuGroup(model, int(count_text)))
    return tuple(groups)


class SimulatedGpuProbe:
    """A `GpuProbe` (and `ProcessOwners`) with simulated GPUs whose usage follows `allocations()`."""

    def __init__(
        self,
        node: str,
        groups: Sequence[FakeGpuGroup],
        allocations: Callable[[], Sequence[WorkerAllocation]] = tuple,
        catalog: ModelCatalog | None = None,
    ) -> None:
        self._node = node
        self._allocations = allocations
        self._devices = self._build_devices(groups, catalog or ModelCatalog())
        self._pid_owner: dict[int, UUID] = {}

    def remove_gpu(self, uuid: str) -> None:
        """Make a GPU disappear from the next discovery, as a GPU falling off the bus would."""
        self._devices = tuple(device for device in self._devices if device.uuid != uuid)

    def discover(self) -> NodeInventory:
        return NodeInventory(
            node=self._node,
            driver_version=SIMULATED_DRIVER_VERSION,
            cuda_version=SIMULATED_DRIVER_VERSION,
            gpus=self._devices,
            simulated=True,
        )

    def sample(self) -> UsageSample:
        allocations = self._allocations()
        devices = {device.uuid: device for device in self._devices}
        processes: list[ProcessSample] = []
        self._pid_owner = {}
        tflops_in_use: dict[str, int] = dict.fromkeys(devices, 0)
        for allocation in sorted(allocations, key=lambda a: a.allocation_id):
            for share in allocation.shares:
                device = devices.get(share.gpu_uuid)
                if device is None:
                    continue
                pid = FIRST_SIMULATED_PID + len(self._pid_owner)
                self._pid_owner[pid] = allocation.allocation_id
                tflops_in_use[device.uuid] += share.tflops_milli
                processes.append(
                    ProcessSample(
                        gpu_uuid=device.uuid,
                        pid=pid,
                        memory_used_bytes=share.vram_bytes,
                        compute_percent=min(100, share.tflops_milli * 100 // device.tflops_milli),
                    )
                )
        gpus = []
        for device in self._devices:
            utilization = min(100, tflops_in_use[device.uuid] * 100 // device.tflops_milli)
            used = sum(p.memory_used_bytes for p in processes if p.gpu_uuid == device.uuid)
            gpus.append(
                GpuSample(
                    uuid=device.uuid,
                    utilization_percent=utilization,
                    memory_used_bytes=min(used, device.vram_bytes),
                    temperature_c=IDLE_TEMPERATURE_C + utilization // 2,
                    power_mw=IDLE_POWER_MW + (FULL_LOAD_POWER_MW - IDLE_POWER_MW) * utilization // 100,
                    pcie_rx_kib_s=0,
                    pcie_tx_kib_s=0,
                )
            )
        return UsageSample(gpus=tuple(gpus), processes=tuple(processes))

    def owners(
        self, processes: Sequence[ProcessSample], allocations: Sequence[WorkerAllocation]
    ) -> Mapping[int, UUID]:
        return {p.pid: self._pid_owner[p.pid] for p in processes if p.pid in self._pid_owner}

    def close(self) -> None:
        return None

    def _build_devices(self, groups: Sequence[FakeGpuGroup], catalog: ModelCatalog) -> tuple[GpuDevice, ...]:
        devices: list[GpuDevice] = []
        for group in groups:
            spec = GPU_MODELS_BY_NAME[group.model]
            product_name = f"Simulated {spec.nvml_names[0] if spec.nvml_names else spec.name}"
            capacity = catalog.capacity_of(spec.name)
            for _ in range(group.count):
                index = len(devices)
                devices.append(
                    GpuDevice(
                        uuid=f"gpu-{uuid_module.uuid5(SIMULATED_UUID_NAMESPACE, f'{self._node}/{index}')}",
                        index=index,
                        model=capacity.model,
                        product_name=product_name,
                        tflops_milli=capacity.tflops_milli,
                        vram_bytes=spec.vram_bytes,
                        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
                        numa_node=None,
                        nvlink_peers=(),
                        mig_enabled=False,
                        capacity_source=f"simulated; {capacity.source}",
                        simulated=True,
                    )
                )
        return tuple(devices)
