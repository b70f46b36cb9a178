"""The pod-index scheme the webhook writes and the device plugin decodes, and the generated gRPC code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tfagent.deviceplugin import codegen
from tfcommon.device_slots import (
    POD_INDEX_COUNT,
    DeviceSlotError,
    container_request,
    pod_index_from_annotation,
    pod_index_of,
)


def test_every_pod_index_round_trips_through_a_resource_and_a_device_count() -> None:
    decoded = set()
    for pod_index in range(POD_INDEX_COUNT):
        resource_name, count = container_request(pod_index)
        resource = int(resource_name.removeprefix("tensor-fusion.ai/index_"), 16)
        decoded.add(pod_index_of(resource, count))
        assert 1 <= count <= 8

    assert decoded == set(range(POD_INDEX_COUNT))


def test_examples_match_the_documented_scheme() -> None:
    assert container_request(0) == ("tensor-fusion.ai/index_0", 1)
    assert container_request(19) == ("tensor-fusion.ai/index_2", 4)
    assert container_request(127) == ("tensor-fusion.ai/index_f", 8)


@pytest.mark.parametrize(("resource", "count"), [(0, 0), (0, 9), (16, 1)])
def test_requests_outside_the_scheme_are_refused_with_the_rule(resource: int, count: int) -> None:
    with pytest.raises(DeviceSlotError):
        pod_index_of(resource, count)


def test_only_valid_index_annotations_are_read() -> None:
    assert [pod_index_from_annotation(v) for v in ("7", " 12 ", "128", "-1", "x", None)] == [
        7,
        12,
        None,
        None,
        None,
        None,
    ]


def test_the_committed_grpc_code_is_what_api_proto_generates(tmp_path: Path) -> None:
    committed = Path(codegen.__file__).parent

    # A subprocess: grpc_tools' bundled protobuf would abort this process when OR-Tools loads later.
    subprocess.run([sys.executable, "-m", codegen.__name__, str(tmp_path)], check=True, capture_output=True)
    for name in codegen.GENERATED:
        generated = tmp_path / Path(codegen.PROTO).parent / name
        assert generated.read_text() == (committed / generated.name).read_text(), (
            f"{generated.name} is stale: run `python -m tfagent.deviceplugin.codegen` and commit the result"
        )
