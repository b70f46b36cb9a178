"""Released payloads stay readable: every fixture of every released version still decodes with the
current models and validates against the committed JSON Schemas (additive-only evolution), and every
registered message has a fixture, so a new message cannot ship without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker
from tfcommon.asyncapi import schema_file_name
from tfcommon.events import MESSAGE_TYPES, InvalidPayloadError, Message, decode, encode, message_type_for

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = REPO_ROOT / "tests" / "contract" / "fixtures"
SCHEMAS = REPO_ROOT / "docs" / "schemas"
RELEASED_VERSIONS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
FIXTURE_FILES = sorted(FIXTURES.glob("v*/*.json"))


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


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=lambda cls: cls.__name__)
def test_schema_and_model_both_refuse_an_unknown_field(message_type: type[Message]) -> None:
    payload = {**load(FIXTURES / RELEASED_VERSIONS[-1] / f"{message_type.subject}.json"), "surprise": 1}
    routing_subject = message_type.model_validate(
        {key: value for key, value in payload.items() if key != "surprise"}
    ).routing_subject()

    assert not committed_schema(message_type).is_valid(payload)
    with pytest.raises(InvalidPayloadError, match="surprise"):
        decode(routing_subject, json.dumps(payload).encode())
