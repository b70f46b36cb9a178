"""GPUs per container on `tfctl up --kubernetes`, with kubectl as a user types it.

A pod whose two containers ask for 1 and 2 native GPUs (`nvidia.com/gpu`) in an automatic-migration
namespace is converted by the running webhook, and the running scheduler's Binding gives it
`tensor-fusion.ai/container-gpus` with 1 and 2 distinct GPUs of the node, all in its `gpu-ids`. The
same holds for an opted-in pod that gives the split itself (`tensor-fusion.ai/container-gpu-count`).
The node agent's `Allocate`, which turns the split into each container's `NVIDIA_VISIBLE_DEVICES`, needs
a kubelet (KWOK has none): `tests/integration/agent/test_device_plugin.py` drives it over gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_stack_up import KubeStack, create_namespace, eventually, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "split-gpus"
T = "tensor-fusion.ai/"
BASE_CONFIG = Path(__file__).resolve().parents[2] / "k8s" / "base" / "config" / "config.yaml"
AUTO_MIGRATION = {"enable": True, "scope": {"includes": {"namespaceNames": [NAMESPACE]}}}


@pytest.fixture
def kube_stack(tmp_path: Path) -> Iterator[KubeStack]:
    config = tmp_path / "config.yaml"
    settings = yaml.safe_load(BASE_CONFIG.read_text())
    settings["dynamicConfig"]["autoMigration"] = AUTO_MIGRATION
    config.write_text(yaml.safe_dump(settings))
    with running_kube_stack(("--fake-gpus", "H100:8"), TF_CONFIG_FILE=str(config)) as stack:
        yield stack


def without_object_selector(stack: KubeStack) -> None:
    """What `k8s/components/auto-migration` does to the registration: the API server sends the webhook
    pods that carry no `tensor-fusion.ai/enabled` label too."""
    registration = stack.kubectl_json("get", "mutatingwebhookconfiguration", "tfpool-webhook")
    for webhook in registration["webhooks"]:
        webhook.pop("objectSelector", None)
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        registration["metadata"].pop(key, None)
    stack.kubectl("replace", "-f", "-", stdin=json.dumps(registration))


def container(name: str, limits: dict[str, int] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": "trainer:1"}
    if limits:
        spec["resources"] = {"limits": limits}
    return spec


def a_pod(name: str, containers: list[dict[str, Any]], **metadata: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, **metadata},
        "spec": {"containers": containers},
    }


def bound_split(stack: KubeStack, name: str) -> tuple[list[str], dict[str, list[str]]]:
    """The pod's `gpu-ids` and `container-gpus` once the scheduler has bound it."""

    def bound() -> dict[str, Any] | None:
        pod = stack.kubectl_json("get", "pod", name, "-n", NAMESPACE)
        return pod if pod["spec"].get("nodeName") else None

    annotations = eventually(f"pod {name} bound", bound, within_s=60)["metadata"]["annotations"]
    return annotations[f"{T}gpu-ids"].split(","), json.loads(annotations[f"{T}container-gpus"])


def test_each_container_is_bound_to_as_many_distinct_gpus_as_it_asks_for(kube_stack: KubeStack) -> None:
    def listed_gpus() -> set[str] | None:
        names = {gpu["metadata"]["name"] for gpu in kube_stack.kubectl_json("get", "gpu")["items"]}
        return names if len(names) == 8 else None

    gpus = eventually("the agent's 8 GPUs", listed_gpus, within_s=60)
    without_object_selector(kube_stack)
    create_namespace(kube_stack, NAMESPACE)
    native = a_pod(
        "native",
        [container("loader", {"nvidia.com/gpu": 1}), container("trainer", {"nvidia.com/gpu": 2})],
    )
    annotated = a_pod(
        "annotated",
        [container("loader"), container("trainer")],
        labels={f"{T}enabled": "true"},
        annotations={
            f"{T}isolation": "shared",
            f"{T}inject-container": "loader,trainer",
            f"{T}container-gpu-count": '{"loader":1,"trainer":2}',
        },
    )
    kube_stack.apply({"apiVersion": "v1", "kind": "List", "items": [native, annotated]})

    for name in ("native", "annotated"):
        gpu_ids, split = bound_split(kube_stack, name)
        assert sorted(split) == ["loader", "trainer"], split
        assert (len(split["loader"]), len(split["trainer"])) == (1, 2), split
        assert len({*split["loader"], *split["trainer"]}) == 3, split
        assert sorted([*split["loader"], *split["trainer"]]) == sorted(gpu_ids)
        assert set(gpu_ids) <= gpus
    converted = kube_stack.kubectl_json("get", "pod", "native", "-n", NAMESPACE)
    assert converted["metadata"]["annotations"][f"{T}container-gpu-count"] == '{"loader":1,"trainer":2}'
    assert all("nvidia.com/gpu" not in c["resources"]["limits"] for c in converted["spec"]["containers"])
