"""A real nats-server running deploy/nats/nats.conf (users, permissions, JetStream) for these tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.nats_servers import SecuredNats, secured_nats_server


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    with secured_nats_server(tmp_path_factory.mktemp("secured-nats")) as server:
        yield server
