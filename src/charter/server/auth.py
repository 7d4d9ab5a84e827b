"""Who is asking (P1): a bearer credential for the API and metrics, a session for
the console.

The API takes ``Authorization: Bearer NAME:SECRET`` on every request, checked by
the engine (a bad or missing credential is refused and audited on the engine's
chain). The console signs in with the same credential once and then holds a
session: a random ID in a cookie (HttpOnly, SameSite=Strict, Secure off
loopback) that the server issued itself, a fresh one at every sign-in, so a
session ID planted before sign-in is never the one signed in (session
fixation). Every form carries the session's CSRF token; the sign-in form, which
comes before any session, carries one bound to a short-lived sign-in cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from charter import AuthenticationError
from charter.server.wire import CsrfRefused

if TYPE_CHECKING:
    from charter import Engine, Principal

SESSION_COOKIE = "charter_session"
SIGNIN_COOKIE = "charter_signin"
SESSION_SECONDS = 8 * 3600


def bearer(engine: Engine, header: str | None) -> Principal:
    """The principal an ``Authorization: Bearer NAME:SECRET`` header proves."""
    scheme, _, token = (header or "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    try:
        return engine.authenticate(token)
    except AuthenticationError as exc:
        if token:
            raise
        raise AuthenticationError(
            "this endpoint needs a credential: send the header Authorization: Bearer NAME:SECRET",
            **exc.details,
        ) from None


@dataclass
class Session:
    id: str
    principal: Principal
    csrf: str
    expires: float  # time.monotonic()
    notes: list[str] = field(default_factory=list)  # shown once on the next page


class Sessions:
    """The console's sessions, in this process's memory: a restart signs everyone out."""

    def __init__(self, seconds: float = SESSION_SECONDS) -> None:
        self._seconds = seconds
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._key = secrets.token_bytes(32)  # binds sign-in CSRF tokens to their cookie

    def open(self, principal: Principal, replacing: str | None = None) -> Session:
        """A new session with a new ID and CSRF token; ``replacing`` is closed."""
        session = Session(
            secrets.token_urlsafe(32),
            principal,
            secrets.token_urlsafe(32),
            time.monotonic() + self._seconds,
        )
        with self._lock:
            if replacing is not None:
                self._by_id.pop(replacing, None)
            self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._by_id.get(session_id)
            if session is not None and session.expires < time.monotonic():
                del self._by_id[session_id]
                return None
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._by_id.pop(session_id or "", None)

    def signin_token(self, nonce: str) -> str:
        """The sign-in form's CSRF token for the sign-in cookie ``nonce``."""
        return hmac.new(self._key, nonce.encode(), hashlib.sha256).hexdigest()


def check_csrf(expected: str, given: str | None) -> None:
    """Refuse a form whose CSRF token is missing or not this session's."""
    if not given or not hmac.compare_digest(expected, given):
        raise CsrfRefused(
            "the form's CSRF token is missing or not this session's; reload the page and "
            "submit it again"
        )
