"""Compaction of empty nodes (TensorFusion's Strategy #1): which nodes get `should-delete=true`.

A node qualifies when nothing is allocated on it, its GPUNode is not `do-not-disrupt`, it is ready,
not being deleted, older than five minutes, and removing it keeps the pool's warm resources
(available TFLOPS and VRAM) and minimum resources (total TFLOPS and VRAM). A pool with
`maxResources` can take only what is left below its maximum, so no more than that is kept warm: an
empty node whose capacity the maximum would never let the pool use is compacted. The cluster
autoscaler acts on the label; nothing is deleted here. Pure: `now` is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tfcommon.quantities import QuantityError, parse_bytes, parse_milli

from tfdefrag.core import markers
from tfdefrag.core.planner import NodeSkip, PoolNode, SkipReason, gpus_in_use

NEW_NODE_PROTECTION = timedelta(minutes=5)


@dataclass(frozen=True)
class Resources:
    """TFLOPS (milli) and VRAM (bytes) of a pool's capacity setting."""

    tflops_milli: int = 0
    vram_bytes: int = 0


@dataclass(frozen=True)
class CompactionDecision:
    """Nodes to label `should-delete=true`, and the empty nodes kept with their reason."""

    mark: tuple[str, ...]
    kept: tuple[NodeSkip, ...]


def parse_capacity(pool: str, capacity_config: object) -> tuple[Resources, Resources, tuple[str, ...]]:
    """`spec.capacityConfig` -> (minResources, warmResources, problems). Invalid values count as 0."""
    problems: list[str] = []
    section = capacity_config if isinstance(capacity_config, Mapping) else {}

    def resources(name: str) -> Resources:
        raw = section.get(name) or {}
        if not isinstance(raw, Mapping):
            problems.append(f"pool {pool}: spec.capacityConfig.{name} must be a mapping with tflops and vram")
            return Resources()
        tflops, vram = 0, 0
        try:
            tflops = parse_milli(raw.get("tflops", 0), what=f"spec.capacityConfig.{name}.tflops")
        except QuantityError as error:
            problems.append(f"pool {pool}: {error}")
        try:
            vram = parse_bytes(raw.get("vram", 0), what=f"spec.capacityConfig.{name}.vram")
        except QuantityError as error:
            problems.append(f"pool {pool}: {error}")
        return Resources(tflops, vram)

    return resources("minResources"), resources("warmResources"), tuple(problems)


def _capacity(node: PoolNode) -> Resources:
    return Resources(
        sum(gpu.tflops_milli for gpu in node.node.gpus), sum(gpu.vram_bytes for gpu in node.node.gpus)
    )


def _used(node: PoolNode) -> Resources:
    return Resources(
        sum(gpu.used_tflops_milli for gpu in node.node.gpus),
        sum(gpu.used_vram_bytes for gpu in node.node.gpus),
    )


def plan_compaction(
    nodes: Sequence[PoolNode],
    now: datetime,
    *,
    minimum: Resources = Resources(),
    warm: Resources = Resources(),
    maximum: tuple[int | None, int | None] = (None, None),
) -> CompactionDecision:
    """Choose the empty nodes whose removal keeps the pool's minimum and warm resources; the warm
    resources kept are at most what the pool's `maximum` (milli-TFLOPS, VRAM bytes; None: unset) still
    lets it reserve."""
    live = [node for node in nodes if not markers.is_marked(node.labels, markers.SHOULD_DELETE)]
    total_tflops = sum(_capacity(node).tflops_milli for node in live)
    total_vram = sum(_capacity(node).vram_bytes for node in live)
    free_tflops = total_tflops - sum(_used(node).tflops_milli for node in live)
    free_vram = total_vram - sum(_used(node).vram_bytes for node in live)
    max_tflops, max_vram = maximum
    if max_tflops is not None:
        room = max(max_tflops - (total_tflops - free_tflops), 0)
        warm = Resources(min(warm.tflops_milli, room), warm.vram_bytes)
    if max_vram is not None:
        room = max(max_vram - (total_vram - free_vram), 0)
        warm = Resources(warm.tflops_milli, min(warm.vram_bytes, room))
    mark: list[str] = []
    kept: list[NodeSkip] = []
    for pool_node in sorted(live, key=lambda n: n.name):
        if gpus_in_use(pool_node.node) or pool_node.node.workers or not pool_node.node.gpus:
            continue
        reason = _protected(pool_node, now)
        if reason is not None:
            kept.append(NodeSkip(pool_node.name, reason[0], reason[1]))
            continue
        capacity = _capacity(pool_node)
        if (
            free_tflops - capacity.tflops_milli < warm.tflops_milli
            or free_vram - capacity.vram_bytes < warm.vram_bytes
            or total_tflops - capacity.tflops_milli < minimum.tflops_milli
            or total_vram - capacity.vram_bytes < minimum.vram_bytes
        ):
            kept.append(
                NodeSkip(
                    pool_node.name,
                    SkipReason.EMPTY,
                    "kept to hold the pool's warmResources/minResources",
                )
            )
            continue
        mark.append(pool_node.name)
        total_tflops -= capacity.tflops_milli
        total_vram -= capacity.vram_bytes
        free_tflops -= capacity.tflops_milli
        free_vram -= capacity.vram_bytes
    return CompactionDecision(tuple(mark), tuple(kept))


def _protected(pool_node: PoolNode, now: datetime) -> tuple[SkipReason, str] | None:
    if markers.is_marked(pool_node.gpu_node_labels, markers.DO_NOT_DISRUPT) or markers.is_marked(
        pool_node.labels, markers.DO_NOT_DISRUPT
    ):
        return SkipReason.DO_NOT_DISRUPT, f"labelled {markers.DO_NOT_DISRUPT}=true on its GPUNode"
    if pool_node.deleting:
        return SkipReason.DELETING, "the node is being deleted"
    if not pool_node.ready:
        return SkipReason.NOT_READY, "the node is not ready"
    if pool_node.created_at is None or now - pool_node.created_at < NEW_NODE_PROTECTION:
        return SkipReason.EMPTY, "younger than 5 minutes (new-node protection)"
    return None
