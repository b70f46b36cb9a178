"""WorkloadProfile: named defaults a pod picks with annotation `tensor-fusion.ai/workload-profile`. Pure.

A `WorkloadProfile` object (tensor-fusion.ai/v1, namespaced) stands for the pod annotations it would
write: `spec.resources` for `tflops-request`/`-limit`, `compute-percent-request`/`-limit` and
`vram-request`/`-limit` (a quantity of 0 says nothing, as TensorFusion reads it; TFLOPS win over a
compute percent on the same profile), `qos`, `isolation`, `gpuCount` (`gpu-count`), `gpuIndices`
(`gpu-indices`), `gpuModel` (`gpu-model`) and `vendor`. `parse_profile` turns a spec into those
annotations (`ProfileError` names the field and the fix); `with_profile` fills them into a pod's
annotations wherever the pod's own leave a key unset: the pod's own win. Compute is one choice: a pod
naming compute in TFLOPS takes none of the profile's percent, and the reverse; a pod naming `gpu-count`
or `gpu-indices` takes neither from the profile. Like TensorFusion, `poolName` and `isLocalGPU` are
not read from a profile (the pod's annotation or the pool's default decides), nor is anything else of
the spec (replicas, autoscaling, gang scheduling, node affinity, worker template).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tfcommon.pod_spec import (
    GPU_COUNT,
    GPU_INDICES,
    GPU_MODEL,
    ISOLATION,
    ISOLATION_MODES,
    MAX_GPU_COUNT,
    PERCENT_LIMIT,
    PERCENT_REQUEST,
    QOS,
    QOS_LEVELS,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VENDOR,
    VRAM_LIMIT,
    VRAM_REQUEST,
    whole_percent,
)
from tfcommon.pod_spec import WORKLOAD_PROFILE as PROFILE
from tfcommon.quantities import (
    QuantityError,
    format_bytes,
    format_milli,
    parse_bytes,
    parse_milli,
)

TFLOPS_KEYS = (TFLOPS_REQUEST, TFLOPS_LIMIT)
PERCENT_KEYS = (PERCENT_REQUEST, PERCENT_LIMIT)
COUNT_KEYS = (GPU_COUNT, GPU_INDICES)


class ProfileError(ValueError):
    """A WorkloadProfile that cannot be used, or a pod naming one that does not exist; the message says
    which field or annotation and the fix."""


@dataclass(frozen=True)
class WorkloadProfile:
    """One profile as the annotations it fills; `problem` set: it is invalid (no good version seen)."""

    namespace: str
    name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None

    @property
    def label(self) -> str:
        """How messages name it: `WorkloadProfile <namespace>/<name>`."""
        return f"WorkloadProfile {self.namespace}/{self.name}"


def profile_key(namespace: str, name: str) -> str:
    """The key of a profile in the webhook's mapping: `namespace/name`."""
    return f"{namespace}/{name}"


def _quantity(
    section: Mapping[str, Any], key: str, path: str, parse: Callable[..., int], text: Callable[[int], str]
) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        parsed = parse(
            value if isinstance(value, int) and not isinstance(value, bool) else str(value),
            what=f"{path}.{key}",
        )
    except QuantityError as error:
        raise ProfileError(str(error)) from None
    if parsed < 0:
        raise ProfileError(f"{path}.{key}: {value!r} is negative; use 0 or more")
    return text(parsed) if parsed else None


def _percent(section: Mapping[str, Any], path: str) -> str | None:
    value = section.get("compute")
    if value is None:
        return None
    number = whole_percent(value if isinstance(value, int) and not isinstance(value, bool) else str(value))
    if number is None:
        raise ProfileError(
            f"{path}.compute: {value!r}; use a whole percent of one GPU from 0 to 100, e.g. '50'"
        )
    return str(number) if number else None


def _section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key) or {}
    if not isinstance(value, Mapping):
        raise ProfileError(f"{path}.{key}: must be a mapping, e.g. {key}: {{tflops: '20', vram: 8Gi}}")
    return value


def _choice(spec: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value = spec.get(key)
    if value in (None, ""):
        return None
    if value not in allowed:
        raise ProfileError(f"spec.{key}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _text(spec: Mapping[str, Any], key: str) -> str | None:
    value = spec.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ProfileError(f"spec.{key}: {value!r} must be a string")
    return value


def _gpu_count(spec: Mapping[str, Any]) -> str | None:
    value = spec.get("gpuCount")
    if value in (None, 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPU_COUNT:
        raise ProfileError(f"spec.gpuCount: {value!r}; use a whole number of GPUs from 1 to {MAX_GPU_COUNT}")
    return str(value)


def _gpu_indices(spec: Mapping[str, Any]) -> str | None:
    value = spec.get("gpuIndices")
    if not value:
        return None
    if (
        not isinstance(value, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
        or len(set(value)) != len(value)
        or len(value) > MAX_GPU_COUNT
    ):
        raise ProfileError(f"spec.gpuIndices: {value!r}; use distinct device indices, e.g. [0, 1]")
    return ",".join(str(i) for i in value)


def parse_profile(namespace: str, name: str, spec: Mapping[str, Any]) -> WorkloadProfile:
    """A WorkloadProfile's `spec` as the annotations it fills; raises `ProfileError` naming the field."""
    resources = _section(spec, "resources", "spec")
    requests = _section(resources, "requests", "spec.resources")
    limits = _section(resources, "limits", "spec.resources")
    filled: dict[str, str | None] = {
        TFLOPS_REQUEST: _quantity(requests, "tflops", "spec.resources.requests", parse_milli, format_milli),
        TFLOPS_LIMIT: _quantity(limits, "tflops", "spec.resources.limits", parse_milli, format_milli),
        VRAM_REQUEST: _quantity(requests, "vram", "spec.resources.requests", parse_bytes, format_bytes),
        VRAM_LIMIT: _quantity(limits, "vram", "spec.resources.limits", parse_bytes, format_bytes),
        PERCENT_KEYS[0]: _percent(requests, "spec.resources.requests"),
        PERCENT_KEYS[1]: _percent(limits, "spec.resources.limits"),
        QOS: _choice(spec, "qos", QOS_LEVELS),
        ISOLATION: _choice(spec, "isolation", ISOLATION_MODES),
        GPU_COUNT: _gpu_count(spec),
        GPU_INDICES: _gpu_indices(spec),
        GPU_MODEL: _text(spec, "gpuModel"),
        VENDOR: _text(spec, "vendor"),
    }
    if any(filled[key] for key in TFLOPS_KEYS):
        for key in PERCENT_KEYS:
            filled[key] = None  # TFLOPS win over a compute percent, as in TensorFusion
    annotations = {key: value for key, value in filled.items() if value is not None}
    return WorkloadProfile(namespace=namespace, name=name, annotations=annotations)


def with_profile(
    annotations: Mapping[str, str], profiles: Mapping[str, WorkloadProfile], namespace: str
) -> dict[str, str]:
    """The pod's annotations with its profile's filled into every key the pod leaves unset (a pod naming
    none comes back as a copy); raises `ProfileError` for a profile that is missing or invalid."""
    name = annotations.get(PROFILE)
    if name is None:
        return dict(annotations)
    profile = profiles.get(profile_key(namespace, name))
    if profile is None:
        known = sorted(p.name for p in profiles.values() if p.namespace == namespace)
        raise ProfileError(
            f"annotation {PROFILE}: no WorkloadProfile {name!r} in namespace {namespace!r} "
            f"(there: {', '.join(known) or 'none'}); create it in that namespace or name one of those"
        )
    if profile.problem is not None:
        raise ProfileError(f"annotation {PROFILE}: {profile.label} is invalid: {profile.problem}")
    skipped: set[str] = set()
    if any(key in annotations for key in TFLOPS_KEYS):
        skipped.update(PERCENT_KEYS)
    if any(key in annotations for key in PERCENT_KEYS):
        skipped.update(TFLOPS_KEYS)
    if any(key in annotations for key in COUNT_KEYS):
        skipped.update(COUNT_KEYS)
    merged = dict(annotations)
    for key, value in profile.annotations.items():
        if key not in skipped:
            merged.setdefault(key, value)
    return merged


def profiles_in_force(
    objects: Mapping[str, tuple[str, str, Mapping[str, Any]]], last_good: Mapping[str, WorkloadProfile]
) -> tuple[dict[str, WorkloadProfile], dict[str, str]]:
    """Every profile of a watch (by `namespace/name`: namespace, name, spec). An invalid one keeps its
    last good version from `last_good`, or, with none, is kept with its `problem` (a pod naming it is
    denied with it); the second result says what is wrong, by key."""
    profiles: dict[str, WorkloadProfile] = {}
    problems: dict[str, str] = {}
    for key, (namespace, name, spec) in objects.items():
        try:
            profiles[key] = parse_profile(namespace, name, spec)
        except ProfileError as error:
            problem = str(error)
            problems[key] = f"WorkloadProfile {namespace}/{name}: {problem}; keeping the last good version"
            good = last_good.get(key)
            profiles[key] = (
                good
                if good is not None and good.problem is None
                else WorkloadProfile(namespace, name, problem=problem)
            )
    return profiles, problems
