"""deploy/nats/nats.conf agrees with the code: each user fetches from and acknowledges only its own durable
consumers (`tfcommon.subjects`) and receives replies only on its own inbox (`tfcommon.bus`). A node agent
has no user in the file: the auth callout's grant (`tfcommon.nats_auth.node_access.node_permissions`)
names its own node's durables and inbox only.

The real server's behaviour is checked in tests/integration/deploy/test_nats_permissions.py; this reads
the file, so a consumer added to `subjects.CONSUMERS` without its permission line fails in seconds.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from deploy_support import REPO_ROOT
from tfcommon import events, subjects
from tfcommon.bus import inbox_prefix_for
from tfcommon.catalogue import filter_matches
from tfcommon.deadletter import dead_letter_subject
from tfcommon.nats_auth.node_access import node_permissions, node_user

NATS_CONFIG = REPO_ROOT / "deploy" / "nats" / "nats.conf"
FETCH_AND_ACK = ("$JS.API.CONSUMER.MSG.NEXT.", "$JS.ACK.")
PER_NODE_SERVICE = "node-agent"
USERS = ("webhook", "scheduler", "defrag-planner", "metrics", "nats-auth", "tfctl", "readonly")

_TOKEN = re.compile(
    r'\s+|#[^\n]*|//[^\n]*|"(?P<quoted>[^"]*)"|(?P<punct>[{}\[\],:=])|(?P<bare>[^\s{}\[\],:=#"]+)'
)


def tokens(text: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for match in _TOKEN.finditer(text):
        if match["quoted"] is not None:
            found.append(("value", match["quoted"]))
        elif match["punct"]:
            found.append(("punct", match["punct"]))
        elif match["bare"]:
            found.append(("value", match["bare"]))
    return found


class ConfReader:
    """Reads the subset of the NATS configuration format that nats.conf uses into dicts and lists."""

    def __init__(self, text: str) -> None:
        self.items = tokens(text)
        self.position = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.position] if self.position < len(self.items) else None

    def take(self) -> tuple[str, str]:
        item = self.items[self.position]
        self.position += 1
        return item

    def body(self, closing: str | None) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (item := self.peek()) is not None and item != ("punct", closing):
            if item == ("punct", ","):
                self.take()
                continue
            _, key = self.take()
            if self.peek() in (("punct", ":"), ("punct", "=")):
                self.take()
            result[key] = self.value()
        if closing is not None:
            self.take()
        return result

    def value(self) -> Any:
        kind, text = self.take()
        if (kind, text) == ("punct", "{"):
            return self.body("}")
        if (kind, text) == ("punct", "["):
            values: list[Any] = []
            while self.peek() != ("punct", "]"):
                if self.peek() == ("punct", ","):
                    self.take()
                    continue
                values.append(self.value())
            self.take()
            return values
        return text


def users() -> dict[str, dict[str, Any]]:
    config = ConfReader(NATS_CONFIG.read_text(encoding="utf-8")).body(None)
    return {user["user"]: user["permissions"] for user in config["authorization"]["users"]}


def fetch_and_ack(spec: subjects.ConsumerSpec) -> set[str]:
    return {
        f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}",
        f"$JS.ACK.{spec.stream}.{spec.durable}.>",
    }


def durable_permissions(subject_list: list[str]) -> set[str]:
    return {subject for subject in subject_list if subject.startswith(FETCH_AND_ACK)}


def test_reader_understands_the_file() -> None:
    assert set(users()) == set(USERS)
    assert users()["webhook"]["publish"]["allow"][-1] == "tf.evt.pod.admitted"


@pytest.mark.parametrize("user", [user for user in USERS if user != PER_NODE_SERVICE])
def test_user_may_fetch_and_acknowledge_exactly_its_own_durables(user: str) -> None:
    own = [spec for spec in subjects.CONSUMERS if spec.service == user]
    publish = users()[user]["publish"]

    assert durable_permissions(publish["allow"]) == set().union(*map(fetch_and_ack, own))
    assert "deny" not in publish


def test_node_agent_may_use_its_own_nodes_durables_and_no_other() -> None:
    granted = node_permissions("gpu-1.example")["pub"]["allow"]
    own = [factory("gpu-1.example") for factory in subjects.PER_NODE_CONSUMERS]

    assert durable_permissions(granted) == set().union(*map(fetch_and_ack, own))
    assert node_permissions("gpu-1.example")["sub"]["allow"] == [
        f"{inbox_prefix_for(node_user('gpu-1.example'))}.>"
    ]
    assert PER_NODE_SERVICE not in users(), "no NATS user shared by every node agent"


def test_fixed_durables_are_named_after_their_service() -> None:
    for spec in subjects.CONSUMERS:
        assert spec.durable.startswith(f"{spec.service}-"), spec.durable
        assert spec.service in USERS or spec.service == PER_NODE_SERVICE, spec.durable


@pytest.mark.parametrize("user", USERS)
def test_user_receives_replies_only_on_its_own_inbox(user: str) -> None:
    subscribe = users()[user]["subscribe"]["allow"]
    inboxes = [subject for subject in subscribe if subject.startswith("_INBOX")]

    assert inboxes == [f"{inbox_prefix_for(user)}.>"]


def test_inbox_prefix_is_per_user_and_nats_default_without_one() -> None:
    assert inbox_prefix_for("defrag-planner") == "_INBOX_defrag-planner"
    assert inbox_prefix_for(None) == "_INBOX"


DEAD_LETTER_STREAM_API = {
    f"$JS.API.STREAM.CREATE.{subjects.DEADLETTER_STREAM}",
    f"$JS.API.STREAM.UPDATE.{subjects.DEADLETTER_STREAM}",
}


def dead_letter_permissions(subject_list: list[str]) -> set[str]:
    return {
        subject
        for subject in subject_list
        if subject.startswith(f"{subjects.DEADLETTER_PREFIX}.") or subjects.DEADLETTER_STREAM in subject
    }


@pytest.mark.parametrize("user", [user for user in USERS if user != "tfctl"])
def test_a_user_running_durables_provisions_the_dead_letter_stream_and_writes_only_its_own(user: str) -> None:
    runs_durables = any(spec.service == user for spec in subjects.CONSUMERS)
    allowed = users()[user].get("publish", {}).get("allow", [])

    expected = DEAD_LETTER_STREAM_API | {dead_letter_subject(user, ">")} if runs_durables else set()
    assert dead_letter_permissions(allowed) == expected


def test_tfctl_reads_deletes_and_replays_dead_letters_on_every_subject_a_durable_reads() -> None:
    allowed = users()["tfctl"]["publish"]["allow"]

    assert dead_letter_permissions(allowed) == {
        f"$JS.API.STREAM.MSG.GET.{subjects.DEADLETTER_STREAM}",
        f"$JS.API.STREAM.MSG.DELETE.{subjects.DEADLETTER_STREAM}",
    }
    per_node = [factory("gpu-1") for factory in subjects.PER_NODE_CONSUMERS]
    read = {pattern for spec in (*subjects.CONSUMERS, *per_node) for pattern in spec.filter_subjects}
    for pattern in read:
        # A node command's filter names the verb with `*`: each verb tfctl may send is one subject.
        verbs = (
            [
                f"{cls.subject}.gpu-1"
                for cls in events.MESSAGE_TYPES.values()
                if issubclass(cls, events.NodeCommand)
            ]
            if pattern.startswith(subjects.NODE_AGENT_COMMANDS_PREFIX)
            else [pattern]
        )
        for subject in verbs:
            assert any(filter_matches(allow, subject) for allow in allowed), subject
