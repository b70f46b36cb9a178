"""The device plugins against a test that plays the kubelet over real gRPC on unix sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.polling import eventually
from tfagent.core.deviceplugin import LimiterLibrary
from tfagent.deviceplugin import api_pb2
from tfagent.deviceplugin.server import KUBELET_SOCKET, DevicePlugins, serve_device_plugins
from tfcommon.cluster.manifests import pod_from_manifest
from tfcommon.cluster.model import ContainerResources, Pod
from tfcommon.config import parse_config
from tfcommon.device_slots import INDEX_RESOURCES, POD_INDEX_ANNOTATION, container_request
from tfscheduler.core.binding import bind_annotations
from tfwebhook.core.admission import AdmissionContext, Admitted, admit
from tfwebhook.testing import a_gpu_container, apply
from tfwebhook.testing import a_pod as a_pod_manifest

pytestmark = pytest.mark.integration

GPU_A = "gpu-0a0a0a0a-1111-4000-8000-000000000001"
GPU_B = "gpu-0b0b0b0b-2222-4000-8000-000000000002"
GPU_C = "gpu-0c0c0c0c-3333-4000-8000-000000000003"
H100_MILLI = 989_400


@dataclass
class FakeKubelet:
    """The kubelet's side: a Registration service that records plugins, and a client for each plugin."""

    plugin_dir: Path
    registrations: list[api_pb2.RegisterRequest] = field(default_factory=list)
    server: grpc.aio.Server | None = None

    async def start(self) -> None:
        async def register(
            request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
        ) -> api_pb2.Empty:
            self.registrations.append(request)
            return api_pb2.Empty()

        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    register,
                    request_deserializer=api_pb2.RegisterRequest.FromString,
                    response_serializer=api_pb2.Empty.SerializeToString,
                )
            },
        )
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.plugin_dir / KUBELET_SOCKET}")
        await self.server.start()

    def endpoint(self, resource_name: str) -> str:
        (registration,) = [r for r in self.registrations if r.resource_name == resource_name]
        return f"unix://{self.plugin_dir / registration.endpoint}"

    async def list_devices(self, resource_name: str) -> list[api_pb2.Device]:
        async with grpc.aio.insecure_channel(self.endpoint(resource_name)) as channel:
            stream = channel.unary_stream(
                "/v1beta1.DevicePlugin/ListAndWatch",
                request_serializer=api_pb2.Empty.SerializeToString,
                response_deserializer=api_pb2.ListAndWatchResponse.FromString,
            )(api_pb2.Empty())
            first = await stream.read()
            stream.cancel()
            return list(first.devices)

    async def allocate(self, resource_name: str, *containers: Sequence[str]) -> api_pb2.AllocateResponse:
        async with grpc.aio.insecure_channel(self.endpoint(resource_name)) as channel:
            allocate = channel.unary_unary(
                "/v1beta1.DevicePlugin/Allocate",
                request_serializer=api_pb2.AllocateRequest.SerializeToString,
                response_deserializer=api_pb2.AllocateResponse.FromString,
            )
            request = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers
                ]
            )
            response: api_pb2.AllocateResponse = await allocate(request, timeout=10)
            return response

    async def allocate_for_pod(self, pod_index: int, offset: int = 0) -> api_pb2.AllocateResponse:
        """Allocate one container of the pod with `pod_index`, as the kubelet would pick devices."""
        resource_name, count = container_request(pod_index)
        devices = await self.list_devices(resource_name)
        return await self.allocate(resource_name, [d.ID for d in devices[offset : offset + count]])


def a_pod(
    name: str,
    pod_index: int,
    gpus: Sequence[str],
    *,
    containers: Sequence[str] = ("main",),
    isolation: str = "soft",
    extra: dict[str, str] | None = None,
) -> Pod:
    resource_name, count = container_request(pod_index)
    return Pod(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        node_name="node-a",
        annotations={
            POD_INDEX_ANNOTATION: str(pod_index),
            "tensor-fusion.ai/gpu-ids": ",".join(gpus),
            "tensor-fusion.ai/isolation": isolation,
            **(extra or {}),
        },
        containers=tuple(ContainerResources(c, limits={resource_name: str(count)}) for c in containers),
    )


@dataclass
class Node:
    kubelet: FakeKubelet
    plugins: DevicePlugins
    pods: list[Pod]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    pods: list[Pod] = []

    async def list_pods() -> Sequence[Pod]:
        return tuple(pods)

    plugins = DevicePlugins(
        plugin_dir,
        list_pods,
        lambda: {GPU_A: H100_MILLI, GPU_B: H100_MILLI},
        LimiterLibrary(host_path="/opt/hami/libvgpu.so"),
    )
    await plugins.start_and_register()
    try:
        yield Node(kubelet, plugins, pods)
    finally:
        await plugins.stop()
        assert kubelet.server is not None
        await kubelet.server.stop(grace=None)


async def test_every_index_resource_registers_with_the_kubelet_and_lists_healthy_devices(node: Node) -> None:
    registrations = node.kubelet.registrations

    assert sorted(r.resource_name for r in registrations) == sorted(
        f"tensor-fusion.ai/index_{k:x}" for k in range(INDEX_RESOURCES)
    )
    assert {r.version for r in registrations} == {"v1beta1"}
    assert all((node.plugins.plugin_dir / r.endpoint).is_socket() for r in registrations)
    devices = await node.kubelet.list_devices("tensor-fusion.ai/index_3")
    assert len(devices) >= 8
    assert {d.health for d in devices} == {"Healthy"}


async def test_allocate_gives_the_container_exactly_the_pods_gpus_and_its_limits(node: Node) -> None:
    node.pods.append(
        a_pod(
            "train",
            19,
            [GPU_A, GPU_B],
            extra={"tensor-fusion.ai/vram-limit": "16Gi", "tensor-fusion.ai/tflops-limit": "100"},
        )
    )

    response = await node.kubelet.allocate_for_pod(19)

    (container,) = response.container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_A[4:]},GPU-{GPU_B[4:]}"
    assert container.envs["TF_GPU_MEMORY_LIMIT"] == str(16 * 1024**3)
    assert container.envs["CUDA_DEVICE_MEMORY_LIMIT"] == "16384m"
    assert container.envs["CUDA_DEVICE_SM_LIMIT"] == "11"
    assert container.envs["LD_PRELOAD"] == "/usr/local/tfpool/libvgpu.so"
    assert [(m.host_path, m.read_only) for m in container.mounts] == [("/opt/hami/libvgpu.so", True)]


async def test_shared_isolation_gets_whole_cards_and_no_limiter(node: Node) -> None:
    node.pods.append(a_pod("shared", 5, [GPU_B], isolation="shared"))

    (container,) = (await node.kubelet.allocate_for_pod(5)).container_responses

    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": f"GPU-{GPU_B[4:]}"}
    assert list(container.mounts) == []


async def test_pods_starting_at_the_same_time_each_get_their_own_gpus(node: Node) -> None:
    node.pods.extend(
        [
            a_pod("first", 8, [GPU_A], isolation="shared"),
            a_pod("second", 9, [GPU_B], isolation="shared"),
            a_pod("third", 40, [GPU_A, GPU_B], isolation="shared"),
        ]
    )

    first, second, third = await asyncio.gather(
        node.kubelet.allocate_for_pod(8, offset=0),
        node.kubelet.allocate_for_pod(9, offset=1),
        node.kubelet.allocate_for_pod(40),
    )

    assert first.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_A[4:]}"
    assert second.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_B[4:]}"
    assert third.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_A[4:]},GPU-{GPU_B[4:]}"


async def test_each_container_gets_its_own_gpus_from_container_gpus_and_a_retry_gets_the_same(
    node: Node,
) -> None:
    container_gpus = json.dumps({"trainer": [GPU_A], "evaluator": [GPU_B]})
    node.pods.append(
        a_pod(
            "split",
            2,
            [GPU_A, GPU_B],
            containers=("trainer", "evaluator"),
            isolation="shared",
            extra={"tensor-fusion.ai/container-gpus": container_gpus},
        )
    )
    resource_name, count = container_request(2)
    device_ids = [d.ID for d in await node.kubelet.list_devices(resource_name)]
    trainer_devices, evaluator_devices = device_ids[:count], device_ids[count : 2 * count]

    trainer = await node.kubelet.allocate(resource_name, trainer_devices)
    retried = await node.kubelet.allocate(resource_name, trainer_devices)
    evaluator = await node.kubelet.allocate(resource_name, evaluator_devices)

    assert trainer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_A[4:]}"
    assert retried.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_A[4:]}"
    assert evaluator.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{GPU_B[4:]}"


def visible_gpus(response: api_pb2.AllocateResponse) -> list[str]:
    """The GPU UUIDs (our lower-case spelling) in the one container's `NVIDIA_VISIBLE_DEVICES`."""
    (container,) = response.container_responses
    visible = container.envs["NVIDIA_VISIBLE_DEVICES"]
    return [f"gpu-{uuid.removeprefix('GPU-')}" for uuid in visible.split(",")]


NATIVE_ONE_AND_TWO = a_pod_manifest(
    containers=[
        a_gpu_container("loader", {"nvidia.com/gpu": 1}),
        a_gpu_container("trainer", {"nvidia.com/gpu": 2}),
    ]
)
ANNOTATED_ONE_AND_TWO = a_pod_manifest(
    labels={"tensor-fusion.ai/enabled": "true"},
    annotations={
        "tensor-fusion.ai/isolation": "shared",
        "tensor-fusion.ai/inject-container": "loader,trainer",
        "tensor-fusion.ai/container-gpu-count": '{"loader":1,"trainer":2}',
    },
    containers=[{"name": "loader", "image": "img"}, {"name": "trainer", "image": "img"}],
)


@pytest.mark.parametrize(
    "manifest",
    [
        pytest.param(NATIVE_ONE_AND_TWO, id="native-limits-migrated"),
        pytest.param(ANNOTATED_ONE_AND_TWO, id="container-gpu-count-annotation"),
    ],
)
async def test_containers_asking_for_one_and_two_gpus_each_get_that_many_cards_of_their_own(
    node: Node, manifest: dict[str, Any]
) -> None:
    """The whole path a pod takes: the webhook converts it (native limits 1 and 2 under automatic
    migration, or its own `container-gpu-count`), the scheduler's Binding annotations split its 3 GPUs,
    and the kubelet allocates each container over gRPC."""
    migrating = parse_config(
        "dynamicConfig: {autoMigration: {enable: true, scope: {includes: {namespaceNames: [ml-team-a]}}}}"
    )
    verdict = admit(manifest, AdmissionContext(migrating, pod_index=21))
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None, verdict.reason
    assert verdict.request.gpu_count == 3
    admitted = pod_from_manifest(apply(manifest, verdict.patch))
    bound = replace(
        admitted,
        uid="uid-native-split",
        node_name="node-a",
        annotations={**admitted.annotations, **bind_annotations(admitted, [GPU_A, GPU_B, GPU_C])},
    )
    node.pods.append(bound)
    resource_name, count = container_request(21)
    device_ids = [d.ID for d in await node.kubelet.list_devices(resource_name)]

    loader = visible_gpus(await node.kubelet.allocate(resource_name, device_ids[:count]))
    trainer = visible_gpus(await node.kubelet.allocate(resource_name, device_ids[count : 2 * count]))

    assert (len(loader), len(trainer)) == (1, 2)
    assert len({*loader, *trainer}) == 3
    assert {*loader, *trainer} == {GPU_A, GPU_B, GPU_C}


async def test_an_unknown_pod_index_is_refused_with_a_message_the_kubelet_shows(node: Node) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.kubelet.allocate_for_pod(77)

    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "tensor-fusion.ai/index=77" in str(refused.value.details())


async def test_a_pod_not_yet_bound_to_gpus_is_refused(node: Node) -> None:
    node.pods.append(a_pod("early", 12, []))

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.kubelet.allocate_for_pod(12)

    assert "has no tensor-fusion.ai/gpu-ids yet" in str(refused.value.details())


async def test_the_plugins_register_again_when_the_kubelet_restarts(tmp_path: Path) -> None:
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()

    async def no_pods() -> Sequence[Pod]:
        return ()

    stopping = asyncio.Event()
    restarted = FakeKubelet(plugin_dir)
    serving = asyncio.create_task(
        serve_device_plugins(DevicePlugins(plugin_dir, no_pods, dict), stopping, check_interval_s=0.05)
    )
    try:
        await eventually(lambda: len(kubelet.registrations) == INDEX_RESOURCES, timeout_s=10.0, every_s=0.02)
        assert kubelet.server is not None
        await kubelet.server.stop(grace=None)
        for leftover in plugin_dir.iterdir():
            leftover.unlink()
        await restarted.start()

        await eventually(
            lambda: len(restarted.registrations) == INDEX_RESOURCES, timeout_s=10.0, every_s=0.02
        )
        devices = await restarted.list_devices("tensor-fusion.ai/index_0")
        assert len(devices) >= 8
    finally:
        stopping.set()
        await asyncio.wait_for(serving, timeout=10)
        if restarted.server is not None:
            await restarted.server.stop(grace=None)
    assert not list(plugin_dir.glob("tfpool-*.sock"))
