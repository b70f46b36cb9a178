"""The dashboard's defrag section: per pool, the campaign in progress and the last finished one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tfmetrics.core.dashboard import CampaignSummary, defrag_view

START = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)


def a_campaign(pool: str, *, running: bool, days_ago: int = 0, outcome: str | None = None) -> CampaignSummary:
    started = START - timedelta(days=days_ago)
    return CampaignSummary(
        pool=pool,
        trigger="cron",
        running=running,
        started_at=started,
        finished_at=None if running else started + timedelta(minutes=30),
        deadline_at=started + timedelta(hours=1) if running else None,
        outcome=outcome,
        current_node="node-1" if running else None,
        nodes_drained=2,
        nodes_failed=0,
        nodes_skipped=1,
        pods_evicted=4,
        stranded_pods=0,
    )


def test_each_pool_shows_its_running_campaign_and_its_last_result() -> None:
    view = defrag_view(
        [
            a_campaign("training", running=False, days_ago=1, outcome="completed"),
            a_campaign("inference", running=False, days_ago=2, outcome="deadline-reached"),
            a_campaign("training", running=True),
        ]
    )
    assert [entry["pool"] for entry in view] == ["inference", "training"]
    inference, training = view
    assert inference["running"] is None
    assert inference["last"]["outcome"] == "deadline-reached"
    assert training["running"]["currentNode"] == "node-1"
    assert training["running"]["deadlineAt"] == (START + timedelta(hours=1)).isoformat()
    assert training["last"]["finishedAt"] == (START - timedelta(days=1, minutes=-30)).isoformat()
    assert (training["last"]["nodesDrained"], training["last"]["nodesSkipped"]) == (2, 1)


def test_no_campaign_shows_nothing() -> None:
    assert defrag_view([]) == []
