"""A real nats-server running deploy/nats/nats.conf: what the deploy integration tests connect to, and
an event they publish to it."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from support.nats_servers import SecuredNats as SecuredNats
from tfcommon import events


def pod_admitted(name: str = "trainer-0") -> events.PodAdmitted:
    """A `PodAdmitted` event, new each call, for a test to publish."""
    return events.PodAdmitted(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        workload=events.WorkloadRef(namespace="ml-team", name=name),
        request=events.GpuRequest(
            pool="default",
            tflops_request_milli=100_000,
            tflops_limit_milli=200_000,
            vram_request_bytes=8 << 30,
            vram_limit_bytes=16 << 30,
        ),
        patch_operations=5,
    )
