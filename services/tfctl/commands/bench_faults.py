"""`tfctl bench faults [--duration 300] [--seed 42] [--json]`: a fault campaign with its invariants.

Starts a private local stack, drives submissions and releases while it kills, restarts and pauses
every piece in turn, then prints operations, faults injected and violations (see `tfctl.faults`).
Exit codes: 0 no violation, 1 violations found or a history figure (`lost`, `doubled`, `phantom`,
`bill_difference`, `self_exits`) not 0 (the stack's logs and `operations.json` are kept and their
folder printed), 2 bad arguments. Registered under `tfctl bench` (`bench.py` registers first).
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_DURATION_S = 300.0
BENCH_ALL_DURATION_S = 120.0
"""`tfctl bench all` runs a shorter campaign so that `make bench` stays within its time budget."""
DEFAULT_SEED = 42
EXIT_VIOLATIONS, USAGE_ERROR = 1, 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `faults` under the `bench` command (and to `tfctl bench all`)."""
    from tfctl.commands import bench

    parent = subparsers.choices.get("bench")
    if parent is None:
        bench.register(subparsers)
        parent = subparsers.choices["bench"]
    targets = next(action for action in parent._actions if isinstance(action, argparse._SubParsersAction))
    parser = targets.add_parser(
        "faults",
        help="kill, restart and pause every service, NATS and Postgres under load; check nothing is lost",
        description=__doc__,
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        help=f"seconds of load and faults ({DEFAULT_DURATION_S:.0f}); every fault runs at least once",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"load generator seed ({DEFAULT_SEED})"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.set_defaults(handler=handler)
    bench.RUNNERS["faults"] = _bench_all_defaults
    bench.SIZES["faults"] = {"duration_s": BENCH_ALL_DURATION_S, "seed": DEFAULT_SEED}


def _bench_all_defaults() -> dict[str, Any]:
    from tfctl.faults import run_fault_campaign

    return run_fault_campaign(BENCH_ALL_DURATION_S, DEFAULT_SEED)


def handler(args: argparse.Namespace) -> int:
    import sys

    from tfctl.faults import FaultCampaignError, campaign_failed, print_report, run_fault_campaign

    if not 1.0 <= args.duration <= 24 * 3600:
        print(
            f"tfctl bench faults: --duration {args.duration:g} must be from 1 to 86400 seconds",
            file=sys.stderr,
        )
        return USAGE_ERROR
    try:
        report = run_fault_campaign(args.duration, args.seed)
    except FaultCampaignError as error:
        print(f"tfctl bench faults: {error}", file=sys.stderr)
        return EXIT_VIOLATIONS
    print_report(report, args.json)
    if campaign_failed(report):
        print(f"tfctl bench faults: logs and operations.json kept in {report['state_dir']}", file=sys.stderr)
        return EXIT_VIOLATIONS
    return 0
