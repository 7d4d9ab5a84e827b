"""Telling people when a run needs them (K3): signed webhooks, at least once.

A worker that finds a run it cannot carry on without a person (an UNKNOWN
attempt no lookup settles, an approval or input waited for, an open
incident, an exhausted allowance, a run that cannot resume: a
:class:`~charter.errors.NeedsIntervention`'s ``blockers``) posts a notice; a
deliverer, in a thread of its own, posts it to every configured webhook that
takes its kind::

    notices = Notices(engine)          # the engine's [webhooks], or webhooks=[Webhook(...)]
    notices.start()                    # deliver in a thread of this process
    notices.post(run_id, mission_id, "cannot_resume", blockers, attempts=[attempt_id])
    ...
    notices.stop()                     # before engine.close()

- :meth:`Notices.post` writes the notice and one delivery per webhook that
  takes its kind, in one transaction, and returns the notice's id. It
  returns ``None`` and writes nothing when the run has a notice for this
  reason already (its kind, needs and attempts), so a worker that looks at
  the same stuck run every poll tells people once; a new reason is a new
  notice. ``None`` too when no webhook takes the kind.
- :meth:`Notices.deliver_due` makes one pass in the calling thread and returns
  how many deliveries were answered 2xx; :meth:`Notices.start` runs passes in a
  thread until :meth:`Notices.stop`, woken at once by a post and when the
  soonest pending delivery falls due (a retry's backoff ends).
- :meth:`Notices.notices` and :meth:`Notices.deliveries` read what was
  written and how far each delivery got.

At least once: a delivery is claimed for a while (a lease, in the store's
time) so no other deliverer, in this process or another, sends it meanwhile;
it is marked done only after a 2xx; anything else is due again after an
exponential backoff with jitter, capped, for as long as it takes. A deliverer
that dies between the send and the mark leaves the claim to run out, and the
notice is sent again with the same id, which the endpoint deduplicates on.
Each send is bounded by its webhook's ``timeout_seconds`` (a watchdog closes
the connection), and the worker never waits for a send: a dead endpoint
delays only its own notices.

What is sent is built from what the store recorded and passed through the
process-wide scrubber (:func:`charter.secret.scrub_text`) on the way in and
on the way out, so a secret echoed into a reason is never sent. The body, the
headers and how to verify the signature: ``docs/notices.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import math
import secrets
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from charter.config import NOTICE_KINDS, Webhook
from charter.engine.engine import Engine, runtime_of
from charter.errors import ConfigError, NotFound, SecretUnavailable, UsageError
from charter.hashing import canonical, digest
from charter.ids import check_text
from charter.secret import scrub_text
from charter.storage import Row
from charter.workers import store

#: The shortest HMAC key a webhook may have: a short one is guessed.
SECRET_CHARACTERS = 16
#: A claim outlives its send by this much: the mark's commit, a slow store.
CLAIM_MARGIN_SECONDS = 30.0
#: Headers of every delivery (their values: docs/notices.md).
ID_HEADER = "Charter-Notice-Id"
TIMESTAMP_HEADER = "Charter-Timestamp"
SIGNATURE_HEADER = "Charter-Signature"
_TEXT_BYTES = 4096  # the most of one need's text kept


@dataclass(frozen=True)
class Notice:
    """A run needs a person, as it was written: what for and which attempts."""

    id: str
    run_id: str
    mission_id: str
    kind: str
    needs: tuple[str, ...]
    attempts: tuple[str, ...]
    created_at_us: int


@dataclass(frozen=True)
class Delivery:
    """How far a notice got to one webhook: ``pending`` until a 2xx, then ``delivered``."""

    notice_id: str
    webhook: str
    status: str
    tries: int
    due_at_us: int
    claimed_until_us: int | None
    last_error: str | None
    delivered_at_us: int | None


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value: ``v1=`` and the hex HMAC-SHA256, keyed by
    the webhook's secret, of the timestamp, a dot and the body's bytes."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


class Notices:
    """The outbox of notices and its deliverer (see the module's docstring)."""

    def __init__(
        self,
        engine: Engine,
        webhooks: Iterable[Webhook] | None = None,
        *,
        backoff_seconds: float = 1.0,
        backoff_cap_seconds: float = 600.0,
        poll_seconds: float = 5.0,
    ) -> None:
        """``webhooks`` default to ``engine``'s configuration's. Each secret is read now: a
        webhook whose secret this process cannot reveal, or one shorter than
        :data:`SECRET_CHARACTERS`, is a :class:`~charter.errors.ConfigError`
        and nothing starts. The first retry waits about ``backoff_seconds``,
        each next one about twice as long, up to ``backoff_cap_seconds``; the
        thread sends each when it falls due, and looks again at least every
        ``poll_seconds``."""
        runtime = runtime_of(engine)
        hooks = list(runtime.config.webhooks.values() if webhooks is None else webhooks)
        self._webhooks = _checked(hooks)
        for name, value in (
            ("backoff_seconds", backoff_seconds),
            ("backoff_cap_seconds", backoff_cap_seconds),
            ("poll_seconds", poll_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{name} must be a positive number of seconds")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds")
        if backoff_cap_seconds < backoff_seconds:
            raise ConfigError("backoff_cap_seconds must be at least backoff_seconds")
        self._runtime = runtime
        self._backoff = (backoff_seconds, backoff_cap_seconds)
        self._poll = poll_seconds
        longest = max((w.timeout_seconds for w in self._webhooks.values()), default=0.0)
        self._lease_us = round((longest + CLAIM_MARGIN_SECONDS) * 1_000_000)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last pass that failed as a whole (the store away a moment), if any.
        self.failure: BaseException | None = None

    @property
    def webhooks(self) -> tuple[Webhook, ...]:
        return tuple(self._webhooks.values())

    # -- writing -------------------------------------------------------------------------
    def post(
        self,
        run_id: str,
        mission_id: str,
        kind: str,
        needs: Sequence[str],
        attempts: Sequence[str] = (),
    ) -> str | None:
        """Write a notice that ``run_id`` needs a person (K3): its id, or ``None``
        when nothing new was written (see the module's docstring). ``needs``
        says what for, one line each; ``attempts`` are the run's attempts it
        concerns. A kind not in :data:`~charter.config.NOTICE_KINDS`, empty
        needs, a run of another mission or an attempt of another run is
        refused with a typed error, and nothing is written."""
        if kind not in NOTICE_KINDS:
            raise UsageError(
                f"a notice's kind is one of {list(NOTICE_KINDS)}, not {kind!r}", kind=kind
            )
        lines = _texts("needs", needs)
        if not lines:
            raise UsageError("a notice says what the run needs: give at least one line")
        linked = sorted(set(_texts("attempts", attempts)))
        # Scrubbed before it is stored: a reason may quote what a target echoed.
        lines = [scrub_text(line[:_TEXT_BYTES], []) for line in lines]
        targets = sorted(n for n, w in self._webhooks.items() if w.takes(kind))
        if not targets:
            return None
        reason = digest(canonical([kind, sorted(set(lines)), linked]))
        with self._runtime.db.transaction() as tx:
            run = store.run_of(tx, run_id)
            if run is None:
                raise NotFound(
                    f"no run {run_id!r} in this store to post a notice for", run_id=run_id
                )
            if run["mission_id"] != mission_id:
                raise UsageError(
                    f"run {run_id} belongs to mission {run['mission_id']}, not {mission_id}",
                    run_id=run_id,
                )
            unknown = sorted(set(linked) - store.attempts_of(tx, run_id, linked))
            if unknown:
                raise NotFound(f"no attempts {unknown} in run {run_id}", attempts=unknown)
            notice_id = tx.ids.new("ntc")
            added = store.add(
                tx,
                notice_id,
                run_id=run_id,
                mission_id=mission_id,
                kind=kind,
                reason=reason,
                needs=json.dumps(lines),
                attempts=json.dumps(linked),
                webhooks=targets,
            )
        if not added:
            return None
        self._wake.set()
        return notice_id

    # -- delivering ----------------------------------------------------------------------
    def deliver_due(self, limit: int = 100) -> int:
        """Send up to ``limit`` due deliveries, one by one, in this thread: how
        many were answered 2xx (and marked done)."""
        return self._pass(limit, None)

    def start(self) -> None:
        """Deliver in a thread of this process until :meth:`stop`."""
        if self._thread is not None:
            raise UsageError("the deliverer is running already; stop it first")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="charter-notices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, after the send in hand (bounded by its timeout): a
        delivery it did not mark is sent again later, as after a crash."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._wake.set()
        thread.join()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            wait = self._poll
            try:
                self._pass(100, self._stopping)
                wait = self._until_due()
                self.failure = None
            except Exception as exc:  # the store away a moment: the next pass tries again
                self.failure = exc
            self._wake.wait(wait)
            self._wake.clear()

    def _until_due(self) -> float:
        """Seconds until the soonest pending delivery falls due (a failed one's
        backoff ends, or another deliverer's claim runs out), by the store's
        clock, and at most the poll interval: a retry is sent on its backoff's
        schedule, not at the next poll."""
        with self._runtime.db.read() as tx:
            due = store.next_due(tx, sorted(self._webhooks))
            now: int = tx.now_us
        if due is None:
            return self._poll
        return min(self._poll, max(due - now, 0) / 1_000_000)

    def _pass(self, limit: int, stopping: threading.Event | None) -> int:
        done = 0
        if not self._webhooks:
            return done
        for _ in range(limit):
            if stopping is not None and stopping.is_set():
                break
            token = secrets.token_hex(16)
            with self._runtime.db.transaction() as tx:
                claimed = store.claim(tx, sorted(self._webhooks), token, self._lease_us)
            if claimed is None:
                break
            done += self._deliver(claimed, token)
        return done

    def _deliver(self, claimed: Row, token: str) -> int:
        """Send one claimed delivery and mark how it went."""
        hook = self._webhooks[claimed["webhook"]]
        body = self._body(claimed)
        timestamp = self._runtime.clock.now_us() // 1_000_000
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "charter-notices",
            ID_HEADER: claimed["id"],
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: sign(hook.secret.reveal(), timestamp, body),
        }
        error = _send(hook, headers, body)
        # A crash here has sent and not marked: the claim runs out, the same id is sent again.
        self._runtime.crash("notice.sent")
        with self._runtime.db.transaction() as tx:
            if error is None:
                store.delivered(tx, claimed["id"], hook.name)
                return 1
            wait_us = self._wait_us(claimed["tries"])
            store.failed(tx, claimed["id"], hook.name, token, wait_us=wait_us, error=error)
            return 0

    def _wait_us(self, tries: int) -> int:
        """Exponential backoff with jitter, capped: after try ``n``, between half
        and all of ``base * 2**(n-1)`` (never shorter than the wait before)."""
        base, cap = self._backoff
        ceiling = min(cap, base * 2.0 ** min(tries - 1, 64))
        return round((ceiling / 2 + self._runtime.random() * ceiling / 2) * 1_000_000)

    def _body(self, row: Row) -> bytes:
        """The JSON an endpoint receives, from the stored notice, scrubbed again:
        this process may know secrets the posting one did not."""
        created = datetime.fromtimestamp(row["created_at_us"] / 1_000_000, UTC)
        attempts = json.loads(row["attempts"])
        payload: dict[str, Any] = {
            "id": row["id"],
            "created_at": created.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "kind": row["kind"],
            "run_id": row["run_id"],
            "mission_id": row["mission_id"],
            "needs": [scrub_text(line, []) for line in json.loads(row["needs"])],
            "links": {
                "run": row["run_id"],
                "attempts": attempts,
                "console": f"/console/runs/{row['run_id']}",
            },
        }
        return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()

    # -- reading -------------------------------------------------------------------------
    def notices(self, run_id: str) -> list[Notice]:
        """The notices written for ``run_id``, oldest first."""
        with self._runtime.db.read() as tx:
            rows = store.notices(tx, run_id)
        return [
            Notice(
                r["id"],
                r["run_id"],
                r["mission_id"],
                r["kind"],
                tuple(json.loads(r["needs"])),
                tuple(json.loads(r["attempts"])),
                r["created_at_us"],
            )
            for r in rows
        ]

    def pending(self) -> int:
        """How many deliveries to this deliverer's webhooks wait for a 2xx."""
        with self._runtime.db.read() as tx:
            return store.pending(tx, sorted(self._webhooks))

    def deliveries(self, notice_id: str) -> list[Delivery]:
        """Where ``notice_id`` goes and how far it got, by webhook."""
        with self._runtime.db.read() as tx:
            rows = store.deliveries(tx, notice_id)
        return [Delivery(**r) for r in rows]


def _checked(hooks: list[Webhook]) -> dict[str, Webhook]:
    """The webhooks by name, each able to sign here; a ConfigError otherwise."""
    found: dict[str, Webhook] = {}
    for hook in hooks:
        if not isinstance(hook, Webhook):
            raise ConfigError(f"webhooks must be charter.config.Webhook values, not {hook!r}")
        if hook.name in found:
            raise ConfigError(f"two webhooks are named {hook.name!r}; names are unique")
        try:
            key = hook.secret.reveal()
        except SecretUnavailable:
            raise ConfigError(
                f"webhook {hook.name!r}: its secret {hook.secret.name!r} is not available in "
                "this process; set that environment variable where notices are delivered",
                webhook=hook.name,
            ) from None
        if len(key) < SECRET_CHARACTERS:
            raise ConfigError(
                f"webhook {hook.name!r}: its secret has {len(key)} characters; an HMAC key "
                f"needs at least {SECRET_CHARACTERS} (make one with `openssl rand -hex 32`)",
                webhook=hook.name,
            )
        found[hook.name] = hook
    return found


def _texts(field: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise UsageError(f"{field} is a list of strings", field=field)
    for value in values:
        check_text(field, value)
    return list(values)


def _send(hook: Webhook, headers: dict[str, str], body: bytes) -> str | None:
    """POST ``body`` to the webhook within its timeout: ``None`` for a 2xx,
    else what went wrong, without the address (it may hold a token)."""
    url = urlsplit(hook.url)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = kind(url.hostname or "", url.port, timeout=hook.timeout_seconds)
    # Socket timeouts bound each wait, not the whole: a trickling answer could
    # outlast the claim. The watchdog ends the connection when the time is up.
    late = threading.Event()
    watchdog = threading.Timer(hook.timeout_seconds, _cut, (conn, late))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", path, body, headers)
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        if late.is_set():
            return f"no answer within {hook.timeout_seconds:g} s"
        return f"no answer: {type(exc).__name__}"
    finally:
        watchdog.cancel()
        conn.close()
    return None if 200 <= status < 300 else f"answered HTTP {status}"


def _cut(conn: http.client.HTTPConnection, late: threading.Event) -> None:
    late.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # closed meanwhile
            sock.shutdown(socket.SHUT_RDWR)
