"""A call's record, built from an allow-list of the fields that define it.

An agent framework's messages carry more than the call they make: when each
was made, which run made it, the provider's ids for it, its usage, and each
release may add more. The request an integration records is the call's
identity on replay (A6): the same conversation must record the same request
whenever it is made, and a conversation that asks for something else must not.
So the record is built from the fields named here (the model, each message's
role, content, tool calls and returns, the tools and their schemas, the
settings that change the answer), never by removing the fields known to vary:
a field a new release adds never enters it.

An object of a kind no table names is refused (:class:`~charter.errors.ConfigError`)
before anything is recorded: Charter cannot tell which of its fields define
the call, and recording it whole would record what varies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from charter.errors import ConfigError

#: A field's name, and whether its value is the framework's objects again
#: (``True``: projected by the same table) or the caller's own data, taken
#: whole (``False``: a tool's arguments or return value, a JSON schema, text).
Fields = Mapping[str, bool]


@dataclass(frozen=True)
class Shapes:
    """The fields that define a call, for each kind of object a framework sends.

    ``tags``: the keys that name an object's kind, the first one present
    counting; ``kinds``: each kind's fields; ``default``: the kind of an
    object that names none (the Responses API's plain ``{"role", "content"}``
    message); ``what``: what the objects are, for the error that refuses one.
    """

    what: str
    tags: tuple[str, ...]
    kinds: Mapping[str, Fields]
    default: str | None = None

    def project(self, value: Any) -> Any:
        """``value`` (as JSON) with only the fields its kind's table names."""
        if isinstance(value, list | tuple):
            return [self.project(v) for v in value]
        if not isinstance(value, Mapping):
            return value
        tag = next((t for t in self.tags if t in value), None)
        kind = self.default if tag is None else value[tag]
        fields = self.kinds.get(kind) if isinstance(kind, str) else None
        if fields is None:
            raise ConfigError(
                f"a {self.what} of kind {kind!r} is not one Charter knows how to record; "
                "its call is refused before anything is sent",
                kind=str(kind),
            )
        return {**({} if tag is None else {tag: kind}), **self.pick(value, fields)}

    def pick(self, value: Mapping[str, Any], fields: Fields) -> dict[str, Any]:
        """The ``fields`` of ``value`` that are set (``None`` is unset), each
        projected when it holds the framework's objects, else taken whole."""
        return {
            name: self.project(value[name]) if nested else value[name]
            for name, nested in fields.items()
            if value.get(name) is not None
        }
