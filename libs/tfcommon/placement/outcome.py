"""What `place()` returns: a `Placement` to reserve, or a `Rejection` that explains itself.

Plain values; the scheduler turns them into ledger writes and events, the simulator applies them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where a request goes and exactly what to reserve there (per chosen GPU, in the same order).
    `limit_tflops_milli`/`limit_vram_bytes` are the limits per chosen GPU (empty: equal to what is
    reserved); a node's virtual capacity is checked against them."""

    request_name: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    tflops_milli: tuple[int, ...]
    vram_bytes: tuple[int, ...]
    cpu_milli: int
    memory_bytes: int
    workload_class: str
    score: int
    policy: str
    limit_tflops_milli: tuple[int, ...] = ()
    limit_vram_bytes: tuple[int, ...] = ()

    @property
    def limits(self) -> tuple[int, int]:
        """The limits this placement holds on its node in all: (milli-TFLOPS, VRAM bytes)."""
        return (
            sum(self.limit_tflops_milli or self.tflops_milli),
            sum(self.limit_vram_bytes or self.vram_bytes),
        )


@dataclass(frozen=True)
class Rejection:
    """No node fits. `reasons` counts nodes per first failing reason, largest count first."""

    request_name: str
    nodes_total: int
    reasons: tuple[tuple[str, int], ...]
    policy: str

    def summary(self) -> str:
        """Kubernetes-style text: `0/1213 nodes fit: 802 insufficient VRAM, 311 wrong GPU model`."""
        if not self.reasons:
            return f"0/{self.nodes_total} nodes fit: no nodes in the cluster"
        details = ", ".join(f"{count} {reason}" for reason, count in self.reasons)
        return f"0/{self.nodes_total} nodes fit: {details}"
