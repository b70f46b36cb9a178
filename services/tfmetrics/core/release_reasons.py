"""The bounded `reason` label of `tf_system_allocations_released_total`.

An `AllocationReleased` event carries its reason in words ("pod deleted", "binding to node-3 failed:
...", "worker stopped: ..."), which would make one Prometheus series per distinct sentence, without
limit. `release_reason_code` maps the event to one of the closed set `RELEASE_REASON_CODES`; anything
it does not recognise is `other`. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

ReleaseReasonCode = Literal[
    "evicted",
    "deleted",
    "completed",
    "binding-failed",
    "worker-stopped",
    "defrag-hold",
    "other",
]
"""What ended an allocation, as the label value: at most these seven series."""

RELEASE_REASON_CODES: Final[frozenset[str]] = frozenset(get_args(ReleaseReasonCode))

# First match wins; the prefixes are those the scheduler, the agents and defrag release with.
_PREFIXES: Final[tuple[tuple[str, ReleaseReasonCode], ...]] = (
    ("pod deleted", "deleted"),
    ("pod gone", "deleted"),
    ("workload-deleted", "deleted"),
    ("pod succeeded", "completed"),
    ("pod failed", "completed"),
    ("binding to ", "binding-failed"),
    ("worker stopped", "worker-stopped"),
    ("defrag hold", "defrag-hold"),
)


def release_reason_code(reason: str, *, evicted: bool = False) -> ReleaseReasonCode:
    """The label value for a release: `evicted` when it was an eviction, else the code of `reason`'s
    known prefix (case-insensitive), else `other`."""
    if evicted:
        return "evicted"
    text = reason.strip().lower()
    for prefix, code in _PREFIXES:
        if text.startswith(prefix):
            return code
    return "other"
