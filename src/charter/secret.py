"""Secrets in requests (S3): sent to the adapter, never recorded.

A request may carry :class:`Secret` values (an API key, a header marked
secret). What is recorded, hashed, audited and printed is a placeholder with
the secret's name, ``{"$secret": "<name>"}``; only the adapter sees the value,
and only by asking for it (:meth:`Secret.reveal`). The request hash covers the
name, not the value, so a rotated key is not a different request on replay.

A send rebuilt from the store (a PREPARED attempt dispatched later, a same-key
replay during reconcile) has the placeholders back as secrets that know only
their name: one made with :meth:`Secret.env` reads its environment variable
again; any other cannot be revealed, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any, NoReturn, TypeVar

from charter.errors import SecretUnavailable

R = TypeVar("R")

#: The key of a recorded secret's placeholder; reserved in requests.
MARK = "$secret"
_ENV = "env:"


class Secret:
    """A value an adapter needs that must never be stored, audited or printed."""

    __slots__ = ("_value", "name")

    def __init__(self, value: str | None, *, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a Secret needs a non-empty name: it is what gets recorded")
        if value is not None and not isinstance(value, str):
            raise TypeError("a Secret's value is a string")
        self.name = name
        self._value = value

    @classmethod
    def env(cls, variable: str) -> Secret:
        """The value of environment variable ``variable``, read now and again by
        whichever process rebuilds the send from the store."""
        value = os.environ.get(variable)
        if value is None:
            raise SecretUnavailable(
                f"environment variable {variable} is not set; it holds the secret "
                f"'{_ENV}{variable}' this request needs",
                secret=f"{_ENV}{variable}",
            )
        return cls(value, name=f"{_ENV}{variable}")

    def reveal(self) -> str:
        """The value, for the adapter to put on the wire (and nowhere else)."""
        if self._value is not None:
            return self._value
        if self.name.startswith(_ENV):
            value = os.environ.get(self.name[len(_ENV) :])
            if value is not None:
                return value
        raise SecretUnavailable(
            f"secret {self.name!r} is not in the store by design (S3), and this send was "
            "rebuilt from the record: use Secret.env(...) for secrets a later process must "
            "find again, or resolve it by its name in the adapter",
            secret=self.name,
        )

    def __repr__(self) -> str:
        return f"Secret(name={self.name!r})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is not pickled: its value must not leave the process")


def placeholder(value: Any) -> dict[str, str]:
    """``default`` for the request encoder: a secret is recorded by its name only."""
    if isinstance(value, Secret):
        return {MARK: value.name}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def rebuild(value: Any) -> Any:
    """A recorded request with its placeholders back as name-only secrets."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(MARK), str):
            return Secret(None, name=value[MARK])
        return {k: rebuild(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rebuild(v) for v in value]
    return value


def found(value: Any) -> Iterator[Secret]:
    """The secrets in a request."""
    if isinstance(value, Secret):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from found(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from found(v)


def missing(value: Any) -> list[str]:
    """The names of the request's secrets that cannot be revealed in this process."""
    return [s.name for s in found(value) if _known(s) is None]


def has_reserved_key(value: Any) -> bool:
    """Whether a request uses the placeholder's key itself (it would read back as a secret)."""
    if isinstance(value, dict):
        return MARK in value or any(has_reserved_key(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_reserved_key(v) for v in value)
    return False


def scrub(value: Any, secrets: list[Secret]) -> Any:
    """``value`` with every revealed secret's text replaced by ``***``, and any
    secret in it by its placeholder (an adapter's error, result or receipt may
    echo what it was sent)."""
    return _scrub(value, [t for t in (_known(s) for s in secrets) if t])


def scrub_text(text: str, secrets: list[Secret]) -> str:
    """``text`` with every revealed secret replaced by ``***``, in each form the
    secret can take once something was turned into text: as is, JSON-escaped,
    and as Python writes it in the repr of a ``str`` or of ``bytes``.

    This is the last step before anything an adapter reported is recorded: a
    target may echo a secret inside bytes, an exception or any object whose
    text is what gets stored, so the final text is what must be clean.
    """
    for value in (t for t in (_known(s) for s in secrets) if t):
        for form in _forms(value):
            text = text.replace(form, "***")
    return text


def _forms(value: str) -> list[str]:
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        repr(value.encode())[2:-1],
    }
    return sorted((f for f in forms if f), key=len, reverse=True)


def recorded(value: Any) -> Any:
    """``value`` as it is recorded: each secret in it as its placeholder."""
    return _scrub(value, [])


def scrub_fields(record: R, secrets: list[Secret], *names: str) -> R:
    """A dataclass ``record`` (an outcome, evidence) with ``names`` scrubbed."""
    changes = {n: scrub(getattr(record, n), secrets) for n in names}
    return dataclasses.replace(record, **changes)  # type: ignore[type-var]


def _known(secret: Secret) -> str | None:
    try:
        return secret.reveal()
    except SecretUnavailable:
        return None


def _scrub(value: Any, texts: list[str]) -> Any:
    if isinstance(value, Secret):
        return placeholder(value)
    if isinstance(value, str):
        for t in texts:
            value = value.replace(t, "***")
        return value
    if isinstance(value, dict):
        return {_scrub(k, texts): _scrub(v, texts) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, texts) for v in value]
    return value
