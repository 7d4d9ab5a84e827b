"""The last check before a send's bytes go out (F3), at the socket.

An adapter checks the send deadline right before handing its request to its
HTTP client, but between that check and the first byte on the wire the client
still takes a connection from its pool (or opens one) and writes the headers.
A process paused in that window (a stalled VM, a SIGSTOP) would send after its
deadline, when another owner may have taken the run over: only a target that
checks the fencing token would stop it. So the HTTP adapter's default
transport checks the deadline again at the first write of the send being made
in this thread to its sockets (:func:`sending`): the window left is one system
call, not the connection's acquisition.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from charter.adapters.protocol import Dispatch
from charter.errors import NotApplied


class Sending:
    """The send being written: whether any of its bytes went out yet, and the
    refusal if its deadline had passed before the first (then none did)."""

    __slots__ = ("refused", "send", "started")

    def __init__(self, send: Dispatch) -> None:
        self.send = send
        self.started = False
        self.refused: NotApplied | None = None


#: The send this thread (or task) is writing, if any.
_SENDING: contextvars.ContextVar[Sending | None] = contextvars.ContextVar(
    "charter_sending", default=None
)


@contextlib.contextmanager
def sending(send: Dispatch) -> Iterator[Sending]:
    """Inside it, the first write to a socket of :func:`transport` (or of
    :func:`async_transport`, from a task this one starts) checks ``send``'s
    deadline first (:meth:`Dispatch.check_deadline`)."""
    current = Sending(send)
    token = _SENDING.set(current)
    try:
        yield current
    finally:
        _SENDING.reset(token)


#: The send whose request the task is writing, where a transport checks one
#: request of a send only (:func:`async_transport`).
_WRITING: contextvars.ContextVar[Sending | None] = contextvars.ContextVar(
    "charter_writing", default=None
)


def _check(current: Sending | None) -> None:
    """Before a send's first byte only: once part of the request went out, the
    target may act on it, and a refusal then would claim a non-application
    nobody can prove (A3). The rest is written; what it did is its answer's."""
    if current is not None and not current.started:
        try:
            current.send.check_deadline()
        except NotApplied as refused:
            current.refused = refused
            raise
        current.started = True


def _backend(httpcore: Any) -> Any:
    """httpcore's own network backend, each connection's stream checking the
    current send's deadline before its first write (:func:`_check`)."""

    class Stream(httpcore.NetworkStream):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data: bytes = self._stream.read(max_bytes, timeout)
            return data

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            _check(_SENDING.get())
            self._stream.write(buffer, timeout)

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(self._stream.start_tls(*args, **kwargs))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):  # type: ignore[misc]
        def __init__(self) -> None:
            self._backend = httpcore.SyncBackend()

        def connect_tcp(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(self._backend.connect_tcp(*args, **kwargs))

        def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(self._backend.connect_unix_socket(*args, **kwargs))

        def sleep(self, seconds: float) -> None:
            self._backend.sleep(seconds)

    return Backend()


def _mapped(httpx: Any, exc: Exception) -> Exception:
    """httpcore's error as httpx's of the same name (httpx's own transport does
    the same): the adapter tells "no connection, nothing sent" by these."""
    for kind in type(exc).__mro__:
        found = getattr(httpx, kind.__name__, None)
        if isinstance(found, type) and issubclass(found, httpx.HTTPError):
            return found(str(exc))  # type: ignore[no-any-return]
    return exc


def _request(httpcore: Any, request: Any) -> Any:
    """An httpx request as httpcore takes it."""
    url = request.url
    return httpcore.Request(
        method=request.method,
        url=httpcore.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
        ),
        headers=request.headers.raw,
        content=request.stream,
        extensions=request.extensions,
    )


#: httpx's default limits, and no retries: every send is one the engine knows of (A5).
_POOL: dict[str, Any] = {
    "max_connections": 100,
    "max_keepalive_connections": 20,
    "keepalive_expiry": 5.0,
    "retries": 0,
}

#: httpcore's errors that httpx's own transport maps to its own (by name).
_ERRORS = ("TimeoutException", "NetworkError", "ProtocolError", "ProxyError", "UnsupportedProtocol")


def transport(httpx: Any) -> Any:
    """An httpx transport with no retries, httpx's default limits and httpcore's
    default TLS, whose sockets check the deadline of the send being made (see
    the module's docstring)."""
    import httpcore  # noqa: PLC0415 - httpx's own dependency, in the same extra

    pool = httpcore.ConnectionPool(**_POOL, network_backend=_backend(httpcore))
    errors = tuple(getattr(httpcore, name) for name in _ERRORS)

    class Body(httpx.SyncByteStream):  # type: ignore[misc]
        """A response's body as httpx reads it, httpcore's errors mapped."""

        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def __iter__(self) -> Iterator[bytes]:
            try:
                yield from self._stream
            except Exception as exc:
                raise _mapped(httpx, exc) from exc

        def close(self) -> None:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()

    class Transport(httpx.BaseTransport):  # type: ignore[misc]
        def handle_request(self, request: Any) -> Any:
            try:
                answer = pool.handle_request(_request(httpcore, request))
            except errors as exc:
                raise _mapped(httpx, exc) from exc
            return httpx.Response(
                status_code=answer.status,
                headers=answer.headers,
                stream=Body(answer.stream),
                extensions=answer.extensions,
            )

        def close(self) -> None:
            pool.close()

    return Transport()


def _async_backend(httpcore: Any) -> Any:
    """:func:`_backend` for asyncio: each stream checks, before its first write,
    the send whose request its task is writing (:data:`_WRITING`)."""

    class Stream(httpcore.AsyncNetworkStream):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            data: bytes = await self._stream.read(max_bytes, timeout)
            return data

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            _check(_WRITING.get())
            await self._stream.write(buffer, timeout)

        async def aclose(self) -> None:
            await self._stream.aclose()

        async def start_tls(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(await self._stream.start_tls(*args, **kwargs))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class Backend(httpcore.AsyncNetworkBackend):  # type: ignore[misc]
        def __init__(self) -> None:
            self._backend = httpcore.AnyIOBackend()

        async def connect_tcp(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(await self._backend.connect_tcp(*args, **kwargs))

        async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Stream:
            return Stream(await self._backend.connect_unix_socket(*args, **kwargs))

        async def sleep(self, seconds: float) -> None:
            await self._backend.sleep(seconds)

    return Backend()


def async_transport(httpx: Any, httpcore: Any, carries: Callable[[Any, Dispatch], bool]) -> Any:
    """:func:`transport` for an async client (``httpx`` and its ``httpcore``,
    the modules: the MCP SDK has its own pair), for a client that sends a
    send's request from a task of its own, started inside :func:`sending`
    (the context travels with it). Only the request for which ``carries(request,
    send)`` holds is checked (a client may send others meanwhile), before its
    first byte. A refused request is answered ``503`` with nothing sent, not
    raised: such a client carries on with its other requests, and the
    adapter learns of the refusal from :attr:`Sending.refused`."""
    pool = httpcore.AsyncConnectionPool(**_POOL, network_backend=_async_backend(httpcore))
    errors = tuple(getattr(httpcore, name) for name in _ERRORS)

    class Body(httpx.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for part in self._stream:
                    yield part
            except Exception as exc:
                raise _mapped(httpx, exc) from exc

        async def aclose(self) -> None:
            close = getattr(self._stream, "aclose", None)
            if close is not None:
                await close()

    class Transport(httpx.AsyncBaseTransport):  # type: ignore[misc]
        async def handle_async_request(self, request: Any) -> Any:
            current = _SENDING.get()
            token = _WRITING.set(
                current if current is not None and carries(request, current.send) else None
            )
            try:
                answer = await pool.handle_async_request(_request(httpcore, request))
            except NotApplied as refused:  # before its first byte: nothing of it went out
                return httpx.Response(503, text=str(refused), request=request)
            except errors as exc:
                raise _mapped(httpx, exc) from exc
            finally:
                _WRITING.reset(token)
            return httpx.Response(
                status_code=answer.status,
                headers=answer.headers,
                stream=Body(answer.stream),
                extensions=answer.extensions,
            )

        async def aclose(self) -> None:
            await pool.aclose()

    return Transport()
