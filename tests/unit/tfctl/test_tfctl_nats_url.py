"""A wrong or stale NATS URL: `tfctl events tail` and `tfctl defrag run` give one clear line within 5 s and
exit 1 (issue #18, item 9), whether the URL came from `--nats-url`, `TF_NATS_URL` or the `endpoints.json`
a stopped `tfctl up` left; and which URL `tfctl` takes when several are known."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tfcommon.infra import free_port
from tfctl.local_state import nats_url

DEADLINE_S = 5.0


def tfctl(*argv: str, cwd: Path, **environment: str) -> tuple[subprocess.CompletedProcess[str], float]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    started = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "tfctl.main", *argv],
        capture_output=True,
        text=True,
        env={**clean, **environment},
        cwd=cwd,
        timeout=60,
        check=False,
    )
    return ran, time.monotonic() - started


def assert_one_clear_line(ran: subprocess.CompletedProcess[str], elapsed_s: float, *mentions: str) -> None:
    assert ran.returncode == 1, ran
    assert elapsed_s < DEADLINE_S, f"took {elapsed_s:.1f} s"
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert "Traceback" not in ran.stderr
    for mention in mentions:
        assert mention in lines[0]


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never says anything (not NATS, or a NATS that hangs)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"nats://127.0.0.1:{listener.getsockname()[1]}"


def test_a_closed_port_given_with_nats_url_is_one_line_within_5_s(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"

    ran, elapsed = tfctl("events", "tail", "--nats-url", url, cwd=tmp_path)

    assert_one_clear_line(ran, elapsed, f"cannot reach NATS at {url} (from --nats-url)", "tfctl up")


def test_a_stale_endpoints_file_is_named_in_the_error(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    (tmp_path / ".tf").mkdir()
    (tmp_path / ".tf" / "endpoints.json").write_text(json.dumps({"services": [], "nats": {"url": url}}))

    ran, elapsed = tfctl("events", "tail", "--count", "1", cwd=tmp_path)

    assert_one_clear_line(
        ran, elapsed, f"cannot reach NATS at {url}", "endpoints.json, written by `tfctl up`"
    )


def test_defrag_run_on_a_server_that_never_answers_gives_up_within_5_s(
    tmp_path: Path, silent_listener: str
) -> None:
    ran, elapsed = tfctl(
        "defrag", "run", "--pool", "default", "--now", cwd=tmp_path, TF_NATS_URL=silent_listener
    )

    assert_one_clear_line(
        ran, elapsed, f"cannot reach NATS at {silent_listener} (from TF_NATS_URL)", "no answer"
    )


def test_a_url_of_another_scheme_is_refused_at_once(tmp_path: Path) -> None:
    ran, elapsed = tfctl("events", "tail", "--nats-url", "http://127.0.0.1:8080", cwd=tmp_path)

    assert_one_clear_line(ran, elapsed, "'http://127.0.0.1:8080' (from --nats-url) is not a NATS URL")
    assert elapsed < 2


def test_no_url_anywhere_says_where_one_comes_from(tmp_path: Path) -> None:
    ran, _ = tfctl("events", "tail", cwd=tmp_path)

    assert ran.returncode == 2
    assert "no NATS URL: set TF_NATS_URL or pass --nats-url" in ran.stderr
    assert ".tf/endpoints.json" in ran.stderr


def test_the_flag_wins_then_the_environment_then_the_stack_s_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TF_NATS_URL", raising=False)
    (tmp_path / "endpoints.json").write_text(json.dumps({"nats": {"url": "nats://127.0.0.1:4300"}}))

    assert nats_url(None, tmp_path / "elsewhere") is None
    assert nats_url(None, tmp_path) == (
        "nats://127.0.0.1:4300",
        f"{tmp_path / 'endpoints.json'}, written by `tfctl up`",
    )
    monkeypatch.setenv("TF_NATS_URL", "nats://127.0.0.1:4222")
    assert nats_url(None, tmp_path) == ("nats://127.0.0.1:4222", "TF_NATS_URL")
    assert nats_url("nats://10.0.0.1:4222", tmp_path) == ("nats://10.0.0.1:4222", "--nats-url")
