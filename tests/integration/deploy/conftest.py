"""A real nats-server running deploy/nats/nats.conf (users, permissions, JetStream) for these tests."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from secured_nats_server import SecuredNats
from tfcommon.infra import free_port, nats_server_binary, wait_for_port

NATS_CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "nats" / "nats.conf"


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    users = re.findall(r"user:\s*(\S+)\s+password:\s*\$(\w+)", NATS_CONFIG.read_text())
    passwords = {user: f"pw-{user}" for user, _ in users}
    environment = {variable: passwords[user] for user, variable in users}
    store = tmp_path_factory.mktemp("secured-nats")
    port = free_port()
    process = subprocess.Popen(
        [
            str(nats_server_binary()),
            "-c", str(NATS_CONFIG),
            "-a", "127.0.0.1",
            "-p", str(port),
            "-m", str(free_port()),
            "-sd", str(store),
            "-l", str(store / "nats-server.log"),
        ],
        env={"PATH": os.environ.get("PATH", ""), **environment},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, 30.0, process)
        yield SecuredNats(url=f"nats://127.0.0.1:{port}", passwords=passwords)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
