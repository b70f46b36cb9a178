"""`tfctl events doc|contract [--check]` write the event contract; `tfctl events tail` prints the bus live.

`doc` renders `docs/events.md` from `tfcommon.events` (no network); `contract` renders it together
with `docs/asyncapi.yaml` and `docs/schemas/*.json` (`tfcommon.asyncapi`). `tail` reads `TF_EVENTS` through an
ordered consumer starting at new messages (it consumes nothing: services' durable consumers are not
affected); command subjects (`tf.cmd.*`) are watched with a plain subscription, since a work queue
admits only its own consumers. The bus is `--nats-url`, else `TF_NATS_URL`, else the one the last
`tfctl up` of the state folder recorded in `endpoints.json`; one that does not answer within seconds is
one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TextIO

REPOSITORY_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_DOCS = REPOSITORY_ROOT / "docs"
DEFAULT_CATALOGUE = DEFAULT_DOCS / "events.md"
USAGE_ERROR = 2
STALE = 1
UNREACHABLE = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("events", help="the event catalogue and a live view of the bus")
    verbs = parser.add_subparsers(dest="events_command", required=True, metavar="VERB")

    doc = verbs.add_parser("doc", help="write docs/events.md from tfcommon/events.py")
    doc.add_argument("--output", type=Path, default=DEFAULT_CATALOGUE, help="where to write (docs/events.md)")
    doc.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    doc.set_defaults(handler=handle_doc)

    contract = verbs.add_parser(
        "contract", help="write docs/events.md, docs/asyncapi.yaml and docs/schemas/ from tfcommon/events.py"
    )
    contract.add_argument("--docs-dir", type=Path, default=DEFAULT_DOCS, help="where to write (docs/)")
    contract.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    contract.set_defaults(handler=handle_contract)

    tail = verbs.add_parser("tail", help="print every message published on the bus, as it happens")
    tail.add_argument("--subject", default="tf.evt.>", help="subject pattern, e.g. 'tf.evt.allocation.*'")
    tail.add_argument(
        "--json", action="store_true", help="one JSON object per line (subject, headers, payload)"
    )
    tail.add_argument("--count", type=int, default=None, help="exit after this many messages")
    tail.add_argument(
        "--nats-url", default=None, help="NATS URL (default: TF_NATS_URL, else STATE_DIR/endpoints.json)"
    )
    tail.add_argument(
        "--state-dir", type=Path, default=None, help="state folder of `tfctl up` (.tf, TF_STATE_DIR)"
    )
    tail.set_defaults(handler=handle_tail)


def handle_doc(args: argparse.Namespace) -> int:
    from tfcommon.catalogue import render_catalogue

    expected = render_catalogue()
    output: Path = args.output
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != expected:
            print(f"{output} is stale: run `tfctl events doc` and commit the result", file=sys.stderr)
            return STALE
        print(f"{output} is up to date")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(expected, encoding="utf-8")
    print(f"wrote {output}")
    return 0


def handle_contract(args: argparse.Namespace) -> int:
    from tfcommon.asyncapi import SCHEMAS_FOLDER, contract_files

    expected = contract_files()
    docs: Path = args.docs_dir
    schemas = docs / SCHEMAS_FOLDER
    leftovers = sorted(
        path.relative_to(docs).as_posix()
        for path in (schemas.glob("*.json") if schemas.is_dir() else ())
        if path.relative_to(docs).as_posix() not in expected
    )
    if args.check:
        stale = [
            name
            for name, text in expected.items()
            if not (docs / name).exists() or (docs / name).read_text(encoding="utf-8") != text
        ]
        if stale or leftovers:
            for name in [*stale, *leftovers]:
                print(
                    f"{docs / name} is stale: run `tfctl events contract` and commit the result",
                    file=sys.stderr,
                )
            return STALE
        print(f"{len(expected)} contract files under {docs} are up to date")
        return 0
    for name, text in expected.items():
        target = docs / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for name in leftovers:
        (docs / name).unlink()
    print(
        f"wrote {len(expected)} contract files under {docs}"
        + (f", removed {len(leftovers)}" if leftovers else "")
    )
    return 0


def handle_tail(args: argparse.Namespace) -> int:
    from tfcommon.settings import NatsSettings

    from tfctl.bus_client import NatsUnreachableError
    from tfctl.local_state import nats_url

    found = nats_url(args.nats_url, args.state_dir)
    if found is None:
        print(NO_NATS_URL, file=sys.stderr)
        return USAGE_ERROR
    if not args.subject.startswith(("tf.evt.", "tf.cmd.")):
        print(f"--subject {args.subject!r} must start with tf.evt. or tf.cmd.", file=sys.stderr)
        return USAGE_ERROR
    settings = NatsSettings()
    password = settings.password.get_secret_value() if settings.password else None
    try:
        asyncio.run(
            tail(
                found[0],
                pattern=args.subject,
                as_json=args.json,
                count=args.count,
                out=sys.stdout,
                user=settings.user,
                password=password,
                source=found[1],
            )
        )
    except NatsUnreachableError as error:
        print(f"tfctl events tail: {error}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:
        return 0
    return 0


NO_NATS_URL = (
    "no NATS URL: set TF_NATS_URL or pass --nats-url nats://HOST:4222, or run from the folder of `tfctl up` "
    "(it records the URL of its NATS in .tf/endpoints.json)"
)
"""What `tfctl events tail` and `tfctl defrag run` say when no NATS URL is known."""


def format_line(subject: str, headers: dict[str, str], payload: bytes, *, as_json: bool) -> str:
    """One printed line for one message."""
    try:
        body: object = json.loads(payload)
    except ValueError:
        body = payload.decode(errors="replace")
    if as_json:
        return json.dumps({"subject": subject, "headers": headers, "payload": body}, sort_keys=True)
    details = dict(body) if isinstance(body, dict) else {"payload": body}
    event_id = details.pop("event_id", headers.get("ce-id", "-"))
    occurred_at = details.pop("occurred_at", headers.get("ce-time", "-"))
    return f"{occurred_at}  {subject}  {event_id}  {json.dumps(details, separators=(',', ':'))}"


async def tail(
    url: str,
    *,
    pattern: str,
    as_json: bool,
    count: int | None,
    out: TextIO,
    user: str | None = None,
    password: str | None = None,
    subscribed: asyncio.Event | None = None,
    source: str = "--nats-url",
) -> None:
    """Print messages matching `pattern` as they are published, until `count` (or forever). Raises
    `NatsUnreachableError` when no NATS answers at `url` (which came from `source`) in time."""
    from tfctl.bus_client import connect

    nc = await connect(url, source, name="tfctl-events-tail", user=user, password=password)
    # Imported once connected, so that a URL that does not answer fails without waiting for them.
    from nats.aio.subscription import Subscription
    from nats.js.api import DeliverPolicy
    from tfcommon.subjects import EVENTS_STREAM

    subscription: Subscription
    try:
        if pattern.startswith("tf.evt."):
            js = nc.jetstream()
            subscription = await js.subscribe(
                pattern, stream=EVENTS_STREAM, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW
            )
        else:
            subscription = await nc.subscribe(pattern)
        await nc.flush()
        if subscribed is not None:
            subscribed.set()
        printed = 0
        while count is None or printed < count:
            try:
                msg = await subscription.next_msg(timeout=1.0)
            except TimeoutError:
                continue
            print(format_line(msg.subject, dict(msg.headers or {}), msg.data, as_json=as_json), file=out)
            out.flush()
            printed += 1
    finally:
        await nc.drain()
