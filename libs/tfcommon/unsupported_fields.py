"""Which fields of GPUPool, GPUNode and GPUResourceQuota objects tfpool acts on, which it only accepts. Pure.

Our CRDs accept every field of TensorFusion's v1 schemas, so TensorFusion's manifests apply unchanged;
a field that no tfpool service reads is still kept, never pruned, and named here instead.
`unsupported_fields(kind, spec)` walks an object's `spec` and returns the path of every field set there
that lies outside `SUPPORTED` (a whole unsupported section is named once, e.g. `spec.componentConfig`).
`unsupported_condition` turns that into the status condition `UnsupportedFields` (status "True" and
the paths in its message when any is set) which the scheduler keeps on each object
(`tfscheduler.spec_conditions`) and `tfctl doctor` prints.

GPU objects are not covered: they have no spec, and their status is written by our node agent only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from tfcommon.cluster.model import CustomResource

CONDITION = "UnsupportedFields"
REASON_UNSUPPORTED = "FieldsNotActedOn"
REASON_NONE = "AllFieldsActedOn"

SUPPORTED: Mapping[CustomResource, frozenset[str]] = {
    CustomResource.GPU_POOL: frozenset(
        {
            "spec.defaultUsingLocalGPU",  # webhook: local GPUs by default
            "spec.qosConfig.defaultQoS",  # webhook: QoS when a pod names none
            "spec.qosConfig.pricing",  # metrics: billing
            "spec.qosConfig.evictionProtectionPriceRatio",  # metrics: billing
            "spec.qosConfig.pricingHistory",  # metrics: billing across price changes (tfpool addition)
            "spec.nodeManagerConfig.defaultIsolationMode",  # webhook: isolation when a pod names none
            "spec.nodeManagerConfig.nodeCompaction",  # defrag planner: compaction and defrag campaigns
            "spec.capacityConfig.minResources.tflops",  # defrag planner: compaction keeps the minimum
            "spec.capacityConfig.minResources.vram",
            "spec.capacityConfig.warmResources.tflops",  # defrag planner: compaction keeps warm capacity
            "spec.capacityConfig.warmResources.vram",
            "spec.capacityConfig.maxResources.tflops",  # scheduler: the pool's reservations stay below
            "spec.capacityConfig.maxResources.vram",
            "spec.capacityConfig.oversubscription",  # scheduler, defrag planner: limits to virtual capacity
            "spec.nodeManagerConfig.nodeSelector",  # scheduler, defrag planner: which nodes are in the pool
            "spec.placement.mode",  # scheduler: placement policy (tfpool addition)
        }
    ),
    CustomResource.GPU_NODE: frozenset(),
    CustomResource.GPU_RESOURCE_QUOTA: frozenset(
        {
            "spec.total",  # scheduler: namespace totals, maxWorkers, alertThresholdPercent
            "spec.single.maxRequests",  # scheduler and webhook: per-workload maxima
            "spec.single.maxLimits",
            "spec.single.maxGPUCount",
            "spec.single.defaultRequests",  # webhook (and scheduler): defaults for a pod that names none
            "spec.single.defaultLimits",
        }
    ),
}
"""Per kind, the field paths some tfpool service reads from the object in Kubernetes mode (a path covers
everything below it). GPUResourceQuota objects are read by the scheduler (`tfscheduler.quota_source`)."""

DOCS = "docs/tensorfusion-compatibility.md"


def _walk(node: Mapping[str, Any], path: str, supported: frozenset[str]) -> Iterable[str]:
    for key in sorted(node):
        child_path = f"{path}.{key}"
        value = node[key]
        if value is None:
            continue
        if any(child_path == s or child_path.startswith(s + ".") for s in supported):
            continue
        below = [s for s in supported if s.startswith(child_path + ".")]
        if below and isinstance(value, Mapping):
            yield from _walk(value, child_path, supported)
        else:
            yield child_path


def unsupported_fields(kind: CustomResource, spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Paths (from the object root, `spec....`) of the fields set in `spec` that tfpool does not act on."""
    return tuple(_walk(spec, "spec", SUPPORTED.get(kind, frozenset())))


def condition_message(fields: Sequence[str]) -> str:
    if not fields:
        return "tfpool acts on every field set in this object's spec"
    return (
        f"tfpool accepts but does not act on {len(fields)} field(s): {', '.join(fields)} "
        f"(kept as written; see {DOCS})"
    )


def unsupported_condition(kind: CustomResource, spec: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The `UnsupportedFields` condition for an object with this `spec`, as of `now`."""
    fields = unsupported_fields(kind, spec)
    return {
        "type": CONDITION,
        "status": "True" if fields else "False",
        "reason": REASON_UNSUPPORTED if fields else REASON_NONE,
        "message": condition_message(fields),
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def same_condition(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Equal apart from `lastTransitionTime`."""
    return a is not None and all(a.get(key) == b.get(key) for key in ("type", "status", "reason", "message"))


def find_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return None
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == kind), None)


def with_condition(status: Mapping[str, Any], condition: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`status.conditions` with `condition` put in place of the one of its type; the others stay. The
    transition time is kept when the status (True/False) did not change."""
    conditions = status.get("conditions")
    kept = [dict(c) for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []
    new = dict(condition)
    for index, old in enumerate(kept):
        if old.get("type") == new["type"]:
            if old.get("status") == new["status"] and old.get("lastTransitionTime"):
                new["lastTransitionTime"] = old["lastTransitionTime"]
            kept[index] = new
            return kept
    return [*kept, new]
