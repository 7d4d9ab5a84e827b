"""Several processes serving one console and API (``charter serve --workers N``).

Python runs one thread of Python at a time, so a server uses more than one core
only as more than one process. Each worker opens its own engine on the store,
and the store serialises what must be serial across them as it does across any
processes; sign-ins are in the store, so any worker serves any session. What
the workers share besides comes from the supervisor as a :class:`Spec`, passed
to each at its start (never through the environment): where the store and the
configuration are, whether cookies are ``Secure``, the key binding the
sign-in forms (a form one worker served may be posted to another), and the
largest request body read.

Connections are kept alive, and a worker holding more of them than another
keeps its clients waiting longer: each worker answers its own in turn. On
Linux each worker listens on a socket of its own on the same port
(``SO_REUSEPORT``), and the kernel deals new connections out at random; one
socket shared by all would let whichever worker wakes first take every
connection waiting (measured here: 31 of 50 on one of two workers, whose
clients then waited half as long again as the other's). Elsewhere the workers
share one socket. Either way the deal can be uneven, so each worker posts how
many connections it holds, and one holding two or more above the least loaded
asks a client to reconnect (``Connection: close`` on an answer, as a server
asks when it restarts): the new connection is dealt again. A worker that
dies is replaced; SIGINT or SIGTERM stops them all.
"""

from __future__ import annotations

import multiprocessing
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from charter import Engine, EngineConfig
from charter.errors import ConfigError
from charter.server.app import build, settled
from charter.server.gate import MAX_BODY

#: Seconds between looks at whether every worker is alive.
WATCH_SECONDS = 0.5
#: Seconds a worker has to finish its requests once told to stop.
STOP_SECONDS = 30
#: Connections a worker may hold above the least loaded one before it asks a
#: client to reconnect, and the seconds between two such requests (the count
#: falls only once the client has gone).
CROWDED = 2
RESPREAD_SECONDS = 0.25


@dataclass(frozen=True)
class Spec:
    """What every worker is started with."""

    store: str | None
    config: str | None
    secure: bool
    key: bytes  # binds the sign-in forms' CSRF tokens, in every worker alike
    max_body: int = MAX_BODY  # the largest request body read, in bytes (P4)


def supervise(
    spec: Spec,
    *,
    host: str,
    port: int,
    workers: int,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Start ``workers`` workers on ``host:port``, replace any that dies once it has
    served, stop them all at SIGINT or SIGTERM; ``announce`` is told the base URL
    once every worker serves (its port the one chosen, for port 0). A worker
    that dies before it serves stops them all:
    :class:`~charter.errors.ConfigError`, its own error printed above."""
    shared = not _spreads()
    try:  # holds the port (and chooses it, for port 0); the one socket when shared
        claim = _listener(host, port, listen=shared)
    except OSError as exc:
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror}") from None
    where = claim.getsockname()[:2]
    context = multiprocessing.get_context("spawn")
    held = context.Array("i", workers, lock=False)  # connections each worker holds

    def start(index: int) -> tuple[BaseProcess, Any]:
        ready = context.Event()
        seat = Seat(held, index)
        process = context.Process(
            target=work, args=(spec, where, claim if shared else None, seat, ready)
        )
        process.start()
        return process, ready

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    running = [start(i) for i in range(workers)]
    pending = announce
    try:
        while not stop.wait(0.05 if pending else WATCH_SECONDS):
            if pending is not None and all(ready.is_set() for _, ready in running):
                pending(f"http://{host}:{where[1]}")
                pending = None
            for i, (process, ready) in enumerate(running):
                if process.is_alive():
                    continue
                if not ready.is_set():
                    raise ConfigError(
                        f"a server worker stopped before serving (exit code "
                        f"{process.exitcode}); its error is printed above"
                    )
                held[i] = 0
                running[i] = start(i)
    finally:
        for process, _ in running:
            process.terminate()
        for process, _ in running:
            process.join(STOP_SECONDS)
        claim.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


def work(
    spec: Spec, where: tuple[str, int], shared: socket.socket | None, seat: Seat, ready: Any
) -> None:
    """A worker: its engine, its application, uvicorn on its socket until stopped;
    ``ready`` is set once it is about to serve."""
    import uvicorn  # noqa: PLC0415 - the extra, checked by the supervisor's caller

    # uvicorn stops at the supervisor's SIGTERM and then raises it again; by default
    # that would end the process at once. As SystemExit the worker unwinds: what it
    # counted is written and its engine closed (also when stopped before serving).
    signal.signal(signal.SIGTERM, _exit)
    sock = shared if shared is not None else _listener(*where, listen=True)
    config = EngineConfig.from_file(spec.config) if spec.config else EngineConfig.discover()
    with Engine.open(spec.store, config=config, create=False) as engine:
        built = build(engine, secure_cookies=spec.secure, key=spec.key, max_body=spec.max_body)
        app = _Spread(built, seat)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        app.connections = server.server_state.connections
        settled()
        ready.set()
        try:
            server.run(sockets=[sock])
        finally:
            built.state.gate.refusals.close()  # what it counted, written before it ends


def _exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@dataclass(frozen=True)
class Seat:
    """A worker's place in the table of connections every worker holds."""

    held: Any  # a shared array of ints, one per worker
    index: int


class _Spread:
    """ASGI middleware posting how many connections this worker holds, and asking
    a client to reconnect while this worker holds :data:`CROWDED` or more above
    the least loaded (see the module docstring)."""

    def __init__(self, app: Any, seat: Seat) -> None:
        self.app, self.seat = app, seat
        self.connections: set[Any] = set()  # the server's own, set once it exists
        self.next_us = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        held, mine = self.seat.held, len(self.connections)
        held[self.seat.index] = mine
        now_us = time.monotonic_ns() // 1000
        if mine - min(held) < CROWDED or now_us < self.next_us:
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        self.next_us = now_us + int(RESPREAD_SECONDS * 1_000_000)

        async def closing(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, closing)  # type: ignore[no-any-return]


def _spreads() -> bool:
    """Whether sockets on one port share its connections out (Linux's SO_REUSEPORT;
    elsewhere the option lets the last socket take them all)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def _listener(host: str, port: int, *, listen: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if _spreads():
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
