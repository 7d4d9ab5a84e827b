"""Sign-ins for people at a desk: the console's sessions, kept in the store.

Mixed into :class:`~charter.engine.engine.Engine`. A sign-in is checked against
the store on every use, so several server processes over one store share them,
and ending one (signing out, or a new sign-in replacing it) ends it for all.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from charter.contracts import store
from charter.contracts.authority import Authority
from charter.contracts.model import SignIn
from charter.contracts.principals import Principal
from charter.errors import UsageError
from charter.hashing import ENGINE_CHAIN
from charter.storage import Database

MAX_SIGN_IN_SECONDS = 7 * 24 * 3600


class SignIns:
    """Open, check and end sign-ins (see the module docstring)."""

    _db: Database
    _authority: Authority
    authenticate: Callable[[str], Principal]  # the engine's: a refusal is audited there

    def record_refusals(self, summary: Mapping[str, Any]) -> None:
        """Record refused credentials a server counted instead of auditing each
        (``authenticate(..., audit=False)``): one ``auth.refused`` event on the
        engine's chain, ``summary`` as its payload (how many, from where, claiming
        whom). A stranger's requests then cost the store's writer one write per
        summary, not one each (P4)."""
        with self._db.transaction() as tx:
            tx.audit(ENGINE_CHAIN, "auth.refused", "anonymous", actor="?", payload=dict(summary))

    def sign_in(self, credential: str, *, seconds: float, replacing: str | None = None) -> SignIn:
        """Check ``credential`` (a refusal is audited and stores nothing) and open a
        sign-in lasting ``seconds`` by the store's clock, with a new ID and CSRF
        token. ``replacing``, the ID the caller held before, is ended: whatever a
        browser held before signing in is never the ID it holds after (session
        fixation). Ended sign-ins are forgotten here."""
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= MAX_SIGN_IN_SECONDS
        ):
            raise UsageError(
                f"a sign-in lasts more than 0 and at most {MAX_SIGN_IN_SECONDS} seconds; "
                f"got {seconds!r}"
            )
        principal = self.authenticate(credential)
        sign_in_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._db.transaction() as tx:
            store.purge_sign_ins(tx)
            if replacing:
                store.end_sign_in(tx, replacing)
            expires_us = tx.now_us + int(seconds * 1_000_000)
            store.insert_sign_in(tx, sign_in_id, principal.name, csrf, expires_us)
        return SignIn(sign_in_id, principal, csrf, expires_us)

    def signed_in(self, sign_in_id: str | None) -> SignIn | None:
        """The live sign-in with this ID; ``None`` for one never issued, ended,
        expired, or whose principal has no credential configured any more."""
        if not sign_in_id:
            return None
        with self._db.read() as tx:
            row = store.live_sign_in(tx, sign_in_id)
        if row is None:
            return None
        principal = self._authority.authenticator.holder(row["principal"])
        if principal is None:
            return None
        return SignIn(sign_in_id, principal, row["csrf"], row["expires_us"])

    def sign_out(self, sign_in_id: str) -> bool:
        """End a sign-in; whether there was one to end."""
        with self._db.transaction() as tx:
            return store.end_sign_in(tx, sign_in_id) > 0
