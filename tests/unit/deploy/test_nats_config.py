"""deploy/nats/nats.conf: the real nats-server accepts it; every password comes from the environment."""

from __future__ import annotations

import os
import re
import subprocess

from deploy_support import REPO_ROOT, VENV_BIN
from tfcommon.nats_auth.node_access import CalloutKeys

NATS_CONFIG = REPO_ROOT / "deploy" / "nats" / "nats.conf"
ISSUER = CalloutKeys.from_secret(b"x" * 48).issuer.public_key


def password_variables() -> list[str]:
    return re.findall(r"password:\s*\$(\w+)", NATS_CONFIG.read_text())


def check_config(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "nats-server"), "-t", "-c", str(NATS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": os.environ.get("PATH", ""), "NATS_CALLOUT_ISSUER": ISSUER, **environment},
    )


def test_nats_server_accepts_the_config_when_the_passwords_are_set() -> None:
    result = check_config({name: f"secret-{name.lower()}" for name in password_variables()})
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stdout + result.stderr


def test_every_user_has_a_password_from_the_environment_and_none_is_written_down() -> None:
    text = NATS_CONFIG.read_text()
    users = re.findall(r"user:\s*(\S+)", text)
    assert set(users) == {
        "webhook",
        "scheduler",
        "defrag-planner",
        "metrics",
        "nats-auth",
        "tfctl",
        "readonly",
    }
    assert len(password_variables()) == len(users)
    assert re.findall(r"password:\s*[^$\s]", text) == []
    callout = re.search(r"auth_callout\s*\{(.*?)\}", text, re.DOTALL)
    assert callout is not None, "node agents are decided by the auth callout"
    assert set(
        re.findall(r"auth_users:\s*\[(.*?)\]", callout.group(1))[0].replace(" ", "").split(",")
    ) == set(users)


def test_nats_server_refuses_to_start_without_a_password() -> None:
    variables = password_variables()
    result = check_config(dict.fromkeys(variables[1:], "secret"))
    assert result.returncode != 0
    assert variables[0] in result.stderr
