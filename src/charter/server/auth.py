"""Who is asking (P1): a bearer credential for the API and metrics, a session for
the console.

The API takes ``Authorization: Bearer NAME:SECRET`` on every request, checked by
the engine (a bad or missing credential is refused and counted; the server
writes the counts on the engine's chain, :mod:`charter.server.gate`). The
console signs in with the same credential once and then holds a session: an
engine sign-in (:meth:`~charter.Engine.sign_in`, kept in the store, so every
server process knows it), whose ID travels in a cookie (HttpOnly,
SameSite=Strict, Secure off loopback). A fresh ID at every sign-in, the one
held before ended, so a session ID planted before sign-in is never the one
signed in (session fixation). Every form carries the session's CSRF token; the
sign-in form, which comes before any session, carries one bound to a
short-lived sign-in cookie.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

from charter.errors import AuthenticationError
from charter.server.wire import CsrfRefused

if TYPE_CHECKING:
    from charter import Engine, Principal

SESSION_COOKIE = "charter_session"
SIGNIN_COOKIE = "charter_signin"
SESSION_SECONDS = 8 * 3600


def bearer(engine: Engine, header: str | None) -> Principal:
    """The principal an ``Authorization: Bearer NAME:SECRET`` header proves. A
    refusal is not audited here, one by one: the caller counts it and records
    the count (P4, :class:`charter.server.gate.Refusals`)."""
    scheme, _, token = (header or "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    try:
        return engine.authenticate(token, audit=False)
    except AuthenticationError as exc:
        if token:
            raise
        raise AuthenticationError(
            "this endpoint needs a credential: send the header Authorization: Bearer NAME:SECRET",
            **exc.details,
        ) from None


class SignInForms:
    """CSRF tokens for the sign-in form, which comes before any sign-in: each is
    bound to a nonce in a short-lived sign-in cookie by a key every server
    process shares (a form served by one process is posted to another)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def token(self, nonce: str) -> str:
        """The sign-in form's CSRF token for the sign-in cookie ``nonce``."""
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()


def check_csrf(expected: str, given: str | None) -> None:
    """Refuse a form whose CSRF token is missing or not this session's."""
    if not given or not hmac.compare_digest(expected, given):
        raise CsrfRefused(
            "the form's CSRF token is missing or not this session's; reload the page and "
            "submit it again"
        )
