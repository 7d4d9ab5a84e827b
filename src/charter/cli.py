"""The ``charter`` command line: inspect, recover, reconcile, resolve, resume.

Every command prints a readable default and takes ``--json``. Errors print one
line (``error: ...``, or a JSON object under ``--json``) and exit non-zero: 2
when the command line itself is wrong (:class:`~charter.errors.UsageError`),
1 for everything else. Identity for decisions comes from the configured
credential — the ``CHARTER_CREDENTIAL`` environment variable (``NAME:SECRET``)
or the file named by ``CHARTER_CREDENTIAL_FILE`` — never from a name on the
command line (P1). The store and engine configuration come from ``--config``,
``$CHARTER_CONFIG`` or ``./charter.toml``; ``--store`` overrides the store.
Only ``charter demo`` creates a store: every other command refuses an address
where there is none, so a typo cannot be answered from a new, empty store.

Listings read one page at a time (keyset paging, :mod:`charter.storage.paging`).
Engine imports are lazy so that ``charter --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from charter.errors import Blocked, CharterError, Fenced, UsageError

if TYPE_CHECKING:
    from charter.engine import Engine
    from charter.principals import Principal
    from charter.storage.paging import Position

Handler = Callable[["Engine", argparse.Namespace], Any]

#: The codes of the signals a command can end in, besides every ``CharterError.code``.
SIGNAL_CODES: dict[type[BaseException], str] = {Fenced: "fenced", Blocked: "blocked"}

PAGE = 50  # rows of a listing unless --limit says otherwise
MAX_PAGE = 1000  # a page's rows are held in memory: this bounds them
_INT64 = 2**63 - 1  # amounts (A9) and times are 64-bit integers in the store

#: Every command with its one-line help; ``docs/cli.md`` documents each one.
COMMANDS: dict[str, str] = {
    "demo": "run the built-in example mission on the embedded SQLite store",
    "credential": "make a new credential for a principal (prints the secret once)",
    "missions": "list missions",
    "runs": "list runs",
    "show": "show a run: status, epoch, owner, nodes, unresolved attempts",
    "attempts": "list attempts",
    "recover": "take over a run as a new segment and print the recovery state",
    "reconcile": "ask the attempt's adapter for evidence and record it",
    "confirm": "settle an uncertain attempt on its recorded evidence",
    "resolve": "settle an uncertain attempt as a person, with evidence",
    "resume": "continue a run under the resume policy",
    "stop": "stop a run: nothing new is admitted; it ends once what was sent has settled",
    "link": "follow an ended run with a reviewed new linked run and run its plan",
    "raise-limit": "raise a mission's allowance limit in one unit (a new contract version)",
    "approvals": "list approvals",
    "approve": "approve (or --deny) a pending approval",
    "incidents": "list a mission's incidents",
    "close-incident": "close an incident with a note",
    "ledger": "show a mission's allowance balances and check the ledger",
    "audit": "verify the audit hash chains",
}


class _Parser(argparse.ArgumentParser):
    """Its usage errors are :class:`UsageError`: one line (or JSON) and exit 2, like
    the amounts and cursors refused by the option types below."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def _global_options(parser: argparse.ArgumentParser, *, on_command: bool) -> None:
    """``--json``, ``--store`` and ``--config``, taken before the command and after it.

    After it they land apart (``cmd_*``, absent unless given) so that :func:`_merge`
    can tell the two places apart and refuse a contradiction instead of picking one.
    """
    prefix, unset = ("cmd_", argparse.SUPPRESS) if on_command else ("", None)
    parser.add_argument(
        "--json",
        dest=prefix + "json",
        action="store_true",
        default=unset if on_command else False,
        help="print machine-readable JSON",
    )
    parser.add_argument(
        "--store",
        dest=prefix + "store",
        metavar="STORE",
        default=unset,
        help="store path or URL (default: from config, else .charter/charter.db)",
    )
    parser.add_argument(
        "--config",
        dest=prefix + "config",
        metavar="FILE",
        default=unset,
        help="engine configuration file (TOML)",
    )


def _merge(args: argparse.Namespace) -> None:
    """One value per global option, wherever it was written."""
    given = vars(args)
    args.json = args.json or given.pop("cmd_json", False)
    for name in ("store", "config"):
        before, after = given[name], given.pop("cmd_" + name, None)
        if before is not None and after is not None and before != after:
            raise UsageError(
                f"--{name} is given twice with different values ({before!r} before the "
                f"command, {after!r} after it); give it once"
            )
        given[name] = before if after is None else after


def _whole(text: str, low: int, high: int) -> int | None:
    """``text`` as a whole number in [low, high], else None (no sign, no float)."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or not low <= int(text) <= high:
        return None
    return int(text)


def _amount(text: str) -> tuple[str, int]:
    """``UNIT=AMOUNT``: a whole amount in the unit's smallest step, in [0, 2^63 - 1] (A9)."""
    unit, sep, amount = text.partition("=")
    value = _whole(amount, 0, _INT64)
    if not unit or not sep or value is None:
        raise argparse.ArgumentTypeError(
            f"takes UNIT=AMOUNT, a whole amount in the unit's smallest step from 0 to "
            f"2^63-1 (A9), got {text!r}"
        )
    return unit, value


class _Costs(argparse.Action):
    """Repeated ``--cost UNIT=AMOUNT`` into one mapping; a unit given twice is a
    contradiction, not a sum."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        unit, amount = values
        costs = dict(getattr(namespace, self.dest))
        if unit in costs:
            parser.error(f"argument --cost: unit {unit!r} is given twice; give each unit once")
        costs[unit] = amount
        setattr(namespace, self.dest, costs)


def _limit(text: str) -> int:
    value = _whole(text, 1, MAX_PAGE)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"takes a whole number of rows from 1 to {MAX_PAGE}, got {text!r}"
        )
    return value


def _cursor(prefix: str) -> Callable[[str], Position]:
    """Parse a ``next`` cursor of the listing whose IDs start with ``prefix``."""

    def parse(text: str) -> Position:
        found = re.fullmatch(r"([0-9]{1,19}):([a-z]+)_[0-9a-z]+", text)
        if found is None or int(found[1]) > _INT64:
            raise argparse.ArgumentTypeError(
                f"takes the `next` cursor a page printed (TIME:ID), got {text!r}"
            )
        if found[2] != prefix:
            raise argparse.ArgumentTypeError(
                f"{text!r} is a cursor of another listing; pass the `next` of this command"
            )
        return int(found[1]), text.partition(":")[2]

    return parse


def _paged(parser: argparse.ArgumentParser, prefix: str) -> argparse.ArgumentParser:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=PAGE,
        metavar="N",
        help=f"rows per page, 1 to {MAX_PAGE} (default {PAGE})",
    )
    parser.add_argument(
        "--after",
        type=_cursor(prefix),
        metavar="CURSOR",
        help="the page after this cursor (the `next` the page before printed)",
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    command_options = _Parser(add_help=False)
    _global_options(command_options, on_command=True)
    p = _Parser(
        prog="charter",
        description="Charter: durable, governed execution for AI-agent missions.",
    )
    _global_options(p, on_command=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="the command")

    def add(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=COMMANDS[name], description=COMMANDS[name], parents=[command_options]
        )

    add("demo")
    c = add("credential")
    c.add_argument("action", choices=["new"], help="'new' makes a fresh credential")
    c.add_argument("name", help="the principal's name")
    _paged(add("missions"), "msn")
    r = _paged(add("runs"), "run")
    r.add_argument("--mission", help="only runs of this mission")
    s = add("show")
    s.add_argument("run", help="run ID")
    a = _paged(add("attempts"), "att")
    a.add_argument("--run", help="only attempts of this run")
    a.add_argument("--mission", help="only attempts of this mission")
    a.add_argument("--unresolved", action="store_true", help="only PREPARED/DISPATCHED/UNKNOWN")
    rc = add("recover")
    rc.add_argument("run", help="run ID")
    rc.add_argument("--segment", required=True, help="a new segment ID for this continuation")
    rc.add_argument(
        "--force", action="store_true", help="take over a live lease (audited; needs 'stop')"
    )
    rn = add("reconcile")
    rn.add_argument("attempt", help="attempt ID")
    rn.add_argument(
        "--segment",
        help="the segment `charter recover` installed: lets a keyed operation be replayed as it",
    )
    cf = add("confirm")
    cf.add_argument("attempt", help="attempt ID")
    cf.add_argument("--evidence-id", help="which recorded evidence (default: the latest)")
    rs = add("resolve")
    rs.add_argument("attempt", help="attempt ID")
    g = rs.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--succeeded",
        dest="outcome",
        action="store_const",
        const="succeeded",
        help="the effect was applied",
    )
    g.add_argument(
        "--failed",
        dest="outcome",
        action="store_const",
        const="failed",
        help="the effect was not applied, or applied as a failure",
    )
    g.add_argument(
        "--written-off",
        dest="outcome",
        action="store_const",
        const="written_off",
        help="nobody can know: settle at the full hold",
    )
    rs.add_argument(
        "--cost",
        action=_Costs,
        type=_amount,
        default={},
        metavar="UNIT=AMOUNT",
        help="actual cost in the unit's smallest step, 0 to 2^63-1 (repeatable, once per unit)",
    )
    rs.add_argument("--evidence", required=True, help="what you saw, and where")
    ru = add("resume")
    ru.add_argument("run", help="run ID")
    ru.add_argument("--segment", required=True, help="the segment to continue as")
    st = add("stop")
    st.add_argument("run", help="run ID")
    st.add_argument("--reason", default="stopped", help="why, recorded on the run and audited")
    lk = add("link")
    lk.add_argument("run", help="the ended run to follow")
    lk.add_argument("--segment", required=True, help="a segment ID for the new run's owner")
    rl = add("raise-limit")
    rl.add_argument("mission", help="mission ID")
    rl.add_argument(
        "limit",
        type=_amount,
        metavar="UNIT=LIMIT",
        help="the unit's new limit, in its smallest step (0 to 2^63-1)",
    )
    ap = _paged(add("approvals"), "apr")
    ap.add_argument("--run", help="only approvals of this run")
    ap.add_argument("--pending", action="store_true", help="only pending ones")
    av = add("approve")
    av.add_argument("approval", help="approval ID")
    av.add_argument("--deny", action="store_true", help="deny instead of approving")
    ic = _paged(add("incidents"), "inc")
    ic.add_argument("mission", help="mission ID")
    ic.add_argument("--open", action="store_true", help="only open incidents")
    ci = add("close-incident")
    ci.add_argument("incident", help="incident ID")
    ci.add_argument("--note", required=True, help="why it is safe to go on")
    lg = add("ledger")
    lg.add_argument("mission", help="mission ID")
    au = add("audit")
    au.add_argument("action", choices=["verify"], help="'verify' recomputes every chain")
    au.add_argument("--mission", help="only this mission's chain")
    return p


def _principal(engine: Engine) -> Principal:
    from charter.errors import AuthenticationError

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


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) if r.get(c) is not None else "-" for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _listing(
    args: argparse.Namespace, rows: list[dict[str, Any]], key: str, columns: Sequence[str]
) -> tuple[dict[str, Any], str]:
    """One page: ``{"items": [...], "next": CURSOR | null}`` and its table.

    Handlers read one row more than the page: the page after exists when it came.
    ``next`` is the last row's keyset position, ``TIME:ID``.
    """
    page = rows[: args.limit]
    after = f"{page[-1][key]}:{page[-1]['id']}" if len(rows) > args.limit else None
    text = _table(page, columns)
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
    found = engine.runs(args.mission, limit=args.limit + 1, after=args.after)
    rows = [r.to_dict() for r in found]
    return _listing(
        args, rows, "created_at_us", ["id", "mission_id", "status", "epoch", "owner_segment"]
    )


def _show(engine: Engine, args: argparse.Namespace) -> Any:
    state = engine.coordinator.state(args.run).to_dict()
    linked = f"linked from: {state['linked_from']}\n" if state["linked_from"] else ""
    text = (
        f"run {state['run_id']}  status {state['status']}  epoch {state['epoch']}  "
        f"owner {state['owner_segment']}  contract v{state['contract_version']}\n"
        f"reason: {state['status_reason'] or '-'}\n{linked}"
        f"nodes:\n{_table(state['nodes'], ['node_id', 'execution', 'status', 'crashes'])}\n"
        f"unresolved attempts:\n"
        f"{_table(state['attempts'], ['id', 'adapter', 'operation', 'status', 'reason'])}\n"
        f"settled: {state['settled_counts'] or '{}'}"
    )
    return state, text


def _attempts(engine: Engine, args: argparse.Namespace) -> Any:
    found = engine.attempts(
        run_id=args.run,
        mission_id=args.mission,
        unresolved=args.unresolved,
        limit=args.limit + 1,
        after=args.after,
    )
    rows = [a.to_dict() for a in found]
    columns = ["id", "run_id", "adapter", "operation", "status", "estimate", "actual"]
    return _listing(args, rows, "prepared_at_us", columns)


def _recover(engine: Engine, args: argparse.Namespace) -> Any:
    from charter import RunStatus
    from charter.errors import RunTerminal

    by = _principal(engine) if args.force else None
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
    attempt = engine.attempt(args.attempt)
    adapter = engine.config.load_adapter(attempt.adapter)
    evidence = engine.coordinator.reconcile(args.attempt, adapter, segment_id=args.segment)
    after = engine.attempt(args.attempt)
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
        args.attempt, by=_principal(engine), evidence_id=args.evidence_id
    )
    return attempt.to_dict(), f"attempt {attempt.id} settled {attempt.status.value}"


def _resolve(engine: Engine, args: argparse.Namespace) -> Any:
    attempt = engine.coordinator.resolve(
        args.attempt,
        by=_principal(engine),
        outcome=args.outcome,
        evidence=args.evidence,
        cost=args.cost,
    )
    return attempt.to_dict(), (
        f"attempt {attempt.id} resolved {attempt.status.value} at {attempt.actual}"
    )


def _resume(engine: Engine, args: argparse.Namespace) -> Any:
    by = None
    if os.environ.get("CHARTER_CREDENTIAL") or os.environ.get("CHARTER_CREDENTIAL_FILE"):
        by = _principal(engine)
    executor = engine.coordinator.resume(args.run, args.segment, by=by)
    result = executor.execute()
    run = engine.run(args.run)
    return (
        {"run_id": run.id, "status": run.status.value, "epoch": run.epoch, "result": result},
        f"run {run.id} {run.status.value} (epoch {run.epoch})",
    )


def _stop(engine: Engine, args: argparse.Namespace) -> Any:
    run = engine.stop_run(args.run, by=_principal(engine), reason=args.reason)
    unresolved = len(engine.attempts(run_id=run.id, unresolved=True))
    text = f"run {run.id} {run.status.value}"
    if unresolved:
        text += (
            f"; it ends stopped once its {unresolved} attempt(s) in flight settle "
            "(`charter attempts --run RUN --unresolved`)"
        )
    return {**run.to_dict(), "unresolved": unresolved}, text


def _link(engine: Engine, args: argparse.Namespace) -> Any:
    from charter.errors import StateError

    if engine.coordinator.state(args.run).plan is None:
        raise StateError(
            f"run {args.run} records no plan to run again; start the linked run from Python "
            "with Engine.new_linked_run(..., plan=...)",
            run_id=args.run,
        )
    executor = engine.new_linked_run(
        args.run, reviewed_by=_principal(engine), segment_id=args.segment
    )
    result = executor.execute()
    run = engine.run(executor.run_id)
    return (
        {"run_id": run.id, "linked_from": args.run, "status": run.status.value, "result": result},
        f"run {run.id} (linked from {args.run}) {run.status.value}",
    )


def _raise_limit(engine: Engine, args: argparse.Namespace) -> Any:
    unit, limit = args.limit
    version = engine.raise_limit(args.mission, unit, limit, by=_principal(engine))
    balance = engine.balances(args.mission)[unit]
    paused = [r.id for r in engine.runs(args.mission) if r.status.value == "paused"]
    data = {
        "mission_id": args.mission,
        "contract_version": version,
        "unit": unit,
        "balance": balance.__dict__,
        "paused_runs": paused,
    }
    text = f"{unit} limit {limit} (contract v{version}); {balance.available} available"
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
    status = engine.approve(args.approval, by=_principal(engine), deny=args.deny)
    return {"approval_id": args.approval, "status": status.value}, f"{args.approval} {status}"


def _incidents(engine: Engine, args: argparse.Namespace) -> Any:
    rows = engine.incidents(
        args.mission, open_only=args.open, limit=args.limit + 1, after=args.after
    )
    return _listing(args, rows, "opened_at_us", ["id", "kind", "status", "attempt_id", "closed_by"])


def _close_incident(engine: Engine, args: argparse.Namespace) -> Any:
    engine.close_incident(args.incident, by=_principal(engine), note=args.note)
    return {"incident_id": args.incident, "status": "closed"}, f"{args.incident} closed"


def _ledger(engine: Engine, args: argparse.Namespace) -> Any:
    balances = engine.balances(args.mission)
    problems = engine.check_ledger(args.mission)
    rows = [{"unit": u, **b.__dict__} for u, b in balances.items()]
    text = _table(rows, ["unit", "limit", "available", "held", "spent", "overrun"])
    text += "\nledger check: " + ("ok" if not problems else "; ".join(problems))
    return {"mission_id": args.mission, "balances": rows, "problems": problems}, text


def _audit(engine: Engine, args: argparse.Namespace) -> Any:
    from charter.errors import AuditError

    results = engine.verify_audit(args.mission)
    rows = [v.to_dict() for v in results]
    text = _table(rows, ["mission_id", "events", "ok", "broken_at", "problem"])
    if not all(v.ok for v in results):
        bad = [v for v in results if not v.ok]
        raise AuditError(
            f"audit chain broken: {bad[0].mission_id} at event {bad[0].broken_at} "
            f"({bad[0].problem})",
            chains=rows,
        )
    return rows, text


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
}


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(text)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        _merge(args)
    except UsageError as exc:
        return _fail("--json" in argv, exc)
    try:
        return _run(args)
    except CharterError as exc:
        return _fail(args.json, exc)
    except (Fenced, Blocked) as signal:
        return _fail(args.json, signal)


def _run(args: argparse.Namespace) -> int:
    if args.command == "credential":
        from charter.principals import new_credential

        credential, digest = new_credential(args.name)
        _emit(
            args,
            {"name": args.name, "credential": credential, "digest": digest},
            f"credential (give it to {args.name}; shown once): {credential}\n"
            f'configure under [credentials]:  {args.name} = "{digest}"',
        )
        return 0
    if args.command == "demo":
        from charter.demo import run_demo

        return run_demo(store=args.store, as_json=args.json)
    from charter.config import EngineConfig
    from charter.engine import Engine

    config = EngineConfig.from_file(args.config) if args.config else EngineConfig.discover()
    with Engine.open(args.store, config=config, create=False) as engine:
        data, text = HANDLERS[args.command](engine, args)
    _emit(args, data, text)
    return 0


def _fail(as_json: bool, error: BaseException) -> int:
    """Print one error (``{"error": {"code", "message", ...}}`` under ``--json``); the
    exit status is 2 for a malformed command line, 1 for anything else."""
    if isinstance(error, CharterError):
        data = error.to_dict()
    else:
        data = {"code": SIGNAL_CODES[type(error)], "message": str(error)}
    if as_json:
        print(json.dumps({"error": data}, default=str))
    else:
        print(f"error: {data['message']}", file=sys.stderr)
    return 2 if isinstance(error, UsageError) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
