"""TLS to NATS: the client context `NatsSettings` asks for, and the one line to show when TLS fails.

`client_context(settings)` is None unless `TF_NATS_TLS_CA_FILE` or a client certificate is set. With
one, the bus connects only over TLS: the server's certificate must chain to that CA (the system's CAs
when only a client certificate is given) and list the host of `TF_NATS_URL` (hostname checking is on).
`TF_NATS_TLS_CERT_FILE` / `TF_NATS_TLS_KEY_FILE` add a client certificate, for a server that verifies
clients (`verify: true` in its `tls {}` block).

`verification_failure(url, error)` turns the `ssl` error of a refused handshake into `NatsTlsError`,
whose message names the setting to fix; a retry would be refused again, so callers stop at it instead
of reconnecting forever. `require_tls(url, server_info)` refuses a server that did not switch to TLS
although the client asked for it (no silent plain-text connection). No I/O beyond reading the files.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from tfcommon.settings import NatsSettings


class NatsTlsError(Exception):
    """TLS to NATS cannot work with this configuration; `str()` is the line to show."""


def client_context(settings: NatsSettings) -> ssl.SSLContext | None:
    """The `ssl.SSLContext` for `nats.connect(tls=...)`, or None when no TLS setting is given."""
    if settings.tls_ca_file is None and settings.tls_cert_file is None:
        return None
    ca_file = settings.tls_ca_file
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(ca_file) if ca_file is not None else None
        )
    except (OSError, ssl.SSLError) as error:
        raise NatsTlsError(
            f"TF_NATS_TLS_CA_FILE={ca_file}: cannot load it as PEM CA certificates ({error}); "
            "point it at the CA certificate that signed the NATS server's certificate"
        ) from error
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.tls_cert_file is not None:
        try:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        except (OSError, ssl.SSLError) as error:
            raise NatsTlsError(
                f"TF_NATS_TLS_CERT_FILE={settings.tls_cert_file} / TF_NATS_TLS_KEY_FILE="
                f"{settings.tls_key_file}: cannot load the client certificate and its key ({error})"
            ) from error
    return context


def verification_failure(url: str, error: BaseException) -> NatsTlsError | None:
    """The `NatsTlsError` a failed TLS handshake with NATS at `url` stands for; None for any other error
    (or a handshake cut short, which a retry may get past)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        reason = error.verify_message or str(error)
        if "mismatch" in reason.lower():
            fix = (
                "connect by a name the server's certificate lists (the host in TF_NATS_URL), "
                "or issue the certificate for that name"
            )
        else:
            fix = "set TF_NATS_TLS_CA_FILE to the CA certificate that signed the NATS server's certificate"
        return NatsTlsError(f"NATS at {url}: the server's TLS certificate was refused ({reason}); {fix}")
    if isinstance(error, ssl.SSLError) and not isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return NatsTlsError(
            f"NATS at {url}: the TLS handshake failed ({error.reason or error}); if the server verifies "
            "clients, set TF_NATS_TLS_CERT_FILE and TF_NATS_TLS_KEY_FILE to a certificate its CA signed"
        )
    return None


def require_tls(url: str, server_info: Mapping[str, Any]) -> None:
    """Raise `NatsTlsError` when the server at `url` (its INFO) did not require TLS: the client asked
    for TLS, and would otherwise carry on in plain text."""
    if not server_info.get("tls_required"):
        raise NatsTlsError(
            f"NATS at {url} does not offer TLS, but TF_NATS_TLS_CA_FILE (or a client certificate) is set: "
            "enable TLS in the server's `tls {}` block, or unset the TF_NATS_TLS_* settings"
        )
