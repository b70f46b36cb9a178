"""The dashboard: `GET /` (one self-contained page, no CDN) and `GET /api/v1/dashboard` (its data).

The page polls the JSON endpoint every two seconds. The data comes from the live view's latest ledger
snapshot (`tfmetrics.core.dashboard`), a 24-hour bill with savings, and each pool's running and last
defrag campaign; a failing bill or campaign read is shown as an error on the page, never as a failed
response.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from decimal import Decimal
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from tfmetrics.core.billing import Bill, BillingInputError
from tfmetrics.core.dashboard import CampaignSummary, dashboard_view, defrag_view
from tfmetrics.core.pricing import PricingError
from tfmetrics.live import LiveView

BILLING_WINDOW = timedelta(hours=24)
BILLING_QUANTUM = Decimal("0.000001")
BillForWindow = Callable[[timedelta, Decimal], Awaitable[Bill]]
Campaigns = Callable[[], Awaitable[Sequence[CampaignSummary]]]

_log = logging.getLogger("tfmetrics.dashboard")


def dashboard_page() -> str:
    return resources.files("tfmetrics").joinpath("static/dashboard.html").read_text(encoding="utf-8")


async def no_campaigns() -> Sequence[CampaignSummary]:
    return ()


def build_dashboard_router(
    view: LiveView,
    bill_for_window: BillForWindow,
    bill_to_json: Callable[[Bill], Any],
    campaigns: Campaigns = no_campaigns,
) -> APIRouter:
    """The page and its data over `view`; `bill_for_window(window, quantum)` bills the last `window`;
    `campaigns()` reads the defrag campaigns."""
    router = APIRouter(tags=["dashboard"])
    page = dashboard_page()

    @router.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get("/api/v1/dashboard")
    async def data() -> JSONResponse:
        snapshot = view.snapshot if view.snapshot is not None else await view.refresh()
        body = dashboard_view(snapshot)
        try:
            body["billing"] = bill_to_json(await bill_for_window(BILLING_WINDOW, BILLING_QUANTUM))
        except (BillingInputError, PricingError) as error:
            body["billing"] = {"error": str(error)}
        try:
            body["defrag"] = defrag_view(await campaigns())
        except Exception as error:
            _log.warning(
                "defrag campaigns not read",
                extra={"event": "metrics.defrag_read_failed", "outcome": "error", "reason": str(error)},
            )
            body["defrag"] = {"error": f"defrag campaigns cannot be read: {type(error).__name__}"}
        return JSONResponse(body)

    return router
