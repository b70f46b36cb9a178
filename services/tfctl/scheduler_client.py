"""One call to the scheduler's HTTP API for the `tfctl` commands that change something (`delete`, `cordon`,
`uncordon`, `label`): the bearer token from `TF_API_TOKEN` or the state folder, and every failure turned
into one line that says what to do (`SchedulerCallError`), never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfctl.commands.get import scheduler_url
from tfctl.local_state import api_token, missing_token_hint

TIMEOUT_S = 30.0


class SchedulerCallError(Exception):
    """The scheduler refused the call or could not be reached; `str()` is the line to print."""


__all__ = ["SchedulerCallError", "call", "detail_of", "scheduler_url"]


def detail_of(body: Any) -> str:
    """The API's `detail` as one line: a string as is, a validation list as `field: problem; ...`."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if not isinstance(detail, list):
        return str(detail)
    problems = []
    for problem in detail:
        if not isinstance(problem, dict):
            problems.append(str(problem))
            continue
        where = ".".join(str(part) for part in problem.get("loc", ())[1:])
        message = str(problem.get("msg", problem)).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where and not message.startswith(where) else message)
    return "; ".join(problems)


def call(
    method: str, path: str, *, url: str, state_dir: Path | None, body: dict[str, Any] | None = None
) -> Any:
    """`method path` with the token; the answer's JSON body, or `SchedulerCallError` with the reason."""
    import httpx

    token = api_token(state_dir)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as error:
        raise SchedulerCallError(
            f"the scheduler at {url} did not answer ({error}); start the stack (tfctl up) or pass "
            "--scheduler-url / TF_SCHEDULER_URL"
        ) from error
    try:
        answer = response.json()
    except ValueError:
        answer = {"detail": f"HTTP {response.status_code}: {response.text[:200]}"}
    if response.status_code in (401, 403):
        hint = missing_token_hint(state_dir) if token is None else "the token sent is not the scheduler's"
        raise SchedulerCallError(f"{detail_of(answer)} ({hint})")
    if response.status_code >= 400:
        raise SchedulerCallError(detail_of(answer))
    return answer
