"""Fixtures for the `Cluster` contract: the same tests on the in-memory fake, on the Kubernetes adapter
against kmock, and on the adapter against a real control plane (`local_kubernetes`, once per session)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from cluster_apiserver import ApiServerState, install
from cluster_control_plane import ControlPlaneHarness
from cluster_harness import Harness, KubernetesHarness, MemoryHarness


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("kubernetes", marks=pytest.mark.integration),
        pytest.param("apiserver", marks=pytest.mark.integration),
    ]
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        yield MemoryHarness()
        return
    if request.param == "apiserver":
        control_plane_harness = ControlPlaneHarness(request.getfixturevalue("local_kubernetes"))
        try:
            yield control_plane_harness
        finally:
            control_plane_harness.close()
        return
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        kubernetes_harness = KubernetesHarness(state, str(server.url).rstrip("/"))
        yield kubernetes_harness
        state.stopping = True
        kubernetes_harness.close()
