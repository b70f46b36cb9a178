"""NATS servers a test starts beside the session's one: `embedded_nats` (a plain JetStream server, for
a module that stops it or wants it alone) and `secured_nats_server` (deploy/nats/nats.conf, with its
users, passwords and permissions)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tfcommon.infra import EmbeddedNats, free_port, nats_server_binary, stop_process, wait_for_port

NATS_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf"


@contextlib.contextmanager
def embedded_nats(
    store_dir: Path | None = None, *, prefix: str = "tfpool-test-nats-"
) -> Iterator[EmbeddedNats]:
    """A started `nats-server -js` that dies with pytest; its store in `store_dir`, or in a new
    temporary folder (removed afterwards) outside pytest's, which another pytest session may prune."""
    own_dir = store_dir is None
    folder = Path(tempfile.mkdtemp(prefix=prefix)) if store_dir is None else store_dir
    server = EmbeddedNats(store_dir=folder, die_with_parent=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class SecuredNats:
    """Where the server listens and each user's password."""

    url: str
    passwords: dict[str, str]


@contextlib.contextmanager
def secured_nats_server(store: Path, password_prefix: str = "pw-") -> Iterator[SecuredNats]:
    """nats-server running deploy/nats/nats.conf on loopback, each user's password
    `<password_prefix><user>`, its JetStream store and log in `store`."""
    users = re.findall(r"user:\s*(\S+)\s+password:\s*\$(\w+)", NATS_CONFIG.read_text(encoding="utf-8"))
    passwords = {user: f"{password_prefix}{user}" for user, _ in users}
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
        env={"PATH": os.environ.get("PATH", ""), **{variable: passwords[user] for user, variable in users}},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, 30.0, process)
        yield SecuredNats(url=f"nats://127.0.0.1:{port}", passwords=passwords)
    finally:
        stop_process(process, timeout_s=10)
