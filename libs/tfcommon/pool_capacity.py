"""A GPUPool's bounds on its capacity and its members, read from its spec. Pure.

Three settings of TensorFusion's GPUPool, as tfpool acts on them (`docs/tensorfusion-compatibility.md`):

- `capacityConfig.maxResources` (`tflops`, `vram`): the most the pool's workloads may reserve together
  (requests, summed over every GPU of the pool). The scheduler keeps a workload pending, its reason
  naming the field, rather than let the pool grow above it (`over_maximum`).
- `capacityConfig.oversubscription`: TensorFusion's virtual capacity of a node, `virtualTFlops =
  TFLOPS x tflopsOversellRatio / 100` and `virtualVRAM = VRAM + host disk x vramExpandToHostDisk% +
  host memory x vramExpandToHostMem%` (`virtual_capacity`). Requests never exceed the physical GPUs
  (as in TensorFusion); in a pool that sets `oversubscription` the limits of a node's workloads may add
  up to its virtual capacity and no further. A field left out takes TensorFusion's default (500, 70,
  50); a pool without `oversubscription` has no virtual capacity and its limits are not checked.
- `nodeManagerConfig.nodeSelector` (a core/v1 NodeSelector: terms ORed, each term's `matchExpressions`
  on labels and `matchFields` on `metadata.name` ANDed, an empty term or term list matching nothing):
  which nodes belong to the pool. A node registered in the pool whose labels do not match is not in it.

`pool_capacity` reads the three from a spec (merged file and object spec, as `GpuPoolSpec` dumps it)
and says what is wrong with a value; `capacity_problems` is the check `tfcommon.pool_source` runs
before a cluster pool's spec takes effect, so an invalid value keeps the pool's last good spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tfcommon.config import TfConfig
from tfcommon.placement.model import NODE_SELECTOR_OPERATORS, Node, NodeSelectorRequirement
from tfcommon.quantities import QuantityError, format_bytes, format_milli, parse_bytes, parse_milli

MAX_RESOURCES = "spec.capacityConfig.maxResources"
OVERSUBSCRIPTION = "spec.capacityConfig.oversubscription"
NODE_SELECTOR = "spec.nodeManagerConfig.nodeSelector"
NODE_NAME_FIELD = "metadata.name"
DEFAULT_TFLOPS_OVERSELL_RATIO = 500
DEFAULT_VRAM_EXPAND_TO_HOST_DISK = 70
DEFAULT_VRAM_EXPAND_TO_HOST_MEM = 50
_RATIO_RANGE = (100, 100_000)


@dataclass(frozen=True)
class Oversubscription:
    """`capacityConfig.oversubscription`, percentages as TensorFusion gives them."""

    tflops_oversell_ratio: int = DEFAULT_TFLOPS_OVERSELL_RATIO
    vram_expand_to_host_disk: int = DEFAULT_VRAM_EXPAND_TO_HOST_DISK
    vram_expand_to_host_mem: int = DEFAULT_VRAM_EXPAND_TO_HOST_MEM


@dataclass(frozen=True)
class HostFacts:
    """What a node's pool bounds read of its host: labels (nodeSelector), memory and disk bytes (the
    virtual VRAM). In Kubernetes mode from the Node object (`status.allocatable` memory and
    ephemeral-storage), in local mode from the ledger (labels and memory as registered, no disk)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    memory_bytes: int = 0
    disk_bytes: int = 0


@dataclass(frozen=True)
class VirtualCapacity:
    """A node's virtual capacity: the most its workloads' limits may add up to."""

    tflops_milli: int
    vram_bytes: int


def virtual_capacity(
    oversubscription: Oversubscription,
    *,
    tflops_milli: int,
    vram_bytes: int,
    host_memory_bytes: int,
    host_disk_bytes: int,
) -> VirtualCapacity:
    """TensorFusion's formula (`calculateVirtualCapacity`), in integers: TFLOPS x ratio / 100, VRAM plus
    the host disk's and memory's percentages (each rounded down)."""
    return VirtualCapacity(
        tflops_milli * oversubscription.tflops_oversell_ratio // 100,
        vram_bytes
        + host_disk_bytes * oversubscription.vram_expand_to_host_disk // 100
        + host_memory_bytes * oversubscription.vram_expand_to_host_mem // 100,
    )


def with_virtual_capacity(node: Node, oversubscription: Oversubscription | None, host: HostFacts) -> Node:
    """`node` (a placement node) with the virtual capacity its pool's `oversubscription` gives it, over
    its GPUs and `host` (the node's own memory when the host's is unknown); none without one."""
    if oversubscription is None:
        if node.virtual_tflops_milli is None and node.virtual_vram_bytes is None:
            return node
        return replace(node, virtual_tflops_milli=None, virtual_vram_bytes=None)
    virtual = virtual_capacity(
        oversubscription,
        tflops_milli=sum(gpu.tflops_milli for gpu in node.gpus),
        vram_bytes=sum(gpu.vram_bytes for gpu in node.gpus),
        host_memory_bytes=host.memory_bytes or node.memory_bytes,
        host_disk_bytes=host.disk_bytes,
    )
    return replace(node, virtual_tflops_milli=virtual.tflops_milli, virtual_vram_bytes=virtual.vram_bytes)


@dataclass(frozen=True)
class SelectorTerm:
    """One NodeSelectorTerm: every expression (on labels) and every field (on the node name) must match."""

    expressions: tuple[NodeSelectorRequirement, ...] = ()
    fields: tuple[NodeSelectorRequirement, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches({NODE_NAME_FIELD: name}) for r in self.fields
        )


@dataclass(frozen=True)
class PoolSelector:
    """`nodeManagerConfig.nodeSelector`: a node is in the pool when any term matches it."""

    terms: tuple[SelectorTerm, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(term.matches(name, labels) for term in self.terms)


@dataclass(frozen=True)
class PoolCapacity:
    """What a pool's spec says about its capacity and members (None: not set)."""

    max_tflops_milli: int | None = None
    max_vram_bytes: int | None = None
    oversubscription: Oversubscription | None = None
    selector: PoolSelector | None = None

    @property
    def capped(self) -> bool:
        return self.max_tflops_milli is not None or self.max_vram_bytes is not None

    def admits_node(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a node registered in this pool belongs to it (always, without a nodeSelector)."""
        return self.selector is None or self.selector.matches(name, labels)


NO_BOUNDS = PoolCapacity()


def membership_reason(pool: str, capacity: PoolCapacity, name: str, labels: Mapping[str, str]) -> str | None:
    """Why node `name` (registered in `pool`) is not in it, or None when it is."""
    if capacity.admits_node(name, labels):
        return None
    return f"not in GPUPool {pool} (node labels miss its {NODE_SELECTOR})"


def over_maximum(
    pool: str, capacity: PoolCapacity, used: tuple[int, int], demand: tuple[int, int]
) -> str | None:
    """Why reserving `demand` (milli-TFLOPS, VRAM bytes) on top of the pool's `used` would take it above
    its maxResources, or None when it fits (or no maximum is set)."""
    for index, (name, limit, show) in enumerate(
        (
            ("tflops", capacity.max_tflops_milli, format_milli),
            ("vram", capacity.max_vram_bytes, format_bytes),
        )
    ):
        if limit is not None and demand[index] and used[index] + demand[index] > limit:
            return (
                f"GPUPool {pool}: {MAX_RESOURCES}.{name} would be {show(used[index] + demand[index])} "
                f"of {show(limit)} (in use {show(used[index])}); waiting for the pool's usage to fall, "
                "or raise the maximum"
            )
    return None


def pool_capacity(pool: str, spec: Mapping[str, Any]) -> tuple[PoolCapacity, tuple[str, ...]]:
    """The pool's capacity settings, and a problem (naming the field and the fix) for each value that
    cannot be read; an unreadable value counts as unset."""
    problems: list[str] = []
    capacity_config = _section(spec, "capacityConfig", problems, pool)
    maximum = _section(capacity_config, "maxResources", problems, pool, "capacityConfig.")
    max_tflops = _quantity(maximum, "tflops", parse_milli, f"{MAX_RESOURCES}.tflops", problems, pool)
    max_vram = _quantity(maximum, "vram", parse_bytes, f"{MAX_RESOURCES}.vram", problems, pool)
    minimum = _section(capacity_config, "minResources", [], pool)
    for name, parse, limit in (("tflops", parse_milli, max_tflops), ("vram", parse_bytes, max_vram)):
        low = _quantity(minimum, name, parse, f"spec.capacityConfig.minResources.{name}", [], pool)
        if limit is not None and low is not None and low > limit:
            problems.append(
                f"pool {pool}: spec.capacityConfig.minResources.{name} is above {MAX_RESOURCES}.{name}; "
                "lower the minimum or raise the maximum"
            )
    oversubscription = None
    if capacity_config.get("oversubscription") is not None:
        raw = _section(capacity_config, "oversubscription", problems, pool, "capacityConfig.")
        oversubscription = Oversubscription(
            _percent(raw, "tflopsOversellRatio", DEFAULT_TFLOPS_OVERSELL_RATIO, _RATIO_RANGE, problems, pool),
            _percent(raw, "vramExpandToHostDisk", DEFAULT_VRAM_EXPAND_TO_HOST_DISK, (0, 100), problems, pool),
            _percent(raw, "vramExpandToHostMem", DEFAULT_VRAM_EXPAND_TO_HOST_MEM, (0, 100), problems, pool),
        )
    manager = _section(spec, "nodeManagerConfig", problems, pool)
    selector = None
    if manager.get("nodeSelector") is not None:
        selector = _selector(manager.get("nodeSelector"), problems, pool)
    return PoolCapacity(max_tflops, max_vram, oversubscription, selector), tuple(problems)


def capacity_problems(pool: str, spec: Mapping[str, Any]) -> list[str]:
    """A `tfcommon.pool_source.PoolCheck`: what is wrong with the spec's capacity settings."""
    return list(pool_capacity(pool, spec)[1])


def capacity_of(config: TfConfig, pool: str) -> PoolCapacity:
    """The capacity settings of `pool` in `config` (`NO_BOUNDS` for an unknown pool)."""
    entry = config.pool(pool)
    if entry is None:
        return NO_BOUNDS
    return pool_capacity(pool, entry.spec_template.model_dump(by_alias=True, exclude_unset=True))[0]


def capacities_of(config: TfConfig) -> dict[str, PoolCapacity]:
    """Every pool's capacity settings that bound anything (pools with none are left out)."""
    found = {entry.name: capacity_of(config, entry.name) for entry in config.gpu_pools}
    return {name: capacity for name, capacity in found.items() if capacity != NO_BOUNDS}


def _section(
    spec: Mapping[str, Any], key: str, problems: list[str], pool: str, prefix: str = ""
) -> Mapping[str, Any]:
    value = spec.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"pool {pool}: spec.{prefix}{key} must be a mapping")
        return {}
    return value


def _quantity(
    section: Mapping[str, Any], key: str, parse: Any, path: str, problems: list[str], pool: str
) -> int | None:
    raw = section.get(key)
    if raw is None:
        return None
    try:
        value: int = parse(raw, what=path)
    except QuantityError as error:
        problems.append(f"pool {pool}: {error}")
        return None
    if value < 0:
        problems.append(f"pool {pool}: {path} is {raw!r}; use a quantity of at least 0")
        return None
    return value


def _percent(
    section: Mapping[str, Any],
    key: str,
    default: int,
    bounds: tuple[int, int],
    problems: list[str],
    pool: str,
) -> int:
    raw = section.get(key)
    if raw is None:
        return default
    low, high = bounds
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        problems.append(
            f"pool {pool}: {OVERSUBSCRIPTION}.{key} is {raw!r}; use a whole percent from {low} to {high} "
            f"(TensorFusion's default is {default})"
        )
        return default
    return raw


def _requirements(
    raw: object, path: str, problems: list[str], pool: str, *, fields: bool
) -> tuple[NodeSelectorRequirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        problems.append(f"pool {pool}: {path} must be a list")
        return ()
    found = []
    for index, item in enumerate(raw):
        where = f"{path}[{index}]"
        if not isinstance(item, Mapping):
            problems.append(f"pool {pool}: {where} must be a mapping with key, operator and values")
            continue
        key, operator = str(item.get("key", "")), str(item.get("operator", ""))
        values = tuple(str(v) for v in item.get("values") or ())
        allowed = ("In", "NotIn") if fields else tuple(sorted(NODE_SELECTOR_OPERATORS))
        problem = None
        if fields and key != NODE_NAME_FIELD:
            problem = f"{where}.key is {key!r}; matchFields supports only {NODE_NAME_FIELD}"
        elif operator not in allowed:
            problem = f"{where}.operator is {operator!r}; use one of {', '.join(allowed)}"
        elif operator in ("In", "NotIn") and not values:
            problem = f"{where}.values is empty; operator {operator} needs at least one value"
        elif operator in ("Exists", "DoesNotExist") and values:
            problem = f"{where}.values must be empty for operator {operator}"
        elif operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
            problem = f"{where}.values must be one integer for operator {operator}"
        if problem is not None:
            problems.append(f"pool {pool}: {problem}")
            continue
        found.append(NodeSelectorRequirement(key, operator, values))
    return tuple(found)


def _selector(raw: object, problems: list[str], pool: str) -> PoolSelector | None:
    if not isinstance(raw, Mapping):
        problems.append(f"pool {pool}: {NODE_SELECTOR} must be a mapping with nodeSelectorTerms")
        return None
    terms_raw = raw.get("nodeSelectorTerms")
    if not isinstance(terms_raw, Sequence) or isinstance(terms_raw, str):
        problems.append(
            f"pool {pool}: {NODE_SELECTOR}.nodeSelectorTerms must be a list of terms "
            "(each with matchExpressions or matchFields)"
        )
        return None
    before = len(problems)
    terms = []
    for index, term in enumerate(terms_raw):
        path = f"{NODE_SELECTOR}.nodeSelectorTerms[{index}]"
        if not isinstance(term, Mapping):
            problems.append(f"pool {pool}: {path} must be a mapping")
            continue
        terms.append(
            SelectorTerm(
                _requirements(
                    term.get("matchExpressions"), f"{path}.matchExpressions", problems, pool, fields=False
                ),
                _requirements(term.get("matchFields"), f"{path}.matchFields", problems, pool, fields=True),
            )
        )
    return PoolSelector(tuple(terms)) if len(problems) == before else None
