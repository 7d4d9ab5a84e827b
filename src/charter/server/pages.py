"""What each console page shows, read through the public engine API.

Each loader takes the engine and the request's values and returns the page's
data; the console renders it with the page's template. Loaders read bounded
pages (:data:`~charter.server.wire.PAGE` rows, or what a run holds), so a page
costs the same with ten runs in the store or a hundred thousand.
"""

from __future__ import annotations

import functools
import html
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from markupsafe import Markup

from charter import RunStatus
from charter.errors import UsageError
from charter.server import story
from charter.server.wire import PAGE, listing, next_action, position, whole

if TYPE_CHECKING:
    from charter import Engine, Unit

Values = Mapping[str, str]
QUEUE_ROWS = 200  # the reconciliation queue shows this many unresolved attempts at most
TIMELINE_ROWS = 50  # a run page shows this many of its newest audit events, then "older"
CHART_ENTRIES = 500  # a ledger chart draws this many of a unit's newest entries


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def inbox(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    """Each pending approval with the exact request it is bound to, its estimate,
    what the allowance has left in the estimate's units, and how long it lasts;
    then the runs that wait for a person otherwise (K3)."""
    items = []
    for approval in engine.approvals(pending=True, limit=QUEUE_ROWS):
        request = engine.approval_request(approval.id)
        balances = engine.balances(approval.mission_id)
        contract = engine.contract(approval.mission_id)
        estimate = {} if request is None else request.estimate
        items.append(
            {
                "approval": approval.to_dict(),
                "request": None if request is None else request.to_dict(),
                "request_json": "" if request is None else pretty(request.to_dict()["request"]),
                "estimate": estimate,
                "left": {u: balances[u].available for u in estimate if u in balances},
                "ttl": contract.approvals.ttl_seconds,
                "units": contract.units,
            }
        )
    return {"items": items, "stuck": stuck(engine)}


def stuck(engine: Engine) -> list[dict[str, Any]]:
    """Runs no worker can carry on until a person decides something (K3)."""
    return [r.to_dict() for r in engine.runs_needing_people(limit=QUEUE_ROWS)]


def units_reader(engine: Engine) -> Callable[[str], Mapping[str, Unit]]:
    """Each mission's units as its contract describes them (how its amounts are
    shown: ``charter.show_amounts``), read once per page however many of the
    page's rows are the mission's."""
    return functools.cache(lambda mission_id: engine.contract(mission_id).units)


def queue(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    """Every attempt sent and not settled, with its evidence so far and the next
    safe action."""
    items = []
    units = units_reader(engine)
    for attempt in engine.attempts(unresolved=True, limit=QUEUE_ROWS):
        if attempt.status.value == "prepared":
            continue  # not sent: it waits in the inbox, not here
        row = attempt.to_dict()
        evidence = engine.evidence(attempt.id)
        items.append(
            {
                "attempt": row,
                "units": units(attempt.mission_id),
                "request_json": pretty(row["request"]),
                "evidence": [{**e, "detail_json": pretty(e.get("detail"))} for e in evidence],
                "conclusive": any(
                    e["verdict"] != "indeterminate" and not e["settled"] for e in evidence
                ),
                "next_action": next_action(row, evidence),
            }
        )
    return {"items": items}


def reconcile_all(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    """What "reconcile all" will do, for a person to confirm before it is done:
    each attempt of the queue (sent, not settled) asked of its target once."""
    units = units_reader(engine)
    return {
        "items": [
            {"attempt": a.to_dict(), "units": units(a.mission_id)}
            for a in engine.attempts(unresolved=True, limit=QUEUE_ROWS)
            if a.status.value != "prepared"
        ]
    }


def runs(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    status = query.get("status") or None
    if status is not None and status not in {s.value for s in RunStatus}:
        raise UsageError(f"no run status {status!r}")
    mission = query.get("mission") or None
    found = engine.runs(
        mission,
        status=None if status is None else RunStatus(status),
        limit=PAGE + 1,
        after=position(query.get("after")),
    )
    page = listing([r.to_dict() for r in found], PAGE, "created_at_us")
    return {
        **page,
        "status": status or "",
        "mission": mission or "",
        "statuses": [s.value for s in RunStatus],
    }


def run(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    """The run's story (:mod:`charter.server.story`): its state and the next safe
    step as it stands now, its input, node executions, attempts with their
    evidence, waits, takeovers and people's decisions, and the newest page of
    its audit timeline (``?before=SEQ``: the page before that event), with the
    cursor of the page before it (``older``, or empty when it is the first)."""
    run_id = path["run_id"]
    before = query.get("before")
    state = engine.coordinator.state(run_id).to_dict()
    timeline = engine.timeline(
        run_id,
        before=None if not before else whole(before, "before", 1),
        limit=TIMELINE_ROWS + 1,
    )
    shown = timeline[-TIMELINE_ROWS:]
    attempts = story.attempts(engine, run_id)
    return {
        "state": state,
        "next_step": story.next_step(state, attempts),
        "ended": state["status"] in story.ENDED,
        "input": engine.run_input(run_id),
        "nodes": story.nodes(engine, run_id),
        "attempts": attempts,
        # How its amounts read: the units of its mission's contract (all its attempts').
        "units": engine.contract(attempts[0]["mission_id"]).units if attempts else {},
        "approvals": [a.to_dict() for a in engine.approvals(run_id=run_id)],
        "takeovers": story.takeovers(shown),
        "decisions": story.decisions(shown),
        "timeline": shown,
        "older": timeline[1]["seq"] if len(timeline) > TIMELINE_ROWS else "",
    }


def run_rows(items: list[dict[str, Any]]) -> Markup:
    """The runs list's table rows. The longest page the console renders, so it is
    built here, its values escaped all at once (:func:`escaped`), not cell by
    cell by the template engine (half the page's cost)."""
    cells = escaped(
        [
            str(r[k])
            for r in items
            for k in ("id", "mission_id", "status", "owner_segment", "principal")
        ]
    )
    rows = []
    for n, r in enumerate(items):
        run_id, mission, status, owner, principal = cells[5 * n : 5 * n + 5]
        rows.append(
            f'<tr><td><a href="/console/runs/{run_id}">{run_id}</a></td>'
            f'<td>{mission}</td><td class="status">{status}</td>'
            f"<td>{int(r['epoch'])}</td><td>{owner}</td>"
            f"<td>{principal}</td><td>{when(r['created_at_us'])}</td></tr>\n"
        )
    return Markup("".join(rows))


def timeline_rows(events: list[dict[str, Any]]) -> Markup:
    """A run page's audit timeline rows, built like :func:`run_rows`: a timeline
    is most of a run page's cells."""
    keys = ("actor", "kind", "entity", "before", "after", "payload")
    cells = escaped([str(e[k] or "") for e in events for k in keys])
    rows = []
    for n, e in enumerate(events):
        actor, kind, entity, before, after, payload = cells[6 * n : 6 * n + 6]
        refusal = "refusal" if e["kind"].endswith("refused") else ""
        change = before + (f" → {after}" if after else "")
        if len(payload) > story.FOLD_CHARS:  # long payloads folded, pretty-printed when opened
            payload = str(story.folded(story.decoded(e["payload"])))
        else:
            payload = f"<code>{payload}</code>"
        rows.append(
            f'<tr class="{refusal}" data-seq="{int(e["seq"])}"><td>{int(e["seq"])}</td>'
            f"<td>{when(e['at_us'])}</td><td>{actor}</td><td>{kind}</td><td>{entity}</td>"
            f"<td>{change}</td><td>{payload}</td></tr>\n"
        )
    return Markup("".join(rows))


_APART = "\x1f"  # between values escaped together: escaping leaves it, IDs never hold it


def escaped(values: list[str]) -> list[str]:
    """Each value HTML-escaped (quotes too), in one call of the escaper for them
    all instead of one per value. A value that holds the separator itself would
    split wrongly, so then each is escaped alone."""
    out = html.escape(_APART.join(values)).split(_APART)
    return out if len(out) == len(values) else [html.escape(v) for v in values]


def when(us: int | None) -> str:
    """A moment as people read it, and how long ago (or how soon) it is from the
    page's making: ``2026-12-03 13:50:00 UTC (3 min ago)``."""
    if us is None:
        return "-"
    seconds = us // 1_000_000
    return f"{_second(seconds)} ({relative(seconds - int(time.time()))})"


def relative(delta: int) -> str:
    """``delta`` seconds from now as people say it: ``-190`` is ``3 min ago``,
    ``7200`` is ``in 2 h`` (an approval's expiry), a few seconds ``just now``."""
    span = abs(delta)
    if span < 5:
        return "just now"
    if span < 60:
        said = f"{span} s"
    elif span < 3600:
        said = f"{span // 60} min"
    elif span < 86400:
        said = f"{span // 3600} h"
    else:
        said = f"{span // 86400} d"
    return f"in {said}" if delta > 0 else f"{said} ago"


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    """A moment as people read it; cached, since every refresh of a page shows
    the same moments again."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def ledger(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    missions = [m.to_dict() for m in engine.missions(limit=QUEUE_ROWS)]
    chosen = query.get("mission") or (missions[-1]["id"] if missions else "")
    if not chosen:
        return {"missions": missions, "mission": "", "balances": [], "charts": [], "incidents": []}
    balances = engine.balances(chosen)
    return {
        "missions": missions,
        "mission": chosen,
        "units": engine.contract(chosen).units,
        "balances": [{"unit": u, **b.__dict__} for u, b in balances.items()],
        # The check reads every entry of the mission: when asked, not on each visit.
        "problems": engine.check_ledger(chosen) if query.get("check") else None,
        "charts": [
            chart(u, engine.ledger_entries(chosen, unit=u, newest=CHART_ENTRIES), b)
            for u, b in balances.items()
        ],
        "incidents": engine.incidents(chosen, limit=QUEUE_ROWS),
    }


class Standing(Protocol):
    """What a chart needs of a unit's balance (:meth:`charter.Engine.balances`)."""

    limit: int
    spent: int


def chart(unit: str, entries: list[dict[str, Any]], now: Standing) -> dict[str, Any]:
    """Spend against the limit over the time ``entries`` (the newest of ``unit``)
    cover, as SVG polyline points in a 300 x 80 box (time left to right, amount
    bottom to top). The window starts where the balance ``now`` was before them,
    so a long mission's chart reads a bounded window and still ends at its
    balance."""
    limit, spent = now.limit, now.spent
    for e in entries:  # back to before the window
        d_limit, d_spent = _moved(e)
        limit, spent = limit - d_limit, spent - d_spent
    steps: list[tuple[int, int, int]] = []  # (at_us, limit, spent) after each entry
    for e in entries:
        d_limit, d_spent = _moved(e)
        limit, spent = limit + d_limit, spent + d_spent
        steps.append((e["at_us"], limit, spent))
    if not steps:
        return {"unit": unit, "limit": "", "spent": "", "top": 0}
    t0, t1 = steps[0][0], max(steps[-1][0], steps[0][0] + 1)
    top = max(max(s[1], s[2]) for s in steps) or 1

    def points(index: int) -> str:
        out = []
        for step in steps:
            x = 300 * (step[0] - t0) / (t1 - t0)
            out.append(f"{x:.1f},{80 - 78 * step[index] / top:.1f}")
        return " ".join(out)

    return {"unit": unit, "limit": points(1), "spent": points(2), "top": top}


def _moved(entry: dict[str, Any]) -> tuple[int, int]:
    """What one entry does to (limit, spent)."""
    if entry["kind"] == "fund":
        return entry["amount"], 0
    if entry["kind"] == "reduce":
        return -entry["amount"], 0
    return 0, entry["amount"] if entry["target"] == "spent" else 0


def audit(engine: Engine, path: Values, query: Values) -> dict[str, Any]:
    """The newest page of a chain's events (a mission's, else the engine's own)
    before ``before``, read backwards on the chain's key: a visit costs one page
    however long the chain. Verifying reads every event of every chain, so it
    runs when asked (``verify``), not on each visit."""
    missions = [m.to_dict() for m in engine.missions(limit=QUEUE_ROWS)]
    chain = query.get("mission") or "engine"
    if chain != "engine":
        engine.mission(chain)  # an unknown mission is NotFound, not an empty chain
    before = query.get("before")
    found = engine.audit_events(
        chain, before=whole(before, "before", 1) if before else None, limit=TIMELINE_ROWS + 1
    )
    events = found[-TIMELINE_ROWS:]
    chains = [v.to_dict() for v in engine.verify_audit()] if query.get("verify") else None
    return {
        "missions": missions,
        "mission": chain,
        "events": events,
        "older": events[0]["seq"] if len(found) > TIMELINE_ROWS else None,
        "chains": chains,
        "ok": chains is not None and all(c["ok"] for c in chains),
    }
