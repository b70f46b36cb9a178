"""Capacity lookup and rediscovery: a GPU that disappears while allocated is kept as `Unknown`."""

from __future__ import annotations

from datetime import UTC, datetime

from builders import a_gpu, an_inventory
from tfagent.core.inventory import GpuPhase, ModelCatalog, merge_rediscovery

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_nvml_product_names_map_to_the_table_ignoring_case_and_spacing() -> None:
    capacity = ModelCatalog().capacity_of("nvidia  h100 80gb hbm3")

    assert (capacity.model, capacity.tflops_milli, capacity.warning) == ("H100", 989_400, None)
    assert "datasheet" in capacity.source


def test_the_first_discovery_reports_every_gpu_as_appeared() -> None:
    inventory = an_inventory(a_gpu("gpu-a", 0), a_gpu("gpu-b", 1))

    change = merge_rediscovery(None, inventory, allocated_uuids=(), now=NOW)

    assert change.inventory == inventory
    assert [gpu.uuid for gpu in change.appeared] == ["gpu-a", "gpu-b"]


def test_an_unchanged_rediscovery_changes_nothing() -> None:
    inventory = an_inventory(a_gpu("gpu-a", 0))

    change = merge_rediscovery(inventory, inventory, allocated_uuids=("gpu-a",), now=NOW)

    assert not change.changed
    assert change.inventory == inventory


def test_an_allocated_gpu_that_disappears_is_kept_as_unknown_with_the_time_it_went_missing() -> None:
    known = an_inventory(a_gpu("gpu-a", 0), a_gpu("gpu-b", 1))

    change = merge_rediscovery(known, an_inventory(a_gpu("gpu-b", 1)), allocated_uuids=("GPU-A",), now=NOW)

    (missing,) = change.went_missing
    assert (missing.uuid, missing.phase, missing.missing_since) == ("gpu-a", GpuPhase.UNKNOWN, NOW)
    assert [(gpu.uuid, gpu.phase) for gpu in change.inventory.gpus] == [
        ("gpu-a", GpuPhase.UNKNOWN),
        ("gpu-b", GpuPhase.RUNNING),
    ]
    assert change.removed == ()
    assert change.inventory.total_tflops_milli == a_gpu().tflops_milli


def test_a_missing_gpu_stays_unknown_since_it_first_went_missing() -> None:
    known = an_inventory(a_gpu("gpu-a", 0))
    first = merge_rediscovery(known, an_inventory(), allocated_uuids=("gpu-a",), now=NOW)

    later = merge_rediscovery(
        first.inventory, an_inventory(), allocated_uuids=("gpu-a",), now=NOW.replace(hour=13)
    )

    assert not later.changed
    assert [gpu.missing_since for gpu in later.inventory.gpus] == [NOW]


def test_an_idle_gpu_that_disappears_is_removed_and_reported() -> None:
    known = an_inventory(a_gpu("gpu-a", 0), a_gpu("gpu-b", 1))

    change = merge_rediscovery(known, an_inventory(a_gpu("gpu-b", 1)), allocated_uuids=(), now=NOW)

    assert [gpu.uuid for gpu in change.removed] == ["gpu-a"]
    assert [gpu.uuid for gpu in change.inventory.gpus] == ["gpu-b"]


def test_a_gpu_that_comes_back_is_running_again() -> None:
    known = an_inventory(a_gpu("gpu-a", 0))
    missing = merge_rediscovery(known, an_inventory(), allocated_uuids=("gpu-a",), now=NOW).inventory

    back = merge_rediscovery(missing, an_inventory(a_gpu("gpu-a", 0)), allocated_uuids=("gpu-a",), now=NOW)

    assert [(gpu.uuid, gpu.phase) for gpu in back.appeared] == [("gpu-a", GpuPhase.RUNNING)]
    assert [gpu.phase for gpu in back.inventory.gpus] == [GpuPhase.RUNNING]
