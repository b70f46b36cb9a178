"""`tfctl defrag plan --pool NAME [--json]` shows the dry run; `tfctl defrag run --pool NAME --now` starts
a campaign by hand. `plan` asks the defrag planner's HTTP API; `run` sends `StartDefragCampaign` on NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

USAGE_ERROR = 2
FAILED = 1
DEFAULT_URL = "http://127.0.0.1:8070"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("defrag", help="defragmentation: see the plan, start a campaign")
    verbs = parser.add_subparsers(dest="defrag_command", required=True, metavar="VERB")

    plan = verbs.add_parser("plan", help="dry run: nodes to drain, where each pod goes, why others stay")
    plan.add_argument("--pool", required=True, help="GPU pool name")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument(
        "--url", default=None, help=f"defrag planner URL (default: $TF_DEFRAG_URL or {DEFAULT_URL})"
    )
    plan.set_defaults(handler=handle_plan)

    run = verbs.add_parser("run", help="start a campaign for a pool (the manual trigger)")
    run.add_argument("--pool", required=True, help="GPU pool name")
    run.add_argument("--now", action="store_true", required=True, help="start now (required)")
    run.add_argument("--max-duration-minutes", type=int, default=None, help="window (default: the pool's)")
    run.add_argument("--nats-url", default=None, help="NATS URL (default: TF_NATS_URL)")
    run.set_defaults(handler=handle_run)


def handle_plan(args: argparse.Namespace) -> int:
    import httpx

    base = (args.url or os.environ.get("TF_DEFRAG_URL") or DEFAULT_URL).rstrip("/")
    try:
        response = httpx.get(f"{base}/api/v1/defrag/plan", params={"pool": args.pool}, timeout=60)
    except httpx.HTTPError as error:
        print(
            f"cannot reach the defrag planner at {base}: {error}; start it (tfctl up) or pass --url",
            file=sys.stderr,
        )
        return FAILED
    if response.status_code != 200:
        detail = response.json().get("detail", response.text) if response.content else response.reason_phrase
        print(f"plan for pool {args.pool} failed ({response.status_code}): {detail}", file=sys.stderr)
        return FAILED
    document = response.json()
    print(json.dumps(document, indent=2) if args.json else render_plan(document))
    return 0


def render_plan(document: dict[str, Any]) -> str:
    """The plan as text: drains with their moves, then every other node and why it stays."""
    lines = [f"pool {document['pool']}: defrag {'enabled' if document.get('defrag_enabled') else 'disabled'}"]
    lines += [f"  config problem: {problem}" for problem in document.get("config_problems", [])]
    drains = document.get("drains", [])
    lines.append(f"nodes to drain: {len(drains)}")
    for drain in drains:
        lines.append(f"  {drain['node']} ({drain['gpus_in_use']}/{drain['gpus_total']} GPUs in use)")
        lines += [
            f"    {move['pod']} -> {move['to']} ({', '.join(move['gpu_uuids'])})" for move in drain["moves"]
        ]
    skipped = document.get("skipped", [])
    lines.append(f"nodes left alone: {len(skipped)}")
    width = max((len(skip["node"]) for skip in skipped), default=0)
    lines += [f"  {skip['node']:<{width}}  {skip['reason']}: {skip['message']}" for skip in skipped]
    marked = document.get("compaction", {}).get("mark_should_delete", [])
    if marked:
        lines.append(f"compaction would label should-delete: {', '.join(marked)}")
    return "\n".join(lines)


def handle_run(args: argparse.Namespace) -> int:
    from tfcommon.settings import NatsSettings

    settings = NatsSettings()
    url = args.nats_url or settings.url
    if not url:
        print("no NATS URL: set TF_NATS_URL or pass --nats-url nats://HOST:4222", file=sys.stderr)
        return USAGE_ERROR
    if args.max_duration_minutes is not None and args.max_duration_minutes <= 0:
        print("--max-duration-minutes must be a positive number of minutes", file=sys.stderr)
        return USAGE_ERROR
    password = settings.password.get_secret_value() if settings.password else None
    asyncio.run(_send(url, args.pool, args.max_duration_minutes, settings.user, password))
    print(f"campaign requested for pool {args.pool}; follow it with `tfctl events tail --subject 'tf.evt.>'`")
    return 0


async def _send(url: str, pool: str, minutes: int | None, user: str | None, password: str | None) -> None:
    from tfcommon import subjects
    from tfcommon.bus import NatsEventBus
    from tfcommon.events import StartDefragCampaign

    bus = await NatsEventBus.connect(url, service="tfctl", user=user, password=password)
    try:
        await subjects.provision(bus.js, consumers=())
        await bus.publish(
            StartDefragCampaign(
                event_id=uuid4(),
                occurred_at=datetime.now(UTC),
                pool=pool,
                max_duration_ms=minutes * 60_000 if minutes else None,
            )
        )
    finally:
        await bus.close()
