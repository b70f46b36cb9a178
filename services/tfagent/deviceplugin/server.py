"""The kubelet device plugins (v1beta1 gRPC over unix sockets): one per index resource, 16 in all.

Each plugin serves `tensor-fusion.ai/index_<k>` on its own socket in the kubelet's device-plugin folder,
registers with the kubelet (`kubelet.sock`), streams its virtual devices (ListAndWatch) and answers
`Allocate` from the pods on this node through `tfagent.core.deviceplugin`. Handlers are registered
generically from the message classes, so only `api_pb2` is generated code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import grpc
from tfcommon.cluster.model import Pod
from tfcommon.device_slots import INDEX_RESOURCES, DeviceSlotError, index_resource_name

from tfagent.core.deviceplugin import (
    AllocationRefusedError,
    AnsweredContainers,
    LimiterLibrary,
    advertised_device_ids,
    grant_container,
)
from tfagent.deviceplugin import api_pb2

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
HEALTHY = "Healthy"

PodLister = Callable[[], Awaitable[Sequence[Pod]]]
"""Returns the pods bound to this node (Kubernetes: a field-selector list through the Cluster port)."""

log = logging.getLogger("tfagent.deviceplugin")


def socket_name(resource: int) -> str:
    return f"tfpool-index-{resource:x}.sock"


class IndexDevicePlugin:
    """The device plugin of one index resource: the `v1beta1.DevicePlugin` service on one unix socket."""

    def __init__(
        self,
        resource: int,
        plugin_dir: Path,
        list_pods: PodLister,
        gpu_capacity_milli: Callable[[], Mapping[str, int]],
        limiter: LimiterLibrary | None = None,
    ) -> None:
        self.resource = resource
        self.resource_name = index_resource_name(resource)
        self.socket_path = plugin_dir / socket_name(resource)
        self._list_pods = list_pods
        self._gpu_capacity_milli = gpu_capacity_milli
        self._limiter = limiter
        self._answered = AnsweredContainers()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._handlers(),))
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def register(self, kubelet_socket: Path) -> None:
        """Tell the kubelet this plugin exists; it then connects to our socket (endpoint = file name)."""
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            register = channel.unary_unary(
                "/v1beta1.Registration/Register",
                request_serializer=api_pb2.RegisterRequest.SerializeToString,
                response_deserializer=api_pb2.Empty.FromString,
            )
            await register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_path.name,
                    resource_name=self.resource_name,
                    options=api_pb2.DevicePluginOptions(),
                ),
                timeout=10,
            )

    async def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            await self._server.stop(grace=1)
        self.socket_path.unlink(missing_ok=True)

    def _handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "v1beta1.DevicePlugin",
            {
                "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                    self._options,
                    request_deserializer=api_pb2.Empty.FromString,
                    response_serializer=api_pb2.DevicePluginOptions.SerializeToString,
                ),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self._list_and_watch,
                    request_deserializer=api_pb2.Empty.FromString,
                    response_serializer=api_pb2.ListAndWatchResponse.SerializeToString,
                ),
                "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                    self._preferred_allocation,
                    request_deserializer=api_pb2.PreferredAllocationRequest.FromString,
                    response_serializer=api_pb2.PreferredAllocationResponse.SerializeToString,
                ),
                "Allocate": grpc.unary_unary_rpc_method_handler(
                    self._allocate,
                    request_deserializer=api_pb2.AllocateRequest.FromString,
                    response_serializer=api_pb2.AllocateResponse.SerializeToString,
                ),
                "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                    self._pre_start,
                    request_deserializer=api_pb2.PreStartContainerRequest.FromString,
                    response_serializer=api_pb2.PreStartContainerResponse.SerializeToString,
                ),
            },
        )

    async def _options(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def _list_and_watch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        devices = [
            api_pb2.Device(ID=device_id, health=HEALTHY) for device_id in advertised_device_ids(self.resource)
        ]
        yield api_pb2.ListAndWatchResponse(devices=devices)
        await self._stopping.wait()

    async def _preferred_allocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        return api_pb2.PreferredAllocationResponse()

    async def _pre_start(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    async def _allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        pods = await self._list_pods()
        responses = []
        async with self._lock:
            self._answered.forget_pods_except({pod.uid for pod in pods})
            for container_request in request.container_requests:
                device_ids = list(container_request.devices_ids)
                try:
                    grant = grant_container(
                        self.resource,
                        device_ids,
                        pods,
                        self._answered,
                        self._gpu_capacity_milli(),
                        self._limiter,
                    )
                except (AllocationRefusedError, DeviceSlotError) as error:
                    log.warning(
                        str(error), extra={"event": "deviceplugin.refused", "resource": self.resource_name}
                    )
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
                log.info(
                    "container allocated",
                    extra={
                        "event": "deviceplugin.allocated",
                        "pod_uid": grant.pod_uid,
                        "container": grant.container,
                    },
                )
                responses.append(
                    api_pb2.ContainerAllocateResponse(
                        envs=dict(grant.envs),
                        mounts=[
                            api_pb2.Mount(
                                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                            )
                            for m in grant.mounts
                        ],
                    )
                )
        return api_pb2.AllocateResponse(container_responses=responses)


class DevicePlugins:
    """All 16 index plugins: start them, register each with the kubelet, stop them."""

    def __init__(
        self,
        plugin_dir: Path,
        list_pods: PodLister,
        gpu_capacity_milli: Callable[[], Mapping[str, int]],
        limiter: LimiterLibrary | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.plugins = tuple(
            IndexDevicePlugin(resource, plugin_dir, list_pods, gpu_capacity_milli, limiter)
            for resource in range(INDEX_RESOURCES)
        )

    async def start_and_register(self) -> None:
        for plugin in self.plugins:
            await plugin.start()
        for plugin in self.plugins:
            await plugin.register(self.plugin_dir / KUBELET_SOCKET)

    async def stop(self) -> None:
        await asyncio.gather(*(plugin.stop() for plugin in self.plugins))


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns)


async def serve_device_plugins(
    plugins: DevicePlugins, stopping: asyncio.Event, check_interval_s: float = 5.0
) -> None:
    """Run the plugins until `stopping`; when the kubelet restarts (a new `kubelet.sock`), register again."""
    kubelet_socket = plugins.plugin_dir / KUBELET_SOCKET
    await plugins.start_and_register()
    registered_with = _socket_identity(kubelet_socket)
    try:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=check_interval_s)
            current = _socket_identity(kubelet_socket)
            if current is not None and current != registered_with:
                # A restarted kubelet deletes every socket in its folder: serve anew, then register again.
                log.info("kubelet restarted; registering again", extra={"event": "deviceplugin.reregister"})
                await plugins.stop()
                await plugins.start_and_register()
                registered_with = current
    finally:
        await plugins.stop()
