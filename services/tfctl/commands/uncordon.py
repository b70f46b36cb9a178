"""`tfctl uncordon NODE...`: the nodes take new workloads again, as `kubectl uncordon` does.

Pending workloads are tried again at once. Sends `PATCH /api/v1/nodes/{name}` with the API token.
Exit codes: 0 done, 1 a node is unknown or the scheduler refused or did not answer.
"""

from __future__ import annotations

import argparse

from tfctl.commands.cordon import add_node_arguments, handler


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "uncordon", help="let cordoned nodes take new workloads", description=__doc__
    )
    parser.add_argument("nodes", nargs="+", metavar="NODE", help="node name (tfctl get nodes)")
    add_node_arguments(parser)
    parser.set_defaults(handler=handler, cordoned=False)
