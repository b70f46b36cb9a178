"""The `Ledger` port: what the services ask of the ledger, as a contract without a database.

Services take a `Ledger` (`ServiceContext.ledger`) and never query the ledger's tables (nodes, GPUs,
allocations, their history, holds, the outbox) themselves; `tfcommon.ledger.sql.SqlLedger` is the
Postgres adapter that satisfies it. The ledger's records come from `tfcommon.ledger.records`.

Tables a service owns itself (the scheduler's workloads, the defrag planner's campaigns, the webhook's
pod index sequence, the metrics service's pool samples) live on the same database but are not the
ledger's: the service reaches them with `ServiceContext.database`, and commits its own statements
with the ledger's changes through `transaction()` (`LedgerTransaction.connection`). Another service
reads such a table here, not with its own SQL (the metrics dashboard reads the planner's campaigns
and the scheduler's pending workloads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

from tfcommon.ledger.records import (
    AllocationRecord,
    DefragCampaignSummary,
    GpuRecord,
    GpuSpec,
    HeldShare,
    HoldFor,
    HoldRecord,
    NamespaceShare,
    NodeRecord,
    NodeSpec,
    NodeState,
    PendingSubmission,
    PlacementFacts,
    PoolRecord,
    QuotaHeld,
    ReservationRequest,
    ReservationResult,
)

if TYPE_CHECKING:
    from sqlalchemy import Executable

    from tfcommon.ledger.sql import LedgerTransaction


class Ledger(Protocol):
    """The ledger of GPU capacity and allocations as the services use it.

    Every method is safe to call concurrently, from any number of processes. Changes write their
    history and their outbox event with them (the outbox relay publishes), so a caller never publishes
    a ledger change itself. Methods that return `bool` return False when the node, GPU or allocation
    named is unknown (or, for `commit`/`release`, already in that state).
    """

    # registration (the scheduler, from the node agents' reports)

    async def upsert_node(self, node: NodeSpec) -> None:
        """Register the node or update it, keeping the planner's markers and the operator's labels."""
        ...

    async def upsert_gpu(self, gpu: GpuSpec) -> None:
        """Register the GPU or update its capacity; `LedgerInputError` below what is reserved on it."""
        ...

    async def set_gpu_phase(self, gpu_uuid: str, phase: str) -> bool:
        """Set the GPU's phase (`Running`, `Unhealthy`, ...)."""
        ...

    async def record_heartbeat(self, node_name: str, *, ready: bool = True) -> bool:
        """Stamp the node's last heartbeat with now, and whether it is ready."""
        ...

    async def set_node_label(self, node_name: str, key: str, value: str | None) -> bool:
        """Set the node's label `key` to `value`, or remove it when `value` is None."""
        ...

    async def set_node_cordoned(self, node_name: str, cordoned: bool) -> bool:
        """Cordon or uncordon the node (no new placements on it while cordoned)."""
        ...

    async def set_node_markers(
        self, node_name: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> bool:
        """Set the node's `labels` and `annotations` given a value and remove those given None, at once
        (the defrag planner's markers, which the scheduler's view and `reserve` read)."""
        ...

    # reads

    async def list_pools(self) -> list[PoolRecord]:
        """Every pool, by name."""
        ...

    async def list_nodes(self) -> list[NodeRecord]:
        """Every node, by name."""
        ...

    async def list_gpus(self) -> list[GpuRecord]:
        """Every GPU, by node and index."""
        ...

    async def node_states(self) -> list[NodeState]:
        """Every node's flags, last heartbeat and drain marker, by name, without labels or GPUs."""
        ...

    async def node_inventory(self, name: str) -> tuple[NodeRecord, list[GpuRecord]] | None:
        """The node and its GPUs (by index), read together; None when the ledger has no such node."""
        ...

    async def placement_facts(self) -> PlacementFacts:
        """Nodes, GPUs and unreleased allocations as one consistent snapshot (the scheduler's view)."""
        ...

    async def active_allocations(self) -> list[AllocationRecord]:
        """Every allocation not released, oldest first."""
        ...

    async def get_allocation(self, allocation_id: UUID) -> AllocationRecord | None:
        """The allocation with its shares, released or not; None when unknown."""
        ...

    async def get_allocations(self, allocation_ids: Sequence[UUID]) -> dict[UUID, AllocationRecord]:
        """`get_allocation` of each id, in one read; unknown ids are left out."""
        ...

    async def namespace_shares(self, namespaces: Sequence[str] | None = None) -> list[NamespaceShare]:
        """The unreleased shares of `namespaces` (all when None), what quota usage is counted from."""
        ...

    async def active_holds(self) -> list[HoldRecord]:
        """The defrag holds not yet claimed, released or expired."""
        ...

    async def expired_holds(self) -> list[HoldRecord]:
        """The defrag holds past their expiry and not yet released."""
        ...

    async def held_shares(self, start: datetime, end: datetime) -> list[HeldShare]:
        """Every GPU share that held capacity at some moment in [start, end), with the interval it
        held it (from the allocation history), by the moment it opened: what billing prices."""
        ...

    async def latest_defrag_campaigns(self) -> list[DefragCampaignSummary]:
        """Each pool's running defrag campaign, if any, and its last finished one, by pool name."""
        ...

    async def defrag_campaigns_since(self, start: datetime, *, limit: int) -> list[DefragCampaignSummary]:
        """The defrag campaigns running now or finished at or after `start`, the `limit` that started
        last, oldest first."""
        ...

    async def pending_workloads(self, limit: int) -> tuple[list[PendingSubmission], int]:
        """The first `limit` workloads the scheduler keeps pending, in its order (highest priority, then
        QoS, then the oldest), and how many are pending in all."""
        ...

    # changes

    async def reserve(self, request: ReservationRequest, *, commit: bool = False) -> ReservationResult:
        """Take the request's capacity on its GPUs, all or nothing; replaying an id takes nothing twice."""
        ...

    async def reserve_within_quota(
        self,
        request: ReservationRequest,
        check: Callable[[Sequence[NamespaceShare]], str | None],
        *,
        commit: bool = False,
    ) -> ReservationResult | QuotaHeld:
        """`reserve()` only if `check` (of the namespace's shares, under its lock) returns None."""
        ...

    async def reserve_many(
        self,
        requests: Sequence[ReservationRequest],
        *,
        commit: bool = False,
        then: Executable | None = None,
    ) -> list[ReservationResult]:
        """`reserve()` each request, in order, in one transaction; `then` runs in it last."""
        ...

    async def commit(self, allocation_id: UUID, cause: UUID | None = None) -> bool:
        """Mark a reserved allocation committed (its pod is bound)."""
        ...

    async def release(
        self, allocation_id: UUID, reason: str, cause: UUID | None = None, *, evicted: bool = False
    ) -> bool:
        """Give the allocation's capacity back; idempotent."""
        ...

    async def reserve_hold(self, request: ReservationRequest, held_for: HoldFor) -> ReservationResult:
        """Reserve capacity kept for an evicted workload's replacement (a defrag hold)."""
        ...

    async def claim_hold(self, hold_id: UUID, request: ReservationRequest) -> ReservationResult | None:
        """Hand the hold's GPUs to the replacement's `request`; None when the hold is gone."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[LedgerTransaction]:
        """One transaction for the caller's own statements, reservations, releases and events."""
        ...
