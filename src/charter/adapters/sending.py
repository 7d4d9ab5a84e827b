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
from collections.abc import Iterator
from typing import Any

from charter.adapters.protocol import Dispatch


class _Sending:
    """The send being written, and whether any of its bytes went out yet."""

    __slots__ = ("send", "started")

    def __init__(self, send: Dispatch) -> None:
        self.send = send
        self.started = False


#: The send this thread (or task) is writing, if any.
_SENDING: contextvars.ContextVar[_Sending | None] = contextvars.ContextVar(
    "charter_sending", default=None
)


@contextlib.contextmanager
def sending(send: Dispatch) -> Iterator[None]:
    """Inside it, the first write to a socket of :func:`transport` checks
    ``send``'s deadline first (:meth:`Dispatch.check_deadline`)."""
    token = _SENDING.set(_Sending(send))
    try:
        yield
    finally:
        _SENDING.reset(token)


def _check() -> None:
    """Before a send's first byte only: once part of the request went out, the
    target may act on it, and a refusal then would claim a non-application
    nobody can prove (A3). The rest is written; what it did is its answer's."""
    current = _SENDING.get()
    if current is not None and not current.started:
        current.send.check_deadline()
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
            _check()
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


def transport(httpx: Any) -> Any:
    """An httpx transport with no retries, httpx's default limits and httpcore's
    default TLS, whose sockets check the deadline of the send being made (see
    the module's docstring)."""
    import httpcore  # noqa: PLC0415 - httpx's own dependency, in the same extra

    pool = httpcore.ConnectionPool(
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        retries=0,
        network_backend=_backend(httpcore),
    )
    # httpcore's errors, each of which httpx's own transport maps to its own.
    errors = (
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.ProxyError,
        httpcore.UnsupportedProtocol,
    )

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
            url = request.url
            sent = httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            try:
                answer = pool.handle_request(sent)
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
