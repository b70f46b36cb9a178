"""The outbox relay: publishes the events the ledger committed to its `outbox` table, exactly once.

Each pass claims unpublished rows (`FOR UPDATE SKIP LOCKED`, so several relays share the work),
publishes them in order (all sent before the first JetStream ack is awaited, so a pass costs about one
round trip), then marks the acknowledged ones published in the same transaction; `run()` starts the
next pass as soon as a pass's acks are in, while that pass still marks (its rows stay locked). A
crash before the publish leaves the rows unclaimed for the next relay; a crash after the publish but
before the mark republishes them, and JetStream drops the repeat because the `Nats-Msg-Id` is the
event id (within the stream's duplicate window, 2 minutes by default). The relay wakes on Postgres
NOTIFY `tf_outbox` (sent by a trigger on every insert) and polls as a fallback.

Run it on its own with `python -m tfcommon.ledger.outbox --database-url URL --nats-url URL`. On a
secured NATS (deploy/nats/nats.conf) it connects as the `scheduler` user, whose events it publishes:
`TF_NATS_USER=scheduler` and `TF_NATS_PASSWORD`, as every service reads them (`NatsSettings`).
This module only moves committed rows to the bus; it never writes ledger state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, Protocol

import nats
import nats.errors
import psycopg
from pydantic import ValidationError
from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tfcommon.ledger import tables
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.urls import DatabaseUrlError, ledger_url
from tfcommon.logs import configure_logging
from tfcommon.nats_tls import NatsTlsError, client_context, verification_failure
from tfcommon.settings import NatsSettings

log = logging.getLogger(__name__)

PausePoint = Literal["before-publish", "after-publish"]
PAUSE_AT_ENV = "TF_OUTBOX_TEST_PAUSE_AT"
PAUSE_MARKER_ENV = "TF_OUTBOX_TEST_PAUSE_MARKER"
STOP_CHECK_INTERVAL_S = 0.2
PRUNE_INTERVAL_S = 60.0
RELAY_NATS_USER = "scheduler"
"""The NATS user the relay runs as on a secured server: the producer of the events it publishes."""


class Publisher(Protocol):
    """Where the relay publishes: `tfcommon.bus.NatsEventBus` (or any `EventBus`) satisfies it.

    `publish_raw` must return only once the message is stored, and must treat `event_id` as the
    deduplication id (`Nats-Msg-Id`), so that publishing the same event twice stores it once. It must
    hand the message to its connection before it first waits: the relay starts the next publish
    before this one is acknowledged, and relies on that to store events in the order they were written.
    """

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class TestPause:
    """A deliberate test hook: stop forever at `point`, after writing the claimed event ids to `marker`.

    Set through `TF_OUTBOX_TEST_PAUSE_AT` (`before-publish` or `after-publish`) and
    `TF_OUTBOX_TEST_PAUSE_MARKER` (a file path) on the relay process, so a test can SIGKILL it there.
    Never set in production.
    """

    __test__ = False  # not a pytest test class

    point: PausePoint
    marker: Path

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> TestPause | None:
        point = environ.get(PAUSE_AT_ENV)
        if not point:
            return None
        if point not in ("before-publish", "after-publish"):
            raise ValueError(f"{PAUSE_AT_ENV}: {point!r} is not before-publish or after-publish")
        marker = environ.get(PAUSE_MARKER_ENV)
        if not marker:
            raise ValueError(f"{PAUSE_MARKER_ENV}: unset; give the file the relay writes when it pauses")
        return cls(point=point, marker=Path(marker))  # type: ignore[arg-type]


_CLAIM = (
    select(
        tables.outbox.c.id,
        tables.outbox.c.event_id,
        tables.outbox.c.subject,
        tables.outbox.c.event_type,
        tables.outbox.c.payload,
        tables.outbox.c.headers,
        tables.outbox.c.occurred_at,
    )
    .where(tables.outbox.c.published_at.is_(None))
    .order_by(tables.outbox.c.id)
    .limit(bindparam("batch_size"))
    .with_for_update(skip_locked=True)
)
_MARK_PUBLISHED = (
    update(tables.outbox)
    .where(tables.outbox.c.id.in_(bindparam("ids", expanding=True)))
    .values(published_at=func.now())
)
"""A pass's two statements, built once (building them cost more than running them)."""


class OutboxRelay:
    """Moves committed outbox rows to the bus. `publish_pending()` is one pass; `run()` loops."""

    def __init__(
        self,
        source: AsyncEngine | SqlLedger,
        publisher: Publisher,
        *,
        batch_size: int = 100,
        poll_interval_s: float = 1.0,
        keep_published_s: float = 24 * 3600.0,
        test_pause: TestPause | None = None,
    ) -> None:
        self._engine = source.engine if isinstance(source, SqlLedger) else source
        self._publisher = publisher
        self._batch_size = batch_size
        self._poll_interval_s = poll_interval_s
        self._test_pause = test_pause
        self._keep_published_s = keep_published_s
        self._next_prune_at = 0.0

    async def publish_pending(self) -> int:
        """Publish up to one batch of unpublished events, oldest first; returns how many were published.

        If publishing fails for some events, those acknowledged are still marked and the first error
        is raised; the others stay pending for the next pass.
        """
        return await self._publish_pass(None)

    async def _publish_pass(self, on_acknowledged: Callable[[int], None] | None) -> int:
        """`publish_pending()`; calls `on_acknowledged(count)` once every claimed event is acknowledged,
        before marking them (the rows stay locked until the mark commits)."""
        failure: BaseException | None = None
        async with self._engine.begin() as connection:
            claimed = (await connection.execute(_CLAIM, {"batch_size": self._batch_size})).all()
            if not claimed:
                return 0
            await self._maybe_pause("before-publish", [str(row.event_id) for row in claimed])
            published: list[int] = []
            try:
                acks = await self._publish_in_order(claimed)
                for row, ack in zip(claimed, acks, strict=True):
                    if ack is None:
                        published.append(row.id)
                    elif isinstance(ack, Exception):
                        failure = failure or ack
                    else:
                        raise ack
                if failure is None:
                    await self._maybe_pause("after-publish", [str(row.event_id) for row in claimed])
                    if on_acknowledged is not None:
                        on_acknowledged(len(claimed))
            except Exception as error:  # marked below, then re-raised: what was published stays published
                failure = error
            if published:
                await connection.execute(_MARK_PUBLISHED, {"ids": published})
        if failure is not None:
            raise failure
        return len(published)

    async def _publish_in_order(self, rows: Sequence[Any]) -> list[BaseException | None]:
        """Publish every row without waiting for one ack before sending the next; each row's outcome.

        The publishes start in `rows` order (asyncio runs new tasks first come, first served) and each
        hands its message to the connection before it first waits, so the bus stores them in that
        order; the connection sends them together and the acks are awaited together."""
        publishing = [
            asyncio.create_task(
                self._publisher.publish_raw(
                    row.subject,
                    _payload_bytes(row.payload),
                    event_id=str(row.event_id),
                    event_type=row.event_type,
                    occurred_at=row.occurred_at,
                    headers=dict(row.headers) or None,
                )
            )
            for row in rows
        ]
        try:
            return await asyncio.gather(*publishing, return_exceptions=True)
        except BaseException:  # cancelled: no publish outlives the transaction that claimed its row
            for task in publishing:
                task.cancel()
            raise

    async def prune_published(self, older_than_s: float) -> int:
        """Delete events published more than `older_than_s` seconds ago; returns how many went.

        Unpublished events are never deleted. `run()` calls this about once a minute with
        `keep_published_s` (a day by default), well past JetStream's duplicate window.
        """
        outbox = tables.outbox.c
        async with self._engine.begin() as connection:
            deleted = await connection.execute(
                delete(tables.outbox)
                .where(outbox.published_at < func.now() - timedelta(seconds=older_than_s))
                .returning(outbox.id)
            )
            return len(deleted.all())

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop` is set: drain the backlog, then wait for a NOTIFY or the poll interval.

        A pass starts as soon as the previous one's events are all acknowledged, while that one still
        marks them published (its rows stay locked, so the new pass skips them): an event committed
        meanwhile does not wait for the mark. Errors (bus or database unavailable) are logged and
        retried after the poll interval.
        """
        listener: psycopg.AsyncConnection[Any] | None = None
        marking: asyncio.Task[int] | None = None
        try:
            while not stop.is_set():
                if listener is None:
                    listener = await self._listen()
                claimed, marking = await self._overlapping_pass(marking)
                await self._prune_now_and_then()
                if claimed < self._batch_size:
                    listener = await self._wait_for_work(listener, stop)
        finally:
            if marking is not None:
                if stop.is_set():
                    await self._outcome(marking)
                else:
                    marking.cancel()
                    await asyncio.wait({marking})
            if listener is not None:
                await listener.close()

    async def _overlapping_pass(
        self, marking: asyncio.Task[int] | None
    ) -> tuple[int, asyncio.Task[int] | None]:
        """Start a pass; return once its events are acknowledged (how many, and the task still marking
        them) or it has ended (how many it published, and None). The previous pass's marking task is
        awaited first, so at most two passes overlap."""
        acknowledged: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_acknowledged(count: int) -> None:
            if not acknowledged.done():
                acknowledged.set_result(count)

        current = asyncio.create_task(self._publish_pass(on_acknowledged), name="outbox-pass")
        try:
            await asyncio.wait({current, acknowledged}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            current.cancel()
            raise
        if marking is not None:
            await self._outcome(marking)
        if current.done():
            return await self._outcome(current), None
        return acknowledged.result(), current

    async def _outcome(self, task: asyncio.Task[int]) -> int:
        """The events a finished (or finishing) pass published; its failure logged, counted as none."""
        try:
            published = await task
        except Exception as error:  # the relay outlives a bus or database outage
            log.warning(
                "outbox publish failed; retrying",
                extra={"outcome": "retry", "error": f"{type(error).__name__}: {error}"},
            )
            return 0
        if published:
            log.info("outbox published", extra={"count": published, "outcome": "published"})
        return published

    async def _prune_now_and_then(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._next_prune_at:
            return
        self._next_prune_at = now + PRUNE_INTERVAL_S
        try:
            pruned = await self.prune_published(self._keep_published_s)
        except Exception as error:  # pruning is housekeeping: never stop publishing for it
            log.warning("outbox prune failed", extra={"outcome": "error", "error": str(error)})
            return
        if pruned:
            log.info("outbox pruned", extra={"outcome": "pruned", "count": pruned})

    async def _listen(self) -> psycopg.AsyncConnection[Any] | None:
        conninfo = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            connection = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            await connection.execute(f"LISTEN {tables.OUTBOX_CHANNEL}")
        except psycopg.Error as error:
            log.warning("outbox LISTEN unavailable, polling", extra={"error": str(error)})
            return None
        return connection

    async def _wait_for_work(
        self, listener: psycopg.AsyncConnection[Any] | None, stop: asyncio.Event
    ) -> psycopg.AsyncConnection[Any] | None:
        if listener is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._poll_interval_s)
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._poll_interval_s
        try:
            while not stop.is_set() and loop.time() < deadline:
                # Short waits keep the relay responsive to `stop` without cancelling psycopg mid-read.
                wait_s = min(STOP_CHECK_INTERVAL_S, max(deadline - loop.time(), 0.0))
                notified = False
                async for _ in listener.notifies(timeout=wait_s, stop_after=1):
                    notified = True
                if notified:
                    break
        except psycopg.Error as error:
            log.warning("outbox LISTEN connection lost", extra={"error": str(error)})
            await listener.close()
            return None
        return listener

    async def _maybe_pause(self, point: PausePoint, event_ids: Sequence[str]) -> None:
        if self._test_pause is None or self._test_pause.point != point:
            return
        await asyncio.to_thread(self._test_pause.marker.write_text, "\n".join(event_ids))
        await asyncio.Event().wait()  # until the test kills this process


def _payload_bytes(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


class RelayConnectionError(RuntimeError):
    """The NATS server refused the relay's credentials (a retry would be refused again)."""


async def _credentials_refusal(
    url: str, user: str | None, password: str | None, tls: ssl.SSLContext | None
) -> str | None:
    """The server's refusal when it rejects these credentials; None when it accepts them or is not
    reachable yet (the bus connection then waits for it). A refused TLS certificate raises
    `RelayConnectionError` naming the TF_NATS_TLS_* setting to fix."""

    async def ignore(_: Exception) -> None:
        return None

    try:
        probe = await nats.connect(
            url,
            user=user,
            password=password,
            allow_reconnect=False,
            connect_timeout=5,
            error_cb=ignore,
            tls=tls,
        )
    except ssl.SSLError as error:
        if (refused := verification_failure(url, error)) is not None:
            raise RelayConnectionError(str(refused)) from error
        return None
    except nats.errors.Error as error:
        return str(error) if "authorization" in str(error).lower() else None
    except (OSError, TimeoutError):
        return None
    await probe.close()
    return None


async def _serve(
    database_url: str, nats_url: str, nats_settings: NatsSettings, test_pause: TestPause | None
) -> None:
    from tfcommon.bus import NatsEventBus

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop_signal, stop.set)
    password = nats_settings.password.get_secret_value() if nats_settings.password is not None else None
    tls = client_context(nats_settings)
    refusal = await _credentials_refusal(nats_url, nats_settings.user, password, tls)
    if refusal is not None:
        who = f"user {nats_settings.user!r}" if nats_settings.user else "no user (TF_NATS_USER unset)"
        raise RelayConnectionError(
            f"NATS at {nats_url} refused the relay as {who} ({refusal}); on a secured server set "
            f"TF_NATS_USER={RELAY_NATS_USER} and TF_NATS_PASSWORD to that user's password"
        )
    bus = await NatsEventBus.connect(
        nats_url, service="outbox-relay", user=nats_settings.user, password=password, tls=tls
    )
    engine = create_async_engine(ledger_url(database_url), pool_size=2, pool_pre_ping=True)
    try:
        await OutboxRelay(engine, bus, test_pause=test_pause).run(stop)
    finally:
        await bus.close()
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the relay until SIGTERM/SIGINT; returns 1 when NATS refuses or cannot be reached.

    URLs default to TF_DATABASE_URL and TF_NATS_URL; the NATS user and password come from
    TF_NATS_USER and TF_NATS_PASSWORD (the user may also be given with `--nats-user`).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfcommon.ledger.outbox", description="Publish committed ledger events to NATS"
    )
    parser.add_argument("--database-url", default=os.environ.get("TF_DATABASE_URL"))
    parser.add_argument("--nats-url", default=os.environ.get("TF_NATS_URL"))
    parser.add_argument(
        "--nats-user",
        default=None,
        help=f"NATS user (default TF_NATS_USER); {RELAY_NATS_USER} on a secured server",
    )
    args = parser.parse_args(argv)
    if not args.nats_url:
        parser.error("--nats-url: unset; pass it or set TF_NATS_URL (e.g. nats://127.0.0.1:4222)")
    try:
        ledger_url(args.database_url or "")
        test_pause = TestPause.from_environment(os.environ)
        nats_settings = NatsSettings()
    except (DatabaseUrlError, ValueError, ValidationError) as error:
        parser.error(str(error))
    if args.nats_user:
        nats_settings = nats_settings.model_copy(update={"user": args.nats_user})
    if nats_settings.user and nats_settings.password is None:
        parser.error(f"TF_NATS_PASSWORD: unset; give the password of NATS user {nats_settings.user!r}")
    configure_logging("outbox-relay", os.environ.get("TF_LOG_LEVEL", "INFO"))
    try:
        asyncio.run(_serve(args.database_url, args.nats_url, nats_settings, test_pause))
    except (RelayConnectionError, NatsTlsError) as error:
        log.error(str(error), extra={"outcome": "error"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
