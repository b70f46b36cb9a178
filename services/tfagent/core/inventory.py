"""What a node's GPUs are: the discovered inventory, capacity from the model table, and rediscovery diffs.

Pure: the probes (NVML or simulated) hand in plain values, this module decides capacity, phases and what
changed. No NVML, no clock (times come in as arguments), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from tfcommon.gpu_models import GPU_MODELS, GpuModelSpec, find_model_by_nvml_name

DEFAULT_FALLBACK_TFLOPS_MILLI = 50_000


class GpuPhase(StrEnum):
    """TensorFusion's GPU phases that the agent sets: present and usable, or gone missing."""

    RUNNING = "Running"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Capacity:
    """Capacity of one GPU and where the TFLOPS figure came from; `warning` is set for unknown models."""

    model: str
    tflops_milli: int
    source: str
    warning: str | None = None


@dataclass(frozen=True)
class ModelCatalog:
    """The model table the agent maps product names with: operator overrides (`TF_GPU_MODELS`) first,
    then the cluster's ProviderConfig `hardwareMetadata` (`providers`), then the built-ins.

    An override or provider entry with a built-in model's short name (e.g. `H100`) replaces that model's
    figures for every NVML product name the built-in entry lists.
    """

    overrides: tuple[GpuModelSpec, ...] = ()
    fallback_tflops_milli: int = DEFAULT_FALLBACK_TFLOPS_MILLI
    providers: tuple[GpuModelSpec, ...] = ()

    def capacity_of(self, product_name: str) -> Capacity:
        spec = find_model_by_nvml_name(product_name, (*self.overrides, *self.providers, *GPU_MODELS))
        if spec is not None:
            layered = (*self.overrides, *self.providers)
            chosen = next((entry for entry in layered if entry.name == spec.name), spec)
            return Capacity(chosen.name, chosen.fp16_tflops_milli, chosen.source)
        fallback_tflops = self.fallback_tflops_milli / 1000
        return Capacity(
            model=product_name,
            tflops_milli=self.fallback_tflops_milli,
            source="configured fallback (model not in the table)",
            warning=(
                f"GPU model {product_name!r} is not in the GPU model table; its capacity is the configured "
                f"fallback of {fallback_tflops:g} TFLOPS (TF_FALLBACK_TFLOPS_MILLI). Add it with "
                f'TF_GPU_MODELS=\'[{{"name": "...", "fp16_tflops_milli": <dense FP16 tensor TFLOPS x 1000>, '
                f'"nvml_names": ["{product_name}"]}}]\' or to libs/tfcommon/gpu_models.py.'
            ),
        )


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU as discovered: identity, topology and capacity. UUIDs are lower case."""

    uuid: str
    index: int
    model: str
    product_name: str
    tflops_milli: int
    vram_bytes: int
    pci_bus_id: str
    numa_node: int | None
    nvlink_peers: tuple[str, ...]
    mig_enabled: bool
    capacity_source: str
    simulated: bool = False
    phase: GpuPhase = GpuPhase.RUNNING
    missing_since: datetime | None = None


@dataclass(frozen=True)
class NodeInventory:
    """Everything one discovery round found on a node; `warnings` are for the operator (unknown models)."""

    node: str
    driver_version: str
    cuda_version: str
    gpus: tuple[GpuDevice, ...]
    simulated: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def total_tflops_milli(self) -> int:
        return sum(gpu.tflops_milli for gpu in self.gpus if gpu.phase is GpuPhase.RUNNING)

    @property
    def total_vram_bytes(self) -> int:
        return sum(gpu.vram_bytes for gpu in self.gpus if gpu.phase is GpuPhase.RUNNING)

    def gpu(self, uuid: str) -> GpuDevice | None:
        wanted = uuid.lower()
        return next((gpu for gpu in self.gpus if gpu.uuid == wanted), None)


@dataclass(frozen=True)
class InventoryChange:
    """Result of merging a rediscovery into the known inventory.

    `appeared` are new or changed GPUs (and GPUs back from `Unknown`); `went_missing` are GPUs that were
    present and are now marked `Unknown`; `removed` are GPUs dropped because they were missing and idle.
    """

    inventory: NodeInventory
    appeared: tuple[GpuDevice, ...]
    went_missing: tuple[GpuDevice, ...]
    removed: tuple[GpuDevice, ...]

    @property
    def changed(self) -> bool:
        return bool(self.appeared or self.went_missing or self.removed)


def merge_rediscovery(
    known: NodeInventory | None,
    discovered: NodeInventory,
    allocated_uuids: Iterable[str],
    now: datetime,
) -> InventoryChange:
    """Merge a fresh discovery into what the agent knew.

    A GPU that is no longer reported stays in the inventory as `Unknown` (with `missing_since`) while any
    allocation holds it, so nothing allocated is ever silently deleted; an idle missing GPU is removed.
    """
    if known is None:
        return InventoryChange(discovered, discovered.gpus, (), ())
    allocated = {uuid.lower() for uuid in allocated_uuids}
    previous: Mapping[str, GpuDevice] = {gpu.uuid: gpu for gpu in known.gpus}
    current = {gpu.uuid for gpu in discovered.gpus}
    appeared = tuple(gpu for gpu in discovered.gpus if previous.get(gpu.uuid) != gpu)
    kept_missing: list[GpuDevice] = []
    went_missing: list[GpuDevice] = []
    removed: list[GpuDevice] = []
    for uuid, gpu in previous.items():
        if uuid in current:
            continue
        if uuid not in allocated:
            removed.append(gpu)
        elif gpu.phase is GpuPhase.UNKNOWN:
            kept_missing.append(gpu)
        else:
            missing = replace(gpu, phase=GpuPhase.UNKNOWN, missing_since=now)
            kept_missing.append(missing)
            went_missing.append(missing)
    gpus = tuple(sorted((*discovered.gpus, *kept_missing), key=lambda gpu: (gpu.index, gpu.uuid)))
    return InventoryChange(replace(discovered, gpus=gpus), appeared, tuple(went_missing), tuple(removed))
