"""`tfcommon.quota.quota_objects`: with several GPUResourceQuotas in a namespace, the last one written is in
force, as in TensorFusion's quota store (one entry per namespace, replaced by each object delivered)."""

from __future__ import annotations

from tfcommon.cluster.model import CustomObject, CustomResource
from tfcommon.quota import quota_objects, quotas_in_force


def quota(name: str, version: str, namespace: str = "team-a", max_workers: int = 1) -> CustomObject:
    return CustomObject(
        kind=CustomResource.GPU_RESOURCE_QUOTA,
        name=name,
        namespace=namespace,
        resource_version=version,
        spec={"total": {"maxWorkers": max_workers}},
    )


def by_key(*objects: CustomObject) -> dict[str, CustomObject]:
    return {f"{obj.namespace}/{obj.name}": obj for obj in objects}


def test_the_last_written_quota_of_a_namespace_is_in_force() -> None:
    objects = by_key(
        quota("a", "30", max_workers=3), quota("b", "12"), quota("c", "7"), quota("z", "1", "ml")
    )

    chosen = quota_objects(objects)

    assert {ns: obj.name for ns, obj in chosen.items()} == {"team-a": "a", "ml": "z"}
    quotas, problems = quotas_in_force(objects, {})
    assert (quotas["team-a"].name, quotas["team-a"].max_workers, problems) == ("a", 3, {})
    edited = by_key(quota("a", "30"), quota("b", "31"))
    assert quota_objects(edited)["team-a"].name == "b"


def test_without_numeric_versions_the_last_by_name_wins() -> None:
    assert quota_objects(by_key(quota("b", ""), quota("a", "")))["team-a"].name == "b"
