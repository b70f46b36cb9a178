"""`tfctl events tail` prints each new message on the bus as one line, without consuming it."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from tfcommon.bus import NatsEventBus
from tfcommon.events import DiscoverGpus, NodeDrained
from tfctl.commands.events import tail
from tfctl.main import main

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


async def test_tail_prints_new_events_matching_the_pattern(nats_bus: NatsEventBus, nats_url: str) -> None:
    out = io.StringIO()
    subscribed = asyncio.Event()
    task = asyncio.create_task(
        tail(nats_url, pattern="tf.evt.node.*", as_json=False, count=2, out=out, subscribed=subscribed)
    )
    await asyncio.wait_for(subscribed.wait(), timeout=10)
    drained = [
        NodeDrained(event_id=uuid4(), occurred_at=NOW, node=f"n{i}", pool="p", pods_moved=i) for i in (1, 2)
    ]
    for event in drained:
        await nats_bus.publish(event)

    await asyncio.wait_for(task, timeout=10)

    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    for line, event in zip(lines, drained, strict=True):
        assert "tf.evt.node.drained" in line
        assert str(event.event_id) in line
        assert f'"pods_moved":{event.pods_moved}' in line


async def test_tail_json_watches_commands_too(nats_bus: NatsEventBus, nats_url: str, node: str) -> None:
    out = io.StringIO()
    subscribed = asyncio.Event()
    task = asyncio.create_task(
        tail(
            nats_url,
            pattern=f"tf.cmd.node-agent.*.{node}",
            as_json=True,
            count=1,
            out=out,
            subscribed=subscribed,
        )
    )
    await asyncio.wait_for(subscribed.wait(), timeout=10)
    command = DiscoverGpus(event_id=uuid4(), occurred_at=NOW, node=node)
    await nats_bus.publish(command)

    await asyncio.wait_for(task, timeout=10)

    record = json.loads(out.getvalue())
    assert record["subject"] == command.routing_subject()
    assert record["headers"]["ce-id"] == str(command.event_id)
    assert record["payload"]["node"] == node


def test_tail_without_a_nats_url_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TF_NATS_URL", raising=False)

    assert main(["events", "tail"]) == 2
    assert "set TF_NATS_URL or pass --nats-url" in capsys.readouterr().err
