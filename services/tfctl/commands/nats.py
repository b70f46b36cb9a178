"""`tfctl nats`: the per-node NATS credentials: run the auth callout, print its issuer key, make a
plain server's node token (`tfcommon.nats_auth`)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfcommon.nats_auth.callout import add_key_commands

    parser = subparsers.add_parser(
        "nats",
        help="per-node NATS credentials: the auth callout, its issuer key, a node's token",
        description="Each node agent connects to NATS as node:<node> and may touch only its node's "
        "subjects: the auth callout grants it for the pod's service-account token (Kubernetes) or a "
        "node token (plain servers). All keys come from one callout secret (TF_NATS_CALLOUT_SECRET_FILE).",
    )
    commands = parser.add_subparsers(dest="nats_command", required=True, metavar="SUBCOMMAND")
    commands.add_parser("callout", help="answer the NATS server's authorization requests (a service)")
    add_key_commands(commands)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from tfcommon.nats_auth.callout import run, run_key_command

    if args.nats_command == "callout":
        return run()
    args.command = args.nats_command
    return run_key_command(args)
