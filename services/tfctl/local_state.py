"""What a running `tfctl up` leaves in its state folder for the other `tfctl` commands to find.

- `api-token` (mode 0600): the bearer token the stack's services require on mutating endpoints.
  `tfctl up` writes a fresh random one when `TF_API_TOKEN` is unset; every `tfctl` command uses
  `TF_API_TOKEN` when it is set and this file otherwise.
- `endpoints.json`: where each service and node agent listens, and the NATS URL of the stack (written by
  `tfctl up` once ready); `tfctl events tail` and `tfctl defrag run` use that URL when `TF_NATS_URL` is
  unset.

The folder is `--state-dir`, else `TF_STATE_DIR`, else `.tf` in the current directory.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Literal

TOKEN_FILE = "api-token"
ENDPOINTS_FILE = "endpoints.json"
TOKEN_ENV = "TF_API_TOKEN"
NATS_URL_ENV = "TF_NATS_URL"

TokenSource = Literal["environment", "file", "generated"]


def default_state_dir() -> Path:
    """`TF_STATE_DIR`, else `.tf` in the current directory."""
    return Path(os.environ.get("TF_STATE_DIR", ".tf"))


def token_path(state_dir: Path) -> Path:
    return state_dir / TOKEN_FILE


def api_token(state_dir: Path | None = None) -> str | None:
    """The token to send: `TF_API_TOKEN` when set, else the one `tfctl up` wrote, else None."""
    from_environment = os.environ.get(TOKEN_ENV, "").strip()
    if from_environment:
        return from_environment
    try:
        stored = token_path(state_dir or default_state_dir()).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return stored or None


def auth_headers(state_dir: Path | None = None) -> dict[str, str]:
    """`Authorization: Bearer ...` when a token is known, else no header (the service answers 401)."""
    token = api_token(state_dir)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def missing_token_hint(state_dir: Path | None = None) -> str:
    """What to tell a user whose call was refused for want of a token."""
    path = token_path(state_dir or default_state_dir())
    return (
        f"no API token: set {TOKEN_ENV}, or run from the folder of `tfctl up` (it writes {path}), "
        "or pass --state-dir"
    )


def ensure_api_token(state_dir: Path) -> tuple[str, TokenSource]:
    """The token the stack runs with: `TF_API_TOKEN`, else the stored one, else a new random one
    written to `STATE_DIR/api-token` readable by its owner only."""
    from_environment = os.environ.get(TOKEN_ENV, "").strip()
    if from_environment:
        return from_environment, "environment"
    path = token_path(state_dir)
    try:
        stored = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        stored = ""
    if stored:
        os.chmod(path, 0o600)
        return stored, "file"
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(token + "\n")
    os.chmod(path, 0o600)
    return token, "generated"


def read_endpoints(state_dir: Path | None = None) -> dict[str, Any]:
    """The stack's `endpoints.json`, or {} when there is none (no stack ran from this folder)."""
    path = (state_dir or default_state_dir()) / ENDPOINTS_FILE
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def nats_url(explicit: str | None = None, state_dir: Path | None = None) -> tuple[str, str] | None:
    """The NATS URL to use and where it came from, for error messages: `explicit` (`--nats-url`), else
    `TF_NATS_URL`, else the `nats` entry of `endpoints.json` that `tfctl up` wrote; None when none is set."""
    if explicit:
        return explicit, "--nats-url"
    from_environment = os.environ.get(NATS_URL_ENV, "").strip()
    if from_environment:
        return from_environment, NATS_URL_ENV
    folder = state_dir or default_state_dir()
    recorded = read_endpoints(folder).get("nats")
    url = recorded.get("url") if isinstance(recorded, dict) else None
    if isinstance(url, str) and url:
        return url, f"{folder / ENDPOINTS_FILE}, written by `tfctl up`"
    return None
