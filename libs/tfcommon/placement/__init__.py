"""Placement core: fragmentation-aware GPU placement. Pure: no I/O, no clock, no hidden randomness.

Public API: the model (`Node`, `Gpu`, `PlacementRequest`, ...), `place(request, cluster, profile)`
returning a `Placement` or a `Rejection`, `ClusterView` (the incremental index a scheduler keeps),
`policy(name, args)` and the fragmentation measures. See docs/placement.md.
"""

from tfcommon.placement.fragmentation import (
    FragmentationReport,
    TargetWorkload,
    WorkloadClass,
    cluster_fragmentation,
)
from tfcommon.placement.framework import Candidate, Chooser, ClusterView, Profile, evaluate, place
from tfcommon.placement.model import (
    Gpu,
    Isolation,
    Node,
    NodeSelectorRequirement,
    PlacementRequest,
    PlacementRequestError,
    Taint,
    Toleration,
)
from tfcommon.placement.outcome import Placement, Rejection
from tfcommon.placement.registry import (
    DEFAULT_POLICY,
    POLICIES,
    PluginArgs,
    ProfileConfig,
    UnknownPolicyError,
    build_profile,
    policy,
    prepare_policy_inputs,
)

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Candidate",
    "Chooser",
    "ClusterView",
    "FragmentationReport",
    "Gpu",
    "Isolation",
    "Node",
    "NodeSelectorRequirement",
    "Placement",
    "PlacementRequest",
    "PlacementRequestError",
    "PluginArgs",
    "Profile",
    "ProfileConfig",
    "Rejection",
    "Taint",
    "TargetWorkload",
    "Toleration",
    "UnknownPolicyError",
    "WorkloadClass",
    "build_profile",
    "cluster_fragmentation",
    "evaluate",
    "place",
    "policy",
    "prepare_policy_inputs",
]
