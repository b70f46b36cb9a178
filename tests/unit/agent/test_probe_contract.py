"""One contract for every `GpuProbe`: the NVML adapter (over a fake pynvml) and the simulated backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_nvml import FakeDriver, FakeGpu, fake_pynvml
from tfagent.adapters.nvml import NvmlGpuProbe
from tfagent.adapters.simulated import FakeGpuGroup, SimulatedGpuProbe
from tfagent.core.inventory import GpuPhase
from tfagent.ports import GpuProbe
from tfcommon.gpu_models import GPU_MODELS_BY_NAME

H100 = GPU_MODELS_BY_NAME["H100"]


def nvml_probe() -> NvmlGpuProbe:
    gpus = [
        FakeGpu(uuid=f"GPU-0A1B2C3D-0000-4000-8000-00000000000{i}", bus_id=f"00000000:1{i}:00.0".encode())
        for i in range(2)
    ]
    module = fake_pynvml(FakeDriver(gpus=gpus))
    module.nvmlInit()
    return NvmlGpuProbe(module, node="node-a")


def simulated_probe() -> SimulatedGpuProbe:
    return SimulatedGpuProbe("node-a", [FakeGpuGroup("H100", 2)])


@pytest.fixture(params=["nvml", "simulated"])
def probe(request: pytest.FixtureRequest) -> Iterator[GpuProbe]:
    built: GpuProbe = nvml_probe() if request.param == "nvml" else simulated_probe()
    yield built
    built.close()


def test_discovers_every_gpu_with_a_lower_case_unique_uuid_and_its_index(probe: GpuProbe) -> None:
    inventory = probe.discover()

    uuids = [gpu.uuid for gpu in inventory.gpus]
    assert inventory.node == "node-a"
    assert len(set(uuids)) == 2
    assert all(uuid == uuid.lower() and uuid.startswith("gpu-") for uuid in uuids)
    assert [gpu.index for gpu in inventory.gpus] == [0, 1]


def test_capacity_comes_from_the_model_table(probe: GpuProbe) -> None:
    inventory = probe.discover()

    assert {gpu.model for gpu in inventory.gpus} == {"H100"}
    assert all(gpu.tflops_milli == H100.fp16_tflops_milli for gpu in inventory.gpus)
    assert all(gpu.vram_bytes == H100.vram_bytes for gpu in inventory.gpus)
    assert inventory.total_tflops_milli == 2 * H100.fp16_tflops_milli
    assert all(gpu.phase is GpuPhase.RUNNING for gpu in inventory.gpus)
    assert inventory.warnings == ()


def test_every_gpu_has_a_distinct_pci_bus_id(probe: GpuProbe) -> None:
    bus_ids = [gpu.pci_bus_id for gpu in probe.discover().gpus]

    assert len(set(bus_ids)) == 2
    assert all(isinstance(bus_id, str) and bus_id.count(":") == 2 for bus_id in bus_ids)


def test_rediscovery_returns_the_same_inventory(probe: GpuProbe) -> None:
    assert probe.discover() == probe.discover()


def test_simulated_flag_is_the_same_on_the_node_and_every_gpu(probe: GpuProbe) -> None:
    inventory = probe.discover()

    assert {gpu.simulated for gpu in inventory.gpus} == {inventory.simulated}


def test_a_sample_covers_every_discovered_gpu_with_plausible_figures(probe: GpuProbe) -> None:
    inventory = probe.discover()

    sample = probe.sample()

    assert [gpu.uuid for gpu in sample.gpus] == [gpu.uuid for gpu in inventory.gpus]
    for gpu_sample, device in zip(sample.gpus, inventory.gpus, strict=True):
        assert 0 <= gpu_sample.utilization_percent <= 100
        assert 0 <= gpu_sample.memory_used_bytes <= device.vram_bytes
        assert gpu_sample.power_mw >= 0
        assert gpu_sample.pcie_rx_kib_s >= 0
        assert gpu_sample.pcie_tx_kib_s >= 0
    assert {process.gpu_uuid for process in sample.processes} <= {gpu.uuid for gpu in inventory.gpus}


def test_sampling_before_discovery_discovers_first(probe: GpuProbe) -> None:
    assert len(probe.sample().gpus) == 2


def test_close_can_be_called_twice(probe: GpuProbe) -> None:
    probe.discover()

    probe.close()
    probe.close()
