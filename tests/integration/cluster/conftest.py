"""Fixtures for the `Cluster` contract: the same tests on the in-memory fake and the Kubernetes adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from cluster_apiserver import ApiServerState, install
from cluster_harness import Harness, KubernetesHarness, MemoryHarness


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("kubernetes", marks=pytest.mark.integration),
    ]
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        yield MemoryHarness()
        return
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        kubernetes_harness = KubernetesHarness(state, str(server.url).rstrip("/"))
        yield kubernetes_harness
        state.stopping = True
        kubernetes_harness.close()
