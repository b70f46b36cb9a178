"""Self-signed TLS material for the admission webhook when no certificate is given.

`ensure_self_signed(cert_dir)` writes `tls.crt` / `tls.key` (ECDSA P-256, PEM) once and reuses them
while they stay valid and cover the requested names. It only touches files under `cert_dir`; it never
talks to the network. Production clusters pass their own pair (cert-manager) through
`TF_TLS_CERT_FILE` / `TF_TLS_KEY_FILE` instead.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_NAMES: tuple[str, ...] = (
    "localhost",
    "127.0.0.1",
    "::1",
    "tfpool-webhook",
    "tfpool-webhook.tfpool-system.svc",
    "tfpool-webhook.tfpool-system.svc.cluster.local",
)
VALIDITY = timedelta(days=365)
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class TlsFiles:
    """A PEM certificate and its private key on disk."""

    cert_file: Path
    key_file: Path


def subject_alternative_names(names: Sequence[str]) -> list[x509.GeneralName]:
    """Each name as an `IPAddress` when it parses as one, else a `DNSName`."""
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    return alternatives


def _still_usable(cert_file: Path, names: Sequence[str], now: datetime) -> bool:
    try:
        certificate = x509.load_pem_x509_certificate(cert_file.read_bytes())
        covered = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    if certificate.not_valid_after_utc - now < RENEW_BEFORE:
        return False
    return all(alternative in covered for alternative in subject_alternative_names(names))


def generate_self_signed(names: Sequence[str], now: datetime) -> tuple[bytes, bytes]:
    """Return `(certificate_pem, private_key_pem)` for a self-signed server certificate over `names`.

    The certificate is its own CA (basic constraints CA=true) so a client can trust it directly, e.g.
    as a webhook `caBundle` or `httpx.AsyncClient(verify=cert_file)`.
    """
    if not names:
        raise ValueError("names: give at least one DNS name or IP address for the certificate")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(subject_alternative_names(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def ensure_self_signed(cert_dir: Path, names: Sequence[str] = DEFAULT_NAMES) -> TlsFiles:
    """Return `cert_dir/tls.crt` and `cert_dir/tls.key`, generating them when missing, expiring or
    not covering `names`. The key file is written with mode 0600, then both are renamed into place so a
    concurrent reader never sees half a file."""
    files = TlsFiles(cert_file=cert_dir / "tls.crt", key_file=cert_dir / "tls.key")
    now = datetime.now(UTC)
    if files.key_file.exists() and _still_usable(files.cert_file, names, now):
        return files
    cert_dir.mkdir(parents=True, exist_ok=True)
    certificate_pem, key_pem = generate_self_signed(names, now)
    staged_key = cert_dir / f".tls.key.{os.getpid()}"
    staged_cert = cert_dir / f".tls.crt.{os.getpid()}"
    descriptor = os.open(staged_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as key_out:
        key_out.write(key_pem)
    staged_cert.write_bytes(certificate_pem)
    os.replace(staged_key, files.key_file)
    os.replace(staged_cert, files.cert_file)
    return files
