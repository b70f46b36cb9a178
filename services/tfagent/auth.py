"""The bearer-token check of the agent's mutating endpoints, as a FastAPI dependency.

A dependency runs before FastAPI validates the path and the body, so a request without the token gets
401 whatever it sends (only a body that is not JSON at all is refused earlier, with 422). The token
(`TF_API_TOKEN`) is compared in constant time; the 401 has the agent's `{"error": ...}` body and, for a
missing or wrong token, `WWW-Authenticate: Bearer`. A router whose routes use the dependency is built
with `route_class=RefusingRoute`, which sends that 401.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Header, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import SecretStr

WRONG_TOKEN = "missing or wrong bearer token: send `Authorization: Bearer <TF_API_TOKEN>`"


class UnauthorisedError(Exception):
    """The bearer-token check turned the request away; `response` is the 401 to send."""

    def __init__(self, response: JSONResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


class RefusingRoute(APIRoute):
    """A route that answers an `UnauthorisedError` raised by its token dependency with the error's own
    401 response instead of a 500."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_or_refuse(request: Request) -> Response:
            try:
                return await handle(request)
            except UnauthorisedError as refusal:
                return refusal.response

        return handle_or_refuse


def bearer_token(api_token: SecretStr | None, *, disabled: str) -> Callable[[str | None], Awaitable[None]]:
    """The dependency that admits only `Authorization: Bearer <api_token>`; with no token configured it
    refuses every request with `disabled` (which says how to enable the endpoints)."""

    async def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if api_token is None:
            raise UnauthorisedError(JSONResponse({"error": disabled}, status_code=401))
        scheme, _, presented = (authorization or "").partition(" ")
        expected = api_token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
            raise UnauthorisedError(
                JSONResponse({"error": WRONG_TOKEN}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            )

    return require_token
