"""TensorFusion's sample GPUResourceQuota objects, applied as they are to a real API server, enforced by the
scheduler through a watch (`tfscheduler.quota_source`) with a real Postgres ledger and NATS: `single`
maxima refuse for good, `total.maxWorkers` keeps a pod pending with the quota named, the object's
`status` follows placements and releases within 2 seconds, crossing `alertThresholdPercent` sets the
condition, posts a Warning Event and sets the `tf_quota_*` gauges, and an edit of the object takes
effect within 2 seconds (the times are printed: `docs/quotas.md` quotes them)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from scheduler_builders import a_submission, register_nodes
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.custom_watch import watch_custom_objects
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.model import CustomResource
from tfcommon.config import TfConfig
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.kube_local import LocalKubernetes
from tfcommon.ledger.sql import SqlLedger
from tfcommon.telemetry import setup_telemetry
from tfscheduler.engine import Scheduler
from tfscheduler.quota_source import ClusterQuotas, QuotaStatusWriter, follow_quotas
from tfscheduler.submission import Submission
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.quotas import WatchedQuotas
from tfwebhook.testing import a_pod, opted_in

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)
WITHIN_S = 2.0
SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "tensorfusion_samples" / "v1_gpuresourcequota.yaml"
NAMESPACES = ("production-namespace", "development-namespace", "research-namespace")
DEV = "development-namespace"


def kubectl(control_plane: LocalKubernetes, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def quota_object(control_plane: LocalKubernetes, namespace: str = DEV, name: str = DEV) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        kubectl(control_plane, "get", "gpuresourcequota", name, "-n", namespace, "-o", "json")
    )
    return found


async def until(check: Callable[[], bool], *, within_s: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within_s:
            raise AssertionError(f"{what} not seen within {within_s}s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def used(control_plane: LocalKubernetes, namespace: str = DEV, name: str = DEV) -> dict[str, Any]:
    status = quota_object(control_plane, namespace, name).get("status") or {}
    return dict(status.get("used") or {})


def condition(control_plane: LocalKubernetes, kind: str) -> dict[str, Any]:
    conditions = (quota_object(control_plane).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def alert_events(control_plane: LocalKubernetes) -> list[dict[str, Any]]:
    selector = "reason=QuotaAlertThresholdReached"
    out = kubectl(control_plane, "get", "events", "-n", DEV, "--field-selector", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


async def test_the_sample_quotas_are_enforced_and_report_their_usage(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus
) -> None:
    for namespace in NAMESPACES:
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        kubectl(local_kubernetes, "apply", "-f", "-", stdin=json.dumps(manifest))
    kubectl(local_kubernetes, "apply", "--validate=strict", "-f", str(SAMPLES))
    setup_telemetry("scheduler-quota-tests")
    await register_nodes(ledger, nodes=1, gpus=4)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    cluster = KubernetesCluster.from_environment(
        kubeconfig=str(local_kubernetes.kubeconfig), watch_timeout_s=5
    )
    quotas = ClusterQuotas(scheduler, file_quotas={})
    writer = QuotaStatusWriter(quotas, ledger, cluster, interval_s=0.2)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(follow_quotas(quotas, cluster, stop)), asyncio.create_task(writer.run(stop))]
    try:
        await asyncio.wait_for(quotas.synced.wait(), timeout=10)
        await until(lambda: DEV in scheduler.quotas, within_s=10, what="the sample quotas")
        assert set(NAMESPACES) <= set(scheduler.quotas)
        dev = scheduler.quotas[DEV]
        assert (dev.max_workers, dev.total_requests_tflops_milli, dev.max_gpu_count) == (20, 200_000, 2)

        too_big = await scheduler.submit(a_submission(namespace=DEV, tflops_milli=60_000))
        assert too_big.state == "refused"
        assert too_big.reason == (
            f"GPUResourceQuota {DEV}/{DEV}: single.maxRequests.tflops is 50 per workload, asked 60"
        )

        first = await scheduler.submit(a_submission(namespace=DEV, tflops_milli=40_000))
        assert first.state == "placed"
        seen = await until(
            lambda: used(local_kubernetes).get("workers") == 1, within_s=WITHIN_S, what="status after placing"
        )
        print(f"placement -> GPUResourceQuota status: {seen * 1000:.0f} ms")
        assert used(local_kubernetes)["requests"] == {"tflops": "40", "vram": "8Gi", "compute": "40"}
        assert condition(local_kubernetes, "Ready")["status"] == "True"
        assert condition(local_kubernetes, "AlertThresholdReached")["status"] == "False"

        edited = time.monotonic()
        kubectl(
            local_kubernetes,
            "patch", "gpuresourcequota", DEV, "-n", DEV, "--type=merge",
            "-p", json.dumps({"spec": {"total": {"maxWorkers": 1}}}),
        )  # fmt: skip
        await until(lambda: scheduler.quotas[DEV].max_workers == 1, within_s=WITHIN_S, what="the edit")
        print(f"GPUResourceQuota edit -> scheduler: {(time.monotonic() - edited) * 1000:.0f} ms")
        waiting = await scheduler.submit(a_submission(namespace=DEV, tflops_milli=10_000))
        assert waiting.state == "pending"
        assert waiting.reason == (
            f"GPUResourceQuota {DEV}/{DEV}: total.maxWorkers would be 2 of 1 (in use 1); "
            "waiting for the namespace's usage to fall"
        )
        other = await scheduler.submit(a_submission(namespace="research-namespace", tflops_milli=10_000))
        assert other.state == "placed"

        await until(
            lambda: condition(local_kubernetes, "AlertThresholdReached").get("status") == "True",
            within_s=WITHIN_S,
            what="AlertThresholdReached",
        )
        assert quota_object(local_kubernetes)["status"]["availablePercent"]["workers"] == "0"
        await until(lambda: bool(alert_events(local_kubernetes)), within_s=WITHIN_S, what="the alert Event")
        events = alert_events(local_kubernetes)
        assert [e["type"] for e in events] == ["Warning"]
        assert events[0]["involvedObject"]["kind"] == "GPUResourceQuota"
        assert "workers at 100% of its bound" in events[0]["message"]
        assert exposed_value("tf_quota_alert_threshold_reached", namespace=DEV, quota=DEV) == 1.0
        assert exposed_value("tf_quota_used_percent", namespace=DEV, quota=DEV, resource="workers") == 100.0

        assert await scheduler.release(first.id, "workload-ended")
        released = time.monotonic()
        await until(
            lambda: used(local_kubernetes).get("workers") == 0, within_s=WITHIN_S, what="status after release"
        )
        print(f"release -> GPUResourceQuota status: {(time.monotonic() - released) * 1000:.0f} ms")
        assert await scheduler.retry_pending() == 1
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        cluster.close()
        kubectl(local_kubernetes, "delete", "-f", str(SAMPLES), "--wait=false")


def exposed_value(metric: str, **labels: str) -> float | None:
    """The value `/metrics` shows for `metric` with `labels` (other labels, such as OTel's scope, ignored)."""
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name == metric and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


COMPUTE_NS = "compute-namespace"


def compute_quota_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUResourceQuota",
        "metadata": {"name": "compute", "namespace": COMPUTE_NS},
        "spec": {
            "total": {"limits": {"compute": "100"}},
            "single": {
                "maxLimits": {"compute": "50"},
                "defaultRequests": {"compute": "10", "vram": "1Gi"},
                "defaultLimits": {"compute": "30", "vram": "1Gi"},
            },
        },
    }


def percent_submission(percent: int | None = None, limit: int | None = None) -> Submission:
    return Submission(
        workload=WorkloadRef(namespace=COMPUTE_NS, name=f"pod-{uuid.uuid4().hex[:8]}", uid=str(uuid.uuid4())),
        request=GpuRequest(
            pool="default",
            tflops_request_milli=0,
            tflops_limit_milli=0,
            vram_request_bytes=0,
            vram_limit_bytes=0,
            compute_percent_request=percent,
            compute_percent_limit=limit,
        ),
    )


async def test_compute_percent_defaults_and_maximum_are_applied_by_the_webhook_and_the_scheduler(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": COMPUTE_NS}}
    kubectl(local_kubernetes, "apply", "-f", "-", stdin=json.dumps(namespace))
    kubectl(
        local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=json.dumps(compute_quota_manifest())
    )
    await register_nodes(ledger, nodes=1, gpus=4)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    cluster = KubernetesCluster.from_environment(
        kubeconfig=str(local_kubernetes.kubeconfig), watch_timeout_s=5
    )
    quotas = ClusterQuotas(scheduler, file_quotas={})
    writer = QuotaStatusWriter(quotas, ledger, cluster, interval_s=0.2)
    admission = WatchedQuotas()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(follow_quotas(quotas, cluster, stop)),
        asyncio.create_task(writer.run(stop)),
        asyncio.create_task(
            watch_custom_objects(cluster, CustomResource.GPU_RESOURCE_QUOTA, admission.observe, stop)
        ),
    ]
    try:
        await until(
            lambda: COMPUTE_NS in scheduler.quotas and COMPUTE_NS in admission(), within_s=10, what="quota"
        )

        def admitted(**annotations: str) -> Admitted | Denied:
            pod = a_pod(labels={"tensor-fusion.ai/enabled": "true"}, annotations=opted_in(**annotations))
            return admit(pod, AdmissionContext(TfConfig(), COMPUTE_NS, quota=admission()[COMPUTE_NS]))

        named_none = admitted(isolation="soft")
        assert isinstance(named_none, Admitted), named_none
        request = named_none.request
        assert request is not None
        assert (request.compute_percent_request, request.compute_percent_limit) == (10, 30)
        over = admitted(compute_percent_request="20", compute_percent_limit="60", vram_request="1Gi")
        assert isinstance(over, Denied)
        assert "single.maxLimits.compute is 50% per workload, asked 60%" in over.message

        defaulted = await scheduler.submit(percent_submission())
        assert defaulted.state == "placed"
        record = await ledger.get_allocation(defaulted.id)
        assert record is not None
        share = record.shares[0]
        assert (share.tflops_milli, share.limit_tflops_milli) == (10_000, 30_000)  # of a 100-TFLOPS card
        refused = await scheduler.submit(percent_submission(20, 60))
        assert (refused.state, refused.reason) == (
            "refused",
            f"GPUResourceQuota {COMPUTE_NS}/compute: single.maxLimits.compute is 50% per workload, asked 60%",
        )
        await until(
            lambda: (
                (used(local_kubernetes, COMPUTE_NS, "compute").get("limits") or {}).get("compute") == "30"
            ),
            within_s=WITHIN_S,
            what="used.limits.compute",
        )
        for _ in range(2):
            assert (await scheduler.submit(percent_submission(20, 30))).state == "placed"
        waiting = await scheduler.submit(percent_submission(5, 20))
        assert waiting.state == "pending"
        assert waiting.reason == (
            f"GPUResourceQuota {COMPUTE_NS}/compute: total.limits.compute would be 110 of 100 (in use 90); "
            "waiting for the namespace's usage to fall"
        )

        edited = time.monotonic()
        kubectl(
            local_kubernetes,
            "patch", "gpuresourcequota", "compute", "-n", COMPUTE_NS, "--type=merge",
            "-p", json.dumps({"spec": {"single": {"maxLimits": {"compute": "70"}}}}),
        )  # fmt: skip
        await until(
            lambda: (
                scheduler.quotas[COMPUTE_NS].max_limit_compute == 70
                and isinstance(admitted(compute_percent_request="5", compute_percent_limit="60"), Admitted)
            ),
            within_s=WITHIN_S,
            what="the maxLimits.compute edit",
        )
        took_ms = (time.monotonic() - edited) * 1000
        print(f"GPUResourceQuota maxLimits.compute edit -> webhook and scheduler: {took_ms:.0f} ms")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=10)
        cluster.close()
        kubectl(local_kubernetes, "delete", "namespace", COMPUTE_NS, "--wait=false")


SEVERAL_NS = "several-quotas"


def workers_quota(name: str, workers: int) -> str:
    return json.dumps(
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUResourceQuota",
            "metadata": {"name": name, "namespace": SEVERAL_NS},
            "spec": {"total": {"maxWorkers": workers}},
        }
    )


async def test_with_several_quotas_in_a_namespace_the_last_written_is_in_force(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SEVERAL_NS}}
    kubectl(local_kubernetes, "apply", "-f", "-", stdin=json.dumps(namespace))
    kubectl(local_kubernetes, "apply", "-f", "-", stdin=workers_quota("a-first", 1))
    kubectl(local_kubernetes, "apply", "-f", "-", stdin=workers_quota("b-second", 2))
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    cluster = KubernetesCluster.from_environment(
        kubeconfig=str(local_kubernetes.kubeconfig), watch_timeout_s=5
    )
    quotas = ClusterQuotas(scheduler, file_quotas={})
    admission = WatchedQuotas()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(follow_quotas(quotas, cluster, stop)),
        asyncio.create_task(
            watch_custom_objects(cluster, CustomResource.GPU_RESOURCE_QUOTA, admission.observe, stop)
        ),
    ]
    try:
        await until(lambda: SEVERAL_NS in scheduler.quotas, within_s=10, what="the quotas")
        assert scheduler.quotas[SEVERAL_NS].name == "b-second", "the last created, not the first by name"
        await until(lambda: SEVERAL_NS in admission(), within_s=10, what="the webhook's quotas")
        assert admission()[SEVERAL_NS].name == "b-second"

        edited = time.monotonic()
        kubectl(
            local_kubernetes,
            "patch", "gpuresourcequota", "a-first", "-n", SEVERAL_NS, "--type=merge",
            "-p", json.dumps({"spec": {"total": {"maxWorkers": 5}}}),
        )  # fmt: skip
        await until(
            lambda: (
                scheduler.quotas[SEVERAL_NS].name == "a-first"
                and scheduler.quotas[SEVERAL_NS].max_workers == 5
                and admission()[SEVERAL_NS].name == "a-first"
            ),
            within_s=WITHIN_S,
            what="the edited quota in force",
        )
        print(f"edit of another GPUResourceQuota -> in force: {(time.monotonic() - edited) * 1000:.0f} ms")

        kubectl(local_kubernetes, "delete", "gpuresourcequota", "a-first", "-n", SEVERAL_NS)
        await until(
            lambda: (
                scheduler.quotas.get(SEVERAL_NS) is not None
                and scheduler.quotas[SEVERAL_NS].name == "b-second"
            ),
            within_s=WITHIN_S,
            what="the remaining quota after a delete",
        )
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=10)
        cluster.close()
        kubectl(local_kubernetes, "delete", "namespace", SEVERAL_NS, "--wait=false")
