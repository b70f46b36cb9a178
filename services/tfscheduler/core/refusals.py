"""Submissions refused before they are recorded, because waiting could never place them. Pure.

- `unknown_pool`: the request names a pool that is neither configured nor has a node.
- `never_fits`: no node of the pool could hold the request even empty: a per-GPU TFLOPS or VRAM
  request above every card (of the model asked for), a GPU model the pool does not have, or more
  such GPUs than any one node has. The reason names the largest that fits. Only capacity counts, not
  what is in use, cordoned or silent now (that may change), nor labels and taints; a pool with no
  node yet refuses nothing (its nodes may still register).
- `takeover_full`: the `enabled-replicas` cap of a workload is reached.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from tfcommon.placement import Gpu, PlacementRequest
from tfcommon.placement.from_ledger import GpuFacts, placement_gpu
from tfcommon.quantities import format_bytes


def unknown_pool(pool: str, known: Collection[str]) -> str | None:
    """Why `pool` is refused, or None when it is known."""
    if pool in known:
        return None
    names = ", ".join(sorted(known)) or "none"
    return f"request.pool: unknown pool {pool!r}; known pools: {names}"


def ledger_cards(
    node_pools: Mapping[str, str], gpus: Iterable[GpuFacts], pool: str
) -> dict[str, Sequence[Gpu]]:
    """The GPUs of each node of `pool` as the ledger records them (`node_pools`: node -> pool), every
    GPU counted, even where the view leaves a node's GPUs out (an incomplete inventory)."""
    cards: dict[str, list[Gpu]] = {name: [] for name, node_pool in node_pools.items() if node_pool == pool}
    for gpu in gpus:
        if gpu.node in cards:
            cards[gpu.node].append(placement_gpu(gpu, workers=0))
    return dict(cards)


def _of_model(request: PlacementRequest, gpu: Gpu) -> bool:
    return not request.gpu_models or gpu.model in request.gpu_models


def _holds(request: PlacementRequest, gpu: Gpu) -> bool:
    return (
        _of_model(request, gpu)
        and request.tflops_on(gpu) <= gpu.tflops_milli
        and request.vram_on(gpu) <= gpu.vram_bytes
    )


def fits_somewhere(request: PlacementRequest, nodes_gpus: Iterable[Sequence[Gpu]]) -> bool:
    """Whether some node, given as its GPUs, could hold `request` when empty (stops at the first)."""
    return any(sum(1 for gpu in gpus if _holds(request, gpu)) >= request.gpu_count for gpus in nodes_gpus)


def never_fits(request: PlacementRequest, cards: Mapping[str, Sequence[Gpu]]) -> str | None:
    """Why no node of `cards` (the nodes of `request.pool`) could ever hold `request`, naming the
    largest that fits; None when one could, or when the pool has no GPU yet."""
    if fits_somewhere(request, cards.values()):
        return None
    every = [gpu for gpus in cards.values() for gpu in gpus]
    if not every:
        return None
    pool = request.pool
    models = [gpu for gpu in every if _of_model(request, gpu)]
    if not models:
        return (
            f"gpu-model {'|'.join(sorted(request.gpu_models))}: pool {pool} has no such GPU "
            f"(its models: {', '.join(sorted({gpu.model for gpu in every}))})"
        )
    kind = f" {'|'.join(sorted(request.gpu_models))}" if request.gpu_models else ""
    tflops, vram = _tflops(request.tflops_milli), format_bytes(request.vram_bytes)
    problems = []
    if all(request.tflops_on(gpu) > gpu.tflops_milli for gpu in models):
        largest = _tflops(max(gpu.tflops_milli for gpu in models))
        problems.append(
            f"tflops-request {tflops} exceeds every{kind} GPU of pool {pool} (largest: {largest} TFLOPS)"
        )
    if all(request.vram_on(gpu) > gpu.vram_bytes for gpu in models):
        largest = format_bytes(max(gpu.vram_bytes for gpu in models))
        problems.append(f"vram-request {vram} exceeds every{kind} GPU of pool {pool} (largest: {largest})")
    if problems:
        return "; ".join(problems)
    most = max(sum(1 for gpu in gpus if _holds(request, gpu)) for gpus in cards.values())
    if most == 0:
        return f"no{kind} GPU of pool {pool} has both tflops-request {tflops} and vram-request {vram}"
    of_model = max(sum(1 for gpu in gpus if _of_model(request, gpu)) for gpus in cards.values())
    fitting = "" if most == of_model else " that hold the request"
    return (
        f"gpu-count {request.gpu_count} exceeds every node of pool {pool} "
        f"(largest: {most}{kind} GPUs{fitting} on one node)"
    )


def takeover_full(workload_key: str, limit: int, taken_over: int) -> str | None:
    """Why one more pod of the workload `workload_key` is not taken over under `enabled-replicas:
    limit` when `taken_over` of its pods are live; None when there is room."""
    if taken_over < limit:
        return None
    return (
        f"enabled-replicas {limit}: {taken_over} pod(s) of workload {workload_key} already taken over; "
        "this one is not (in Kubernetes it would keep its device-plugin GPUs)"
    )


def _tflops(milli: int) -> str:
    return f"{milli / 1000:g}"
