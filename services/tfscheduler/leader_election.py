"""`LeaderElector`: campaigns for a Lease through a `LeaseStore` and runs the leader's work while it holds it.

A thin async shell around `tfscheduler.core.leader` (which decides every move). Candidates try every
retry period; the leader renews every retry period and stops its work when a renewal has failed for the
renew deadline or the Lease names someone else; on a clean stop it stops its work first, then releases
the Lease so another candidate takes over at once. Leadership is exported as the gauge
`tf_leader_election_leader` (1 leading, 0 not) with the attributes `lease` and `identity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Iterable
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from tfcommon.cluster.model import Applied, ClusterError
from tfcommon.cluster.port import LeaseStore

from tfscheduler.core.leader import ElectionTimings, Move, decide, released, renewal_overdue

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Lead = Callable[[asyncio.Event], Coroutine[None, None, None]]
"""The leader's work: runs until the event is set (leadership lost or the service stopping), then returns."""

log = logging.getLogger("tfscheduler.leader_election")
_leading: dict[tuple[str, str], int] = {}


def _utc_now() -> datetime:
    return datetime.now(UTC)


def default_identity() -> str:
    """`POD_NAME` (the downward API), else `hostname_pid`: unique per running process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def default_namespace(configured: str | None, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """`configured`, else `POD_NAMESPACE`, else the pod's service-account namespace, else `default`."""
    if configured:
        return configured
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        if namespace := service_account_file.read_text(encoding="utf-8").strip():
            return namespace
    return "default"


def _observe(_options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(value, {"lease": lease, "identity": identity})
        for (lease, identity), value in sorted(_leading.items())
    ]


@cache
def _register_gauge() -> None:
    metrics.get_meter("tfscheduler.leader_election").create_observable_gauge(
        "tf_leader_election_leader", callbacks=[_observe], description="1 while this process holds the lease"
    )


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


class LeaderElector:
    """One candidate for the Lease `namespace/name`; `run` campaigns until `stop` and leads when elected."""

    def __init__(
        self,
        leases: LeaseStore,
        *,
        namespace: str,
        name: str,
        identity: str,
        timings: ElectionTimings,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity: set POD_NAME (the downward API)")
        self.leases = leases
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self.clock = clock
        self.is_leader = False
        self.holder = ""
        """The holder seen in the Lease at the last read ("" when free or not read yet)."""
        self._renewed_at: datetime | None = None
        self._last_move: Move | None = None
        _register_gauge()
        self._set_leader(False)

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def run(self, stop: asyncio.Event, lead: Lead) -> None:
        """Campaign; while leader, run `lead`; after losing the Lease campaign again; return after `stop`
        (releasing the Lease if held). An error raised by `lead` is raised here after the release."""
        while not stop.is_set():
            if await self._campaign(stop):
                await self._lead(stop, lead)

    async def _campaign(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            try:
                if await self._attempt():
                    return True
            except ClusterError as error:
                log.warning("reading or writing the lease %s failed, retrying: %s", self.lease, error)
            await _wait(stop, self.timings.retry_period_s)
        return False

    async def _attempt(self) -> bool:
        """Read the Lease, decide, write; True when this candidate now holds it."""
        lease = await self.leases.get_lease(self.namespace, self.name)
        now = self.clock()
        self.holder = lease.holder_identity if lease is not None else ""
        decision = decide(
            lease, identity=self.identity, now=now, timings=self.timings, leading=self.is_leader
        )
        self._last_move = decision.move
        if decision.record is None:
            return False
        write = self.leases.create_lease if decision.move is Move.CREATE else self.leases.update_lease
        result = await write(self.namespace, self.name, decision.record)
        if not isinstance(result, Applied):
            log.debug("lease %s: %s lost the race (%s)", self.lease, decision.move.value, result)
            return False
        self.holder = self.identity
        self._renewed_at = now
        if decision.move is not Move.RENEW:
            log.info(
                "acquired the lease %s (%s)",
                self.lease,
                decision.reason,
                extra={"event": "leader.acquired", "identity": self.identity, "outcome": "ok"},
            )
        return True

    async def _lead(self, stop: asyncio.Event, lead: Lead) -> None:
        self._set_leader(True)
        term_over = asyncio.Event()
        work = asyncio.create_task(lead(term_over), name=f"leader-{self.name}")
        keeping = asyncio.create_task(self._keep(stop), name=f"lease-{self.name}")
        try:
            await asyncio.wait({work, keeping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Cancelled, not stopped (a crash, as far as the Lease goes): end the work, let the Lease expire.
            term_over.set()
            self._set_leader(False)
            keeping.cancel()
            work.cancel()
            raise
        term_over.set()
        self._set_leader(False)
        lost = keeping.done() and not stop.is_set()
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
        try:
            await work
            if not stop.is_set() and not lost:
                raise RuntimeError(f"the leader's work for lease {self.lease} ended on its own")
        finally:
            if not lost:
                await self._release()

    async def _keep(self, stop: asyncio.Event) -> None:
        """Renew every retry period; return when `stop` is set or leadership is lost."""
        while True:
            await _wait(stop, self.timings.retry_period_s)
            if stop.is_set():
                return
            assert self._renewed_at is not None
            left = self._renewed_at + timedelta(seconds=self.timings.renew_deadline_s) - self.clock()
            try:
                renewed = await asyncio.wait_for(self._attempt(), timeout=max(left.total_seconds(), 0.001))
            except (ClusterError, TimeoutError) as error:
                log.warning("renewing the lease %s failed: %s", self.lease, str(error) or "timed out")
                renewed = False
            if renewed:
                continue
            if self._last_move is Move.STEP_DOWN:
                why = f"the lease now names {self.holder}"
            elif renewal_overdue(self._renewed_at, self.clock(), self.timings):
                why = f"no renewal for {self.timings.renew_deadline_s} s"
            else:
                continue
            log.warning(
                "lost the lease %s: %s; stopping the leader's work",
                self.lease,
                why,
                extra={"event": "leader.lost", "identity": self.identity, "outcome": "error"},
            )
            return

    async def _release(self) -> None:
        """Write the Lease with no holder (only if it still names us), so another candidate takes over now."""
        try:
            lease = await self.leases.get_lease(self.namespace, self.name)
            if lease is None or lease.holder_identity != self.identity:
                return
            result = await self.leases.update_lease(self.namespace, self.name, released(lease, self.clock()))
        except ClusterError as error:
            log.warning("releasing the lease %s failed (it expires on its own): %s", self.lease, error)
            return
        self.holder = "" if isinstance(result, Applied) else self.holder
        log.info(
            "released the lease %s",
            self.lease,
            extra={"event": "leader.released", "identity": self.identity, "outcome": str(result)},
        )

    def _set_leader(self, leading: bool) -> None:
        self.is_leader = leading
        _leading[(self.lease, self.identity)] = int(leading)
