"""`tfctl label node NODE KEY=VALUE|KEY-...`: set or remove node labels, as `kubectl label` does.

In local mode the node is also its GPUNode, and the label an operator sets is
`tensor-fusion.ai/do-not-disrupt`: with `=true` compaction never marks the node for deletion and the
defrag planner never drains it (reason `do-not-disrupt`); `tensor-fusion.ai/do-not-disrupt-` (a trailing
`-`) removes it. It does not stop a `tfctl delete workload` you run yourself. The label stays when the
node agent registers again. Sends `PATCH /api/v1/nodes/{name}` with the API token.
Exit codes: 0 done, 1 the node is unknown or the scheduler refused or did not answer, 2 a change is
neither KEY=VALUE nor KEY-.
"""

from __future__ import annotations

import argparse
import sys

from tfctl.commands.cordon import add_node_arguments, patch_nodes

EXIT_USAGE = 2
KINDS = ("node", "nodes", "gpunode", "gpunodes")


class LabelSyntaxError(ValueError):
    """A change that is neither KEY=VALUE nor KEY-; `str()` says so with an example."""


def parse_changes(changes: list[str]) -> dict[str, str | None]:
    """`KEY=VALUE` sets, `KEY-` removes (None); raises `LabelSyntaxError` naming the bad one."""
    parsed: dict[str, str | None] = {}
    for change in changes:
        if "=" in change:
            key, value = change.split("=", 1)
        elif change.endswith("-"):
            key, value = change[:-1], None
        else:
            key = ""
        if not key:
            raise LabelSyntaxError(
                f"{change!r} is neither KEY=VALUE nor KEY- (e.g. tensor-fusion.ai/do-not-disrupt=true, "
                "or tensor-fusion.ai/do-not-disrupt- to remove it)"
            )
        if key in parsed:
            raise LabelSyntaxError(f"{key!r} is given twice; give each label once")
        parsed[key] = value
    return parsed


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "label",
        help="set or remove node labels (tensor-fusion.ai/do-not-disrupt)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=KINDS, help="node (gpunode is the same node in local mode)")
    parser.add_argument("node", metavar="NODE", help="node name (tfctl get nodes)")
    parser.add_argument("changes", nargs="+", metavar="KEY=VALUE|KEY-", help="label to set, or to remove")
    add_node_arguments(parser)
    parser.set_defaults(handler=handler)


def handler(args: argparse.Namespace) -> int:
    try:
        labels = parse_changes(args.changes)
    except LabelSyntaxError as error:
        print(f"tfctl label: {error}", file=sys.stderr)
        return EXIT_USAGE
    args.nodes = [args.node]
    done = "unlabeled" if all(value is None for value in labels.values()) else "labeled"
    return patch_nodes(args, {"labels": labels}, done)
