"""`tfctl billing --from --to --group-by namespace [--json|--csv]`: the bill from the metrics service.

Asks the metrics service's `GET /api/v1/billing` (URL from `--url`, else `TF_METRICS_URL`, else
http://127.0.0.1:8090) and prints a table, the JSON body, or CSV (one row per group, then a total row).
The table and CSV are in cents, the JSON to the millionth (`--quantum` sets the step for all three).
Without a dedicated price for a GPU model (`TF_GPU_COST_PER_HOUR` on the metrics service) the dedicated
cost and savings are unknown: `unknown` in the table, empty in CSV, null in JSON with the reason.
Exit codes: 0 printed, 1 the service refused or could not be reached, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8090"
GROUPS = ("namespace", "workload", "pod", "qos", "pool")
EXIT_FAILED, EXIT_USAGE = 1, 2
COLUMNS = ("key", "cost", "dedicatedCost", "savings", "gpuHours", "shares")
CENTS, EXACT = "0.01", "0.000001"
UNKNOWN = "unknown"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "billing", help="what the pool cost over a period, per group, with savings", description=__doc__
    )
    parser.add_argument("--from", dest="start", help="start, ISO 8601 or a date (default: 30 days ago)")
    parser.add_argument("--to", dest="end", help="end, ISO 8601 or a date (default: now)")
    parser.add_argument("--group-by", choices=GROUPS, default="namespace", help="grouping (namespace)")
    parser.add_argument(
        "--quantum",
        default=None,
        help=f"money is rounded to this step (table and CSV {CENTS}, --json {EXACT})",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the API's JSON")
    output.add_argument("--csv", action="store_true", help="print CSV: one row per group and a total row")
    parser.add_argument("--url", default=None, help=f"metrics service URL (TF_METRICS_URL, {DEFAULT_URL})")
    parser.set_defaults(handler=handler)


def fetch_bill(url: str, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
    import httpx

    response = httpx.get(f"{url.rstrip('/')}/api/v1/billing", params=params, timeout=30)
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        body = {"error": f"HTTP {response.status_code}: {response.text[:200]}"}
    return response.status_code, body


def _cells(values: dict[str, Any], unknown: str) -> list[str]:
    return [unknown if values.get(column) is None else str(values.get(column)) for column in COLUMNS]


def _total(bill: dict[str, Any]) -> dict[str, Any]:
    return {**bill, "key": "TOTAL", "gpuHours": "", "shares": ""}


def render_csv(bill: dict[str, Any]) -> str:
    """One row per group and a total row; an unknown amount is an empty cell."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([bill["groupBy"], "cost", "dedicated_cost", "savings", "gpu_hours", "shares"])
    for values in [*bill["groups"], _total(bill)]:
        writer.writerow(_cells(values, ""))
    return buffer.getvalue()


def render_table(bill: dict[str, Any]) -> str:
    """The groups, the total and the notes; an unknown dedicated cost or saving reads `unknown`."""
    header = (bill["groupBy"].upper(), "COST", "DEDICATED", "SAVINGS", "GPU-HOURS", "SHARES")
    rows = [tuple(_cells(values, UNKNOWN)) for values in [*bill["groups"], _total(bill)]]
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    lines = [f"billing {bill['from']} .. {bill['to']}"]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    lines.extend(f"note: {note}" for note in bill["notes"])
    return "\n".join(lines) + "\n"


def handler(args: argparse.Namespace) -> int:
    import httpx

    url = args.url or os.environ.get("TF_METRICS_URL") or DEFAULT_URL
    params = {"groupBy": args.group_by, "quantum": args.quantum or (EXACT if args.json else CENTS)}
    if args.start:
        params["from"] = args.start
    if args.end:
        params["to"] = args.end
    try:
        status, body = fetch_bill(url, params)
    except httpx.HTTPError as error:
        print(
            f"tfctl billing: cannot reach the metrics service at {url}: {error}; "
            "start it (tfctl up) or pass --url / TF_METRICS_URL",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if status != 200:
        print(f"tfctl billing: {body.get('error', body)}", file=sys.stderr)
        return EXIT_USAGE if status == 400 else EXIT_FAILED
    if args.json:
        print(json.dumps(body, indent=2))
    elif args.csv:
        sys.stdout.write(render_csv(body))
    else:
        sys.stdout.write(render_table(body))
    return 0
