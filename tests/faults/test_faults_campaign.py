"""A bounded fault campaign on the local stack: nothing acknowledged is lost, doubled or misbilled.

One campaign (about a minute on two cores) runs under load while every service is SIGKILLed and
restarted, NATS and Postgres restart, and the scheduler and a node agent are paused past their
timeouts; each test then asserts one invariant of its report. `make bench` runs a longer one.
"""

from __future__ import annotations

from typing import Any

import pytest
from tfctl.faults import print_report, run_fault_campaign

pytestmark = pytest.mark.e2e

CAMPAIGN_S = 12.0
SEED = 42


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    result = run_fault_campaign(CAMPAIGN_S, SEED)
    print_report(result, json_output=False)
    return result


def test_the_campaign_ran_every_fault_under_load(report: dict[str, Any]) -> None:
    faults = " ".join(report["faults"])
    for service in ("webhook", "scheduler", "defrag-planner", "metrics", "node-agent-sim-node-1"):
        assert f"sigkill {service}" in faults
    for fault in ("restart nats", "restart postgres", "sigstop scheduler", "sigstop node-agent"):
        assert fault in faults
    assert report["operations"].get("submit-ok", 0) >= 50
    assert report["operations"].get("release-ok", 0) >= 20


def test_no_gpu_is_ever_over_capacity(report: dict[str, Any]) -> None:
    assert report["violations"]["gpu over capacity"] == []


def test_no_pod_ever_holds_two_active_allocations(report: dict[str, Any]) -> None:
    assert report["violations"]["pod with two active allocations"] == []


def test_every_acknowledged_submission_ends_allocated_once_or_unschedulable(report: dict[str, Any]) -> None:
    assert report["violations"]["submission outcome"] == []


def test_every_ledger_change_reaches_each_consumer_exactly_once(report: dict[str, Any]) -> None:
    assert report["violations"]["bus exactly once"] == []


def test_the_bill_conserves_the_allocated_time(report: dict[str, Any]) -> None:
    assert report["violations"]["bill conserves"] == []


def test_agents_ledger_and_scheduler_agree_within_ten_seconds(report: dict[str, Any]) -> None:
    assert report["violations"]["views agree within 10 s"] == []
    assert report["converged_after_s"] is not None
    assert report["violation_count"] == 0


def test_no_service_stops_on_its_own_during_an_outage(report: dict[str, Any]) -> None:
    # Under `tfctl up` a child that exits stops the whole stack, so an outage must not end any service.
    assert report["self_exits"] == {}, report["self_exit_logs"]
