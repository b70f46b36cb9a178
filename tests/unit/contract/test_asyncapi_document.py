"""The committed AsyncAPI document and JSON Schemas: valid AsyncAPI 3.0, up to date with the code, and
describing what the bus really sends (subjects, headers, payloads, who sends and who receives)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator, Draft202012Validator, FormatChecker
from tfcommon import subjects
from tfcommon.asyncapi import asyncapi_document, contract_files
from tfcommon.bus import InMemoryEventBus
from tfcommon.events import (
    MESSAGE_TYPES,
    FromNodeCommand,
    Message,
    NodeCommand,
    PodAdmitted,
    StopWorker,
    WorkloadSubmitted,
)
from tfcommon.node_allocations import NODE_ALLOCATIONS
from tfctl.main import main

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCS = REPO_ROOT / "docs"
ASYNCAPI_SPEC = Path(__file__).resolve().parent / "schemas" / "asyncapi-3.0.0.json"
FIXTURES = REPO_ROOT / "tests" / "contract" / "fixtures" / "v1"


@functools.cache
def committed_document() -> dict[str, Any]:
    document = yaml.safe_load((DOCS / "asyncapi.yaml").read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def payload_validator(message_name: str) -> Draft202012Validator:
    """Validates against the document's payload schema, resolving its `#/components/...` references."""
    schema = {**committed_document(), "$ref": f"#/components/schemas/{message_name}"}
    return Draft202012Validator(schema, format_checker=FormatChecker())


def fixture_message(message_type: type[Message]) -> Message:
    return message_type.model_validate_json((FIXTURES / f"{message_type.subject}.json").read_bytes())


def operations(action: str, message_type: type[Message]) -> dict[str, dict[str, Any]]:
    channel = f"#/channels/{message_type.subject}"
    return {
        name: operation
        for name, operation in committed_document()["operations"].items()
        if operation["action"] == action and operation["channel"]["$ref"] == channel
    }


def test_committed_contract_files_are_up_to_date() -> None:
    for name, text in contract_files().items():
        assert (DOCS / name).read_text(encoding="utf-8") == text, (
            f"docs/{name} is stale: run `tfctl events contract` and commit the result"
        )
    generated = {name for name in contract_files() if name.startswith("schemas/")}
    committed = {f"schemas/{path.name}" for path in (DOCS / "schemas").glob("*.json")}
    assert committed == generated


def test_check_fails_on_stale_or_extra_files_and_contract_repairs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", "contract", "--check", "--docs-dir", str(tmp_path)]) == 1
    assert main(["events", "contract", "--docs-dir", str(tmp_path)]) == 0
    assert main(["events", "contract", "--check", "--docs-dir", str(tmp_path)]) == 0
    capsys.readouterr()

    (tmp_path / "asyncapi.yaml").write_text("asyncapi: 3.0.0\n", encoding="utf-8")
    (tmp_path / "schemas" / "tf.evt.gone.v1.json").write_text("{}", encoding="utf-8")
    assert main(["events", "contract", "--check", "--docs-dir", str(tmp_path)]) == 1
    errors = capsys.readouterr().err
    assert "asyncapi.yaml is stale: run `tfctl events contract`" in errors
    assert "tf.evt.gone.v1.json is stale" in errors

    assert main(["events", "contract", "--docs-dir", str(tmp_path)]) == 0
    assert not (tmp_path / "schemas" / "tf.evt.gone.v1.json").exists()
    assert main(["events", "contract", "--check", "--docs-dir", str(tmp_path)]) == 0


def test_document_is_valid_asyncapi_3() -> None:
    specification = json.loads(ASYNCAPI_SPEC.read_text(encoding="utf-8"))
    validator = Draft7Validator(specification)

    assert [error.message for error in validator.iter_errors(committed_document())] == []
    broken = {**committed_document(), "operations": {"x": {"action": "publish", "channel": {}}}}
    assert not validator.is_valid(broken)


def test_every_message_has_a_channel_on_its_subject() -> None:
    channels = committed_document()["channels"]

    for subject, message_type in MESSAGE_TYPES.items():
        channel = channels[subject]
        to_or_from_a_node = issubclass(message_type, NodeCommand | FromNodeCommand)
        expected = f"{subject}.{{node}}" if to_or_from_a_node else subject
        assert channel["address"] == expected
        assert list(channel["messages"]) == [message_type.__name__]
        assert ("parameters" in channel) is to_or_from_a_node
    assert len(channels) == len(MESSAGE_TYPES) + 3  # the node-allocations request, its reply, dead letters


def test_dead_letters_have_a_channel_every_consuming_service_sends_on_and_tfctl_reads() -> None:
    document = committed_document()
    channel = document["channels"]["tf.dlq"]
    assert channel["address"] == "tf.dlq.{service}.{consumer}"
    headers = document["components"]["messages"]["DeadLetter"]["headers"]
    assert "Tf-Dlq-Reason" in headers["required"]
    assert "Tf-Dlq-Subject" in headers["required"]
    users = {
        (op["action"], op["tags"][0]["name"])
        for op in document["operations"].values()
        if op["channel"]["$ref"] == "#/channels/tf.dlq"
    }
    consuming = {spec.service for spec in subjects.CONSUMERS} | {"node-agent"}
    assert users == {("send", service) for service in consuming} | {("receive", "tfctl")}


def test_the_node_allocations_request_is_answered_by_the_scheduler_on_the_requesters_inbox() -> None:
    document = committed_document()
    request = document["channels"][NODE_ALLOCATIONS]
    assert request["address"] == f"{NODE_ALLOCATIONS}.{{node}}"
    assert list(request["messages"]) == ["NodeAllocationsRequest"]
    assert document["channels"][f"{NODE_ALLOCATIONS}.reply"]["address"] is None
    senders = {
        name: operation
        for name, operation in document["operations"].items()
        if operation["channel"]["$ref"] == f"#/channels/{NODE_ALLOCATIONS}"
    }
    assert {(op["action"], op["tags"][0]["name"]) for op in senders.values()} == {
        ("send", "node-agent"),
        ("receive", "scheduler"),
    }
    assert all(op["reply"]["channel"]["$ref"].endswith(".reply") for op in senders.values())


@pytest.mark.parametrize("message_type", MESSAGE_TYPES.values(), ids=lambda cls: cls.__name__)
async def test_published_message_matches_its_documented_headers_and_payload(
    message_type: type[Message],
) -> None:
    bus = InMemoryEventBus(service="scheduler")
    await bus.publish(fixture_message(message_type))
    stored = bus.stored[0]
    documented = committed_document()["components"]["messages"][message_type.__name__]
    headers = Draft202012Validator(documented["headers"], format_checker=FormatChecker())

    assert [error.message for error in headers.iter_errors(dict(stored.headers))] == []
    assert not headers.is_valid({**stored.headers, "ce-type": "tf.evt.something-else.v1"})
    payload = json.loads(stored.payload)
    assert [error.message for error in payload_validator(message_type.__name__).iter_errors(payload)] == []
    assert not payload_validator(message_type.__name__).is_valid({**payload, "event_id": "not-a-uuid"})
    assert payload_validator(message_type.__name__).is_valid({**payload, "added_in_v2": 1})
    channel_address = committed_document()["channels"][message_type.subject]["address"]
    assert stored.subject == channel_address.replace("{node}", getattr(stored.decoded(), "node", ""))


def test_senders_are_the_producers_of_each_message() -> None:
    assert [op["tags"][0]["name"] for op in operations("send", PodAdmitted).values()] == ["webhook"]
    for message_type in MESSAGE_TYPES.values():
        senders = {op["tags"][0]["name"] for op in operations("send", message_type).values()}
        assert senders == {producer.split()[0] for producer in message_type.producers}


def test_receivers_are_the_declared_durable_consumers() -> None:
    assert [op["x-tfpool-durable"] for op in operations("receive", WorkloadSubmitted).values()] == [
        subjects.SCHEDULER_SCHEDULE_WORKLOAD.durable
    ]
    assert [op["x-tfpool-durable"] for op in operations("receive", StopWorker).values()] == [
        "node-agent-run-commands-{node}"
    ]
    documented = {
        op["x-tfpool-durable"]
        for message_type in MESSAGE_TYPES.values()
        for op in operations("receive", message_type).values()
    }
    assert {spec.durable for spec in subjects.CONSUMERS} <= documented
    assert {factory("{node}").durable for factory in subjects.PER_NODE_CONSUMERS} <= documented


def test_yaml_file_holds_exactly_the_generated_document() -> None:
    assert yaml.safe_load(contract_files()["asyncapi.yaml"]) == asyncapi_document()
