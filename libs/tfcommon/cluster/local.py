"""`LocalCluster`: the `Cluster` port in local mode (`make run`, `tfctl submit`), with no Kubernetes at all.

Workloads submitted locally live here as pod manifests. It behaves like `InMemoryCluster` and adds what
Kubernetes controllers would do: an evicted workload comes back as a new pending one (same name, a new
uid, unbound, without the scheduler's annotations), so the scheduler places the replacement. State is
process memory; the ledger stays the source of truth for allocations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfcommon.cluster.memory import InMemoryCluster
from tfcommon.cluster.model import Evicted, EvictionResult, Pod

SCHEDULER_WRITTEN_ANNOTATIONS = (
    "tensor-fusion.ai/gpu-ids",
    "tensor-fusion.ai/container-gpus",
    "tensor-fusion.ai/index",
)


def replacement_manifest(evicted: Mapping[str, Any]) -> dict[str, Any]:
    """What a controller would create after an eviction: the same workload, pending, not yet placed."""
    meta = dict(evicted.get("metadata") or {})
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in SCHEDULER_WRITTEN_ANNOTATIONS
    }
    spec = {k: v for k, v in (evicted.get("spec") or {}).items() if k != "nodeName"}
    return {
        "apiVersion": evicted.get("apiVersion", "v1"),
        "kind": evicted.get("kind", "Pod"),
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace") or "default",
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
            "ownerReferences": list(meta.get("ownerReferences") or ()),
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class LocalCluster(InMemoryCluster):
    """Local mode: `submit()` adds a workload; an allowed eviction recreates it as a new pending pod."""

    def submit(self, manifest: Mapping[str, Any]) -> Pod:
        return self.put_pod(manifest)

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        before = self.manifest("pods", namespace, name)
        result = await super().evict_pod(namespace, name)
        if isinstance(result, Evicted) and before is not None:
            self.put_pod(replacement_manifest(before))
        return result
