"""What survives a full garbage collection is frozen, so the next full collection scans only what came
after it (a scheduler's burst of placements no longer makes a later collection pause the load); once
per rescan interval everything is handed back to the collector."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest
from tfcommon.runtime import freeze_full_collection_survivors


class Node:
    """A small object that joins a reference cycle, as long-lived scheduler state might."""

    def __init__(self) -> None:
        self.partner: Node | None = None


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_survivors_of_a_full_collection_are_frozen_and_a_rescan_gives_them_back() -> None:
    stop = freeze_full_collection_survivors(rescan_every_s=3600)
    try:
        assert freeze_full_collection_survivors() is not None  # a second call installs nothing more
        assert sum("survivors" in getattr(cb, "__qualname__", "") for cb in gc.callbacks) == 1
        survivors = [Node() for _ in range(1000)]
        gc.collect()
        frozen = gc.get_freeze_count()
        assert frozen >= len(survivors)

        garbage = [Node() for _ in range(100)]
        for node in garbage:
            node.partner = node  # a cycle that only the collector frees
        del garbage, node
        assert gc.collect() >= 100  # what came after the freeze is still collected
        assert gc.get_freeze_count() >= frozen
    finally:
        stop()
    assert not any("survivors" in getattr(cb, "__qualname__", "") for cb in gc.callbacks)


def test_after_the_rescan_interval_a_full_collection_gives_the_frozen_objects_back() -> None:
    stop = freeze_full_collection_survivors(rescan_every_s=1.0)
    try:
        gc.collect()  # within the interval: freezes
        assert gc.get_freeze_count() > 0
        time.sleep(1.1)
        gc.collect()  # past it: unfreezes, so this and the next collection go over everything
        assert gc.get_freeze_count() == 0
    finally:
        stop()
