"""`tfctl get pools|nodes|gpus|allocations|workloads|recommendations [--json]`: what the ledger holds.

Reads the scheduler's HTTP API (`--scheduler-url`, default `$TF_SCHEDULER_URL` or
http://127.0.0.1:8080); `recommendations` reads the metrics service's (`--metrics-url`, default
`$TF_METRICS_URL` or http://127.0.0.1:8090) and prints what `tfctl recommendations` prints. `workloads`
lists placed and pending workloads (`-n NAMESPACE` for one namespace), each pending one with its reason.
Exit codes: 0 shown, 1 the service did not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx
from tfcommon.display import gib_text, tflops_text

COLUMNS: dict[str, tuple[str, ...]] = {
    "pools": ("name", "placement_mode", "nodes", "ready_nodes", "gpus", "tflops", "vram"),
    "nodes": ("name", "pool", "schedulable", "reason", "labels", "gpus", "tflops", "vram"),
    "gpus": ("uuid", "node", "index", "model", "phase", "tflops", "vram"),
    "allocations": ("id", "namespace", "name", "node", "qos", "state", "gpus"),
}


HEADERS = {"tflops": "TFLOPS AVAIL/TOTAL", "vram": "VRAM GiB AVAIL/TOTAL"}
"""Column headers that say the unit and what the two figures are; other columns show their name."""


def scheduler_url(explicit: str | None) -> str:
    return (explicit or os.environ.get("TF_SCHEDULER_URL") or "http://127.0.0.1:8080").rstrip("/")


KINDS = (*COLUMNS, "workloads", "recommendations")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "get", help="list pools, nodes, GPUs, allocations, workloads or recommendations", description=__doc__
    )
    parser.add_argument("kind", choices=KINDS, help=" | ".join(KINDS))
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("-n", "--namespace", help="workloads: only this namespace (default: all)")
    parser.add_argument("--scheduler-url", help="scheduler API base URL ($TF_SCHEDULER_URL)")
    parser.add_argument("--metrics-url", help="metrics API base URL ($TF_METRICS_URL), for recommendations")
    parser.set_defaults(handler=handler)


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "tflops":
        return f"{tflops_text(row['available_tflops_milli'])}/{tflops_text(row['capacity_tflops_milli'])}"
    if column == "vram":
        return f"{gib_text(row['available_vram_bytes'])}/{gib_text(row['capacity_vram_bytes'])}"
    if column == "labels" and isinstance(row.get("labels"), dict):
        return ",".join(f"{key}={value}" for key, value in sorted(row["labels"].items())) or "-"
    if column == "gpus" and isinstance(row.get("shares"), list):
        return ",".join(share["gpu_uuid"] for share in row["shares"])
    value = row.get(column)
    return "-" if value is None else str(value)


def render_table(kind: str, rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table; TFLOPS (in TFLOPS) and VRAM (in GiB) as available/total."""
    headers = [HEADERS.get(column, column.upper()) for column in COLUMNS[kind]]
    cells = [[_cell(row, column) for column in COLUMNS[kind]] for row in rows]
    widths = [max(len(line[i]) for line in [headers, *cells]) for i in range(len(headers))]
    lines = [
        "  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True))
        for line in [headers, *cells]
    ]
    return "\n".join(line.rstrip() for line in lines)


def handler(args: argparse.Namespace) -> int:
    if args.kind == "recommendations":
        from tfctl.commands import recommendations

        return recommendations.handler(argparse.Namespace(json=args.json, url=args.metrics_url))
    url = f"{scheduler_url(args.scheduler_url)}/api/v1/{args.kind}"
    try:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as error:
        print(f"tfctl get: the scheduler at {url} did not answer: {error}", file=sys.stderr)
        return 1
    rows = response.json()
    if args.kind == "workloads":
        from tfctl import workloads

        rows = workloads.in_namespace(rows, args.namespace)
        print(json.dumps(rows, indent=2) if args.json else workloads.render(rows))
        return 0
    print(json.dumps(rows, indent=2) if args.json else render_table(args.kind, rows))
    return 0
