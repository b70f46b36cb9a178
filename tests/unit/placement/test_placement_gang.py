"""Gang placement core (`tfcommon.placement.gang.place_gang`): the members of a gang fit together, each
seeing the capacity the earlier ones took, or none is placed; the view is never changed."""

from __future__ import annotations

from tfcommon.placement import ClusterView, PlacementRequest, policy
from tfcommon.placement.gang import place_gang
from tfcommon.placement.testing import a_node

WHOLE_CARD = 1000


def whole_card_members(count: int) -> list[tuple[str, PlacementRequest]]:
    return [(f"m{n}", PlacementRequest(name=f"m{n}", gpu_share=WHOLE_CARD)) for n in range(count)]


def test_members_that_fit_together_get_distinct_cards() -> None:
    view = ClusterView([a_node("a", gpus=2), a_node("b", gpus=2)])

    outcome = place_gang(whole_card_members(4), view, policy(), needed=4)

    assert outcome.enough
    assert [key for key, _p in outcome.placements] == ["m0", "m1", "m2", "m3"]
    cards = [uuid for _key, p in outcome.placements for uuid in p.gpu_uuids]
    assert len(set(cards)) == 4


def test_none_is_placed_when_fewer_than_needed_fit() -> None:
    view = ClusterView([a_node("a", gpus=2), a_node("b", gpus=1)])

    outcome = place_gang(whole_card_members(4), view, policy(), needed=4)

    assert not outcome.enough
    assert outcome.placements == ()
    assert outcome.fitted == 3
    assert [key for key, _r in outcome.rejections] == ["m3"]


def test_enough_members_are_placed_and_the_one_left_over_is_named() -> None:
    view = ClusterView([a_node("a", gpus=3)])

    outcome = place_gang(whole_card_members(4), view, policy(), needed=3)

    assert outcome.enough
    assert [key for key, _p in outcome.placements] == ["m0", "m1", "m2"]
    assert [key for key, _r in outcome.rejections] == ["m3"]


def test_the_view_is_left_as_it_was() -> None:
    view = ClusterView([a_node("a", gpus=3)])

    place_gang(whole_card_members(3), view, policy(), needed=3)
    place_gang(whole_card_members(4), view, policy(), needed=4)

    assert all(gpu.used_vram_bytes == 0 and gpu.workers == 0 for gpu in view.nodes["a"].gpus)
