from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tfcommon.quantities import (
    MissingUnitError,
    QuantityError,
    format_bytes,
    format_milli,
    parse_bytes,
    parse_milli,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 * 1024**3),
        ("8G", 8 * 10**9),
        ("1Ki", 1024),
        ("1e3", 1000),
        ("1E3", 1000),
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("123Mi", 123 * 1024**2),
        ("0.5Gi", 512 * 1024**2),
        (" 2Gi ", 2 * 1024**3),
        (80, 80),
    ],
)
def test_parses_byte_sizes_exactly(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20", 20_000),
        ("500m", 500),
        ("1.5", 1_500),
        ("1e3", 1_000_000),
        ("0", 0),
        ("0.001", 1),
        ("989.4", 989_400),
    ],
)
def test_parses_tflops_into_milli(text: str, expected: int) -> None:
    assert parse_milli(text) == expected


def test_keeps_fractions_exact() -> None:
    assert parse_quantity("0.1") * 3 == Fraction(3, 10)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a Kubernetes quantity such as 16Gi"),
        ("abc", "'abc' is not a Kubernetes quantity"),
        ("16GB", "'16GB' is not a Kubernetes quantity"),
        ("16 Gi", "is not a Kubernetes quantity"),
        ("-1Gi", "is negative; use a size such as 16Gi"),
        ("0.5", "is not a whole number of bytes"),
        ("1Gi1", "is not a Kubernetes quantity"),
        ("1e99", "exponent in '1e99' is out of range"),
    ],
)
def test_refuses_bad_byte_sizes_with_a_message(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=r"vram-request: .*") as raised:
        parse_bytes(text, what="vram-request")
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.0001", "finer than a thousandth"),
        ("-5", "is negative"),
        ("x1", "is not a Kubernetes quantity"),
    ],
)
def test_refuses_bad_milli_values_with_a_message(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        parse_milli(text, what="tflops-request")


def test_refuses_booleans() -> None:
    with pytest.raises(QuantityError):
        parse_bytes(True)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=2**62))
def test_byte_sizes_round_trip(value: int) -> None:
    assert parse_bytes(format_bytes(value)) == value


@given(st.integers(min_value=0, max_value=10**15))
def test_milli_values_round_trip(value: int) -> None:
    assert parse_milli(format_milli(value)) == value


@given(
    st.integers(min_value=0, max_value=2**40),
    st.sampled_from(["Ki", "Mi", "Gi", "k", "M", "G", ""]),
)
def test_suffixed_integers_scale_exactly(number: int, suffix: str) -> None:
    factors = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}
    assert parse_bytes(f"{number}{suffix}") == number * factors[suffix]


def test_formats_canonically() -> None:
    assert format_bytes(16 * 1024**3) == "16Gi"
    assert format_bytes(8 * 10**9) == "8G"
    assert format_bytes(1023) == "1023"
    assert format_milli(20_000) == "20"
    assert format_milli(1_500) == "1500m"


@pytest.mark.parametrize("text", ["8", " 8 ", "1.5", 8])
def test_a_size_that_needs_a_unit_refuses_a_bare_number_showing_one(text: str | int) -> None:
    number = str(text).strip()
    with pytest.raises(MissingUnitError) as raised:
        parse_bytes(text, what="--vram", unit_required=True)
    assert str(raised.value) == f"--vram {number}: give a unit, e.g. {number}Gi"


@pytest.mark.parametrize(
    ("text", "expected"), [("8Gi", 8 * 1024**3), ("8G", 8 * 10**9), ("8e9", 8 * 10**9), ("0", 0)]
)
def test_a_size_with_a_unit_or_zero_is_accepted_where_a_unit_is_required(text: str, expected: int) -> None:
    assert parse_bytes(text, what="--vram", unit_required=True) == expected


def test_a_bare_number_is_bytes_as_in_kubernetes() -> None:
    assert parse_bytes("8", what="annotation tensor-fusion.ai/vram-request") == 8
