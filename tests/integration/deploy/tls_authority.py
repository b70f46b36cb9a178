"""A throwaway certificate authority for the TLS integration tests (NATS, Postgres).

`TestAuthority(folder)` writes a CA; `server(stem, names)` a serving certificate it signs for those
DNS names and IP addresses, `client(stem, common_name)` a client certificate. A second authority
(another folder) shows that a certificate from the wrong CA is refused.
"""

from __future__ import annotations

from pathlib import Path

from tfcommon.kube_local.pki import KeyPair, ensure_ca_pair, ensure_leaf_pair


class TestAuthority:
    """A CA under `folder`, and the certificates it signs there."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str = "tfpool-test-ca") -> None:
        self.folder = folder
        self.ca = ensure_ca_pair(KeyPair(folder / f"{name}.crt", folder / f"{name}.key"), name)

    def server(self, stem: str, names: tuple[str, ...]) -> KeyPair:
        pair = KeyPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        return ensure_leaf_pair(pair, self.ca, names[0], server_names=names)

    def client(self, stem: str, common_name: str) -> KeyPair:
        pair = KeyPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        return ensure_leaf_pair(pair, self.ca, common_name)
