"""The shell's memo of `admit` for identical replica pods: same answers, bounded, never for slots."""

from __future__ import annotations

import base64
import json

from tfcommon.config import TfConfig, parse_config
from tfcommon.device_slots import POD_INDEX_COUNT
from tfwebhook.core.admission import AdmissionContext, Admitted, admit
from tfwebhook.http import VerdictCache
from tfwebhook.testing import a_gpu_container, a_pod

ENABLED = {"tensor-fusion.ai/enabled": "true"}


def replica(**annotations: str) -> dict[str, object]:
    return a_pod(
        labels=ENABLED,
        annotations={"tensor-fusion.ai/isolation": "shared", **annotations},
        containers=[a_gpu_container()],
        name=None,
        owner=("ReplicaSet", "web-1"),
    )


def test_identical_pods_get_the_verdict_admit_gives() -> None:
    cache = VerdictCache(8)
    context = AdmissionContext(TfConfig(), "ns", takeover_slot_id="a")
    first = cache.decide(replica(), context)
    assert first == admit(replica(), context)
    assert cache.decide(replica(), AdmissionContext(context.config, "ns", takeover_slot_id="b")) is first
    assert cache.decide(replica(), AdmissionContext(context.config, "other")) is not first


def test_slot_claims_are_never_reused_across_requests() -> None:
    cache = VerdictCache(8)
    config = TfConfig()
    first = cache.decide(
        replica(**{"tensor-fusion.ai/enabled-replicas": "1"}),
        AdmissionContext(config, "ns", takeover_slot_id="a"),
    )
    second = cache.decide(
        replica(**{"tensor-fusion.ai/enabled-replicas": "1"}),
        AdmissionContext(config, "ns", takeover_slot_id="b"),
    )
    assert isinstance(first, Admitted)
    assert isinstance(second, Admitted)
    assert first.takeover is not None
    assert second.takeover is not None
    assert (first.takeover.slot_id, second.takeover.slot_id) == ("a", "b")


def test_a_new_configuration_empties_the_cache() -> None:
    cache = VerdictCache(8)
    pod = replica(**{"tensor-fusion.ai/gpupool": "inference"})
    assert not isinstance(cache.decide(pod, AdmissionContext(TfConfig(), "ns")), Admitted)
    config = parse_config("gpuPools: [{name: default, isDefault: true}, {name: inference}]")
    assert isinstance(cache.decide(pod, AdmissionContext(config, "ns")), Admitted)


def test_the_cache_is_bounded() -> None:
    cache = VerdictCache(2)
    context = AdmissionContext(TfConfig(), "ns")
    first = cache.decide(replica(), context)
    for index in range(3):
        cache.decide(replica(**{"tensor-fusion.ai/gpu-model": f"m{index}"}), context)
    assert cache.decide(replica(), context) is not first
    assert cache.decide(replica(), context) == first


def test_replicas_completed_with_an_index_get_the_patch_an_uncached_admission_gives() -> None:
    cache = VerdictCache(4)
    context = AdmissionContext(TfConfig(), "ns")
    for pod_index in [*range(POD_INDEX_COUNT), 0, 1, 127, 5]:
        verdict = cache.decide(replica(), context)
        assert isinstance(verdict, Admitted)
        completed = cache.with_pod_index(verdict, pod_index)
        expected = admit(replica(), AdmissionContext(context.config, "ns", pod_index=pod_index))
        assert isinstance(expected, Admitted)
        assert completed.patch == expected.patch
        assert json.loads(base64.b64decode(completed.encoded_patch)) == expected.patch
    inference = parse_config("gpuPools: [{name: default, isDefault: true}, {name: inference}]")
    pod = replica(**{"tensor-fusion.ai/gpupool": "inference"})
    moved = cache.with_pod_index(cache.decide(pod, AdmissionContext(inference, "ns")), 0)  # type: ignore[arg-type]
    assert {
        "op": "add",
        "path": "/metadata/labels/tensor-fusion.ai~1gpupool",
        "value": "inference",
    } in moved.patch
