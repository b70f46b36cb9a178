"""`tfctl billing` output: `unknown` (never a negative saving) without a dedicated price, empty CSV cells
for unknown amounts. Cents and the exact `--json` are checked against the service in
tests/integration/metrics/test_metrics_service.py."""

from __future__ import annotations

from typing import Any

from tfctl.commands import billing

NOTE = "no dedicated price for GPU model 'H100': dedicated cost and savings are unknown"


def a_bill(*, priced: bool) -> dict[str, Any]:
    dedicated, savings = ("6.00", "5.22") if priced else (None, None)
    return {
        "from": "2026-11-01T00:00:00+00:00",
        "to": "2026-11-02T00:00:00+00:00",
        "groupBy": "namespace",
        "quantum": "0.01",
        "cost": "0.78",
        "dedicatedCost": dedicated,
        "savings": savings,
        "savingsUnknownReason": None if priced else NOTE,
        "groups": [
            {
                "key": "team-a",
                "cost": "0.78",
                "dedicatedCost": dedicated,
                "savings": savings,
                "savingsUnknownReason": None if priced else NOTE,
                "gpuHours": "2.0000",
                "shares": 1,
            }
        ],
        "notes": [] if priced else [NOTE],
    }


def test_an_unknown_dedicated_cost_reads_unknown_and_the_note_says_why() -> None:
    lines = billing.render_table(a_bill(priced=False)).splitlines()

    assert lines[1].split() == ["NAMESPACE", "COST", "DEDICATED", "SAVINGS", "GPU-HOURS", "SHARES"]
    assert lines[2].split() == ["team-a", "0.78", "unknown", "unknown", "2.0000", "1"]
    assert lines[3].split() == ["TOTAL", "0.78", "unknown", "unknown"]
    assert lines[4] == f"note: {NOTE}"


def test_a_priced_bill_shows_its_savings() -> None:
    lines = billing.render_table(a_bill(priced=True)).splitlines()

    assert lines[2].split() == ["team-a", "0.78", "6.00", "5.22", "2.0000", "1"]
    assert lines[3].split() == ["TOTAL", "0.78", "6.00", "5.22"]


def test_csv_leaves_an_unknown_amount_empty() -> None:
    assert billing.render_csv(a_bill(priced=False)) == (
        "namespace,cost,dedicated_cost,savings,gpu_hours,shares\nteam-a,0.78,,,2.0000,1\nTOTAL,0.78,,,,\n"
    )
