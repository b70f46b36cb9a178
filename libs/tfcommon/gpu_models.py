"""GPU model data: dense FP16 tensor TFLOPS and VRAM per model, with the source of each figure.

Used by the node agent (capacity of a discovered GPU), the webhook (`dedicated-gpu`) and trace replays.
Pure data and lookups; operators override or extend it through the configuration file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuModelSpec:
    """One GPU model: its short name, the NVML product names that map to it, and its capacity."""

    name: str
    fp16_tflops_milli: int
    vram_bytes: int
    source: str
    nvml_names: tuple[str, ...] = ()


DATASHEET = "vendor datasheet, dense FP16 tensor TFLOPS (no sparsity)"

GPU_MODELS: tuple[GpuModelSpec, ...] = (
    GpuModelSpec("B200", 2_250_000, 180 * GIB, f"NVIDIA HGX B200 {DATASHEET}, per GPU", ("NVIDIA B200",)),
    GpuModelSpec("H200", 989_400, 141 * GIB, f"NVIDIA H200 SXM {DATASHEET}", ("NVIDIA H200",)),
    GpuModelSpec("H200-NVL", 835_500, 141 * GIB, f"NVIDIA H200 NVL {DATASHEET}", ("NVIDIA H200 NVL",)),
    GpuModelSpec("H100", 989_400, 80 * GIB, f"NVIDIA H100 SXM {DATASHEET}", ("NVIDIA H100 80GB HBM3",)),
    GpuModelSpec("H100-PCIE", 756_000, 80 * GIB, f"NVIDIA H100 PCIe {DATASHEET}", ("NVIDIA H100 PCIe",)),
    GpuModelSpec("H100-NVL", 835_000, 94 * GIB, f"NVIDIA H100 NVL {DATASHEET}", ("NVIDIA H100 NVL",)),
    GpuModelSpec("H20", 148_000, 96 * GIB, f"NVIDIA H20 {DATASHEET}", ("NVIDIA H20",)),
    GpuModelSpec(
        "A100-80G",
        312_000,
        80 * GIB,
        f"NVIDIA A100 {DATASHEET}",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    ),
    GpuModelSpec(
        "A100",
        312_000,
        40 * GIB,
        f"NVIDIA A100 {DATASHEET}",
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    ),
    GpuModelSpec("A40", 149_700, 48 * GIB, f"NVIDIA A40 {DATASHEET}", ("NVIDIA A40",)),
    GpuModelSpec("A30", 165_000, 24 * GIB, f"NVIDIA A30 {DATASHEET}", ("NVIDIA A30",)),
    GpuModelSpec("L40S", 362_050, 48 * GIB, f"NVIDIA L40S {DATASHEET}", ("NVIDIA L40S",)),
    GpuModelSpec("L40", 181_050, 48 * GIB, f"NVIDIA L40 {DATASHEET}", ("NVIDIA L40",)),
    GpuModelSpec("L20", 119_500, 48 * GIB, f"NVIDIA L20 {DATASHEET}", ("NVIDIA L20",)),
    GpuModelSpec("L4", 121_000, 24 * GIB, f"NVIDIA L4 {DATASHEET}", ("NVIDIA L4",)),
    GpuModelSpec("A10", 125_000, 24 * GIB, f"NVIDIA A10 {DATASHEET}", ("NVIDIA A10",)),
    GpuModelSpec(
        "RTX4090",
        165_200,
        24 * GIB,
        "NVIDIA Ada Lovelace architecture whitepaper, dense FP16 tensor TFLOPS with FP32 accumulate",
        ("NVIDIA GeForce RTX 4090",),
    ),
    GpuModelSpec("T4", 65_000, 16 * GIB, f"NVIDIA T4 {DATASHEET}", ("Tesla T4",)),
    GpuModelSpec(
        "V100M32",
        125_000,
        32 * GIB,
        f"NVIDIA V100 SXM2 {DATASHEET}",
        ("Tesla V100-SXM2-32GB", "Tesla V100S-PCIE-32GB"),
    ),
    GpuModelSpec("V100M16", 125_000, 16 * GIB, f"NVIDIA V100 SXM2 {DATASHEET}", ("Tesla V100-SXM2-16GB",)),
    GpuModelSpec(
        "P100", 18_700, 16 * GIB, "NVIDIA P100 datasheet, FP16 (no tensor cores)", ("Tesla P100-PCIE-16GB",)
    ),
)

GPU_MODELS_BY_NAME: dict[str, GpuModelSpec] = {spec.name: spec for spec in GPU_MODELS}


def find_model_by_nvml_name(
    product_name: str, models: Iterable[GpuModelSpec] = GPU_MODELS
) -> GpuModelSpec | None:
    """The model whose NVML product names (or short name) match `product_name`, ignoring case and spaces.

    Earlier entries of `models` win, so a caller puts operator overrides first.
    """
    wanted = _normalised(product_name)
    for spec in models:
        if wanted == _normalised(spec.name) or any(wanted == _normalised(n) for n in spec.nvml_names):
            return spec
    return None


def _normalised(name: str) -> str:
    return " ".join(name.split()).casefold()
