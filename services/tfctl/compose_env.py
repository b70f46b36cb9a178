"""`make compose-env`: write the `.env` docker compose reads, with a random value for every secret.

docker-compose.yml gives no password a default: each secret is written `${NAME:?...}`, so compose
refuses to start until it is set. This module finds those names in the compose file itself (so a
secret added there is generated here without a second list) and writes `NAME=value` lines, each value
`secrets.token_urlsafe` (URL-safe, so it can sit inside `TF_DATABASE_URL`). The file is created with
mode 0600 and never replaces an existing one: Postgres keeps the passwords it was first set up with,
so a new `.env` over an old volume would lock the services out.

It uses only the standard library, so it runs before the virtual environment exists:
`python3 services/tfctl/compose_env.py [--compose-file FILE] [--output FILE]`.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIRED_VARIABLE = re.compile(r"\$\{(\w+):\?[^}]*\}")
"""A compose interpolation that fails when the variable is unset or empty: `${NAME:?message}`."""


def required_variables(compose_text: str) -> list[str]:
    """The names compose requires (`${NAME:?...}`), in first-use order, each once."""
    return list(dict.fromkeys(REQUIRED_VARIABLE.findall(compose_text)))


def render_env(names: Sequence[str], new_secret: Callable[[], str]) -> str:
    """The `.env` text: a comment, then `NAME=secret` for each name."""
    lines = ["# Written by `make compose-env`: random secrets for docker-compose.yml. Keep it private."]
    lines += [f"{name}={new_secret()}" for name in names]
    return "\n".join(lines) + "\n"


def write_env(compose_file: Path, output: Path) -> list[str]:
    """Create `output` (mode 0600) with a secret for every required variable; return the names.

    Raises `FileExistsError` when `output` exists: it is never overwritten.
    """
    names = required_variables(compose_file.read_text(encoding="utf-8"))
    if not names:
        raise ValueError(f"{compose_file}: no ${{NAME:?...}} variable found, nothing to generate")
    text = render_env(names, lambda: secrets.token_urlsafe(24))
    descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(output, 0o600)  # the umask cannot widen 0600, but an inherited ACL default could
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compose-env", description=__doc__.splitlines()[0])
    parser.add_argument("--compose-file", type=Path, default=REPO_ROOT / "docker-compose.yml")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / ".env")
    args = parser.parse_args(argv)
    try:
        names = write_env(args.compose_file, args.output)
    except FileExistsError:
        print(
            f"{args.output} exists: left as it is (delete it first, and run `docker compose down -v` "
            "too, since Postgres keeps the passwords it was set up with)",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as error:
        print(f"compose-env: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} (mode 0600): {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
