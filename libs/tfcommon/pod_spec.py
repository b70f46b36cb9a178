"""The pod contract: the `tensor-fusion.ai/*` keys a GPU pod carries, their vocabulary and limits, and
the parsers every stop shares. Pure: no I/O.

The admission webhook (and `tfctl submit`, which runs it locally), the scheduler's binding, the local
scheduler API, the defrag planner and the agent's device plugin all read a pod through this module, so a
value one of them accepts is accepted, with the same meaning, by all, and a value one refuses is refused
by all with the same message (the annotation named, then a valid value). The GPU request itself is read
by `tfcommon.pod_request`, built on these keys and parsers.

Vocabulary: QoS levels and isolation modes (`tfcommon.events.QosLevel` / `IsolationMode`), the
PriorityClasses the webhook gives `high` and `critical` pods and their values (`charts/.../priorityclass.yaml`
in TensorFusion: 10000 and 100000), and `MAX_GPU_COUNT`.
"""

from __future__ import annotations

import re
from typing import get_args

from tfcommon.events import IsolationMode, QosLevel
from tfcommon.quantities import QuantityError, parse_quantity

PREFIX = "tensor-fusion.ai/"

# Labels.
ENABLED = PREFIX + "enabled"
COMPONENT = PREFIX + "component"
WORKLOAD = PREFIX + "workload"

# The request, read by the scheduler, the defrag planner and the device plugin (`tfcommon.pod_request`).
GPUPOOL = PREFIX + "gpupool"
GPU_COUNT = PREFIX + "gpu-count"
GPU_INDICES = PREFIX + "gpu-indices"
GPU_MODEL = PREFIX + "gpu-model"
TFLOPS_REQUEST = PREFIX + "tflops-request"
TFLOPS_LIMIT = PREFIX + "tflops-limit"
VRAM_REQUEST = PREFIX + "vram-request"
VRAM_LIMIT = PREFIX + "vram-limit"
PERCENT_REQUEST = PREFIX + "compute-percent-request"
PERCENT_LIMIT = PREFIX + "compute-percent-limit"
QOS = PREFIX + "qos"
ISOLATION = PREFIX + "isolation"
EVICTION_PROTECTION = PREFIX + "eviction-protection"

# What the webhook reads besides the request, and writes.
VENDOR = PREFIX + "vendor"
DEDICATED_GPU = PREFIX + "dedicated-gpu"
INJECT_CONTAINER = PREFIX + "inject-container"
CONTAINER_GPU_COUNT = PREFIX + "container-gpu-count"
ENABLED_REPLICAS = PREFIX + "enabled-replicas"
AUTOSCALE = PREFIX + "autoscale"
AUTOSCALE_TARGET = PREFIX + "autoscale-target"
IS_LOCAL_GPU = PREFIX + "is-local-gpu"
POD_COUNTER_KEY = PREFIX + "pod-counter-key"
TAKEOVER_SLOT = PREFIX + "takeover-slot"
WORKLOAD_PROFILE = PREFIX + "workload-profile"
AUTOSCALE_SOURCE = PREFIX + "autoscale-source"

# What the scheduler writes at bind, read by the device plugin and the agent.
GPU_IDS = PREFIX + "gpu-ids"
CONTAINER_GPUS = PREFIX + "container-gpus"

QOS_LEVELS: tuple[str, ...] = get_args(QosLevel)
"""`low`, `medium`, `high`, `critical`, lowest first."""
ISOLATION_MODES: tuple[str, ...] = get_args(IsolationMode)
"""`shared`, `soft`, `hard`, `partitioned`."""
DEFAULT_QOS = "medium"
DEFAULT_ISOLATION = "soft"

PRIORITY_CLASSES: dict[str, str] = {"high": "tensor-fusion-high", "critical": "tensor-fusion-critical"}
"""The PriorityClass the webhook gives a pod of this QoS that names none."""
PRIORITY_CLASS_VALUES: dict[str, int] = {"tensor-fusion-high": 10_000, "tensor-fusion-critical": 100_000}
"""The value of each of those PriorityClasses (what Kubernetes puts in `spec.priority`)."""

MAX_GPU_COUNT = 128
"""The most GPUs one pod may ask for (`gpu-count`, `gpu-indices`, native GPU limits)."""

PERCENT_EXAMPLE = "a whole percentage of one GPU from 0 to 100, e.g. 50"
DURATION_EXAMPLE = "use Go syntax, e.g. 30m or 1h30m"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


class PodRequestError(ValueError):
    """A pod's `tensor-fusion.ai/*` annotation cannot be read; the message names it and the fix."""


def whole_percent(raw: str | int) -> int | None:
    """`raw` as a whole percent of one GPU (0..100, a Kubernetes quantity such as `50`), or None when it
    is none (`50%`, `0.5`, `150`): the one percent parser of every stop, annotations and profiles."""
    try:
        number = parse_quantity(raw)
    except QuantityError:
        return None
    if number.denominator != 1 or not 0 <= number <= 100:
        return None
    return int(number)


def parse_percent(key: str, raw: str) -> int:
    """A compute percent annotation (`compute-percent-request`/`-limit`, `whole_percent`); raises
    `PodRequestError` naming `key`. `50%` is refused, as TensorFusion's quantity parser refuses it."""
    value = whole_percent(raw)
    if value is not None:
        return value
    try:
        parse_quantity(raw)
    except QuantityError:
        raise PodRequestError(f"annotation {key}: {raw!r} is not {PERCENT_EXAMPLE}") from None
    raise PodRequestError(f"annotation {key}: {raw!r} is outside 0..100; use {PERCENT_EXAMPLE}")


def parse_duration_s(raw: str | None, *, key: str = EVICTION_PROTECTION) -> int:
    """A Go duration annotation (`eviction-protection`, `gang-timeout`: `30m`, `1h30m`, `90s`) in whole
    seconds, rounded down; empty means none. Raises `PodRequestError` naming `key`."""
    if raw is None or not raw.strip():
        return 0
    text = raw.strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise PodRequestError(f"annotation {key}: {raw!r} is not a duration; {DURATION_EXAMPLE}")
    return int(sum(float(number) * _DURATION_SECONDS[unit] for number, unit in parts))


def priority_of(qos: str, priority_class_name: str | None = None) -> int:
    """The priority Kubernetes gives a pod the webhook admitted: its own PriorityClass when it names one
    of ours, else the one its QoS gets (`PRIORITY_CLASSES`), else 0."""
    name = priority_class_name or PRIORITY_CLASSES.get(qos, "")
    return PRIORITY_CLASS_VALUES.get(name, 0)
