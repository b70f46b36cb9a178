"""The `LeaseStore` contract, on the in-memory fake and on `KubernetesCluster` over HTTP: Leases are created
once, and written only with the version read, so two candidates never both win."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import cast

from cluster_harness import Harness
from tfcommon.cluster import Applied, Conflict, NotFound
from tfcommon.cluster.model import LeaseRecord
from tfcommon.cluster.port import LeaseStore

NAMESPACE = "tfpool-system"
NAME = "tfpool-scheduler"
T0 = datetime(2026, 12, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def leases(harness: Harness) -> LeaseStore:
    return cast(LeaseStore, harness.cluster)


async def test_a_created_lease_reads_back_with_its_fields_and_version(harness: Harness) -> None:
    store = leases(harness)
    assert await store.get_lease(NAMESPACE, NAME) is None

    created = await store.create_lease(NAMESPACE, NAME, LeaseRecord("a", 15, T0, T0, 0))

    assert isinstance(created, Applied)
    read = await store.get_lease(NAMESPACE, NAME)
    assert read == LeaseRecord("a", 15, T0, T0, 0, resource_version=created.resource_version)


async def test_a_whole_second_is_stored_and_read_back(harness: Harness) -> None:
    whole = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)

    await leases(harness).create_lease(NAMESPACE, NAME, LeaseRecord("a", 15, whole, whole, 0))

    read = await leases(harness).get_lease(NAMESPACE, NAME)
    assert read is not None
    assert read.renew_time is not None
    assert abs(read.renew_time - whole) <= timedelta(microseconds=1)


async def test_only_the_first_of_two_creations_wins(harness: Harness) -> None:
    store = leases(harness)
    first = await store.create_lease(NAMESPACE, NAME, LeaseRecord("a", 15, T0, T0, 0))

    second = await store.create_lease(NAMESPACE, NAME, LeaseRecord("b", 15, T0, T0, 0))

    assert isinstance(first, Applied)
    assert isinstance(second, Conflict)
    read = await store.get_lease(NAMESPACE, NAME)
    assert read is not None
    assert read.holder_identity == "a"


async def test_an_update_from_a_stale_read_is_refused_and_changes_nothing(harness: Harness) -> None:
    store = leases(harness)
    await store.create_lease(NAMESPACE, NAME, LeaseRecord("a", 15, T0, T0, 0))
    seen = await store.get_lease(NAMESPACE, NAME)
    assert seen is not None
    later = T0 + timedelta(seconds=20)

    won = await store.update_lease(NAMESPACE, NAME, replace(seen, holder_identity="b", renew_time=later))
    lost = await store.update_lease(NAMESPACE, NAME, replace(seen, holder_identity="c", renew_time=later))

    assert isinstance(won, Applied)
    assert won.resource_version != seen.resource_version
    assert isinstance(lost, Conflict)
    read = await store.get_lease(NAMESPACE, NAME)
    assert read is not None
    assert (read.holder_identity, read.renew_time, read.resource_version) == (
        "b",
        later,
        won.resource_version,
    )


async def test_updating_a_missing_lease_is_not_found(harness: Harness) -> None:
    result = await leases(harness).update_lease(NAMESPACE, NAME, LeaseRecord("a", 15, T0, T0, 0, "1"))

    assert isinstance(result, NotFound)
