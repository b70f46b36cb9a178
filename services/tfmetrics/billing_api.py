"""`GET /api/v1/billing`: a bill for any period from the ledger, priced with the pools' `qosConfig`.

The HTTP shell around `tfmetrics.core.billing`: parses the query (bad input is a 400 naming the
parameter and the fix), reads the held intervals from the ledger (`Ledger.held_shares`) and renders
the `Bill` as JSON with money as decimal strings (never floats). Where a GPU model has no dedicated
price, `dedicatedCost` and `savings` are null and `savingsUnknownReason` says which model and how to
price it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from tfcommon.config import TfConfig
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import HeldShare

from tfmetrics.core.billing import (
    GROUP_BY_CHOICES,
    Bill,
    BillableShare,
    BillingInputError,
    GroupBy,
    PoolPricing,
    compute_bill,
    unpriced_note,
)
from tfmetrics.core.pricing import PricingError, parse_pool_pricing

DEFAULT_PERIOD = timedelta(days=30)
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class QueryError(ValueError):
    """A query parameter is malformed; the message names it and the fix."""


def parse_time(value: str, parameter: str) -> datetime:
    """ISO 8601 with a time zone (`2026-11-01T00:00:00Z`), or a date (`2026-11-01`, midnight UTC)."""
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(
            f"{parameter}: {value!r} is not a time; use ISO 8601 such as 2026-11-01T00:00:00Z or 2026-11-01"
        ) from None
    if moment.utcoffset() is None:
        if len(value.strip()) > len("2026-11-01"):
            raise QueryError(f"{parameter}: {value!r} has no time zone; add one, e.g. {value.strip()}Z")
        moment = moment.replace(tzinfo=UTC)
    return moment


def billable_share(share: HeldShare) -> BillableShare:
    """The ledger's held interval as billing prices it: the workload is the owner, else the pod, and
    the eviction-protection window runs from the share's start."""
    protection_s = share.eviction_protection_s
    return BillableShare(
        allocation_id=str(share.allocation_id),
        gpu_uuid=share.gpu_uuid,
        namespace=share.workload.namespace,
        pod=share.workload.name,
        workload=share.workload.workload or share.workload.name,
        qos=share.qos,
        pool=share.pool,
        gpu_model=share.gpu_model,
        request_tflops_milli=share.request_tflops_milli,
        request_vram_bytes=share.request_vram_bytes,
        limit_tflops_milli=share.limit_tflops_milli,
        limit_vram_bytes=share.limit_vram_bytes,
        start=share.start,
        end=share.end,
        protected_until=share.start + timedelta(seconds=protection_s) if protection_s else None,
    )


def pool_pricing(config: TfConfig, pools: set[str]) -> dict[str, PoolPricing]:
    """Each pool's prices from its `specTemplate.qosConfig`; a pool not in the file gets the defaults."""
    result: dict[str, PoolPricing] = {}
    for name in sorted(pools):
        pool = config.pool(name)
        qos_config: Mapping[str, Any] = {}
        if pool is not None:
            qos_config = pool.spec_template.qos_config.model_dump(by_alias=True, exclude_none=True)
        result[name] = parse_pool_pricing(qos_config, f"gpuPools[{name}].specTemplate.qosConfig")
    return result


async def bill_from_ledger(
    ledger: Ledger,
    config: TfConfig,
    gpu_cost_per_hour: Mapping[str, Decimal],
    *,
    start: datetime,
    end: datetime,
    group_by: GroupBy,
    quantum: Decimal,
) -> Bill:
    """The bill for [start, end) from the ledger's history; raises `BillingInputError`/`PricingError`."""
    if end <= start:
        raise BillingInputError(f"to: {end.isoformat()} must be after from {start.isoformat()}")
    shares = [billable_share(share) for share in await ledger.held_shares(start, end)]
    pricing = pool_pricing(config, {share.pool for share in shares})
    return compute_bill(
        shares, pricing, gpu_cost_per_hour, start=start, end=end, group_by=group_by, quantum=quantum
    )


def _money(amount: Decimal | None) -> str | None:
    return None if amount is None else str(amount)


def _savings_unknown(unpriced_models: tuple[str, ...]) -> str | None:
    return unpriced_note(unpriced_models) if unpriced_models else None


def bill_to_json(bill: Bill) -> dict[str, Any]:
    """The wire form of a bill: money as decimal strings (null where unknown), times in ISO 8601."""
    return {
        "from": bill.start.isoformat(),
        "to": bill.end.isoformat(),
        "groupBy": bill.group_by,
        "quantum": str(bill.quantum),
        "cost": str(bill.cost),
        "dedicatedCost": _money(bill.dedicated_cost),
        "savings": _money(bill.savings),
        "savingsUnknownReason": _savings_unknown(bill.unpriced_models),
        "groups": [
            {
                "key": line.key,
                "cost": str(line.cost),
                "dedicatedCost": _money(line.dedicated_cost),
                "savings": _money(line.savings),
                "savingsUnknownReason": _savings_unknown(line.unpriced_models),
                "gpuHours": str(line.gpu_hours),
                "shares": line.shares,
            }
            for line in bill.lines
        ],
        "notes": list(bill.notes),
    }


def _parse_quantum(value: str) -> Decimal:
    try:
        quantum = Decimal(value)
    except InvalidOperation:
        quantum = Decimal("NaN")
    if not quantum.is_finite() or quantum <= 0:
        raise QueryError(f"quantum: {value!r} must be a positive amount such as 0.01 or 0.000001")
    return quantum


def build_billing_router(
    ledger: Ledger,
    config: Callable[[], TfConfig],
    gpu_cost_per_hour: Mapping[str, Decimal],
    clock: Clock = utc_now,
) -> APIRouter:
    """The billing endpoint over `ledger`; `config` returns the configuration in force."""
    router = APIRouter(tags=["billing"])

    @router.get("/api/v1/billing")
    async def get_billing(
        start: str | None = Query(default=None, alias="from"),
        end: str | None = Query(default=None, alias="to"),
        group_by: str = Query(default="namespace", alias="groupBy"),
        quantum: str = Query(default="0.01"),
    ) -> JSONResponse:
        try:
            period_end = parse_time(end, "to") if end else clock()
            period_start = parse_time(start, "from") if start else period_end - DEFAULT_PERIOD
            if group_by not in GROUP_BY_CHOICES:
                raise QueryError(f"groupBy: {group_by!r} is not one of {', '.join(GROUP_BY_CHOICES)}")
            bill = await bill_from_ledger(
                ledger,
                config(),
                gpu_cost_per_hour,
                start=period_start,
                end=period_end,
                group_by=group_by,
                quantum=_parse_quantum(quantum),
            )
        except (QueryError, BillingInputError) as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        except PricingError as error:
            return JSONResponse({"error": f"configuration file: {error}"}, status_code=503)
        return JSONResponse(bill_to_json(bill))

    return router
