"""Composition root of the admission webhook service (HTTPS, `POST /mutate-v1-pod`).

Only wiring lives here: `compose` plugs the admission router and its tasks into the shared runtime
(`tfcommon.runtime`); admission decisions live in `tfwebhook.core`. The server always speaks HTTPS:
with `TF_TLS_CERT_FILE` / `TF_TLS_KEY_FILE` when given, else with a self-signed pair generated once
under `<state dir>/certs/`. In a Kubernetes cluster (`KUBERNETES_SERVICE_HOST` or `KUBECONFIG` set)
namespace labels for `namespaceSelector` scopes, and the taken-over pods of a workload whose
`enabled-replicas` is full (`tfwebhook.takeover_recheck`), are read from the API server; locally
namespaces have no labels. Nothing is built at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from tfcommon.config import ConfigError
from tfcommon.config_source import ConfigSource
from tfcommon.ledger.recommendations import RecommendationCache, RecommendationStore
from tfcommon.ledger.takeover import TakeoverGate, TakeoverLedger
from tfcommon.pool_source import wire_gpu_pools
from tfcommon.runtime import (
    Components,
    ServiceContext,
    ServiceSpec,
    StartupError,
    Timer,
    freeze_startup_heap,
    run_service,
)
from tfcommon.settings import WebhookSettings
from tfcommon.tls import TlsFiles, ensure_self_signed

from tfwebhook.http import (
    CERTIFICATE_CHECK_S,
    AdmissionService,
    CertificateReloader,
    NamespaceLabels,
    build_router,
    front_routes,
)
from tfwebhook.namespaces import NamespaceLabelCache, local_namespace_labels
from tfwebhook.pod_index import SequencePodIndices
from tfwebhook.profiles import wire_profiles
from tfwebhook.quotas import wire_quotas
from tfwebhook.takeover_recheck import TakeoverRecheck

if TYPE_CHECKING:
    from tfcommon.cluster.kubernetes import KubernetesCluster

SERVICE = "webhook"
DEFAULT_STATE_DIR = Path(".tf")
NAMESPACE_LABELS_TTL_S = 10.0
RECOMMENDATIONS_REFRESH_S = 30.0
"""How often the webhook's copy of the stored autoscaling recommendations (`workload_recommendation`) is
read again, off the admission path; admissions read only the copy, and a failed read keeps the last one."""


def kubernetes_cluster(cleanup: AsyncExitStack) -> KubernetesCluster | None:
    """The API server's client in a cluster (`KUBERNETES_SERVICE_HOST` or `KUBECONFIG`); None locally."""
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("KUBECONFIG")):
        return None
    from tfcommon.cluster.kubernetes import KubernetesCluster

    cluster = KubernetesCluster.from_environment()
    cleanup.callback(cluster.close)
    return cluster


def namespace_labels(cluster: KubernetesCluster | None) -> NamespaceLabels:
    """Namespace labels from the API server (cached) in a cluster; none in local mode."""
    if cluster is None:
        return local_namespace_labels
    return NamespaceLabelCache(cluster.get_namespace, ttl_s=NAMESPACE_LABELS_TTL_S)


def composer(tls: TlsFiles) -> Callable[[ServiceContext[WebhookSettings]], Awaitable[Components]]:
    """The webhook's composition: admission route (ahead of FastAPI's middleware), takeover ledger, pod
    indexes, namespace labels, config and certificate reload."""

    async def compose(context: ServiceContext[WebhookSettings]) -> Components:
        try:
            config = ConfigSource(context.settings.config_file)
        except ConfigError as error:
            raise StartupError(f"TF_CONFIG_FILE: {error}") from None
        takeovers = TakeoverGate(
            TakeoverLedger(context.database),
            full_ttl_s=config.current().webhook.takeover_full_cache_seconds,
        )
        recommendations = RecommendationCache(RecommendationStore(context.database))
        pod_indices = SequencePodIndices(context.database)
        context.cleanup.push_async_callback(pod_indices.close)
        pools, pool_tasks = wire_gpu_pools(
            config, service="webhook", stop=context.stopping, report=False, on_close=context.cleanup.callback
        )
        quotas, quota_tasks = wire_quotas(context.stopping, context.cleanup.callback)
        profiles, profile_tasks = wire_profiles(context.stopping, context.cleanup.callback)
        cluster = kubernetes_cluster(context.cleanup)
        service = AdmissionService(
            config=pools,
            bus=context.bus,
            takeovers=takeovers,
            takeover_recheck=None
            if cluster is None
            else TakeoverRecheck(TakeoverLedger(context.database), cluster.list_pods),
            namespace_labels=namespace_labels(cluster),
            pod_indices=pod_indices,
            recommendations=recommendations.current,
            quotas=quotas,
            profiles=profiles,
        )
        context.cleanup.push_async_callback(service.drain)
        timers = {"recommendations": Timer(RECOMMENDATIONS_REFRESH_S, recommendations.refresh, at_start=True)}
        if context.ssl_context is not None:
            reloader = CertificateReloader(context.ssl_context, tls.cert_file, tls.key_file)
            timers["certificate-reload"] = Timer(CERTIFICATE_CHECK_S, reloader.round, at_start=True)
        freeze_startup_heap()
        return Components(
            routers=[build_router(service)],
            timers=timers,
            tasks={**pool_tasks, **quota_tasks, **profile_tasks},
            front_routes=front_routes(service),
        )

    return compose


def tls_files(settings: WebhookSettings, state_dir: Path) -> TlsFiles:
    """The configured certificate pair, or a self-signed one under `state_dir/certs` when none is set."""
    cert_file, key_file = settings.tls_cert_file, settings.tls_key_file
    if cert_file is None and key_file is None:
        return ensure_self_signed(state_dir / "certs")
    if cert_file is None or key_file is None:
        raise StartupError(
            "TF_TLS_CERT_FILE and TF_TLS_KEY_FILE must be set together (or neither, for a self-signed pair)"
        )
    for variable, path in (("TF_TLS_CERT_FILE", cert_file), ("TF_TLS_KEY_FILE", key_file)):
        if not path.is_file():
            raise StartupError(
                f"{variable}={path}: no such file; give a PEM file or unset both TLS variables"
            )
    return TlsFiles(cert_file=cert_file, key_file=key_file)


def build(settings: WebhookSettings, state_dir: Path = DEFAULT_STATE_DIR) -> ServiceSpec[WebhookSettings]:
    """The webhook service as the runtime runs it, over HTTPS."""
    tls = tls_files(settings, state_dir)
    return ServiceSpec(
        name=SERVICE,
        settings=settings,
        port=settings.port,
        compose=composer(tls),
        tls=tls,
    )


def main() -> int:
    try:
        spec = build(WebhookSettings())
    except StartupError as error:
        sys.stderr.write(f"webhook: {error}\n")
        return 2
    return run_service(spec)
