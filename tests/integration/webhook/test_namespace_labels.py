"""Automatic migration's `namespaceSelector` in the running webhook: namespace labels read through the
Kubernetes adapter from a test API server (kmock), cached for a short TTL, and read only when needed."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kmock
import pytest
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.model import Namespace
from tfcommon.config_source import ConfigSource
from tfwebhook.http import AdmissionService
from tfwebhook.namespaces import NamespaceLabelCache, local_namespace_labels
from tfwebhook.testing import a_gpu_container, a_pod, a_review

# The Kubernetes API test server of the cluster suite (tests/integration/cluster/cluster_apiserver.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_apiserver import ApiServerState, install

pytestmark = pytest.mark.integration

NAMESPACES = "/v1/namespaces"
SELECTED = """
dynamicConfig:
  autoMigration:
    enable: true
    scope:
      includes:
        namespaceSelector: {matchLabels: {gpu-migration: "on"}}
"""


class Api:
    def __init__(self, state: ApiServerState, cluster: KubernetesCluster) -> None:
        self.state = state
        self.cluster = cluster
        self.reads = 0

    async def get_namespace(self, name: str) -> Namespace | None:
        self.reads += 1
        return await self.cluster.get_namespace(name)


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        cluster = KubernetesCluster.for_url(str(server.url).rstrip("/"))
        try:
            yield Api(state, cluster)
        finally:
            state.stopping = True
            cluster.close()


def label_namespace(api: Api, labels: Mapping[str, str]) -> None:
    api.state.put(
        NAMESPACES,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-team-a", "labels": dict(labels)}},
    )


def native_gpu_pod() -> dict[str, Any]:
    return a_pod(containers=[a_gpu_container()])


async def migrated(service: AdmissionService, uid: str) -> bool:
    status, body = await service.review(a_review(native_gpu_pod(), uid=uid))
    assert status == 200
    return b'"patch"' in body


def config_file(tmp_path: Path, text: str) -> ConfigSource:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return ConfigSource(path)


async def test_the_adapter_reads_namespace_labels(api: Api) -> None:
    label_namespace(api, {"gpu-migration": "on", "team": "a"})
    found = await api.cluster.get_namespace("ml-team-a")
    assert found == Namespace(name="ml-team-a", labels={"gpu-migration": "on", "team": "a"})
    assert await api.cluster.get_namespace("no-such-namespace") is None


async def test_a_namespace_selector_follows_the_labels_after_the_cache_expires(
    api: Api, tmp_path: Path
) -> None:
    now = [0.0]
    labels = NamespaceLabelCache(api.get_namespace, ttl_s=10, clock=lambda: now[0])
    service = AdmissionService(config=config_file(tmp_path, SELECTED), namespace_labels=labels)
    label_namespace(api, {"gpu-migration": "on"})
    assert await migrated(service, "a")
    label_namespace(api, {"gpu-migration": "off"})
    assert await migrated(service, "b"), "answered from the cache within the TTL"
    assert api.reads == 1
    now[0] = 10.5
    assert not await migrated(service, "c")
    assert api.reads == 2


async def test_namespaces_are_not_read_without_a_namespace_selector(api: Api, tmp_path: Path) -> None:
    labels = NamespaceLabelCache(api.get_namespace)
    everywhere = "dynamicConfig: {autoMigration: {enable: true}}\n"
    service = AdmissionService(config=config_file(tmp_path, everywhere), namespace_labels=labels)
    assert await migrated(service, "a")
    assert api.reads == 0


async def test_an_unknown_namespace_or_a_failing_api_server_matches_no_selector(tmp_path: Path) -> None:
    async def failing(name: str) -> Namespace | None:
        raise ConnectionError("API server unreachable")

    async def missing(name: str) -> Namespace | None:
        return None

    for read in (failing, missing):
        service = AdmissionService(
            config=config_file(tmp_path, SELECTED), namespace_labels=NamespaceLabelCache(read)
        )
        assert not await migrated(service, "a")


async def test_local_mode_namespaces_have_no_labels(tmp_path: Path) -> None:
    without = SELECTED.replace(
        'matchLabels: {gpu-migration: "on"}',
        "matchExpressions: [{key: gpu-migration, operator: DoesNotExist}]",
    )
    service = AdmissionService(config=config_file(tmp_path, without), namespace_labels=local_namespace_labels)
    assert await migrated(service, "a")


async def test_concurrent_lookups_of_one_namespace_share_one_read(api: Api) -> None:
    label_namespace(api, {"gpu-migration": "on"})
    labels = NamespaceLabelCache(api.get_namespace)
    found = await asyncio.gather(*(labels("ml-team-a") for _ in range(10)))
    assert found == [{"gpu-migration": "on"}] * 10
    assert api.reads == 1
