"""The service runtime: what every tfpool service shares from start to exit.

A service is described by a `ServiceSpec` and run with `serve(spec, stop=...)` (tests, embedding) or
`run_service(spec)` (the process entry point behind `tfctl serve`, which also handles SIGTERM/SIGINT):

1. connect to NATS (`NatsEventBus`) and wait for Postgres to answer, retrying up to
   `spec.startup_timeout_s`; then `subjects.provision()` the streams and the service's own durable
   consumers (`subjects.consumers_of(spec.name)`; the node-agent adds its per-node ones itself);
2. open the ledger (`SqlLedger`) and build a `ServiceContext`. A service whose spec says
   `needs_ledger=False` (the node agent: it reaches the ledger only through the scheduler, over NATS)
   skips Postgres altogether: no `TF_DATABASE_URL` is needed or read, none is waited for, and its
   `/readyz` has no `postgres` check;
3. call `spec.compose(context)`: the service's own composition root. It returns `Components`: FastAPI
   routers, the message `handlers` by durable consumer, the periodic `timers`, other named background
   tasks and extra readiness checks. Anything it opens that needs closing goes on `context.cleanup` (an
   `AsyncExitStack`);
4. serve HTTP with uvicorn (HTTPS when `spec.tls` is set) with `GET /healthz` (alive) and `GET /readyz`
   (200 only when NATS and Postgres (if used) answer and every extra check passes; 503 with a JSON body
   naming what is down) plus the routers, and run the tasks: one pull-consumer loop
   (`tfcommon.consumer.run_pull_consumer`) per handler and one loop per timer (`run_timer`) among them;
5. on `stop` (SIGTERM/SIGINT): stop accepting connections, set `context.stopping` so the tasks finish
   their in-flight work and return, close `context.cleanup`, then close the ledger, drain the NATS
   connection and dispose of the Postgres probe engine, and return. A task that fails or returns
   before `stopping` is set stops the service with `ServiceFailedError` (exit code 1), so a
   supervisor sees the crash instead of a half-working process.

Nothing here runs at import time and nothing is global: every dependency is an explicit field.
The runtime makes no decisions of its own; it is the I/O shell around each service's composition.

A minimal service:

    async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
        return Components(
            routers=[build_router(context.ledger)],
            handlers={subjects.SCHEDULER_TRACK_NODES: track_nodes},
            timers={"check-nodes": Timer(1.0, recheck_nodes)},
        )

    spec = ServiceSpec(name="scheduler", settings=SchedulerSettings(), port=8080, compose=compose)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, NamedTuple, TypeVar

import nats.errors
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from nats.js.errors import ServiceUnavailableError
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from starlette.types import ASGIApp, Receive, Scope, Send

from tfcommon import subjects
from tfcommon.bus import EventBus, NatsEventBus
from tfcommon.consumer import Handler, metric_consumer, run_pull_consumer
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.urls import DatabaseUrlError, ledger_url
from tfcommon.logs import configure_logging
from tfcommon.nats_tls import NatsTlsError, client_context
from tfcommon.service_metrics import RequestTimer, metrics_router
from tfcommon.settings import ServiceSettings
from tfcommon.subjects import ConsumerSpec
from tfcommon.telemetry import setup_telemetry
from tfcommon.tls import TlsFiles

SettingsT = TypeVar("SettingsT", bound=ServiceSettings)
T = TypeVar("T")

ReadinessCheck = Callable[[], Awaitable[str | None]]
"""Returns None when the dependency is ready, else a short reason such as `"config file missing"`."""

BackgroundTask = Callable[[], Awaitable[None]]
"""Runs until the service's `stopping` event is set, then finishes in-flight work and returns."""

Round = Callable[[], Awaitable[object]]
"""One round of a timer's periodic work."""


class Timer(NamedTuple):
    """Periodic work: `fn` every `interval_s` seconds (counted from the end of the previous round), the
    first round after one interval, or at once with `at_start`. A round that raises is logged and the
    next one runs as usual; a round in flight when the service stops is finished, none is started."""

    interval_s: float
    fn: Round
    at_start: bool = False


@dataclass(frozen=True)
class Consume:
    """A message handler with its pull loop's options (`tfcommon.consumer.run_pull_consumer`): `batch`
    messages fetched at once, handled one after another or, with `concurrent`, together."""

    handler: Handler
    batch: int = 16
    concurrent: bool = False


PROBE_TIMEOUT_S = 2
SHUTDOWN_TIMEOUT_S = 20.0
RETRY_INTERVAL_S = 0.5
UNAVAILABLE_RETRY_AFTER_S = 1
"""`Retry-After` (seconds) of a 503 answered while the database is unreachable."""
DATABASE_UNAVAILABLE = "the ledger database (Postgres) is unavailable; retry shortly"
"""The `detail` of that 503."""
FALLBACK_APP = "tfpool.fallback_app"
"""The scope key under which a front route finds the service's app (`with_front_routes`)."""
PORT_WAIT_S = 30.0
"""How long a starting service waits for its port to be released before it gives up."""

log = logging.getLogger("tfcommon.runtime")


class StartupError(RuntimeError):
    """The service could not start; the message names the dependency or setting and the fix."""


class ServiceFailedError(RuntimeError):
    """A background task failed (or ended on its own) while the service was running."""


@dataclass(frozen=True)
class Components:
    """What a service plugs into the runtime, returned by its `compose` function.

    `routers` are mounted on the service's FastAPI app. `handlers` maps a durable consumer (provisioned
    by then: the service's own are, `subjects.consumers_of`) to the handler of its messages, a `Consume`
    for other pull options; the runtime runs one pull loop each, named after the durable without the
    service's prefix (nor a node agent's node). `timers` maps a short name to a `Timer` or an
    `(interval_s, fn)` pair, run by `run_timer`. `tasks` maps a short name (used in logs) to any other
    coroutine function started after the server listens; each must return promptly once
    `context.stopping` is set. Names are unique across the three. `readiness` maps a name to an extra
    `/readyz` check. `front_routes` maps `(method, path)` to a raw ASGI handler served ahead of FastAPI
    and its middleware (hot paths; see `with_front_routes`).
    """

    routers: Sequence[APIRouter] = ()
    handlers: Mapping[ConsumerSpec, Handler | Consume] = field(default_factory=dict)
    timers: Mapping[str, Timer | tuple[float, Round]] = field(default_factory=dict)
    tasks: Mapping[str, BackgroundTask] = field(default_factory=dict)
    readiness: Mapping[str, ReadinessCheck] = field(default_factory=dict)
    front_routes: Mapping[tuple[str, str], ASGIApp] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceContext(Generic[SettingsT]):
    """The running service's shared dependencies, handed to `compose`.

    `bus` is where the service publishes (the `EventBus` protocol); `nats` is the same connected bus as
    NATS, for what only NATS does (`.nc` / `.js`: request-reply, consumers a service provisions itself).
    The streams are provisioned. `ledger` is the open ledger as the `Ledger` port
    (`tfcommon.ledger.port`): every read and change of the ledger's own tables goes through it.
    `database` is the connection pool of the ledger's database, for the tables a service owns there
    (the scheduler's workloads, the defrag planner's campaigns, the webhook's pod index sequence, the
    metrics service's pool samples and recommendations, the takeover slots), never for the ledger's
    tables. `sql_ledger` is the Postgres adapter itself, for the scheduler's engine alone (its batched
    reservation transactions and its workload store on the adapter's engine). In a service that runs
    without the ledger, reaching for any of them (or `database_url`) raises `NoLedgerError`.
    `stopping` is set when the service begins to shut down.
    `cleanup` is closed (last in, first out) once the tasks have returned, before the ledger is closed
    and the bus drains, so what it closes may still publish.
    `ssl_context` is the live server context when serving HTTPS: loading a new chain into it
    (`load_cert_chain`) rotates the certificate for new connections without a restart.
    """

    name: str
    settings: SettingsT
    nats: NatsEventBus
    stopping: asyncio.Event
    cleanup: AsyncExitStack
    ssl_context: ssl.SSLContext | None
    open_ledger: SqlLedger | None = None
    open_database_url: str | None = None

    @property
    def bus(self) -> EventBus:
        return self.nats

    @property
    def ledger(self) -> Ledger:
        return self.sql_ledger

    @property
    def database(self) -> AsyncEngine:
        return self.sql_ledger.engine

    @property
    def sql_ledger(self) -> SqlLedger:
        if self.open_ledger is None:
            raise NoLedgerError(f"service {self.name} runs without the ledger (ServiceSpec.needs_ledger)")
        return self.open_ledger

    @property
    def database_url(self) -> str:
        if self.open_database_url is None:
            raise NoLedgerError(f"service {self.name} runs without the ledger (ServiceSpec.needs_ledger)")
        return self.open_database_url


class NoLedgerError(RuntimeError):
    """A service that runs without the ledger (`ServiceSpec.needs_ledger=False`) reached for it."""


def freeze_startup_heap() -> None:
    """Take what start-up allocated (modules, config, clients, a scheduler's view) out of the garbage
    collector's view: a full collection then scans only what was allocated since, instead of
    stalling the work in flight for a pass over every start-up object (100-250 ms measured under
    load in the webhook and the scheduler). Objects frozen are still freed when their last reference
    goes; only a reference cycle among them would outlive its use. Call once start-up is done."""
    gc.collect()
    gc.freeze()


def freeze_full_collection_survivors(*, rescan_every_s: float = 3600.0) -> Callable[[], None]:
    """After each full garbage collection, take what survived it out of the collector's view too
    (`gc.freeze`), as `freeze_startup_heap` does for start-up: a full collection then scans only what
    was allocated since the last one, not every allocation record a burst of placements left (58 ms
    for 5,000 placements at 1,000 nodes, a pause in the middle of the load; 11 ms with this). What
    survived a full collection was reachable then; should some of it later become unreachable in a
    reference cycle, it waits for the next rescan: once every `rescan_every_s` the frozen objects are
    given back (`gc.unfreeze`), so that one full collection goes over everything again. Call once,
    after `freeze_startup_heap`; a second call changes nothing. Returns what stops it (for tests)."""
    installed = [cb for cb in gc.callbacks if getattr(cb, "__qualname__", "").startswith(_SURVIVORS)]
    if installed:
        return lambda: _uninstall(installed[0])
    state = {"unfrozen_at": time.monotonic()}

    def after_full(phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        now = time.monotonic()
        if now - state["unfrozen_at"] >= rescan_every_s:
            state["unfrozen_at"] = now
            gc.unfreeze()
        else:
            gc.freeze()

    gc.callbacks.append(after_full)
    return lambda: _uninstall(after_full)


_SURVIVORS = "freeze_full_collection_survivors."


def _uninstall(callback: Callable[..., object]) -> None:
    if callback in gc.callbacks:
        gc.callbacks.remove(callback)


async def no_components(context: ServiceContext[Any]) -> Components:
    """The composition of a service that only serves its health endpoints."""
    return Components()


@dataclass(frozen=True)
class ServiceSpec(Generic[SettingsT]):
    """How to run one service: its kebab-case name (logs, consumer prefix), settings, port and parts.

    `host` and `port` are where it listens; `tls` switches the server to HTTPS. `compose` builds the
    service's `Components` once the bus and ledger are up. `needs_ledger=False` runs it without
    Postgres (no `TF_DATABASE_URL`, no database wait or readiness check, no ledger in its context).
    """

    name: str
    settings: SettingsT
    port: int
    compose: Callable[[ServiceContext[SettingsT]], Awaitable[Components]] = no_components
    host: str | None = None
    tls: TlsFiles | None = None
    startup_timeout_s: float = 30.0
    needs_ledger: bool = True

    @property
    def bind_host(self) -> str:
        return self.host if self.host is not None else self.settings.bind_host


def required_urls(settings: ServiceSettings, *, ledger: bool = True) -> tuple[str, str | None]:
    """Return `(nats_url, database_url)` or raise `StartupError` naming every missing variable.

    With `ledger=False` (a service that runs without the ledger) only `TF_NATS_URL` is required and
    the database URL returned is None, whatever `TF_DATABASE_URL` says."""
    if not ledger:
        if not settings.nats.url:
            raise StartupError(
                "TF_NATS_URL not set: this service needs the bus (and no database), e.g. "
                "TF_NATS_URL=nats://127.0.0.1:4222 (or run the whole local stack with `tfctl up`)"
            )
        return settings.nats.url, None
    missing = [
        name
        for name, value in (("TF_NATS_URL", settings.nats.url), ("TF_DATABASE_URL", settings.database.url))
        if not value
    ]
    if missing:
        raise StartupError(
            f"{' and '.join(missing)} not set: a service needs the bus and the ledger, e.g. "
            "TF_NATS_URL=nats://127.0.0.1:4222 "
            "TF_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/tfpool "
            "(or run the whole local stack with `tfctl up`, which starts both)"
        )
    nats_url, database_url = settings.nats.url or "", settings.database.url or ""
    try:
        ledger_url(database_url)
    except DatabaseUrlError as error:
        raise StartupError(f"TF_DATABASE_URL: {error}") from error
    return nats_url, database_url


async def check_nats(bus: NatsEventBus) -> str | None:
    if not bus.nc.is_connected:
        return "not connected (reconnecting)" if bus.nc.is_reconnecting else "not connected"
    try:
        await bus.nc.flush(timeout=PROBE_TIMEOUT_S)
    except Exception as error:
        return f"no answer to PING: {type(error).__name__}"
    return None


async def check_postgres(engine: AsyncEngine) -> str | None:
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S), engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception as error:
        return f"SELECT 1 failed: {_first_line(error)}"
    return None


def _first_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return message[0] if message else type(error).__name__


def probe_engine(database_url: str) -> AsyncEngine:
    """An engine that opens one short-lived connection per readiness probe (no pool to go stale)."""
    return create_async_engine(
        ledger_url(database_url), poolclass=NullPool, connect_args={"connect_timeout": PROBE_TIMEOUT_S}
    )


def build_app(
    name: str,
    routers: Sequence[APIRouter],
    checks: Mapping[str, ReadinessCheck],
) -> FastAPI:
    """The service's FastAPI app: `/healthz`, `/readyz` over `checks`, the service's routers, then
    `/metrics` (`tfcommon.service_metrics`, request latency included)."""
    app = FastAPI(title=f"tfpool {name}", docs_url=None, redoc_url=None)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"service": name, "status": "alive"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        reasons = await asyncio.gather(*(check() for check in checks.values()))
        results = dict(zip(checks, reasons, strict=True))
        down = sorted(check for check, reason in results.items() if reason is not None)
        body = {
            "service": name,
            "status": "not ready" if down else "ready",
            "down": down,
            "checks": {check: reason or "ok" for check, reason in results.items()},
        }
        return JSONResponse(body, status_code=503 if down else 200)

    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, error: OperationalError) -> JSONResponse:
        log.warning(
            "request failed: the database is unavailable",
            extra={"path": request.url.path, "error": _first_line(error.orig or error), "outcome": "error"},
        )
        return JSONResponse(
            {"detail": DATABASE_UNAVAILABLE},
            status_code=503,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
        )

    for router in routers:
        app.include_router(router)
    app.include_router(metrics_router())
    app.add_middleware(RequestTimer, service=name)
    return app


async def request_body(receive: Receive) -> bytes:
    """The whole body of an HTTP request, for a raw handler (`with_front_routes`)."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def with_front_routes(app: ASGIApp, routes: Mapping[tuple[str, str], ASGIApp]) -> ASGIApp:
    """`app` behind a dispatcher that hands an HTTP request matching `(method, path)` exactly to its
    raw handler, skipping the app's middleware stack and routing; everything else goes to `app`.

    A handler finds `app` as `scope[FALLBACK_APP]`: one that answers only some requests itself hands
    the others to it (with the body it already read)."""
    if not routes:
        return app
    table = dict(routes)

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = table.get((scope["method"], scope["path"]))
            if handler is not None:
                scope[FALLBACK_APP] = app
                await handler(scope, receive, send)
                return
        await app(scope, receive, send)

    return dispatch


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the runtime decides when to stop."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.listening.set()


def server_ssl_context(tls: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


async def _connect_bus(spec: ServiceSpec[Any], nats_url: str) -> NatsEventBus:
    nats = spec.settings.nats
    try:
        # The bus reconnects forever once connected; the first connection is bounded here.
        async with asyncio.timeout(spec.startup_timeout_s):
            return await NatsEventBus.connect(
                nats_url,
                service=spec.name,
                user=nats.user,
                password=nats.password_source(),
                tls=client_context(nats),
            )
    except NatsTlsError as error:
        raise StartupError(str(error)) from error
    except Exception as error:
        reason = "no answer" if isinstance(error, TimeoutError) else _first_line(error)
        raise StartupError(
            f"NATS at {nats_url} (TF_NATS_URL) did not answer within {spec.startup_timeout_s:.0f}s: {reason}"
        ) from error


async def _wait_for_postgres(spec: ServiceSpec[Any], engine: AsyncEngine, database_url: str) -> None:
    deadline = time.monotonic() + spec.startup_timeout_s
    while (reason := await check_postgres(engine)) is not None:
        if time.monotonic() > deadline:
            raise StartupError(
                f"Postgres at {_without_password(database_url)} (TF_DATABASE_URL) did not answer within "
                f"{spec.startup_timeout_s:.0f}s: {reason}"
            )
        await asyncio.sleep(RETRY_INTERVAL_S)


async def _unless_stopped(step: Awaitable[T], stop: asyncio.Event) -> T:
    """Await one start-up step, abandoning it with `_StopRequestedError` as soon as `stop` is set."""
    work = asyncio.ensure_future(step)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise _StopRequestedError
    return work.result()


class _StopRequestedError(Exception):
    """`stop` was set while the service was still starting."""


async def _close_bus(bus: NatsEventBus) -> None:
    """Drain the bus; when NATS is unreachable there is nothing to drain, so just close."""
    try:
        async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
            await bus.close()
    except Exception as error:
        log.warning(
            "NATS connection closed without draining",
            extra={"event": "service.bus_closed", "outcome": "error", "reason": _first_line(error)},
        )
        await bus.nc.close()


def _without_password(database_url: str) -> str:
    return ledger_url(database_url).render_as_string(hide_password=True)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


async def _wait_for_port(host: str, port: int) -> None:
    """Wait up to `PORT_WAIT_S` for `host:port` to be free: a restarted service finds its port still
    held for a while by the process it replaces. Then serving reports it if it is still taken."""
    if port == 0 or _port_free(host, port):
        return
    log.warning(
        "port in use; waiting for it to be released",
        extra={"event": "service.port_busy", "port": port, "wait_s": PORT_WAIT_S},
    )
    for _attempt in range(round(PORT_WAIT_S / RETRY_INTERVAL_S)):
        await asyncio.sleep(RETRY_INTERVAL_S)
        if _port_free(host, port):
            return


async def _serve_http(server: _Server) -> None:
    try:
        await server.serve()
    except SystemExit as exit_:
        # uvicorn exits the process when it cannot bind; report it as a failure of this service instead.
        raise ServiceFailedError(
            f"HTTP server on {server.config.host}:{server.config.port} failed to start (code {exit_.code}); "
            "is the port in use? Choose another with --port / TF_PORT"
        ) from None


PROVISION_RETRY_S = 0.5


async def _provision(spec: ServiceSpec[Any], bus: NatsEventBus) -> None:
    """The streams (on `TF_NATS_STREAM_REPLICAS` servers) and this service's own durable consumers;
    asked again until `spec.startup_timeout_s` while JetStream does not answer for now (a NATS cluster
    whose stream lost its leader answers nothing or 503 until it has elected another)."""
    deadline = time.monotonic() + spec.startup_timeout_s
    while True:
        try:
            await subjects.provision(
                bus.js,
                consumers=subjects.consumers_of(spec.name),
                replicas=spec.settings.nats.stream_replicas,
            )
            return
        except subjects.StreamReplicasError as error:
            raise StartupError(str(error)) from error
        except (nats.errors.TimeoutError, ServiceUnavailableError) as error:
            if time.monotonic() > deadline:
                raise StartupError(
                    f"NATS did not provision the streams within {spec.startup_timeout_s:.0f}s: "
                    f"{_first_line(error)}"
                ) from error
            await asyncio.sleep(PROVISION_RETRY_S)


async def serve(spec: ServiceSpec[SettingsT], *, stop: asyncio.Event) -> None:
    """Run `spec` until `stop` is set, then shut down in order (see the module docstring).

    Raises `StartupError` when NATS or Postgres cannot be reached or a setting is missing, and
    `ServiceFailedError` when a background task or the HTTP server fails while running.
    """
    nats_url, database_url = required_urls(spec.settings, ledger=spec.needs_ledger)
    if database_url is None and spec.settings.database.url:
        log.warning(
            "TF_DATABASE_URL is set but this service runs without the ledger; it is not used: remove it",
            extra={"service": spec.name, "event": "service.unused_database_url"},
        )
    started_at = time.monotonic()
    async with AsyncExitStack() as resources:
        try:
            await _unless_stopped(_wait_for_port(spec.bind_host, spec.port), stop)
            engine = None if database_url is None else probe_engine(database_url)
            if engine is not None:
                resources.push_async_callback(engine.dispose)
            bus = await _unless_stopped(_connect_bus(spec, nats_url), stop)
            resources.push_async_callback(_close_bus, bus)
            if engine is not None and database_url is not None:
                await _unless_stopped(_wait_for_postgres(spec, engine, database_url), stop)
            await _unless_stopped(_provision(spec, bus), stop)
            ledger = None
            if database_url is not None:
                ledger = SqlLedger.create(database_url, pool_size=spec.settings.database.pool_size)
                resources.push_async_callback(ledger.close)
        except _StopRequestedError:
            log.info(
                "stopped while starting",
                extra={"service": spec.name, "event": "service.stopped", "outcome": "ok"},
            )
            return
        cleanup = await resources.enter_async_context(AsyncExitStack())
        ssl_context = server_ssl_context(spec.tls) if spec.tls else None
        context = ServiceContext(
            name=spec.name,
            settings=spec.settings,
            nats=bus,
            stopping=asyncio.Event(),
            cleanup=cleanup,
            ssl_context=ssl_context,
            open_ledger=ledger,
            open_database_url=database_url,
        )
        components = await spec.compose(context)
        checks: dict[str, ReadinessCheck] = {"nats": lambda: check_nats(bus)}
        if engine is not None:
            probe = engine
            checks["postgres"] = lambda: check_postgres(probe)
        checks.update(components.readiness)
        app = build_app(spec.name, components.routers, checks)
        config = uvicorn.Config(
            with_front_routes(app, components.front_routes),
            host=spec.bind_host,
            port=spec.port,
            log_config=None,
            access_log=False,
            lifespan="off",
            ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context else None,
        )
        server = _Server(config)
        await _run_until_stopped(spec, context, server, components, stop, started_at)


async def _run_until_stopped(
    spec: ServiceSpec[Any],
    context: ServiceContext[Any],
    server: _Server,
    components: Components,
    stop: asyncio.Event,
    started_at: float,
) -> None:
    http = asyncio.create_task(_serve_http(server), name=f"{spec.name}-http")
    tasks = {
        asyncio.create_task(_guarded(name, task, context.stopping), name=f"{spec.name}-{name}"): name
        for name, task in background_tasks(context, components).items()
    }
    stop_requested = asyncio.create_task(stop.wait())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait({http, listening, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    if listening.done():
        log.info(
            "service listening",
            extra={
                "service": spec.name,
                "event": "service.listening",
                "outcome": "ok",
                "url": f"{'https' if spec.tls else 'http'}://{spec.bind_host}:{spec.port}",
                "duration_ms": round((time.monotonic() - started_at) * 1000),
            },
        )
        await asyncio.wait({http, stop_requested, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    failure = _first_failure(http, tasks, stop)
    log.info(
        "service stopping",
        extra={"service": spec.name, "event": "service.stopping", "outcome": "error" if failure else "ok"},
    )
    server.should_exit = True
    context.stopping.set()
    pending = [task for task in (http, *tasks) if not task.done()]
    _, stragglers = await asyncio.wait(pending, timeout=SHUTDOWN_TIMEOUT_S) if pending else (set(), set())
    for straggler in stragglers:
        log.warning(
            "task did not stop in time; cancelled",
            extra={"service": spec.name, "event": "service.task_cancelled", "task": straggler.get_name()},
        )
        straggler.cancel()
    await asyncio.gather(*stragglers, return_exceptions=True)
    stop_requested.cancel()
    await context.cleanup.aclose()
    log.info(
        "service stopped",
        extra={"service": spec.name, "event": "service.stopped", "outcome": "error" if failure else "ok"},
    )
    if failure is not None:
        raise failure


def _first_failure(
    http: asyncio.Task[None], tasks: Mapping[asyncio.Task[None], str], stop: asyncio.Event
) -> ServiceFailedError | None:
    finished = [(http, "http server"), *((task, name) for task, name in tasks.items())]
    for task, name in finished:
        if not task.done():
            continue
        error = task.exception()
        if isinstance(error, ServiceFailedError):
            return error
        if error is not None:
            return ServiceFailedError(f"{name} failed: {_first_line(error)}")
        if task is http and not stop.is_set():
            return ServiceFailedError("http server stopped before the service was asked to stop")
    return None


async def run_timer(name: str, timer: Timer | tuple[float, Round], stop: asyncio.Event) -> None:
    """Run `timer` until `stop` is set: its `fn` every `interval_s` (see `Timer`). An exception from a
    round is logged with its traceback (`service.timer_failed`) and the next round runs on time. Also
    for timers bound to an event of their own (a leader's term) rather than the service's `stopping`."""
    interval_s, fn, at_start = Timer(*timer)
    if not at_start:
        await _sleep_unless(stop, interval_s)
    while not stop.is_set():
        try:
            await fn()
        except Exception as error:
            log.exception(
                "timer round failed; the next round runs as usual",
                extra={
                    "event": "service.timer_failed",
                    "task": name,
                    "outcome": "retry",
                    "reason": _first_line(error),
                },
            )
        await _sleep_unless(stop, interval_s)


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def background_tasks(context: ServiceContext[Any], components: Components) -> dict[str, BackgroundTask]:
    """Every background task of `components` by name: one pull loop per handler, one loop per timer,
    then the plain tasks. Raises `ValueError` when two share a name."""
    bus, stopping = context.nats, context.stopping
    named: list[tuple[str, BackgroundTask]] = []
    for consumer, handler in components.handlers.items():
        consume = handler if isinstance(handler, Consume) else Consume(handler)
        named.append(
            (
                metric_consumer(consumer).removeprefix(f"{consumer.service or context.name}-"),
                partial(
                    run_pull_consumer,
                    bus.js,
                    consumer,
                    consume.handler,
                    bus=bus,
                    service=context.name,
                    stop=stopping,
                    batch=consume.batch,
                    concurrent=consume.concurrent,
                ),
            )
        )
    named.extend(
        (name, partial(run_timer, name, timer, stopping)) for name, timer in components.timers.items()
    )
    named.extend(components.tasks.items())
    twice = sorted(name for name, count in Counter(name for name, _ in named).items() if count > 1)
    if twice:
        raise ValueError(f"background tasks named twice: {', '.join(twice)}")
    return dict(named)


async def _guarded(name: str, task: BackgroundTask, stopping: asyncio.Event) -> None:
    try:
        await task()
    except Exception as error:
        log.exception(
            "background task failed", extra={"event": "service.task_failed", "task": name, "outcome": "error"}
        )
        raise ServiceFailedError(f"task {name} failed: {_first_line(error)}") from error
    if not stopping.is_set():
        raise ServiceFailedError(f"task {name} returned before the service was asked to stop")


def run_service(spec: ServiceSpec[Any]) -> int:
    """Process entry point: JSON logs, telemetry, `serve` until SIGTERM/SIGINT. Returns the exit code:
    0 after a clean stop, 1 when the service could not start or failed while running."""
    configure_logging(spec.name, spec.settings.log_level)
    setup_telemetry(spec.name, spec.settings.otlp_endpoint)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signal_number, stop.set)
        await serve(spec, stop=stop)

    try:
        asyncio.run(main())
    except StartupError as error:
        log.error(
            str(error), extra={"service": spec.name, "event": "service.start_failed", "outcome": "error"}
        )
        return 1
    except ServiceFailedError as error:
        log.error(str(error), extra={"service": spec.name, "event": "service.failed", "outcome": "error"})
        return 1
    return 0
