"""`tfctl sim replay`: replay a GPU trace through the placement core and report allocation figures.

Thin shell: argument parsing and output only; the replay lives in `tfctl.simulation`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tfcommon.placement import DEFAULT_POLICY, POLICIES

from tfctl.simulation import (
    LEARN_MODES,
    ProgressBar,
    ReplayResult,
    TraceError,
    benchmark_markdown,
    plot,
    read_nodes,
    read_pods,
    replay,
    run_label,
    summarize,
)

DEFAULT_SEED = 42
MAX_INFLATE = 10.0


def register(subparsers: Any) -> None:
    sim = subparsers.add_parser("sim", help="simulate placement on traces")
    commands = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
    parser = commands.add_parser(
        "replay",
        help="replay an openb trace with the FGD paper's protocol",
        description=(
            "Shuffle the pods with each seed, clone them until the requested GPU reaches INFLATE x capacity, "
            "place them one by one with no departures, and report the GPU allocation ratio. With --learn "
            "online the target workload is learned only from the pods that arrived before each one."
        ),
    )
    parser.add_argument(
        "--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb_pod_list_*.csv)")
    parser.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help=f"placement policy, repeatable (default {DEFAULT_POLICY}); one of: {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--seed",
        action="append",
        dest="seeds",
        type=int,
        metavar="N",
        help=f"repeatable (default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--inflate", type=float, default=1.3, help="arrived GPU as a multiple of capacity (1.3)"
    )
    parser.add_argument(
        "--learn",
        choices=LEARN_MODES,
        default="trace",
        help="target workload learned from the whole pod list up front (trace, the paper's protocol) "
        "or, as the scheduler does, only from the pods that arrived so far (online)",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per policy and seed, one per line"
    )
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw allocation against arrived workload"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=replay_command)
    table = commands.add_parser(
        "table",
        help="markdown tables from replay JSON lines",
        description="Read `tfctl sim replay --json` lines (each with a `trace` field) and print the tables "
        "docs/benchmarks.md holds.",
    )
    table.add_argument("results", type=Path, help="a file of JSON lines")
    table.set_defaults(handler=table_command)


def table_command(args: argparse.Namespace) -> int:
    try:
        lines = args.results.read_text().splitlines()
    except OSError as error:
        print(f"tfctl sim table: {args.results}: cannot read ({error.strerror})", file=sys.stderr)
        return 2
    runs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError as error:
            message = f"{args.results}:{number}: not JSON ({error.msg}); give one object per line"
            print(f"tfctl sim table: {message}", file=sys.stderr)
            return 2
    print(benchmark_markdown(runs), end="")
    return 0


def replay_command(args: argparse.Namespace) -> int:
    policies: list[str] = args.policies or [DEFAULT_POLICY]
    seeds: list[int] = args.seeds or [DEFAULT_SEED]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown:
        print(
            f"tfctl sim replay: unknown policy {', '.join(unknown)}; use one of {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.inflate <= MAX_INFLATE:
        print(
            f"tfctl sim replay: --inflate is {args.inflate}; use a value in (0, {MAX_INFLATE}]",
            file=sys.stderr,
        )
        return 2
    try:
        trace_nodes = read_nodes(args.nodes)
        pods = read_pods(args.pods)
    except TraceError as error:
        print(f"tfctl sim replay: {error}", file=sys.stderr)
        return 2
    results: list[ReplayResult] = []
    for name in policies:
        for seed in seeds:
            bar = ProgressBar(f"{name} seed {seed} ({args.learn})", enabled=not args.no_progress)
            try:
                result = replay(
                    trace_nodes,
                    pods,
                    name,
                    seed,
                    inflate=args.inflate,
                    on_progress=bar.update,
                    learn=args.learn,
                )
            finally:
                bar.close()
            results.append(result)
            if args.json:
                print(json.dumps(result.as_json()), flush=True)
    if not args.json:
        _print_table([result.as_json() for result in results])
    if args.plot is not None:
        plot(results, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _print_table(runs: list[dict[str, Any]]) -> None:
    header = f"{'policy':<22} {'seed':>5} {'alloc@100':>10} {'alloc@130':>10} {'idle GPUs@130':>14} "
    header += f"{'frag rate@90':>13} {'failed':>7} {'pods/s':>8}"
    print(header)
    for run in runs:
        idle = run["unallocated_gpus_at_130"]
        print(
            f"{run_label(run):<22} {run['seed']:>5} {_percent(run['allocated_at_100']):>10} "
            f"{_percent(run['allocated_at_130']):>10} {'-' if idle is None else f'{idle:.1f}':>14} "
            f"{_percent(run['fragmentation_rate_at_90']):>13} {run['failed_pods']:>7} "
            f"{run['placements_per_second'] or 0:>8.0f}"
        )
    if len(runs) > len({run_label(run) for run in runs}):
        print("\nmean over seeds")
        for name, figures in summarize(runs).items():
            idle = figures["unallocated_gpus_at_130"]
            print(
                f"{name:<22} {'':>5} {_percent(figures['allocated_at_100']):>10} "
                f"{_percent(figures['allocated_at_130']):>10} {'-' if idle is None else f'{idle:.1f}':>14} "
                f"{_percent(figures['fragmentation_rate_at_90']):>13}"
            )
