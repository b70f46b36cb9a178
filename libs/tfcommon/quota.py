"""Namespace GPU quotas with TensorFusion's `GPUResourceQuota` semantics: the quota, its manifest, and
what applies to one workload (defaults, `spec.single` maxima). Pure; exact integers (milli-TFLOPS, bytes)
and fractions (compute percent).

Shared by the scheduler (which also checks `spec.total`: `tfscheduler.core.quota`) and the admission
webhook (which fills a pod's zero requests from `spec.single.defaultRequests/defaultLimits` and denies a
pod over a `spec.single` maximum).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from tfcommon.cluster.model import CustomObject
from tfcommon.events import GpuRequest
from tfcommon.quantities import QuantityError, format_bytes, format_milli, parse_bytes, parse_milli

DEFAULT_MAX_WORKERS = 32_768


DEFAULT_ALERT_THRESHOLD_PERCENT = 95


class QuotaError(ValueError):
    """A GPUResourceQuota manifest that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class NamespaceQuota:
    """One namespace's `GPUResourceQuota`. `None` means no bound. Per-workload maxima are per GPU."""

    namespace: str
    total_requests_tflops_milli: int | None = None
    total_requests_vram_bytes: int | None = None
    total_limits_tflops_milli: int | None = None
    total_limits_vram_bytes: int | None = None
    max_workers: int = DEFAULT_MAX_WORKERS
    max_request_tflops_milli: int | None = None
    max_request_vram_bytes: int | None = None
    max_limit_tflops_milli: int | None = None
    max_limit_vram_bytes: int | None = None
    total_requests_compute: Fraction | None = None
    total_limits_compute: Fraction | None = None
    max_request_compute: Fraction | None = None
    """Per GPU, in percent; checked against a request made in percent (`compute-percent-request`)."""
    max_limit_compute: Fraction | None = None
    """Per GPU, in percent; checked against the limit of a request made in percent."""
    default_request_compute: int | None = None
    """A whole percent: the compute a workload naming none asks for when no TFLOPS default is set."""
    default_limit_compute: int | None = None
    """A whole percent: the limit of a request in percent that names none."""
    max_gpu_count: int | None = None
    default_request_tflops_milli: int | None = None
    default_request_vram_bytes: int | None = None
    default_limit_tflops_milli: int | None = None
    default_limit_vram_bytes: int | None = None
    alert_threshold_percent: int = DEFAULT_ALERT_THRESHOLD_PERCENT
    name: str = ""
    """The GPUResourceQuota object's name ("" for a quota built in code)."""

    @property
    def label(self) -> str:
        """How refusals and events name the quota: `GPUResourceQuota <namespace>/<name>`."""
        return f"GPUResourceQuota {self.namespace}/{self.name or self.namespace}"


@dataclass(frozen=True)
class QuotaRefusal:
    """Why a workload does not fit its namespace's quota; `retryable` False: it never will as asked."""

    reason: str
    retryable: bool


def effective_percent_limit(request: GpuRequest) -> int | None:
    """The compute limit of a request made in percent (its limit, never below its request); None for a
    request in TFLOPS."""
    if request.compute_percent_request is None:
        return None
    return max(request.compute_percent_limit or 0, request.compute_percent_request)


def with_defaults(quota: NamespaceQuota | None, request: GpuRequest) -> GpuRequest:
    """`request` with the quota's defaults filled into its zero fields (what the webhook does). Compute
    that is not named is asked in TFLOPS from `defaultRequests.tflops`, else in percent from
    `defaultRequests.compute`; then a request in TFLOPS takes `defaultLimits.tflops` into a zero limit
    and a request in percent with no limit takes `defaultLimits.compute` (never below the request): the
    two forms are never mixed in one request."""
    if quota is None:
        return request
    changes: dict[str, int] = {}
    percent = request.compute_percent_request is not None
    if not percent and request.tflops_request_milli == 0:
        if quota.default_request_tflops_milli:
            changes["tflops_request_milli"] = quota.default_request_tflops_milli
        elif quota.default_request_compute is not None and request.tflops_limit_milli == 0:
            changes["compute_percent_request"] = quota.default_request_compute
            percent = True
    if request.vram_request_bytes == 0 and quota.default_request_vram_bytes:
        changes["vram_request_bytes"] = quota.default_request_vram_bytes
    if percent:
        asked = changes.get("compute_percent_request", request.compute_percent_request) or 0
        if request.compute_percent_limit is None and quota.default_limit_compute is not None:
            changes["compute_percent_limit"] = max(quota.default_limit_compute, asked)
    elif request.tflops_limit_milli == 0 and quota.default_limit_tflops_milli:
        changes["tflops_limit_milli"] = quota.default_limit_tflops_milli
    if request.vram_limit_bytes == 0 and quota.default_limit_vram_bytes:
        changes["vram_limit_bytes"] = quota.default_limit_vram_bytes
    return request.model_copy(update=changes) if changes else request


def check_single(quota: NamespaceQuota | None, request: GpuRequest) -> QuotaRefusal | None:
    """Per-workload maxima (`spec.single`); a refusal here is final (`retryable=False`)."""
    if quota is None:
        return None
    checks = (
        ("maxGPUCount", request.gpu_count, quota.max_gpu_count, str),
        ("maxRequests.tflops", request.tflops_request_milli, quota.max_request_tflops_milli, format_milli),
        ("maxRequests.vram", request.vram_request_bytes, quota.max_request_vram_bytes, format_bytes),
        ("maxLimits.tflops", request.tflops_limit_milli, quota.max_limit_tflops_milli, format_milli),
        ("maxLimits.vram", request.vram_limit_bytes, quota.max_limit_vram_bytes, format_bytes),
    )
    for name, asked, bound, show in checks:
        if bound is not None and asked > bound:
            return QuotaRefusal(
                f"{quota.label}: single.{name} is {show(bound)} per workload, asked {show(asked)}",
                retryable=False,
            )
    for name, asked_percent, percent_bound in (
        ("maxRequests.compute", request.compute_percent_request, quota.max_request_compute),
        ("maxLimits.compute", effective_percent_limit(request), quota.max_limit_compute),
    ):
        if percent_bound is not None and asked_percent is not None and asked_percent > percent_bound:
            return QuotaRefusal(
                f"{quota.label}: single.{name} is {format_percent(percent_bound)}% per workload, "
                f"asked {asked_percent}%",
                retryable=False,
            )
    return None


def format_percent(value: Fraction | int) -> str:
    """A percent as a Kubernetes quantity: exact when whole, else to two decimals (`12.5`, `33.33`)."""
    fraction = Fraction(value)
    if fraction.denominator == 1:
        return str(fraction.numerator)
    return f"{float(fraction):.2f}".rstrip("0").rstrip(".")


def _quantity(section: Mapping[str, Any], key: str, path: str, parse: Any) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        parsed: int = parse(str(value))
    except QuantityError as error:
        raise QuotaError(f"{path}.{key}: {error}") from error
    return parsed


def _compute(section: Mapping[str, Any], path: str) -> Fraction | None:
    value = section.get("compute")
    if value is None:
        return None
    try:
        milli = parse_milli(str(value))
    except QuantityError as error:
        raise QuotaError(f"{path}.compute: {error}; use a percent of one GPU, e.g. compute: '50'") from error
    return Fraction(milli, 1000)


def _whole_percent(section: Mapping[str, Any], path: str) -> int | None:
    value = _compute(section, path)
    if value is None:
        return None
    if value.denominator != 1 or not 0 <= value <= 100:
        raise QuotaError(
            f"{path}.compute: {section.get('compute')!r}; a default is a whole percent of one GPU "
            "from 0 to 100 (as the compute-percent annotations take), e.g. compute: '25'"
        )
    return int(value)


def _section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key) or {}
    if not isinstance(value, Mapping):
        raise QuotaError(f"{path}.{key}: must be a mapping, e.g. {key}: {{tflops: '100', vram: 80Gi}}")
    return value


def _whole(value: Any, path: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        at_least = "" if minimum is None else f" >= {minimum}"
        raise QuotaError(f"{path}: {value!r}; use a whole number{at_least}")
    return value


def parse_quota(manifest: Mapping[str, Any]) -> NamespaceQuota:
    """A `GPUResourceQuota` manifest (tensor-fusion.ai/v1) as a `NamespaceQuota`; raises `QuotaError`."""
    if manifest.get("kind") != "GPUResourceQuota":
        raise QuotaError(f"kind: {manifest.get('kind')!r}; a quota manifest has kind: GPUResourceQuota")
    metadata = manifest.get("metadata") or {}
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if not namespace or not isinstance(namespace, str):
        raise QuotaError("metadata.namespace: missing; a GPUResourceQuota applies to its namespace")
    name = metadata.get("name") if isinstance(metadata.get("name"), str) else ""
    spec = _section(manifest, "spec", "")
    total = _section(spec, "total", "spec")
    single = _section(spec, "single", "spec")
    requests = _section(total, "requests", "spec.total")
    limits = _section(total, "limits", "spec.total")
    max_requests = _section(single, "maxRequests", "spec.single")
    max_limits = _section(single, "maxLimits", "spec.single")
    default_requests = _section(single, "defaultRequests", "spec.single")
    default_limits = _section(single, "defaultLimits", "spec.single")
    quota = NamespaceQuota(
        namespace=namespace,
        name=name or "",
        total_requests_compute=_compute(requests, "spec.total.requests"),
        total_limits_compute=_compute(limits, "spec.total.limits"),
        max_request_compute=_compute(max_requests, "spec.single.maxRequests"),
        max_limit_compute=_compute(max_limits, "spec.single.maxLimits"),
        default_request_compute=_whole_percent(default_requests, "spec.single.defaultRequests"),
        default_limit_compute=_whole_percent(default_limits, "spec.single.defaultLimits"),
        total_requests_tflops_milli=_quantity(requests, "tflops", "spec.total.requests", parse_milli),
        total_requests_vram_bytes=_quantity(requests, "vram", "spec.total.requests", parse_bytes),
        total_limits_tflops_milli=_quantity(limits, "tflops", "spec.total.limits", parse_milli),
        total_limits_vram_bytes=_quantity(limits, "vram", "spec.total.limits", parse_bytes),
        max_request_tflops_milli=_quantity(max_requests, "tflops", "spec.single.maxRequests", parse_milli),
        max_request_vram_bytes=_quantity(max_requests, "vram", "spec.single.maxRequests", parse_bytes),
        max_limit_tflops_milli=_quantity(max_limits, "tflops", "spec.single.maxLimits", parse_milli),
        max_limit_vram_bytes=_quantity(max_limits, "vram", "spec.single.maxLimits", parse_bytes),
        default_request_tflops_milli=_quantity(
            default_requests, "tflops", "spec.single.defaultRequests", parse_milli
        ),
        default_request_vram_bytes=_quantity(
            default_requests, "vram", "spec.single.defaultRequests", parse_bytes
        ),
        default_limit_tflops_milli=_quantity(
            default_limits, "tflops", "spec.single.defaultLimits", parse_milli
        ),
        default_limit_vram_bytes=_quantity(default_limits, "vram", "spec.single.defaultLimits", parse_bytes),
    )
    if "maxWorkers" in total:
        quota = replace(quota, max_workers=_whole(total["maxWorkers"], "spec.total.maxWorkers"))
    if "alertThresholdPercent" in total:
        threshold = _whole(total["alertThresholdPercent"], "spec.total.alertThresholdPercent", 0)
        quota = replace(quota, alert_threshold_percent=threshold)
    if "maxGPUCount" in single:
        quota = replace(quota, max_gpu_count=_whole(single["maxGPUCount"], "spec.single.maxGPUCount"))
    return quota


def _written_order(obj: CustomObject) -> tuple[int, str]:
    version = obj.resource_version
    return (int(version) if version.isdigit() else -1, obj.name)


def quota_objects(objects: Mapping[str, CustomObject]) -> dict[str, CustomObject]:
    """The GPUResourceQuota object in force in each namespace, as in TensorFusion, whose quota store
    keeps one quota per namespace and takes each object its informer delivers (created or updated) in
    its namespace's place: the last one written wins. Here that is the highest `resourceVersion` (the
    API server's write order, etcd's revision); where versions are not numbers, the last by name (the
    order TensorFusion's start-up list applies them in)."""
    chosen: dict[str, CustomObject] = {}
    for obj in objects.values():
        if not obj.namespace:
            continue
        known = chosen.get(obj.namespace)
        if known is None or _written_order(obj) > _written_order(known):
            chosen[obj.namespace] = obj
    return chosen


def quotas_in_force(
    objects: Mapping[str, CustomObject], last_good: Mapping[str, NamespaceQuota]
) -> tuple[dict[str, NamespaceQuota], dict[str, str]]:
    """The quota of each namespace from a watch's GPUResourceQuota objects (by `namespace/name`): the last
    one written when a namespace has several (`quota_objects`), as in TensorFusion. An invalid object
    keeps its namespace's quota from `last_good` (or none); the second result says why, by namespace."""
    chosen = quota_objects(objects)
    quotas: dict[str, NamespaceQuota] = {}
    problems: dict[str, str] = {}
    for namespace, obj in chosen.items():
        manifest = {
            "kind": "GPUResourceQuota",
            "metadata": {"name": obj.name, "namespace": namespace},
            "spec": dict(obj.spec),
        }
        try:
            quotas[namespace] = parse_quota(manifest)
        except QuotaError as error:
            problems[namespace] = (
                f"GPUResourceQuota {namespace}/{obj.name}: {error}; keeping the last good quota"
            )
            if namespace in last_good:
                quotas[namespace] = last_good[namespace]
    return quotas, problems
