"""Read a pool's `qosConfig` (TensorFusion's shape) into `PoolPricing`; errors name the field and the fix.

Pure: takes the already-loaded YAML mapping. TensorFusion's fields are read as they are
(`pricing[].qos`, `pricing[].requests.perFP16TFlopsPerHour`, `...perGBOfVRAMPerHour` with or without a
leading `$`, `pricing[].limitsOverRequests`, `evictionProtectionPriceRatio`). One addition of ours:
`pricingHistory`, a list of earlier price books each with the `effectiveUntil` time it stopped
applying, so bills over a past price change stay exact. A pool without `pricing` gets TensorFusion's
CRD defaults for every QoS.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from tfcommon.pod_spec import QOS_LEVELS

from tfmetrics.core.billing import (
    DEFAULT_EVICTION_PROTECTION_PRICE_RATIO,
    PoolPricing,
    PriceBook,
    QosPrice,
)

DEFAULT_PER_TFLOPS_HOUR = Decimal("0.0069228")
DEFAULT_PER_VRAM_GIB_HOUR = Decimal("0.01548")
DEFAULT_LIMITS_OVER_REQUESTS = Decimal(1)


class PricingError(ValueError):
    """The pricing configuration is invalid; `str()` names the field path and the fix."""


def parse_money(value: object, field: str) -> Decimal:
    """`"$0.0069228"`, `"0.0069228"` or a number -> Decimal; never through a float."""
    text = str(value).strip()
    if isinstance(value, bool) or value is None:
        text = ""
    text = text.removeprefix("$").strip()
    try:
        amount = Decimal(text)
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or amount < 0:
        raise PricingError(f'{field}: {value!r} is not an amount; write it like "$0.0069228" or "1.2"')
    return amount


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PricingError(f"{field}: expected a mapping, got {type(value).__name__}")
    return value


def _price_book(section: Mapping[str, Any], field: str) -> PriceBook:
    ratio = DEFAULT_EVICTION_PROTECTION_PRICE_RATIO
    if section.get("evictionProtectionPriceRatio") is not None:
        ratio = parse_money(section["evictionProtectionPriceRatio"], f"{field}.evictionProtectionPriceRatio")
    entries = section.get("pricing")
    if entries is None:
        default = QosPrice(DEFAULT_PER_TFLOPS_HOUR, DEFAULT_PER_VRAM_GIB_HOUR, DEFAULT_LIMITS_OVER_REQUESTS)
        return PriceBook(prices=dict.fromkeys(QOS_LEVELS, default), eviction_protection_price_ratio=ratio)
    if not isinstance(entries, list):
        raise PricingError(f"{field}.pricing: expected a list such as [{{qos: low, requests: {{...}}}}]")
    prices: dict[str, QosPrice] = {}
    for index, raw in enumerate(entries):
        path = f"{field}.pricing[{index}]"
        entry = _mapping(raw, path)
        qos = entry.get("qos")
        if qos is None:
            continue  # TensorFusion accepts it and prices no QoS with it (its prices are looked up by QoS)
        if qos not in QOS_LEVELS:
            raise PricingError(f"{path}.qos: {qos!r} is not one of {', '.join(QOS_LEVELS)}")
        if qos in prices:
            raise PricingError(f"{path}.qos: {qos} is priced twice; keep one entry per QoS")
        requests = _mapping(entry.get("requests") or {}, f"{path}.requests")
        prices[qos] = QosPrice(
            per_tflops_hour=parse_money(
                requests.get("perFP16TFlopsPerHour", DEFAULT_PER_TFLOPS_HOUR),
                f"{path}.requests.perFP16TFlopsPerHour",
            ),
            per_vram_gib_hour=parse_money(
                requests.get("perGBOfVRAMPerHour", DEFAULT_PER_VRAM_GIB_HOUR),
                f"{path}.requests.perGBOfVRAMPerHour",
            ),
            limits_over_requests=parse_money(
                entry.get("limitsOverRequests", DEFAULT_LIMITS_OVER_REQUESTS), f"{path}.limitsOverRequests"
            ),
        )
    return PriceBook(prices=prices, eviction_protection_price_ratio=ratio)


def _parse_time(value: object, field: str) -> datetime:
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise PricingError(
                f"{field}: {value!r} is not a time; write it like 2026-11-01T00:00:00Z"
            ) from None
    if moment.utcoffset() is None:
        raise PricingError(f"{field}: {value!r} has no time zone; add one, e.g. 2026-11-01T00:00:00Z")
    return moment


def parse_pool_pricing(qos_config: Mapping[str, Any], field: str = "qosConfig") -> PoolPricing:
    """The pool's prices over time from its `qosConfig` mapping (as written in the configuration file)."""
    current = _price_book(qos_config, field)
    history = qos_config.get("pricingHistory") or []
    if not isinstance(history, list):
        raise PricingError(f"{field}.pricingHistory: expected a list of {{effectiveUntil, pricing}} entries")
    dated: list[tuple[datetime, PriceBook]] = []
    for index, raw in enumerate(history):
        path = f"{field}.pricingHistory[{index}]"
        entry = _mapping(raw, path)
        if "effectiveUntil" not in entry:
            raise PricingError(f"{path}.effectiveUntil: missing; say when these prices stopped applying")
        dated.append(
            (_parse_time(entry["effectiveUntil"], f"{path}.effectiveUntil"), _price_book(entry, path))
        )
    dated.sort(key=lambda item: item[0])
    untils = [until for until, _ in dated]
    if len(set(untils)) != len(untils):
        raise PricingError(f"{field}.pricingHistory: two entries share an effectiveUntil; make them distinct")
    books: list[tuple[datetime | None, PriceBook]] = []
    previous_until: datetime | None = None
    for until, book in dated:
        books.append((previous_until, book))
        previous_until = until
    books.append((previous_until, current))
    return PoolPricing(books=tuple(books))


def pricing_problems(pool: str, spec: Mapping[str, Any]) -> list[str]:
    """What is wrong in a GPUPool spec's `qosConfig` prices: the check `tfcommon.pool_source` runs before a
    cluster pool's spec takes effect (empty: valid)."""
    qos_config = spec.get("qosConfig") or {}
    try:
        parse_pool_pricing(qos_config if isinstance(qos_config, Mapping) else {}, "spec.qosConfig")
    except PricingError as error:
        return [f"pool {pool}: {error}"]
    return []
