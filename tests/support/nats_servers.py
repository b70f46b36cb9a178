"""NATS servers a test starts beside the session's one: `embedded_nats` (a plain JetStream server, for
a module that stops it or wants it alone) and `secured_nats_server` (deploy/nats/nats.conf, with its
users, passwords and permissions, and its auth callout for node agents running as its own process)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tfcommon.infra import EmbeddedNats, free_port, nats_server_binary, stop_process, wait_for_port
from tfcommon.nats_auth.node_access import CalloutKeys, node_token

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


CALLOUT_READY = "answering $SYS.REQ.USER.AUTH"


@dataclass(frozen=True)
class SecuredNats:
    """Where the server listens, each user's password and the callout's keys."""

    url: str
    passwords: dict[str, str]
    callout_keys: CalloutKeys
    callout_log: Path

    def node_password(self, node: str) -> str:
        """The node token of `node`'s agent (what `tfctl nats node-token` prints)."""
        return node_token(self.callout_keys.node_token_key, node)


@contextlib.contextmanager
def secured_nats_server(
    store: Path, password_prefix: str = "pw-", callout_environment: dict[str, str] | None = None
) -> Iterator[SecuredNats]:
    """nats-server running deploy/nats/nats.conf on loopback, each user's password
    `<password_prefix><user>`, its JetStream store and log in `store`, with the auth callout
    (`python -m tfcommon.nats_auth`) answering for node agents; `callout_environment` adds to the
    callout's settings (TF_NATS_CALLOUT_SERVICE_ACCOUNTS, TF_KUBECONFIG)."""
    users = re.findall(r"user:\s*(\S+)\s+password:\s*\$(\w+)", NATS_CONFIG.read_text(encoding="utf-8"))
    passwords = {user: f"{password_prefix}{user}" for user, _ in users}
    secret_file = store / "callout-secret"
    secret_file.write_bytes(os.urandom(48).hex().encode())
    secret_file.chmod(0o600)
    keys = CalloutKeys.from_secret(secret_file.read_bytes())
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
        env={
            "PATH": os.environ.get("PATH", ""),
            "NATS_CALLOUT_ISSUER": keys.issuer.public_key,
            **{variable: passwords[user] for user, variable in users},
        },
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    callout: subprocess.Popen[bytes] | None = None
    callout_log = store / "nats-auth.log"
    try:
        wait_for_port("127.0.0.1", port, 30.0, process)
        url = f"nats://127.0.0.1:{port}"
        with callout_log.open("wb") as log:
            callout = subprocess.Popen(
                [sys.executable, "-m", "tfcommon.nats_auth", "serve"],
                env={
                    "PATH": os.environ.get("PATH", ""),
                    "TF_NATS_URL": url,
                    "TF_NATS_USER": "nats-auth",
                    "TF_NATS_PASSWORD": passwords["nats-auth"],
                    "TF_NATS_CALLOUT_SECRET_FILE": str(secret_file),
                    **(callout_environment or {}),
                },
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_for_line(callout_log, CALLOUT_READY, callout)
        yield SecuredNats(url=url, passwords=passwords, callout_keys=keys, callout_log=callout_log)
    finally:
        if callout is not None:
            stop_process(callout, timeout_s=10)
        stop_process(process, timeout_s=10)


def _wait_for_line(path: Path, line: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if line in path.read_text(encoding="utf-8", errors="replace"):
            return
        if process.poll() is not None:
            raise RuntimeError(
                f"the NATS auth callout exited {process.returncode}: {path.read_text()[-2000:]}"
            )
        time.sleep(0.1)
    raise TimeoutError(
        f"the NATS auth callout did not start within {timeout_s:.0f}s: {path.read_text()[-2000:]}"
    )
