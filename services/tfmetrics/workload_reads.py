"""The scheduler's pending workloads for the dashboard, read through the ledger port.

Each pending workload with what it asks for and the scheduler's reason, in the scheduler's own order
(highest priority, then QoS, then the oldest), at most `PENDING_LIMIT` of them with the total count
(`Ledger.pending_workloads`). The submission document the scheduler stored is read leniently: a field
it lacks shows as empty (the metrics service never imports the scheduler).
"""

from __future__ import annotations

from typing import Any

from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import PendingSubmission

from tfmetrics.core.dashboard import PendingWorkload

PENDING_LIMIT = 200
"""The most pending workloads the dashboard lists; the count covers them all."""


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _number(document: dict[str, Any], key: str) -> int:
    value = document.get(key)
    return value if isinstance(value, int) else 0


def _text(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    return value if isinstance(value, str) and value else None


def _pending(row: PendingSubmission) -> PendingWorkload:
    submission = _object(row.submission)
    request = _object(submission.get("request"))
    return PendingWorkload(
        namespace=row.namespace,
        name=row.name,
        workload=_text(_object(submission.get("workload")), "workload") or row.name,
        pool=_text(request, "pool") or "",
        qos=_text(request, "qos") or "",
        gpu_count=_number(request, "gpu_count"),
        gpu_model=_text(request, "gpu_model"),
        tflops_request_milli=_number(request, "tflops_request_milli"),
        vram_request_bytes=_number(request, "vram_request_bytes"),
        reason=row.reason,
        submitted_at=row.submitted_at,
    )


async def pending_workloads(ledger: Ledger) -> tuple[list[PendingWorkload], int]:
    """The first `PENDING_LIMIT` pending workloads in the scheduler's order, and how many are pending."""
    pending, total = await ledger.pending_workloads(PENDING_LIMIT)
    return [_pending(row) for row in pending], total
