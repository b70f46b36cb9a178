"""The dashboard's data: node health (heartbeat age, cordon, do-not-disrupt), each GPU's TFLOPS and VRAM
split by workload, and the pending workloads with their reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tfmetrics.core.dashboard import (
    HEARTBEAT_LATE_S,
    HEARTBEAT_LOST_S,
    PendingWorkload,
    dashboard_view,
    node_health,
    pending_view,
)
from tfmetrics.core.series import ClusterSnapshot, GpuState, NodeState, WorkerShare

GIB = 1024**3
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def a_node(name: str, heartbeat_s: float | None, *, ready: bool = True, **flags: bool) -> NodeState:
    last = None if heartbeat_s is None else NOW - timedelta(seconds=heartbeat_s)
    return NodeState(name, "training", ready, last, **flags)


def test_node_health_follows_the_heartbeat_age_and_readiness() -> None:
    assert node_health(a_node("n", 2), NOW) == "ok"
    assert node_health(a_node("n", HEARTBEAT_LATE_S), NOW) == "late"
    assert node_health(a_node("n", HEARTBEAT_LOST_S), NOW) == "lost"
    assert node_health(a_node("n", None), NOW) == "no-heartbeat"
    assert node_health(a_node("n", 1, ready=False), NOW) == "not-ready"
    assert node_health(a_node("n", -3), NOW) == "ok"


def test_nodes_carry_their_health_and_the_operators_flags() -> None:
    snapshot = ClusterSnapshot(
        now=NOW,
        nodes=(
            a_node("n2", 75.04),
            a_node("n1", 3, cordoned=True, do_not_disrupt=True),
        ),
        gpus=(),
    )
    first, second = dashboard_view(snapshot)["nodes"]
    assert (first["name"], first["cordoned"], first["doNotDisrupt"], first["health"]) == (
        "n1",
        True,
        True,
        "ok",
    )
    assert first["heartbeatAgeS"] == 3.0
    assert (second["name"], second["cordoned"], second["doNotDisrupt"]) == ("n2", False, False)
    assert (second["health"], second["heartbeatAgeS"]) == ("lost", 75.0)


def test_each_gpu_shows_tflops_and_vram_reserved_per_workload() -> None:
    share = WorkerShare(
        "a1", "team-a", "trainer-0", "trainer", "high", "training", "g1", 494_700, 20 * GIB, 494_700, 20 * GIB
    )
    snapshot = ClusterSnapshot(
        now=NOW,
        nodes=(a_node("n1", 1),),
        gpus=(
            GpuState("g2", "n1", 1, "H100", "Running", 989_400, 80 * GIB, 0, 0),
            GpuState("g1", "n1", 0, "H100", "Running", 989_400, 80 * GIB, 494_700, 20 * GIB),
        ),
        shares=(share,),
    )
    [node] = dashboard_view(snapshot)["nodes"]
    used, idle = node["gpus"]
    assert (used["uuid"], idle["uuid"]) == ("g1", "g2")
    assert (used["allocatedTflops"], used["capacityTflops"]) == (494.7, 989.4)
    assert (used["allocatedVramGiB"], used["capacityVramGiB"]) == (20.0, 80.0)
    assert (used["allocatedTflopsPercent"], used["allocatedVramPercent"]) == (50.0, 25.0)
    assert used["segments"] == [
        {
            "workload": "team-a/trainer",
            "pod": "trainer-0",
            "qos": "high",
            "tflopsPercent": 50.0,
            "vramPercent": 25.0,
        }
    ]
    assert idle["segments"] == []


def test_pending_workloads_show_what_they_ask_for_how_long_they_waited_and_why() -> None:
    waiting = PendingWorkload(
        namespace="team-b",
        name="big-0",
        workload="big",
        pool="training",
        qos="high",
        gpu_count=2,
        gpu_model="H100",
        tflops_request_milli=400_000,
        vram_request_bytes=90 * GIB,
        reason="0/4 nodes fit: 4 insufficient VRAM",
        submitted_at=NOW - timedelta(minutes=4, seconds=3),
    )
    view = pending_view([waiting], 7, NOW)
    assert view["total"] == 7
    assert view["workloads"] == [
        {
            "namespace": "team-b",
            "name": "big-0",
            "workload": "big",
            "pool": "training",
            "qos": "high",
            "gpuCount": 2,
            "gpuModel": "H100",
            "tflopsRequest": 400.0,
            "vramRequestGiB": 90.0,
            "reason": "0/4 nodes fit: 4 insufficient VRAM",
            "submittedAt": (NOW - timedelta(minutes=4, seconds=3)).isoformat(),
            "waitingS": 243.0,
        }
    ]
    assert pending_view([], 0, NOW) == {"total": 0, "workloads": []}
