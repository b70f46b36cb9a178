"""The CRDs (GPU, GPUNode, GPUPool, GPUResourceQuota, WorkloadProfile, ProviderConfig) and the sample
resources users copy from."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_support import REPO_ROOT, kubernetes_problem

CRD_FOLDER = REPO_ROOT / "k8s" / "base" / "crds"
EXAMPLES = REPO_ROOT / "k8s" / "examples"
EXPECTED = {
    "GPU": ("gpus", "Cluster"),
    "GPUNode": ("gpunodes", "Cluster"),
    "GPUPool": ("gpupools", "Cluster"),
    "GPUResourceQuota": ("gpuresourcequotas", "Namespaced"),
    "WorkloadProfile": ("workloadprofiles", "Namespaced"),
    "ProviderConfig": ("providerconfigs", "Cluster"),
}


def crds() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(CRD_FOLDER.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        found[crd["spec"]["names"]["kind"]] = crd
    return found


def served_version(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return dict(version)


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused where the API server would silently prune them."""
    schema = copy.deepcopy(schema)

    def close(node: dict[str, Any]) -> None:
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for child in node.get("properties", {}).values():
            close(child)
        if isinstance(node.get("items"), dict):
            close(node["items"])

    close(schema)
    return schema


def example_problems(document: dict[str, Any]) -> list[str]:
    crd = crds()[document["kind"]]
    schema = closed(served_version(crd)["schema"]["openAPIV3Schema"])
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in jsonschema.Draft7Validator(schema).iter_errors(document)
    ]


def example(kind: str) -> dict[str, Any]:
    for path in EXAMPLES.glob("*.yaml"):
        document = yaml.safe_load(path.read_text())
        if document["kind"] == kind:
            return dict(document)
    raise AssertionError(f"no example of {kind} in {EXAMPLES}")


def json_path_value(document: dict[str, Any], json_path: str) -> Any:
    value: Any = document
    for key in json_path.lstrip(".").split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths = {prefix} if prefix else set()
    for name, child in schema.get("properties", {}).items():
        paths |= schema_paths(child, f"{prefix}.{name}")
    return paths


def test_defines_the_six_kinds_in_group_tensor_fusion_ai_v1() -> None:
    found = crds()
    assert set(found) == set(EXPECTED)
    for kind, (plural, scope) in EXPECTED.items():
        crd = found[kind]
        assert crd["metadata"]["name"] == f"{plural}.tensor-fusion.ai"
        assert crd["spec"]["group"] == "tensor-fusion.ai"
        assert crd["spec"]["scope"] == scope
        version = served_version(crd)
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        assert version["subresources"] == {"status": {}}
        assert kubernetes_problem(crd) is None


def test_schemas_are_structural() -> None:
    def untyped(node: dict[str, Any], path: str) -> list[str]:
        found = []
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        if not typed and not node.get("x-kubernetes-preserve-unknown-fields"):
            found.append(path)
        for name, child in node.get("properties", {}).items():
            found += untyped(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += untyped(node[key], f"{path}[{key}]")
        return found

    for kind, crd in crds().items():
        assert untyped(served_version(crd)["schema"]["openAPIV3Schema"], kind) == []


def test_kubectl_get_gpu_wide_shows_model_capacity_and_available() -> None:
    columns = served_version(crds()["GPU"])["additionalPrinterColumns"]
    paths = {column["jsonPath"] for column in columns}
    assert {
        ".status.gpuModel",
        ".status.capacity.tflops",
        ".status.capacity.vram",
        ".status.available.tflops",
        ".status.available.vram",
    } <= paths


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_printer_column_points_at_a_field_of_the_schema(kind: str) -> None:
    version = served_version(crds()[kind])
    known = schema_paths(version["schema"]["openAPIV3Schema"]) | {".metadata.creationTimestamp"}
    for column in version["additionalPrinterColumns"]:
        assert column["jsonPath"] in known, column


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_example_is_valid_against_its_crd(kind: str) -> None:
    assert example_problems(example(kind)) == []


def test_seed_columns_show_values_for_the_example_gpu() -> None:
    gpu = example("GPU")
    assert json_path_value(gpu, ".status.gpuModel") == "H100"
    assert json_path_value(gpu, ".status.capacity") == {"tflops": "989.5", "vram": "80Gi"}
    for column in served_version(crds()["GPU"])["additionalPrinterColumns"]:
        if column["name"] != "Age":
            assert json_path_value(gpu, column["jsonPath"]) is not None, column["name"]


@pytest.mark.parametrize(
    ("kind", "path", "bad_value"),
    [
        ("GPU", ["status", "capacity", "vram"], "eighty gigabytes"),
        ("GPU", ["status", "phase"], "Sleeping"),
        (
            "GPUPool",
            ["spec", "nodeManagerConfig", "nodeCompaction", "defrag", "utilizationThresholdPercent"],
            140,
        ),
        ("GPUPool", ["spec", "qosConfig", "defaultQoS"], "platinum"),
        ("GPUNode", ["spec", "manageMode"], "Sometimes"),
        ("GPUResourceQuota", ["spec", "total", "maxWorkers"], "many"),
        ("GPUResourceQuota", ["spec", "total", "requestz"], {"tflops": "1"}),
        ("WorkloadProfile", ["spec", "qos"], "gold"),
        ("WorkloadProfile", ["spec", "gpuCount"], 0),
        ("ProviderConfig", ["spec", "hardwareMetadata", 0, "fp16TFlops"], "fast"),
    ],
)
def test_schema_refuses_a_wrong_value(kind: str, path: list[str], bad_value: Any) -> None:
    document = copy.deepcopy(example(kind))
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad_value
    assert example_problems(document) != []


def test_quantities_accept_kubernetes_spellings() -> None:
    for value in ("80Gi", "81920Mi", "989.5", "500m", 1000, "1e3"):
        gpu = copy.deepcopy(example("GPU"))
        gpu["status"]["capacity"]["vram"] = value
        assert example_problems(gpu) == [], value


def test_examples_folder_holds_one_resource_per_file() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert len(documents) == 1, path.name
        assert documents[0]["apiVersion"] == "tensor-fusion.ai/v1", path.name
