"""What a request must show before the server spends anything on it (P4).

The credential comes first. It is checked from the request's headers alone
(a digest and a comparison, on the event loop), before a byte of the body is
read, so a stranger's upload costs the server its headers and nothing more:
the answer goes out at once with ``Connection: close``, and the rest of the
upload goes with the connection.

Then the body, read through :func:`body` and never past a limit: a declared
length above it is refused without reading anything, a body without one
(chunked) is cut off at the limit. Either is ``413 body_too_large``. What is
read is parsed by :func:`json_body`, which refuses what the API never takes
(not JSON, nested deeper than :data:`MAX_DEPTH`, text no store can keep) as
``400 malformed_body``.

A refused credential is not written down one by one: every refusal would be
a synced write competing with the workers for the store's writer, at the
pace of whoever sends them. :class:`Refusals` counts them in memory (how
many, from which addresses, claiming which principals) and writes what it
counted as one ``auth.refused`` event on the engine's chain, at most one per
:data:`REFUSAL_SECONDS` and process, on a thread of its own (no request waits
for it). The first refusal after a quiet spell is written at once; the count
of refusals not yet written is in ``/metrics``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from charter import CharterError
from charter.errors import AuthenticationError, ConfigError
from charter.server.auth import bearer
from charter.server.wire import BodyTooLarge, MalformedBody

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from charter import Engine, Principal

#: The largest request body read, in bytes, unless the server is told otherwise.
MAX_BODY = 1 << 20
#: The deepest nesting of arrays and objects a JSON body may have (the API's
#: deepest body, ``resolve``'s ``cost``, has two levels).
MAX_DEPTH = 16
#: Seconds between two summaries of refused credentials, at most one each.
REFUSAL_SECONDS = 10.0
#: Addresses (and claimed principals) a summary names; the rest are counted together.
REFUSAL_KEYS = 256
OTHERS = "(others)"


def too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the request body is larger than this server takes ({limit} bytes); send a "
        "smaller one (the limit is set where the server is started)",
        limit=limit,
    )


async def body(request: Request, limit: int) -> bytes:
    """The request's body, read up to ``limit`` bytes and no further: a declared
    length above it is refused before anything is read, a body without one is
    refused as soon as what came passes it."""
    declared = request.headers.get("content-length", "")
    # Past 18 digits it is too large whatever it says: no huge number is parsed.
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    request.state.body_read = True
    return b"".join(chunks)


def unread(request: Request) -> bool:
    """Whether the request sent (or announced) a body that was not read whole."""
    announced = request.headers.get("content-length", "0") not in ("", "0")
    announced = announced or "transfer-encoding" in request.headers
    return announced and not getattr(request.state, "body_read", False)


def closing(request: Request, response: Response) -> Response:
    """``response``, closing the connection when the request's body was left
    unread: the rest of it is never read, the connection is dropped instead."""
    if unread(request):
        response.headers["connection"] = "close"
    return response


def json_body(raw: bytes) -> Any:
    """``raw`` as JSON, or :class:`MalformedBody`: not UTF-8 JSON, a bare NaN or
    Infinity, nesting past :data:`MAX_DEPTH`, a lone surrogate in any string."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # UnicodeDecodeError included
        raise MalformedBody(
            "the request body must be a JSON document in UTF-8; nothing was done"
        ) from None
    _check(value)
    return value


def _no_constant(name: str) -> Any:
    raise MalformedBody(f"the request body holds {name}, which is not JSON; nothing was done")


def _too_deep() -> MalformedBody:
    return MalformedBody(
        f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels; no "
        "request needs that, nothing was done",
        max_depth=MAX_DEPTH,
    )


def _check(value: Any) -> None:
    """Walk ``value`` (without recursion) for depth and for strings that are not
    Unicode text (a lone surrogate): no store keeps them, no answer can carry them."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _text(item)
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            if isinstance(item, dict):
                for key in item:
                    _text(key)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)


def _text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MalformedBody(
            f"the request body holds a lone surrogate (U+{ord(text[exc.start]):04X}) in a "
            "string: it is not Unicode text, so nothing can keep it; nothing was done",
            position=exc.start,
        ) from None


@dataclass
class _Tally:
    """Refusals counted and not yet written."""

    count: int = 0
    sources: Counter[str] = field(default_factory=Counter)
    principals: Counter[str] = field(default_factory=Counter)
    since: float = 0.0  # monotonic time of the first

    def add(self, source: str, claimed: str, times: int = 1) -> None:
        if not self.count:
            self.since = time.monotonic()
        self.count += times
        _bump(self.sources, source, times)
        _bump(self.principals, claimed, times)

    def merge(self, other: _Tally) -> None:
        self.since = min(self.since, other.since) if self.count else other.since
        self.count += other.count
        for key, n in other.sources.items():
            _bump(self.sources, key, n)
        for key, n in other.principals.items():
            _bump(self.principals, key, n)


def _bump(counts: Counter[str], key: str, times: int) -> None:
    """Count ``key``, or count it with the others once :data:`REFUSAL_KEYS` are named:
    a flood from many addresses costs bounded memory and a bounded event."""
    counts[key if key in counts or len(counts) < REFUSAL_KEYS else OTHERS] += times


class Refusals:
    """Refused credentials, counted here and written in summary (see the module
    docstring): at most one event per ``seconds``, the first at once."""

    def __init__(self, engine: Engine, seconds: float = REFUSAL_SECONDS) -> None:
        self._engine = engine
        self.seconds = seconds
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time; close waits for it
        self._pending = _Tally()
        self._timer: threading.Timer | None = None
        self._written_at = -math.inf
        self._closed = False
        #: Refusals counted since the server started, and how many of them are written.
        self.total = 0
        self.written = 0

    def count(self, source: str, claimed: str) -> None:
        """Count one refusal; the summary holding it is written within ``seconds``."""
        with self._lock:
            self.total += 1
            self._pending.add(source, claimed)
            self._schedule()

    def _schedule(self) -> None:
        """A write when the last is ``seconds`` old (at once after a quiet spell);
        called holding the lock."""
        if self._timer is None and not self._closed:
            delay = max(0.0, self._written_at + self.seconds - time.monotonic())
            self._timer = threading.Timer(delay, self._due)
            self._timer.daemon = True
            self._timer.start()

    def _due(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self.flush()
        except CharterError:
            # The store could not take it (busy, unreachable): the counts were put
            # back, and the next try is one interval away, not sooner.
            with self._lock:
                self._schedule()

    def flush(self) -> None:
        """Write what is counted and not yet written, now, as one event; on a
        store error the counts are kept for the next write and the error raised.
        A write under way is waited for: once :meth:`close` returns, nothing
        here touches the engine again."""
        with self._writing:
            with self._lock:
                tally, self._pending = self._pending, _Tally()
                self._written_at = time.monotonic()
            if not tally.count:
                return
            try:
                self._engine.record_refusals(_summary(tally))
            except CharterError:
                with self._lock:
                    self._pending.merge(tally)
                raise
            with self._lock:
                self.written += tally.count

    def close(self) -> None:
        """No more timed writes; what is counted is written now (the server stops)."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.flush()


def _summary(tally: _Tally) -> dict[str, Any]:
    return {
        "reason": "bad or missing credential",
        "count": tally.count,
        "seconds": round(time.monotonic() - tally.since, 3),
        "sources": dict(tally.sources.most_common()),
        "principals": dict(tally.principals.most_common()),
    }


class Gate:
    """The credential check and the body limit of one server process."""

    def __init__(self, engine: Engine, *, max_body: int, refusal_seconds: float) -> None:
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ConfigError(f"max_body must be a whole number of bytes above 0, got {max_body!r}")
        self.engine = engine
        self.max_body = max_body
        self.refusals = Refusals(engine, refusal_seconds)

    def bearer(self, request: Request) -> Principal:
        """The principal the request's ``Authorization`` header proves; a refusal
        is counted (and written in summary), never written on its own."""
        try:
            return bearer(self.engine, request.headers.get("authorization"))
        except AuthenticationError as exc:
            self.refusals.count(_source(request), str(exc.details.get("principal", "?")))
            raise

    def credential(self, request: Request, credential: str) -> Principal:
        """The principal a sign-in form's ``NAME:SECRET`` proves; refusals as :meth:`bearer`."""
        try:
            return self.engine.authenticate(credential, audit=False)
        except AuthenticationError as exc:
            self.refusals.count(_source(request), str(exc.details.get("principal", "?")))
            raise

    async def body(self, request: Request) -> bytes:
        return await body(request, self.max_body)


def _source(request: Request) -> str:
    return request.client.host if request.client is not None else "?"
