"""Plugin registry and policies: a policy is a profile configuration that names plugins and weights.

`build_profile(config, args)` turns a `ProfileConfig` (which a settings file can carry) into a
`Profile`; `policy(name, args)` builds one of the built-in policies listed in `POLICIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcommon.placement.card_value import CardValueMeasure, card_values_for
from tfcommon.placement.filters import (
    DEFAULT_MAX_WORKERS_PER_NODE,
    FitsCpu,
    FitsMemory,
    FitsTflops,
    FitsVirtualCapacity,
    FitsVram,
    IsolationSupported,
    MatchesGpuModel,
    MatchesGpuVendor,
    MatchesNodeAffinity,
    MatchesNodeSelector,
    MatchesPool,
    MaxWorkersPerNode,
    NodeSchedulable,
    SharedTakesIdleGpu,
    ToleratesTaints,
)
from tfcommon.placement.fragmentation import TargetWorkload, WorkloadClass
from tfcommon.placement.framework import GpuFilter, NodeFilter, Profile, ScorePlugin
from tfcommon.placement.gradient import FragmentationGradient
from tfcommon.placement.model import WHOLE_GPU_SHARE, PlacementRequest
from tfcommon.placement.rollout import DEFAULT_CANDIDATES, DEFAULT_DEPTH, Rollout
from tfcommon.placement.scores import (
    BestFit,
    CompactFirst,
    DotProduct,
    GpuClustering,
    GpuPacking,
    Indifferent,
    LeastFreeGpus,
    LowLoadFirst,
    NodeCompactGpuLowLoad,
)


class UnknownPolicyError(ValueError):
    """A policy or plugin name that is not registered; `str()` lists the known names."""


@dataclass(frozen=True)
class PluginArgs:
    """What plugin factories may need: the seed of seeded policies; the target workload of
    fragmentation-aware ones (`target` for `fgd`, `memory_target` built `with_memory` for `tfpool`,
    which falls back to `target`; see `PluginArgs.learned_from`); the largest node's CPU and GPU
    share (for normalizing); the worker cap."""

    seed: int = 0
    target: TargetWorkload = field(default_factory=lambda: TargetWorkload(()))
    memory_target: TargetWorkload | None = None
    max_cpu_milli: int = 128_000
    max_gpu_share: int = 8 * WHOLE_GPU_SHARE
    max_workers_per_node: int = DEFAULT_MAX_WORKERS_PER_NODE

    @classmethod
    def learned_from(cls, requests: Iterable[PlacementRequest], **fields: Any) -> PluginArgs:
        """Arguments whose target workloads are learned from `requests` (e.g. the recent ones)."""
        kept = list(requests)
        return cls(
            target=TargetWorkload.from_requests(kept),
            memory_target=TargetWorkload.from_requests(kept, with_memory=True),
            **fields,
        )

    @classmethod
    def learned_from_classes(
        cls, memories: Mapping[WorkloadClass, Sequence[int]], **fields: Any
    ) -> PluginArgs:
        """`learned_from` for requests already sorted into classes (`TargetWorkload.from_classes`)."""
        return cls(
            target=TargetWorkload.from_classes(memories),
            memory_target=TargetWorkload.from_classes(memories, with_memory=True),
            **fields,
        )


@dataclass(frozen=True)
class ProfileConfig:
    """A policy as configuration: score plugin names with weights, whether ties are seeded, and the
    rollout look-ahead (`rollout_candidates` best nodes, `rollout_depth` drawn pods; 0: none), which
    needs a fragmentation-gradient scorer (tfcommon/placement/rollout.py)."""

    name: str
    scorers: tuple[tuple[str, int], ...]
    seeded_ties: bool = False
    rollout_candidates: int = 0
    rollout_depth: int = 0


SCORE_PLUGINS: dict[str, Callable[[PluginArgs], ScorePlugin]] = {
    "CompactFirst": lambda args: CompactFirst(),
    "LowLoadFirst": lambda args: LowLoadFirst(),
    "NodeCompactGPULowLoad": lambda args: NodeCompactGpuLowLoad(),
    "BestFit": lambda args: BestFit(args.max_cpu_milli, args.max_gpu_share),
    "DotProduct": lambda args: DotProduct(args.max_cpu_milli, args.max_gpu_share),
    "GpuPacking": lambda args: GpuPacking(),
    "GpuClustering": lambda args: GpuClustering(args.max_gpu_share),
    "Indifferent": lambda args: Indifferent(),
    "FragmentationGradient": lambda args: FragmentationGradient(args.target),
    "MemoryAwareFragmentationGradient": lambda args: FragmentationGradient(
        args.memory_target or args.target, memory_aware=args.memory_target is not None
    ),
}

ROLLOUT_POLICY = "tfpool-rollout"
DEFAULT_POLICY = ROLLOUT_POLICY

POLICIES: dict[str, ProfileConfig] = {
    config.name: config
    for config in (
        ProfileConfig("CompactFirst", (("CompactFirst", 1),)),
        ProfileConfig("LowLoadFirst", (("LowLoadFirst", 1),)),
        ProfileConfig("NodeCompactGPULowLoad", (("NodeCompactGPULowLoad", 1),)),
        ProfileConfig("bestfit", (("BestFit", 1),)),
        ProfileConfig("dotproduct", (("DotProduct", 1),)),
        ProfileConfig("gpupacking", (("GpuPacking", 1),)),
        ProfileConfig("gpuclustering", (("GpuClustering", 1),)),
        ProfileConfig("random", (("Indifferent", 1),), seeded_ties=True),
        ProfileConfig("fgd", (("FragmentationGradient", 1),)),
        ProfileConfig("tfpool", (("MemoryAwareFragmentationGradient", 1),)),
        ProfileConfig(
            ROLLOUT_POLICY,
            (("MemoryAwareFragmentationGradient", 1),),
            rollout_candidates=DEFAULT_CANDIDATES,
            rollout_depth=DEFAULT_DEPTH,
        ),
    )
}


def node_filters(args: PluginArgs) -> tuple[NodeFilter, ...]:
    return (
        IsolationSupported(),
        NodeSchedulable(),
        MatchesPool(),
        MatchesNodeSelector(),
        MatchesNodeAffinity(),
        ToleratesTaints(),
        FitsCpu(),
        FitsMemory(),
        FitsVirtualCapacity(),
        MaxWorkersPerNode(args.max_workers_per_node),
    )


def gpu_filters() -> tuple[GpuFilter, ...]:
    return (MatchesGpuModel(), MatchesGpuVendor(), SharedTakesIdleGpu(), FitsTflops(), FitsVram())


def build_profile(config: ProfileConfig, args: PluginArgs) -> Profile:
    scorers: list[tuple[ScorePlugin, int]] = []
    for plugin_name, weight in config.scorers:
        factory = SCORE_PLUGINS.get(plugin_name)
        if factory is None:
            known = ", ".join(sorted(SCORE_PLUGINS))
            raise UnknownPolicyError(
                f"profile {config.name}: unknown score plugin {plugin_name!r}; use {known}"
            )
        scorers.append((factory(args), weight))
    return Profile(
        name=config.name,
        node_filters=node_filters(args),
        gpu_filters=gpu_filters(),
        scorers=tuple(scorers),
        gpu_picker=LeastFreeGpus(),
        seed=args.seed if config.seeded_ties else None,
        chooser=_rollout(config, args, scorers),
    )


def _rollout(
    config: ProfileConfig, args: PluginArgs, scorers: list[tuple[ScorePlugin, int]]
) -> Rollout | None:
    if config.rollout_candidates < 2 or config.rollout_depth < 1:
        return None
    gradient = next((scorer for scorer, _ in scorers if isinstance(scorer, FragmentationGradient)), None)
    if gradient is None:
        raise UnknownPolicyError(
            f"profile {config.name}: a rollout needs a fragmentation-gradient scorer; add "
            "FragmentationGradient or MemoryAwareFragmentationGradient"
        )
    return Rollout(
        CardValueMeasure(card_values_for(gradient.target), gradient.target),
        gradient.target,
        seed=args.seed,
        candidates=config.rollout_candidates,
        depth=config.rollout_depth,
    )


def prepare_policy_inputs(args: PluginArgs) -> None:
    """Compute and keep what building a policy from `args` would compute (the rollout's card values,
    about 0.1 s of CPU), so that a caller with an event loop can do it in a worker thread first."""
    card_values_for(args.memory_target or args.target)


def policy(name: str = DEFAULT_POLICY, args: PluginArgs | None = None) -> Profile:
    """Build a built-in policy by name (see `POLICIES`)."""
    config = POLICIES.get(name)
    if config is None:
        raise UnknownPolicyError(f"unknown policy {name!r}; use one of {', '.join(POLICIES)}")
    return build_profile(config, args or PluginArgs())
