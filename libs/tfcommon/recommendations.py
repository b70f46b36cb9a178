"""A workload's autoscaling recommendation as the metrics service stores it and the webhook applies it.

Pure data, no I/O: the metrics service computes it (`tfmetrics.core.recommendations`), the ledger keeps
it (`tfcommon.ledger.recommendations`), the webhook applies it to newly admitted pods of a workload with
`tensor-fusion.ai/autoscale: "true"`, and `tfctl get recommendations` shows it. Quantities are per GPU
(milli-TFLOPS, bytes) and never above the card the workload runs on. Only workloads that hold GPUs have
one. A recommendation that is not `sufficient` (too few samples) repeats the current values and must not
change a pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


def workload_key(namespace: str, workload: str) -> str:
    """The key a workload's recommendation is stored under: `namespace/workload`."""
    return f"{namespace}/{workload}"


@dataclass(frozen=True)
class Recommendation:
    """Recommended per-GPU request and limit for one workload, with when, why and on how many samples."""

    workload_key: str
    pool: str
    qos: str
    gpu_count: int
    request_tflops_milli: int
    limit_tflops_milli: int
    request_vram_bytes: int
    limit_vram_bytes: int
    current_request_tflops_milli: int
    current_limit_tflops_milli: int
    current_request_vram_bytes: int
    current_limit_vram_bytes: int
    sample_count: int
    sufficient: bool
    reason: str
    computed_at: datetime

    def __post_init__(self) -> None:
        if self.limit_tflops_milli < self.request_tflops_milli:
            raise ValueError("limit_tflops_milli: must be at least request_tflops_milli")
        if self.limit_vram_bytes < self.request_vram_bytes:
            raise ValueError("limit_vram_bytes: must be at least request_vram_bytes")
        if min(self.request_tflops_milli, self.request_vram_bytes, self.sample_count) < 0:
            raise ValueError("request_tflops_milli, request_vram_bytes and sample_count must not be negative")
        if self.gpu_count < 1:
            raise ValueError("gpu_count: must be at least 1")
