"""A pool's qosConfig, in TensorFusion's shape, read into prices; bad values named with their path."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from tfmetrics.core.billing import QosPrice
from tfmetrics.core.pricing import PricingError, parse_pool_pricing

TF_SAMPLE = {
    "defaultQoS": "medium",
    "evictionProtectionPriceRatio": "1.2",
    "pricing": [
        {
            "qos": "low",
            "requests": {"perFP16TFlopsPerHour": "$0.0069228", "perGBOfVRAMPerHour": "$0.01548"},
            "limitsOverRequests": "0.1",
        },
        {"qos": "critical", "requests": {"perFP16TFlopsPerHour": "0.02"}},
    ],
}


def test_reads_tensorfusion_pricing_with_dollar_signs_and_crd_defaults() -> None:
    pricing = parse_pool_pricing(TF_SAMPLE)
    [(start, book)] = pricing.books
    assert start is None
    assert book.prices == {
        "low": QosPrice(Decimal("0.0069228"), Decimal("0.01548"), Decimal("0.1")),
        "critical": QosPrice(Decimal("0.02"), Decimal("0.01548"), Decimal(1)),
    }
    assert book.eviction_protection_price_ratio == Decimal("1.2")


def test_a_pool_without_pricing_gets_the_default_price_for_every_qos() -> None:
    [(_, book)] = parse_pool_pricing({}).books
    assert sorted(book.prices) == ["critical", "high", "low", "medium"]
    assert book.prices["medium"].per_tflops_hour == Decimal("0.0069228")


def test_an_entry_without_qos_prices_no_qos_as_in_tensorfusion() -> None:
    [(_, book)] = parse_pool_pricing(
        {"pricing": [{"requests": {"perFP16TFlopsPerHour": "$9"}}, {"qos": "low"}]}
    ).books
    assert sorted(book.prices) == ["low"]
    assert book.prices["low"].per_tflops_hour == Decimal("0.0069228")


def test_pricing_history_applies_earlier_books_until_their_end() -> None:
    change = datetime(2026, 11, 1, tzinfo=UTC)
    config = {
        **TF_SAMPLE,
        "pricingHistory": [
            {"effectiveUntil": "2026-11-01T00:00:00Z", "pricing": [{"qos": "low", "limitsOverRequests": "0"}]}
        ],
    }
    pricing = parse_pool_pricing(config)
    assert [start for start, _ in pricing.books] == [None, change]
    assert pricing.books[0][1].prices["low"].limits_over_requests == Decimal(0)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"pricing": [{"qos": "low", "requests": {"perFP16TFlopsPerHour": "cheap"}}]},
            r"qosConfig.pricing\[0\].requests.perFP16TFlopsPerHour: 'cheap' is not an amount",
        ),
        ({"pricing": [{"qos": "gold"}]}, r"qosConfig.pricing\[0\].qos: 'gold' is not one of low"),
        ({"pricing": [{"qos": "low"}, {"qos": "low"}]}, r"pricing\[1\].qos: low is priced twice"),
        ({"evictionProtectionPriceRatio": "-1"}, "evictionProtectionPriceRatio: '-1' is not an amount"),
        (
            {"pricingHistory": [{"effectiveUntil": "2026-11-01"}]},
            r"pricingHistory\[0\].effectiveUntil: .* has no time zone",
        ),
    ],
)
def test_bad_pricing_is_refused_naming_the_field(config: dict[str, object], message: str) -> None:
    with pytest.raises(PricingError, match=message):
        parse_pool_pricing(config)
