"""What the API and the console share: HTTP statuses for the engine's error codes,
request values checked as the command line checks them, records as JSON.

An error answers ``{"error": {"code", "message", ...details}}`` with the code the
engine gave it (``CharterError.code``), so a client reacts to the code, never to
the wording.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from charter import CharterError
from charter.errors import (
    AdmissionRefused,
    AuthenticationError,
    ConfigError,
    ContractError,
    NonDeterminismError,
    NotAuthorized,
    NotFound,
    StateError,
    StoreBusy,
    UsageError,
)

#: The largest whole number the store's columns hold (A9).
INT64 = 2**63 - 1
PAGE = 50
MAX_PAGE = 1000


class CsrfRefused(UsageError):
    """A console form without its session's CSRF token: refused, nothing changed."""

    code = "csrf_refused"


class BodyTooLarge(UsageError):
    """A request body above the server's limit (P4): refused as soon as it is
    declared or read past the limit, nothing changed; ``limit`` is in the
    details."""

    code = "body_too_large"


class MalformedBody(UsageError):
    """A request body that is not JSON the API can take: not UTF-8, not JSON,
    nested deeper than any request needs, or holding text no store can keep (a
    lone surrogate). Refused before anything is decided, nothing changed."""

    code = "malformed_body"


#: Error class -> HTTP status, most specific first; anything else is 500.
STATUSES: tuple[tuple[type[CharterError], int], ...] = (
    (AuthenticationError, 401),
    (CsrfRefused, 403),
    (BodyTooLarge, 413),
    (NotAuthorized, 403),
    (NotFound, 404),
    (UsageError, 400),
    (ContractError, 400),
    (StateError, 409),
    (AdmissionRefused, 409),
    (NonDeterminismError, 409),  # a replay that asks for something else than recorded
    (StoreBusy, 503),
    (ConfigError, 500),
)


def status_of(exc: CharterError) -> int:
    for cls, status in STATUSES:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(exc: CharterError) -> dict[str, Any]:
    return {"error": jsonable(exc.to_dict())}


def jsonable(value: Any) -> Any:
    """Records (dataclasses, enums, mappings) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return jsonable(to_dict() if callable(to_dict) else dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def whole(text: str, name: str, low: int = 0, high: int = INT64) -> int:
    """``text`` as a whole number in [low, high] (no sign, no float), else UsageError."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or not low <= int(text) <= high:
        raise UsageError(f"{name} must be a whole number from {low} to {high}, got {text!r}")
    return int(text)


def position(text: str | None) -> tuple[int, str] | None:
    """A page cursor ``TIME:ID`` (the ``next`` of the page before), or None."""
    if not text:
        return None
    time_us, sep, row_id = text.partition(":")
    if not sep or not row_id:
        raise UsageError(f"after takes the cursor TIME:ID a page returned as next, got {text!r}")
    return whole(time_us, "after's time"), row_id


def limit(text: str | None) -> int:
    return PAGE if not text else whole(text, "limit", 1, MAX_PAGE)


def listing(rows: list[dict[str, Any]], size: int, key: str) -> dict[str, Any]:
    """One page from ``size + 1`` rows read: ``{"items", "next"}`` (``next`` is the
    cursor of the page after, or null when there is none)."""
    page = rows[:size]
    after = f"{page[-1][key]}:{page[-1]['id']}" if len(rows) > size else None
    return {"items": page, "next": after}


def next_action(attempt: Mapping[str, Any], evidence: list[dict[str, Any]]) -> str:
    """The next safe step for an unresolved attempt, from what is on record (R7, R8)."""
    if attempt["status"] == "prepared":
        return "waits for its approval; nothing was sent"
    open_verdicts = [e["verdict"] for e in evidence if not e.get("settled")]
    if any(v in ("applied", "not_applied") for v in open_verdicts):
        return "confirm the conclusive evidence, or resolve it with your own"
    if evidence:
        return "evidence is indeterminate: resolve it with evidence and cost, or write it off"
    return "reconcile: ask the target whether it acted (nothing is sent again blindly)"
