"""Exactly-once delivery bookkeeping of pod watches (`PodReflector`), without any server."""

from __future__ import annotations

from tfcommon.cluster import Pod, PodEventType, WatchCursor
from tfcommon.cluster.reflector import PodReflector


def pod(name: str, version: str, uid: str | None = None) -> Pod:
    return Pod(namespace="default", name=name, uid=uid or f"uid-{name}", resource_version=version)


def test_a_repeated_event_is_dropped() -> None:
    reflector = PodReflector()

    first = reflector.observe(PodEventType.ADDED, pod("a", "5"))
    replay = reflector.observe(PodEventType.ADDED, pod("a", "5"))
    replay_as_modified = reflector.observe(PodEventType.MODIFIED, pod("a", "5"))

    assert first is not None
    assert first.type is PodEventType.ADDED
    assert replay is None
    assert replay_as_modified is None


def test_a_change_of_a_known_pod_is_modified_and_a_new_pod_is_added() -> None:
    reflector = PodReflector()
    reflector.observe(PodEventType.ADDED, pod("a", "5"))

    changed = reflector.observe(PodEventType.ADDED, pod("a", "6"))
    new = reflector.observe(PodEventType.MODIFIED, pod("b", "7"))

    assert changed is not None
    assert changed.type is PodEventType.MODIFIED
    assert new is not None
    assert new.type is PodEventType.ADDED
    assert reflector.resource_version == "7"


def test_a_deletion_is_delivered_once_even_with_an_unchanged_version() -> None:
    reflector = PodReflector()
    reflector.observe(PodEventType.ADDED, pod("a", "5"))

    deleted = reflector.observe(PodEventType.DELETED, pod("a", "5"))
    again = reflector.observe(PodEventType.DELETED, pod("a", "5"))

    assert deleted is not None
    assert deleted.type is PodEventType.DELETED
    assert again is None


def test_resync_yields_only_the_difference_deletions_first() -> None:
    reflector = PodReflector()
    for name in ("kept", "changed", "gone"):
        reflector.observe(PodEventType.ADDED, pod(name, "1"))

    events = reflector.resync([pod("kept", "1"), pod("changed", "2"), pod("fresh", "3")], "10")

    assert [(e.type, e.pod.name) for e in events] == [
        (PodEventType.DELETED, "gone"),
        (PodEventType.MODIFIED, "changed"),
        (PodEventType.ADDED, "fresh"),
    ]
    assert reflector.resource_version == "10"


def test_a_pod_recreated_under_the_same_name_is_a_deletion_and_an_addition() -> None:
    reflector = PodReflector()
    reflector.observe(PodEventType.ADDED, pod("a", "1", uid="old"))

    events = reflector.resync([pod("a", "4", uid="new")], "4")

    assert [(e.type, e.pod.uid) for e in events] == [
        (PodEventType.DELETED, "old"),
        (PodEventType.ADDED, "new"),
    ]


def test_the_cursor_restores_what_was_delivered() -> None:
    reflector = PodReflector()
    reflector.observe(PodEventType.ADDED, pod("a", "5"))
    reflector.observe(PodEventType.ADDED, pod("b", "6"))

    restored = PodReflector(reflector.cursor)

    seen = {"uid-a": ("default", "a", "5"), "uid-b": ("default", "b", "6")}
    assert restored.cursor == WatchCursor("6", seen)
    assert restored.observe(PodEventType.MODIFIED, pod("a", "5")) is None
    gone = restored.resync([pod("a", "5")], "9")
    assert [(e.type, e.pod.name) for e in gone] == [(PodEventType.DELETED, "b")]
