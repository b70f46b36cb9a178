"""Builders for tests and examples: readable A100 nodes and GPUs with sensible defaults.

Pure and small; used by the placement tests and by services' tests that need a cluster.
"""

from __future__ import annotations

from tfcommon.gpu_models import GIB
from tfcommon.placement import Gpu, Node

A100_TFLOPS = 312_000
A100_VRAM = 40 * GIB


def a_gpu(
    index: int = 0, *, node: str = "n", model: str = "A100", used_share: int = 0, vendor: str = "nvidia"
) -> Gpu:
    return Gpu(
        uuid=f"{node}-gpu-{index}",
        index=index,
        model=model,
        tflops_milli=A100_TFLOPS,
        vram_bytes=A100_VRAM,
        vendor=vendor,
        used_tflops_milli=used_share * A100_TFLOPS // 1000,
        used_vram_bytes=used_share * A100_VRAM // 1000,
        workers=1 if used_share else 0,
    )


def a_node(
    name: str = "n",
    *,
    gpus: int = 1,
    model: str = "A100",
    used_shares: tuple[int, ...] = (),
    cpu_milli: int = 32_000,
    memory_bytes: int = 128 * GIB,
    **fields: object,
) -> Node:
    shares = used_shares + (0,) * (gpus - len(used_shares))
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        gpus=tuple(a_gpu(i, node=name, model=model, used_share=shares[i]) for i in range(gpus)),
        **fields,  # type: ignore[arg-type]
    )
