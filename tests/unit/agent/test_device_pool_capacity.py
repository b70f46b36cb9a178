from tfagent.core.deviceplugin import advertised_device_ids
from tfcommon.device_slots import container_request


def test_one_index_block_of_pods_with_many_containers_fits_in_the_advertised_devices() -> None:
    injected_containers_per_pod = 16
    for block in range(16):
        demand: dict[str, int] = {}
        for pod_index in range(block * 8, block * 8 + 8):
            resource, count = container_request(pod_index)
            demand[resource] = demand.get(resource, 0) + count * injected_containers_per_pod
        (resource_name, needed), *_ = demand.items()
        assert len(demand) == 1, "the eight pod indexes of a block share one resource"
        assert needed <= len(advertised_device_ids(block)), resource_name


def test_advertised_device_ids_are_unique_per_resource() -> None:
    ids = advertised_device_ids(3)
    assert len(set(ids)) == len(ids)
    assert all(device.startswith("index-3-") for device in ids)
