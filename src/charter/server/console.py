"""The web console: server-rendered pages for people deciding what the engine
cannot decide alone.

Pages are Jinja2 templates; each page's live part re-renders itself every few
seconds through htmx (vendored in ``static/``, with its licence), so a page
follows the work without a reload. Forms post plainly (POST, then a redirect
back) with the session's CSRF token; each form is one API endpoint's handler
(:mod:`charter.server.api`), so the console decides nothing the API would not,
and the engine authorises and audits every decision. A refusal is shown on the
page it came from, with the engine's error code.
"""

from __future__ import annotations

import base64
import functools
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from charter import CharterError, show_amounts
from charter.errors import AuthenticationError, UsageError
from charter.server import pages, search, story
from charter.server.api import ENDPOINTS, Call
from charter.server.auth import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    SIGNIN_COOKIE,
    SignInForms,
    check_csrf,
)
from charter.server.gate import Gate, closing
from charter.server.reader import Reader
from charter.server.wire import BodyTooLarge, CsrfRefused, status_of, whole

if TYPE_CHECKING:
    from charter import Engine, SignIn, Unit

HERE = Path(__file__).parent
BY_NAME = {ep.name: ep for ep in ENDPOINTS}
Loader = Callable[["Engine", Mapping[str, str], Mapping[str, str]], dict[str, Any]]
Endpoint = Callable[[Request], Awaitable[Response]]
NOTES_COOKIE = "charter_notes"
NOTES_KEPT = 5  # decisions' outcomes a browser keeps to show on its next page
NOTE_CHARS = 400


_DICT_NAMES = frozenset(dir(dict))


class _Pages(Environment):
    """Jinja2 for the console's pages. A record is a dict: ``r.id`` reads its key
    directly rather than first failing to find an attribute of that name (an
    exception per cell was a tenth of a page's cost); a dict's own methods
    (``m.items()``) still win over its keys, as in Jinja2."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute in obj and attribute not in _DICT_NAMES:
            return obj[attribute]
        return super().getattr(obj, attribute)


def _environment() -> Environment:
    env = _Pages(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,  # the templates are the package's: no stat of each per page
    )
    env.filters["when"] = pages.when
    env.filters["amounts"] = show_amounts  # m.amounts(amounts, units) in macros.html
    env.filters["run_rows"] = pages.run_rows
    env.filters["timeline_rows"] = pages.timeline_rows
    env.filters["pretty"] = pages.pretty
    env.filters["folded"] = story.folded
    env.filters["took"] = story.took
    env.filters["json"] = lambda v: json.dumps(v, sort_keys=True, default=str)
    # Compiled now, not by the first requests: they would wait for it, each
    # worker's first visitors would, and so would everyone queued behind them.
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)
    return env


def _body(
    form: Mapping[str, str], name: str, units: Callable[[], Mapping[str, Unit]]
) -> dict[str, Any]:
    """The API body a console form stands for: its fields, costs gathered from
    ``cost.UNIT`` fields into one mapping of amounts. A cost is whole steps
    (``1250``), or, with a point, the unit as its contract describes it
    (``12.50`` USD, exactly 1250 cents; ``units`` is read only then)."""
    fields = set(BY_NAME[name].body)
    body: dict[str, Any] = {k: v for k, v in form.items() if k in fields and v}
    costs: dict[str, int] = {}
    for key, text in form.items():
        if not key.startswith("cost.") or not text:
            continue
        unit = key[5:]
        described = units().get(unit) if "." in text else None
        costs[unit] = whole(text, key) if described is None else described.parse(text)
    if "cost" in fields and costs:
        body["cost"] = costs
    return body


def _units(engine: Engine, path: Mapping[str, str]) -> Mapping[str, Unit]:
    """How the units of the attempt a form settles are shown (its contract's)."""
    attempt_id = path.get("attempt_id")
    if attempt_id is None:
        return {}
    return engine.contract(engine.get_attempt(attempt_id).mission_id).units


def _here(request: Request) -> str:
    """The page's own path and query as the browser sent them, still
    percent-encoded (an encoded ``?`` in a path stays part of the path). Read
    from the request line, not from a URL object built for it, which was a
    twentieth of a page's cost; a server that does not pass the request line
    on gets the URL object."""
    raw: bytes | None = request.scope.get("raw_path")
    if not raw:
        return request.url.path + ("?" + request.url.query if request.url.query else "")
    query: bytes = request.scope.get("query_string", b"")
    return (raw + (b"?" + query if query else b"")).decode("latin-1")


def _local(target: str | None) -> str:
    """Where to go back to: a console path on this server, never elsewhere."""
    if target and target.startswith("/console/") and not target.startswith("//"):
        return target
    return "/console/inbox"


class Console:
    def __init__(
        self, engine: Engine, forms: SignInForms, read: Reader, gate: Gate, *, secure: bool
    ) -> None:
        self.engine = engine
        self.forms = forms
        self.gate = gate  # the credential check and the body limit, shared with the API
        self.read = read  # the process's reading thread, shared with the API
        self.secure = secure
        self.env = _environment()

    def _render(self, template: str, status: int = 200, /, **data: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(**data)
        return HTMLResponse(html, status_code=status)

    def _cookie(self, response: Response, name: str, value: str, path: str, age: int) -> None:
        response.set_cookie(
            name,
            value,
            max_age=age,
            path=path,
            httponly=True,
            samesite="strict",
            secure=self.secure,
        )

    def _held(self, request: Request) -> SignIn | None:
        """The request's sign-in, read from the store (blocking: call it in a thread)."""
        return self.engine.signed_in(request.cookies.get(SESSION_COOKIE))

    # -- sign-in ------------------------------------------------------------------------
    async def login_form(self, request: Request, error: str = "", status: int = 200) -> Response:
        nonce = secrets.token_urlsafe(24)
        response = self._render(
            "login.html",
            status,
            csrf=self.forms.token(nonce),
            next=_local(request.query_params.get("next")),
            error=error,
            me=None,
        )
        self._cookie(response, SIGNIN_COOKIE, nonce, "/console/login", 600)
        return response

    async def _form(self, request: Request) -> dict[str, str]:
        """The posted form, read no further than the server's body limit."""
        return dict(parse_qsl((await self.gate.body(request)).decode(errors="replace")))

    async def login(self, request: Request) -> Response:
        nonce = request.cookies.get(SIGNIN_COOKIE, "")
        try:
            form = await self._form(request)
            check_csrf(self.forms.token(nonce) if nonce else "", form.get("csrf"))
            # Refused here, counted with the API's refusals (P4); sign_in checks again.
            self.gate.credential(request, form.get("credential", ""))
            # A new sign-in ID every time; whatever ID the browser held is ended.
            held = await run_in_threadpool(
                functools.partial(
                    self.engine.sign_in,
                    form.get("credential", ""),
                    seconds=SESSION_SECONDS,
                    replacing=request.cookies.get(SESSION_COOKIE),
                )
            )
        except (AuthenticationError, CsrfRefused, BodyTooLarge) as exc:
            answer = await self.login_form(request, f"{exc.code}: {exc.message}", status_of(exc))
            return closing(request, answer)
        response = RedirectResponse(_local(form.get("next")), status_code=303)
        self._cookie(response, SESSION_COOKIE, held.id, "/", SESSION_SECONDS)
        response.delete_cookie(SIGNIN_COOKIE, path="/console/login")
        return response

    async def logout(self, request: Request) -> Response:
        held = await run_in_threadpool(self._held, request)  # first: no body for a stranger
        if held is not None:
            try:
                form = await self._form(request)
                check_csrf(held.csrf, form.get("csrf"))
            except (CsrfRefused, BodyTooLarge) as exc:
                return closing(request, self._refused(exc))
            await run_in_threadpool(self.engine.sign_out, held.id)
        response = closing(request, RedirectResponse("/console/login", status_code=303))
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def _refused(self, exc: CharterError) -> HTMLResponse:
        return self._render(
            "refused.html", status_of(exc), code=exc.code, message=exc.message, me=None
        )

    # -- pages and forms -----------------------------------------------------------------
    def page(self, loader: Loader, template: str, section: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            # A live refresh (htmx) leaves the notes for the next whole page.
            live = request.headers.get("hx-request") == "true"
            notes = [] if live else _notes(request)

            def work() -> Response:
                # The reading thread signs in, reads and renders: the event loop
                # only moves bytes. The sign-in and the page's reads are one
                # moment of the store, read in one transaction.
                try:
                    with self.engine.reading():
                        held = self._held(request)
                        if held is None:
                            where = quote(_here(request))
                            return RedirectResponse(f"/console/login?next={where}", status_code=303)
                        data = loader(self.engine, request.path_params, request.query_params)
                except CharterError as exc:
                    return self._refused(exc)
                return self._render(
                    template,
                    section=section,
                    me=held.principal.name,
                    csrf=held.csrf,
                    notes=notes,
                    here=_here(request),
                    **data,
                )

            response = closing(request, await self.read(work))  # a body sent here is not read
            if notes and response.status_code == 200:
                response.delete_cookie(NOTES_COOKIE, path="/console")
            return response

        return endpoint

    def form(self, name: str, **fixed: str) -> Endpoint:
        """POST a console form as API endpoint ``name``; back to the page it came from."""
        ep = BY_NAME[name]

        async def endpoint(request: Request) -> Response:
            # The session first, from its cookie: a stranger's body is never read.
            held = await run_in_threadpool(self._held, request)
            if held is None:
                refused = AuthenticationError("sign in first: /console/login")
                return closing(request, self._refused(refused))
            try:
                form = await self._form(request)
            except BodyTooLarge as exc:
                return closing(request, self._refused(exc))

            def work() -> Response | str:
                try:
                    check_csrf(held.csrf, form.get("csrf"))
                except CsrfRefused as exc:
                    return self._refused(exc)
                units = functools.partial(_units, self.engine, request.path_params)
                try:
                    call = Call(request.path_params, {}, {**_body(form, name, units), **fixed})
                    result = ep.handler(self.engine, held.principal, call)
                except CharterError as exc:
                    return f"refused ({exc.code}): {exc.message}"
                return f"{ep.summary}: {_outcome(result)}"

            outcome = await run_in_threadpool(work)
            if isinstance(outcome, Response):
                return outcome
            response = RedirectResponse(_local(form.get("back")), status_code=303)
            notes = [*_notes(request), outcome][-NOTES_KEPT:]
            self._cookie(response, NOTES_COOKIE, _packed(notes), "/console", 600)
            return response

        return endpoint

    async def reconcile_all(self, request: Request) -> Response:
        """Reconcile all, confirmed: each attempt the confirmation listed (its
        ``attempt`` fields) is reconciled as its own decision, through the API's
        ``reconcile`` (authorised and audited one by one, as one button does),
        and the page lists each outcome, or its refusal with the engine's code."""
        held = await run_in_threadpool(self._held, request)  # a stranger's body is never read
        if held is None:
            refused = AuthenticationError("sign in first: /console/login")
            return closing(request, self._refused(refused))
        try:
            pairs = parse_qsl((await self.gate.body(request)).decode(errors="replace"))
        except BodyTooLarge as exc:
            return closing(request, self._refused(exc))
        chosen = list(dict.fromkeys(v for k, v in pairs if k == "attempt" and v))

        def work() -> Response:
            try:
                check_csrf(held.csrf, dict(pairs).get("csrf"))
                if not 0 < len(chosen) <= pages.QUEUE_ROWS:
                    raise UsageError(
                        f"reconcile all takes 1 to {pages.QUEUE_ROWS} attempts, got "
                        f"{len(chosen)}: confirm from /console/queue/reconcile-all"
                    )
            except CharterError as exc:
                return self._refused(exc)
            done = []
            for attempt_id in chosen:
                call = Call({"attempt_id": attempt_id}, {}, {})
                try:
                    result = BY_NAME["reconcile"].handler(self.engine, held.principal, call)
                except CharterError as exc:
                    done.append({"attempt_id": attempt_id, "refused": f"{exc.code}: {exc.message}"})
                    continue
                done.append({**result, "refused": ""})
            return self._render(
                "reconcile_all.html",
                section="queue",
                me=held.principal.name,
                csrf=held.csrf,
                notes=[],
                here="/console/queue",
                items=[],
                done=done,
            )

        return await run_in_threadpool(work)


def _notes(request: Request) -> list[str]:
    """The outcomes of this browser's last decisions, shown once on its next page.
    They travel in a cookie of their own (any server process may show them); a
    malformed one shows nothing, and the page escapes what it shows."""
    packed = request.cookies.get(NOTES_COOKIE)
    if not packed:
        return []
    try:
        notes = json.loads(base64.urlsafe_b64decode(packed.encode()))
    except ValueError:
        return []
    if not isinstance(notes, list):
        return []
    return [str(n) for n in notes[-NOTES_KEPT:]]


def _packed(notes: list[str]) -> str:
    """Notes as a cookie value, each cut short enough that a few fit in one cookie."""
    short = [n if len(n) <= NOTE_CHARS else n[: NOTE_CHARS - 1] + "…" for n in notes]
    return base64.urlsafe_b64encode(json.dumps(short).encode()).decode()


def _outcome(result: Any) -> str:
    if isinstance(result, Mapping):
        for key in ("verdict", "status"):
            if key in result:
                return str(result[key])
    return "done"


def routes(
    engine: Engine, forms: SignInForms, read: Reader, gate: Gate, *, secure_cookies: bool
) -> list[Route]:
    c = Console(engine, forms, read, gate, secure=secure_cookies)
    post = ["POST"]
    return [
        Route("/console/login", c.login_form, methods=["GET"]),
        Route("/console/login", c.login, methods=post),
        Route("/console/logout", c.logout, methods=post),
        Route("/console/inbox", c.page(pages.inbox, "inbox.html", "inbox")),
        Route("/console/queue", c.page(pages.queue, "queue.html", "queue")),
        Route(
            "/console/queue/reconcile-all",
            c.page(pages.reconcile_all, "reconcile_all.html", "queue"),
        ),
        Route("/console/queue/reconcile-all", c.reconcile_all, methods=post),
        Route("/console/runs", c.page(pages.runs, "runs.html", "runs")),
        Route("/console/runs/{run_id}", c.page(pages.run, "run.html", "runs")),
        Route("/console/ledger", c.page(pages.ledger, "ledger.html", "ledger")),
        Route("/console/audit", c.page(pages.audit, "audit.html", "audit")),
        Route("/console/search", c.page(search.search, "search.html", "search")),
        Route("/console/approvals/{approval_id}/approve", c.form("approve"), methods=post),
        Route("/console/approvals/{approval_id}/deny", c.form("deny"), methods=post),
        Route("/console/attempts/{attempt_id}/reconcile", c.form("reconcile"), methods=post),
        Route("/console/attempts/{attempt_id}/confirm", c.form("confirm"), methods=post),
        Route("/console/attempts/{attempt_id}/resolve", c.form("resolve"), methods=post),
        Route(
            "/console/attempts/{attempt_id}/write-off",
            c.form("resolve", outcome="written_off"),
            methods=post,
        ),
        Route("/console/runs/{run_id}/resume", c.form("resume"), methods=post),
        Route("/console/runs/{run_id}/stop", c.form("stop"), methods=post),
        Route("/console/incidents/{incident_id}/close", c.form("close_incident"), methods=post),
    ]
