"""`enabled-replicas` counted in a real ledger: never more than N taken over, released when pods go."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.config_source import ConfigSource
from tfcommon.ledger.takeover import TakeoverGate, TakeoverLedger, release_takeover
from tfwebhook.http import AdmissionService
from tfwebhook.testing import a_gpu_container, a_pod, a_review

pytestmark = pytest.mark.integration
REPLICAS = 8


def replica(template_hash: str, enabled_replicas: int) -> dict[str, Any]:
    return a_pod(
        labels={"tensor-fusion.ai/enabled": "true", "pod-template-hash": template_hash},
        annotations={
            "tensor-fusion.ai/isolation": "shared",
            "tensor-fusion.ai/enabled-replicas": str(enabled_replicas),
        },
        containers=[a_gpu_container()],
        name=None,
        owner=("ReplicaSet", f"llm-{template_hash}"),
    )


async def admit_replicas(
    service: AdmissionService, template_hash: str, enabled_replicas: int, count: int, *, dry_run: bool = False
) -> dict[str, bool]:
    """Admit `count` pods at once; returns slot id (request uid) -> taken over."""
    uids = [f"{template_hash}-{uuid4().hex[:8]}" for _ in range(count)]

    async def one(uid: str) -> bool:
        status, body = await service.review(
            a_review(replica(template_hash, enabled_replicas), uid=uid, dry_run=dry_run)
        )
        assert status == 200
        response = json.loads(body)["response"]
        assert response["allowed"] is True
        if "patch" not in response:
            return False
        patch = json.loads(base64.b64decode(response["patch"]))
        assert {
            "op": "add",
            "path": "/metadata/annotations/tensor-fusion.ai~1takeover-slot",
            "value": uid,
        } in patch
        return True

    results = await asyncio.gather(*(one(uid) for uid in uids))
    return dict(zip(uids, results, strict=True))


def a_service(engine: AsyncEngine, full_ttl_s: float = 2.0) -> AdmissionService:
    return AdmissionService(
        config=ConfigSource(None), takeovers=TakeoverGate(TakeoverLedger(engine), full_ttl_s=full_ttl_s)
    )


async def test_rollout_in_stages_takes_over_1_then_25_50_and_100_percent(webhook_engine: AsyncEngine) -> None:
    service = a_service(webhook_engine, full_ttl_s=0)
    ledger = TakeoverLedger(webhook_engine)
    previous: dict[str, bool] = {}
    for stage, enabled in enumerate([1, REPLICAS // 4, REPLICAS // 2, REPLICAS]):
        template_hash = f"stage{stage}-{uuid4().hex[:6]}"
        for slot_id, taken in previous.items():  # the rolling update deletes the previous pods
            assert await release_takeover(webhook_engine, slot_id) is taken
        admitted = await admit_replicas(service, template_hash, enabled, REPLICAS)
        assert sum(admitted.values()) == enabled
        assert await ledger.held(f"ml-team-a/ReplicaSet/llm-{template_hash}/{template_hash}") == enabled
        previous = admitted


async def test_a_deleted_pod_frees_its_slot_for_the_replacement(webhook_engine: AsyncEngine) -> None:
    service = a_service(webhook_engine, full_ttl_s=0)
    template_hash = uuid4().hex[:8]
    first = await admit_replicas(service, template_hash, 2, 4)
    taken = [slot for slot, was_taken in first.items() if was_taken]
    assert len(taken) == 2
    assert await release_takeover(webhook_engine, taken[0]) is True
    assert await release_takeover(webhook_engine, taken[0]) is False
    replacement = await admit_replicas(service, template_hash, 2, 3)
    assert sum(replacement.values()) == 1
    assert (
        await TakeoverLedger(webhook_engine).held(f"ml-team-a/ReplicaSet/llm-{template_hash}/{template_hash}")
        == 2
    )


async def test_concurrent_webhook_replicas_never_take_over_more_than_n(webhook_engine: AsyncEngine) -> None:
    replicas = [a_service(webhook_engine) for _ in range(4)]
    template_hash = uuid4().hex[:8]
    results = await asyncio.gather(*(admit_replicas(service, template_hash, 5, 10) for service in replicas))
    assert sum(sum(result.values()) for result in results) == 5


async def test_a_full_workload_is_answered_from_the_cache_without_exceeding_n(
    webhook_engine: AsyncEngine,
) -> None:
    now = [0.0]
    ledger = TakeoverLedger(webhook_engine)
    gate = TakeoverGate(ledger, full_ttl_s=5.0, clock=lambda: now[0])
    key = f"ns/ReplicaSet/cache-{uuid4().hex[:6]}/h"
    assert await gate.claim("a-" + key, key, 1) is True
    assert await gate.claim("b-" + key, key, 1) is False
    await ledger.release("a-" + key)  # released by another process: this gate still says full
    assert await gate.claim("c-" + key, key, 1) is False
    assert await ledger.held(key) == 0
    now[0] += 5.0
    assert await gate.claim("c-" + key, key, 1) is True
    assert await gate.claim("c-" + key, key, 1) is True  # a retried admission keeps its one slot
    assert await ledger.held(key) == 1


async def test_a_dry_run_claims_nothing(webhook_engine: AsyncEngine) -> None:
    service = a_service(webhook_engine)
    template_hash = uuid4().hex[:8]
    assert sum((await admit_replicas(service, template_hash, 1, 3, dry_run=True)).values()) == 3
    assert (
        await TakeoverLedger(webhook_engine).held(f"ml-team-a/ReplicaSet/llm-{template_hash}/{template_hash}")
        == 0
    )


async def test_a_resync_frees_slots_of_pods_that_never_appeared(webhook_engine: AsyncEngine) -> None:
    ledger = TakeoverLedger(webhook_engine)
    key = f"ns/ReplicaSet/sweep-{uuid4().hex[:6]}/h"
    for slot in ("live", "never-created", "fresh"):
        assert await ledger.claim(f"{slot}-{key}", key, 3) is True
    async with webhook_engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE takeover_slot SET claimed_at = now() - interval '1 hour' "
                "WHERE workload_key = :key AND slot_id <> :fresh"
            ),
            {"key": key, "fresh": f"fresh-{key}"},
        )
    released = await ledger.sweep({f"live-{key}"}, claimed_before=datetime.now(UTC) - timedelta(minutes=5))
    assert released == 1
    assert await ledger.held(key) == 2
    assert await ledger.claim(f"next-{key}", key, 3) is True
