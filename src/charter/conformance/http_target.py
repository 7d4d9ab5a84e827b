"""A scripted JSON API on loopback for :func:`charter.conformance.check_adapter`.

It applies ``POST /v1/things`` (each ``Idempotency-Key`` at most once, as a
keyed API does; a POST without a key is applied every time, as an API
without keys does) and answers lookups at ``GET /v1/things?key=<key>`` as a
list (``{"data": [thing]}``), the shape that tempts an adapter to read any
200 as success. Armed with a case, its next request misbehaves as the case
says: it applies then drops the connection, applies then answers 500,
refuses with 422 before applying, applies then holds its answer until the
adapter gives up, echoes the credential back, or answers 50 MB; a lookup
answers empty, list-shaped, malformed, someone else's effect, several
candidates or 503, resets the connection, holds its answer until the adapter
gives up, or finds nobody listening (the connection is refused until the
next case is armed). Every request needs ``Authorization: Bearer <secret>``.

A held answer waits for the adapter to hang up, so the adapter's own timeout
decides how long it takes; ``stall`` (30 seconds by default) is the most it
waits, after which it answers: an adapter that waits longer has no timeout
worth the name, and the case fails. ``huge`` (50 MB by default) is the size of
the huge answer: anything far past the kit's bound on what is stored plays the
same case, and a transport whose cost grows faster than the answer may want
less (an MCP stdio upstream: docs/gateway.md).

:meth:`ScriptedHttp.declaration` declares the built-in HTTP adapter for it.
Only the standard library is used: the kit runs wherever Charter does.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from charter.adapters import EffectClass
from charter.adapters.http import HttpDeclaration, HttpOperation
from charter.sandbox.server import POLL_SECONDS
from charter.secret import Secret

#: The huge answer's size by default.
HUGE_BYTES = 50 * 1024 * 1024


class _Server(ThreadingHTTPServer):
    """Serves each request on a thread of its own; its port can be held by a
    socket that does not listen (refusing connections) and then listened on
    again, so the address never changes hands."""

    allow_reuse_port = hasattr(socket, "SO_REUSEPORT")
    daemon_threads = True


class ScriptedHttp:
    """The target; use as a context manager (``with ScriptedHttp() as target``)."""

    def __init__(
        self,
        *,
        secret: str = "sk-conformance-0123456789abcdef",
        stall: float = 30.0,
        huge: int = HUGE_BYTES,
    ) -> None:
        self._secret = secret
        self.stall = stall
        self.huge = huge
        self.armed: str | None = None
        self.things: dict[str, dict[str, Any]] = {}
        self.created = 0
        self.applies: Counter[str] = Counter()
        self.receipts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.target = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self._refusing = False

    @property
    def secret(self) -> str:
        return self._secret

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ScriptedHttp:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def arm(self, case: str) -> bool:
        self._listen_again()
        with self.lock:
            self.armed = case
        if case == "lookup_refused":
            return self._stop_listening()
        return True

    def take(self) -> str | None:
        with self.lock:
            case, self.armed = self.armed, None
        return case

    def applied(self, key: str) -> int:
        return self.applies[key]

    def received(self, key: str) -> int:
        return self.receipts[key]

    def apply(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        """The thing ``key`` names, made now if the key is new (or absent)."""
        with self.lock:
            thing = self.things.get(key) if key else None
            if thing is None:
                self.created += 1
                self.applies[key] += 1
                thing = {"id": f"thing-{self.created}", "key": key, **body}
                if key:
                    self.things[key] = thing
        return thing

    def _stop_listening(self) -> bool:
        """Refuse connections: the port stays held by a socket that does not listen."""
        if not _Server.allow_reuse_port:
            return False  # this platform cannot hold the port meanwhile: not played
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(self._server.server_address[:2])
        self._server.shutdown()
        self._thread.join()
        self._server.socket.close()
        self._server.socket = holder
        self._refusing = True
        return True

    def _listen_again(self) -> None:
        if not self._refusing:
            return
        self._server.socket.listen(self._server.request_queue_size)
        self._refusing = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self._thread.start()

    def declaration(self, *, name: str = "things", timeout_seconds: float = 0.5) -> HttpDeclaration:
        """The built-in HTTP adapter declared for this target: a keyed create and
        a lookup that answers a list (``lookup_found="data"``)."""
        create = HttpOperation(
            "POST",
            "/v1/things",
            EffectClass.IDEMPOTENT_KEYED,
            dedupe_window_seconds=86_400,
            estimate={"usd_cents": "amount"},
            cost={"usd_cents": "amount"},
            lookup="/v1/things?key={idempotency_key}",
            lookup_found="data",
            lookup_match={"key": "{idempotency_key}"},
        )
        return HttpDeclaration(
            name,
            self.url,
            {"create": create},
            headers={"Authorization": Secret(f"Bearer {self.secret}", name=f"{name}-auth")},
            timeout_seconds=timeout_seconds,
        )


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a conformance run is read in its report."""

    @property
    def target(self) -> ScriptedHttp:
        return self.server.target  # type: ignore[attr-defined, no-any-return]

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.target.secret}":
            return True
        self._json(401, {"error": "bad credentials"})
        return False

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorized():
            return
        key = self.headers.get("Idempotency-Key") or ""
        target = self.target
        with target.lock:
            target.receipts[key] += 1
        case = target.take()
        if case == "refused_before_applying":
            self._json(422, {"error": "amount rejected before anything was done"})
            return
        self._answer(case, target.apply(key, body))

    def _answer(self, case: str | None, thing: dict[str, Any]) -> None:
        secret = self.target.secret
        if case == "applied_then_lost":
            self.close_connection = True
            return
        if case == "timeout":
            self._stall()
        if case == "error_after_applying":
            self._json(500, {"error": "internal error"})
        elif case == "echo_in_header":
            self._json(201, thing, headers={"X-Echo-Authorization": f"Bearer {secret}"})
        elif case == "echo_in_body":
            self._json(201, {**thing, "seen_authorization": f"Bearer {secret}"})
        elif case == "echo_in_exception":
            self._json(500, {"error": f"upstream refused credential Bearer {secret}"})
        elif case == "echo_in_bytes":
            self._raw(201, b"created with " + secret.encode() + b"\xff\xfe", "text/plain")
        elif case == "huge_answer":
            blob = "x" * self.target.huge
            self._raw(201, json.dumps({**thing, "blob": blob}).encode(), "application/json")
        else:
            self._json(201, thing)

    def do_GET(self) -> None:
        if not self._authorized():
            return
        parts = urlsplit(self.path)
        key = (parse_qs(parts.query).get("key") or [""])[0]
        case = self.target.take()
        thing = self.target.things.get(key)
        if case == "lookup_reset":
            self._reset()
            return
        if case == "lookup_timeout":
            self._stall()
        if case == "lookup_empty":
            self._raw(200, b"", "application/json")
        elif case == "lookup_list":
            self._json(200, {"data": []})
        elif case == "lookup_malformed":
            self._raw(200, b"<html>maintenance</html>", "text/html")
        elif case == "lookup_down":
            self._json(503, {"error": "lookups are unavailable"})
        elif case in ("lookup_other", "lookup_several"):
            # Other clients' effects, shaped like this one: only the key tells them apart.
            count = 1 if case == "lookup_other" else 2
            others = [_elsewhere(thing or {}, n) for n in range(1, count + 1)]
            self._json(200, {"data": others})
        else:
            self._json(200, {"data": [thing] if thing is not None else []})

    def _stall(self) -> None:
        """Hold the answer until the adapter hangs up (its timeout), at most ``stall`` s."""
        select.select([self.connection], [], [], self.target.stall)

    def _reset(self) -> None:
        """Drop the connection with a reset, the request read and nothing answered."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(body).encode(), "application/json", headers)

    def _raw(
        self, status: int, data: bytes, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the adapter gave up waiting (the timeout case)


def _elsewhere(thing: dict[str, Any], n: int) -> dict[str, Any]:
    """Another client's effect, made with another key: everything else as ``thing``."""
    return {**thing, "id": f"thing-elsewhere-{n}", "key": f"key-of-another-client-{n}"}
