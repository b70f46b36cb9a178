"""How a pod is recognised by the node-agent's kubelet device plugin from device IDs alone.

The kubelet's `Allocate` call says only which devices of which resource a container got, not which pod
it is for. So each GPU pod carries a pod index `n` (annotation `tensor-fusion.ai/index`, 0..127,
assigned by the webhook from an atomic counter) and each of its injected containers requests
`n % 8 + 1` devices of resource `tensor-fusion.ai/index_<n // 8 in hex>`. The plugin serving resource
`k` that is asked for `m` devices decodes `n = 8k + m - 1`. Pure: shared by the webhook (which writes
the request) and the agent (which decodes it).
"""

from __future__ import annotations

POD_INDEX_ANNOTATION = "tensor-fusion.ai/index"
RESOURCE_PREFIX = "tensor-fusion.ai/index_"
SLOTS_PER_RESOURCE = 8
INDEX_RESOURCES = 16
POD_INDEX_COUNT = SLOTS_PER_RESOURCE * INDEX_RESOURCES


class DeviceSlotError(ValueError):
    """A pod index or a device request outside the scheme; the message says what is allowed."""


def index_resource_name(resource: int) -> str:
    """`tensor-fusion.ai/index_<hex digit>` for resource number 0..15."""
    if not 0 <= resource < INDEX_RESOURCES:
        raise DeviceSlotError(f"index resource {resource} is outside 0..{INDEX_RESOURCES - 1}")
    return f"{RESOURCE_PREFIX}{resource:x}"


def container_request(pod_index: int) -> tuple[str, int]:
    """The extended resource and count each injected container of pod `pod_index` requests."""
    if not 0 <= pod_index < POD_INDEX_COUNT:
        raise DeviceSlotError(f"pod index {pod_index} is outside 0..{POD_INDEX_COUNT - 1}")
    return index_resource_name(pod_index // SLOTS_PER_RESOURCE), pod_index % SLOTS_PER_RESOURCE + 1


def pod_index_of(resource: int, device_count: int) -> int:
    """Decode the pod index from the resource a container's devices came from and how many it got."""
    resource_name = index_resource_name(resource)
    if not 1 <= device_count <= SLOTS_PER_RESOURCE:
        raise DeviceSlotError(
            f"{device_count} devices of {resource_name} do not name a pod: a container "
            f"requests 1..{SLOTS_PER_RESOURCE} (its pod index modulo {SLOTS_PER_RESOURCE}, plus one)"
        )
    return resource * SLOTS_PER_RESOURCE + device_count - 1


def pod_index_from_annotation(value: str | None) -> int | None:
    """The pod index annotation as an int, or None when absent or not a valid index."""
    if value is None or not value.strip().isdigit():
        return None
    index = int(value)
    return index if index < POD_INDEX_COUNT else None
