"""The webhook service end to end over real TLS: AdmissionReview in and out, events, certificate rotation."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import nats
import pytest
from nats.js.api import DeliverPolicy
from support.polling import eventually
from tfcommon.device_slots import container_request
from tfcommon.events import PodAdmitted, decode
from tfcommon.infra import free_port
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, NatsSettings, WebhookSettings
from tfcommon.tls import TlsFiles
from tfwebhook.app import build
from tfwebhook.testing import a_gpu_container, a_pod, a_review

pytestmark = pytest.mark.integration
SUBJECT = "tf.evt.pod.admitted"


def trusting(cert_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert_file))


class Webhook:
    def __init__(self, url: str, tls: TlsFiles, config_file: Path) -> None:
        self.url = url
        self.tls = tls
        self.config_file = config_file
        self.client = httpx.AsyncClient(base_url=url, verify=trusting(tls.cert_file), timeout=10)

    async def review(self, body: bytes) -> httpx.Response:
        return await self.client.post(
            "/mutate-v1-pod", content=body, headers={"content-type": "application/json"}
        )


@pytest.fixture
async def webhook(
    nats_url: str, webhook_database_url: str, tmp_path: Path, write_certificate: Callable[[Path], TlsFiles]
) -> AsyncIterator[Webhook]:
    tls = write_certificate(tmp_path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text("gpuPools: [{name: default, isDefault: true}]\n")
    port = free_port()
    settings = WebhookSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=webhook_database_url),
        config_file=config_file,
        tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file,
        port=port,
        bind_host="127.0.0.1",
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings, state_dir=tmp_path), stop=stop))
    hook = Webhook(f"https://127.0.0.1:{port}", tls, config_file)

    async def healthy() -> bool | None:
        if service.done():
            service.result()
        try:
            return (await hook.client.get("/healthz")).status_code == 200 or None
        except httpx.TransportError:
            return None

    try:
        await eventually(healthy)
        yield hook
    finally:
        await hook.client.aclose()
        stop.set()
        await asyncio.wait({service}, timeout=30)
        assert service.done()


def gpu_pod(name: str, **annotations: str) -> dict[str, Any]:
    return a_pod(
        name=name,
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared", **annotations},
        containers=[a_gpu_container()],
    )


async def test_admits_a_gpu_pod_with_a_patch_and_publishes_pod_admitted(
    webhook: Webhook, nats_url: str
) -> None:
    name = f"trainer-{uuid4().hex[:6]}"
    dry_name = f"dry-{name}"
    dry = await webhook.review(a_review(gpu_pod(dry_name), uid=f"dry-{name}", dry_run=True))
    assert dry.status_code == 200
    assert dry.json()["response"]["allowed"] is True
    response = await webhook.review(a_review(gpu_pod(name), uid=f"uid-{name}"))
    assert response.status_code == 200
    review = response.json()
    assert review["response"]["uid"] == f"uid-{name}"
    assert review["response"]["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(review["response"]["patch"]))
    assert {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"} in operations
    dry_operations = json.loads(base64.b64decode(dry.json()["response"]["patch"]))
    index_path = "/metadata/annotations/tensor-fusion.ai~1index"
    (index,) = [int(op["value"]) for op in operations if op["path"] == index_path]
    (previewed,) = [int(op["value"]) for op in dry_operations if op["path"] == index_path]
    assert previewed == index, "a dry run previews the index without taking it"
    resource, count = container_request(index)
    assert {
        "op": "add",
        "path": f"/spec/containers/0/resources/limits/{resource.replace('/', '~1')}",
        "value": str(count),
    } in operations

    connection = await nats.connect(nats_url)
    try:
        subscription = await connection.jetstream().subscribe(
            SUBJECT, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        seen: list[PodAdmitted] = []

        async def ours() -> PodAdmitted | None:
            try:
                message = await subscription.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                return None
            event = decode(message.subject, message.data)
            assert isinstance(event, PodAdmitted)
            seen.append(event)
            return event if event.workload.name == name else None

        event = await eventually(ours)
    finally:
        await connection.close()
    assert event.request.isolation == "shared"
    assert event.migrated_resource == "nvidia.com/gpu"
    assert event.workload.namespace == "ml-team-a"
    assert all(earlier.workload.name != dry_name for earlier in seen)


async def test_a_denial_carries_status_code_and_message(webhook: Webhook) -> None:
    response = await webhook.review(a_review(gpu_pod("bad", **{"tensor-fusion.ai/gpu-count": "500"})))
    assert response.status_code == 200
    body = response.json()["response"]
    assert body["allowed"] is False
    assert body["status"]["code"] == 400
    assert "tensor-fusion.ai/gpu-count" in body["status"]["message"]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"{}", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}'],
)
async def test_a_malformed_review_gets_http_400(webhook: Webhook, body: bytes) -> None:
    response = await webhook.review(body)
    assert response.status_code == 400
    assert response.json()["error"]


async def test_a_configuration_change_takes_effect_without_a_restart(webhook: Webhook) -> None:
    pod = gpu_pod("pooled", **{"tensor-fusion.ai/gpupool": "inference"})
    first = (await webhook.review(a_review(pod))).json()["response"]
    assert first["allowed"] is False
    webhook.config_file.write_text("gpuPools: [{name: default, isDefault: true}, {name: inference}]\n")

    async def accepted() -> bool | None:
        return (await webhook.review(a_review(pod))).json()["response"]["allowed"] or None

    await eventually(accepted)


async def test_automatic_migration_of_a_pod_naming_soft_isolation_asks_for_whole_gpus(
    webhook: Webhook,
) -> None:
    """Issue 16 item 7: a native GPU pod migrated automatically that names `isolation: soft` is admitted
    with 100 % of each of its GPUs (TensorFusion's conversion), not denied as asking for nothing."""
    webhook.config_file.write_text(
        "gpuPools: [{name: default, isDefault: true}]\n"
        "dynamicConfig: {autoMigration: {enable: true, scope: {includes: {namespaceNames: [ml-team-a]}}}}\n"
    )
    pod = a_pod(
        name=f"soft-{uuid4().hex[:6]}",
        annotations={"tensor-fusion.ai/isolation": "soft"},
        containers=[a_gpu_container(limits={"nvidia.com/gpu": 2})],
    )

    async def migrated() -> dict[str, Any] | None:
        """The answer once the new configuration is read: until then the pod is admitted unchanged."""
        answer: dict[str, Any] = (await webhook.review(a_review(pod))).json()["response"]
        return answer if "patch" in answer or not answer["allowed"] else None

    answer = await eventually(migrated)
    assert answer["allowed"] is True, answer["status"]["message"]
    operations = json.loads(base64.b64decode(answer["patch"]))
    by_path = {op["path"]: op.get("value") for op in operations}
    assert by_path["/metadata/labels"]["tensor-fusion.ai/enabled"] == "true"
    assert by_path["/metadata/annotations/tensor-fusion.ai~1compute-percent-limit"] == "100"
    assert by_path["/metadata/annotations/tensor-fusion.ai~1compute-percent-request"] == "100"
    assert by_path["/metadata/annotations/tensor-fusion.ai~1gpu-count"] == "2"
    assert {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"} in operations


async def test_a_rotated_certificate_is_served_without_a_restart(
    webhook: Webhook, tmp_path: Path, write_certificate: Callable[[Path], TlsFiles]
) -> None:
    old_cert = tmp_path / "old.crt"
    old_cert.write_bytes(webhook.tls.cert_file.read_bytes())
    rotated = write_certificate(webhook.tls.cert_file.parent)

    async def served_by_new_certificate() -> bool | None:
        async with httpx.AsyncClient(base_url=webhook.url, verify=trusting(rotated.cert_file)) as client:
            try:
                response = await client.post("/mutate-v1-pod", content=a_review(gpu_pod("after-rotation")))
            except httpx.ConnectError:
                return None
            return response.status_code == 200 or None

    await eventually(served_by_new_certificate)
    async with httpx.AsyncClient(base_url=webhook.url, verify=trusting(old_cert)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/healthz")
