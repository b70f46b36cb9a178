"""`tfctl bench TARGET`: benchmarks that run the real code paths and print their figures.

`tfctl bench scheduler --nodes 1000 --gpus-per-node 8 --pods 20000 [--json]`: placements per second
and submission-to-announced latency (p50, p99) of the scheduler over real NATS and Postgres (embedded
ones unless `TF_NATS_URL` / `TF_DATABASE_URL` are set), with simulated nodes; then the latency at an
offered load (`--offered-rate`, 200/s by default). `tfctl bench all --json` runs every target with its
defaults and prints one JSON document (`make bench`).

Adding a target: write `_register_<name>(targets)` that adds its subparser (with a handler) and puts a
no-argument runner into `RUNNERS`, and call it from `register`. Exit codes: 0 done, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

USAGE_ERROR = 2
RUNNERS: dict[str, Callable[[], dict[str, Any]]] = {}
"""Each target's benchmark with its default arguments, for `tfctl bench all`."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and print its figures", description=__doc__)
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    _register_scheduler(targets)
    every = targets.add_parser("all", help="every benchmark with its defaults, as one JSON document")
    every.add_argument("--json", action="store_true", help="accepted for symmetry; the output is JSON")
    every.set_defaults(handler=_run_all)


def _run_all(args: argparse.Namespace) -> int:
    print(json.dumps({name: run() for name, run in RUNNERS.items()}, indent=2))
    return 0


def _scheduler_defaults() -> dict[str, Any]:
    from tfscheduler.bench import run_scheduler_benchmark

    return run_scheduler_benchmark(
        database_url=os.environ.get("TF_DATABASE_URL") or None, nats_url=os.environ.get("TF_NATS_URL") or None
    )


def _register_scheduler(targets: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = targets.add_parser(
        "scheduler",
        help="placements/s and p50/p99 from submission to the announced allocation",
        description="Place PODS pods on simulated nodes through the scheduler engine, the ledger and the "
        "outbox relay; then offer --offered-pods at --offered-rate per second.",
    )
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes (1000)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, 100 TFLOPS / 80 GiB (8)")
    parser.add_argument(
        "--pods", type=int, default=20_000, help="pods of 2 TFLOPS / 2 GiB in the burst (20000)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="submissions in flight in the burst (64)")
    parser.add_argument(
        "--offered-rate", type=float, default=200.0, help="submissions per second offered (200)"
    )
    parser.add_argument(
        "--offered-pods", type=int, default=2_000, help="pods offered at that rate; 0 skips (2000)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=_run_scheduler)
    RUNNERS["scheduler"] = _scheduler_defaults


def _run_scheduler(args: argparse.Namespace) -> int:
    from tfscheduler.bench import BenchmarkError, run_scheduler_benchmark

    try:
        result = run_scheduler_benchmark(
            args.nodes,
            args.gpus_per_node,
            args.pods,
            concurrency=args.concurrency,
            offered_rate=args.offered_rate,
            offered_pods=args.offered_pods,
            database_url=os.environ.get("TF_DATABASE_URL") or None,
            nats_url=os.environ.get("TF_NATS_URL") or None,
        )
    except BenchmarkError as error:
        print(f"tfctl bench scheduler: {error}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"burst: {result['placed']} pods on {result['nodes']} nodes x {result['gpus_per_node']} GPUs: "
        f"{result['placements_per_second']} placements/s, "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms"
    )
    offered = result.get("offered")
    if offered:
        print(
            f"offered {offered['rate_per_second']}/s: {offered['placed']} pods, "
            f"p50 {offered['p50_ms']} ms, p99 {offered['p99_ms']} ms"
        )
    baseline = result["baseline_raw_reserve"]
    print(f"baseline: {baseline['reserves_per_second']} raw ledger reserve() calls/s, one at a time")
    return 0
