"""`tfctl bench ledger` and `tfctl bench outbox` at a tiny size on real Postgres and NATS JetStream:
the document has the shape `make bench` relies on, and every reservation and event is accounted for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from sqlalchemy import Select, func, inspect, select
from sqlalchemy.ext.asyncio import create_async_engine
from tfcommon.ledger import tables
from tfcommon.ledger.urls import ledger_url
from tfctl.bench_ledger import MODES, measure_ledger
from tfctl.bench_outbox import measure_outbox
from tfctl.bench_servers import scratch_database
from tfctl.main import main

pytestmark = pytest.mark.integration


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "test_bench") as url:
        yield url


async def _count(url: str, *statements: Select[Any]) -> list[int]:
    engine = create_async_engine(ledger_url(url))
    try:
        async with engine.connect() as connection:
            return [int(await connection.scalar(statement) or 0) for statement in statements]
    finally:
        await engine.dispose()


async def test_ledger_benchmark_makes_every_reservation_it_reports(database_url: str) -> None:
    result = await measure_ledger(database_url, reservations=12, concurrency=4, batch=5)

    assert set(result["modes"]) == set(MODES)
    for measured in result["modes"].values():
        assert measured["reservations"] == 12
        assert measured["reservations_per_second"] > 0
        assert measured["baseline_inserts_per_second"] > 0
        expected = measured["reservations_per_second"] / measured["baseline_inserts_per_second"]
        assert measured["ratio"] == pytest.approx(expected, rel=0.01)
    assert result["rows"] == {"allocations": 36, "outbox_events": 36, "baseline_rows": 36}
    allocation, outbox = tables.allocation.c, tables.outbox.c
    allocations, shares, events = await _count(
        database_url,
        select(func.count(allocation.allocation_id.distinct())),
        select(func.count()).select_from(tables.allocation).where(allocation.state == "reserved"),
        select(func.count()).select_from(tables.outbox).where(outbox.subject == "tf.evt.allocation.created"),
    )
    assert (allocations, shares, events) == (36, 36, 36)
    engine = create_async_engine(ledger_url(database_url))
    try:
        async with engine.connect() as connection:
            names = await connection.run_sync(lambda sync: inspect(sync).get_table_names())
    finally:
        await engine.dispose()
    assert not [name for name in names if name.startswith("bench_insert")], "the baseline table is dropped"


async def test_outbox_benchmark_relays_every_event_once(database_url: str, nats_url: str) -> None:
    result = await measure_outbox(database_url, nats_url, events=40, batch_size=16)

    assert result["counts"] == {
        "relayed": 40,
        "relay_received": 40,
        "relay_stored": 40,
        "bare_received": 40,
        "bare_stored": 40,
        "outbox_unpublished": 0,
    }
    relay, bare = result["relay"]["events_per_second"], result["bare_publish"]["events_per_second"]
    assert relay > 0
    assert bare > 0
    assert result["ratio"] == pytest.approx(relay / bare, rel=0.01)
    outbox = tables.outbox.c
    (published,) = await _count(
        database_url, select(func.count()).select_from(tables.outbox).where(outbox.published_at.is_not(None))
    )
    assert published == 40
    client = await nats.connect(nats_url)
    try:
        names = [info.config.name for info in await client.jetstream().streams_info()]
    finally:
        await client.close()
    assert not [name for name in names if name and name.startswith("TF_BENCH_")], (
        "the run's stream is deleted"
    )


def test_bench_ledger_command_prints_one_document_with_the_machine_and_ratios(
    postgres_server_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TF_DATABASE_URL", postgres_server_url)

    assert (
        main(["bench", "ledger", "--reservations", "4", "--concurrency", "2", "--batch", "3", "--json"]) == 0
    )

    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert set(document["machine"]) >= {"cpu_model", "cores", "memory_gib", "python"}
    entry = document["targets"]["ledger"]
    assert entry["sizes"] == {"reservations": 4, "concurrency": 2, "batch": 3}
    assert entry["result"]["rows"]["allocations"] == 12
    assert len(entry["figures"]) == 3
    assert all(figure["ratio"] > 0 for figure in entry["figures"])
    assert "bench ledger" in captured.err


def test_bench_ledger_command_names_a_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "ledger", "--batch", "0"]) == 2
    assert "--batch: 0" in capsys.readouterr().err
