"""The scheduler's live workloads as `tfctl` shows and finds them (`tfctl get workloads`, `tfctl delete`).

Reads `GET /api/v1/workloads` (placed and pending workloads, oldest first per name). Rendering is pure:
one row per workload with its state, node, GPU count, GPU ids and, for a pending one, the reason it
waits. `find` picks the workloads a user names: by namespace and name, or by allocation id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

COLUMNS = ("NAMESPACE", "NAME", "STATE", "NODE", "GPUS", "GPU-IDS", "REASON")


def _row(workload: dict[str, Any]) -> tuple[str, ...]:
    gpu_ids = list(workload.get("gpu_uuids") or [])
    gpus = len(gpu_ids) if gpu_ids else workload.get("gpu_count")
    return (
        str(workload["namespace"]),
        str(workload["name"]),
        str(workload["state"]),
        str(workload.get("node") or "-"),
        "-" if gpus is None else str(gpus),
        ",".join(gpu_ids) or "-",
        str(workload.get("reason") or "-"),
    )


def render(workloads: Sequence[dict[str, Any]]) -> str:
    """An aligned table; the reason column comes last, unpadded, since it can be long."""
    if not workloads:
        return "no workloads (submit one with `tfctl submit -f pod.yaml` or `tfctl run`)"
    rows = [COLUMNS, *(_row(workload) for workload in workloads)]
    widths = [max(len(row[index]) for row in rows) for index in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    )


def in_namespace(workloads: Sequence[dict[str, Any]], namespace: str | None) -> list[dict[str, Any]]:
    """The workloads of `namespace`, or all of them when it is None."""
    return [w for w in workloads if namespace is None or w["namespace"] == namespace]


def find(workloads: Sequence[dict[str, Any]], name_or_id: str, namespace: str) -> list[dict[str, Any]]:
    """The live workloads `name_or_id` names: an allocation id (any namespace) or a name in `namespace`."""
    try:
        wanted_id: UUID | None = UUID(name_or_id)
    except ValueError:
        wanted_id = None
    if wanted_id is not None:
        return [w for w in workloads if UUID(str(w["id"])) == wanted_id]
    return [w for w in workloads if w["namespace"] == namespace and w["name"] == name_or_id]


def has_controller(workload: dict[str, Any]) -> bool:
    """Whether a controller owns it (its manifest's `ownerReferences`), which recreates it once deleted."""
    owner = workload.get("owner")
    return bool(owner) and owner != workload["name"]
