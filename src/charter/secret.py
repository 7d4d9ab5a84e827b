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

import base64
import functools
import json
import os
from collections.abc import Iterator
from typing import Any, NoReturn
from urllib.parse import quote, quote_plus

from charter.errors import SecretUnavailable

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
        if value:
            _see(name, value)

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
        """The value, for the adapter to put on the wire (and nowhere else).

        A value read from the environment here is remembered for scrubbing,
        like one given to the constructor: a target may echo it back."""
        if self._value is not None:
            return self._value
        if self.name.startswith(_ENV):
            value = os.environ.get(self.name[len(_ENV) :])
            if value is not None:
                if value:
                    _see(self.name, value)
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


def scrub_text(text: str, secrets: list[Secret]) -> str:
    """``text`` with every secret replaced by ``***``, in each form a secret can
    take once something was turned into text (see :func:`_forms`).

    This is the last step before anything an adapter reported is recorded: a
    target may echo a secret inside bytes, an exception or any object whose
    text is what gets stored, so the final text is what must be clean. The
    secrets scrubbed are the request's (``secrets``) and every other secret
    this process has made or read: an adapter's own credentials (an API key,
    a header read from the environment) are held as :class:`Secret` values
    too, and a target that quotes one back in an error must not get it stored.
    Those are scrubbed from :data:`PROCESS_WIDE` characters on: a shorter value
    is no credential, and replacing it everywhere would corrupt unrelated text.
    """
    values = _WIDE
    if secrets:
        values = values | {t for s in secrets for t in _texts(s)}
    elif not values:
        return text
    for value in values:
        for form in _forms(value):
            if form in text:
                text = text.replace(form, "***")
    return text


@functools.lru_cache(maxsize=1024)
def _forms(value: str) -> list[str]:
    """Every shape a secret takes when a target hands it back as text: as is,
    JSON-escaped, in a ``str`` or ``bytes`` repr, percent-encoded (in a URL or
    a form) and in base64 (a Basic header, a token), padded or not."""
    raw = value.encode()
    b64 = [base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()]
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        repr(raw)[2:-1],
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
        *b64,
        *(b.rstrip("=") for b in b64),
    }
    return sorted((f for f in forms if f), key=len, reverse=True)


def recorded(value: Any) -> Any:
    """``value`` as it is recorded: each secret in it as its placeholder."""
    return _placeholders(value)


def _known(secret: Secret) -> str | None:
    try:
        return secret.reveal()
    except SecretUnavailable:
        return None


def _texts(secret: Secret) -> set[str]:
    """Every value this process knows for the secret's name: its own, and those of
    secrets of that name made here (a send rebuilt from the record knows only
    the name, yet a lookup may echo the value its adapter holds)."""
    known = _known(secret)
    return _SEEN.get(secret.name, set()) | ({known} if known else set())


#: The shortest secret scrubbed from everything recorded in this process, not
#: only from the reports of the request that carried it.
PROCESS_WIDE = 8

#: Values of the secrets made in this process, by name, for scrubbing only.
_SEEN: dict[str, set[str]] = {}

#: The values of ``_SEEN`` scrubbed from everything recorded (those of
#: :data:`PROCESS_WIDE` characters or more), grown as :func:`_see` adds one.
_WIDE: frozenset[str] = frozenset()


def _see(name: str, value: str) -> None:
    """Remember ``value`` of secret ``name`` for scrubbing."""
    global _WIDE  # noqa: PLW0603 - a cache of _SEEN, which is process-wide by design
    known = _SEEN.setdefault(name, set())
    if value not in known:
        known.add(value)
        if len(value) >= PROCESS_WIDE:
            _WIDE = _WIDE | {value}


def _placeholders(value: Any) -> Any:
    if isinstance(value, Secret):
        return placeholder(value)
    if isinstance(value, dict):
        return {k: _placeholders(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_placeholders(v) for v in value]
    return value
