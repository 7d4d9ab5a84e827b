"""The ``charter`` commands that work on a store: one handler per command.

Each handler takes the open engine and the parsed command line and returns the
JSON-able data and the readable text of its answer; :mod:`charter.cli.app` parses,
opens the store, prints, and turns errors into exit statuses.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charter import RunStatus, show_amounts
from charter.cli import snapshots
from charter.errors import AuditError, AuthenticationError, RunTerminal, StateError, UsageError

if TYPE_CHECKING:
    from charter import Engine, Principal

Handler = Callable[["Engine", argparse.Namespace], Any]


def principal(engine: Engine) -> Principal:

    credential = os.environ.get("CHARTER_CREDENTIAL")
    path = os.environ.get("CHARTER_CREDENTIAL_FILE")
    if not credential and path:
        try:
            credential = Path(path).read_text().strip()
        except OSError as exc:
            raise AuthenticationError(
                f"cannot read CHARTER_CREDENTIAL_FILE {path}: {exc}"
            ) from None
    if not credential:
        raise AuthenticationError(
            "this command needs an identity: set CHARTER_CREDENTIAL=NAME:SECRET or "
            "CHARTER_CREDENTIAL_FILE=path"
        )
    return engine.authenticate(credential)


def _identified() -> bool:
    """Whether the command line was given an identity (a credential or its file)."""
    return bool(os.environ.get("CHARTER_CREDENTIAL") or os.environ.get("CHARTER_CREDENTIAL_FILE"))


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) if r.get(c) is not None else "-" for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def amounts_shown(
    engine: Engine, rows: list[dict[str, Any]], keys: Sequence[str]
) -> list[dict[str, Any]]:
    """Copies of ``rows`` (each with its ``mission_id``) whose amount columns
    ``keys`` read as people read them, in their mission's units ("12.50 USD"):
    for a table's text only; ``--json`` keeps the integers."""
    units: dict[str, Any] = {}
    out = []
    for row in rows:
        mission = row["mission_id"]
        if mission not in units:  # one contract read per mission on the page
            units[mission] = engine.contract(mission).units
        shown = {k: show_amounts(row[k], units[mission]) for k in keys if row.get(k) is not None}
        out.append({**row, **shown})
    return out


def _listing(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    key: str,
    columns: Sequence[str],
    shown: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], str]:
    """One page: ``{"items": [...], "next": CURSOR | null}`` and its table.

    Handlers read one row more than the page: the page after exists when it came.
    ``next`` is the last row's keyset position, ``TIME:ID``. ``shown``: the
    page's rows as the table prints them, when they differ from the data.
    """
    page = rows[: args.limit]
    after = f"{page[-1][key]}:{page[-1]['id']}" if len(rows) > args.limit else None
    text = table(page if shown is None else shown[: args.limit], columns)
    if after is not None:
        text += f"\n(more: add --after {after} for the next page)"
    return {"items": page, "next": after}, text


# -- handlers: each returns (json-able data, readable text) -----------------------------
def _missions(engine: Engine, args: argparse.Namespace) -> Any:
    rows = [m.to_dict() for m in engine.missions(limit=args.limit + 1, after=args.after)]
    return _listing(
        args, rows, "created_at_us", ["id", "name", "contract_version", "attempts_admitted"]
    )


def _runs(engine: Engine, args: argparse.Namespace) -> Any:
    try:
        status = RunStatus(args.status) if args.status else None
    except ValueError:
        raise UsageError(
            f"--status takes one of {', '.join(s.value for s in RunStatus)}, got {args.status!r}"
        ) from None
    found = engine.runs(args.mission, status=status, limit=args.limit + 1, after=args.after)
    rows = [r.to_dict() for r in found]
    return _listing(
        args, rows, "created_at_us", ["id", "mission_id", "status", "epoch", "owner_segment"]
    )


def _show(engine: Engine, args: argparse.Namespace) -> Any:
    recovery = engine.coordinator.state(args.run)
    state = recovery.to_dict()
    unresolved = [
        {**a, "hold": show_amounts(a["estimate"], recovery.contract.units)}
        for a in state["attempts"]
    ]
    state["graph"] = graph(state["nodes"], engine.plan_versions(args.run))
    linked = f"linked from: {state['linked_from']}\n" if state["linked_from"] else ""
    text = (
        f"run {state['run_id']}  status {state['status']}  epoch {state['epoch']}  "
        f"owner {state['owner_segment']}  contract v{state['contract_version']}\n"
        f"reason: {state['status_reason'] or '-'}\n{linked}"
        f"nodes:\n{_drawn(state['graph'])}\n"
        f"unresolved attempts:\n"
        f"{table(unresolved, ['id', 'adapter', 'operation', 'status', 'hold', 'reason'])}\n"
        f"settled: {state['settled_counts'] or '{}'}"
    )
    return state, text


#: How a node's latest execution is drawn.
MARKS = {
    "completed": "[x]",
    "running": "[>]",
    "failed": "[!]",
    "waiting": "[~]",
    "blocked": "[?]",
}


def graph(nodes: list[dict[str, Any]], versions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node the run executed or its plan changes added, in first-seen order:
    its latest execution's status (``pending`` when it never ran), the error it
    raised unless it completed since (N6) and, for a node a plan change added,
    the nodes it comes after (N1, N3)."""
    after = {s["id"]: list(s["after"]) for v in versions for s in v["steps"]}
    drawn: dict[str, dict[str, Any]] = {}
    for n in nodes:  # executions in order; the latest wins
        drawn[n["node_id"]] = {
            "node_id": n["node_id"],
            "status": n["status"],
            "executions": n["execution"],
            "after": after.get(n["node_id"], []),
            "error": None if n["status"] == "completed" else n.get("error"),
        }
    for step, deps in after.items():
        drawn.setdefault(
            step,
            {"node_id": step, "status": "pending", "executions": 0, "after": deps, "error": None},
        )
    return list(drawn.values())


def _drawn(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "(none)"
    width = max(len(n["node_id"]) for n in nodes)
    lines = []
    for n in nodes:
        lines.append(
            f"  {MARKS.get(n['status'], '[ ]')} {n['node_id'].ljust(width)}  {n['status']}"
            + (f"  <- {', '.join(n['after'])}" if n["after"] else "")
        )
        if n["error"]:  # what it raised, with its last frames, under it
            lines += ["        " + line for line in n["error"].splitlines()]
    return "\n".join(lines)


def _attempts(engine: Engine, args: argparse.Namespace) -> Any:
    found = engine.attempts(
        run_id=args.run,
        mission_id=args.mission,
        unresolved=args.unresolved,
        limit=args.limit + 1,
        after=args.after,
    )
    rows = [a.to_dict() for a in found]
    columns = ["id", "run_id", "effect_key", "adapter", "operation", "status", "estimate", "actual"]
    shown = amounts_shown(engine, rows[: args.limit], ["estimate", "actual"])
    return _listing(args, rows, "prepared_at_us", columns, shown)


def _recover(engine: Engine, args: argparse.Namespace) -> Any:

    # With a credential the call is that principal's and needs `recover` (P3); a
    # forced takeover needs one (with `stop`); without, it is the engine's own.
    by = principal(engine) if args.force or _identified() else None
    state = engine.coordinator.recover(args.run, args.segment, force=args.force, by=by).to_dict()
    if RunStatus(state["status"]).terminal:
        # Recovery reports a terminal run's state without taking it over (N4): the
        # request was not carried out, whatever the state says.
        raise RunTerminal(
            f"run {args.run} is {state['status']} and a terminal run is never reopened: "
            f"nothing was taken over, segment {args.segment} owns nothing and the epoch "
            f"stays {state['epoch']}; follow it with `charter link {args.run} --segment ID`",
            run_id=args.run,
            status=state["status"],
            epoch=state["epoch"],
            taken_over=False,
            next_actions=state["next_actions"],
        )
    state["taken_over"] = True
    lines = [
        f"run {state['run_id']} recovered as segment {args.segment}: epoch "
        f"{state['epoch']}, status {state['status']}"
    ]
    lines += [
        f"  {n['kind']} {n['id']} [{n['phase']}]: {n['action']}" for n in state["next_actions"]
    ]
    return state, "\n".join(lines)


def _reconcile(engine: Engine, args: argparse.Namespace) -> Any:
    attempt = engine.get_attempt(args.attempt)
    adapter = engine.config.load_adapter(attempt.adapter)
    by = principal(engine) if _identified() else None  # needs `reconcile` (P3)
    evidence = engine.coordinator.reconcile(args.attempt, adapter, by=by, segment_id=args.segment)
    after = engine.get_attempt(args.attempt)
    data = {
        "attempt_id": args.attempt,
        "verdict": evidence.verdict,
        "detail": evidence.detail,
        "status": after.status.value,
        "settled": after.status.settled,
    }
    hint = (
        ""
        if after.status.settled
        else (
            "; confirm it with `charter confirm`"
            if evidence.conclusive
            else "; a person must resolve it (`charter resolve`)"
        )
    )
    return data, f"evidence: {evidence.verdict}; attempt is {after.status.value}{hint}"


def _confirm(engine: Engine, args: argparse.Namespace) -> Any:
    attempt = engine.coordinator.confirm(
        args.attempt, by=principal(engine), evidence_id=args.evidence_id
    )
    return attempt.to_dict(), f"attempt {attempt.id} settled {attempt.status.value}"


def _resolve(engine: Engine, args: argparse.Namespace) -> Any:
    attempt = engine.coordinator.resolve(
        args.attempt,
        by=principal(engine),
        outcome=args.outcome,
        evidence=args.evidence,
        cost=args.cost,
        confirm_above_hold=args.confirm_above_hold,
    )
    cost = show_amounts(attempt.actual, engine.contract(attempt.mission_id).units)
    return attempt.to_dict(), f"attempt {attempt.id} resolved {attempt.status.value} at {cost}"


def _resume(engine: Engine, args: argparse.Namespace) -> Any:
    if args.segment is None:
        return _go_ahead(engine, args.run)
    by = None
    if os.environ.get("CHARTER_CREDENTIAL") or os.environ.get("CHARTER_CREDENTIAL_FILE"):
        by = principal(engine)
    executor = engine.coordinator.resume(args.run, args.segment, by=by)
    result = executor.execute()
    run = engine.run(args.run)
    return (
        {"run_id": run.id, "status": run.status.value, "epoch": run.epoch, "result": result},
        f"run {run.id} {run.status.value} (epoch {run.epoch})",
    )


def _go_ahead(engine: Engine, run_id: str) -> Any:
    """resume without --segment: a run workers carry goes on in a worker, on the
    word of the principal whose credential is given."""
    if engine.queued_run(run_id) is None:
        raise UsageError(
            f"run {run_id} is not carried by workers: give --segment to continue it here"
        )
    by = principal(engine)
    run = engine.coordinator.go_ahead(run_id, by=by)
    return (
        {"run_id": run.id, "status": run.status.value, "epoch": run.epoch, "go_ahead": by.name},
        f"run {run.id}: go-ahead from {by.name} recorded; the next worker continues it",
    )


def _stop(engine: Engine, args: argparse.Namespace) -> Any:
    run = engine.stop_run(args.run, by=principal(engine), reason=args.reason)
    unresolved = len(engine.attempts(run_id=run.id, unresolved=True))
    text = f"run {run.id} {run.status.value}"
    if unresolved:
        text += (
            f"; it ends stopped once its {unresolved} attempt(s) in flight settle "
            "(`charter attempts --run RUN --unresolved`)"
        )
    return {**run.to_dict(), "unresolved": unresolved}, text


def _link(engine: Engine, args: argparse.Namespace) -> Any:

    if engine.coordinator.state(args.run).plan is None:
        raise StateError(
            f"run {args.run} records no plan to run again; start the linked run from Python "
            "with Engine.new_linked_run(..., plan=...)",
            run_id=args.run,
        )
    executor = engine.new_linked_run(
        args.run, reviewed_by=principal(engine), segment_id=args.segment
    )
    result = executor.execute()
    run = engine.run(executor.run_id)
    return (
        {"run_id": run.id, "linked_from": args.run, "status": run.status.value, "result": result},
        f"run {run.id} (linked from {args.run}) {run.status.value}",
    )


def _raise_limit(engine: Engine, args: argparse.Namespace) -> Any:
    unit, limit = args.limit
    version = engine.raise_limit(args.mission, unit, limit, by=principal(engine))
    balance = engine.balances(args.mission)[unit]
    paused = [r.id for r in engine.runs(args.mission) if r.status.value == "paused"]
    data = {
        "mission_id": args.mission,
        "contract_version": version,
        "unit": unit,
        "balance": balance.__dict__,
        "paused_runs": paused,
    }
    units = engine.contract(args.mission).units
    text = (
        f"{unit} limit {show_amounts({unit: limit}, units)} (contract v{version}); "
        f"{show_amounts({unit: balance.available}, units)} available"
    )
    if paused:
        text += f"; still paused (open incident or overrun): {', '.join(paused)}"
    return data, text


def _approvals(engine: Engine, args: argparse.Namespace) -> Any:
    found = engine.approvals(
        run_id=args.run, pending=args.pending, limit=args.limit + 1, after=args.after
    )
    rows = [a.to_dict() for a in found]
    return _listing(
        args, rows, "requested_at_us", ["id", "run_id", "scope", "status", "decided_by"]
    )


def _approve(engine: Engine, args: argparse.Namespace) -> Any:
    status = engine.approve(args.approval, by=principal(engine), deny=args.deny)
    return {"approval_id": args.approval, "status": status.value}, f"{args.approval} {status}"


def _incidents(engine: Engine, args: argparse.Namespace) -> Any:
    rows = engine.incidents(
        args.mission, open_only=args.open, limit=args.limit + 1, after=args.after
    )
    return _listing(args, rows, "opened_at_us", ["id", "kind", "status", "attempt_id", "closed_by"])


def _close_incident(engine: Engine, args: argparse.Namespace) -> Any:
    engine.close_incident(args.incident, by=principal(engine), note=args.note)
    return {"incident_id": args.incident, "status": "closed"}, f"{args.incident} closed"


def _ledger(engine: Engine, args: argparse.Namespace) -> Any:
    balances = engine.balances(args.mission)
    problems = engine.check_ledger(args.mission)
    rows = [{"unit": u, **b.__dict__} for u, b in balances.items()]
    units = engine.contract(args.mission).units
    accounts = ["limit", "available", "held", "spent", "overrun"]
    shown = [{**r, **{k: show_amounts({r["unit"]: r[k]}, units) for k in accounts}} for r in rows]
    text = table(shown, ["unit", *accounts])
    text += "\nledger check: " + ("ok" if not problems else "; ".join(problems))
    return {"mission_id": args.mission, "balances": rows, "problems": problems}, text


def _audit(engine: Engine, args: argparse.Namespace) -> Any:
    if args.action == "identity":
        return snapshots.identity(engine)
    results = engine.verify_audit(args.mission)
    rows = [v.to_dict() for v in results]
    text = table(rows, ["mission_id", "events", "ok", "broken_at", "problem"])
    if not all(v.ok for v in results):
        bad = [v for v in results if not v.ok]
        raise AuditError(
            f"audit chain broken: {bad[0].mission_id} at event {bad[0].broken_at} "
            f"({bad[0].problem})",
            chains=rows,
        )
    if args.key:
        signed = engine.verify_checkpoints(args.mission)
        text += "\n" + table(signed, ["mission_id", "ok", "signed_seq", "problem"])
        bad_points = [c for c in signed if not c["ok"]]
        if bad_points:
            raise AuditError(
                f"signed checkpoint fails: {bad_points[0]['mission_id']} "
                f"({bad_points[0]['problem']})",
                chains=rows,
                checkpoints=signed,
            )
        return {"chains": rows, "checkpoints": signed}, text
    return rows, text


def _serve(engine: Engine, args: argparse.Namespace) -> Any:
    from charter.server import serve, serve_workers  # noqa: PLC0415 - the extra, loaded when run

    served: list[str] = []

    def say(base: str) -> None:  # once the port is bound: port 0 says which it is
        served.append(base)
        print(f"serving {base}/api/v1 and {base}/console/ (Ctrl-C stops it)", flush=True)

    if args.workers == 1:
        serve(engine, host=args.host, port=args.port, max_body=args.max_body, announce=say)
    else:
        config = None if args.config is None else str(Path(args.config).resolve())
        serve_workers(
            args.store,
            config,
            host=args.host,
            port=args.port,
            workers=args.workers,
            max_body=args.max_body,
            announce=say,
        )
    return {"served": served[0] if served else None}, "stopped"


HANDLERS: dict[str, Handler] = {
    "missions": _missions,
    "runs": _runs,
    "show": _show,
    "attempts": _attempts,
    "recover": _recover,
    "reconcile": _reconcile,
    "confirm": _confirm,
    "resolve": _resolve,
    "resume": _resume,
    "stop": _stop,
    "link": _link,
    "raise-limit": _raise_limit,
    "approvals": _approvals,
    "approve": _approve,
    "incidents": _incidents,
    "close-incident": _close_incident,
    "ledger": _ledger,
    "audit": _audit,
    "serve": _serve,
    "export": lambda e, a: snapshots.export(e, a, principal(e) if a.handover else None),
    "import": snapshots.import_,
    "handoff": snapshots.handoff,
    "adopt": lambda e, a: snapshots.adopt(e, a, principal(e)),
}
