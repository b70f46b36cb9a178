"""NATS nkeys: Ed25519 key pairs written as base32 strings with a type prefix and a CRC-16 check.

A public key is `base32(prefix byte + 32-byte key + crc16)`; a seed is two prefix bytes (`S` and the
key type) + the 32-byte seed + crc16. Account keys start with `A`, users with `U`, servers with `N`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from enum import IntEnum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

_SEED_PREFIX = 18 << 3


class KeyType(IntEnum):
    """The prefix byte of each kind of public key."""

    OPERATOR = 14 << 3
    SERVER = 13 << 3
    CLUSTER = 2 << 3
    ACCOUNT = 0
    USER = 20 << 3
    CURVE = 23 << 3


class NkeyError(ValueError):
    """A string that is no valid nkey of the kind asked for."""


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), as nkeys checks their strings."""
    return binascii.crc_hqx(data, 0)


def _encode(raw: bytes) -> str:
    checked = raw + _crc16(raw).to_bytes(2, "little")
    return base64.b32encode(checked).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        checked = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as error:
        raise NkeyError(f"{text[:8]}...: not base32") from error
    raw, crc = checked[:-2], checked[-2:]
    if len(checked) < 3 or _crc16(raw).to_bytes(2, "little") != crc:
        raise NkeyError(f"{text[:8]}...: checksum does not match")
    return raw


def encode_public(kind: KeyType, key: bytes) -> str:
    """The nkey string of a 32-byte Ed25519 public key of `kind`."""
    return _encode(bytes([kind]) + key)


def decode_public(text: str, kind: KeyType | None = None) -> bytes:
    """The 32-byte Ed25519 public key in `text`; `kind`, when given, must be its type."""
    raw = _decode(text)
    if len(raw) != 33:
        raise NkeyError(f"{text[:8]}...: not a public key")
    if kind is not None and raw[0] != kind:
        raise NkeyError(f"{text[:8]}...: not a {kind.name.lower()} key")
    if raw[0] not in set(KeyType):
        raise NkeyError(f"{text[:8]}...: unknown key type")
    return raw[1:]


@dataclass(frozen=True)
class KeyPair:
    """An nkey with its private half: signs, and writes itself as a seed (secret) or a public key."""

    kind: KeyType
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, kind: KeyType) -> KeyPair:
        return cls(kind, Ed25519PrivateKey.generate())

    @classmethod
    def from_raw_seed(cls, kind: KeyType, seed: bytes) -> KeyPair:
        """The key pair of `kind` whose Ed25519 private key is the 32 bytes `seed`."""
        return cls(kind, Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        """The key pair of an nkey seed (`SA...` for an account, `SU...` for a user)."""
        raw = _decode(seed.strip())
        if len(raw) != 34 or raw[0] & 0xF8 != _SEED_PREFIX:
            raise NkeyError("not an nkey seed: it starts with S and is 58 characters long")
        kind_byte = ((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)
        try:
            kind = KeyType(kind_byte)
        except ValueError as error:
            raise NkeyError("the seed's key type is unknown") from error
        return cls(kind, Ed25519PrivateKey.from_private_bytes(raw[2:]))

    @property
    def seed(self) -> str:
        secret = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        prefix = bytes([_SEED_PREFIX | (self.kind >> 5), (self.kind & 31) << 3])
        return _encode(prefix + secret)

    @property
    def public_key(self) -> str:
        return encode_public(
            self.kind, self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        )

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """Whether `signature` over `data` was made by the private half of the nkey `public_key`."""
    try:
        Ed25519PublicKey.from_public_bytes(decode_public(public_key)).verify(signature, data)
    except (InvalidSignature, NkeyError, ValueError):
        return False
    return True
