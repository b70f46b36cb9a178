"""A bounded fault campaign on the local stack: nothing acknowledged is lost, doubled or misbilled.

One campaign (about two minutes on two cores) runs under load through the webhook and the scheduler,
on a three-server NATS cluster with every stream on the three (`tfctl.fault_nats`), with defrag
campaigns and preemptions, while every service is SIGKILLed and restarted, the three NATS servers and
Postgres restart, the server leading `TF_EVENTS` is SIGKILLed and comes back after the other two
elected a new leader, every service is paused past its timeouts, backends are terminated, events are
republished after the duplicate window, a poison message is sent, a consumer stalls past
`max_deliver` (dead-lettered, then replayed) and (as root) the stream leader's JetStream disk fills, a
node agent is partitioned and slowed, and the scheduler is cut from the three NATS servers alone, then
from Postgres alone (the kernel drops those ports' packets: `tests/faults/test_faults_network.py`);
each test then asserts one invariant of its report or one of the history checker's figures. `make
bench` runs a longer one.
"""

from __future__ import annotations

import os
from decimal import Decimal
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
        assert f"sigstop {service}" in faults
    for fault in ("restart nats", "nats leader killed", "restart postgres", "sigstop node-agent-sim-node-2"):
        assert fault in faults
    assert report["operations"].get("submit-ok", 0) >= 50
    assert report["operations"].get("release-ok", 0) >= 20


def test_the_history_is_checked_on_a_snapshot_nothing_changed_during(report: dict[str, Any]) -> None:
    assert report["chaos"]["unsettled_snapshot"] is False


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
    assert report["self_exits"] == 0, report["self_exit_logs"]
    assert report["self_exits_by_service"] == {}


def test_the_streams_live_on_three_servers_and_a_killed_leader_is_replaced(report: dict[str, Any]) -> None:
    chaos = report["chaos"]
    assert chaos["events_replicas"] == 3
    assert chaos["leader_elections_s"], "the other two servers elected no new TF_EVENTS leader"


def test_the_load_preempts_and_every_preempted_workload_was_announced_and_recreated(
    report: dict[str, Any],
) -> None:
    # `critical` submissions preempt lower-priority ones once the GPUs are full; the checker counts a
    # preempted workload lost unless its eviction, tf.evt.pod.evicted and replacement are all there.
    assert report["preemptions"] > 0, report["chaos"]["evictions"]
    assert report["evictions"] >= report["preemptions"]
    assert report["chaos"]["evictions"].get("preemption", 0) > 0


def test_a_consumer_stalled_past_max_deliver_is_dead_lettered_and_reconciled_losing_nothing(
    report: dict[str, Any],
) -> None:
    chaos = report["chaos"]
    assert chaos["stalled_dead_lettered"] > 0, "the stall outlasted no message's max_deliver"
    assert chaos["stalled_replayed"] == chaos["stalled_dead_lettered"]
    assert report["violations"]["dead letters reconciled, none lost"] == []


def test_every_poison_message_is_dead_lettered_by_the_consumers_that_ended_it(report: dict[str, Any]) -> None:
    chaos = report["chaos"]
    assert chaos["poison_dead_lettered"] >= chaos["poison_published"]
    assert chaos["poison_dead_lettered"] >= chaos["poison_terminated"]


def test_the_history_checker_finds_nothing_lost_doubled_phantom_or_misbilled(report: dict[str, Any]) -> None:
    examples = report["figures"]["examples"]
    assert report["acknowledged_operations"] >= 50
    assert (report["lost"], report["doubled"], report["phantom"]) == (0, 0, 0), examples
    assert Decimal(report["bill_difference"]) == 0, report["figures"]["oracle_cost"]
    assert report["self_exits"] == 0


def test_the_campaign_injected_every_kind_of_fault_real_on_this_machine(report: dict[str, Any]) -> None:
    kinds = set(report["fault_kinds"])
    assert {"sigkill", "sigstop", "restart nats", "restart postgres", "pg_terminate_backend"} <= kinds
    assert "nats leader killed" in kinds
    assert {"republish after duplicate window", "poison message", "stalled consumer", "overlapping"} <= kinds
    assert report["chaos"]["backends_terminated"] > 0
    assert report["chaos"]["republished"] >= 1
    assert report["chaos"]["poison_terminated"] >= 2
    assert report["chaos"]["defrag_requests"] >= 1
    assert report["operations"].get("submit-ok", 0) > 0
    if os.geteuid() == 0:
        expected = {"disk full", "partition", "slow-link", "partition from nats", "partition from postgres"}
        assert expected <= kinds, report["chaos"]["not_run"]
        drops = report["chaos"]["partition_drops"]
        cut_from = {name.rsplit(" ", 1)[0] for name in drops}
        assert cut_from == {"partition scheduler from nats", "partition scheduler from postgres"}, drops
        assert min(drops.values()) > 0, drops
        slowed = report["chaos"]["slow_link"]
        assert slowed["passed"] + slowed["dropped_at_random"] > 0, slowed  # the agent's heartbeats
