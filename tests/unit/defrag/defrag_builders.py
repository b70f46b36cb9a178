"""Builders for defrag planner tests: nodes with GPUs in use, workers, budgets."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from tfcommon.cluster.model import LabelSelector, PodDisruptionBudget
from tfcommon.placement import Gpu, Node, PlacementRequest
from tfdefrag.core.planner import PoolNode, Worker

NOW = datetime(2026, 6, 1, 3, 30, tzinfo=UTC)
OLD = NOW - timedelta(days=1)
GIB = 1 << 30
H100_TFLOPS = 989_000
H100_VRAM = 80 * GIB


def a_node(name: str, used_shares: tuple[int, ...], **kwargs: object) -> PoolNode:
    """A node whose GPU i has `used_shares[i]` thousandths of an H100 reserved."""
    gpus = tuple(
        Gpu(
            uuid=f"gpu-{name}-{index}",
            index=index,
            model="H100",
            tflops_milli=H100_TFLOPS,
            vram_bytes=H100_VRAM,
            used_tflops_milli=share * H100_TFLOPS // 1000,
            used_vram_bytes=share * H100_VRAM // 1000,
            workers=1 if share else 0,
        )
        for index, share in enumerate(used_shares)
    )
    node = Node(name=name, cpu_milli=64_000, memory_bytes=512 * GIB, gpus=gpus, pool="default")
    return PoolNode(node=node, created_at=OLD, **kwargs)  # type: ignore[arg-type]


def a_worker(
    name: str,
    node: str,
    share: int = 250,
    *,
    labels: Mapping[str, str] | None = None,
    created_at: datetime | None = OLD,
    namespace: str = "ml",
) -> Worker:
    return Worker(
        namespace=namespace,
        name=name,
        node=node,
        request=PlacementRequest(name=name, gpu_share=share),
        uid=f"uid-{name}",
        labels=dict(labels if labels is not None else {"app": "serve"}),
        created_at=created_at,
    )


def a_budget(
    name: str = "serve",
    *,
    match: Mapping[str, str] | None = None,
    allowed: int = 1,
    namespace: str = "ml",
) -> PodDisruptionBudget:
    return PodDisruptionBudget(
        namespace=namespace,
        name=name,
        selector=LabelSelector(match_labels=dict(match if match is not None else {"app": "serve"})),
        disruptions_allowed=allowed,
    )
