"""Exact Kubernetes quantities: `16Gi`, `8G`, `500m`, `1.5`, `1e3` to integer bytes and milli-TFLOPS.

Pure and exact (fractions, never floats). A value that cannot be represented exactly in the target
unit is refused with a message naming the value and the expected form, never silently rounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}
DECIMAL_SUFFIXES: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exponent>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
EXPECTED_FORM = "a Kubernetes quantity such as 16Gi, 8G, 500m, 1.5 or 1e3"


class QuantityError(ValueError):
    """A quantity that is malformed or not representable; `str()` names the value and the fix."""


class MissingUnitError(QuantityError):
    """A size given as a bare number where a unit is required; `str()` already shows one, e.g. `8Gi`."""


def parse_quantity(text: str | int, *, what: str = "quantity") -> Fraction:
    """Parse a Kubernetes quantity exactly. `what` names the field in error messages."""
    if isinstance(text, bool):
        raise QuantityError(f"{what}: {text!r} is not {EXPECTED_FORM}")
    if isinstance(text, int):
        return Fraction(text)
    cleaned = text.strip()
    match = _QUANTITY.match(cleaned)
    if match is None:
        raise QuantityError(f"{what}: {text!r} is not {EXPECTED_FORM}")
    number = Fraction(match["number"] if not match["number"].endswith(".") else match["number"][:-1])
    if match["exponent"]:
        exponent = int(match["exponent"][1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{what}: exponent in {text!r} is out of range (|e| <= 30)")
        number *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        number *= BINARY_SUFFIXES.get(suffix) or DECIMAL_SUFFIXES[suffix]
    return -number if match["sign"] == "-" else number


def parse_bytes(text: str | int, *, what: str = "memory", unit_required: bool = False) -> int:
    """A non-negative whole number of bytes, e.g. `16Gi` -> 17179869184.

    A bare number is bytes, as in Kubernetes; with `unit_required` (command-line flags, where `8`
    almost always means 8Gi) a bare number other than 0 raises `MissingUnitError`.
    """
    value = parse_quantity(text, what=what)
    if value < 0:
        raise QuantityError(f"{what}: {text!r} is negative; use a size such as 16Gi")
    if unit_required and value != 0 and _is_bare_number(text):
        number = str(text).strip()
        raise MissingUnitError(f"{what} {number}: give a unit, e.g. {number}Gi")
    if value.denominator != 1:
        raise QuantityError(f"{what}: {text!r} is not a whole number of bytes; use a size such as 16Gi")
    return int(value)


def _is_bare_number(text: str | int) -> bool:
    """Whether a quantity that parsed has neither a suffix nor an exponent (`8`, `1.5`)."""
    if isinstance(text, int):
        return True
    match = _QUANTITY.match(text.strip())
    return match is not None and not match["exponent"] and not match["suffix"]


def parse_milli(text: str | int, *, what: str = "value") -> int:
    """A non-negative value in thousandths, e.g. TFLOPS `1.5` -> 1500, `500m` -> 500."""
    value = parse_quantity(text, what=what) * 1000
    if value < 0:
        raise QuantityError(f"{what}: {text!r} is negative; use a value such as 20 or 500m")
    if value.denominator != 1:
        raise QuantityError(f"{what}: {text!r} is finer than a thousandth; use a value such as 1.5 or 500m")
    return int(value)


def format_bytes(value: int) -> str:
    """Canonical text for a byte count: the shortest exact form, binary suffixes winning ties."""
    if value < 0:
        raise QuantityError(f"memory: {value} is negative")
    if value == 0:
        return "0"
    candidates = [str(value)]
    for suffix, factor in BINARY_SUFFIXES.items():
        if value % factor == 0:
            candidates.append(f"{value // factor}{suffix}")
    for suffix in ("k", "M", "G", "T", "P", "E"):
        decimal_factor = int(DECIMAL_SUFFIXES[suffix])
        if value % decimal_factor == 0:
            candidates.append(f"{value // decimal_factor}{suffix}")
    return min(candidates, key=lambda text: (len(text), not text.endswith("i")))


def format_milli(value: int) -> str:
    """Canonical text for a milli value: `20` for 20000, `1500m` for 1500."""
    if value < 0:
        raise QuantityError(f"value: {value} is negative")
    return str(value // 1000) if value % 1000 == 0 else f"{value}m"
