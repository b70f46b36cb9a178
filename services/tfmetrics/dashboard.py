"""The dashboard: `GET /` (one self-contained page, no CDN), `GET /api/v1/dashboard` (its data) and
`GET /api/v1/dashboard/history` (its time series).

The page polls the data every two seconds and the history every sample interval. The data comes from
the live view's latest ledger snapshot (`tfmetrics.core.dashboard`: pools, node health, GPUs), the
scheduler's pending workloads, a 24-hour bill with savings (at most `BILL_MAX_AGE_S` old), and each
pool's running and last defrag campaign (`Ledger.latest_defrag_campaigns`); the history from the
service's own pool samples (`tfmetrics.pool_history`) and the defrag campaigns in the window
(`Ledger.defrag_campaigns_since`). A failing bill, campaign or pending read is shown as an error on
the page, never as a failed response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from importlib import resources
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, JSONResponse
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import DefragCampaignSummary

from tfmetrics.core.billing import Bill, BillingInputError
from tfmetrics.core.dashboard import (
    CampaignSummary,
    PendingWorkload,
    dashboard_view,
    defrag_view,
    pending_view,
)
from tfmetrics.core.history import HISTORY_WINDOW, history_view
from tfmetrics.core.pricing import PricingError
from tfmetrics.live import LiveView
from tfmetrics.pool_history import PoolHistory

BILLING_WINDOW = timedelta(hours=24)
BILLING_QUANTUM = Decimal("0.000001")
BILL_MAX_AGE_S = 5.0
"""The page's bill is recomputed in the background once it is this old; until then the last one is shown
(a 24-hour bill of 1,500 GPU shares takes about half a second to compute)."""
BillForWindow = Callable[[timedelta, Decimal], Awaitable[Bill]]
Campaigns = Callable[[], Awaitable[Sequence[CampaignSummary]]]
CampaignsSince = Callable[[datetime], Awaitable[Sequence[CampaignSummary]]]
PendingReads = Callable[[], Awaitable[tuple[Sequence[PendingWorkload], int]]]
T = TypeVar("T")
MAX_HISTORY_HOURS = HISTORY_WINDOW.total_seconds() / 3600
MARKED_CAMPAIGNS_LIMIT = 500
"""The most campaigns one history window marks, the newest (the planner runs a few a day per pool)."""
HistoryHours = Annotated[
    float,
    Query(gt=0, le=MAX_HISTORY_HOURS, description="how far back, in hours (at most 24, the default)"),
]

_log = logging.getLogger("tfmetrics.dashboard")


def dashboard_page() -> str:
    return resources.files("tfmetrics").joinpath("static/dashboard.html").read_text(encoding="utf-8")


async def no_campaigns() -> Sequence[CampaignSummary]:
    return ()


async def no_campaigns_since(_start: datetime) -> Sequence[CampaignSummary]:
    return ()


def campaign_summary(campaign: DefragCampaignSummary) -> CampaignSummary:
    return CampaignSummary(
        pool=campaign.pool,
        trigger=campaign.trigger,
        running=campaign.running,
        started_at=campaign.started_at,
        finished_at=campaign.finished_at,
        deadline_at=campaign.deadline_at,
        outcome=campaign.outcome,
        current_node=campaign.current_node,
        nodes_drained=campaign.nodes_drained,
        nodes_failed=campaign.nodes_failed,
        nodes_skipped=campaign.nodes_skipped,
        pods_evicted=campaign.pods_evicted,
        stranded_pods=campaign.stranded_pods,
    )


async def latest_campaigns(ledger: Ledger) -> list[CampaignSummary]:
    """Each pool's running defrag campaign and its last finished one, by pool name."""
    return [campaign_summary(campaign) for campaign in await ledger.latest_defrag_campaigns()]


async def campaigns_since(ledger: Ledger, start: datetime) -> list[CampaignSummary]:
    """The campaigns running now or finished at or after `start` (the newest `MARKED_CAMPAIGNS_LIMIT`),
    oldest first."""
    campaigns = await ledger.defrag_campaigns_since(start, limit=MARKED_CAMPAIGNS_LIMIT)
    return [campaign_summary(campaign) for campaign in campaigns]


async def no_pending() -> tuple[Sequence[PendingWorkload], int]:
    return (), 0


@dataclass(frozen=True)
class DashboardSources:
    """What the dashboard reads besides the live view: `bill_for_window(window, quantum)` bills the last
    `window`; `campaigns()` each pool's running and last defrag campaign; `campaigns_since(start)` the
    campaigns to mark on the charts; `pending()` the pending workloads and their count; `history` the
    pool samples."""

    bill_for_window: BillForWindow
    bill_to_json: Callable[[Bill], Any]
    history: PoolHistory
    campaigns: Campaigns = no_campaigns
    campaigns_since: CampaignsSince = no_campaigns_since
    pending: PendingReads = no_pending


class _LastBill:
    """The last bill the page was given, recomputed in the background once `BILL_MAX_AGE_S` old, so a
    poll never waits for a bill except the very first. A bill that cannot be computed keeps the last
    one (or, before any, answers an error naming why)."""

    def __init__(self, sources: DashboardSources) -> None:
        self.sources = sources
        self.body: Any = None
        self.computed_at = 0.0
        self.refreshing: asyncio.Task[None] | None = None

    async def _compute(self) -> None:
        try:
            bill = await self.sources.bill_for_window(BILLING_WINDOW, BILLING_QUANTUM)
            self.body = self.sources.bill_to_json(bill)
        except (BillingInputError, PricingError) as error:
            self.body = {"error": str(error)}
        except Exception as error:
            _log.warning(
                "bill not computed",
                extra={"event": "metrics.bill_failed", "outcome": "error", "reason": str(error)},
            )
            if self.body is None or "error" in self.body:
                self.body = {"error": f"the bill cannot be computed: {type(error).__name__}"}
        self.computed_at = time.monotonic()

    async def current(self) -> Any:
        if self.body is None:
            await self._compute()
        elif time.monotonic() - self.computed_at >= BILL_MAX_AGE_S and (
            self.refreshing is None or self.refreshing.done()
        ):
            self.refreshing = asyncio.create_task(self._compute())
        return self.body


async def _read_or_error(read: Callable[[], Awaitable[T]], what: str, event: str) -> T | dict[str, str]:
    try:
        return await read()
    except Exception as error:
        _log.warning(f"{what} not read", extra={"event": event, "outcome": "error", "reason": str(error)})
        return {"error": f"{what} cannot be read: {type(error).__name__}"}


def build_dashboard_router(view: LiveView, sources: DashboardSources) -> APIRouter:
    """The page, its data over `view` and `sources`, and the history of `sources.history`."""
    router = APIRouter(tags=["dashboard"])
    page = dashboard_page()
    last_bill = _LastBill(sources)
    drawn: dict[str, Any] = {}

    @router.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get("/api/v1/dashboard")
    async def data() -> JSONResponse:
        snapshot = view.snapshot if view.snapshot is not None else await view.refresh()
        if drawn.get("snapshot") is not snapshot:
            drawn.update(snapshot=snapshot, view=dashboard_view(snapshot))
        body = dict(drawn["view"])
        body["billing"] = await last_bill.current()
        campaigns = await _read_or_error(sources.campaigns, "defrag campaigns", "metrics.defrag_read_failed")
        body["defrag"] = campaigns if isinstance(campaigns, dict) else defrag_view(campaigns)
        pending = await _read_or_error(sources.pending, "pending workloads", "metrics.pending_read_failed")
        body["pending"] = pending if isinstance(pending, dict) else pending_view(*pending, snapshot.now)
        return JSONResponse(body)

    @router.get("/api/v1/dashboard/history")
    async def history(hours: HistoryHours = MAX_HISTORY_HOURS) -> JSONResponse:
        """Per pool, the samples of the last `hours` as columns, and the defrag campaigns in that window."""
        end = sources.history.clock()
        start = end - timedelta(hours=hours)
        campaigns = await _read_or_error(
            lambda: sources.campaigns_since(start), "defrag campaigns", "metrics.defrag_read_failed"
        )
        body = history_view(
            sources.history.since(start),
            [] if isinstance(campaigns, dict) else campaigns,
            start=start,
            end=end,
            interval=sources.history.interval,
        )
        if isinstance(campaigns, dict):
            body["campaignsError"] = campaigns["error"]
        return JSONResponse(body)

    return router
