"""The ASGI application: routes for the API, the console, the metrics and the
static files, and the one place errors become HTTP answers.

Engine calls block (the store), so none runs on the event loop; the engine
is shared by all of them (its store serialises what must be serial). Reads
(the API's GETs, the console's pages) run on the process's one reading thread
(:mod:`charter.server.reader`), decisions in a worker thread each. Only the
credential is checked on the loop (a digest, no store), before anything else
and before the body is read (:mod:`charter.server.gate`, P4).
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from charter import CharterError
from charter.errors import StoreError, UsageError
from charter.server import console, metrics, openapi, remote
from charter.server.api import ENDPOINTS, PREFIX, VERSION, Call, Endpoint
from charter.server.auth import SignInForms
from charter.server.gate import MAX_BODY, REFUSAL_SECONDS, Gate, closing, json_body
from charter.server.reader import Reader
from charter.server.wire import error_body, jsonable, status_of

if TYPE_CHECKING:
    from charter import Engine

HERE = Path(__file__).parent
_log = logging.getLogger("charter.server")


def failure(exc: CharterError, request: Request) -> Response:
    """The error as JSON with its status; the connection closes when the body
    was left unread (a stranger's upload, one above the limit). A store's own
    failure is told by its code alone: the database's text (its tables, types
    and values) is for the server's log, never for a client."""
    if type(exc) is StoreError:
        _log.error("the store failed a request to %s: %s", request.url.path, exc.message)
        exc = StoreError("the store could not carry out the request; the server's log says why")
    status = status_of(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="charter"'} if status == 401 else None
    return closing(request, JSONResponse(error_body(exc), status_code=status, headers=headers))


def _body(raw: bytes, ep: Endpoint) -> dict[str, Any]:
    """The JSON object a decision takes; unknown fields are refused, not ignored."""
    if not raw.strip():
        return {}
    body = json_body(raw)
    if not isinstance(body, dict):
        raise UsageError("the request body must be a JSON object")
    unknown = sorted(set(body) - set(ep.body))
    if unknown:
        raise UsageError(
            f"unknown field(s) {', '.join(unknown)}; {ep.name} takes "
            f"{', '.join(ep.body) or 'no body'}"
        )
    return body


def _api_route(engine: Engine, ep: Endpoint, read: Reader, gate: Gate) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            # First, from the headers alone: nothing of the body is read for a stranger.
            who = gate.bearer(request)
            raw = await gate.body(request) if ep.decides else b""

            def work() -> Any:
                call = Call(request.path_params, dict(request.query_params), _body(raw, ep))
                return jsonable(ep.handler(engine, who, call))

            if ep.decides:
                return JSONResponse(await run_in_threadpool(work))
            return closing(request, JSONResponse(await read(work)))
        except CharterError as exc:
            return failure(exc, request)

    return Route(PREFIX + ep.path, endpoint, methods=[ep.method], name=ep.name)


def _bearer_only(gate: Gate, answer: Callable[[], Response]) -> Callable[..., Any]:
    """An endpoint that only needs a valid bearer credential."""

    async def endpoint(request: Request) -> Response:
        try:
            gate.bearer(request)
            return closing(request, await run_in_threadpool(answer))
        except CharterError as exc:
            return failure(exc, request)

    return endpoint


def _index() -> Response:
    """What ``/api/v1`` answers (the address ``charter serve`` prints)."""
    return JSONResponse({"version": VERSION, "openapi": PREFIX + "/openapi.json"})


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if request.url.path.startswith("/api/"):
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        message = f"no {request.method} {request.url.path} in the API; see {PREFIX}/openapi.json"
        answer: Response = JSONResponse(
            {"error": {"code": code, "message": message}}, status_code=status
        )
    else:
        answer = PlainTextResponse(f"{status}: nothing here", status_code=status)
    return closing(request, answer)  # a body sent here is never read


def build(
    engine: Engine,
    *,
    secure_cookies: bool,
    key: bytes,
    max_body: int = MAX_BODY,
    refusal_seconds: float = REFUSAL_SECONDS,
) -> Starlette:
    """The application over ``engine``; ``key`` binds the sign-in form's CSRF
    tokens, the same in every process serving one console. ``max_body`` bounds
    every request body, ``refusal_seconds`` how often refused credentials are
    written in summary (:mod:`charter.server.gate`); the application's
    ``state.gate.refusals.close()`` writes what is counted when it stops."""
    read = Reader()
    gate = Gate(engine, max_body=max_body, refusal_seconds=refusal_seconds)
    metrics_text = functools.partial(metrics.render, engine, gate.refusals)
    endpoints = (*ENDPOINTS, *remote.ENDPOINTS)
    routes: list[BaseRoute] = [_api_route(engine, ep, read, gate) for ep in endpoints]
    routes += [
        Route(PREFIX, _bearer_only(gate, _index), name="index"),
        Route(PREFIX + "/", _bearer_only(gate, _index)),
        Route(
            PREFIX + "/openapi.json",
            _bearer_only(gate, lambda: JSONResponse(openapi.document())),
            name="openapi",
        ),
        Route(
            "/metrics",
            _bearer_only(
                gate,
                lambda: PlainTextResponse(metrics_text(), media_type="text/plain; version=0.0.4"),
            ),
            name="metrics",
        ),
        Route("/", _to_console),
        Route("/console", _to_console),
        Route("/console/", _to_console),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        *console.routes(engine, SignInForms(key), read, gate, secure_cookies=secure_cookies),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _not_found})
    app.state.gate = gate
    return app


async def _to_console(request: Request) -> Response:
    """The console's address (the one ``charter serve`` prints) opens its inbox."""
    return RedirectResponse("/console/inbox", status_code=303)


def settled() -> None:
    """Keep what is loaded by now (modules, templates, the application) out of the
    garbage collector's reach: a full collection would otherwise walk all of it
    while a request waits, a pause of milliseconds at the tail of every page."""
    gc.collect()
    gc.freeze()
