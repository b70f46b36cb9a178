"""Kubernetes mode acting on a pod's latest state only (kmock over HTTP, real Postgres and NATS JetStream):
an event of a pod from before this scheduler bound it (queued while the binding was in flight, by the
pending-pod retry or the watch) places nothing, so each pod gets exactly one binding request."""

from __future__ import annotations

from typing import Any

import pytest
from k8s_scheduler_support import LONG, api_server, gpu_pod, install_once, register_gpus
from tfcommon.bus import NatsEventBus
from tfcommon.cluster import BindResult, PodEvent, PodEventType
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.manifests import pod_from_manifest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import SchedulerKubernetesSettings
from tfscheduler.engine import Scheduler
from tfscheduler.kubernetes_mode import wire_kubernetes

pytestmark = pytest.mark.integration


async def test_an_event_from_before_the_binding_sends_no_second_binding(
    ledger: SqlLedger, bus: NatsEventBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    await register_gpus(ledger, "gpu-node-1", 1)
    async with api_server() as (state, scaffold, url):
        install_once(scaffold, state)
        pod = pod_from_manifest(state.put("/v1/pods", gpu_pod("trainer")))
        cluster = KubernetesCluster.for_url(url)
        try:
            scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
            await scheduler.start()
            mode = wire_kubernetes(
                scheduler, SchedulerKubernetesSettings(mode="kubernetes"), cluster=cluster
            ).mode

            bind = cluster.bind_pod

            async def bind_as_the_retry_fires(*args: Any, **kwargs: Any) -> BindResult:
                mode.retry_pending()  # the pending-pod retry queues the pod's state before the binding
                return await bind(*args, **kwargs)

            monkeypatch.setattr(cluster, "bind_pod", bind_as_the_retry_fires)
            mode.dispatch(PodEvent(PodEventType.ADDED, pod))
            await mode.drain()
        finally:
            cluster.close()

        bindings = [r for r in scaffold if r.url.path.endswith("/pods/trainer/binding")]
        assert len(bindings) == 1
        assert state.objects[("/v1/pods", "team-a", "trainer")]["spec"]["nodeName"] == "gpu-node-1"
        assert [a.workload.name for a in await ledger.active_allocations()] == ["trainer"]
