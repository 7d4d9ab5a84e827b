"""A run's story as an operator reads it: what each node was given and gave
back, with its timings; each attempt's request, evidence and receipt as fields;
the takeovers and who decided what; and the one next safe step.

The run page (:func:`charter.server.pages.run`) builds its data here from the
public engine reads. Values are shown whole when short, folded (``<details>``)
when long, and as their hash and size only when too large to read on a page.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from charter.server.wire import next_action

if TYPE_CHECKING:
    from charter import Engine

FOLD_CHARS = 120  # a value longer than this is folded: its first characters, then the whole
WHOLE_CHARS = 16_384  # a value longer than this is shown as its hash and size only
ENDED = ("completed", "failed", "cancelled", "stopped", "handed_off")
#: Audit events that change who carries the run on, and at which epoch (R1).
TAKEOVERS = ("run.recovered", "run.resumed", "run.handed_off")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def folded(value: Any) -> Markup:
    """``value`` for a page: itself when short; when long, its first characters
    with the whole pretty-printed under them, folded; when too large to read on
    a page, its SHA-256 and size (what the store can be asked for)."""
    if value is None or value == "":
        return Markup('<span class="muted">-</span>')
    text = _text(value)
    if len(text) <= FOLD_CHARS:
        return Markup(html.escape(text))
    size = len(text.encode())
    digest = hashlib.sha256(text.encode()).hexdigest()
    if len(text) > WHOLE_CHARS:
        return Markup(f'<span class="large">{size} bytes · sha256 {digest}</span>')
    whole = (
        text if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True, default=str)
    )
    return Markup(
        f"<details><summary>{html.escape(text[:FOLD_CHARS])}… ({size} bytes)</summary>"
        f"<pre>{html.escape(whole)}</pre></details>"
    )


def decoded(text: Any) -> Any:
    """A stored JSON text as its value; text that is not JSON as itself."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def took(start_us: int | None, end_us: int | None) -> str:
    """How long something lasted, as people read it ("-" while it goes on)."""
    if start_us is None or end_us is None:
        return "-"
    seconds = max(0, end_us - start_us) / 1_000_000
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def nodes(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    """Each node execution with its output (or error), timings and epoch."""
    return [
        {
            **n.__dict__,
            "took": took(n.started_at_us, n.completed_at_us),
        }
        for n in engine.node_executions(run_id)
    ]


def attempts(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    """Each attempt with its evidence decoded into fields and, while it is not
    settled, the next safe step for it (R7, R8)."""
    out = []
    for attempt in engine.attempts(run_id=run_id):
        row = attempt.to_dict()
        evidence = engine.evidence(attempt.id)
        unsettled = attempt.status.value in ("prepared", "dispatched", "unknown")
        row["evidence"] = [
            {**e, "outcome": decoded(e.get("outcome")), "detail": decoded(e.get("detail"))}
            for e in evidence
        ]
        row["next"] = next_action(row, evidence) if unsettled else ""
        row["unsettled"] = unsettled
        row["took"] = took(attempt.dispatched_at_us, attempt.settled_at_us)
        out.append(row)
    return out


def takeovers(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recoveries, resumes and handoffs among ``timeline``'s events, with the
    epoch each one left the run at (R1)."""
    return [{**e, "payload": decoded(e["payload"])} for e in timeline if e["kind"] in TAKEOVERS]


def decisions(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What people decided among ``timeline``'s events: acts of no segment
    (approvals, resolutions, confirmations, stops, resumes by a person),
    refusals left out (the timeline highlights them)."""
    return [
        {**e, "payload": decoded(e["payload"])}
        for e in timeline
        if e["segment"] is None
        and e["actor"]
        and not e["kind"].endswith("refused")
        and e["kind"] != "evidence.recorded"  # the resolution's own record, shown with it
    ]


def next_step(state: dict[str, Any], attempts: list[dict[str, Any]]) -> str:
    """The one next safe step for the run as it stands now. The status reason the
    run recorded when it stopped ("attempt … is unknown: reconcile or resolve it")
    stays on the run after a person settled that attempt, so it is read here only
    when nothing on record explains the status better."""
    status = state["status"]
    if status in ENDED:
        return f"the run {status}: it is never reopened; start a reviewed new linked run if needed"
    for a in attempts:
        if a["unsettled"]:
            return f"attempt {a['id']} is {a['status']}: {a['next']}"
    for w in state["waits"]:
        if w.get("expired"):
            return f"approval {w['id']} lapsed: resuming the run asks for it again"
        if w.get("kind"):  # input, timer or event (W1)
            return f"the run waits for {w['kind']} {w['id']}"
        if w.get("status") == "pending":
            return f"approval {w['id']} waits for a decision (Approvals)"
    assessment = state["assessment"]
    if assessment["exhausted"]:
        units = ", ".join(assessment["exhausted"])
        return f"the allowance is exhausted in {units}: raise the limit, then resume the run"
    if assessment["open_incidents"]:
        return "an incident is open: close it (Ledger), then resume the run"
    reason = state.get("status_reason") or ""
    stale = re.match(r"attempt (\S+) is \w+: ", reason)
    if stale:  # the attempt it names is settled now (none is unsettled above)
        return f"attempt {stale.group(1)} is settled: resume the run"
    if status == "needs_intervention" and reason:
        return reason  # a node raised, or replayed differently: what the run recorded
    if status in ("needs_intervention", "paused", "waiting"):
        return "nothing is left unsettled: resume the run"
    if status == "stopping":
        return "stopping: nothing new is admitted; settle what is in flight"
    if status == "queued":
        return "queued: the first free worker starts it"
    return f"running as {state['owner_segment']}: nothing to decide"
