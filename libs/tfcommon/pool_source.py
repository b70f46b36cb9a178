"""The configuration with its pools read from the cluster's GPUPool objects, kept current through a watch.

In Kubernetes mode every service that uses pool settings serves `ClusterPoolSource.current()` instead of
the file's `ConfigSource.current()`: the same `TfConfig`, whose `gpuPools` are the GPUPool objects (a
pool's `spec` as its `specTemplate`, the annotation `tensor-fusion.ai/is-default-pool: "true"` as
`isDefault`). The YAML file stays the source of everything else and of defaults: a file pool of the same
name is the base the object's spec is merged over, and a file pool with no object stays as it is.

Each object is validated (the `GpuPoolSpec` model, then the service's own `checks` of the sections it
reads). An invalid spec never replaces the pool's last good one: the pool keeps it (or the file's, or is
absent when it never had one), and `follow_gpu_pools` says why in the pool's status (condition
`<Service>SpecValid`, status "False", only that condition replaced) and as a Warning Event
`InvalidPoolSpec` on the pool; services whose account only reads (webhook, metrics) log it instead.
A valid spec is in force as soon as the watch delivers it (milliseconds on a real API server;
`docs/tensorfusion-compatibility.md`). `observe` touches no I/O; the watch and writes are in
`follow_gpu_pools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tfcommon.cluster.manifests import warning_event
from tfcommon.cluster.model import Applied, ClusterError, CustomObject, CustomResource
from tfcommon.config import ConfigProvider, GpuPoolConfig, TfConfig, validation_problems
from tfcommon.config_source import ConfigSource
from tfcommon.unsupported_fields import find_condition, same_condition, with_condition

if TYPE_CHECKING:
    from tfcommon.cluster.kubernetes import KubernetesCluster

log = logging.getLogger(__name__)

DEFAULT_POOL_ANNOTATION = "tensor-fusion.ai/is-default-pool"
EVENT_REASON = "InvalidPoolSpec"
EVENT_NAMESPACE = "default"
POOLS_ENVIRONMENT = "TF_GPU_POOLS"

PoolCheck = Callable[[str, Mapping[str, Any]], Sequence[str]]
"""A service's check of the pool sections it reads: (pool name, merged spec) -> problems (empty: valid)."""


def pools_from_cluster(environment: Mapping[str, str] | None = None) -> bool:
    """Whether pools come from GPUPool objects: `TF_GPU_POOLS=cluster`, or `auto` (the default) in a pod."""
    env = os.environ if environment is None else environment
    choice = env.get(POOLS_ENVIRONMENT, "auto").strip().lower() or "auto"
    if choice not in ("auto", "cluster", "file"):
        raise ValueError(f"{POOLS_ENVIRONMENT}={choice!r}: use auto, cluster or file")
    return choice == "cluster" or (choice == "auto" and bool(env.get("KUBERNETES_SERVICE_HOST")))


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        merged[key] = (
            _merged(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
        )
    return merged


@dataclass(frozen=True)
class PoolVerdict:
    """What one GPUPool object's spec came to: `problems` empty means it is the pool's spec now."""

    pool: CustomObject
    problems: tuple[str, ...]
    kept: str
    """When invalid, what is in force instead: "the last good spec", "the file's", or "none"."""


class ClusterPoolSource:
    """`current()` like `ConfigSource`, with the pools the watch last delivered (thread-safe, cheap)."""

    def __init__(self, file: ConfigSource, *, service: str, checks: Sequence[PoolCheck] = ()) -> None:
        self.file = file
        self.service = service
        self.checks = tuple(checks)
        self.condition_type = f"{service.title().replace('-', '')}SpecValid"
        self.synced = asyncio.Event()
        self.changes = 0
        """How many times the pools in force changed (tests and `docs/` measure the edit -> effect time)."""
        self._lock = threading.Lock()
        self._accepted: dict[str, GpuPoolConfig] = {}
        self._defaults: set[str] = set()
        self._built: tuple[TfConfig, TfConfig] | None = None
        self.verdicts: tuple[PoolVerdict, ...] = ()
        """The verdict on each GPUPool object the watch last delivered."""
        self.listeners: list[Callable[[TfConfig], None]] = []
        """Called with the new configuration each time the pools in force change."""

    @property
    def last_error(self) -> str | None:
        return self.file.last_error

    def current(self) -> TfConfig:
        base = self.file.current()
        with self._lock:
            if self._built is None or self._built[0] is not base:
                self._built = (base, self._build(base))
            return self._built[1]

    def _build(self, base: TfConfig) -> TfConfig:
        annotated = [name for name in sorted(self._defaults) if name in self._accepted]
        file_default = base.default_pool()
        default = annotated[0] if annotated else (file_default.name if file_default else None)
        pools = [entry for entry in base.gpu_pools if entry.name not in self._accepted]
        pools += [self._accepted[name] for name in sorted(self._accepted)]
        pools = [
            p
            if p.is_default == (p.name == default)
            else p.model_copy(update={"is_default": p.name == default})
            for p in pools
        ]
        return base.model_copy(update={"gpu_pools": tuple(pools)})

    def validate(self, obj: CustomObject, base: TfConfig) -> tuple[GpuPoolConfig | None, tuple[str, ...]]:
        """The pool `obj` describes, merged over the file's pool of that name, or why it is invalid."""
        file_entry = base.pool(obj.name)
        template = (
            file_entry.spec_template.model_dump(by_alias=True, exclude_unset=True) if file_entry else {}
        )
        spec = _merged(template, obj.spec)
        try:
            entry = GpuPoolConfig.model_validate({"name": obj.name, "specTemplate": spec})
        except ValidationError as error:
            problems = validation_problems(error)
            return None, tuple(p.replace("specTemplate", "spec", 1) for p in problems)
        problems = [problem for check in self.checks for problem in check(obj.name, spec)]
        return (None, tuple(problems)) if problems else (entry, ())

    def observe(self, objects: Mapping[str, CustomObject]) -> list[PoolVerdict]:
        """Take the watch's GPUPool objects: valid specs are in force from now, invalid ones keep the
        last good; returns a verdict per object."""
        base = self.file.current()
        verdicts = []
        accepted = {k: v for k, v in self._accepted.items() if k in objects}
        for name, obj in sorted(objects.items()):
            entry, problems = self.validate(obj, base)
            if entry is not None:
                accepted[name] = entry
                kept = ""
            elif name in accepted:
                kept = "the last good spec"
            else:
                kept = "the configuration file's pool" if base.pool(name) else "none (the pool is not in use)"
            verdicts.append(PoolVerdict(obj, problems, kept))
        defaults = {
            name for name, obj in objects.items() if obj.annotations.get(DEFAULT_POOL_ANNOTATION) == "true"
        }
        with self._lock:
            changed = accepted != self._accepted or defaults != self._defaults
            if changed:
                self.changes += 1
                self._built = None
            self._accepted = accepted
            self._defaults = defaults
        if changed:
            for listener in self.listeners:
                listener(self.current())
        self.verdicts = tuple(verdicts)
        self.synced.set()
        return verdicts

    def condition(self, verdict: PoolVerdict, now: datetime) -> dict[str, Any]:
        """This service's `<Service>SpecValid` condition for the verdict."""
        if not verdict.problems:
            return {
                "type": self.condition_type,
                "status": "True",
                "reason": "Accepted",
                "message": f"{self.service} uses this spec",
                "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        return {
            "type": self.condition_type,
            "status": "False",
            "reason": EVENT_REASON,
            "message": f"{'; '.join(verdict.problems)}; {self.service} keeps {verdict.kept}",
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def pool_event(pool: CustomObject, message: str, reporter: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Warning Event `InvalidPoolSpec` about a GPUPool (cluster-scoped: kept in `default`)."""
    involved = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "name": pool.name,
        "uid": pool.uid,
        "resourceVersion": pool.resource_version,
    }
    return warning_event(EVENT_NAMESPACE, involved, EVENT_REASON, message, reporter, now)


def _post_event(cluster: KubernetesCluster, event: Mapping[str, Any]) -> None:
    response = cluster.open_request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", None, event)
    raw = response.read()
    if not 200 <= response.status < 300:
        raise ClusterError(response.status, "EventNotRecorded", raw.decode(errors="replace")[:300])


async def _report(
    source: ClusterPoolSource,
    cluster: KubernetesCluster,
    verdict: PoolVerdict,
    reported: dict[str, tuple[str, ...]],
    now: datetime,
) -> None:
    pool = verdict.pool
    condition = source.condition(verdict, now)
    if not same_condition(find_condition(pool.status, source.condition_type), condition):
        result = await cluster.patch_custom_status(
            CustomResource.GPU_POOL,
            pool.name,
            {"conditions": with_condition(pool.status, condition)},
            resource_version=pool.resource_version or None,
        )
        if not isinstance(result, Applied):
            return  # changed meanwhile: the watch delivers it again
    if verdict.problems and reported.get(pool.name) != verdict.problems:
        log.warning("GPUPool %s: %s", pool.name, condition["message"])
        await asyncio.to_thread(
            _post_event, cluster, pool_event(pool, condition["message"], source.service, now)
        )
    reported[pool.name] = verdict.problems


async def follow_gpu_pools(
    source: ClusterPoolSource, cluster: KubernetesCluster, stop: asyncio.Event, *, report: bool = True
) -> None:
    """Watch GPUPool objects into `source` until `stop`; report each verdict that changed (condition,
    Event; reporting failures are logged and retried on the next change). With `report` false (a service
    whose account only reads: the webhook, metrics) an invalid spec is only logged."""
    from tfcommon.cluster.custom_watch import watch_custom_objects

    verdicts: asyncio.Queue[list[PoolVerdict]] = asyncio.Queue()
    reported: dict[str, tuple[str, ...]] = {}

    def on_change(objects: Mapping[str, CustomObject]) -> None:
        verdicts.put_nowait(source.observe(objects))

    async def publish() -> None:
        while True:
            latest = await verdicts.get()
            while not verdicts.empty():
                latest = verdicts.get_nowait()
            for verdict in latest:
                if not report:
                    if verdict.problems and reported.get(verdict.pool.name) != verdict.problems:
                        log.warning("GPUPool %s: %s", verdict.pool.name, "; ".join(verdict.problems))
                    reported[verdict.pool.name] = verdict.problems
                    continue
                try:
                    await _report(source, cluster, verdict, reported, datetime.now(UTC))
                except ClusterError as error:
                    log.warning("reporting on GPUPool %s failed: %s", verdict.pool.name, error)

    reporter = asyncio.create_task(publish())
    try:
        await watch_custom_objects(cluster, CustomResource.GPU_POOL, on_change, stop)
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


def wire_gpu_pools(
    file: ConfigSource,
    *,
    service: str,
    stop: asyncio.Event,
    checks: Sequence[PoolCheck] = (),
    enabled: bool | None = None,
    report: bool = True,
    cluster: KubernetesCluster | None = None,
    on_close: Callable[[Callable[[], None]], object] | None = None,
) -> tuple[ConfigProvider, dict[str, Callable[[], Awaitable[None]]]]:
    """What a service reads its configuration through and the task that keeps it current: in Kubernetes
    mode (`enabled`, default `pools_from_cluster()`) a `ClusterPoolSource` and its `gpu-pools` watch on
    `cluster` (default: the service account's, or $KUBECONFIG; `on_close` registers closing it), else the
    file's source and no task. `report` as for `follow_gpu_pools`."""
    if not (pools_from_cluster() if enabled is None else enabled):
        return file, {}
    if cluster is None:
        from tfcommon.cluster.kubernetes import KubernetesCluster

        cluster = KubernetesCluster.from_environment()
        if on_close is not None:
            on_close(cluster.close)
    source = ClusterPoolSource(file, service=service, checks=checks)
    watched = cluster
    return source, {"gpu-pools": lambda: follow_gpu_pools(source, watched, stop, report=report)}
