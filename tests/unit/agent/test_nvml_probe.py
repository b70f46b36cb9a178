"""The NVML adapter over a fake pynvml module: what it reads, and how it copes with missing features."""

from __future__ import annotations

from fake_nvml import FakeDriver, FakeGpu, fake_pynvml
from tfagent.adapters.nvml import NvmlGpuProbe
from tfagent.core.inventory import ModelCatalog
from tfcommon.gpu_models import GIB, GpuModelSpec


def probe_over(*gpus: FakeGpu, catalog: ModelCatalog | None = None) -> tuple[NvmlGpuProbe, FakeDriver]:
    driver = FakeDriver(gpus=list(gpus))
    module = fake_pynvml(driver)
    module.nvmlInit()
    return NvmlGpuProbe(module, node="node-a", catalog=catalog), driver


def test_reports_topology_mig_and_versions_as_the_driver_gives_them() -> None:
    probe, _ = probe_over(
        FakeGpu(uuid="GPU-AAAA", bus_id=b"00000000:18:00.0", numa_node=0, nvlink_group=1, mig_mode=1),
        FakeGpu(uuid="GPU-BBBB", bus_id=b"00000000:2A:00.0", numa_node=1, nvlink_group=1),
        FakeGpu(uuid="GPU-CCCC", bus_id=b"00000000:3A:00.0", numa_node=None),
    )

    inventory = probe.discover()

    a, b, c = inventory.gpus
    assert (a.uuid, b.uuid, c.uuid) == ("gpu-aaaa", "gpu-bbbb", "gpu-cccc")
    assert a.pci_bus_id == "00000000:18:00.0"
    assert (a.numa_node, b.numa_node, c.numa_node) == (0, 1, None)
    assert a.nvlink_peers == ("gpu-bbbb",)
    assert b.nvlink_peers == ("gpu-aaaa",)
    assert c.nvlink_peers == ()
    assert (a.mig_enabled, b.mig_enabled) == (True, False)
    assert inventory.driver_version == "570.86.15"
    assert inventory.cuda_version == "12.8"
    assert not inventory.simulated


def test_an_unknown_model_gets_the_fallback_capacity_and_a_warning_saying_how_to_add_it() -> None:
    probe, _ = probe_over(FakeGpu(uuid="GPU-AAAA", name="NVIDIA Future X9"))

    inventory = probe.discover()

    (gpu,) = inventory.gpus
    assert gpu.model == "NVIDIA Future X9"
    assert gpu.tflops_milli == ModelCatalog().fallback_tflops_milli
    (warning,) = inventory.warnings
    assert "'NVIDIA Future X9'" in warning
    assert "TF_GPU_MODELS" in warning
    assert '"nvml_names": ["NVIDIA Future X9"]' in warning
    assert "libs/tfcommon/gpu_models.py" in warning


def test_configured_models_override_the_built_in_table() -> None:
    custom = GpuModelSpec("X9", 500_000, 96 * GIB, "operator's benchmark", ("NVIDIA Future X9",))
    h100_derated = GpuModelSpec("H100", 700_000, 80 * GIB, "operator override", ())
    probe, _ = probe_over(
        FakeGpu(uuid="GPU-AAAA", name="NVIDIA Future X9"),
        FakeGpu(uuid="GPU-BBBB", bus_id=b"00000000:19:00.0"),
        catalog=ModelCatalog(overrides=(custom, h100_derated), fallback_tflops_milli=1_000),
    )

    x9, h100 = probe.discover().gpus

    assert (x9.model, x9.tflops_milli, x9.capacity_source) == ("X9", 500_000, "operator's benchmark")
    assert (h100.model, h100.tflops_milli) == ("H100", 700_000)


def test_samples_gpu_counters_and_per_process_memory_and_compute() -> None:
    probe, _ = probe_over(
        FakeGpu(
            uuid="GPU-AAAA",
            memory_used=10 * GIB,
            utilization=63,
            temperature=71,
            power_mw=412_000,
            pcie_rx_kib_s=2048,
            pcie_tx_kib_s=1024,
            processes=[(4242, 6 * GIB), (4343, 4 * GIB)],
            process_utilization=[(4242, 50, 1_000), (4343, 13, 1_000)],
        )
    )

    sample = probe.sample()

    (gpu,) = sample.gpus
    assert (gpu.uuid, gpu.utilization_percent, gpu.memory_used_bytes) == ("gpu-aaaa", 63, 10 * GIB)
    assert (gpu.temperature_c, gpu.power_mw, gpu.pcie_rx_kib_s, gpu.pcie_tx_kib_s) == (
        71,
        412_000,
        2048,
        1024,
    )
    assert {(p.pid, p.memory_used_bytes, p.compute_percent) for p in sample.processes} == {
        (4242, 6 * GIB, 50),
        (4343, 4 * GIB, 13),
    }


def test_process_utilization_is_only_read_from_samples_newer_than_the_last_round() -> None:
    gpu = FakeGpu(uuid="GPU-AAAA", processes=[(4242, GIB)], process_utilization=[(4242, 50, 1_000)])
    probe, _ = probe_over(gpu)
    probe.sample()

    stale = probe.sample()
    gpu.process_utilization = [(4242, 50, 1_000), (4242, 20, 2_000)]
    fresh = probe.sample()

    assert [p.compute_percent for p in stale.processes] == [None]
    assert [p.compute_percent for p in fresh.processes] == [20]


def test_features_the_driver_does_not_support_read_as_zero_not_as_errors() -> None:
    probe, _ = probe_over(
        FakeGpu(
            uuid="GPU-AAAA", power_mw=None, pcie_rx_kib_s=None, pcie_tx_kib_s=None, process_utilization=None
        )
    )

    (gpu,) = probe.sample().gpus

    assert (gpu.power_mw, gpu.pcie_rx_kib_s, gpu.pcie_tx_kib_s) == (0, 0, 0)


def test_a_gpu_that_fell_off_the_bus_is_not_reported_by_the_next_discovery() -> None:
    first = FakeGpu(uuid="GPU-AAAA")
    probe, driver = probe_over(first, FakeGpu(uuid="GPU-BBBB", bus_id=b"00000000:19:00.0"))
    probe.discover()

    driver.gpus.remove(first)

    assert [gpu.uuid for gpu in probe.discover().gpus] == ["gpu-bbbb"]
    assert [gpu.uuid for gpu in probe.sample().gpus] == ["gpu-bbbb"]


def test_close_shuts_nvml_down_once() -> None:
    probe, driver = probe_over(FakeGpu(uuid="GPU-AAAA"))

    probe.close()
    probe.close()

    assert (driver.shutdowns, driver.initialised) == (1, False)
