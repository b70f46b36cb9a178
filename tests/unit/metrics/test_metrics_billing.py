"""Bills on hand-computed cases, and the property that groups always add up to the total."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfmetrics.core.billing import (
    GROUP_BY_CHOICES,
    Bill,
    BillableShare,
    BillingInputError,
    GroupBy,
    PoolPricing,
    PriceBook,
    QosPrice,
    allocate_rounded,
    compute_bill,
)

GIB = 1024**3
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
# 10 TFLOPS and 8 GiB requested, limits 20 TFLOPS and 16 GiB, limitsOverRequests 0.5:
# 10*0.01 + 8*0.02 + 10*0.01*0.5 + 8*0.02*0.5 = 0.39 per hour.
PRICE = QosPrice(Decimal("0.01"), Decimal("0.02"), Decimal("0.5"))
BOOK = PriceBook(prices={"medium": PRICE, "critical": PRICE}, eviction_protection_price_ratio=Decimal("1.5"))
PRICING = {"training": PoolPricing.constant(BOOK)}
COSTS = {"H100": Decimal("3.00")}


def a_share(
    *,
    start: datetime = T0,
    end: datetime | None = T0 + 2 * HOUR,
    namespace: str = "team-a",
    pod: str = "trainer-0",
    workload: str = "trainer",
    qos: str = "medium",
    pool: str = "training",
    gpu: str = "gpu-1",
    model: str = "H100",
    protected_until: datetime | None = None,
) -> BillableShare:
    return BillableShare(
        allocation_id=f"alloc-{pod}",
        gpu_uuid=gpu,
        namespace=namespace,
        pod=pod,
        workload=workload,
        qos=qos,
        pool=pool,
        gpu_model=model,
        request_tflops_milli=10_000,
        request_vram_bytes=8 * GIB,
        limit_tflops_milli=20_000,
        limit_vram_bytes=16 * GIB,
        start=start,
        end=end,
        protected_until=protected_until,
    )


def bill_of(
    shares: list[BillableShare],
    group_by: GroupBy = "namespace",
    *,
    pricing: dict[str, PoolPricing] = PRICING,
    quantum: Decimal = Decimal("0.01"),
) -> Bill:
    return compute_bill(
        shares, pricing, COSTS, start=T0, end=T0 + 24 * HOUR, group_by=group_by, quantum=quantum
    )


def test_requests_and_the_limits_above_them_are_priced_per_hour() -> None:
    bill = bill_of([a_share()])
    assert bill.cost == Decimal("0.78")
    assert [(line.key, line.cost, line.gpu_hours) for line in bill.lines] == [
        ("team-a", Decimal("0.78"), Decimal("2.0000"))
    ]


def test_each_gpu_of_a_multi_gpu_workload_is_billed() -> None:
    bill = bill_of([a_share(gpu="gpu-1"), a_share(gpu="gpu-2")], group_by="pod")
    assert bill.cost == Decimal("1.56")
    assert bill.lines[0].shares == 2


def test_only_the_time_inside_the_period_is_billed_to_the_microsecond() -> None:
    share = a_share(start=T0, end=T0 + 4 * HOUR)
    bill = compute_bill(
        [share],
        PRICING,
        COSTS,
        start=T0 + HOUR,
        end=T0 + HOUR + timedelta(seconds=1, microseconds=500_000),
        group_by="pool",
        quantum=Decimal("0.0000000001"),
    )
    # 0.39 per hour for 1.5 seconds = 0.0001625
    assert bill.cost == Decimal("0.0001625000")


def test_a_held_allocation_is_billed_up_to_the_end_of_the_period() -> None:
    bill = compute_bill([a_share(end=None)], PRICING, COSTS, start=T0, end=T0 + 3 * HOUR, group_by="pool")
    assert bill.cost == Decimal("1.17")


def test_a_price_change_mid_period_bills_each_part_at_its_own_price() -> None:
    doubled = PriceBook(prices={"medium": QosPrice(Decimal("0.02"), Decimal("0.04"), Decimal("0.5"))})
    pricing = {"training": PoolPricing(books=((None, BOOK), (T0 + HOUR, doubled)))}
    bill = compute_bill([a_share()], pricing, COSTS, start=T0, end=T0 + 24 * HOUR, group_by="pool")
    # first hour at 0.39, second at 0.78
    assert bill.cost == Decimal("1.17")


def test_the_eviction_protection_window_is_charged_at_the_protection_ratio() -> None:
    share = a_share(end=T0 + HOUR, protected_until=T0 + timedelta(minutes=30))
    bill = bill_of([share], quantum=Decimal("0.0001"))
    # 30 min at 0.39 * 1.5 + 30 min at 0.39 = 0.2925 + 0.195
    assert bill.cost == Decimal("0.4875")


def test_critical_workloads_pay_no_protection_surcharge() -> None:
    share = a_share(end=T0 + HOUR, qos="critical", protected_until=T0 + timedelta(minutes=30))
    assert bill_of([share], quantum=Decimal("0.0001")).cost == Decimal("0.3900")


def test_a_protection_ratio_below_one_means_the_default_surcharge() -> None:
    book = PriceBook(prices={"medium": PRICE}, eviction_protection_price_ratio=Decimal("0.5"))
    share = a_share(end=T0 + HOUR, protected_until=T0 + HOUR)
    bill = bill_of([share], pricing={"training": PoolPricing.constant(book)}, quantum=Decimal("0.0001"))
    assert bill.cost == Decimal("0.4680")  # 0.39 * 1.2


def test_savings_compare_the_pool_with_whole_dedicated_gpus() -> None:
    bill = bill_of([a_share()])
    assert (bill.dedicated_cost, bill.savings) == (Decimal("6.00"), Decimal("5.22"))
    assert bill.lines[0].savings == Decimal("5.22")


def test_an_unpriced_qos_costs_zero_and_an_unpriced_model_leaves_the_savings_unknown() -> None:
    bill = bill_of([a_share(qos="low", model="T4")])
    assert (bill.cost, bill.dedicated_cost, bill.savings) == (Decimal("0.00"), None, None)
    assert bill.unpriced_models == ("T4",)
    assert bill.notes == (
        "no dedicated price for GPU model 'T4': dedicated cost and savings are unknown; set "
        """TF_GPU_COST_PER_HOUR on the metrics service, e.g. '{"T4": "<price per hour>"}'""",
        "pool 'training' prices no QoS 'low': those allocations cost 0",
    )


def test_without_a_dedicated_price_there_are_no_negative_savings() -> None:
    shares = [a_share(), a_share(namespace="team-b", pod="server-0", model="L4")]

    bill = bill_of(shares)

    priced, unpriced = bill.lines
    assert (priced.key, priced.dedicated_cost, priced.savings) == ("team-a", Decimal("6.00"), Decimal("5.22"))
    assert (unpriced.key, unpriced.cost, unpriced.dedicated_cost, unpriced.savings) == (
        "team-b",
        Decimal("0.78"),
        None,
        None,
    )  # was a dedicated cost of 0.00 and savings of -0.78
    assert unpriced.unpriced_models == ("L4",)
    assert (bill.cost, bill.dedicated_cost, bill.savings) == (Decimal("1.56"), None, None)


@pytest.mark.parametrize(
    ("group_by", "keys"),
    [
        ("namespace", ["team-a", "team-b"]),
        ("workload", ["team-a/trainer", "team-b/server"]),
        ("pod", ["team-a/trainer-0", "team-a/trainer-1", "team-b/server-0"]),
        ("qos", ["critical", "medium"]),
        ("pool", ["training"]),
    ],
)
def test_groups_by_each_dimension(group_by: GroupBy, keys: list[str]) -> None:
    shares = [
        a_share(pod="trainer-0"),
        a_share(pod="trainer-1"),
        a_share(namespace="team-b", pod="server-0", workload="server", qos="critical"),
    ]
    bill = bill_of(shares, group_by=group_by)
    assert [line.key for line in bill.lines] == keys
    assert bill.cost == Decimal("2.34")


def test_rounding_left_overs_go_to_the_largest_remainders_then_by_key() -> None:
    third = Fraction(1, 300)
    total, parts = allocate_rounded({"b": third, "a": third, "c": third}, Decimal("0.01"))
    assert total == Decimal("0.01")
    assert parts == {"a": Decimal("0.01"), "b": Decimal("0.00"), "c": Decimal("0.00")}


def test_a_period_that_ends_before_it_starts_is_refused_with_the_field_named() -> None:
    with pytest.raises(BillingInputError, match=r"to: .* must be after from"):
        compute_bill([], PRICING, COSTS, start=T0, end=T0, group_by="pool")


def test_an_unknown_group_is_refused_with_the_choices() -> None:
    with pytest.raises(BillingInputError, match="groupBy: 'team' is not one of namespace, workload"):
        compute_bill([], PRICING, COSTS, start=T0, end=T0 + HOUR, group_by="team")  # type: ignore[arg-type]


minutes = st.integers(min_value=0, max_value=3 * 24 * 60)


@st.composite
def shares_strategy(draw: st.DrawFn) -> BillableShare:
    begin = draw(minutes)
    length = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=2 * 24 * 60)))
    request_tflops = draw(st.integers(min_value=0, max_value=1_000_000))
    request_vram = draw(st.integers(min_value=0, max_value=80 * GIB))
    protection = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=120)))
    start = T0 + timedelta(minutes=begin, microseconds=draw(st.integers(0, 999_999)))
    return BillableShare(
        allocation_id=draw(st.sampled_from(["a1", "a2", "a3"])),
        gpu_uuid=draw(st.sampled_from(["gpu-1", "gpu-2"])),
        namespace=draw(st.sampled_from(["team-a", "team-b", "team-c"])),
        pod=draw(st.sampled_from(["p0", "p1", "p2", "p3"])),
        workload=draw(st.sampled_from(["w0", "w1"])),
        qos=draw(st.sampled_from(["low", "medium", "high", "critical"])),
        pool=draw(st.sampled_from(["training", "serving"])),
        gpu_model=draw(st.sampled_from(["H100", "A100"])),
        request_tflops_milli=request_tflops,
        request_vram_bytes=request_vram,
        limit_tflops_milli=request_tflops + draw(st.integers(min_value=0, max_value=500_000)),
        limit_vram_bytes=request_vram + draw(st.integers(min_value=0, max_value=8 * GIB)),
        start=start,
        end=None if length is None else start + timedelta(minutes=length),
        protected_until=None if protection is None else start + timedelta(minutes=protection),
    )


@settings(max_examples=100, deadline=None)
@given(
    shares=st.lists(shares_strategy(), max_size=25),
    group_by=st.sampled_from(GROUP_BY_CHOICES),
    quantum=st.sampled_from([Decimal("0.01"), Decimal("0.0001"), Decimal("1")]),
    period_hours=st.integers(min_value=2, max_value=96),
)
def test_groups_always_add_up_to_the_total(
    shares: list[BillableShare], group_by: GroupBy, quantum: Decimal, period_hours: int
) -> None:
    pricing = {
        "training": PoolPricing(books=((None, BOOK), (T0 + 5 * HOUR, PriceBook(prices={"high": PRICE})))),
        "serving": PoolPricing.constant(BOOK),
    }
    bill = compute_bill(
        shares,
        pricing,
        {"H100": Decimal("3.00"), "A100": Decimal("1.10")},
        start=T0 + HOUR,
        end=T0 + HOUR * period_hours,
        group_by=group_by,
        quantum=quantum,
    )
    assert sum((line.cost for line in bill.lines), Decimal(0)) == bill.cost
    assert sum((line.dedicated_cost for line in bill.lines), Decimal(0)) == bill.dedicated_cost
    assert bill.savings == bill.dedicated_cost - bill.cost
    for amount in [bill.cost, *(line.cost for line in bill.lines)]:
        assert amount % quantum == 0
        assert amount >= 0
