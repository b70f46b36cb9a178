"""`tfctl submit -f pod.yaml`: admit the pod as the webhook would, then submit it to the scheduler.

The same pure admission as the webhook (`tfwebhook.core.admit`) turns the pod's `tensor-fusion.ai/*`
annotations into a GPU request, the priority Kubernetes would give the pod (its PriorityClass, or the
one its `qos` gets: `high` 10000, `critical` 100000) and its `eviction-protection`; a denied pod is
not submitted. The scheduler answers placed (exit 0),
pending with the reason (exit 0; placed later, when capacity or quota frees), or refused (exit 1:
an unknown pool, or a request no node of the pool could ever hold, with the largest that fits). Under
`tensor-fusion.ai/enabled-replicas: N`, pods of a workload beyond the N live ones are not taken over
(exit 0, "not taken over", nothing submitted), as the webhook admits them unchanged in Kubernetes.
Submitting the same pod again (a manifest without `metadata.uid`) answers the workload already there.
Mutating the scheduler needs the stack's API token (`TF_API_TOKEN`, else the `api-token` file `tfctl up`
wrote in `TF_STATE_DIR` / `.tf`). Exit 2: the file or the configuration is malformed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml
from tfcommon.config import ConfigError
from tfcommon.config_source import load_config
from tfwebhook.core.admission import AdmissionContext, Admitted, admit

from tfctl.commands.get import scheduler_url
from tfctl.local_state import api_token, missing_token_hint

EXIT_PLACED, EXIT_REFUSED, EXIT_MALFORMED = 0, 1, 2
NOT_TAKEN_OVER = 409


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("submit", help="admit a pod manifest and submit it for placement")
    parser.add_argument("-f", "--filename", required=True, type=Path, help="Pod YAML or JSON ('-' for stdin)")
    parser.add_argument("--namespace", default=None, help="namespace when the pod names none (default)")
    parser.add_argument("--config", type=Path, default=None, help="configuration file ($TF_CONFIG_FILE)")
    parser.add_argument("--scheduler-url", help="scheduler API base URL ($TF_SCHEDULER_URL)")
    parser.add_argument("--json", action="store_true", help="print the scheduler's answer as JSON")
    parser.set_defaults(handler=handler)


def _fail(message: str, code: int = EXIT_MALFORMED) -> int:
    print(f"tfctl submit: {message}", file=sys.stderr)
    return code


def submission_for(pod: dict[str, Any], namespace: str, config_path: Path | None) -> dict[str, Any] | str:
    """The scheduler submission for `pod`, or why it cannot be submitted."""
    verdict = admit(pod, AdmissionContext(load_config(config_path), namespace))
    if not isinstance(verdict, Admitted):
        return f"denied by admission: {verdict.message}"
    if verdict.request is None or verdict.workload is None:
        return f"the pod is not taken over ({verdict.reason}); nothing to schedule"
    spec = pod.get("spec") or {}
    return {
        "workload": verdict.workload.model_dump(mode="json"),
        "request": verdict.request.model_dump(mode="json"),
        "priority": verdict.priority,
        "eviction_protection_s": verdict.eviction_protection_s,
        "tolerations": [
            {key: str(value) for key, value in toleration.items() if key != "tolerationSeconds"}
            for toleration in spec.get("tolerations") or []
        ],
        "node_selector": dict(spec.get("nodeSelector") or {}),
        "labels": {
            str(key): str(value) for key, value in ((pod.get("metadata") or {}).get("labels") or {}).items()
        },
        "takeover": None
        if verdict.takeover is None
        else {"workload_key": verdict.takeover.workload_key, "limit": verdict.takeover.limit},
    }


def handler(args: argparse.Namespace) -> int:
    config_path = args.config or (
        Path(os.environ["TF_CONFIG_FILE"]) if os.environ.get("TF_CONFIG_FILE") else None
    )
    try:
        text = sys.stdin.read() if str(args.filename) == "-" else args.filename.read_text(encoding="utf-8")
        pod = yaml.safe_load(text)
    except OSError as error:
        return _fail(f"{args.filename}: cannot read: {error.strerror}")
    except yaml.YAMLError as error:
        return _fail(f"{args.filename}: not valid YAML or JSON: {error}")
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        return _fail(f"{args.filename}: expected a manifest with kind: Pod")
    namespace = args.namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    try:
        submission = submission_for(pod, namespace, config_path)
    except ConfigError as error:
        return _fail(str(error))
    if isinstance(submission, str):
        return _fail(submission, EXIT_REFUSED)
    token = api_token()
    if not token:
        return _fail(missing_token_hint())
    url = f"{scheduler_url(args.scheduler_url)}/api/v1/workloads"
    try:
        response = httpx.post(url, json=submission, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except httpx.HTTPError as error:
        return _fail(f"the scheduler at {url} did not answer: {error}", EXIT_REFUSED)
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()[:300] or "(empty body)"
        return _fail(f"the scheduler at {url} answered {response.status_code}: {text}", EXIT_REFUSED)
    if not isinstance(body, dict):
        return _fail(f"the scheduler at {url} answered {response.status_code}: {body}", EXIT_REFUSED)
    if response.status_code == NOT_TAKEN_OVER:
        name = submission["workload"]["name"]
        if args.json:
            print(json.dumps({"state": "not-taken-over", "reason": body.get("detail")}, indent=2))
        else:
            print(f"not taken over {namespace}/{name}: {body.get('detail')}")
        return EXIT_PLACED
    if response.status_code >= 400:
        return _fail(f"refused ({response.status_code}): {body.get('detail', body)}", EXIT_REFUSED)
    if args.json:
        print(json.dumps(body, indent=2))
    elif body["state"] == "placed":
        print(
            f"placed {namespace}/{body['workload']['name']} on {body['node']}: {','.join(body['gpu_uuids'])}"
        )
        print(f"id: {body['id']}")
    else:
        print(f"{body['state']} {namespace}/{body['workload']['name']}: {body.get('reason')}")
        print(f"id: {body['id']}")
    return EXIT_PLACED
