"""Principals and their credentials (P1).

A principal is an authenticated identity. Credentials are configured in the
engine as ``name -> "sha256:<hex>"`` digests of a high-entropy secret; the secret
itself never enters the store, the audit log or any output (S3). Only
:meth:`Authenticator.authenticate` makes a :class:`Principal`; one built by hand
carries no valid proof and every engine call refuses it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from charter.errors import AuthenticationError, ConfigError


class Right(StrEnum):
    """The named rights a contract grants to a principal."""

    RUN = "run"  # start runs and admit attempts on adapter.operation scopes
    APPROVE = "approve"  # decide approvals for effects on scopes
    RESOLVE = "resolve"  # settle uncertain attempts, close incidents
    CONSUME = "consume"  # consume artifacts
    ADOPT = "adopt"  # accept a handed-over mission
    LINK = "link"  # review a new linked run after a terminal one
    RAISE_LIMIT = "raise_limit"  # raise an allowance limit (new contract version)
    STOP = "stop"  # stop a run
    RECOVER = "recover"  # take a run over (R1-R6); comes with run or resolve
    RECONCILE = "reconcile"  # ask for evidence, maybe replay (R7, A8); with run or resolve


@dataclass(frozen=True)
class Principal:
    """An authenticated identity. Obtain one from ``Engine.authenticate``."""

    name: str
    _proof: str = field(repr=False, compare=False)


def hash_secret(secret: str) -> str:
    """The digest to configure for a credential secret (``sha256:<hex>``)."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


def new_credential(name: str) -> tuple[str, str]:
    """A fresh credential for ``name``: ``(credential, digest to configure)``."""
    secret = secrets.token_urlsafe(32)
    return f"{name}:{secret}", hash_secret(secret)


def parse_credential(credential: str) -> tuple[str, str]:
    """Split ``"name:secret"``; refuse anything else."""
    name, sep, secret = credential.strip().partition(":")
    if not sep or not name or not secret:
        raise AuthenticationError(
            "a credential has the form NAME:SECRET; "
            "set CHARTER_CREDENTIAL or CHARTER_CREDENTIAL_FILE to one"
        )
    return name, secret


class Authenticator:
    """Checks credentials against configured digests and vouches for principals."""

    def __init__(self, digests: Mapping[str, str]) -> None:
        for name, digest in digests.items():
            if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
                raise ConfigError(
                    f"credential for principal {name!r} must be 'sha256:<64 hex>'; "
                    "make one with `charter credential new NAME`"
                )
        self._digests = dict(digests)
        self._key = secrets.token_bytes(32)  # proofs are valid for this engine only

    def _proof(self, name: str) -> str:
        return hmac.new(self._key, name.encode(), hashlib.sha256).hexdigest()

    def authenticate(self, credential: str) -> Principal:
        """Return the principal a ``NAME:SECRET`` credential proves, or refuse."""
        name, secret = parse_credential(credential)
        expected = self._digests.get(name)
        if expected is None or not hmac.compare_digest(expected, hash_secret(secret)):
            raise AuthenticationError(
                "the credential is not valid here; check the principal's name and secret "
                "against the engine's configured credentials",
                principal=name,
            )
        return Principal(name, self._proof(name))

    def vouch(self, principal: Principal) -> None:
        """Refuse a principal this engine did not authenticate (a forgery)."""
        if not isinstance(principal, Principal) or not hmac.compare_digest(
            principal._proof, self._proof(principal.name)
        ):
            raise AuthenticationError(
                f"principal {getattr(principal, 'name', principal)!r} was not authenticated by "
                "this engine; obtain it from Engine.authenticate(credential)",
                principal=str(getattr(principal, "name", principal)),
            )

    def holder(self, name: str) -> Principal | None:
        """The principal ``name`` for a sign-in the engine issued after checking
        that name's credential (:mod:`charter.engine.signins`); ``None`` once the
        name has no credential configured here."""
        return Principal(name, self._proof(name)) if name in self._digests else None

    def system(self, name: str) -> Principal:
        """A principal for the engine's own actions (recorded as ``engine:<name>``)."""
        full = f"engine:{name}"
        return Principal(full, self._proof(full))
