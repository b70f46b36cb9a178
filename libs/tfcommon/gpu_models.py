"""GPU model data: dense FP16 tensor TFLOPS and VRAM per model, with the source of each figure.

Used by the node agent (capacity of a discovered GPU), the webhook (`dedicated-gpu`) and trace replays.
Pure data; operators override or extend it through the configuration file.
"""

from __future__ import annotations

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
    GpuModelSpec("H200", 989_400, 141 * GIB, f"NVIDIA H200 {DATASHEET}", ("NVIDIA H200",)),
    GpuModelSpec("H100", 989_400, 80 * GIB, f"NVIDIA H100 SXM {DATASHEET}", ("NVIDIA H100 80GB HBM3",)),
    GpuModelSpec("A100-80G", 312_000, 80 * GIB, f"NVIDIA A100 {DATASHEET}", ("NVIDIA A100-SXM4-80GB",)),
    GpuModelSpec("A100", 312_000, 40 * GIB, f"NVIDIA A100 {DATASHEET}", ("NVIDIA A100-SXM4-40GB",)),
    GpuModelSpec("L40S", 362_050, 48 * GIB, f"NVIDIA L40S {DATASHEET}", ("NVIDIA L40S",)),
    GpuModelSpec("L4", 121_000, 24 * GIB, f"NVIDIA L4 {DATASHEET}", ("NVIDIA L4",)),
    GpuModelSpec("A10", 125_000, 24 * GIB, f"NVIDIA A10 {DATASHEET}", ("NVIDIA A10",)),
    GpuModelSpec("T4", 65_000, 16 * GIB, f"NVIDIA T4 {DATASHEET}", ("Tesla T4",)),
    GpuModelSpec("V100M32", 125_000, 32 * GIB, f"NVIDIA V100 SXM2 {DATASHEET}", ("Tesla V100-SXM2-32GB",)),
    GpuModelSpec("V100M16", 125_000, 16 * GIB, f"NVIDIA V100 SXM2 {DATASHEET}", ("Tesla V100-SXM2-16GB",)),
    GpuModelSpec(
        "P100", 18_700, 16 * GIB, "NVIDIA P100 datasheet, FP16 (no tensor cores)", ("Tesla P100-PCIE-16GB",)
    ),
)

GPU_MODELS_BY_NAME: dict[str, GpuModelSpec] = {spec.name: spec for spec in GPU_MODELS}
