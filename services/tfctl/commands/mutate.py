"""`tfctl mutate -f FILE [--config CONFIG.yaml] [--diff]`: the webhook's admission decision, offline.

FILE holds an AdmissionReview (prints the response AdmissionReview), a Pod (prints the mutated Pod), or
a Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob (prints it with its pod template
mutated). Exit codes: 0 admitted, 1 denied, 2 FILE or the configuration is malformed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from tfcommon.config import ConfigError, TfConfig
from tfcommon.config_source import load_config
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.core.manifests import ManifestError, admit_manifest
from tfwebhook.core.review import MalformedReviewError, parse_review, render_response

EXIT_ADMITTED, EXIT_DENIED, EXIT_MALFORMED = 0, 1, 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mutate",
        help="show what the admission webhook does to a manifest, without a cluster",
        description=__doc__,
    )
    parser.add_argument(
        "-f", "--filename", required=True, type=Path, help="YAML or JSON manifest ('-' for stdin)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="configuration file (default: $TF_CONFIG_FILE, else defaults)",
    )
    parser.add_argument("--diff", action="store_true", help="print a unified diff instead of the result")
    parser.add_argument("--namespace", default="default", help="namespace of manifests that name none")
    parser.add_argument(
        "--namespace-labels",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="labels of the namespace, for autoMigration namespaceSelector scopes (unknown if unset)",
    )
    parser.set_defaults(handler=handler)


def _fail(message: str) -> int:
    print(f"tfctl mutate: {message}", file=sys.stderr)
    return EXIT_MALFORMED


def _read_documents(path: Path) -> list[Any]:
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    return [document for document in yaml.safe_load_all(text) if document is not None]


def _render(document: Any) -> str:
    rendered: str = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    return rendered


def handler(args: argparse.Namespace) -> int:
    config_path = args.config or (
        Path(os.environ["TF_CONFIG_FILE"]) if os.environ.get("TF_CONFIG_FILE") else None
    )
    try:
        config = load_config(config_path)
    except ConfigError as error:
        return _fail(str(error))
    try:
        documents = _read_documents(args.filename)
    except OSError as error:
        return _fail(f"{args.filename}: cannot read: {error.strerror}")
    except yaml.YAMLError as error:
        return _fail(f"{args.filename}: not valid YAML or JSON: {error}")
    if not documents:
        return _fail(f"{args.filename}: the file holds no manifest")
    try:
        namespace_labels = _labels(args.namespace_labels)
    except ValueError as error:
        return _fail(str(error))
    outputs: list[str] = []
    denied = False
    for index, document in enumerate(documents):
        where = f"{args.filename}" + (f" (document {index + 1})" if len(documents) > 1 else "")
        if not isinstance(document, dict):
            return _fail(f"{where}: a manifest must be a mapping with apiVersion and kind")
        try:
            output, admitted = _mutate_one(document, config, args.namespace, namespace_labels, args.diff)
        except (ManifestError, MalformedReviewError) as error:
            return _fail(f"{where}: {error}")
        denied = denied or not admitted
        outputs.append(output)
    print("---\n".join(outputs) if not args.diff else "".join(outputs), end="")
    return EXIT_DENIED if denied else EXIT_ADMITTED


def _labels(text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    labels: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ValueError(f"--namespace-labels: {pair!r} is not KEY=VALUE, e.g. team=ml")
        labels[key] = value
    return labels


def _mutate_one(
    document: dict[str, Any],
    config: TfConfig,
    namespace: str,
    namespace_labels: dict[str, str] | None,
    as_diff: bool,
) -> tuple[str, bool]:
    context = AdmissionContext(config, namespace, namespace_labels)
    if document.get("kind") == "AdmissionReview":
        review = parse_review(json.dumps(document))
        context = AdmissionContext(config, review.namespace, namespace_labels, takeover_slot_id=review.uid)
        if review.pod is None or not review.is_pod_creation:
            return json.dumps(render_response(review.uid, Admitted()), indent=2) + "\n", True
        verdict = admit(review.pod, context)
        return json.dumps(render_response(review.uid, verdict), indent=2) + "\n", isinstance(
            verdict, Admitted
        )
    result = admit_manifest(document, context)
    if isinstance(result.verdict, Denied):
        print(f"denied: {result.verdict.message}", file=sys.stderr)
        return "", False
    if result.verdict.takeover is not None:
        print(
            f"note: enabled-replicas={result.verdict.takeover.limit}: only that many pods of this workload "
            "are taken over; the others keep their device-plugin GPUs",
            file=sys.stderr,
        )
    if not as_diff:
        return _render(result.mutated), True
    name = f"{document.get('kind')}/{(document.get('metadata') or {}).get('name', '')}"
    diff = difflib.unified_diff(
        _render(document).splitlines(keepends=True),
        _render(result.mutated).splitlines(keepends=True),
        fromfile=f"{name} (as written)",
        tofile=f"{name} (after admission)",
    )
    return "".join(diff), True
