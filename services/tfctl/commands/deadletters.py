"""`tfctl deadletters list|replay|discard`: what the services' consumers gave up, and reconciling it.

A durable consumer that cannot read a message (poison) or whose handler failed `max_deliver` times
copies it to the stream `TF_DEADLETTER` before terminating it (`tfcommon.deadletter`). `list` prints
them, oldest first (`--consumer` one durable's, `--json` one JSON document); `replay ID` publishes one
again on its original subject with its original payload and event id (consumers are idempotent by
event id), then removes it (`--keep` leaves it); `discard ID` removes one without replaying it. The bus
is `--nats-url`, else `TF_NATS_URL`, else the one `tfctl up` recorded; as the NATS user `TF_NATS_USER`
(in a secured deployment: `tfctl`, whose permissions allow exactly this). Exit 1: NATS did not answer,
or no dead letter has that ID; 2: bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfcommon.deadletter import DeadLetter

USAGE_ERROR = 2
FAILED = 1
DETAIL_WIDTH = 60


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "deadletters", help="messages the services' consumers gave up: list, replay or discard them"
    )
    verbs = parser.add_subparsers(dest="deadletters_command", required=True, metavar="VERB")

    listing = verbs.add_parser("list", help="the dead letters kept, oldest first")
    listing.add_argument("--consumer", default=None, help="only this durable consumer's")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    listing.set_defaults(handler=handle_list)

    replay = verbs.add_parser("replay", help="publish a dead letter again on its subject, then remove it")
    replay.add_argument("id", type=int, help="the dead letter's ID (tfctl deadletters list)")
    replay.add_argument("--keep", action="store_true", help="leave the dead letter in the stream")
    replay.add_argument("--json", action="store_true", help="one JSON document")
    replay.set_defaults(handler=handle_replay)

    discard = verbs.add_parser("discard", help="remove a dead letter without replaying it")
    discard.add_argument("id", type=int, help="the dead letter's ID (tfctl deadletters list)")
    discard.set_defaults(handler=handle_discard)

    for verb in (listing, replay, discard):
        verb.add_argument(
            "--nats-url", default=None, help="NATS URL (default: TF_NATS_URL, else STATE_DIR/endpoints.json)"
        )
        verb.add_argument(
            "--state-dir", type=Path, default=None, help="state folder of `tfctl up` (.tf, TF_STATE_DIR)"
        )


def _fail(message: str, code: int = FAILED) -> int:
    print(f"tfctl deadletters: {message}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace, action: Any) -> int:
    """Connect to the bus, run `action(js)` and return its exit code."""
    from tfcommon.settings import NatsSettings

    from tfctl.bus_client import NatsUnreachableError, connect
    from tfctl.commands.events import NO_NATS_URL
    from tfctl.local_state import nats_url

    found = nats_url(args.nats_url, args.state_dir)
    if found is None:
        return _fail(NO_NATS_URL, USAGE_ERROR)
    settings = NatsSettings()
    password = settings.password.get_secret_value() if settings.password else None

    async def connected() -> int:
        client = await connect(
            found[0], found[1], name="tfctl-deadletters", user=settings.user, password=password
        )
        try:
            code: int = await action(client.jetstream())
            return code
        finally:
            await client.drain()

    try:
        return asyncio.run(connected())
    except NatsUnreachableError as error:
        return _fail(str(error))


def _line(letter: DeadLetter) -> str:
    detail = letter.detail
    if len(detail) > DETAIL_WIDTH:
        detail = detail[: DETAIL_WIDTH - 3] + "..."
    at = letter.dead_lettered_at.isoformat(timespec="seconds") if letter.dead_lettered_at else "-"
    return (
        f"{letter.sequence:>6}  {at:<25}  {letter.consumer:<36}  {letter.reason:<9}  "
        f"{letter.subject} #{letter.original_sequence}  {letter.event_id or '-'}  "
        f"x{letter.deliveries}  {detail}"
    )


def handle_list(args: argparse.Namespace) -> int:
    from tfcommon.deadletter import list_dead_letters

    async def action(js: Any) -> int:
        letters = await list_dead_letters(js, args.consumer)
        if args.json:
            print(json.dumps([letter.as_json() for letter in letters], indent=2))
        elif not letters:
            print("no dead letters" + (f" of {args.consumer}" if args.consumer else ""))
        else:
            print(
                f"{'ID':>6}  {'DEAD-LETTERED':<25}  {'CONSUMER':<36}  {'REASON':<9}  "
                "SUBJECT #SEQUENCE  EVENT  DELIVERIES  DETAIL"
            )
            for letter in letters:
                print(_line(letter))
        return 0

    return _run(args, action)


def handle_replay(args: argparse.Namespace) -> int:
    from tfcommon.deadletter import replay_dead_letter

    async def action(js: Any) -> int:
        replayed = await replay_dead_letter(js, args.id, keep=args.keep)
        if replayed is None:
            return _fail(f"no dead letter {args.id} (replayed, discarded or aged out; see `list`)")
        letter = replayed.dead_letter
        if args.json:
            document = {
                "id": args.id,
                "subject": letter.subject,
                "event_id": letter.event_id,
                "stream": replayed.stream,
                "sequence": replayed.sequence,
                "duplicate": replayed.duplicate,
                "kept": args.keep,
            }
            print(json.dumps(document, indent=2))
        else:
            again = " (already replayed: JetStream kept the earlier copy)" if replayed.duplicate else ""
            print(
                f"replayed {args.id} on {letter.subject} as {replayed.stream} #{replayed.sequence}, event "
                f"{letter.event_id or '-'}{again}" + ("" if args.keep else "; removed from TF_DEADLETTER")
            )
        return 0

    return _run(args, action)


def handle_discard(args: argparse.Namespace) -> int:
    from tfcommon.deadletter import discard_dead_letter

    async def action(js: Any) -> int:
        if not await discard_dead_letter(js, args.id):
            return _fail(f"no dead letter {args.id} (replayed, discarded or aged out; see `list`)")
        print(f"discarded {args.id}")
        return 0

    return _run(args, action)
