"""The API token `tfctl up` keeps in its state folder, and how every `tfctl` command finds it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from tfctl.local_state import api_token, auth_headers, ensure_api_token, read_endpoints, token_path


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_API_TOKEN", raising=False)


def test_a_first_start_generates_a_token_only_its_owner_can_read(tmp_path: Path) -> None:
    token, source = ensure_api_token(tmp_path / "state")

    path = token_path(tmp_path / "state")
    assert source == "generated"
    assert len(token) >= 32
    assert path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_next_start_keeps_the_token_and_tightens_a_loosened_file(tmp_path: Path) -> None:
    first, _ = ensure_api_token(tmp_path)
    token_path(tmp_path).chmod(0o644)

    second, source = ensure_api_token(tmp_path)

    assert (second, source) == (first, "file")
    assert stat.S_IMODE(token_path(tmp_path).stat().st_mode) == 0o600


def test_tf_api_token_wins_and_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_API_TOKEN", "from-the-shell")

    assert ensure_api_token(tmp_path) == ("from-the-shell", "environment")
    assert not token_path(tmp_path).exists()
    assert api_token(tmp_path) == "from-the-shell"


def test_tfctl_reads_the_stacks_token_from_the_state_folder(tmp_path: Path) -> None:
    token, _ = ensure_api_token(tmp_path)

    assert api_token(tmp_path) == token
    assert auth_headers(tmp_path) == {"Authorization": f"Bearer {token}"}


def test_without_a_token_no_header_is_sent(tmp_path: Path) -> None:
    assert api_token(tmp_path) is None
    assert auth_headers(tmp_path) == {}


def test_endpoints_of_a_folder_without_a_stack_are_empty(tmp_path: Path) -> None:
    (tmp_path / "endpoints.json").write_text("not json")

    assert read_endpoints(tmp_path) == {}
    assert read_endpoints(tmp_path / "missing") == {}
