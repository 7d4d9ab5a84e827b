"""The ``charter`` commands that find things: ``search`` by a business key and
``audit log``, the audit timeline a page at a time.

Both read through the public engine API (:meth:`charter.Engine.search`,
:meth:`charter.Engine.timeline` and :meth:`charter.Engine.audit_events`) one
bounded page a call, as the HTTP API does, and return the JSON-able data and the
readable text, like every handler.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from charter.cli import commands
from charter.cli.commands import Handler
from charter.errors import UsageError

if TYPE_CHECKING:
    from charter import Engine

PAGE = 50  # events or matches a page shows unless --limit says otherwise
PAYLOAD_CHARS = 60  # a payload is shown cut to this many characters; --json has it whole
ENGINE_CHAIN = "engine"  # the engine's own chain: sign-ins and refusals outside a mission


def search(engine: Engine, args: argparse.Namespace) -> Any:
    """The matches of ``TEXT``, newest first, each with its run (``charter show RUN``)."""
    found = engine.search(args.text, limit=args.limit or PAGE, before=args.before)
    rows = [
        {**f, "effect_key": f.get("effect_key"), "operation": _operation(f)} for f in found["items"]
    ]
    text = commands.table(
        rows, ["kind", "id", "run_id", "matched", "effect_key", "operation", "status"]
    )
    if found["next"]:
        text += f"\n(older attempts: add --before {found['next']})"
    return found, text


def _operation(found: dict[str, Any]) -> str | None:
    return f"{found['adapter']}.{found['operation']}" if found.get("adapter") else None


def audit_log(engine: Engine, args: argparse.Namespace) -> Any:
    """The newest page of a run's events (``--run``), a mission's (``--mission``) or
    the engine's own chain before ``--before``, oldest of the page first; ``next``
    is the ``--before`` of the page of older events."""
    if args.run and args.mission:
        raise UsageError("audit log reads one run (--run) or one mission (--mission), not both")
    size = args.limit or PAGE
    if args.run:
        found = engine.timeline(args.run, before=args.before, limit=size + 1)
    else:
        if args.mission:
            engine.mission(args.mission)  # an unknown mission is NotFound, not an empty log
        chain = args.mission or ENGINE_CHAIN
        found = engine.audit_events(chain, before=args.before, limit=size + 1)
    page = found[-size:]
    after = str(page[0]["seq"]) if len(found) > size else None
    text = _events(page)
    if after is not None:
        text += f"\n(older events: add --before {after})"
    return {"items": page, "next": after}, text


def audit(engine: Engine, args: argparse.Namespace) -> Any:
    """``charter audit``: ``log`` here, ``verify`` and ``identity`` as before."""
    if args.action == "log":
        return audit_log(engine, args)
    if args.run or args.before or args.limit:
        raise UsageError("--run, --before and --limit go with `charter audit log`")
    return commands.HANDLERS["audit"](engine, args)


#: Handlers for ``charter.cli.app``, taken over theirs (``audit`` reads its log here).
HANDLERS: dict[str, Handler] = {"search": search, "audit": audit}


def _events(events: list[dict[str, Any]]) -> str:
    """One line an event: seq, time (UTC), actor, kind, entity, before->after and
    the start of its payload."""
    rows = [
        {
            "seq": e["seq"],
            "time": datetime.fromtimestamp(e["at_us"] / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            "actor": e["actor"],
            "kind": e["kind"],
            "entity": e["entity"],
            "change": f"{e['before'] or '-'}->{e['after'] or '-'}"
            if e["before"] or e["after"]
            else None,
            "payload": _short(e["payload"]),
        }
        for e in events
    ]
    return commands.table(rows, ["seq", "time", "actor", "kind", "entity", "change", "payload"])


def _short(payload: Any) -> str | None:
    """A payload on one line, cut to :data:`PAYLOAD_CHARS`."""
    if payload in (None, "", "{}"):
        return None
    text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= PAYLOAD_CHARS else text[: PAYLOAD_CHARS - 3] + "..."
