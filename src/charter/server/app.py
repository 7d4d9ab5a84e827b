"""The ASGI application: routes for the API, the console, the metrics and the
static files, and the one place errors become HTTP answers.

Engine calls block (the store), so none runs on the event loop; the engine
is shared by all of them (its store serialises what must be serial). Reads
(the API's GETs, the console's pages) run on the process's one reading thread
(:mod:`charter.server.reader`), decisions in a worker thread each.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from charter import CharterError, UsageError
from charter.server import console, metrics, openapi
from charter.server.api import ENDPOINTS, PREFIX, Call, Endpoint
from charter.server.auth import SignInForms, bearer
from charter.server.reader import Reader
from charter.server.wire import error_body, jsonable, status_of

if TYPE_CHECKING:
    from charter import Engine

HERE = Path(__file__).parent


def failure(exc: CharterError) -> JSONResponse:
    status = status_of(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="charter"'} if status == 401 else None
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


def _body(raw: bytes, ep: Endpoint) -> dict[str, Any]:
    """The JSON object a decision takes; unknown fields are refused, not ignored."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise UsageError("the request body must be JSON") from None
    if not isinstance(body, dict):
        raise UsageError("the request body must be a JSON object")
    unknown = sorted(set(body) - set(ep.body))
    if unknown:
        raise UsageError(
            f"unknown field(s) {', '.join(unknown)}; {ep.name} takes "
            f"{', '.join(ep.body) or 'no body'}"
        )
    return body


def _api_route(engine: Engine, ep: Endpoint, read: Reader) -> Route:
    async def endpoint(request: Request) -> Response:
        raw = await request.body() if ep.decides else b""
        header = request.headers.get("authorization")

        def work() -> Any:
            who = bearer(engine, header)  # first: nothing is read for a stranger
            call = Call(request.path_params, dict(request.query_params), _body(raw, ep))
            return jsonable(ep.handler(engine, who, call))

        try:
            if ep.decides:
                return JSONResponse(await run_in_threadpool(work))
            return JSONResponse(await read(work))
        except CharterError as exc:
            return failure(exc)

    return Route(PREFIX + ep.path, endpoint, methods=[ep.method], name=ep.name)


def _bearer_only(engine: Engine, answer: Any) -> Any:
    """An endpoint that only needs a valid bearer credential."""

    async def endpoint(request: Request) -> Response:
        header = request.headers.get("authorization")

        def work() -> Response:
            bearer(engine, header)
            return answer()  # type: ignore[no-any-return]

        try:
            return await run_in_threadpool(work)
        except CharterError as exc:
            return failure(exc)

    return endpoint


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if request.url.path.startswith("/api/"):
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        message = f"no {request.method} {request.url.path} in the API; see {PREFIX}/openapi.json"
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
    return PlainTextResponse(f"{status}: nothing here", status_code=status)


def build(engine: Engine, *, secure_cookies: bool, key: bytes) -> Starlette:
    """The application over ``engine``; ``key`` binds the sign-in form's CSRF
    tokens, the same in every process serving one console."""
    read = Reader()
    routes: list[BaseRoute] = [_api_route(engine, ep, read) for ep in ENDPOINTS]
    routes += [
        Route(
            PREFIX + "/openapi.json",
            _bearer_only(engine, lambda: JSONResponse(openapi.document())),
            name="openapi",
        ),
        Route(
            "/metrics",
            _bearer_only(
                engine,
                lambda: PlainTextResponse(
                    metrics.render(engine), media_type="text/plain; version=0.0.4"
                ),
            ),
            name="metrics",
        ),
        Route("/", lambda request: RedirectResponse("/console/inbox", status_code=303)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        *console.routes(engine, SignInForms(key), read, secure_cookies=secure_cookies),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _not_found})


def settled() -> None:
    """Keep what is loaded by now (modules, templates, the application) out of the
    garbage collector's reach: a full collection would otherwise walk all of it
    while a request waits, a pause of milliseconds at the tail of every page."""
    gc.collect()
    gc.freeze()
