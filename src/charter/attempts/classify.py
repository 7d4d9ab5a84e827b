"""What a target's answer proves about an attempt (A3): one rule for every adapter.

An adapter sees two kinds of answer, and this module reads both the same way
for every built-in adapter (HTTP, MCP, the model providers, the agent
integrations) and for anyone writing their own:

**What a send answered.** An answer *settles* an attempt only on positive
proof:

- the target says it applied the effect: SUCCEEDED (:class:`~charter.adapters.Outcome`);
- the target proves it did not act (no connection was made, a refusal it
  documents as made before applying anything): not applied
  (:class:`~charter.errors.NotApplied`), the hold released;
- any error raised or returned *after* the request may have reached the
  target (a 5xx, a dropped connection, a timeout, an MCP tool result with
  ``isError``, which the MCP SDK makes from any exception inside a tool even
  after the tool acted) is UNKNOWN for ``unsafe`` and ``idempotent_keyed``
  effects (:func:`error_answer`). Only a ``read_only`` effect, which changes
  nothing outside, may settle FAILED on such an answer.

**What a lookup answered** (reconcile, R7). A lookup proves *applied* only
when it returns the effect itself, and *not applied* only where the adapter
declares that the target's absence is proof. An empty list, an empty body,
an envelope around nothing, more than one candidate, or any shape the
adapter did not declare proves nothing: *indeterminate*
(:func:`read_lookup`, :func:`lookup_evidence`).

Nothing here touches the store: it sits on the adapters' floor, so an adapter
outside this package imports it as freely as the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from charter.adapters.protocol import EffectClass, Evidence, Operation, Outcome
from charter.errors import AdapterError, OutcomeUnknown

#: What a lookup's answer shows, before the adapter's declaration is applied.
Seen = Literal["found", "absent", "indeterminate"]


def error_answer(
    operation: Operation, result: Any = None, *, receipt: Any = None, reason: str
) -> Outcome:
    """A target's error answer given after the request may have reached it.

    FAILED only for a ``read_only`` effect (nothing outside can have changed);
    for any other it raises :class:`~charter.errors.OutcomeUnknown`, keeping
    what the target said, so the attempt waits for evidence or a person and is
    never retried on a guess.
    """
    if operation.effect is EffectClass.READ_ONLY:
        return Outcome.failed(result, receipt=receipt)
    raise OutcomeUnknown(
        f"{reason}; the target may have acted before it answered with an error",
        evidence={"answer": receipt if receipt is not None else result},
    )


@dataclass(frozen=True)
class Lookup:
    """A lookup's answer, read: ``found`` holds the effect when ``seen`` is ``"found"``."""

    seen: Seen
    found: Mapping[str, Any] | None = None
    why: str = ""


def read_lookup(
    body: Any,
    *,
    found_at: str | None = None,
    match: Mapping[str, Any] | None = None,
    known: Mapping[str, str] | None = None,
    empty_is_absent: bool = False,
) -> Lookup:
    """What a successful lookup's ``body`` shows.

    ``found_at`` is a dotted path to the effect inside the body (``"data"``,
    ``"result.payment"``; a number steps into a list). Without it the body
    itself must be the effect: a JSON object that is not an envelope (a
    lone member holding a list or an object, such as ``{"data": []}``).

    At that place: an object is the effect; a list of exactly one object is
    that object; an empty list, ``null``, ``{}`` or an empty body is *absent*
    only when ``empty_is_absent`` (the target documents that an empty answer
    means it holds no such effect), else it proves nothing; anything else is
    indeterminate. ``match`` maps dotted fields of the found
    object to what they must hold for it to be *this* effect: a value, a
    list of accepted values, or a ``"{name}"`` filled from ``known`` (the
    attempt's ``idempotency_key``, ``attempt_id``, ``run_id``). A found object
    that does not match proves nothing.
    """
    if found_at is None:
        if _is_envelope(body):
            return Lookup(
                "indeterminate",
                why="the answer wraps a list or an object and no path to the effect is "
                "declared (found_at)",
            )
        place = body
    else:
        place = _at(body, found_at)
        if place is _MISSING:
            return Lookup("indeterminate", why=f"the answer has nothing at {found_at!r}")
    if place is None or place in ("", [], {}):
        return Lookup("absent" if empty_is_absent else "indeterminate", why="the answer is empty")
    if isinstance(place, list):
        if len(place) != 1:
            return Lookup("indeterminate", why=f"the answer lists {len(place)} candidates")
        place = place[0]
    if not isinstance(place, dict) or not place:
        return Lookup("indeterminate", why=f"the answer is a {type(place).__name__}, not an object")
    for path, wanted in (match or {}).items():
        have = _at(place, path)
        if not _matches(have, wanted, known or {}):
            return Lookup(
                "indeterminate",
                why=f"the object found has {path}={_short(have)}, not {_short(wanted)}",
            )
    return Lookup("found", place)


def lookup_evidence(
    lookup: Lookup,
    *,
    absent_is_proof: bool,
    outcome: Callable[[Mapping[str, Any]], Outcome],
    detail: Any,
) -> Evidence:
    """Evidence from a read lookup: applied only with the effect in hand, not
    applied only where absence is declared proof, otherwise indeterminate.

    ``outcome`` builds the applied outcome from the found object (its cost,
    its result); if it cannot (no amount where the declaration says), the
    effect's record is not what was expected and the lookup proves nothing.
    """
    if lookup.seen == "found" and lookup.found is not None:
        try:
            return Evidence.applied(outcome(lookup.found), detail=detail)
        except AdapterError as exc:
            return Evidence.indeterminate({**_dict(detail), "why": exc.message})
    if lookup.seen == "absent" and absent_is_proof:
        return Evidence.not_applied(detail)
    why = lookup.why if lookup.seen != "absent" else f"{lookup.why}, and absence is not proof"
    return Evidence.indeterminate({**_dict(detail), "why": why})


_MISSING = object()


def _at(value: Any, path: str) -> Any:
    for step in path.split("."):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return _MISSING
    return value


def _is_envelope(body: Any) -> bool:
    if isinstance(body, list):
        return True
    return (
        isinstance(body, dict)
        and len(body) == 1
        and isinstance(next(iter(body.values())), list | dict)
    )


def _matches(have: Any, wanted: Any, known: Mapping[str, str]) -> bool:
    if have is _MISSING:
        return False
    if isinstance(wanted, list):
        return any(_matches(have, w, known) for w in wanted)
    if isinstance(wanted, str) and wanted.startswith("{") and wanted.endswith("}"):
        name = wanted[1:-1]
        if name not in known:
            raise AdapterError(f"a lookup match names {wanted!r}, which the attempt does not have")
        return bool(have == known[name])
    return bool(have == wanted and type(have) is type(wanted))


def _dict(detail: Any) -> dict[str, Any]:
    return dict(detail) if isinstance(detail, Mapping) else {"detail": detail}


def _short(value: Any) -> str:
    text = "nothing" if value is _MISSING else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
