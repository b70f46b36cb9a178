"""OpenTelemetry set-up (tracer and meter providers, once per process) and trace context in NATS headers.

Metrics are read through the Prometheus exporter (served by the service that wants `/metrics`).
Traces go to an OTLP endpoint when one is configured and the optional OTLP exporter package
(`opentelemetry-exporter-otlp-proto-http`) is installed; otherwise spans are only used to carry trace
context from one service to the next. Nothing here opens a socket at import time.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

OTLP_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Telemetry:
    """What `setup_telemetry` installed: the providers and whether spans are exported."""

    service: str
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting_spans: bool


_installed: Telemetry | None = None


def _otlp_span_exporter(endpoint: str) -> SpanExporter | None:
    try:
        module = importlib.import_module(OTLP_EXPORTER_MODULE)
    except ImportError:
        _log.warning(
            "otlp_endpoint is set but the OTLP exporter is not installed; spans are not exported. "
            "Install opentelemetry-exporter-otlp-proto-http or unset TF_OTLP_ENDPOINT.",
            extra={"otlp_endpoint": endpoint},
        )
        return None
    exporter: SpanExporter = module.OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    return exporter


def setup_telemetry(service: str, otlp_endpoint: str | None = None) -> Telemetry:
    """Install the global tracer and meter providers for `service`; later calls return the first set-up.

    OpenTelemetry allows one global provider per process, so a second call (another service name, or
    another endpoint) changes nothing.
    """
    global _installed
    if _installed is not None:
        return _installed
    resource = Resource.create({SERVICE_NAME: service})
    tracer_provider = TracerProvider(resource=resource)
    exporter = _otlp_span_exporter(otlp_endpoint) if otlp_endpoint else None
    if exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _installed = Telemetry(service, tracer_provider, meter_provider, exporting_spans=exporter is not None)
    return _installed


def inject_trace_context(headers: MutableMapping[str, str]) -> None:
    """Add the current span's W3C trace context (`traceparent`, `tracestate`) to message headers."""
    propagate.inject(headers)


def extract_trace_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context carried by a message's headers (empty when it has none)."""
    return propagate.extract(dict(headers or {}))
