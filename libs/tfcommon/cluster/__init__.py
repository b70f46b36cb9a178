"""The cluster port (`Cluster`), its value types and typed results.

Import adapters from their modules (`tfcommon.cluster.kubernetes`, `tfcommon.cluster.memory`): this package
itself imports no Kubernetes client, so pure code can depend on the types.
"""

from tfcommon.cluster.model import (
    Applied,
    BindResult,
    Bound,
    ClusterError,
    Conflict,
    ContainerResources,
    CustomObject,
    CustomResource,
    Evicted,
    EvictionBlocked,
    EvictionResult,
    LabelSelector,
    Node,
    NodeCondition,
    NotFound,
    PatchResult,
    Pod,
    PodDisruptionBudget,
    PodEvent,
    PodEventType,
    PodKey,
    PodList,
    Taint,
    Toleration,
    WatchCursor,
)
from tfcommon.cluster.port import Cluster, PodWatch

__all__ = [
    "Applied",
    "BindResult",
    "Bound",
    "Cluster",
    "ClusterError",
    "Conflict",
    "ContainerResources",
    "CustomObject",
    "CustomResource",
    "Evicted",
    "EvictionBlocked",
    "EvictionResult",
    "LabelSelector",
    "Node",
    "NodeCondition",
    "NotFound",
    "PatchResult",
    "Pod",
    "PodDisruptionBudget",
    "PodEvent",
    "PodEventType",
    "PodKey",
    "PodList",
    "PodWatch",
    "Taint",
    "Toleration",
    "WatchCursor",
]
