"""Simulated GPUs: the `--fake-gpus` syntax, the simulated marking, and usage that follows allocations."""

from __future__ import annotations

import pytest
from builders import a_share, an_allocation
from tfagent.adapters.simulated import FakeGpuGroup, FakeGpuSpecError, SimulatedGpuProbe, parse_fake_gpus
from tfagent.core.usage import WorkerAllocation, build_node_usage
from tfcommon.gpu_models import GIB, GPU_MODELS_BY_NAME


def test_parses_models_and_counts() -> None:
    assert parse_fake_gpus("H100:8, A100-80G:4") == (FakeGpuGroup("H100", 8), FakeGpuGroup("A100-80G", 4))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("H100", "MODEL:COUNT"),
        ("H100:8,", "MODEL:COUNT"),
        ("H999:2", "unknown model 'H999'"),
        ("H100:zero", "positive integer"),
        ("H100:0", "positive integer"),
    ],
)
def test_a_bad_spec_names_the_bad_part_and_the_fix(spec: str, fragment: str) -> None:
    with pytest.raises(FakeGpuSpecError, match="--fake-gpus") as error:
        parse_fake_gpus(spec)

    assert fragment in str(error.value)


def test_everything_it_reports_says_simulated() -> None:
    inventory = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:1,L4:2")).discover()

    assert inventory.simulated
    assert inventory.driver_version == "simulated"
    assert [gpu.model for gpu in inventory.gpus] == ["H100", "L4", "L4"]
    assert all(gpu.simulated and gpu.product_name.startswith("Simulated ") for gpu in inventory.gpus)
    assert all("simulated" in gpu.capacity_source for gpu in inventory.gpus)


def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    first = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:2")).discover()
    again = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:2")).discover()
    other = SimulatedGpuProbe("node-b", parse_fake_gpus("H100:2")).discover()

    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}


def test_usage_follows_the_allocations_on_each_card() -> None:
    allocations: list[WorkerAllocation] = []
    probe = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:2"), allocations=lambda: allocations)
    busy, idle = probe.discover().gpus
    half = GPU_MODELS_BY_NAME["H100"].fp16_tflops_milli // 2
    allocations.append(an_allocation(a_share(busy.uuid, tflops_milli=half, vram_gib=30)))

    sample = probe.sample()

    busy_sample, idle_sample = sample.gpus
    assert (busy_sample.utilization_percent, busy_sample.memory_used_bytes) == (50, 30 * GIB)
    assert (idle_sample.utilization_percent, idle_sample.memory_used_bytes) == (0, 0)
    assert busy_sample.power_mw > idle_sample.power_mw
    usage = build_node_usage(
        probe.discover().gpus, sample, allocations, probe.owners(sample.processes, allocations)
    )
    assert [(row.uuid, row.memory_bytes, row.compute_percentage) for row in usage.workers] == [
        (busy.uuid, 30 * GIB, 50.0)
    ]
    assert idle.uuid not in {process.gpu_uuid for process in sample.processes}


def test_released_allocations_stop_using_the_card() -> None:
    allocations = [an_allocation(a_share(tflops_milli=100_000))]
    probe = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:1"), allocations=lambda: allocations)
    (gpu,) = probe.discover().gpus
    allocations[0] = an_allocation(a_share(gpu.uuid, tflops_milli=100_000))
    assert probe.sample().gpus[0].utilization_percent > 0

    allocations.clear()

    assert (probe.sample().gpus[0].utilization_percent, probe.sample().processes) == (0, ())


def test_a_removed_gpu_is_gone_from_the_next_discovery() -> None:
    probe = SimulatedGpuProbe("node-a", parse_fake_gpus("H100:2"))
    first, second = probe.discover().gpus

    probe.remove_gpu(first.uuid)

    assert [gpu.uuid for gpu in probe.discover().gpus] == [second.uuid]
