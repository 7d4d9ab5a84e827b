"""A scripted JSON API on loopback for :func:`charter.conformance.check_adapter`.

It applies ``POST /v1/things`` (each ``Idempotency-Key`` at most once, as a
keyed API does) and answers lookups at ``GET /v1/things?key=<key>`` as a list
(``{"data": [thing]}``), the shape that tempts an adapter to read any 200 as
success. Armed with a case, its next request misbehaves as the case says:
it applies then drops the connection, applies then answers 500, refuses with
422 before applying, applies then stalls past the adapter's timeout, echoes
the credential back, answers 50 MB, or answers a lookup empty, list-shaped,
malformed or down. Every request needs ``Authorization: Bearer <secret>``.

:meth:`ScriptedHttp.declaration` declares the built-in HTTP adapter for it.
Only the standard library is used: the kit runs wherever Charter does.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from charter.adapters import EffectClass
from charter.adapters.http import HttpDeclaration, HttpOperation
from charter.secret import Secret

_HUGE_BYTES = 50 * 1024 * 1024


class ScriptedHttp:
    """The target; use as a context manager (``with ScriptedHttp() as target``)."""

    def __init__(self, *, secret: str = "sk-conformance-0123456789abcdef", stall: float = 1.5):
        self._secret = secret
        self.stall = stall
        self.armed: str | None = None
        self.things: dict[str, dict[str, Any]] = {}
        self.applies: Counter[str] = Counter()
        self.receipts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.target = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

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
        with self.lock:
            self.armed = case
        return True

    def take(self) -> str | None:
        with self.lock:
            case, self.armed = self.armed, None
        return case

    def applied(self, key: str) -> int:
        return self.applies[key]

    def received(self, key: str) -> int:
        return self.receipts[key]

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
        target.receipts[key] += 1
        case = target.take()
        if case == "refused_before_applying":
            self._json(422, {"error": "amount rejected before anything was done"})
            return
        with target.lock:
            if key not in target.things:
                target.applies[key] += 1
                target.things[key] = {"id": f"thing-{len(target.things) + 1}", "key": key, **body}
            thing = target.things[key]
        self._answer(case, thing)

    def _answer(self, case: str | None, thing: dict[str, Any]) -> None:
        secret = self.target.secret
        if case == "applied_then_lost":
            self.close_connection = True
            return
        if case == "timeout":
            time.sleep(self.target.stall)
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
            blob = "x" * _HUGE_BYTES
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
        if case == "lookup_empty":
            self._raw(200, b"", "application/json")
        elif case == "lookup_list":
            self._json(200, {"data": []})
        elif case == "lookup_malformed":
            self._raw(200, b"<html>maintenance</html>", "text/html")
        elif case == "lookup_down":
            self._json(503, {"error": "lookups are unavailable"})
        else:
            self._json(200, {"data": [thing] if thing is not None else []})

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
