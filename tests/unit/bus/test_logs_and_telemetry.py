"""Structured logs (JSON lines, no secrets, trace ids) and trace context carried in message headers."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from tfcommon.logs import configure_logging, redact_url
from tfcommon.telemetry import extract_trace_context, inject_trace_context, setup_telemetry


@pytest.fixture
def restored_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers, root.level = handlers, level


@pytest.mark.usefixtures("restored_root_logger")
def test_each_record_is_one_json_line_with_service_and_extras(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("scheduler", "info")

    logging.getLogger("tfscheduler").info(
        "acked tf.evt.workload.submitted",
        extra={"subject": "tf.evt.workload.submitted", "outcome": "acked", "ms": 1.5},
    )

    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["service"] == "scheduler"
    assert record["level"] == "INFO"
    assert record["logger"] == "tfscheduler"
    assert record["message"] == "acked tf.evt.workload.submitted"
    assert (record["subject"], record["outcome"], record["ms"]) == ("tf.evt.workload.submitted", "acked", 1.5)


@pytest.mark.usefixtures("restored_root_logger")
def test_secrets_never_reach_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("node-agent")

    logging.getLogger("tfagent").warning(
        "connecting to nats://agent:s3cr3t@nats:4222",
        extra={"api_token": "abc123", "database_url": "postgresql://tf:hunter2@db/tfpool", "port": 8001},
    )

    output = capsys.readouterr().err
    assert "s3cr3t" not in output
    assert "abc123" not in output
    assert "hunter2" not in output
    record = json.loads(output)
    assert record["database_url"] == "postgresql://***@db/tfpool"
    assert record["port"] == 8001


@pytest.mark.usefixtures("restored_root_logger")
def test_records_inside_a_span_carry_its_trace_id(capsys: pytest.CaptureFixture[str]) -> None:
    setup_telemetry("unit-tests")
    configure_logging("webhook")

    with trace.get_tracer("unit-tests").start_as_current_span("admit") as span:
        logging.getLogger("tfwebhook").info("admitted")

    record = json.loads(capsys.readouterr().err)
    assert record["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_an_unknown_level_names_the_setting_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"TF_LOG_LEVEL to one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        configure_logging("metrics", "LOUD")


def test_url_credentials_are_removed() -> None:
    assert redact_url("nats://u:p@h:4222 and http://x@y/z") == "nats://***@h:4222 and http://***@y/z"
    assert redact_url("nats://h:4222") == "nats://h:4222"


def test_setup_is_idempotent() -> None:
    first = setup_telemetry("unit-tests")

    assert setup_telemetry("another-name", "http://collector:4318") is first
    assert trace.get_tracer_provider() is first.tracer_provider


def test_trace_context_survives_the_trip_through_headers() -> None:
    setup_telemetry("unit-tests")
    headers: dict[str, str] = {}

    with trace.get_tracer("unit-tests").start_as_current_span("publish") as span:
        inject_trace_context(headers)

    carried = trace.get_current_span(extract_trace_context(headers)).get_span_context()
    assert carried.trace_id == span.get_span_context().trace_id
    assert carried.span_id == span.get_span_context().span_id
    assert not trace.get_current_span(extract_trace_context(None)).get_span_context().is_valid
