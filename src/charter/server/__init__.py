"""The operator's desk: a versioned JSON API, a web console and Prometheus metrics
served over one engine (``charter serve``, extra ``charter[server]``).

A client of the public face like the command line: every request is
authenticated as a principal (P1), every decision goes through the engine,
which authorises it against the mission's current contract and audits it
(refusals included). Starlette, uvicorn and Jinja2 are loaded only here, on
first use; without them :class:`~charter.errors.MissingExtra` names the extra.
"""

from __future__ import annotations

import contextlib
import importlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from charter.errors import ConfigError, MissingExtra

if TYPE_CHECKING:
    from charter import Engine

#: Hosts that are this machine: cookies go without ``Secure`` only here.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _require() -> None:
    for module in ("starlette", "uvicorn", "jinja2"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(
                f"the server needs {module}: pip install 'charter[server]'", extra="server"
            ) from None


def create_app(
    engine: Engine,
    *,
    secure_cookies: bool = False,
    key: bytes | None = None,
    max_body: int | None = None,
    refusal_seconds: float | None = None,
) -> Any:
    """The ASGI application over ``engine``: the API under ``/api/v1``, the console
    under ``/console``, ``/metrics``. ``secure_cookies`` marks the session cookie
    ``Secure`` (needed whenever the console is reached over anything but loopback).
    ``key`` binds the sign-in form's CSRF tokens: processes serving one console
    behind one address must share it (default: a new one, for a process alone).
    Sign-ins themselves live in the store, so any process serves any of them.

    Unauthenticated traffic is bounded (P4): ``max_body`` is the largest request
    body read, in bytes (default 1 MiB; above it ``413 body_too_large``), and
    refused credentials are written as one summary per ``refusal_seconds``
    (default 10). ``app.state.gate.refusals.close()`` writes what is still
    counted when the application stops (:func:`serve` does)."""
    _require()
    from charter.server.app import build  # noqa: PLC0415 - the extra, loaded on first use
    from charter.server.gate import MAX_BODY, REFUSAL_SECONDS  # noqa: PLC0415 - the extra

    return build(
        engine,
        secure_cookies=secure_cookies,
        key=key or secrets.token_bytes(32),
        max_body=MAX_BODY if max_body is None else max_body,
        refusal_seconds=REFUSAL_SECONDS if refusal_seconds is None else refusal_seconds,
    )


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    max_body: int | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve ``engine`` until interrupted; off loopback the cookies are ``Secure``.
    ``announce`` is called with the base URL once the port is bound, so port 0
    (any free port, chosen by the system) tells its caller where it serves: a
    port chosen beforehand and bound later can be taken by another process in
    between. A port that cannot be bound is a :class:`~charter.errors.ConfigError`."""
    app = create_app(engine, secure_cookies=host not in LOOPBACK, max_body=max_body)
    import uvicorn  # noqa: PLC0415 - the extra, checked by create_app

    from charter.server.app import settled  # noqa: PLC0415 - the extra, loaded on first use

    settled()
    server = announcing(uvicorn.Config(app, host=host, port=port, log_level="warning"), announce)
    try:
        with bound(server):
            server.run()
    finally:
        app.state.gate.refusals.close()


def announcing(config: Any, announce: Callable[[str], None] | None) -> Any:
    """A uvicorn server for ``config`` (a ``uvicorn.Config``) that calls
    ``announce`` with its base URL once its port is bound: the port the system
    chose, for port 0. Binding then telling is what leaves no window in which
    another process could take a port chosen beforehand."""
    import uvicorn  # noqa: PLC0415 - the extra, checked by the caller

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and announce is not None:
                port = self.servers[0].sockets[0].getsockname()[1]
                announce(f"http://{config.host}:{port}")

    return Announcing(config)


@contextlib.contextmanager
def bound(server: Any) -> Iterator[None]:
    """Around a uvicorn ``server``'s run: if it never started (its port could
    not be bound; uvicorn prints why and exits), a
    :class:`~charter.errors.ConfigError` instead of the exit."""
    try:
        yield
    except SystemExit:
        if server.started:
            raise
    if not server.started:
        where = f"{server.config.host}:{server.config.port}"
        raise ConfigError(f"cannot serve on {where}: its error is printed above")


@contextlib.contextmanager
def serving(engine: Engine, *, start_seconds: float = 10.0, **options: Any) -> Iterator[str]:
    """Serve ``engine`` on loopback from a thread of this process for the ``with``
    block, on a port the system picks; its base URL (``options`` go to
    :func:`create_app`). For tests, benchmarks and programs that embed the desk;
    ``charter serve`` is the way to run it. uvicorn binds the port itself: a
    socket handed to it would lose ``TCP_NODELAY``, and every answer on a
    kept-alive connection would wait 40 ms."""
    app = create_app(engine, **options)
    import uvicorn  # noqa: PLC0415 - the extra, checked by create_app

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    said: list[str] = []
    server = announcing(config, said.append)
    thread = threading.Thread(target=server.run, name="charter-serving", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_seconds
    while not said:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield said[0]
    finally:
        server.should_exit = True
        thread.join(start_seconds)
        app.state.gate.refusals.close()


def serve_workers(
    store: str | None,
    config: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    workers: int = 2,
    max_body: int | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve the store at ``store`` (``None``: the configuration's) from ``workers``
    processes on one port, each with its own engine opened with the configuration
    file ``config`` (``None``: found as the command line finds it), until
    interrupted. Sign-ins are in the store, so any worker serves any session; how
    the workers share the port and what else they share:
    :mod:`charter.server.workers`. ``announce`` as for :func:`serve`."""
    _require()
    from charter.server.gate import MAX_BODY  # noqa: PLC0415 - with the extra
    from charter.server.workers import Spec, supervise  # noqa: PLC0415 - with the extra

    spec = Spec(
        store,
        config,
        secure=host not in LOOPBACK,
        key=secrets.token_bytes(32),
        max_body=MAX_BODY if max_body is None else max_body,
    )
    supervise(spec, host=host, port=port, workers=workers, announce=announce)
