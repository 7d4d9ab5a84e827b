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
import contextlib
import io
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from charter import Blocked, CharterError, Fenced
from charter.cli.gateway import COMMANDS as GATEWAY_COMMANDS
from charter.cli.gateway import gateway_arguments
from charter.cli.graphs import COMMANDS as GRAPH_COMMANDS
from charter.cli.graphs import add_arguments as graph_arguments
from charter.cli.work import COMMANDS as WORK_COMMANDS
from charter.cli.work import add_arguments as work_arguments
from charter.errors import UsageError

#: Where a listing's page starts: after (time in µs, id) of the last row shown.
Position = tuple[int, str]

#: The codes of the signals a command can end in, besides every ``CharterError.code``.
SIGNAL_CODES: dict[type[BaseException], str] = {
    Fenced: "fenced",
    Blocked: "blocked",
    KeyboardInterrupt: "interrupted",
}

PAGE = 50  # rows of a listing unless --limit says otherwise
MAX_PAGE = 1000  # a page's rows are held in memory: this bounds them
_INT64 = 2**63 - 1  # amounts (A9) and times are 64-bit integers in the store

#: Every command with its one-line help; ``docs/cli.md`` documents each one.
COMMANDS: dict[str, str] = {
    "demo": "run the built-in example mission on the embedded SQLite store",
    "credential": "make a new credential for a principal (prints the secret once)",
    "sandbox": "serve the payments sandbox on loopback, to run adapters and missions against",
    "missions": "list missions",
    "runs": "list runs",
    "show": "show a run: status, epoch, owner, nodes, unresolved attempts",
    "attempts": "list attempts",
    "search": "find runs and attempts by an effect key, a request value or an ID prefix",
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
    "serve": "serve the HTTP API, the web console and metrics (extra charter[server])",
    **GRAPH_COMMANDS,
    **WORK_COMMANDS,
    **GATEWAY_COMMANDS,
    "audit": "verify the audit hash chains, read the audit log, or show this store's identity",
    "export": "write a mission's signed snapshot (--handover: hand it to another store)",
    "import": "verify a snapshot and file its mission, read-only",
    "handoff": "the handoff report of a snapshot file or a mission (a view, never importable)",
    "adopt": "accept a mission handed over to this store and follow its runs",
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


def _port(text: str) -> int:
    value = _whole(text, 0, 65_535)
    if value is None:
        raise argparse.ArgumentTypeError(f"takes a port from 0 to 65535, got {text!r}")
    return value


def _workers(text: str) -> int:
    value = _whole(text, 1, 64)
    if value is None:
        raise argparse.ArgumentTypeError(f"takes 1 to 64 worker processes, got {text!r}")
    return value


def _bytes(text: str) -> int:
    value = _whole(text, 1, 2**31)
    if value is None:
        raise argparse.ArgumentTypeError(f"takes a size in bytes from 1 to 2^31, got {text!r}")
    return value


def _seq(text: str) -> int:
    value = _whole(text, 1, _INT64)
    if value is None:
        raise argparse.ArgumentTypeError(f"takes an event's seq, 1 or more, got {text!r}")
    return value


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
    commands = {
        name: sub.add_parser(name, help=line, description=line, parents=[command_options])
        for name, line in COMMANDS.items()
    }
    _looking(commands)
    _recovering(commands)
    _deciding(commands)
    graph_arguments(commands)
    work_arguments(commands)
    gateway_arguments(commands)
    return p


def _looking(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    """The commands that only read (and ``credential``, which touches no store)."""
    cmd["credential"].add_argument("action", choices=["new"], help="'new' makes a fresh credential")
    cmd["credential"].add_argument("name", help="the principal's name")
    _serving(cmd["sandbox"])
    cmd["serve"].add_argument("--host", default="127.0.0.1", help="address (default loopback)")
    cmd["serve"].add_argument("--port", type=_port, default=8765, help="port (default 8765)")
    cmd["serve"].add_argument(
        "--workers", type=_workers, default=1, help="server processes over the store (default 1)"
    )
    cmd["serve"].add_argument(
        "--max-body", type=_bytes, default=None, help="largest request body, bytes (default 1 MiB)"
    )
    _paged(cmd["missions"], "msn")
    r = _paged(cmd["runs"], "run")
    r.add_argument("--mission", help="only runs of this mission")
    r.add_argument("--status", help="only runs in this status (active, paused, completed, ...)")
    se = cmd["search"]
    se.add_argument("text", help="an effect key, a request value (invoice, payee...), an ID")
    se.add_argument("--limit", type=_limit, metavar="N", help="matches per page (default 50)")
    se.add_argument("--before", metavar="ATTEMPT", help="the older window a page printed")
    cmd["show"].add_argument("run", help="run ID")
    a = _paged(cmd["attempts"], "att")
    a.add_argument("--run", help="only attempts of this run")
    a.add_argument("--mission", help="only attempts of this mission")
    a.add_argument("--unresolved", action="store_true", help="only PREPARED/DISPATCHED/UNKNOWN")
    ap = _paged(cmd["approvals"], "apr")
    ap.add_argument("--run", help="only approvals of this run")
    ap.add_argument("--pending", action="store_true", help="only pending ones")
    ic = _paged(cmd["incidents"], "inc")
    ic.add_argument("mission", help="mission ID")
    ic.add_argument("--open", action="store_true", help="only open incidents")
    cmd["ledger"].add_argument("mission", help="mission ID")
    cmd["audit"].add_argument(
        "action",
        choices=["verify", "log", "identity"],
        help="'verify' recomputes every chain; 'log' shows the newest page of events; "
        "'identity' prints the store id and public key",
    )
    cmd["audit"].add_argument("--mission", help="only this mission's chain")
    cmd["audit"].add_argument("--run", help="log: only the events about this run")
    cmd["audit"].add_argument(
        "--limit", type=_limit, metavar="N", help="log: events per page (default 50)"
    )
    cmd["audit"].add_argument(
        "--before", type=_seq, metavar="SEQ", help="log: the older page (the `next` printed)"
    )
    cmd["audit"].add_argument(
        "--key", action="store_true", help="also check the signed checkpoints of the chain heads"
    )
    _snapshotting(cmd)


def _snapshotting(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    """export, import, handoff, adopt (S2-S5)."""
    cmd["export"].add_argument("mission", help="mission ID")
    cmd["export"].add_argument("-o", "--output", required=True, help="a new file to write")
    cmd["export"].add_argument(
        "--handover",
        metavar="STORE_ID",
        help="fence the mission here and hand it to that store (`charter audit identity` there)",
    )
    cmd["import"].add_argument("file", help="a snapshot file")
    cmd["handoff"].add_argument("source", metavar="FILE|MISSION", help="a snapshot or a mission")
    cmd["adopt"].add_argument("mission", help="the mission handed over to this store")
    cmd["adopt"].add_argument("--segment", required=True, help="a segment ID for the new runs")


def _serving(sb: argparse.ArgumentParser) -> None:
    """``charter sandbox``: where it listens and keeps its state."""
    sb.add_argument("--port", type=_port, default=0, help="port on 127.0.0.1 (default: any free)")
    sb.add_argument(
        "--data",
        default=".charter/sandbox.db",
        metavar="FILE",
        help="the sandbox's own SQLite file (default .charter/sandbox.db)",
    )
    sb.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")


def _recovering(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    """recover, reconcile, confirm, resolve, resume (R1-R9)."""
    rc = cmd["recover"]
    rc.add_argument("run", help="run ID")
    rc.add_argument("--segment", required=True, help="a new segment ID for this continuation")
    rc.add_argument(
        "--force", action="store_true", help="take over a live lease (audited; needs 'stop')"
    )
    cmd["reconcile"].add_argument("attempt", help="attempt ID")
    cmd["reconcile"].add_argument(
        "--segment",
        help="the segment `charter recover` installed: lets a keyed operation be replayed as it",
    )
    cmd["confirm"].add_argument("attempt", help="attempt ID")
    cmd["confirm"].add_argument(
        "--evidence-id", help="which recorded evidence (default: the latest)"
    )
    rs = cmd["resolve"]
    rs.add_argument("attempt", help="attempt ID")
    g = rs.add_mutually_exclusive_group(required=True)
    for outcome, meaning in (
        ("succeeded", "the effect was applied"),
        ("failed", "the effect was not applied, or applied as a failure"),
        ("written_off", "nobody can know: settle at the full hold"),
    ):
        option = "--" + outcome.replace("_", "-")
        g.add_argument(option, dest="outcome", action="store_const", const=outcome, help=meaning)
    rs.add_argument(
        "--cost",
        action=_Costs,
        type=_amount,
        default={},
        metavar="UNIT=AMOUNT",
        help="actual cost in the unit's smallest step, 0 to 2^63-1 (repeatable, once per unit)",
    )
    rs.add_argument("--evidence", required=True, help="what you saw, and where")
    rs.add_argument(
        "--confirm-above-hold",
        action="store_true",
        help="a cost more than 10 times the attempt's hold is meant (an overrun incident, L5)",
    )
    cmd["resume"].add_argument("run", help="run ID")
    cmd["resume"].add_argument(
        "--segment",
        help="the segment to continue as, in this process; without it, a run workers carry "
        "is given a go-ahead and the next worker continues it",
    )
    for name in ("confirm", "resolve"):
        cmd[name].epilog = (
            f"Who decides: the principal whose credential CHARTER_CREDENTIAL holds "
            f"(NAME:SECRET), or the file CHARTER_CREDENTIAL_FILE names; {name} needs "
            f"the 'resolve' right on the attempt's scope, and is recorded under that "
            f"name. Without one it is refused (unauthenticated) and nothing changes."
        )
    cmd["resume"].epilog = (
        "Who resumes: with CHARTER_CREDENTIAL (NAME:SECRET) or CHARTER_CREDENTIAL_FILE "
        "set, that principal (it needs 'run' in the mission; the 'human' resume mode "
        "requires one); without, the engine itself, where the resume policy allows. "
        "A run workers carry needs no --segment: resume gives it a go-ahead (recorded "
        "under that principal) and a worker continues it."
    )


def _deciding(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    """stop, link, raise-limit, approve, close-incident: a principal's decisions."""
    cmd["stop"].add_argument("run", help="run ID")
    cmd["stop"].add_argument(
        "--reason", default="stopped", help="why, recorded on the run and audited"
    )
    cmd["link"].add_argument("run", help="the ended run to follow")
    cmd["link"].add_argument(
        "--segment", required=True, help="a segment ID for the new run's owner"
    )
    cmd["raise-limit"].add_argument("mission", help="mission ID")
    cmd["raise-limit"].add_argument(
        "limit",
        type=_amount,
        metavar="UNIT=LIMIT",
        help="the unit's new limit, in its smallest step (0 to 2^63-1)",
    )
    cmd["approve"].add_argument("approval", help="approval ID")
    cmd["approve"].add_argument("--deny", action="store_true", help="deny instead of approving")
    cmd["close-incident"].add_argument("incident", help="incident ID")
    cmd["close-incident"].add_argument("--note", required=True, help="why it is safe to go on")


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(text)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``charter`` command: its exit status. Whatever goes wrong ends in one
    error line (one JSON object under ``--json``), never a traceback; a reader
    that stops reading (``charter runs | head -1``) ends it quietly."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _command(argv)
        finally:
            sys.stdout.flush()  # here, not at exit, where a closed pipe would print a traceback
    except BrokenPipeError:
        return _pipe_closed()


def _command(argv: list[str]) -> int:
    as_json = "--json" in argv
    try:
        args = _parser().parse_args(argv)
        _merge(args)
        as_json = args.json
        return _run(args)
    except BrokenPipeError:
        raise
    except (Exception, Fenced, Blocked, KeyboardInterrupt) as exc:
        # Beyond the engine's own errors: a plan, an adapter or the environment
        # failed in a way Charter did not foresee (:data:`UNEXPECTED`).
        status = _fail(as_json, exc)
        return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else status


#: The exit status of a command interrupted by Ctrl-C (128 + SIGINT), and of one
#: whose reader closed its output (128 + SIGPIPE), as a shell reports those signals.
INTERRUPTED = 130
PIPE_CLOSED = 141

#: The code of an error that is no :class:`CharterError` nor a signal: a bug.
UNEXPECTED = "unexpected_error"


def _pipe_closed() -> int:
    """Nothing more can be printed: send what is still buffered nowhere, quietly."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
                os.dup2(devnull, stream.fileno())
        os.close(devnull)
    return PIPE_CLOSED


def _run(args: argparse.Namespace) -> int:
    if args.command == "credential":
        from charter import new_credential  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

        credential, digest = new_credential(args.name)
        _emit(
            args,
            {"name": args.name, "credential": credential, "digest": digest},
            f"credential (give it to {args.name}; shown once): {credential}\n"
            f'configure under [credentials]:  {args.name} = "{digest}"',
        )
        return 0
    if args.command == "sandbox":
        return _sandbox(args)
    if args.command == "gateway":
        from charter.cli.gateway import run_gateway  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

        return run_gateway(args)
    if args.command == "demo":
        from charter.cli.demo import run_demo  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

        return run_demo(store=args.store, as_json=args.json)
    from charter import Engine, EngineConfig  # noqa: PLC0415 - loaded when run: `charter --help` starts fast
    from charter.cli.commands import HANDLERS  # noqa: PLC0415 - loaded when run: `charter --help` starts fast
    from charter.cli.finding import HANDLERS as FINDING  # noqa: PLC0415 - loaded when run: `charter --help` starts fast
    from charter.cli.graphs import HANDLERS as GRAPHS  # noqa: PLC0415 - loaded when run: `charter --help` starts fast
    from charter.cli.work import HANDLERS as WORK  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

    config = EngineConfig.from_file(args.config) if args.config else EngineConfig.discover()
    with Engine.open(args.store, config=config, create=False) as engine:
        data, text = {**HANDLERS, **GRAPHS, **WORK, **FINDING}[args.command](engine, args)
    _emit(args, data, text)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the sandbox as Ctrl-C does."""
    raise KeyboardInterrupt


def _sandbox(args: argparse.Namespace) -> int:
    """Serve until interrupted; the first line printed says where (the port may be any)."""
    from charter.sandbox import Sandbox  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

    Path(args.data).parent.mkdir(parents=True, exist_ok=True)
    box = Sandbox(args.data, port=args.port, api_key=args.api_key)
    where = {"url": box.url, "data": args.data}
    print(  # one line, so a script can read where before the first request
        json.dumps(where)
        if args.json
        else f"payments sandbox listening on {box.url} (state in {args.data}); Ctrl-C stops it",
        flush=True,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        box.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        box.stop()
    return 0


def _fail(as_json: bool, error: BaseException) -> int:
    """Print one error (``{"error": {"code", "message", ...}}`` under ``--json``); the
    exit status is 2 for a malformed command line, 1 for anything else."""
    data = _error_data(error)
    if as_json:
        print(json.dumps({"error": data}, default=str))
    else:
        print("error: " + " ".join(str(data["message"]).split()), file=sys.stderr)
    return 2 if isinstance(error, UsageError) else 1


def _error_data(error: BaseException) -> dict[str, Any]:
    """An error as data: a Charter error's own; a signal's code, its run and what
    it names; anything else as :data:`UNEXPECTED`, its type and message only."""
    if isinstance(error, CharterError):
        return error.to_dict()
    for kind, code in SIGNAL_CODES.items():
        if isinstance(error, kind):
            names = ("run_id", "attempt_id", "wait_id", "epoch", "current_epoch")
            found = {n: getattr(error, n) for n in names if getattr(error, n, None) is not None}
            message = str(error) or "interrupted; what was committed stays committed"
            return {"code": code, "message": message, **found}
    return {
        "code": UNEXPECTED,
        "message": f"{type(error).__name__}: {error} (unexpected: a bug in Charter or in "
        "the code it loaded, a plan or an adapter; what was committed stays committed)",
        "type": type(error).__name__,
    }


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
