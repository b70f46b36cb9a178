"""Where a replay's idle GPU share sits at the end: cards grouped by their free share."""

from __future__ import annotations

from tfcommon.placement.testing import a_node
from tfctl.simulation import ReplayResult, TraceNode, TracePod, idle_cards_by_free_share, replay


def test_cards_are_grouped_by_free_share_and_ranked_by_idle_share() -> None:
    nodes = [
        a_node("a", gpus=4, used_shares=(810, 810, 1000, 470)),
        a_node("b", gpus=2, used_shares=(810, 0)),
        a_node("c", gpus=2, used_shares=(940, 1000)),
    ]

    assert idle_cards_by_free_share(nodes) == ((1000, 1), (190, 3), (530, 1), (60, 1))


def test_only_the_top_groups_are_kept() -> None:
    nodes = [a_node("a", gpus=3, used_shares=(810, 470, 940))]

    assert idle_cards_by_free_share(nodes, top=2) == ((530, 1), (190, 1))


def test_replay_json_reports_idle_gpus_per_group() -> None:
    result = ReplayResult("tfpool", 42, 8, 10, 1, {130: 0.9}, None, 1.0, ((190, 5), (60, 2)))

    assert result.as_json()["idle_at_end"] == [
        {"free_share": 190, "cards": 5, "idle_gpus": 0.9},
        {"free_share": 60, "cards": 2, "idle_gpus": 0.1},
    ]


def test_a_replay_reports_the_share_left_beside_each_placed_pod() -> None:
    nodes = [TraceNode("n1", 32_000, 65_536, 2, "T4")]
    pods = [TracePod("p", 4000, 1024, 1, 810, "")]

    result = replay(nodes, pods, "tfpool", 42, inflate=1.0)

    assert result.pods == 2
    assert result.failed_pods == 0
    assert result.idle_at_end == ((190, 2),)
