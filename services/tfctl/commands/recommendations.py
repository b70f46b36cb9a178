"""`tfctl recommendations [--json]`: each workload's current GPU values beside its recommendation.

Asks the metrics service's `GET /api/v1/recommendations` (URL from `--url`, else `TF_METRICS_URL`, else
http://127.0.0.1:8090) and prints one row per workload: QoS, GPU count, TFLOPS (in TFLOPS) and VRAM (in
GiB), request/limit per GPU, now and recommended, the samples behind it, the expected saving per hour on
the pool's current prices, and why (a workload with too few samples keeps its values and says so). Only
workloads that hold GPUs are listed. Pods of a workload annotated `tensor-fusion.ai/autoscale: "true"`
are admitted with the recommendation. `--json` prints the API's exact integers.
Exit codes: 0 printed, 1 the service refused or could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tfcommon.display import gib_text, tflops_text

DEFAULT_URL = "http://127.0.0.1:8090"
EXIT_FAILED = 1
HEADER = (
    "WORKLOAD",
    "QOS",
    "GPUS",
    "TFLOPS NOW",
    "TFLOPS REC",
    "VRAM GiB NOW",
    "VRAM GiB REC",
    "SAMPLES",
    "SAVING/H",
)
LEGEND = "TFLOPS and VRAM are per GPU, request/limit"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "recommendations",
        help="autoscaling recommendations per workload, beside the current values and the saving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.add_argument("--url", default=None, help=f"metrics service URL (TF_METRICS_URL, {DEFAULT_URL})")
    parser.set_defaults(handler=handler)


def fetch_recommendations(url: str) -> tuple[int, dict[str, Any]]:
    import httpx

    response = httpx.get(f"{url.rstrip('/')}/api/v1/recommendations", timeout=30)
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        body = {"error": f"HTTP {response.status_code}: {response.text[:200]}"}
    return response.status_code, body


def _tflops(values: dict[str, int]) -> str:
    return f"{tflops_text(values['tflopsRequestMilli'])}/{tflops_text(values['tflopsLimitMilli'])}"


def _vram(values: dict[str, int]) -> str:
    return f"{gib_text(values['vramRequestBytes'])}/{gib_text(values['vramLimitBytes'])}"


def render_table(body: dict[str, Any]) -> str:
    """One row per workload (TFLOPS columns in TFLOPS, VRAM columns in GiB), the legend, then each
    workload's reason."""
    items = body["recommendations"]
    if not items:
        return "no recommendations yet: the metrics service stores them once workloads hold GPUs\n"
    rows = [
        (
            item["workload"],
            item["qos"],
            str(item["gpuCount"]),
            _tflops(item["current"]),
            _tflops(item["recommended"]) if item["sufficient"] else "-",
            _vram(item["current"]),
            _vram(item["recommended"]) if item["sufficient"] else "-",
            str(item["sampleCount"]),
            item["expectedSavingPerHour"] if item["sufficient"] else "-",
        )
        for item in items
    ]
    widths = [max(len(row[index]) for row in [HEADER, *rows]) for index in range(len(HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [HEADER, *rows]
    ]
    lines.append(LEGEND)
    lines.extend(f"{item['workload']}: {item['reason']}" for item in items)
    return "\n".join(lines) + "\n"


def handler(args: argparse.Namespace) -> int:
    import httpx

    url = args.url or os.environ.get("TF_METRICS_URL") or DEFAULT_URL
    try:
        status, body = fetch_recommendations(url)
    except httpx.HTTPError as error:
        print(
            f"tfctl recommendations: cannot reach the metrics service at {url}: {error}; "
            "start it (tfctl up) or pass --url / TF_METRICS_URL",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if status != 200:
        print(f"tfctl recommendations: {body.get('error', body)}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        sys.stdout.write(render_table(body))
    return 0
