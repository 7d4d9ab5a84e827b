"""Statement parameters as both stores keep them: text as given, or refused (A10).

SQLite keeps a NUL inside text; PostgreSQL cannot (libpq sends a text
parameter up to its first NUL, so ``inv\\0A`` would be stored as ``inv``, and an
audit event hashed over the whole text would no longer match its row). A lone
surrogate is not Unicode and neither store takes it. So every statement's text
parameters are checked here, on both stores alike, before anything is sent:
a NUL or a lone surrogate is a :class:`~charter.errors.TextRefused` and the
transaction writes nothing. Callers refuse such identifiers earlier, naming
them; this is the rule for whatever text reaches a store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from charter.errors import TextRefused
from charter.ids import problem, refusal


def check(params: Sequence[Any]) -> None:
    """Refuse ``params`` if a text among them holds a NUL (SQLite itself refuses a
    lone surrogate as it binds; see :func:`refused`)."""
    for value in params:  # a loop: cheaper than joining, on every statement
        if type(value) is str and "\0" in value:
            raise refused(params)


def refused(params: Sequence[Any]) -> TextRefused:
    """The error for the first text parameter a store cannot keep as given."""
    for i, value in enumerate(params):
        if isinstance(value, str):
            found = problem(value)
            if found is not None:
                return refusal(f"a statement's parameter {i + 1}", value, found)
    return TextRefused("a statement's text cannot be stored as given", field="parameter")


def postgres(params: Sequence[Any]) -> list[bytes | None]:
    """``params`` in PostgreSQL's text format (the server infers their types);
    text holding a NUL or a lone surrogate is refused."""
    try:
        values = [v.encode() if type(v) is str else _text(v) for v in params]
    except UnicodeEncodeError:
        raise refused(params) from None
    if b"\0" in b"".join([v for v in values if v is not None]):
        raise refused(params)
    return values


def _text(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return str(value).encode()
    raise TypeError(f"cannot send a {type(value).__name__} to PostgreSQL")
