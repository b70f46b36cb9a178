"""`tfcommon.unsupported_fields`: which fields of a spec tfpool names as accepted but not acted on."""

from __future__ import annotations

from datetime import UTC, datetime

from tfcommon.cluster import CustomResource
from tfcommon.unsupported_fields import unsupported_condition, unsupported_fields, with_condition

NOW = datetime(2026, 9, 1, 10, 0, tzinfo=UTC)


def test_a_whole_unsupported_section_is_named_once_and_supported_leaves_are_not() -> None:
    spec = {
        "componentConfig": {"hypervisor": {"image": "x", "portNumber": 8000}},
        "capacityConfig": {"minResources": {"tflops": "20", "vram": "10Gi", "cpu": "8"}},
        "nodeManagerConfig": {"nodeCompaction": {"period": "5m"}, "defaultIsolationMode": "soft"},
        "qosConfig": {"defaultQoS": "low", "definitions": [{"name": "low"}]},
        "placement": {"mode": "CompactFirst"},
    }
    assert unsupported_fields(CustomResource.GPU_POOL, spec) == (
        "spec.capacityConfig.minResources.cpu",
        "spec.componentConfig",
        "spec.qosConfig.definitions",
    )


def test_pool_capacity_bounds_and_node_selector_are_acted_on_but_not_cpu_or_memory_maxima() -> None:
    spec = {
        "capacityConfig": {
            "maxResources": {"tflops": "100", "vram": "100Gi", "cpu": "64"},
            "oversubscription": {"tflopsOversellRatio": 2000},
        },
        "nodeManagerConfig": {"nodeSelector": {"nodeSelectorTerms": []}, "defaultVendor": "NVIDIA"},
    }
    assert unsupported_fields(CustomResource.GPU_POOL, spec) == (
        "spec.capacityConfig.maxResources.cpu",
        "spec.nodeManagerConfig.defaultVendor",
    )


def test_nothing_set_in_a_gpunode_spec_is_acted_on_yet() -> None:
    assert unsupported_fields(CustomResource.GPU_NODE, {"costPerHour": "1.2"}) == ("spec.costPerHour",)


def test_every_quota_field_is_acted_on_compute_limits_and_compute_defaults_too() -> None:
    quota = {
        "total": {"maxWorkers": 3, "requests": {"compute": "50"}},
        "single": {
            "maxGPUCount": 2,
            "maxRequests": {"compute": "20"},
            "maxLimits": {"tflops": "10", "compute": "30"},
            "defaultRequests": {"tflops": "1", "compute": "5"},
        },
    }
    assert unsupported_fields(CustomResource.GPU_RESOURCE_QUOTA, quota) == ()


def test_condition_is_false_when_every_field_is_acted_on() -> None:
    condition = unsupported_condition(CustomResource.GPU_POOL, {"defaultUsingLocalGPU": True}, NOW)
    assert (condition["type"], condition["status"]) == ("UnsupportedFields", "False")
    named = unsupported_condition(CustomResource.GPU_POOL, {"schedulingConfigTemplate": "t"}, NOW)
    assert named["status"] == "True"
    assert "spec.schedulingConfigTemplate" in named["message"]


def test_other_conditions_stay_and_the_transition_time_is_kept_while_the_status_holds() -> None:
    earlier = {"type": "UnsupportedFields", "status": "True", "message": "a", "lastTransitionTime": "T0"}
    ready = {"type": "Ready", "status": "True"}
    status = {"conditions": [ready, earlier]}
    same_status = unsupported_condition(CustomResource.GPU_POOL, {"schedulingConfigTemplate": "t"}, NOW)
    assert with_condition(status, same_status) == [ready, {**same_status, "lastTransitionTime": "T0"}]
    flipped = unsupported_condition(CustomResource.GPU_POOL, {}, NOW)
    assert with_condition(status, flipped) == [ready, flipped]
