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
from pathlib import Path
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
    run.add_argument(
        "--nats-url", default=None, help="NATS URL (default: TF_NATS_URL, else STATE_DIR/endpoints.json)"
    )
    run.add_argument(
        "--state-dir", type=Path, default=None, help="state folder of `tfctl up` (.tf, TF_STATE_DIR)"
    )
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

    from tfctl.bus_client import NatsUnreachableError
    from tfctl.commands.events import NO_NATS_URL
    from tfctl.local_state import nats_url

    found = nats_url(args.nats_url, args.state_dir)
    if found is None:
        print(NO_NATS_URL, file=sys.stderr)
        return USAGE_ERROR
    if args.max_duration_minutes is not None and args.max_duration_minutes <= 0:
        print("--max-duration-minutes must be a positive number of minutes", file=sys.stderr)
        return USAGE_ERROR
    settings = NatsSettings()
    password = settings.password.get_secret_value() if settings.password else None
    try:
        asyncio.run(_send(found, args.pool, args.max_duration_minutes, settings.user, password))
    except NatsUnreachableError as error:
        print(f"tfctl defrag run: {error}", file=sys.stderr)
        return FAILED
    print(f"campaign requested for pool {args.pool}; follow it with `tfctl events tail --subject 'tf.evt.>'`")
    return 0


async def _send(
    url: tuple[str, str], pool: str, minutes: int | None, user: str | None, password: str | None
) -> None:
    from tfctl.bus_client import connect

    nc = await connect(*url, name="tfpool-tfctl", user=user, password=password)
    # Imported once connected, so that a URL that does not answer fails without waiting for them.
    from tfcommon import subjects
    from tfcommon.bus import PUBLISH_TIMEOUT_S, NatsEventBus
    from tfcommon.events import StartDefragCampaign

    bus = NatsEventBus(nc, nc.jetstream(timeout=PUBLISH_TIMEOUT_S), "tfctl")
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
