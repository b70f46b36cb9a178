"""`tfctl` entry point: builds the argument parser from the modules in `tfctl.commands`.

A call imports only the modules of the command it runs (`COMMANDS`), so that `tfctl get pools` does not
pay for the webhook, the ledger's SQLAlchemy or the Kubernetes client that other commands import; the
other commands are listed by name and one-line help only. `build_parser()` builds every command in
full (for tests and tools that parse any command line).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bench": ("run a benchmark and print its figures", ("bench", "bench_faults")),
    "billing": ("what the pool cost over a period, per group, with savings", ("billing",)),
    "config": ("configuration reference", ("config",)),
    "cordon": ("stop placing new workloads on nodes (what runs there stays)", ("cordon",)),
    "deadletters": (
        "messages the services' consumers gave up: list, replay or discard them",
        ("deadletters",),
    ),
    "defrag": ("defragmentation: see the plan, start a campaign", ("defrag",)),
    "delete": ("delete workloads; one a controller owns is recreated, on other GPUs", ("delete",)),
    "doctor": (
        "list the fields of the cluster's GPUPool, GPUNode and quota objects tfpool does not act on",
        ("doctor",),
    ),
    "events": ("the event catalogue and a live view of the bus", ("events",)),
    "get": ("list pools, nodes, GPUs, allocations, workloads or recommendations", ("get",)),
    "label": ("set or remove node labels (tensor-fusion.ai/do-not-disrupt)", ("label",)),
    "migrate": ("apply the ledger's database migrations (alembic upgrade head)", ("migrate",)),
    "mutate": ("show what the admission webhook does to a manifest, without a cluster", ("mutate",)),
    "nats": (
        "per-node NATS credentials: the auth callout, its issuer key, a node's token",
        ("nats",),
    ),
    "recommendations": (
        "autoscaling recommendations per workload, beside the current values and the saving",
        ("recommendations",),
    ),
    "run": (
        "run a command on pooled GPUs (allocate, start with CUDA_VISIBLE_DEVICES, release on exit)",
        ("run",),
    ),
    "serve": ("run one service in the foreground (needs TF_NATS_URL and TF_DATABASE_URL)", ("serve",)),
    "sim": ("simulate placement on traces", ("sim", "sim_defrag")),
    "submit": ("admit a pod manifest and submit it for placement", ("submit",)),
    "uncordon": ("let cordoned nodes take new workloads", ("uncordon",)),
    "up": ("start NATS, Postgres, migrations, the five services and simulated GPU nodes", ("up",)),
}
"""Each command: the one-line help `tfctl --help` shows (the same as its module registers) and the
modules of `tfctl.commands` that register it, in order. A new command module goes here."""


def _top_level() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="tfctl", description="GPU pooling control plane")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return parser, subparsers


def _register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], command: str) -> None:
    for module in COMMANDS[command][1]:
        importlib.import_module(f"tfctl.commands.{module}").register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    """Every command with all its arguments (imports every command module)."""
    parser, subparsers = _top_level()
    for command in COMMANDS:
        _register(subparsers, command)
    return parser


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for this command line: its command in full, every other one by name and help only."""
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    parser, subparsers = _top_level()
    for command, (help_text, _modules) in COMMANDS.items():
        if command == chosen:
            _register(subparsers, command)
        else:
            subparsers.add_parser(command, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; its return value is the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser_for(arguments).parse_args(arguments)
    exit_code: int = args.handler(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
