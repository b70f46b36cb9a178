"""The `tensor-fusion.ai/*` keys a pod may carry, and the denial for any other. Pure: no I/O.

A pod's labels and annotations with the prefix must be keys we read or write, or keys of TensorFusion's
vocabulary that we accept and ignore (`docs/webhook.md` lists them all, with what each does here).
Anything else is a misspelling that would otherwise be ignored without a word, so `unknown_keys`
names it, with the closest known key (difflib) when there is one, or says that a key belongs in the
other section (an annotation written as a label, or the reverse).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from tfcommon.pod_spec import PREFIX

READ_ANNOTATIONS = frozenset(
    PREFIX + key
    for key in (
        "tflops-request",
        "tflops-limit",
        "vram-request",
        "vram-limit",
        "compute-percent-request",
        "compute-percent-limit",
        "gpu-count",
        "gpu-indices",
        "gpupool",
        "qos",
        "isolation",
        "is-local-gpu",
        "inject-container",
        "gpu-model",
        "vendor",
        "dedicated-gpu",
        "enabled-replicas",
        "autoscale",
        "autoscale-target",
        "eviction-protection",
        "workload-profile",
        "gang-enabled",
        "gang-min-members",
        "gang-timeout",
        "gang-required-members",
        "gang-group-key",
    )
)
"""Annotations the webhook or the scheduler reads from a pod (the scheduler places `gang-*` gangs)."""

WRITTEN_ANNOTATIONS = frozenset(
    PREFIX + key
    for key in (
        "container-gpu-count",
        "pod-counter-key",
        "takeover-slot",
        "autoscale-source",
        "index",
        "gpu-ids",
        "container-gpus",
        "defrag-evicted-since",
        "defrag-evicted-pool",
    )
)
"""Annotations we write on a pod (a pod admitted again, or copied from a running one, carries them)."""

IGNORED_ANNOTATIONS = frozenset(
    PREFIX + key
    for key in (
        "sidecar-worker",
        "embedded-worker",
        "partition-id",
        "worker-pod-template",
        "gang-desired-members",
        "disable-features",
        "workload",
        "selected-workload",
        "pending-owned-workload",
        "effective-hard-sm-percent",
        "port-name",
        "port-number",
        "workload-mode",
        # Keys of TensorFusion's other objects (nodes, GPUs, pools): meaningless on a pod.
        "defrag-source-since",
        "defrag-source-pool",
        "defrag-evict-skip-since",
        "defrag-evict-skip-pool",
        "defrag-evict-skip-reason",
        "last-sync",
        "virtualization-capabilities",
        "is-default-pool",
        "manual-compaction",
        "gpu-missing-since",
    )
)
"""TensorFusion's annotations that we accept on a pod and ignore."""

READ_LABELS = frozenset({PREFIX + "enabled"})
"""Labels the webhook reads from a pod."""

WRITTEN_LABELS = frozenset(PREFIX + key for key in ("component", "workload", "gpupool", "defrag-evicted"))
"""Labels we write on a pod (`enabled` too, when a native GPU pod is migrated)."""

IGNORED_LABELS = frozenset(
    PREFIX + key
    for key in (
        "pod-template-hash",
        "disable-features",
        "host-port",
        # Keys of TensorFusion's other objects (nodes, GPUs): meaningless on a pod.
        "do-not-disrupt",
        "should-delete",
        "defrag-source",
        "defrag-evict-skip",
        "managed-by",
        "node-provisioner",
    )
)
"""TensorFusion's labels that we accept on a pod and ignore."""

ANNOTATIONS = READ_ANNOTATIONS | WRITTEN_ANNOTATIONS | IGNORED_ANNOTATIONS
LABELS = READ_LABELS | WRITTEN_LABELS | IGNORED_LABELS
DOCUMENTED_IN = "docs/webhook.md"


def unknown_keys(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """Why the pod's `tensor-fusion.ai/*` keys are refused (each unknown key named, with the known key
    it most resembles), or None when every such key is known."""
    problems = [
        *_problems(labels, "label", LABELS, "annotation", ANNOTATIONS, "metadata.annotations"),
        *_problems(annotations, "annotation", ANNOTATIONS, "label", LABELS, "metadata.labels"),
    ]
    return "; ".join(problems) if problems else None


def _problems(
    keys: Iterable[str],
    kind: str,
    known: frozenset[str],
    other_kind: str,
    other_known: frozenset[str],
    other_section: str,
) -> list[str]:
    problems = []
    for key in sorted(key for key in keys if key.startswith(PREFIX) and key not in known):
        if key in other_known:
            article = "an" if other_kind[0] in "aeiou" else "a"
            problems.append(f"{kind} {key} is read as {article} {other_kind}: move it to {other_section}")
            continue
        close = difflib.get_close_matches(key.removeprefix(PREFIX).lower(), _suffixes(known), n=1)
        if close:
            problems.append(f"unknown {kind} {key}; did you mean {PREFIX}{close[0]}?")
        else:
            problems.append(
                f"unknown {kind} {key}; it is no TensorFusion key ({DOCUMENTED_IN} lists them): "
                "correct its spelling or remove it"
            )
    return problems


def _suffixes(keys: frozenset[str]) -> list[str]:
    return sorted(key.removeprefix(PREFIX) for key in keys)
