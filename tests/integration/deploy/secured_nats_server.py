"""A real nats-server running deploy/nats/nats.conf: what the deploy integration tests connect to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SecuredNats:
    """Where the server listens and each user's password."""

    url: str
    passwords: dict[str, str]
