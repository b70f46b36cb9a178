"""Released payloads stay readable: every fixture of every released version still decodes with the
current models and validates against the committed JSON Schemas (additive-only evolution), a reader of
v1 accepts a payload a newer producer extended with optional fields, and every registered message has
a fixture, so a new message cannot ship without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import BaseModel, ValidationError
from tfcommon.asyncapi import schema_file_name
from tfcommon.events import (
    MESSAGE_TYPES,
    AllocationCreated,
    InvalidPayloadError,
    Message,
    decode,
    encode,
    message_type_for,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = REPO_ROOT / "tests" / "contract" / "fixtures"
SCHEMAS = REPO_ROOT / "docs" / "schemas"
RELEASED_VERSIONS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
FIXTURE_FILES = sorted(FIXTURES.glob("v*/*.json"))
NEW_FIELD = "added_in_v2"


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def load(path: Path) -> dict[str, Any]:
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(payload, dict)
    return payload


def committed_schema(message_type: type[Message]) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / schema_file_name(message_type)).read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=FormatChecker())


def published(message: Message) -> dict[str, Any]:
    value = json.loads(encode(message))
    assert isinstance(value, dict)
    return value


def test_version_one_is_released() -> None:
    assert "v1" in RELEASED_VERSIONS
    assert len(FIXTURE_FILES) >= len(MESSAGE_TYPES)


def test_every_registered_message_has_a_fixture() -> None:
    covered = {path.stem for path in FIXTURE_FILES}
    missing = sorted(set(MESSAGE_TYPES) - covered)
    assert missing == [], (
        f"add a payload fixture tests/contract/fixtures/{RELEASED_VERSIONS[-1]}/<subject>.json for {missing}"
    )


def test_every_fixture_names_a_registered_subject() -> None:
    orphans = sorted(fixture_id(path) for path in FIXTURE_FILES if path.stem not in MESSAGE_TYPES)
    assert orphans == [], f"a released message was removed or renamed (a breaking change): {orphans}"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=fixture_id)
def test_released_payload_still_decodes_and_keeps_its_values(path: Path) -> None:
    payload = load(path)
    message_type = message_type_for(path.stem)
    routing_subject = message_type.model_validate(payload).routing_subject()

    message = decode(routing_subject, json.dumps(payload).encode())

    assert type(message) is message_type
    republished = published(message)
    assert {field: republished[field] for field in payload} == payload


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=fixture_id)
def test_released_payload_matches_the_committed_json_schema(path: Path) -> None:
    payload = load(path)
    message_type = message_type_for(path.stem)

    errors = [error.message for error in committed_schema(message_type).iter_errors(payload)]

    assert errors == []


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=lambda cls: cls.__name__)
def test_schema_and_model_both_refuse_a_payload_missing_a_required_field(
    message_type: type[Message],
) -> None:
    payload = load(FIXTURES / RELEASED_VERSIONS[-1] / f"{message_type.subject}.json")
    required = [name for name, info in message_type.model_fields.items() if info.is_required()]
    routing_subject = message_type.model_validate(payload).routing_subject()

    for name in required:
        incomplete = {key: value for key, value in payload.items() if key != name}
        assert not committed_schema(message_type).is_valid(incomplete), name
        with pytest.raises(InvalidPayloadError, match=name):
            decode(routing_subject, json.dumps(incomplete).encode())


def model_inside(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly, optionally or as a tuple of them), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = model_inside(argument)
        if found is not None:
            return found
    return None


def as_a_newer_producer_sends(model: type[BaseModel], payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with an optional field added to it and to every object nested in it (a v2 payload)."""
    extended: dict[str, Any] = {**payload, NEW_FIELD: {"added": ["in", 2]}}
    for name, info in model.model_fields.items():
        nested, value = model_inside(info.annotation), payload.get(name)
        if nested is not None and isinstance(value, dict):
            extended[name] = as_a_newer_producer_sends(nested, value)
        elif nested is not None and isinstance(value, list):
            extended[name] = [as_a_newer_producer_sends(nested, item) for item in value]
    return extended


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=lambda cls: cls.__name__)
def test_a_v1_reader_accepts_a_v2_payload_with_added_fields(message_type: type[Message]) -> None:
    v1_payload = load(FIXTURES / "v1" / f"{message_type.subject}.json")
    v2_payload = as_a_newer_producer_sends(message_type, v1_payload)
    routing_subject = message_type.model_validate(v1_payload).routing_subject()

    message = decode(routing_subject, json.dumps(v2_payload).encode())

    assert message == decode(routing_subject, json.dumps(v1_payload).encode())
    assert NEW_FIELD not in published(message)
    assert [error.message for error in committed_schema(message_type).iter_errors(v2_payload)] == []


def test_added_fields_are_ignored_inside_nested_objects_too() -> None:
    v1_payload = load(FIXTURES / "v1" / "tf.evt.allocation.created.json")
    v2_payload = as_a_newer_producer_sends(AllocationCreated, v1_payload)
    assert NEW_FIELD in v2_payload["workload"]
    assert NEW_FIELD in v2_payload["shares"][0]

    message = decode(AllocationCreated.subject, json.dumps(v2_payload).encode())

    assert isinstance(message, AllocationCreated)
    assert message.workload.name == v1_payload["workload"]["name"]
    assert message.shares[0].vram_bytes == v1_payload["shares"][0]["vram_bytes"]


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=lambda cls: cls.__name__)
def test_a_v2_payload_missing_or_mistyping_a_required_field_is_still_refused(
    message_type: type[Message],
) -> None:
    v2_payload = as_a_newer_producer_sends(
        message_type, load(FIXTURES / "v1" / f"{message_type.subject}.json")
    )
    routing_subject = message_type.model_validate(
        load(FIXTURES / "v1" / f"{message_type.subject}.json")
    ).routing_subject()

    without_time = {key: value for key, value in v2_payload.items() if key != "occurred_at"}
    mistyped_id = {**v2_payload, "event_id": ["not", "a", "uuid"]}

    for broken, field in ((without_time, "occurred_at"), (mistyped_id, "event_id")):
        assert not committed_schema(message_type).is_valid(broken), field
        with pytest.raises(InvalidPayloadError, match=field):
            decode(routing_subject, json.dumps(broken).encode())


def test_a_producer_still_cannot_build_a_message_with_an_unknown_field() -> None:
    fields = load(FIXTURES / "v1" / "tf.evt.allocation.created.json")

    with pytest.raises(ValidationError, match="surprise"):
        AllocationCreated.model_validate({**fields, "surprise": 1})
