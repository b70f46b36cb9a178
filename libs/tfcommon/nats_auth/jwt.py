"""NATS JWTs (version 2): the claims a NATS server and its auth callout exchange, signed with nkeys.

A token is `base64url(header).base64url(claims).base64url(signature)`, the header
`{"typ": "JWT", "alg": "ed25519-nkey"}`, the signature Ed25519 by the key named in the claims' `iss`.
The claims' `jti` is the base32 SHA-512/256 of the claims written without it, as NATS writes its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tfcommon.nats_auth.nkeys import KeyPair, verify

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


class JwtError(ValueError):
    """A token that is malformed or whose signature is not its issuer's."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError as error:
        raise JwtError("a token part is not base64url") from error


def encode(claims: Mapping[str, Any], signer: KeyPair) -> str:
    """`claims` signed by `signer` (whose public key becomes `iss`), with their `jti`."""
    body = dict(claims) | {"iss": signer.public_key, "jti": ""}
    digest = hashlib.new("sha512_256", json.dumps(body, separators=(",", ":")).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(HEADER).encode())}.{_b64(json.dumps(body).encode())}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"


def decode(token: str) -> dict[str, Any]:
    """The claims of `token`, once its signature is checked against its own `iss`."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("a NATS JWT has three parts separated by dots")
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except json.JSONDecodeError as error:
        raise JwtError("a token part is not JSON") from error
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unsupported JWT algorithm {header!r}; NATS signs with ed25519-nkey")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise JwtError("the claims name no issuer (iss)")
    if not verify(claims["iss"], f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2])):
        raise JwtError("the signature is not the issuer's")
    return claims
