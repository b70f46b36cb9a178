"""`tfctl up`: the whole local control plane in the foreground (what `make run` calls).

Parses and checks the options, then hands over to `tfctl.stack` (`tfctl.kube_stack` with
`--kubernetes`); Ctrl-C stops everything in order.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start NATS, Postgres, migrations, the five services and simulated GPU nodes",
        description=(
            "Start the local control plane: embedded NATS and Postgres (unless TF_NATS_URL / "
            "TF_DATABASE_URL are set), the ledger migrations, the five services and one node agent per "
            "simulated node; print where each listens. Ctrl-C stops everything."
        ),
    )
    parser.add_argument(
        "--fake-gpus",
        action="append",
        metavar="MODEL:N[,MODEL:N]",
        help="the GPUs of one simulated node; repeat for more nodes (default: H100:4 and A100-80G:4)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("TF_STATE_DIR", ".tf")),
        help="where NATS, Postgres, certificates and logs live (default .tf, TF_STATE_DIR)",
    )
    parser.add_argument(
        "--ports",
        choices=("fixed", "auto"),
        default="fixed",
        help="fixed: the documented ports (webhook 9443, scheduler 8080, ...); auto: free ports",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the services bind (default 127.0.0.1)")
    parser.add_argument("--json", action="store_true", help="print the endpoints as one JSON object")
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="also run a local Kubernetes control plane (etcd, kube-apiserver, KWOK nodes) with the "
        "production manifests, and the services in Kubernetes mode, each with its own service account",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, metavar="SECONDS", help="wait this long for /readyz"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from tfctl import kube_stack, stack
    from tfctl.stack import DEFAULT_NODES, StackOptions, parse_fake_gpus

    try:
        nodes = [parse_fake_gpus(value) for value in args.fake_gpus or DEFAULT_NODES]
    except ValueError as error:
        print(f"tfctl up: {error}", file=sys.stderr)
        return 2
    options = StackOptions(
        state_dir=args.state_dir.resolve(),
        nodes=nodes,
        auto_ports=args.ports == "auto",
        host=args.host,
        json_output=args.json,
        ready_timeout_s=args.ready_timeout,
    )
    return (kube_stack.run if args.kubernetes else stack.run)(options)
