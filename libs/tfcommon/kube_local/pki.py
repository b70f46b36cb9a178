"""The certificates and keys of a local Kubernetes control plane, generated once into its state folder.

One CA signs the API server's serving certificate (loopback and the in-cluster names) and a client
certificate per component (admin in `system:masters`, the controller manager, the scheduler, KWOK), and
is the controller manager's cluster-signing CA. A front-proxy CA signs the API server's client certificate
towards aggregated API servers (request-header authentication). A separate key signs service-account
tokens. Files that
exist are kept, so a restarted control plane keeps its identity and the tokens it issued stay valid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tfcommon.tls import subject_alternative_names

VALIDITY = timedelta(days=3650)
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
API_SERVER_SERVICE_IP = "10.96.0.1"
API_SERVER_NAMES: tuple[str, ...] = (
    "localhost",
    "127.0.0.1",
    API_SERVER_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its private key."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class ClientIdentity:
    """Who a client certificate authenticates as: user `common_name` in `groups`."""

    file_stem: str
    common_name: str
    groups: tuple[str, ...] = ()


ADMIN = ClientIdentity("admin", "kubernetes-admin", ("system:masters",))
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
KWOK = ClientIdentity("kwok", "system:kwok-controller", ("system:masters",))
CLIENTS: tuple[ClientIdentity, ...] = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, KWOK)
FRONT_PROXY_CLIENT = ClientIdentity("front-proxy-client", "front-proxy-client")


@dataclass(frozen=True)
class ControlPlanePki:
    """Paths of everything `ensure_pki` writes under `folder`."""

    folder: Path

    @property
    def ca(self) -> KeyPair:
        return KeyPair(self.folder / "ca.crt", self.folder / "ca.key")

    @property
    def front_proxy_ca(self) -> KeyPair:
        return KeyPair(self.folder / "front-proxy-ca.crt", self.folder / "front-proxy-ca.key")

    @property
    def api_server(self) -> KeyPair:
        return KeyPair(self.folder / "apiserver.crt", self.folder / "apiserver.key")

    @property
    def service_account_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.folder / "sa.pub"

    def client(self, identity: ClientIdentity) -> KeyPair:
        """The client certificate and key authenticating as `identity`."""
        return KeyPair(self.folder / f"{identity.file_stem}.crt", self.folder / f"{identity.file_stem}.key")


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    os.replace(staged, path)


def _write_public(path: Path, data: bytes) -> None:
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_bytes(data)
    os.replace(staged, path)


def _ensure_ca(
    pair: KeyPair, common_name: str, now: datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if pair.cert_file.exists() and pair.key_file.exists():
        key = serialization.load_pem_private_key(pair.key_file.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(pair.cert_file.read_bytes()), key
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(pair.key_file, _key_pem(key))
    _write_public(pair.cert_file, certificate.public_bytes(serialization.Encoding.PEM))
    return certificate, key


def _ensure_leaf(
    pair: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    now: datetime,
    names: tuple[str, ...] = (),
) -> None:
    if pair.cert_file.exists() and pair.key_file.exists():
        return
    ca_certificate, ca_key = ca
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(subject_alternative_names(names)), critical=False
        )
    certificate = builder.sign(ca_key, hashes.SHA256())
    _write_private(pair.key_file, _key_pem(key))
    _write_public(pair.cert_file, certificate.public_bytes(serialization.Encoding.PEM))


def ensure_pki(folder: Path) -> ControlPlanePki:
    """Write whatever of the CA, the serving and client certificates and the service-account key pair is
    missing under `folder`; return their paths. Never replaces an existing file."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    pki = ControlPlanePki(folder)
    now = datetime.now(UTC)
    ca = _ensure_ca(pki.ca, "tfpool-local-kubernetes-ca", now)
    front_proxy_ca = _ensure_ca(pki.front_proxy_ca, "tfpool-local-front-proxy-ca", now)
    _ensure_leaf(
        pki.api_server,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        ca,
        now,
        API_SERVER_NAMES,
    )
    for identity in CLIENTS:
        subject = x509.Name(
            [
                *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in identity.groups),
                x509.NameAttribute(NameOID.COMMON_NAME, identity.common_name),
            ]
        )
        _ensure_leaf(pki.client(identity), subject, ExtendedKeyUsageOID.CLIENT_AUTH, ca, now)
    front_proxy_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, FRONT_PROXY_CLIENT.common_name)])
    _ensure_leaf(
        pki.client(FRONT_PROXY_CLIENT),
        front_proxy_subject,
        ExtendedKeyUsageOID.CLIENT_AUTH,
        front_proxy_ca,
        now,
    )
    if not pki.service_account_key.exists():
        key = _new_key()
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        _write_public(pki.service_account_public_key, public)
        _write_private(pki.service_account_key, _key_pem(key))
    return pki


def ensure_ca_pair(pair: KeyPair, common_name: str) -> KeyPair:
    """A CA certificate and key at `pair` (written unless both files exist), e.g. for a test's TLS
    servers; returns `pair`."""
    pair.cert_file.parent.mkdir(parents=True, exist_ok=True)
    _ensure_ca(pair, common_name, datetime.now(UTC))
    return pair


def ensure_leaf_pair(
    pair: KeyPair, ca_pair: KeyPair, common_name: str, *, server_names: tuple[str, ...] = ()
) -> KeyPair:
    """A certificate the CA at `ca_pair` signs, and its key, at `pair` (written unless both exist).

    With `server_names` it is a serving certificate for those DNS names and IP addresses; without, a
    client certificate authenticating as `common_name`. Returns `pair`.
    """
    if not (ca_pair.cert_file.exists() and ca_pair.key_file.exists()):
        raise FileNotFoundError(f"{ca_pair.cert_file}: no CA there; write it first with ensure_ca_pair")
    now = datetime.now(UTC)
    ca = _ensure_ca(ca_pair, common_name, now)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    _ensure_leaf(pair, subject, usage, ca, now, server_names)
    return pair
