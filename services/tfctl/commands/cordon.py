"""`tfctl cordon NODE...`: no new workload is placed on the nodes, as `kubectl cordon` does.

What runs there keeps running; `tfctl delete workload` then moves one elsewhere, and `tfctl uncordon`
lets the node take work again. The defrag planner neither drains a cordoned node nor moves workloads
onto it (reason `cordoned`). Sends `PATCH /api/v1/nodes/{name}` to the scheduler with the API token
(`TF_API_TOKEN`, else STATE_DIR/api-token that `tfctl up` writes).
Exit codes: 0 done, 1 a node is unknown or the scheduler refused or did not answer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_FAILED = 1


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `cordon`, `uncordon` and `label` share: where the scheduler and its token are."""
    parser.add_argument("--scheduler-url", help="scheduler API base URL ($TF_SCHEDULER_URL)")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="state folder of `tfctl up`, for its API token (.tf)"
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_cordon_verb(
        subparsers,
        "cordon",
        "stop placing new workloads on nodes (what runs there stays)",
        __doc__,
        cordoned=True,
    )


def register_cordon_verb(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    verb: str,
    help_text: str,
    description: str | None,
    *,
    cordoned: bool,
) -> None:
    """`tfctl cordon` or `tfctl uncordon`: the same arguments, the flag set one way or the other."""
    parser = subparsers.add_parser(verb, help=help_text, description=description)
    parser.add_argument("nodes", nargs="+", metavar="NODE", help="node name (tfctl get nodes)")
    add_node_arguments(parser)
    parser.set_defaults(handler=handler, cordoned=cordoned)


def patch_nodes(args: argparse.Namespace, change: dict[str, object], done: str) -> int:
    """Send `change` for each of `args.nodes`; prints `node/NAME DONE` or why not."""
    from tfctl.scheduler_client import SchedulerCallError, call, scheduler_url

    url = scheduler_url(args.scheduler_url)
    failed = False
    for node in args.nodes:
        try:
            call("PATCH", f"/api/v1/nodes/{node}", url=url, state_dir=args.state_dir, body=change)
        except SchedulerCallError as error:
            print(f"tfctl {args.command}: {error}", file=sys.stderr)
            failed = True
            continue
        print(f"node/{node} {done}")
    return EXIT_FAILED if failed else 0


def handler(args: argparse.Namespace) -> int:
    cordoned: bool = args.cordoned
    return patch_nodes(args, {"cordoned": cordoned}, "cordoned" if cordoned else "uncordoned")
