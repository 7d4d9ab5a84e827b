"""The ``charter`` commands of graph runs: waits, artifacts, plan versions (N1-N3, W1).

``answer`` and ``signal`` satisfy a node's wait; ``wait`` sleeps until a run
has something that arrived (an answer, a signal, a timer); ``artifacts``
lists, verifies or fetches a run's artifacts; ``plan`` shows its plan
versions. Like every handler, each returns the JSON-able data and the text.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from charter.cli.commands import Handler, principal, table
from charter.errors import UsageError

if TYPE_CHECKING:
    from charter import Engine

#: How often ``charter wait`` looks for a run that is due.
POLL_SECONDS = 0.2


def parse_value(text: str) -> Any:
    """An answer as given: JSON when it reads as JSON (``3``, ``true``,
    ``{"a": 1}``), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answer(engine: Engine, args: argparse.Namespace) -> Any:
    wait = engine.answer(args.run, args.key, parse_value(args.value), by=principal(engine))
    data = wait.to_dict()
    return data, f"answered {args.key!r} of run {args.run}: the run is due for a resume"


def _signal(engine: Engine, args: argparse.Namespace) -> Any:
    payload = None if args.payload is None else parse_value(args.payload)
    heard = engine.signal(args.run, args.event, payload, by=principal(engine))
    return {"run_id": args.run, "event": args.event, "heard_by": heard}, (
        f"signalled {args.event!r} to run {args.run}: {len(heard)} wait(s) heard it"
    )


def _wait(engine: Engine, args: argparse.Namespace) -> Any:
    """Sleep until a run is due (or ``--timeout`` passes); the runs that are."""
    deadline = time.monotonic() + args.timeout
    while True:
        ready = [d for d in engine.due() if d["ready"] and args.run in (None, d["run_id"])]
        if ready or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    text = table(ready, ["run_id", "due_at_us"]) if ready else "nothing is due"
    return {"due": ready}, text


def _artifacts(engine: Engine, args: argparse.Namespace) -> Any:
    if args.fetch is not None:
        if args.output is None:
            raise UsageError("--fetch NAME needs -o DEST, where to write it")
        fetched = engine.fetch_artifact(args.run, args.fetch, args.output, by=principal(engine))
        return fetched, f"wrote {args.fetch} to {args.output} (sha256 {fetched.get('sha256')})"
    rows = engine.verify_artifacts(args.run) if args.verify else engine.artifacts(args.run)
    columns = ["name", "sha256", "size", *(["ok"] if args.verify else [])]
    return {"items": rows}, table([_short(r) for r in rows], columns)


def _plan(engine: Engine, args: argparse.Namespace) -> Any:
    versions = engine.plan_versions(args.run)
    rows = [
        {**v, "added": ", ".join(s.get("id", "?") for s in v.get("steps", []))} for v in versions
    ]
    text = table(rows, ["version", "added"]) if rows else "the plan as started; no change"
    return {"versions": versions}, text


def _short(row: Mapping[str, Any]) -> dict[str, Any]:
    digest = row.get("sha256")
    return {**row, "sha256": digest[:16] + "..." if isinstance(digest, str) else digest}


HANDLERS: dict[str, Handler] = {
    "answer": _answer,
    "signal": _signal,
    "wait": _wait,
    "artifacts": _artifacts,
    "plan": _plan,
}

COMMANDS: dict[str, str] = {
    "answer": "answer a node's question (a human-input wait) with a value",
    "signal": "send a named event to a run's nodes waiting for it",
    "wait": "sleep until a run has something due (an answer, a signal, a timer)",
    "artifacts": "list, verify (--verify) or fetch (--fetch NAME -o DEST) a run's artifacts",
    "plan": "a run's plan versions: the changes its nodes made",
}


def add_arguments(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    cmd["answer"].add_argument("run", help="run ID")
    cmd["answer"].add_argument("key", help="the wait's key, as the node named it")
    cmd["answer"].add_argument("value", help="the answer (JSON if it reads as JSON)")
    cmd["signal"].add_argument("run", help="run ID")
    cmd["signal"].add_argument("event", help="the event's name")
    cmd["signal"].add_argument("--payload", help="what comes with it (JSON if it reads as JSON)")
    cmd["wait"].add_argument("--run", help="only this run")
    cmd["wait"].add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="give up after (default 60)"
    )
    a = cmd["artifacts"]
    a.add_argument("run", help="run ID")
    a.add_argument("--verify", action="store_true", help="check each stored object's hash")
    a.add_argument("--fetch", metavar="NAME", help="write one artifact out (needs 'consume')")
    a.add_argument("-o", "--output", metavar="DEST", help="where --fetch writes")
    cmd["plan"].add_argument("run", help="run ID")
