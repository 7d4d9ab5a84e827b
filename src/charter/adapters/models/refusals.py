"""What a model API's error means for an attempt (A3).

Only an answer the providers document as a refusal before any work (a bad
request, bad credentials, a rate limit) or a connection that was never made
proves the call was not billed; a 500, a timeout or a cut-off stream may come
after the provider billed it, so the attempt stays UNKNOWN.
"""

from __future__ import annotations

from typing import Any, NoReturn

from charter.errors import NotApplied, OutcomeUnknown

#: Statuses both APIs document as refused before the model ran.
REFUSED = frozenset({400, 401, 403, 404, 413, 422, 429})


def refused_or_raise(exc: Exception) -> NoReturn:
    """Raise :class:`NotApplied` for a proven refusal, else ``exc`` itself (UNKNOWN)."""
    status = getattr(exc, "status_code", None)
    if status in REFUSED:
        raise NotApplied(
            f"the provider refused the request (HTTP {status})",
            evidence={"status": status, "error": str(exc)[:2000]},
        ) from exc
    if type(exc.__cause__).__name__ == "ConnectError":  # httpx: no connection, nothing sent
        raise NotApplied("no connection to the provider", evidence={"error": str(exc)}) from exc
    raise exc


def unknown_stream(exc: BaseException, partial: dict[str, Any]) -> OutcomeUnknown:
    """A stream cut off: it may be billed, so UNKNOWN with what it had reported."""
    return OutcomeUnknown(
        f"the stream was cut off ({type(exc).__name__}: {exc})",
        evidence={"stream": "interrupted", "partial": partial},
    )
