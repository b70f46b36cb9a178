"""How `tfctl` connects to NATS (`tfctl events tail`, `tfctl defrag run`): within a deadline, quietly.

A service retries the bus for as long as it runs; a command a user typed must not. `connect` keeps
trying for `CONNECT_DEADLINE_S` (NATS may be starting), keeps the client's errors out of the terminal,
and then raises `NatsUnreachableError` whose message is the one line to print: the URL, where it came
from (`--nats-url`, `TF_NATS_URL` or the state folder's `endpoints.json`), the last error and the fix.
Once connected the client reconnects on its own, as the services' does.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.client import Client

CONNECT_DEADLINE_S = 2.5
ATTEMPT_TIMEOUT_S = 2
RETRY_WAIT_S = 0.25
NATS_SCHEMES = ("nats", "tls", "ws", "wss")


class NatsUnreachableError(Exception):
    """No NATS answered at the URL in time; `str()` is the line to print."""


def _reason(error: BaseException | None) -> str:
    if error is None or isinstance(error, TimeoutError):
        return "no answer"
    return str(error) or type(error).__name__


async def connect(
    url: str, source: str, *, name: str, user: str | None = None, password: str | None = None
) -> Client:
    """A connected client, or `NatsUnreachableError` after at most `CONNECT_DEADLINE_S` seconds."""
    for server in url.split(","):
        scheme = server.strip().partition("://")[0] if "://" in server else "nats"
        if scheme not in NATS_SCHEMES:
            raise NatsUnreachableError(
                f"{server.strip()!r} (from {source}) is not a NATS URL: use nats://HOST:PORT, "
                "as `tfctl up` prints"
            )
    import nats
    from tfcommon.nats_tls import NatsTlsError, client_context, require_tls, verification_failure
    from tfcommon.settings import NatsSettings

    try:
        tls = client_context(NatsSettings())
    except (NatsTlsError, ValueError) as error:
        raise NatsUnreachableError(str(error)) from error
    options: dict[str, Any] = {} if tls is None else {"tls": tls}
    if user is not None:  # otherwise NATS's own inbox prefix (and no import of the event catalogue)
        from tfcommon.bus import inbox_prefix_for

        options["inbox_prefix"] = inbox_prefix_for(user)
    seen: list[Exception] = []
    connected = False

    async def remember(error: Exception) -> None:
        seen.append(error)
        if not connected and (refused := verification_failure(url, error)) is not None:
            raise refused  # out of nats.connect: a retry would be refused the same way

    try:
        client = await asyncio.wait_for(
            nats.connect(
                url,
                name=name,
                user=user,
                password=password,
                connect_timeout=ATTEMPT_TIMEOUT_S,
                reconnect_time_wait=RETRY_WAIT_S,
                max_reconnect_attempts=-1,
                error_cb=remember,
                **options,
            ),
            timeout=CONNECT_DEADLINE_S,
        )
    except NatsTlsError as error:
        raise NatsUnreachableError(str(error)) from error
    except (TimeoutError, OSError, ValueError, nats.errors.Error) as error:
        last = seen[-1] if seen else error
        raise NatsUnreachableError(
            f"cannot reach NATS at {url} (from {source}) within {CONNECT_DEADLINE_S:g} s: {_reason(last)}; "
            "start the stack (tfctl up), or pass --nats-url / set TF_NATS_URL to the URL `tfctl up` prints"
        ) from error
    if tls is not None:
        try:
            require_tls(url, client._server_info)
        except NatsTlsError as error:
            await client.close()
            raise NatsUnreachableError(str(error)) from error
    connected = True
    return client
