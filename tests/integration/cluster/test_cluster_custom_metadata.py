"""The `Cluster` port's writes of custom-object metadata (what the node agent needs): owned creation and
label merges that keep users' labels, on the in-memory fake and on the Kubernetes adapter over HTTP."""

from __future__ import annotations

from cluster_harness import Harness
from tfcommon.cluster import Applied, CustomResource, NotFound
from tfcommon.cluster.model import OwnerReference

DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"


async def test_a_gpu_is_created_owned_by_its_gpunode(harness: Harness) -> None:
    assert isinstance(
        await harness.cluster.create_custom_object(CustomResource.GPU_NODE, "node-a", labels={"a": "1"}),
        Applied,
    )
    node = await harness.cluster.get_custom_object(CustomResource.GPU_NODE, "node-a")
    assert node is not None
    assert node.uid

    created = await harness.cluster.create_custom_object(
        CustomResource.GPU, "gpu-0a1b", labels={"kubernetes.io/hostname": "node-a"}, owner=node
    )

    assert isinstance(created, Applied)
    stored = harness.custom(CustomResource.GPU, "gpu-0a1b")
    assert stored is not None
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUNode",
            "name": "node-a",
            "uid": node.uid,
            "controller": True,
        }
    ]
    gpu = await harness.cluster.get_custom_object(CustomResource.GPU, "gpu-0a1b")
    assert gpu is not None
    assert gpu.owner_references == (OwnerReference("GPUNode", "node-a", node.uid, controller=True),)


async def test_metadata_patch_merges_labels_and_keeps_users_labels_and_status(harness: Harness) -> None:
    harness.put_custom(
        CustomResource.GPU_NODE,
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUNode",
            "metadata": {
                "name": "node-a",
                "labels": {DO_NOT_DISRUPT: "true", "tensor-fusion.ai/gpupool": "old"},
            },
            "spec": {"manageMode": "Manual"},
            "status": {"phase": "Running"},
        },
    )

    result = await harness.cluster.patch_custom_metadata(
        CustomResource.GPU_NODE, "node-a", labels={"tensor-fusion.ai/gpupool": "default", "gone": None}
    )

    assert isinstance(result, Applied)
    stored = harness.custom(CustomResource.GPU_NODE, "node-a")
    assert stored is not None
    assert stored["metadata"]["labels"] == {DO_NOT_DISRUPT: "true", "tensor-fusion.ai/gpupool": "default"}
    assert stored["spec"] == {"manageMode": "Manual"}
    assert stored["status"] == {"phase": "Running"}
    missing = await harness.cluster.patch_custom_metadata(CustomResource.GPU, "absent", labels={"a": "b"})
    assert isinstance(missing, NotFound)
