"""Signatures over chain heads (S2): Ed25519, through the ``cryptography`` package.

Why a public-key signature and not an HMAC from the standard library: with an
HMAC every party that can verify a snapshot can also forge one, so a receiving
store, or an auditor, would have to be trusted with the key that signs. With
Ed25519 the signing key stays with the engine that exports; anyone holding the
public key (another store, ``openssl pkeyutl``) verifies and cannot sign. Why
``cryptography``: it is the maintained binding to OpenSSL that the Python world
already audits and ships wheels of. The core has no runtime dependencies, so it
sits behind the ``signing`` extra (``pip install 'charter[signing]'``) and is
loaded only when a key is used.

A signing key is a PEM (PKCS#8) file, as ``openssl genpkey -algorithm ed25519``
or :func:`new_signing_key` writes it; the engine is configured with its path
and never copies the key anywhere (S3). A key's id is derived from its public
key (``ed25519:`` and 16 hex digits of its SHA-256), so it cannot be claimed by
another key. **Rotation**: make a new key and point ``signing_key`` at it; keep
the old key's public text in ``trusted_keys`` for as long as snapshots and
checkpoints it signed must verify; remove it to stop trusting them.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charter.errors import ConfigError, MissingExtra, SignatureInvalid

#: How a public key is written in configuration and snapshots.
PREFIX = "ed25519:"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import (  # noqa: PLC0415 - an optional extra
            ed25519,
        )
    except ImportError:
        raise MissingExtra(
            "signing snapshots and checkpoints needs cryptography: pip install 'charter[signing]'",
            extra="signing",
        ) from None
    return ed25519


def _serialization() -> Any:
    _ed25519()
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - an optional extra

    return serialization


def key_id(public_key: str) -> str:
    """The id of a public key written as ``ed25519:BASE64``."""
    return PREFIX + hashlib.sha256(public_key.encode()).hexdigest()[:16]


def _public_text(raw: bytes) -> str:
    return PREFIX + base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Signer:
    """An Ed25519 signing key; its ``public_key`` verifies what it signs."""

    public_key: str
    _key: Any = field(repr=False)

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def sign(self, data: bytes) -> bytes:
        signature: bytes = self._key.sign(data)
        return signature


def _signer(private: Any) -> Signer:
    serialization = _serialization()
    raw = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return Signer(_public_text(raw), private)


def load_signer(path: str | Path) -> Signer:
    """The signing key in the PEM file at ``path``; the message of a refusal never
    quotes the file's content."""
    ed25519 = _ed25519()
    serialization = _serialization()
    try:
        pem = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the signing key {path}: {exc.strerror}") from None
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        private = None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise ConfigError(
            f"the signing key {path} is not an unencrypted Ed25519 private key in PEM; "
            "make one with `openssl genpkey -algorithm ed25519 -out FILE`"
        )
    return _signer(private)


def new_signing_key(path: str | Path) -> str:
    """Write a new Ed25519 signing key to ``path`` (readable by its owner only) and
    return its public key, the text to put in other stores' ``trusted_keys``.
    An existing file is never overwritten."""
    ed25519 = _ed25519()
    serialization = _serialization()
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; a signing key is never overwritten") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return _signer(private).public_key


def check_public(text: str) -> str:
    """``text`` if it is a public key as configuration writes it, else a ConfigError."""
    raw = b""
    if isinstance(text, str) and text.startswith(PREFIX):
        try:
            raw = base64.b64decode(text[len(PREFIX) :], validate=True)
        except ValueError:
            raw = b""
    if len(raw) != 32:
        raise ConfigError(
            f"trusted key {text!r} is not an Ed25519 public key written as 'ed25519:BASE64' "
            "(the text `charter audit identity` prints)"
        )
    return text


def verify(trusted: Iterable[str], signer_id: str, data: bytes, signature: bytes) -> None:
    """Refuse unless the trusted public key with id ``signer_id`` signed ``data``."""
    keys = {key_id(k): k for k in trusted}
    public = keys.get(signer_id)
    if public is None:
        raise SignatureInvalid(
            f"signed by key {signer_id}, which this engine does not trust; add its public "
            "key to trusted_keys if you trust who holds it",
            problem="untrusted_key",
            key_id=signer_id,
        )
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - an optional extra

    key = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(public[len(PREFIX) :]))
    try:
        key.verify(signature, data)
    except InvalidSignature:
        raise SignatureInvalid(
            f"the signature does not verify with key {signer_id}: what it signed was changed "
            "after signing, or it was made with another key",
            problem="bad_signature",
            key_id=signer_id,
        ) from None
