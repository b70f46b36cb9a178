"""The admission decision: `admit(pod, context) -> Verdict`. Pure: no I/O, no clock, no randomness.

Reads the `tensor-fusion.ai/*` labels and annotations (TensorFusion-compatible; any key outside
`tfwebhook.core.vocabulary` is denied, with the known key it resembles), converts native
device-plugin GPUs (`nvidia.com/gpu`, ...: whole GPUs under `isolation: shared`, else 100 % of each;
docs/webhook.md "Native GPU conversion"), applies automatic migration,
validates, and returns either one RFC 6902 patch (the diff between the pod and its mutated copy) or a
denial whose message names the annotation and what a valid value looks like. Admitting an already
mutated pod yields an empty patch. `enabled-replicas` is decided by the shell (ledger), from the
`TakeoverClaim` the verdict carries.

The pod index (`tfcommon.device_slots`: annotation `tensor-fusion.ai/index`, and on each injected
container `container_request(index)`) identifies the pod to the node agent's device plugin. A pod that
already carries a valid index keeps it (reinvocation); otherwise the index comes from the context, or,
when the context has none, the verdict says which containers await it and `assign_pod_index` completes
the patch later (so a verdict can be cached for identical pods and each one still gets its own index).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any, cast

import orjson
from tfcommon.config import TfConfig
from tfcommon.device_slots import (
    POD_INDEX_ANNOTATION,
    RESOURCE_PREFIX,
    container_request,
    pod_index_from_annotation,
)
from tfcommon.events import GpuRequest, IsolationMode, QosLevel, WorkloadRef
from tfcommon.gpu_models import GPU_MODELS_BY_NAME
from tfcommon.pod_spec import (
    AUTOSCALE,
    AUTOSCALE_TARGET,
    COMPONENT,
    CONTAINER_GPU_COUNT,
    DEDICATED_GPU,
    ENABLED,
    ENABLED_REPLICAS,
    EVICTION_PROTECTION,
    GPU_COUNT,
    GPU_INDICES,
    GPU_MODEL,
    GPUPOOL,
    INJECT_CONTAINER,
    IS_LOCAL_GPU,
    ISOLATION,
    ISOLATION_MODES,
    MAX_GPU_COUNT,
    PERCENT_LIMIT,
    PERCENT_REQUEST,
    POD_COUNTER_KEY,
    PRIORITY_CLASSES,
    QOS,
    QOS_LEVELS,
    TAKEOVER_SLOT,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VENDOR,
    VRAM_LIMIT,
    VRAM_REQUEST,
    WORKLOAD,
    WORKLOAD_PROFILE,
    PodRequestError,
    parse_duration_s,
    parse_percent,
    priority_of,
)
from tfcommon.pod_spec import (
    PREFIX as PREFIX,  # the pod contract's keys are this module's too (tests enumerate them)
)
from tfcommon.quantities import (
    QuantityError,
    format_bytes,
    format_milli,
    parse_bytes,
    parse_milli,
    parse_quantity,
)
from tfcommon.quota import NamespaceQuota, check_single, effective_percent_limit, with_defaults
from tfcommon.recommendations import Recommendation, workload_key

from tfwebhook.core.autoscale import AUTOSCALE_SOURCE, Sizes, autoscale
from tfwebhook.core.patch import JsonPatch, escape_pointer_token, json_diff
from tfwebhook.core.profile import ProfileError, WorkloadProfile, with_profile
from tfwebhook.core.vocabulary import unknown_keys
from tfwebhook.core.workload import WorkloadIdentity, identify, pod_display_name

_PLAIN_JSON_STRING = re.compile(r"[ !#-\[\]-~]*")
"""Printable ASCII but `"` and `\\`: a string JSON writes as it is, between quotes."""
QUANTITIES_REMEMBERED = 4096
"""Distinct quantity texts (and byte counts) whose parse (and canonical text) `admit` keeps."""
SCHEDULER_NAME = "tensor-fusion-scheduler"
WORKER_COMPONENT = "worker"
AUTOSCALE_TARGETS = ("compute", "vram", "all")
VENDOR_BY_RESOURCE_DOMAIN = {"nvidia.com": "NVIDIA", "amd.com": "AMD", "intel.com": "Intel"}
DENIED_CODE = 400


class AdmissionDeniedError(ValueError):
    """Raised inside the core for a pod that must be refused; the message is shown to the user."""


@dataclass(frozen=True)
class AdmissionContext:
    """Everything besides the pod that the decision depends on, gathered by the shell.

    `namespace_labels` is None when unknown (a namespace selector then never matches);
    `takeover_slot_id` identifies this admission's `enabled-replicas` slot (the request UID) and is
    written to the pod so the slot can be released when the pod is gone; None offline.
    `pod_index` (0..127) is the device-plugin index for a pod that has none yet; None leaves it to
    `assign_pod_index` (see `Admitted.awaiting_pod_index`). `recommendations` maps `namespace/workload`
    to its stored autoscaling recommendation, applied to pods with `tensor-fusion.ai/autoscale: "true"`.
    """

    config: TfConfig
    namespace: str = "default"
    namespace_labels: Mapping[str, str] | None = None
    takeover_slot_id: str | None = None
    pod_index: int | None = None
    recommendations: Mapping[str, Recommendation] = field(default_factory=dict)
    quota: NamespaceQuota | None = None
    """The pod's namespace's GPUResourceQuota: its `single.defaultRequests/defaultLimits` fill the zero
    requests of a pod that is not `shared`, and a pod over a `single` maximum is denied."""
    profiles: Mapping[str, WorkloadProfile] = field(default_factory=dict)
    """The cluster's WorkloadProfiles by `namespace/name` (`tfwebhook.core.profile`): a pod naming one in
    annotation `tensor-fusion.ai/workload-profile` gets its keys wherever its own are unset."""


@dataclass(frozen=True)
class TakeoverClaim:
    """This pod may be taken over only if the ledger grants `slot_id` below `limit` for `workload_key`."""

    workload_key: str
    limit: int
    slot_id: str | None


@dataclass(frozen=True)
class Admitted:
    """Admit the pod with `patch` (empty: unchanged). GPU pods carry their workload and request.

    When `takeover` is set, the patch applies only if the ledger grants the slot; otherwise the pod
    must be admitted unchanged (it keeps its device-plugin GPUs). `awaiting_pod_index` lists the
    positions of the injected containers when the pod still needs its index (`assign_pod_index`);
    None when it has one or needs none.
    """

    patch: JsonPatch = field(default_factory=list)
    reason: str = ""
    workload: WorkloadRef | None = None
    request: GpuRequest | None = None
    migrated_resource: str | None = None
    takeover: TakeoverClaim | None = None
    awaiting_pod_index: tuple[int, ...] | None = None
    priority: int = 0
    """The priority Kubernetes gives the admitted pod (its PriorityClass's value; `tfctl submit` sends it)."""
    eviction_protection_s: int = 0
    """`tensor-fusion.ai/eviction-protection` in seconds (0: none), as the scheduler reads it."""

    @property
    def is_gpu_pod(self) -> bool:
        return self.request is not None

    @cached_property
    def encoded_patch(self) -> str:
        """The patch as the AdmissionReview carries it: base64 of its JSON, computed once per verdict."""
        return base64.b64encode(orjson.dumps(self.patch)).decode()


@dataclass(frozen=True)
class Denied:
    """Refuse the pod; `message` names the annotation and what a valid value looks like."""

    message: str
    code: int = DENIED_CODE


Verdict = Admitted | Denied


@dataclass(frozen=True)
class _Resources:
    tflops_request: int = 0
    tflops_limit: int = 0
    vram_request: int = 0
    vram_limit: int = 0
    percent_request: int | None = None
    percent_limit: int | None = None

    def request(self, pool: str, gpu_count: int, **details: Any) -> GpuRequest:
        """These amounts per GPU as the request the pod is admitted with (`details`: model, QoS, ...)."""
        return GpuRequest(
            pool=pool,
            gpu_count=gpu_count,
            tflops_request_milli=self.tflops_request,
            tflops_limit_milli=self.tflops_limit,
            vram_request_bytes=self.vram_request,
            vram_limit_bytes=self.vram_limit,
            compute_percent_request=self.percent_request,
            compute_percent_limit=self.percent_limit,
            **details,
        )


def _string_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise AdmissionDeniedError(f"{what} must map strings to strings, e.g. {{app: web}}")
    return value


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers, each a shallow copy placed in a copied list in `spec` (copy on write)."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise AdmissionDeniedError("spec.containers must list at least one container")
    for index, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name"), str):
            raise AdmissionDeniedError(f"spec.containers[{index}] must be a container with a name")
    copies = [dict(container) for container in containers]
    spec["containers"] = copies
    return copies


def _native_gpu_limits(
    containers: list[dict[str, Any]], resource_names: tuple[str, ...]
) -> dict[str, tuple[str, int]]:
    """Container name -> (native resource, count) for containers with a native GPU limit."""
    found: dict[str, tuple[str, int]] = {}
    for container in containers:
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for section in ("limits", "requests"):
            values = resources.get(section)
            if not isinstance(values, dict):
                continue
            for resource in resource_names:
                if resource not in values:
                    continue
                what = f"container {container['name']!r} {section}[{resource}]"
                if isinstance(values[resource], bool) or not isinstance(values[resource], str | int):
                    raise AdmissionDeniedError(
                        f"{what}: {values[resource]!r} must be a whole number such as 1"
                    )
                try:
                    count = _parse(parse_quantity, values[resource], what)
                except QuantityError as error:
                    raise AdmissionDeniedError(f"{error}; use a whole number of GPUs such as 1") from None
                if count.denominator != 1 or count < 0:
                    raise AdmissionDeniedError(
                        f"{what}: {values[resource]!r} must be a whole number such as 1"
                    )
                if count > 0 and container["name"] not in found:
                    found[container["name"]] = (resource, int(count))
    return found


def _boolean(annotations: Mapping[str, str], key: str) -> bool | None:
    value = annotations.get(key)
    if value is None:
        return None
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise AdmissionDeniedError(f'annotation {key}: {value!r} is not a boolean; use "true" or "false"')


def _choice(annotations: Mapping[str, str], key: str, allowed: tuple[str, ...]) -> str | None:
    value = annotations.get(key)
    if value is None:
        return None
    if value not in allowed:
        raise AdmissionDeniedError(f"annotation {key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _milli(annotations: Mapping[str, str], key: str) -> int | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        return cast(int, _parse(parse_milli, value, f"annotation {key}"))
    except QuantityError as error:
        raise AdmissionDeniedError(f"{error} (TFLOPS per GPU, e.g. 20)") from None


def _bytes(annotations: Mapping[str, str], key: str) -> int | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        return cast(int, _parse(parse_bytes, value, f"annotation {key}"))
    except QuantityError as error:
        raise AdmissionDeniedError(f"{error} (VRAM per GPU, e.g. 16Gi)") from None


def _percent(annotations: Mapping[str, str], key: str) -> int | None:
    value = annotations.get(key)
    return None if value is None else _percent_value(key, value)


@lru_cache(maxsize=QUANTITIES_REMEMBERED)
def _percent_value(key: str, value: str) -> int:
    """The pod contract's percent parser (`tfcommon.pod_spec.parse_percent`), remembered."""
    try:
        return parse_percent(key, value)
    except PodRequestError as error:
        raise AdmissionDeniedError(str(error)) from None


def _eviction_protection_s(annotations: Mapping[str, str]) -> int:
    try:
        return parse_duration_s(annotations.get(EVICTION_PROTECTION))
    except PodRequestError as error:
        raise AdmissionDeniedError(str(error)) from None


def _paired(request: int | None, limit: int | None, request_key: str, limit_key: str) -> tuple[int, int]:
    resolved_request = request if request is not None else limit
    resolved_limit = limit if limit is not None else request
    if resolved_request is None or resolved_limit is None:
        return 0, 0
    if resolved_limit < resolved_request:
        raise AdmissionDeniedError(
            f"annotation {limit_key} is below {request_key}; use a limit at least as large as the request"
        )
    return resolved_request, resolved_limit


def _resources(annotations: Mapping[str, str]) -> _Resources:
    tflops = _paired(
        _milli(annotations, TFLOPS_REQUEST), _milli(annotations, TFLOPS_LIMIT), TFLOPS_REQUEST, TFLOPS_LIMIT
    )
    vram = _paired(
        _bytes(annotations, VRAM_REQUEST), _bytes(annotations, VRAM_LIMIT), VRAM_REQUEST, VRAM_LIMIT
    )
    percent_request = _percent(annotations, PERCENT_REQUEST)
    percent_limit = _percent(annotations, PERCENT_LIMIT)
    if percent_request is None and percent_limit is None:
        return _Resources(*tflops, *vram)
    if TFLOPS_REQUEST in annotations or TFLOPS_LIMIT in annotations:
        raise AdmissionDeniedError(
            f"annotations {TFLOPS_REQUEST}/{TFLOPS_LIMIT} and {PERCENT_REQUEST}/{PERCENT_LIMIT} "
            "exclude each other; give TFLOPS (e.g. 20) or a compute percent (e.g. 50), not both"
        )
    percent = _paired(percent_request, percent_limit, PERCENT_REQUEST, PERCENT_LIMIT)
    return _Resources(0, 0, *vram, *percent)


WHOLE_GPU_PERCENT = 100
"""The compute percent a native GPU limit stands for outside `shared`: all of each GPU."""


def _native_whole_gpus(annotations: Mapping[str, str], resources: _Resources) -> _Resources:
    """TensorFusion's conversion of a native GPU limit outside `isolation: shared`: each GPU is asked for
    as `compute-percent-limit: 100` (the request follows the limit unless annotated). A TFLOPS annotation
    means the pod sized its compute itself: nothing is converted; a percent annotation keeps its value."""
    if TFLOPS_REQUEST in annotations or TFLOPS_LIMIT in annotations or PERCENT_LIMIT in annotations:
        return resources
    request = resources.percent_request if PERCENT_REQUEST in annotations else WHOLE_GPU_PERCENT
    return replace(resources, percent_request=request, percent_limit=WHOLE_GPU_PERCENT)


def _within_quota(
    quota: NamespaceQuota, resources: _Resources, gpu_count: int, isolation: str, pool: str
) -> _Resources:
    """`resources` with the quota's defaults in their zero fields (not for `shared` whole GPUs); denies
    a pod over a `spec.single` maximum, naming the limit."""
    request = resources.request(pool, gpu_count)
    if isolation != "shared":
        request = with_defaults(quota, request)
    refusal = check_single(quota, request)
    if refusal is not None:
        raise AdmissionDeniedError(f"{refusal.reason}; ask for at most that, or raise the quota")
    return replace(
        resources,
        tflops_request=request.tflops_request_milli,
        tflops_limit=request.tflops_limit_milli,
        vram_request=request.vram_request_bytes,
        vram_limit=request.vram_limit_bytes,
        percent_request=request.compute_percent_request,
        percent_limit=effective_percent_limit(request),
    )


def _gpu_count(
    annotations: Mapping[str, str], native: Mapping[str, tuple[str, int]], injected: list[str]
) -> int:
    example = f"a whole number of GPUs from 1 to {MAX_GPU_COUNT}, e.g. 2"
    indices = annotations.get(GPU_INDICES)
    if indices is not None:
        parts = [part.strip() for part in indices.split(",")]
        if not parts or not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
            raise AdmissionDeniedError(
                f"annotation {GPU_INDICES}: {indices!r} is not a comma-separated list of distinct "
                "device indices such as 0,1"
            )
        if len(parts) > MAX_GPU_COUNT:
            raise AdmissionDeniedError(
                f"annotation {GPU_INDICES}: more than {MAX_GPU_COUNT} GPUs; use {example}"
            )
        return len(parts)
    text = annotations.get(GPU_COUNT)
    if text is not None:
        if not text.strip().isdigit() or not 1 <= int(text) <= MAX_GPU_COUNT:
            raise AdmissionDeniedError(f"annotation {GPU_COUNT}: {text!r} is not {example}")
        return int(text)
    written = _written_container_counts(annotations, injected)
    if written is not None:
        total = sum(written.values())
        if total > MAX_GPU_COUNT:
            raise AdmissionDeniedError(
                f"annotation {CONTAINER_GPU_COUNT}: its counts add up to {total} GPUs, above "
                f"{MAX_GPU_COUNT}; lower the counts to add up to at most {MAX_GPU_COUNT}"
            )
        return total
    total = sum(count for name, (_, count) in native.items() if name in injected)
    if total > MAX_GPU_COUNT:
        raise AdmissionDeniedError(
            f"native GPU limits add up to {total} GPUs, above {MAX_GPU_COUNT}; "
            f"set annotation {GPU_COUNT} to {example}"
        )
    return total or 1


def _injected_containers(
    annotations: Mapping[str, str], containers: list[dict[str, Any]], native: Mapping[str, Any]
) -> list[str]:
    names = [container["name"] for container in containers]
    text = annotations.get(INJECT_CONTAINER)
    if text is not None:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in chosen if name not in names]
        if not chosen or unknown:
            raise AdmissionDeniedError(
                f"annotation {INJECT_CONTAINER}: {text!r} must list containers of this pod, "
                f"comma-separated, from: {', '.join(names)}"
            )
        return list(dict.fromkeys(chosen))
    if native:
        return [name for name in names if name in native]
    if len(names) == 1:
        return names
    raise AdmissionDeniedError(
        f"the pod has {len(names)} containers and no way to tell which gets the GPU: set annotation "
        f"{INJECT_CONTAINER} to a comma-separated list of container names, e.g. {names[0]}"
    )


def _written_container_counts(annotations: Mapping[str, str], injected: list[str]) -> dict[str, int] | None:
    """The pod's own `container-gpu-count` when it gives every injected container, and only those, a
    positive count (as the webhook wrote it at an earlier admission); else None."""
    existing = annotations.get(CONTAINER_GPU_COUNT)
    if existing is None:
        return None
    try:
        parsed = json.loads(existing)
    except ValueError:
        return None
    if (
        isinstance(parsed, dict)
        and set(parsed) == set(injected)
        and all(type(value) is int and value > 0 for value in parsed.values())
    ):
        return {str(name): int(value) for name, value in parsed.items()}
    return None


def _container_gpu_counts(
    annotations: Mapping[str, str], native: Mapping[str, tuple[str, int]], injected: list[str], count: int
) -> str:
    """How many of the pod's `count` GPUs each injected container sees: the pod's own split, else each
    container's native limit (a container with none sees them all). A split whose counts add up to
    fewer than `count` would reserve GPUs no container sees: then every container sees all of them."""
    written = _written_container_counts(annotations, injected)
    if written is not None and sum(written.values()) >= count:
        return annotations[CONTAINER_GPU_COUNT]
    by_container = {name: native[name][1] if name in native else count for name in injected}
    if sum(by_container.values()) < count:
        by_container = dict.fromkeys(injected, count)
    if len(by_container) == 1 and _PLAIN_JSON_STRING.fullmatch(injected[0]):
        return f'{{"{injected[0]}":{by_container[injected[0]]}}}'  # what json.dumps writes, cheaper
    return json.dumps(by_container, separators=(",", ":"), sort_keys=True)


def should_auto_migrate(
    config: TfConfig,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    pod_labels: Mapping[str, str],
) -> bool:
    """TensorFusion's scope rule: excludes first, then includes; no scope means every native-GPU pod."""
    migration = config.dynamic_config.auto_migration
    if not migration.enable:
        return False
    if migration.scope is None:
        return True
    excludes, includes = migration.scope.excludes, migration.scope.includes
    if excludes is not None and excludes.matches(namespace, namespace_labels, pod_labels):
        return False
    return includes is None or includes.matches(namespace, namespace_labels, pod_labels)


def _resolve_qos(annotations: Mapping[str, str], resources: _Resources, pool_default: str | None) -> str:
    explicit = _choice(annotations, QOS, QOS_LEVELS)
    if explicit is not None:
        return explicit
    compute = (
        (resources.percent_request, resources.percent_limit)
        if resources.percent_request is not None
        else (resources.tflops_request, resources.tflops_limit)
    )
    vram = (resources.vram_request, resources.vram_limit)
    if compute[0] == compute[1] and vram[0] == vram[1] and compute[0] and vram[0]:
        return "high"
    return pool_default or "medium"


def _set_annotation_value(
    annotations: dict[str, str],
    key: str,
    value: int,
    parse: Callable[[str], Any],
    text: Callable[[int], str],
) -> None:
    """Write `text(value)` unless the annotation already holds the same value (keeps the user's
    spelling)."""
    current = annotations.get(key)
    if current is not None:
        try:
            if _remembered(parse, current) == value:
                return
        except ValueError:
            pass
    annotations[key] = text(value)


@lru_cache(maxsize=QUANTITIES_REMEMBERED, typed=True)
def _remembered(parse: Callable[[Any], Any], text: str | int) -> Any:
    """`parse(text)`, remembered: a cluster's pods repeat a few quantities (`16Gi`, `50`), and parsing
    one exactly (with fractions) costs more than most of the rest of a decision. Failures are not kept."""
    return parse(text)


def _parse(parse: Callable[..., Any], text: str | int, what: str) -> Any:
    """`parse(text, what=what)`, remembered (`_remembered`); a failure names `what`."""
    try:
        return _remembered(parse, text)
    except QuantityError:
        return parse(text, what=what)


_canonical_bytes = lru_cache(maxsize=QUANTITIES_REMEMBERED)(format_bytes)


def _enabled_replicas(annotations: Mapping[str, str]) -> int | None:
    text = annotations.get(ENABLED_REPLICAS)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise AdmissionDeniedError(
            f'annotation {ENABLED_REPLICAS}: {text!r} is not a whole number of pods; use e.g. "1" or "4"'
        )
    return int(text)


def _unchanged(reason: str) -> Admitted:
    return Admitted(reason=reason)


def admit(pod: Mapping[str, Any], context: AdmissionContext) -> Verdict:
    """Decide one pod: an `Admitted` with one JSON patch (possibly empty) or a `Denied` with the fix."""
    try:
        verdict = _admit(pod, context)
    except AdmissionDeniedError as denial:
        return Denied(str(denial))
    if context.pod_index is not None and isinstance(verdict, Admitted):
        return assign_pod_index(verdict, context.pod_index)
    return verdict


def assign_pod_index(verdict: Admitted, pod_index: int) -> Admitted:
    """Complete a verdict that awaits its pod index: annotate the pod and request the index resource.

    The operations are appended to the patch; they apply after it, when the annotations and each
    injected container's `resources.limits` exist. A verdict that awaits nothing is returned as is.
    """
    if verdict.awaiting_pod_index is None:
        return verdict
    resource, count = container_request(pod_index)
    operations: JsonPatch = [
        {
            "op": "add",
            "path": f"/metadata/annotations/{escape_pointer_token(POD_INDEX_ANNOTATION)}",
            "value": str(pod_index),
        }
    ]
    operations += [
        {
            "op": "add",
            "path": f"/spec/containers/{position}/resources/limits/{escape_pointer_token(resource)}",
            "value": str(count),
        }
        for position in verdict.awaiting_pod_index
    ]
    return replace(verdict, patch=[*verdict.patch, *operations], awaiting_pod_index=None)


def _admit(original: Mapping[str, Any], context: AdmissionContext) -> Verdict:
    config = context.config
    # Copy on write: only the objects the mutation touches are copied, the rest is shared with
    # `original`, so the diff skips shared subtrees by identity.
    pod: dict[str, Any] = dict(original)
    metadata = dict(pod["metadata"]) if isinstance(pod.get("metadata"), dict) else {}
    pod["metadata"] = metadata
    if not isinstance(pod.get("spec"), dict):
        raise AdmissionDeniedError("the pod has no spec; send a complete Pod object")
    spec = pod["spec"] = dict(pod["spec"])
    labels = _string_map(metadata.get("labels"), "metadata.labels")
    annotations = _string_map(metadata.get("annotations"), "metadata.annotations")
    containers = _containers(spec)
    native = _native_gpu_limits(containers, config.native_gpu_resource_names)
    namespace = metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None
    namespace = namespace or context.namespace

    enabled = labels.get(ENABLED)
    if enabled == "false":
        return _unchanged(f'label {ENABLED} is "false"')
    if enabled != "true":
        if not native:
            unknown = unknown_keys(labels, annotations)
            return _unchanged(
                f'not a GPU pod: no label {ENABLED}: "true" and no native GPU'
                + (f"; {unknown}" if unknown else "")
            )
        if not should_auto_migrate(config, namespace, context.namespace_labels, labels):
            return _unchanged("native GPU pod outside automatic migration")
        labels = {**labels, ENABLED: "true"}
        annotations = {**annotations, ISOLATION: annotations.get(ISOLATION, "shared")}
    else:
        labels = dict(labels)
        annotations = dict(annotations)
    unknown = unknown_keys(labels, annotations)
    if unknown is not None:
        raise AdmissionDeniedError(unknown)
    if WORKLOAD_PROFILE in annotations:
        try:
            annotations = with_profile(annotations, context.profiles, namespace)
        except ProfileError as error:
            raise AdmissionDeniedError(str(error)) from None

    local = _boolean(annotations, IS_LOCAL_GPU)
    pool_name = annotations.get(GPUPOOL)
    if pool_name is not None:
        pool = config.pool(pool_name)
        if pool is None:
            known = ", ".join(p.name for p in config.gpu_pools) or "none configured"
            raise AdmissionDeniedError(
                f"annotation {GPUPOOL}: unknown pool {pool_name!r}; known pools: {known}"
            )
    else:
        pool = config.default_pool()
        if pool is None:
            raise AdmissionDeniedError(
                f"no default GPU pool is configured: set annotation {GPUPOOL} to one of "
                f"{', '.join(p.name for p in config.gpu_pools)}, or mark a pool isDefault: true"
            )
    pool_spec = pool.spec_template
    if local is False or (local is None and not pool_spec.default_using_local_gpu):
        raise AdmissionDeniedError(
            f"annotation {IS_LOCAL_GPU}: remote GPU workers are not supported yet; "
            f'set {IS_LOCAL_GPU}: "true" (pool {pool.name!r} defaults to remote GPUs '
            "when its defaultUsingLocalGPU is false)"
        )

    isolation = (
        _choice(annotations, ISOLATION, ISOLATION_MODES)
        or pool_spec.node_manager_config.default_isolation_mode
    )
    resources = _resources(annotations)
    injected = _injected_containers(annotations, containers, native)
    if isolation != "shared" and not native.keys().isdisjoint(injected):
        resources = _native_whole_gpus(annotations, resources)
    gpu_model = annotations.get(GPU_MODEL)
    if _boolean(annotations, DEDICATED_GPU):
        if not gpu_model:
            raise AdmissionDeniedError(
                f'annotation {DEDICATED_GPU}: "true" needs annotation {GPU_MODEL}, e.g. H100'
            )
        card = GPU_MODELS_BY_NAME.get(gpu_model)
        if card is None:
            raise AdmissionDeniedError(
                f"annotation {GPU_MODEL}: unknown model {gpu_model!r} for {DEDICATED_GPU}; "
                f"use one of {', '.join(sorted(GPU_MODELS_BY_NAME))}"
            )
        resources = _Resources(
            card.fp16_tflops_milli, card.fp16_tflops_milli, card.vram_bytes, card.vram_bytes
        )
    qos = _resolve_qos(annotations, resources, pool_spec.qos_config.default_qos)
    autoscale_target = _choice(annotations, AUTOSCALE_TARGET, AUTOSCALE_TARGETS) or "all"
    if _boolean(annotations, AUTOSCALE) and not _boolean(annotations, DEDICATED_GPU):
        resources = _autoscaled(resources, autoscale_target, qos, metadata, namespace, annotations, context)
    enabled_replicas = _enabled_replicas(annotations)
    eviction_protection_s = _eviction_protection_s(annotations)

    gpu_count = _gpu_count(annotations, native, injected)
    if context.quota is not None:
        resources = _within_quota(context.quota, resources, gpu_count, isolation, pool.name)
    compute_zero = not resources.tflops_request and not resources.percent_request
    if isolation != "shared" and compute_zero and not resources.vram_request:
        raise AdmissionDeniedError(
            f"every GPU request is zero: set annotations {TFLOPS_REQUEST} (e.g. 20) or {PERCENT_REQUEST} "
            f"(e.g. 50), and {VRAM_REQUEST} (e.g. 16Gi), or use {ISOLATION}: shared for whole GPUs"
        )

    identity = identify(metadata, namespace)
    migrated_resources = sorted({native[name][0] for name in injected if name in native})
    migrated = migrated_resources[0] if migrated_resources else None

    annotations[GPUPOOL] = pool.name
    annotations[QOS] = qos
    annotations[ISOLATION] = isolation
    _set_annotation_value(annotations, GPU_COUNT, gpu_count, int, str)
    if isolation != "shared" or resources.tflops_limit or resources.percent_limit is not None:
        if resources.percent_limit is not None:
            _set_annotation_value(annotations, PERCENT_REQUEST, resources.percent_request or 0, int, str)
            _set_annotation_value(annotations, PERCENT_LIMIT, resources.percent_limit, int, str)
        else:
            _set_annotation_value(
                annotations, TFLOPS_REQUEST, resources.tflops_request, parse_milli, format_milli
            )
            _set_annotation_value(
                annotations, TFLOPS_LIMIT, resources.tflops_limit, parse_milli, format_milli
            )
    if isolation != "shared" or resources.vram_limit:
        _set_annotation_value(
            annotations, VRAM_REQUEST, resources.vram_request, parse_bytes, _canonical_bytes
        )
        _set_annotation_value(annotations, VRAM_LIMIT, resources.vram_limit, parse_bytes, _canonical_bytes)
    if INJECT_CONTAINER not in annotations:
        annotations[INJECT_CONTAINER] = ",".join(injected)
    annotations[CONTAINER_GPU_COUNT] = _container_gpu_counts(annotations, native, injected, gpu_count)
    vendor = annotations.get(VENDOR)
    if vendor is None and migrated is not None:
        vendor = VENDOR_BY_RESOURCE_DOMAIN.get(migrated.split("/", 1)[0])
        if vendor is not None:
            annotations[VENDOR] = vendor

    takeover = _takeover(identity, enabled_replicas, annotations, context)
    labels[COMPONENT] = WORKER_COMPONENT
    labels[WORKLOAD] = identity.name
    labels[GPUPOOL] = pool.name
    metadata["labels"] = labels
    metadata["annotations"] = annotations

    spec["schedulerName"] = SCHEDULER_NAME
    if qos in PRIORITY_CLASSES and not spec.get("priorityClassName"):
        spec["priorityClassName"] = PRIORITY_CLASSES[qos]
        spec.pop("priority", None)
    pod_index = pod_index_from_annotation(annotations.get(POD_INDEX_ANNOTATION))
    index_resource = container_request(pod_index) if pod_index is not None else None
    awaiting: list[int] = []
    for position, container in enumerate(containers):
        if container["name"] in injected:
            _hand_over_container(container, config.native_gpu_resource_names, index_resource)
            awaiting.append(position)

    request = resources.request(
        pool.name,
        gpu_count,
        gpu_model=gpu_model,
        qos=cast(QosLevel, qos),
        isolation=cast(IsolationMode, isolation),
    )
    workload = WorkloadRef(
        namespace=namespace,
        name=pod_display_name(metadata),
        uid=metadata.get("uid") if isinstance(metadata.get("uid"), str) else None,
        workload=identity.name,
    )
    return Admitted(
        patch=json_diff(original, pod),
        reason="taken over by the GPU pool",
        workload=workload,
        request=request,
        migrated_resource=migrated,
        takeover=takeover,
        awaiting_pod_index=tuple(awaiting) if pod_index is None else None,
        priority=priority_of(qos, str(spec.get("priorityClassName") or "")),
        eviction_protection_s=eviction_protection_s,
    )


def _autoscaled(
    resources: _Resources,
    target: str,
    qos: str,
    metadata: Mapping[str, Any],
    namespace: str,
    annotations: dict[str, str],
    context: AdmissionContext,
) -> _Resources:
    key = workload_key(namespace, identify(metadata, namespace).name)
    result = autoscale(
        key,
        target,
        qos,
        Sizes(resources.tflops_request, resources.tflops_limit, resources.vram_request, resources.vram_limit),
        context.recommendations.get(key),
        compute_as_percent=resources.percent_limit is not None,
    )
    annotations[AUTOSCALE_SOURCE] = result.note
    applied = result.sizes
    return replace(
        resources,
        tflops_request=applied.tflops_request,
        tflops_limit=applied.tflops_limit,
        vram_request=applied.vram_request,
        vram_limit=applied.vram_limit,
    )


def _takeover(
    identity: WorkloadIdentity,
    enabled_replicas: int | None,
    annotations: dict[str, str],
    context: AdmissionContext,
) -> TakeoverClaim | None:
    if enabled_replicas is None or identity.takeover_key is None:
        return None
    annotations[POD_COUNTER_KEY] = identity.takeover_key
    slot_id = annotations.get(TAKEOVER_SLOT) or context.takeover_slot_id
    if slot_id is not None:
        annotations[TAKEOVER_SLOT] = slot_id
    return TakeoverClaim(workload_key=identity.takeover_key, limit=enabled_replicas, slot_id=slot_id)


def _hand_over_container(
    container: dict[str, Any], native_names: tuple[str, ...], index_resource: tuple[str, int] | None
) -> None:
    """Drop the native GPU resources and any stale index resource; request `index_resource` if known.

    `resources.limits` always exists afterwards, so `assign_pod_index` can add the request later.
    """
    resources = dict(container["resources"]) if isinstance(container.get("resources"), dict) else {}
    container["resources"] = resources
    wanted = {index_resource[0]: str(index_resource[1])} if index_resource is not None else {}
    for section in ("limits", "requests"):
        if not isinstance(resources.get(section), dict):
            continue
        values = resources[section]
        stale = [
            name
            for name in values
            if name in native_names or (name.startswith(RESOURCE_PREFIX) and values[name] != wanted.get(name))
        ]
        if not stale:
            continue
        values = resources[section] = {k: v for k, v in values.items() if k not in stale}
        if not values and section == "requests":
            del resources[section]
    if not isinstance(resources.get("limits"), dict):
        resources["limits"] = {}
    if index_resource is not None and resources["limits"].get(index_resource[0]) != wanted[index_resource[0]]:
        resources["limits"] = {**resources["limits"], **wanted}
