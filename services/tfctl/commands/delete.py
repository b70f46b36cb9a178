"""`tfctl delete workload NAME|ID... [-n NAMESPACE]`: delete workloads as `kubectl delete pod` does.

A workload is named by its name in `-n/--namespace` (default `default`) or by its allocation id (from
`tfctl get workloads --json` or `tfctl submit`). One that a controller owns (its manifest's
`ownerReferences`) is recreated, as its controller would: the scheduler evicts it through its local
Eviction API and places the replacement, on other GPUs than the ones it left whenever any fit (cordon
the node first to keep it off the node altogether). One without a controller, a pending one, or any
with `--no-replace` ends, and its allocation is released. Mutating the scheduler needs the API token
(`TF_API_TOKEN`, else STATE_DIR/api-token that `tfctl up` writes).
Exit codes: 0 every workload deleted, 1 one was not found or the scheduler refused or did not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
KINDS = ("workload", "workloads")
EVICTION_REASON = "deleted with tfctl delete workload"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "delete",
        help="delete workloads; one a controller owns is recreated, on other GPUs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=KINDS, help="workload")
    parser.add_argument("names", nargs="+", metavar="NAME", help="workload name, or its allocation id")
    parser.add_argument("-n", "--namespace", default="default", help="namespace of the names (default)")
    parser.add_argument(
        "--no-replace",
        action="store_true",
        help="end it even when a controller owns it (nothing recreates it)",
    )
    parser.add_argument("--json", action="store_true", help="print what happened to each as JSON")
    parser.add_argument("--scheduler-url", help="scheduler API base URL ($TF_SCHEDULER_URL)")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="state folder of `tfctl up`, for its API token (.tf)"
    )
    parser.set_defaults(handler=handler)


def _not_found(name: str, namespace: str, workloads: list[dict[str, Any]]) -> str:
    elsewhere = sorted({w["namespace"] for w in workloads if w["name"] == name})
    hint = (
        f"it is in namespace {', '.join(elsewhere)}: pass -n {elsewhere[0]}"
        if elsewhere
        else f"`tfctl get workloads -n {namespace}` lists them"
    )
    return f"no placed or pending workload {namespace}/{name}; {hint}"


def describe(outcome: dict[str, Any]) -> str:
    """One line for what happened to one workload."""
    key = f"{outcome['namespace']}/{outcome['name']}"
    if outcome["action"] == "ended":
        return f"workload {key} deleted ({outcome['why']})"
    replacement = outcome["replacement"]
    if replacement["state"] == "placed":
        where = f"placed on {replacement['node']} ({','.join(replacement['gpu_uuids'])})"
    else:
        where = f"{replacement['state']}: {replacement.get('reason')}"
    return f"workload {key} deleted from {outcome['node']}; its controller recreated it: {where}"


def _delete_one(
    workload: dict[str, Any], *, replace: bool, url: str, state_dir: Path | None
) -> dict[str, Any]:
    from tfctl.scheduler_client import call
    from tfctl.workloads import has_controller

    outcome: dict[str, Any] = {
        "id": workload["id"],
        "namespace": workload["namespace"],
        "name": workload["name"],
        "node": workload.get("node"),
    }
    if replace and workload["state"] == "placed" and has_controller(workload):
        answer = call(
            "POST",
            f"/api/v1/workloads/{workload['id']}/eviction",
            url=url,
            state_dir=state_dir,
            body={"reason": EVICTION_REASON, "by": "drain"},
        )
        return {**outcome, "action": "evicted", "replacement": answer["replacement"]}
    call("DELETE", f"/api/v1/workloads/{workload['id']}", url=url, state_dir=state_dir)
    if workload["state"] != "placed":
        why = f"it was {workload['state']}"
    elif not replace:
        why = "--no-replace: nothing recreates it"
    else:
        why = "no controller owns it: nothing recreates it"
    return {**outcome, "action": "ended", "why": why, "replacement": None}


def handler(args: argparse.Namespace) -> int:
    from tfctl.scheduler_client import SchedulerCallError, call, scheduler_url
    from tfctl.workloads import find

    url = scheduler_url(args.scheduler_url)
    try:
        workloads: list[dict[str, Any]] = call("GET", "/api/v1/workloads", url=url, state_dir=args.state_dir)
    except SchedulerCallError as error:
        print(f"tfctl delete: {error}", file=sys.stderr)
        return EXIT_FAILED
    outcomes: list[dict[str, Any]] = []
    failed = False
    for name in args.names:
        named = find(workloads, name, args.namespace)
        if not named:
            print(f"tfctl delete: {_not_found(name, args.namespace, workloads)}", file=sys.stderr)
            failed = True
        for workload in named:
            try:
                outcome = _delete_one(
                    workload, replace=not args.no_replace, url=url, state_dir=args.state_dir
                )
            except SchedulerCallError as error:
                print(f"tfctl delete: {workload['namespace']}/{workload['name']}: {error}", file=sys.stderr)
                failed = True
                continue
            outcomes.append(outcome)
            if not args.json:
                print(describe(outcome))
    if args.json:
        print(json.dumps(outcomes, indent=2))
    return EXIT_FAILED if failed else 0
