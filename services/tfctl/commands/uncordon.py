"""`tfctl uncordon NODE...`: the nodes take new workloads again, as `kubectl uncordon` does.

Pending workloads are tried again at once. Sends `PATCH /api/v1/nodes/{name}` with the API token.
Exit codes: 0 done, 1 a node is unknown or the scheduler refused or did not answer.
"""

from __future__ import annotations

import argparse

from tfctl.commands.cordon import register_cordon_verb


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    register_cordon_verb(
        subparsers, "uncordon", "let cordoned nodes take new workloads", __doc__, cordoned=False
    )
