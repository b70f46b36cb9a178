"""The wire contract: every registered message round-trips through encode/decode, names follow the
conventions, and bad input gets an error that names the subject, the field and the fix."""

from __future__ import annotations

import json
import re
import types
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Literal, Union, get_args, get_origin
from uuid import UUID, uuid4

import pytest
from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, StringConstraints
from tfcommon import events
from tfcommon.events import (
    MESSAGE_TYPES,
    Command,
    DiscoverGpus,
    Event,
    InvalidPayloadError,
    Message,
    NodeCommand,
    NodeDrained,
    StartWorker,
    UnknownSubjectError,
    decode,
    derived_event_id,
    encode,
)

NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
NODE_NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z0-9]{1,6}){0,2}", fullmatch=True)
AWARE_DATETIMES = st.datetimes(
    min_value=datetime(2000, 1, 1),  # noqa: DTZ001 (hypothesis wants naive bounds with timezones=)
    max_value=datetime(2100, 1, 1),  # noqa: DTZ001
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5, minutes=-30))]
    ),
)


def _bounded_int(metadata: list[Any]) -> st.SearchStrategy[int]:
    low = high = None
    for item in metadata:
        if isinstance(item, Ge):
            low = int(item.ge)  # type: ignore[call-overload]
        elif isinstance(item, Gt):
            low = int(item.gt) + 1  # type: ignore[call-overload]
        elif isinstance(item, Le):
            high = int(item.le)  # type: ignore[call-overload]
    return st.integers(min_value=low if low is not None else -(2**62), max_value=high or 2**62)


def strategy_for(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return st.one_of(*(strategy_for(arg, metadata) for arg in get_args(annotation)))
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if origin is tuple:
        min_size = next((item.min_length for item in metadata if isinstance(item, MinLen)), 0)
        return st.lists(strategy_for(get_args(annotation)[0], []), min_size=min_size, max_size=3).map(tuple)
    if origin is dict:
        key, value = get_args(annotation)
        return st.dictionaries(strategy_for(key, []), strategy_for(value, []), max_size=3)
    if annotation is type(None):
        return st.none()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_strategy(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return _bounded_int(metadata)
    if annotation is float:
        return st.floats(min_value=0, max_value=1e6, allow_nan=False)
    if annotation is UUID:
        return st.uuids()
    if annotation is datetime:
        return AWARE_DATETIMES
    if annotation is str:
        if any(isinstance(item, StringConstraints) for item in metadata):
            return NODE_NAMES
        max_size = next((item.max_length for item in metadata if isinstance(item, MaxLen)), 40)
        min_size = next((item.min_length for item in metadata if isinstance(item, MinLen)), 0)
        return st.text(min_size=min_size, max_size=max_size)
    raise NotImplementedError(f"no strategy for {annotation!r}: extend strategy_for in this test")


def model_strategy(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {name: strategy_for(info.annotation, info.metadata) for name, info in model.model_fields.items()}
    return st.fixed_dictionaries(fields).map(lambda values: model(**values))


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=list(MESSAGE_TYPES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_message_round_trips_through_the_wire(message_type: type[Message], data: st.DataObject) -> None:
    message = data.draw(model_strategy(message_type))

    assert decode(message.routing_subject(), encode(message)) == message


def test_the_registry_holds_the_messages_services_exchange() -> None:
    expected = {
        "tf.evt.pod.admitted",
        "tf.evt.workload.submitted",
        "tf.evt.workload.unschedulable",
        "tf.evt.allocation.created",
        "tf.evt.allocation.released",
        "tf.evt.node.registered",
        "tf.evt.gpu.discovered",
        "tf.evt.node.heartbeat-sent",
        "tf.evt.gpu.usage-reported",
        "tf.evt.gpu.drift-detected",
        "tf.evt.defrag-campaign.started",
        "tf.evt.defrag-campaign.finished",
        "tf.evt.node.defrag-skipped",
        "tf.evt.pod.evicted",
        "tf.evt.node.drained",
        "tf.cmd.node-agent.start-worker",
        "tf.cmd.node-agent.stop-worker",
    }
    assert expected <= set(MESSAGE_TYPES)


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=list(MESSAGE_TYPES))
def test_every_message_follows_the_naming_and_typing_rules(message_type: type[Message]) -> None:
    assert message_type.__doc__, "every message class documents what it means"
    assert message_type.producers, "every message names its producer"
    if issubclass(message_type, Event):
        assert re.fullmatch(r"tf\.evt\.[a-z-]+\.[a-z-]*(ed|sent|unschedulable)", message_type.subject), (
            "facts are past tense"
        )
    else:
        assert issubclass(message_type, Command)
        assert re.fullmatch(r"tf\.cmd\.[a-z-]+\.[a-z-]+", message_type.subject)
    for name, info in message_type.model_fields.items():
        if name.endswith(("_milli", "_bytes", "_ms")):
            assert info.annotation in (int, int | None), f"{name} is a quantity: an integer"


def test_node_command_subject_resolves_with_a_dotted_node_name() -> None:
    command = DiscoverGpus(event_id=uuid4(), occurred_at=NOW, node="ip-10-0-0-7.ec2.internal")

    assert command.routing_subject() == "tf.cmd.node-agent.discover-gpus.ip-10-0-0-7.ec2.internal"
    assert decode(command.routing_subject(), encode(command)) == command


def test_node_command_on_another_nodes_subject_is_refused() -> None:
    command = DiscoverGpus(event_id=uuid4(), occurred_at=NOW, node="node-a")

    with pytest.raises(
        InvalidPayloadError, match=r"addressed to 'tf\.cmd\.node-agent\.discover-gpus\.node-a'"
    ):
        decode("tf.cmd.node-agent.discover-gpus.node-b", encode(command))


def test_node_command_without_its_node_is_unknown() -> None:
    with pytest.raises(UnknownSubjectError):
        decode("tf.cmd.node-agent.discover-gpusx.node-a", b"{}")
    assert issubclass(DiscoverGpus, NodeCommand)


def test_unknown_subject_names_the_subject_and_where_to_look() -> None:
    with pytest.raises(UnknownSubjectError, match=r"'tf\.evt\.pod\.exploded'.*docs/events\.md"):
        decode("tf.evt.pod.exploded", b"{}")


def test_bad_json_names_the_subject_and_the_schema() -> None:
    with pytest.raises(InvalidPayloadError, match=r"'tf\.evt\.node\.drained' is not a valid NodeDrained"):
        decode("tf.evt.node.drained", b"{not json")


def test_missing_and_wrong_fields_are_named() -> None:
    payload = json.dumps(
        {
            "event_id": str(uuid4()),
            "occurred_at": "2026-12-02T09:30:00Z",
            "node": "n",
            "pool": "p",
            "pods_moved": -1,
        }
    )
    with pytest.raises(InvalidPayloadError) as raised:
        decode("tf.evt.node.drained", payload.encode())

    assert "pods_moved: Input should be greater than or equal to 0" in str(raised.value)


def test_fields_a_newer_producer_added_are_ignored_by_the_reader() -> None:
    event = NodeDrained(event_id=uuid4(), occurred_at=NOW, node="n", pool="p", pods_moved=1)
    extended = encode(event)[:-1] + b', "surprise": 1}'

    assert decode(event.subject, extended) == event


@pytest.mark.parametrize("node", ["Node-A", "node a", "node.*", "-node", "node>"])
def test_node_names_that_cannot_be_subject_tokens_are_refused(node: str) -> None:
    with pytest.raises(ValueError, match="node"):
        DiscoverGpus(event_id=uuid4(), occurred_at=NOW, node=node)


def test_derived_event_ids_are_stable_per_cause_type_and_discriminator() -> None:
    cause = uuid4()

    assert derived_event_id(cause, NodeDrained) == derived_event_id(cause, NodeDrained)
    assert derived_event_id(cause, NodeDrained) != derived_event_id(cause, StartWorker)
    assert derived_event_id(cause, NodeDrained, "gpu-1") != derived_event_id(cause, NodeDrained, "gpu-2")
    assert derived_event_id(cause, NodeDrained) != derived_event_id(uuid4(), NodeDrained)


def test_event_type_carries_the_schema_version() -> None:
    assert NodeDrained.event_type() == "tf.evt.node.drained.v1"
    assert events.AllocationCreated.event_type() == "tf.evt.allocation.created.v1"
