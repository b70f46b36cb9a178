"""Structured logging: one JSON object per line on stderr, with the service name and the trace id.

Fields passed through `extra=` become keys of the line. Values under secret-looking keys (password,
token, secret, authorization) are masked, and credentials inside URLs are removed, so a log line never
carries a secret.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SECRET_KEY = re.compile(r"pass(word)?|secret|token|authorization|api[_-]?key|credential", re.IGNORECASE)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s:]+(:[^/@\s]*)?@", re.IGNORECASE)
MASK = "***"

_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def redact_url(text: str) -> str:
    """`text` with the user and password of every URL in it removed."""
    return URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{MASK}@", text)


def _redacted(key: str, value: Any) -> Any:
    if SECRET_KEY.search(key):
        return MASK
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, dict):
        return {str(k): _redacted(str(k), v) for k, v in value.items()}
    return value


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, service, logger, message, extras, trace id."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": redact_url(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                line[key] = _redacted(key, value)
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            line["trace_id"] = format(span_context.trace_id, "032x")
            line["span_id"] = format(span_context.span_id, "016x")
        if record.exc_info:
            line["error"] = redact_url(self.formatException(record.exc_info))
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every log record of the process to stderr as JSON lines tagged with `service`.

    Replaces the root logger's handlers, so calling it again (e.g. with another level) is safe.
    """
    normalized = level.strip().upper()
    if normalized not in LEVELS:
        raise ValueError(f"log level {level!r} is not valid; set TF_LOG_LEVEL to one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(normalized)
