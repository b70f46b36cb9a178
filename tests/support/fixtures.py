"""The fixtures every test may ask for, registered by the root conftest as a pytest plugin.

`nats_url` / `postgres_server_url`: real NATS JetStream and Postgres for the whole session.
`TF_NATS_URL` / `TF_DATABASE_URL` point the tests at existing servers; when unset (CI, a fresh clone)
the tests start their own with the same launchers `tfctl up` uses, in a temporary folder. A test that
stops NATS (a bus outage) uses a server of its own instead: `own_nats`, and `own_nats_bus` to connect.
`local_kubernetes` is a real Kubernetes control plane, started once per session when a test asks for it.
`migrated_database_url` is a fresh ledger database for one test, at the newest migration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres
from tfcommon.kube_local import LocalKubernetes, ensure_binaries

from support.nats_servers import embedded_nats
from support.scratch_database import scratch_database

BusOf = Callable[[str], contextlib.AbstractAsyncContextManager[NatsEventBus]]


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    configured = os.environ.get("TF_NATS_URL")
    if configured:
        yield configured
        return
    with embedded_nats() as server:  # nothing left if pytest is killed
        yield server.url


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a Postgres server; tests create their own databases on it.

    The data lives outside pytest's temporary folders, which another pytest session may prune.
    """
    configured = os.environ.get("TF_DATABASE_URL")
    if configured:
        yield configured
        return
    root = Path(tempfile.mkdtemp(prefix="tfpool-test-pg-"))
    server = EmbeddedPostgres(
        data_dir=root / "data", die_with_parent=True
    )  # nothing left if pytest is killed
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def migrated_database_url(postgres_server_url: str) -> Iterator[str]:
    """A new database on the session's Postgres at the ledger's newest migration; dropped after the test."""
    with scratch_database(postgres_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def local_kubernetes(request: pytest.FixtureRequest) -> Iterator[LocalKubernetes]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK from `tools/kubernetes`
    (built first when missing, with its progress on the terminal), our CRDs applied with kubectl."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        bin_dir = ensure_binaries(lambda line: print(line, file=sys.stderr, flush=True))
    state_dir = Path(tempfile.mkdtemp(prefix="tfpool-test-k8s-"))
    control_plane = LocalKubernetes(state_dir=state_dir, bin_dir=bin_dir, die_with_parent=True)
    try:
        control_plane.start()
        crds = Path(__file__).resolve().parents[2] / "k8s" / "base" / "crds"
        kubectl = [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}"]
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crds)], check=True, capture_output=True)
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds)],
            check=True,
            capture_output=True,
        )
        yield control_plane
    finally:
        control_plane.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A NATS server only this test uses, so that it may `stop()` it and `start()` it again (same port,
    same JetStream store)."""
    with embedded_nats(tmp_path / "own-nats") as server:
        yield server


@pytest.fixture
def own_nats_bus(own_nats: EmbeddedNats) -> BusOf:
    """`async with own_nats_bus(service) as bus`: a connection to `own_nats` as `service`, the streams
    provisioned. Left while the server is stopped, it is dropped with what it had not sent (a crash)."""

    @contextlib.asynccontextmanager
    async def connected(service: str) -> AsyncIterator[NatsEventBus]:
        bus = await NatsEventBus.connect(own_nats.url, service=service)
        try:
            await subjects.provision(bus.js)
            yield bus
        finally:
            if bus.nc.is_connected:
                await bus.close()
            else:  # nothing to drain, and closing the lost connection says so
                with contextlib.suppress(ConnectionError):
                    await bus.nc.close()

    return connected
