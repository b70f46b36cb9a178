"""The Kubernetes permissions `KubernetesCluster` needs, as data, per consumer of the port.

The deploy manifests (`k8s/`) must grant exactly these rules to each service account; a test compares the
two, and `tests/e2e/test_kube_rbac_audit.py` checks them against what the services used in a run (the
API server's audit log). Pure data; when a service starts calling a new verb or resource, add it here and
in `docs/kubernetes.md`; when none calls one any more, take it out.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcommon.cluster.model import CUSTOM_RESOURCE_GROUP


@dataclass(frozen=True)
class PolicyRule:
    """One RBAC rule: `api_group` "" is the core group; resources may name a subresource (`pods/binding`)."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]


_CUSTOM_RESOURCES = ("gpus", "gpunodes", "gpupools", "gpuresourcequotas")
_CUSTOM_STATUS = tuple(f"{plural}/status" for plural in _CUSTOM_RESOURCES)

REQUIRED_RBAC: dict[str, list[PolicyRule]] = {
    "scheduler": [
        PolicyRule("", ("pods",), ("get", "list", "watch")),
        PolicyRule("", ("pods/binding",), ("create",)),
        PolicyRule("", ("pods/eviction",), ("create",)),
        PolicyRule("", ("pods/status",), ("patch",)),
        PolicyRule("", ("events",), ("create",)),
        PolicyRule("", ("nodes",), ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, _CUSTOM_RESOURCES, ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, _CUSTOM_STATUS, ("patch",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpupools", "gpuresourcequotas"), ("watch",)),
    ],
    "webhook": [
        PolicyRule("", ("namespaces",), ("get",)),
        PolicyRule("", ("pods",), ("list",)),
        PolicyRule(
            CUSTOM_RESOURCE_GROUP, ("gpupools", "gpuresourcequotas", "workloadprofiles"), ("list", "watch")
        ),
    ],
    "defrag-planner": [
        PolicyRule("", ("pods",), ("get", "list", "patch")),
        PolicyRule("", ("pods/eviction",), ("create",)),
        PolicyRule("", ("nodes",), ("get", "list", "patch")),
        PolicyRule("policy", ("poddisruptionbudgets",), ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpunodes", "gpupools"), ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpupools/status",), ("patch",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpupools",), ("watch",)),
        PolicyRule("", ("events",), ("create",)),
    ],
    "node-agent": [
        PolicyRule("", ("pods",), ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpunodes",), ("get",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("providerconfigs",), ("list",)),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpus", "gpunodes"), ("create", "patch")),
        PolicyRule(CUSTOM_RESOURCE_GROUP, ("gpus/status", "gpunodes/status"), ("patch",)),
    ],
}
"""Rules per service account. `get` covers the `get_*` methods, `list` the `list_*` ones; gpupools `list` and
`watch` are the GPUPool watch of Kubernetes mode (`tfcommon.pool_source`), `events` create for the defrag
planner its Warning `InvalidPoolSpec`; the scheduler lists every kind whose status it writes (the status
writer's read-back, `tfscheduler.status_writer`); the webhook watches WorkloadProfiles (`tfwebhook.profiles`),
the node agent lists ProviderConfigs once at start for its GPU model table (`tfagent.providers`). RBAC cannot
limit the node agent to its own node's objects (resource names are not known in advance, and `create`
cannot be limited by name): its code only touches the GPUNode named after its node and the GPUs it
discovered there (`tfagent.kubernetes_status`)."""

LEASE_RBAC: dict[str, list[PolicyRule]] = {
    "scheduler": [PolicyRule("coordination.k8s.io", ("leases",), ("get", "create", "update"))],
}
"""Rules per service account granted by a namespaced Role in the service's own namespace: the
leader-election Lease (`KubernetesCluster.get_lease`, `create_lease`, `update_lease`). `get` and `update`
are limited to the Lease's name (`resourceNames`); `create` cannot be, as Kubernetes does not know the
name before the object exists."""
