"""GPUResourceQuota objects as the scheduler's quotas in Kubernetes mode, and their `status`.

`ClusterQuotas.observe` turns the objects a watch delivers (`tfcommon.cluster.custom_watch`) into the
engine's `quotas` by namespace: the quota file's (`TF_SCHEDULER_QUOTA_FILE`) stay as defaults, an object
replaces its namespace's. One quota per namespace as in TensorFusion: with several, the last one written
(`tfcommon.quota.quota_objects`); the status writer writes only that one's status. An invalid object
keeps its namespace's last good quota (or none) and is logged once. A change
wakes the pods waiting for a quota (`capacity_freed`), so raising a bound places them at once.

`QuotaStatusWriter` keeps each object's `status` (used requests, limits and workers counted from the
ledger, `availablePercent`, conditions `Ready` and `AlertThresholdReached`) within `interval_s` of a
placement or release. When usage first reaches `alertThresholdPercent` it posts a Warning Event
`QuotaAlertThresholdReached` on the object; the gauges `tf_quota_used_percent` (per namespace, quota and
dimension) and `tf_quota_alert_threshold_reached` (0 or 1) are on the scheduler's `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from tfcommon.cluster.manifests import warning_event
from tfcommon.cluster.model import Applied, ClusterError, CustomObject, CustomResource
from tfcommon.ledger.port import Ledger
from tfcommon.quota import quota_objects, quotas_in_force
from tfcommon.runtime import Timer, run_timer
from tfcommon.unsupported_fields import find_condition, same_condition, with_condition

from tfscheduler.core.quota import (
    NamespaceQuota,
    Usage,
    alert_percent,
    alert_reached,
    format_percent,
    quota_status,
    usage_of_shares,
)
from tfscheduler.engine import Scheduler

if TYPE_CHECKING:
    from tfcommon.cluster.kubernetes import KubernetesCluster

log = logging.getLogger("tfscheduler.quota_source")

ALERT_REASON = "QuotaAlertThresholdReached"
STATUS_CONDITIONS = ("Ready", "AlertThresholdReached")
_used_percent: dict[tuple[str, str, str], float] = {}
_alerting: dict[tuple[str, str], int] = {}


class ClusterQuotas:
    """The quotas in force: the file's, with each namespace's GPUResourceQuota object over it."""

    def __init__(self, scheduler: Scheduler, *, file_quotas: Mapping[str, NamespaceQuota]) -> None:
        self.scheduler = scheduler
        self.file_quotas = dict(file_quotas)
        self.objects: dict[str, CustomObject] = {}
        """The object in force per namespace (the status writer's targets)."""
        self.synced = asyncio.Event()
        self.changes = 0
        """How many times the quotas in force changed (tests and `docs/` time an edit's effect)."""
        self._good: dict[str, NamespaceQuota] = {}
        self._reported: dict[str, str] = {}

    def observe(self, objects: Mapping[str, CustomObject]) -> None:
        """Take the watch's current objects (by `namespace/name`); touches no I/O."""
        cluster, problems = quotas_in_force(objects, self._good)
        for namespace, message in problems.items():
            if self._reported.get(namespace) != message:
                log.warning(message, extra={"event": "scheduler.quota_invalid"})
        self._reported = problems
        self._good = cluster
        self.objects = {ns: obj for ns, obj in quota_objects(objects).items() if ns in cluster}
        quotas = {**self.file_quotas, **cluster}
        if quotas != self.scheduler.quotas:
            self.scheduler.quotas = quotas
            self.changes += 1
            self.scheduler.capacity_freed.set()  # a raised bound may let waiting pods in
        self.synced.set()


async def follow_quotas(quotas: ClusterQuotas, cluster: KubernetesCluster, stop: asyncio.Event) -> None:
    """Keep `quotas` current from a watch of GPUResourceQuota objects until `stop` is set."""
    from tfcommon.cluster.custom_watch import watch_custom_objects

    await watch_custom_objects(cluster, CustomResource.GPU_RESOURCE_QUOTA, quotas.observe, stop)


def _observe_used(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(value, {"namespace": ns, "quota": name, "resource": resource})
        for (ns, name, resource), value in list(_used_percent.items())
    ]


def _observe_alerting(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(value, {"namespace": ns, "quota": name}) for (ns, name), value in list(_alerting.items())
    ]


@cache
def _gauges() -> None:
    meter = metrics.get_meter("tfscheduler.quota_source")
    meter.create_observable_gauge(
        "tf_quota_used_percent",
        callbacks=[_observe_used],
        unit="%",
        description="percent of a GPUResourceQuota bound in use, per dimension",
    )
    meter.create_observable_gauge(
        "tf_quota_alert_threshold_reached",
        callbacks=[_observe_alerting],
        description="1 while a GPUResourceQuota's usage is at or above its alertThresholdPercent",
    )


def record_quota_metrics(quota: NamespaceQuota, used: Usage) -> None:
    """Set the quota's gauges for `used`."""
    _gauges()
    name = quota.name or quota.namespace
    fullest = alert_percent(quota, used)
    if fullest is not None:
        _used_percent[(quota.namespace, name, fullest[1])] = float(fullest[0])
    _alerting[(quota.namespace, name)] = int(alert_reached(quota, used))


class QuotaStatusWriter:
    """Writes each GPUResourceQuota object's `status` when its usage changes; `run` until stopped."""

    def __init__(
        self,
        quotas: ClusterQuotas,
        ledger: Ledger,
        cluster: KubernetesCluster,
        *,
        interval_s: float = 0.5,
        reporter: str = "tensor-fusion-scheduler",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.quotas = quotas
        self.ledger = ledger
        self.cluster = cluster
        self.interval_s = interval_s
        self.reporter = reporter
        self.clock = clock
        self._written: dict[str, tuple[str, Usage]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """`sync` now and every `interval_s` until `stop` is set (a runtime timer)."""
        await run_timer("quota-status", Timer(self.interval_s, self._round, at_start=True), stop)

    async def _round(self) -> None:
        try:
            await self.sync()
        except (ClusterError, OSError) as error:
            log.warning("writing GPUResourceQuota status failed, will retry: %s", error)

    async def sync(self) -> int:
        """One round: every quota object whose usage changed gets its status; returns how many."""
        objects = dict(self.quotas.objects)
        in_force = self.quotas.scheduler.quotas
        if not objects:
            return 0
        usage = usage_of_shares(await self.ledger.namespace_shares(sorted(objects)))
        written = 0
        for namespace, obj in objects.items():
            quota = in_force.get(namespace)
            if quota is None:
                continue
            used = usage.get(namespace, Usage())
            record_quota_metrics(quota, used)
            if self._written.get(namespace) == (obj.uid + repr(quota), used) and self._status_current(obj):
                continue
            if await self._write(obj, quota, used):
                self._written[namespace] = (obj.uid + repr(quota), used)
                written += 1
        return written

    @staticmethod
    def _status_current(obj: CustomObject) -> bool:
        return find_condition(obj.status, "Ready") is not None

    async def _write(self, obj: CustomObject, quota: NamespaceQuota, used: Usage) -> bool:
        now = self.clock()
        status = quota_status(quota, used, now)
        latest = self.quotas.objects.get(str(obj.namespace), obj)  # the watch's newest copy
        was_alerting = (find_condition(latest.status, "AlertThresholdReached") or {}).get("status") == "True"
        conditions: Mapping[str, Any] = latest.status
        for condition in status["conditions"]:
            conditions = {"conditions": with_condition(conditions, condition)}
        body = {**status, "conditions": conditions["conditions"]}
        unchanged = all(
            same_condition(find_condition(latest.status, c["type"]), c) for c in status["conditions"]
        ) and {k: latest.status.get(k) for k in ("used", "availablePercent")} == {
            k: status[k] for k in ("used", "availablePercent")
        }
        if not unchanged:
            result = await self.cluster.patch_custom_status(
                obj.kind, obj.name, body, namespace=obj.namespace, resource_version=latest.resource_version
            )
            if not isinstance(result, Applied):
                return False  # written by someone else meanwhile: next round
        if alert_reached(quota, used) and not was_alerting:
            await self._alert(latest, quota, used, now)
        return True

    async def _alert(self, obj: CustomObject, quota: NamespaceQuota, used: Usage, now: datetime) -> None:
        fullest = alert_percent(quota, used)
        assert fullest is not None
        message = (
            f"{quota.label}: {fullest[1]} at {format_percent(fullest[0])}% of its bound, "
            f"at or above alertThresholdPercent {quota.alert_threshold_percent}%"
        )
        log.warning(message, extra={"event": "scheduler.quota_alert"})
        involved = {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUResourceQuota",
            "namespace": obj.namespace,
            "name": obj.name,
            "uid": obj.uid,
            "resourceVersion": obj.resource_version,
        }
        event = warning_event(str(obj.namespace), involved, ALERT_REASON, message, self.reporter, now)
        await asyncio.to_thread(_post_event, self.cluster, str(obj.namespace), event)


def _post_event(cluster: KubernetesCluster, namespace: str, event: Mapping[str, Any]) -> None:
    response = cluster.open_request("POST", f"/api/v1/namespaces/{namespace}/events", None, event)
    raw = response.read()
    if not 200 <= response.status < 300:
        raise ClusterError(response.status, "EventNotRecorded", raw.decode(errors="replace")[:300])
