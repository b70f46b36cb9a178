"""`TF_NATS_TLS_*`: what a wrong combination or an unreadable file says, before any connection."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from tfcommon.kube_local.pki import KeyPair, ensure_ca_pair
from tfcommon.nats_tls import NatsTlsError, client_context, require_tls, verification_failure
from tfcommon.settings import NatsSettings


def test_no_tls_setting_means_no_context() -> None:
    assert client_context(NatsSettings()) is None


def test_a_client_certificate_without_its_key_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="TF_NATS_TLS_CERT_FILE and TF_NATS_TLS_KEY_FILE go together"):
        NatsSettings(tls_cert_file=tmp_path / "client.crt")


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TF_NATS_TLS_CA_FILE", str(tmp_path / "ca.crt"))
    assert NatsSettings().tls_ca_file == tmp_path / "ca.crt"


def test_an_unreadable_ca_file_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    with pytest.raises(NatsTlsError, match=r"TF_NATS_TLS_CA_FILE=.*ca\.crt: cannot load it"):
        client_context(NatsSettings(tls_ca_file=tmp_path / "ca.crt"))


def test_the_context_checks_the_certificate_and_the_name(tmp_path: Path) -> None:
    ca = ensure_ca_pair(KeyPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "unit-test-ca")
    context = client_context(NatsSettings(tls_ca_file=ca.cert_file))
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_a_dropped_handshake_is_left_to_the_retries() -> None:
    assert verification_failure("nats://n:4222", ssl.SSLEOFError(8, "EOF occurred")) is None
    assert verification_failure("nats://n:4222", ConnectionRefusedError()) is None


def test_a_server_without_tls_is_refused_when_tls_is_asked_for() -> None:
    require_tls("nats://n:4222", {"tls_required": True})
    with pytest.raises(NatsTlsError, match="does not offer TLS"):
        require_tls("nats://n:4222", {})
