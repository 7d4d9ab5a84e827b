"""The payments sandbox's HTTP face: a small JSON API of the kind payment services offer.

``POST /v1/payments`` creates a payment. It needs an ``Idempotency-Key``
header: the same key with the same body answers the first payment again
(``Idempotent-Replayed: true``) and applies nothing; the same key with another
body is refused (422). An ``X-Fencing-Token: <run_id>:<epoch>`` header is
checked per run: a token older than one the sandbox has seen for that run is
refused before anything is applied (409). ``GET /v1/payments/by-key/<key>``
looks a payment up by its key; when there is none it *closes* the key, so a
create still on its way is refused and the answer "not applied" stays true.
``GET /v1/payments?reference=<ref>`` lists payments by client reference.

Refusals the sandbox documents as made before applying anything: 409 (a stale
fencing token, a closed key) and 429 (a refusal armed as a fault). Everything
else it answers follows the usual meaning.

Misbehaviours are armed through ``POST /_sandbox/faults`` (or
:meth:`Sandbox.fault` in-process), each for the next ``times`` requests of its
kind: ``drop_after_apply`` (apply, then close the connection without a
response), ``slow`` (apply, then answer after ``seconds``), ``refuse`` (429,
applying nothing), ``error_after_apply`` (apply, then answer 500) and
``lookups_unavailable`` (lookups answer 503).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from charter.sandbox.store import Ledger, Payment, Refusal, body_hash

#: The misbehaviours a test or the demo can arm, and which requests they hit.
FAULTS = {
    "drop_after_apply": "create",
    "slow": "create",
    "refuse": "create",
    "error_after_apply": "create",
    "lookups_unavailable": "lookup",
}


@dataclass
class _Armed:
    fault: str
    times: int
    seconds: float
    reference: str | None


class SandboxError(ValueError):
    """A sandbox set-up or fault request that makes no sense."""


class Sandbox:
    """A payments service on loopback, with its state in a SQLite file of its own.

    Use it in-process (``with Sandbox(path) as box: box.url``) or from the
    command line (``charter sandbox``). ``api_key``, when set, must come as
    ``Authorization: Bearer <api_key>`` (else 401).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        blocked_payees: tuple[str, ...] = ("blocked",),
        on_apply: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise SandboxError(f"the sandbox listens on loopback only, not {host!r}")
        self.ledger = Ledger(path)
        self.api_key = api_key
        self.blocked_payees = frozenset(blocked_payees)
        #: Called with each new payment once it is applied, before it is answered.
        self.on_apply = on_apply
        self._faults: list[_Armed] = []
        self._faults_lock = threading.Lock()
        self._server = _Server((host, port), _Handler)
        self._server.box = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Sandbox:
        """Serve in a background thread (for tests and the demo)."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (for ``charter sandbox``)."""
        self._server.serve_forever(POLL_SECONDS)

    def stop(self) -> None:
        self._server.stopped = True
        self._server.shutdown()
        self._server.server_close()
        self.ledger.close()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fault(
        self, name: str, *, times: int = 1, seconds: float = 0.0, reference: str | None = None
    ) -> None:
        """Arm a misbehaviour for the next ``times`` requests it applies to (only
        creates with this client ``reference``, if given)."""
        if name not in FAULTS:
            raise SandboxError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise SandboxError(f"times must be a positive whole number, got {times!r}")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
            raise SandboxError(f"seconds must be a non-negative number, got {seconds!r}")
        if reference is not None and not isinstance(reference, str):
            raise SandboxError(f"reference must be a string, got {reference!r}")
        with self._faults_lock:
            self._faults.append(_Armed(name, times, float(seconds), reference))

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def _take(self, kind: str, reference: str | None = None) -> _Armed | None:
        """The armed fault for this request, if any, spending one use of it."""
        with self._faults_lock:
            for armed in self._faults:
                if FAULTS[armed.fault] == kind and armed.reference in (None, reference):
                    armed.times -= 1
                    if armed.times == 0:
                        self._faults.remove(armed)
                    return armed
        return None

    def payments(self) -> list[dict[str, Any]]:
        """Every payment applied, oldest first: the ground truth."""
        return [
            p.to_dict() | {"run_id": p.run_id, "epoch": p.epoch} for p in self.ledger.payments()
        ]

    def requests(self) -> list[dict[str, Any]]:
        """Every request received and what the sandbox did with it."""
        return self.ledger.requests()


#: How often the serving loop looks for a stop: ``stop`` waits for its next look
#: (the standard library's half second made every test that stops a server wait).
POLL_SECONDS = 0.02


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    box: Sandbox
    stopped = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request still being handled when the sandbox stopped finds its
        records closed: it goes unanswered, as it would by a server that went
        away, and says nothing. Any other error is printed as usual."""
        if not self.stopped:
            super().handle_error(request, client_address)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class _Reply(Exception):
    """An answer decided part way through handling a request."""

    def __init__(self, status: int, body: Any, verdict: str) -> None:
        super().__init__(verdict)
        self.status, self.body, self.verdict = status, body, verdict


def _error(status: int, code: str, message: str, verdict: str) -> _Reply:
    return _Reply(status, {"error": {"code": code, "message": message}}, verdict)


class _Handler(BaseHTTPRequestHandler):
    """One request to the sandbox; the sandbox itself is the server's ``box``."""

    server: _Server
    received: str  # when the request's first line was read (parse_request)
    protocol_version = "HTTP/1.1"
    server_version = "charter-payments-sandbox/1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the sandbox's record is its request log, not stderr."""

    def parse_request(self) -> bool:
        """The request's arrival, dated as soon as its first line was read: a
        request may then wait for another's transaction before it is decided."""
        self.received = _now()
        return super().parse_request()

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        with self._answering("create" if path == "/v1/payments" else "control") as reply:
            if path == "/v1/payments":
                self._create(reply)
            elif path == "/_sandbox/faults":
                self._arm()
            else:
                raise _error(404, "not_found", f"no such endpoint {path}", "not_found")

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        prefix = "/v1/payments/by-key/"
        with self._answering("lookup" if parts.path.startswith(prefix) else "list") as facts:
            self._authorize()
            if parts.path.startswith(prefix):
                facts["key"] = unquote(parts.path[len(prefix) :])  # logged as the lookup's
                self._lookup(facts["key"])
            elif parts.path == "/v1/payments":
                refs = parse_qs(parts.query).get("reference")
                found = (
                    self.server.box.ledger.by_reference(refs[0])
                    if refs
                    else self.server.box.ledger.payments()
                )
                raise _Reply(200, {"data": [p.to_dict() for p in found]}, "listed")
            raise _error(404, "not_found", f"no such endpoint {parts.path}", "not_found")

    @contextmanager
    def _answering(self, kind: str) -> Iterator[dict[str, Any]]:
        """Run a handler; whatever reply it raises is logged and written."""
        facts: dict[str, Any] = {"key": self.headers.get("Idempotency-Key")}
        try:
            yield facts
        except _Reply as reply:
            token = self.headers.get("X-Fencing-Token")
            self.server.box.ledger.log(
                kind,
                facts["key"],
                token,
                verdict=reply.verdict,
                status=reply.status,
                now=_now(),
                received=self.received,
            )
            if reply.verdict != "applied_response_dropped":
                self._write(reply.status, reply.body, facts.get("replayed", False))

    def _write(self, status: int, body: Any, replayed: bool) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a slow answer past its timeout)
            self.close_connection = True

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise _error(400, "invalid_json", "the body is not JSON", "invalid") from None
        if not isinstance(body, dict):
            raise _error(400, "invalid_body", "the body must be a JSON object", "invalid")
        return body

    def _authorize(self) -> None:
        if self.server.box.api_key is not None and self.headers.get("Authorization") != (
            f"Bearer {self.server.box.api_key}"
        ):
            raise _error(401, "unauthorized", "a valid API key is required", "unauthorized")

    def _create(self, facts: dict[str, Any]) -> None:
        body = self._body()
        self._authorize()
        key = facts["key"]
        if not key:
            raise _error(400, "missing_key", "an Idempotency-Key header is required", "invalid")
        _check_payment(body)
        if body["payee"] in self.server.box.blocked_payees:
            raise _error(403, "payee_blocked", "payments to this payee are blocked", "forbidden")
        fault = self.server.box._take("create", body.get("reference"))
        if fault is not None and fault.fault == "refuse":
            raise _error(429, "rate_limited", "too many requests; nothing applied", "refused")
        try:
            payment, replayed = self.server.box.ledger.create(
                key=key,
                body_hash=body_hash(body),
                body=body,
                fence=_fence(self.headers.get("X-Fencing-Token")),
                now=_now(),
            )
        except Refusal as refusal:
            raise _error(refusal.status, refusal.code, refusal.message, refusal.code) from None
        facts["replayed"] = replayed
        if not replayed and self.server.box.on_apply is not None:
            self.server.box.on_apply(payment.to_dict())
        self._misbehave(fault, payment)
        raise _Reply(
            200 if replayed else 201, payment.to_dict(), "replayed" if replayed else "applied"
        )

    def _misbehave(self, fault: _Armed | None, payment: Payment) -> None:
        """After applying: lose the answer, delay it, or answer an error."""
        if fault is None:
            return
        if fault.fault == "drop_after_apply":
            self.close_connection = True
            raise _Reply(0, None, "applied_response_dropped")
        if fault.fault == "error_after_apply":
            raise _error(500, "internal_error", "something went wrong", "applied_then_500")
        if fault.fault == "slow":
            time.sleep(fault.seconds)

    def _lookup(self, key: str) -> None:
        fault = self.server.box._take("lookup")
        if fault is not None:
            raise _error(503, "unavailable", "lookups are unavailable", "lookup_unavailable")
        payment = self.server.box.ledger.lookup(key, _now())
        if payment is None:
            raise _error(404, "no_such_payment", "no payment with this key", "absent")
        raise _Reply(200, payment.to_dict(), "found")

    def _arm(self) -> None:
        body = self._body()
        try:
            self.server.box.fault(
                str(body.get("fault")),
                times=body.get("times", 1),
                seconds=body.get("seconds", 0.0),
                reference=body.get("reference"),
            )
        except SandboxError as exc:
            raise _error(400, "invalid_fault", str(exc), "invalid") from None
        raise _Reply(200, {"armed": body.get("fault")}, "armed")


def _check_payment(body: dict[str, Any]) -> None:
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount < 2**53:
        raise _error(400, "invalid_amount", "amount must be a positive whole number", "invalid")
    for name in ("currency", "payee"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise _error(400, f"invalid_{name}", f"{name} must be a non-empty string", "invalid")
    if not isinstance(body.get("reference", ""), str):
        raise _error(400, "invalid_reference", "reference must be a string", "invalid")


def _fence(token: str | None) -> tuple[str, int] | None:
    if token is None:
        return None
    run_id, sep, epoch = token.rpartition(":")
    if not sep or not run_id or not epoch.isdigit():
        raise _error(400, "invalid_fencing_token", "X-Fencing-Token is <run_id>:<epoch>", "invalid")
    return run_id, int(epoch)
