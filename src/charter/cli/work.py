"""The ``charter`` commands of workers (K1): ``submit`` a run, run a ``worker``, list ``queues``.

``submit`` queues a run of a plan (by its ``module:attribute`` reference) for
whichever worker is free; ``worker`` is the long-running process that carries
runs on (SIGTERM stops it well, K4); ``queues`` shows what waits in each queue.
Like every handler, each returns the JSON-able data and the text.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from charter.cli.commands import Handler, principal, table
from charter.cli.graphs import parse_value
from charter.errors import UsageError

if TYPE_CHECKING:
    from charter import Engine

COMMANDS: dict[str, str] = {
    "submit": "queue a run of a plan for whichever worker is free",
    "worker": "carry submitted and due runs on until SIGTERM (takes over dead owners' runs)",
    "queues": "runs per queue: due now, held by a worker, waiting for a decision",
}


def add_arguments(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    s = cmd["submit"]
    s.add_argument("mission", help="mission ID")
    s.add_argument("plan", help="the plan's module:attribute reference")
    s.add_argument("--input", help="the run's input (JSON, or text)")
    s.add_argument("--queue", default="default", help="the queue (default: default)")
    w = cmd["worker"]
    w.add_argument(
        "--plan", action="append", required=True, help="module:attribute of a plan (repeatable)"
    )
    w.add_argument("--queue", action="append", help="a queue to take runs from (repeatable)")
    w.add_argument(
        "--adapter",
        action="append",
        default=[],
        help="module:attribute of an adapter to look lost answers up with (repeatable)",
    )
    w.add_argument("--concurrency", type=int, default=4, help="runs carried at once (default 4)")
    w.add_argument(
        "--poll", type=float, default=1.0, help="seconds between looks at the store at most"
    )
    w.add_argument("--name", help="the worker's name in logs and leases (default host-pid)")
    w.add_argument(
        "--escrow",
        action="append",
        default=[],
        metavar="UNIT=AMOUNT",
        help="lease a slice of each carried run's mission, per unit (repeatable; L10)",
    )


def _submit(engine: Engine, args: argparse.Namespace) -> Any:
    given = None if args.input is None else parse_value(args.input)
    run = engine.submit(
        args.mission, by=principal(engine), plan=args.plan, input=given, queue=args.queue
    )
    return run.to_dict(), f"run {run.id} queued in {args.queue!r}"


def _worker(engine: Engine, args: argparse.Namespace) -> Any:
    from charter import Worker  # noqa: PLC0415 - loaded when run: `charter --help` starts fast

    escrow = escrow_amounts(args.escrow)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = Worker(
        engine,
        args.plan,
        queues=args.queue or ["default"],
        adapters=args.adapter,
        concurrency=args.concurrency,
        poll_seconds=args.poll,
        name=args.name,
        escrow=escrow,
    )
    worker.run()
    return {"worker": worker.name, "counts": worker.counts}, (
        f"worker {worker.name} stopped: " + ", ".join(f"{k} {v}" for k, v in worker.counts.items())
    )


def escrow_amounts(given: list[str]) -> dict[str, int] | None:
    """``--escrow UNIT=AMOUNT`` options as a worker's escrow (``None``: none given);
    a malformed one is refused before anything starts."""
    if not given:
        return None
    amounts: dict[str, int] = {}
    for option in given:
        unit, sep, amount = option.partition("=")
        if not sep or not unit or not amount.strip().isdigit() or unit in amounts:
            raise UsageError(
                f"--escrow takes UNIT=AMOUNT, a whole amount in the unit's smallest step, "
                f"each unit once (e.g. --escrow usd_micros=50000); got {option!r}",
                field="escrow",
            )
        amounts[unit] = int(amount)
    return amounts


def _queues(engine: Engine, args: argparse.Namespace) -> Any:
    rows = engine.queues()
    text = table(rows, ["queue", "due", "held", "parked", "runs"]) if rows else "no queued runs"
    return {"queues": rows}, text


HANDLERS: dict[str, Handler] = {"submit": _submit, "worker": _worker, "queues": _queues}
