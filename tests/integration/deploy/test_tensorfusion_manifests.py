"""TensorFusion's own sample manifests against our CRDs on a real API server, and the `UnsupportedFields`
condition the scheduler keeps on what we accept but do not act on.

The samples (`tensorfusion_samples/`, copied unmodified from NexusGPU/tensor-fusion: GPU, GPUNode, GPUPool,
GPUResourceQuota, WorkloadProfile and the four ProviderConfigs) apply with
`kubectl apply --validate=strict` (an unknown field is an error, never pruned), and every value they set
reads back unchanged. Status written under TensorFusion's names (`hypervisorState`, `allocatedPods`,
`topology`, ...) is accepted through the status subresource.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.kube_local import LocalKubernetes
from tfcommon.unsupported_fields import CONDITION
from tfscheduler.spec_conditions import UnsupportedFieldsReporter

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parent / "tensorfusion_samples"
SAMPLE_NAMESPACES = ("production-namespace", "development-namespace", "research-namespace", "tensor-fusion")


def run_kubectl(
    control_plane: LocalKubernetes, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def kubectl(control_plane: LocalKubernetes, *args: str, stdin: str | None = None) -> str:
    result = run_kubectl(control_plane, *args, stdin=stdin)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((SAMPLES / name).read_text()) if doc]


def pools_of_cluster_samples() -> list[dict[str, Any]]:
    """Each `gpuPools[].specTemplate` of the TensorFusionCluster samples as the GPUPool TensorFusion makes."""
    pools = []
    for path in sorted(SAMPLES.glob("tensorfusioncluster-*.yaml")):
        for doc in documents(path.name):
            if doc.get("kind") != "TensorFusionCluster":
                continue
            for entry in doc["spec"]["gpuPools"]:
                pools.append(
                    {
                        "apiVersion": "tensor-fusion.ai/v1",
                        "kind": "GPUPool",
                        "metadata": {"name": f"{path.stem}-{entry['name']}"},
                        "spec": entry["specTemplate"],
                    }
                )
    return pools


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            yield from leaves(child, f"{path}.{key}")
    elif isinstance(value, list) and value:
        for index, child in enumerate(value):
            yield from leaves(child, f"{path}[{index}]")
    else:
        yield path, value


def read_back(control_plane: LocalKubernetes, doc: Mapping[str, Any]) -> dict[str, Any]:
    namespace = doc["metadata"].get("namespace")
    args = ["get", f"{doc['kind'].lower()}.tensor-fusion.ai", doc["metadata"]["name"], "-o", "json"]
    stored: dict[str, Any] = json.loads(
        kubectl(control_plane, *args, *(["-n", namespace] if namespace else []))
    )
    return stored


def missing_values(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """Paths of `sent.spec` leaves whose value is not the same in `stored.spec`."""
    stored_leaves = dict(leaves(stored.get("spec") or {}))
    return [
        f"spec{path}: sent {value!r}, stored {stored_leaves.get(path)!r}"
        for path, value in leaves(sent.get("spec") or {})
        if value not in (None, {}, []) and stored_leaves.get(path) != value
    ]


@pytest.fixture(scope="module")
def sample_namespaces(local_kubernetes: LocalKubernetes) -> Iterator[None]:
    for namespace in SAMPLE_NAMESPACES:
        kubectl(local_kubernetes, "create", "namespace", namespace)
    yield
    for namespace in SAMPLE_NAMESPACES:
        kubectl(local_kubernetes, "delete", "namespace", namespace, "--wait=false")


@pytest.mark.parametrize(
    "sample",
    [
        "v1_gpu.yaml",
        "v1_gpunode.yaml",
        "v1_gpupool.yaml",
        "v1_gpuresourcequota.yaml",
        "v1_workloadprofile.yaml",
        "provider-nvidia.yaml",
        "provider-ascend.yaml",
        "provider-mthreads.yaml",
        "provider-ppu.yaml",
    ],
)
def test_tensorfusion_sample_applies_strictly_and_keeps_every_value(
    local_kubernetes: LocalKubernetes, sample_namespaces: None, sample: str
) -> None:
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", str(SAMPLES / sample))
    try:
        for doc in documents(sample):
            assert missing_values(doc, read_back(local_kubernetes, doc)) == []
    finally:
        kubectl(local_kubernetes, "delete", "--wait=false", "-f", str(SAMPLES / sample))


def test_pools_of_tensorfusioncluster_samples_apply_strictly(local_kubernetes: LocalKubernetes) -> None:
    pools = pools_of_cluster_samples()
    assert len(pools) == 8
    manifest = yaml.safe_dump_all(pools)
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=manifest)
    try:
        for pool in pools:
            assert missing_values(pool, read_back(local_kubernetes, pool)) == [], pool["metadata"]["name"]
    finally:
        kubectl(local_kubernetes, "delete", "--wait=false", "-f", "-", stdin=manifest)


def test_what_tensorfusions_schemas_accept_and_ours_used_to_refuse_applies(
    local_kubernetes: LocalKubernetes,
) -> None:
    """TensorFusion's CRDs set no minimum on `single.maxGPUCount` or `total.maxWorkers` and do not require
    `qosConfig.pricing[].qos`; ours did. Both kinds of object apply now and read back unchanged."""
    name = f"loose-{uuid.uuid4().hex[:8]}"
    pool = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "nodeManagerConfig": {},
            "qosConfig": {"pricing": [{"requests": {"perFP16TFlopsPerHour": "$0.5"}}]},
        },
    }
    quota = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUResourceQuota",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"total": {"maxWorkers": -1}, "single": {"maxGPUCount": 0}},
    }
    manifest = yaml.safe_dump_all([pool, quota])
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=manifest)
    try:
        for applied in (pool, quota):
            assert missing_values(applied, read_back(local_kubernetes, applied)) == [], applied["kind"]
    finally:
        kubectl(local_kubernetes, "delete", "--wait=false", "-f", "-", stdin=manifest)


def test_a_misspelt_field_is_refused_not_pruned(local_kubernetes: LocalKubernetes) -> None:
    pool = documents("v1_gpupool.yaml")[0]
    pool["metadata"] = {"name": f"typo-{uuid.uuid4().hex[:8]}"}
    pool["spec"]["capacityConfig"]["minResource"] = pool["spec"]["capacityConfig"].pop("minResources")
    result = run_kubectl(
        local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(pool)
    )
    assert result.returncode != 0
    assert 'unknown field "spec.capacityConfig.minResource"' in result.stderr


def test_a_misspelt_workload_profile_field_is_refused_not_pruned(
    local_kubernetes: LocalKubernetes, sample_namespaces: None
) -> None:
    profile = documents("v1_workloadprofile.yaml")[0]
    profile["metadata"]["name"] = f"typo-{uuid.uuid4().hex[:8]}"
    profile["spec"]["gpucount"] = 2
    result = run_kubectl(
        local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(profile)
    )
    assert result.returncode != 0
    assert 'unknown field "spec.gpucount"' in result.stderr


TF_GPU_STATUS = {
    "phase": "Running",
    "vendor": "NVIDIA",
    "model": "NVIDIA H100 80GB HBM3",
    "gpuModel": "H100",
    "uuid": "gpu-7e57",
    "index": 0,
    "numaNode": 0,
    "message": "",
    "nodeSelector": {"kubernetes.io/hostname": "node-1"},
    "capacity": {"tflops": "989.5", "vram": "80Gi", "compute": "100"},
    "available": {"tflops": "900", "vram": "70Gi", "compute": "90"},
    "isolationMode": "soft",
    "isolationPolicy": "Dynamic",
    "activeIsolationMode": "soft",
    "dynamicIsolationConflict": False,
    "usedBy": "tensor-fusion",
    "runningApps": [
        {
            "name": "llm",
            "namespace": "team",
            "count": 1,
            "pods": [
                {
                    "name": "llm-0",
                    "namespace": "team",
                    "uid": "u-1",
                    "requests": {"tflops": "89.5", "vram": "10Gi", "compute": "10"},
                    "limits": {"tflops": "100", "vram": "10Gi"},
                    "qos": "medium",
                    "isExternal": False,
                }
            ],
        }
    ],
    "allocatedPartitions": {
        "u-1": {
            "templateId": "1g.10gb",
            "podUid": "u-1",
            "podName": "llm-0",
            "namespace": "team",
            "allocatedAt": "2026-09-01T10:00:00Z",
            "allocatedSlotStart": 0,
            "allocatedSlotEnd": 1,
            "isolationGroupId": 2,
        }
    },
    "nvLink": {
        "peerCount": 1,
        "totalLinkCount": 18,
        "totalBandwidthMBps": 900000,
        "peers": [{"peerUUID": "gpu-8f68", "linkCount": 18, "linkVersion": 4, "bandwidthMBps": 900000}],
    },
    "topology": {"peers": [{"peerGPUUUID": "gpu-8f68", "tier": 0, "linkType": "NVLink", "bandwidth": 900}]},
}
TF_GPU_NODE_STATUS = {
    "phase": "Running",
    "totalTFlops": "989.5",
    "totalVRAM": "80Gi",
    "virtualTFlops": "4947.5",
    "virtualVRAM": "120Gi",
    "availableTFlops": "900",
    "availableVRAM": "70Gi",
    "virtualAvailableTFlops": "4847.5",
    "virtualAvailableVRAM": "110Gi",
    "hypervisorStatus": {
        "hypervisorState": "Running",
        "hypervisorVersion": "1.40.0",
        "lastHeartbeatTime": "2026-09-01T10:00:00Z",
    },
    "nodeInfo": {"ramSize": "512Gi", "dataDiskSize": "1Ti"},
    "loadedModels": ["llama-3-8b"],
    "totalGPUs": 1,
    "managedGPUs": 1,
    "managedGPUDeviceIDs": ["gpu-7e57"],
    "totalGPUPods": 1,
    "allocatedPods": {"gpu-7e57": [TF_GPU_STATUS["runningApps"][0]["pods"][0]]},  # type: ignore[index]
    "observedGeneration": 1,
}


@pytest.mark.parametrize(
    ("kind", "status"), [("GPU", TF_GPU_STATUS), ("GPUNode", TF_GPU_NODE_STATUS)], ids=["GPU", "GPUNode"]
)
def test_status_in_tensorfusion_names_is_kept(
    local_kubernetes: LocalKubernetes, kind: str, status: dict[str, Any]
) -> None:
    name = f"tf-status-{uuid.uuid4().hex[:8]}"
    resource = f"{kind.lower()}.tensor-fusion.ai"
    manifest = {"apiVersion": "tensor-fusion.ai/v1", "kind": kind, "metadata": {"name": name}}
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(manifest))
    try:
        patch = json.dumps({"status": status})
        kubectl(
            local_kubernetes, "patch", resource, name, "--subresource=status", "--type=merge", "-p", patch
        )
        stored = json.loads(kubectl(local_kubernetes, "get", resource, name, "-o", "json"))
        assert dict(leaves(stored["status"])) == dict(leaves(status))
    finally:
        kubectl(local_kubernetes, "delete", resource, name, "--wait=false")


def condition(stored: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in stored.get("status", {}).get("conditions", []) if c["type"] == kind), None)


async def test_scheduler_names_the_fields_it_accepts_but_does_not_act_on(
    local_kubernetes: LocalKubernetes,
) -> None:
    pool = documents("v1_gpupool.yaml")[0]
    name = f"unsupported-{uuid.uuid4().hex[:8]}"
    pool["metadata"] = {"name": name}
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(pool))
    other = {
        "type": "Ready",
        "status": "True",
        "reason": "Test",
        "message": "kept",
        "lastTransitionTime": "2026-09-01T10:00:00Z",
    }
    kubectl(
        local_kubernetes,
        *("patch", "gpupool.tensor-fusion.ai", name, "--subresource=status", "--type=merge"),
        "-p",
        json.dumps({"status": {"conditions": [other]}}),
    )
    cluster = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    reporter = UnsupportedFieldsReporter(cluster)
    try:
        assert await reporter.sync() >= 1
        stored = json.loads(kubectl(local_kubernetes, "get", "gpupool.tensor-fusion.ai", name, "-o", "json"))
        found = condition(stored, CONDITION)
        assert found is not None
        assert found["status"] == "True"
        for field in ("spec.componentConfig", "spec.nodeManagerConfig.defaultVendor"):
            assert field in found["message"], field
        for acted_on in (
            "spec.capacityConfig.minResources",
            "spec.capacityConfig.warmResources",
            "spec.capacityConfig.maxResources",
            "spec.capacityConfig.oversubscription",
            "spec.nodeManagerConfig.nodeSelector",
        ):
            assert acted_on not in found["message"], acted_on
        assert condition(stored, "Ready") == other
        assert await reporter.sync() == 0  # nothing changed, nothing written

        kubectl(
            local_kubernetes,
            *("patch", "gpupool.tensor-fusion.ai", name, "--type=json"),
            "-p",
            json.dumps([{"op": "remove", "path": "/spec/componentConfig"}]),
        )
        await reporter.sync()
        stored = json.loads(kubectl(local_kubernetes, "get", "gpupool.tensor-fusion.ai", name, "-o", "json"))
        changed = condition(stored, CONDITION)
        assert changed is not None
        assert "spec.componentConfig" not in changed["message"]
        assert "spec.nodeManagerConfig.defaultVendor" in changed["message"]
    finally:
        cluster.close()
        kubectl(local_kubernetes, "delete", "gpupool.tensor-fusion.ai", name, "--wait=false")


def test_tfctl_doctor_lists_what_is_accepted_but_not_acted_on(local_kubernetes: LocalKubernetes) -> None:
    pool = documents("v1_gpupool.yaml")[0]
    name = f"doctor-{uuid.uuid4().hex[:8]}"
    pool["metadata"] = {"name": name}
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(pool))
    refused = {
        "type": "SchedulerSpecValid",
        "status": "False",
        "reason": "InvalidPoolSpec",
        "message": "spec.placement.mode: unknown policy 'X'; scheduler keeps the last good spec",
    }
    patch = json.dumps({"status": {"conditions": [refused]}})
    kubectl(
        local_kubernetes,
        "patch",
        "gpupool.tensor-fusion.ai",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    )
    try:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "tfctl"),
                "doctor",
                f"--kubeconfig={local_kubernetes.kubeconfig}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f"gpupools/{name}: SchedulerSpecValid False: {refused['message']}" in result.stdout
        header, *rest = result.stdout.split(f"gpupools/{name}: accepted", 1)[1].splitlines()
        assert "UnsupportedFields not written yet" in header
        listed = []
        for line in rest:
            if not line.startswith("  "):
                break
            listed.append(line.strip())
        assert {"spec.componentConfig", "spec.nodeManagerConfig.defaultVendor"} <= set(listed)
        assert not any(field.startswith("spec.capacityConfig.minResources") for field in listed)
        assert "spec.nodeManagerConfig.nodeSelector" not in listed
    finally:
        kubectl(local_kubernetes, "delete", "gpupool.tensor-fusion.ai", name, "--wait=false")


async def test_a_gpunode_spec_nobody_reads_is_named_too(local_kubernetes: LocalKubernetes) -> None:
    name = f"node-spec-{uuid.uuid4().hex[:8]}"
    node = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": {"manageMode": "Manual", "costPerHour": "2.5", "gpuCardIndices": [0, 1]},
    }
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(node))
    cluster = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    try:
        reporter = UnsupportedFieldsReporter(cluster)
        await reporter.sync(nodes=True)
        stored = json.loads(kubectl(local_kubernetes, "get", "gpunode.tensor-fusion.ai", name, "-o", "json"))
        found = condition(stored, CONDITION)
        assert found is not None
        assert found["status"] == "True"
        for field in ("spec.manageMode", "spec.costPerHour", "spec.gpuCardIndices"):
            assert field in found["message"], field
    finally:
        cluster.close()
        kubectl(local_kubernetes, "delete", "gpunode.tensor-fusion.ai", name, "--wait=false")
