"""Plans that workers carry in the tests, importable by reference from any process.

A paying plan takes its sandbox's address from the run's input, so that a worker
in another process builds its own adapter for the same sandbox. Run as a worker
process::

    python tests/_worker_plans.py CONFIG.json

The configuration names the store, the credential digests, the worker's name,
its concurrency and poll interval, and the lease; the process runs a
:class:`charter.Worker` until SIGTERM and prints one JSON line when it starts.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import charter
from charter.adapters.http import HttpAdapter
from charter.sandbox import declaration

_ADAPTERS: dict[str, HttpAdapter] = {}
_BUILDING = threading.Lock()


def sandbox(url: str) -> HttpAdapter:
    """The payments adapter for the sandbox at ``url`` (one per process)."""
    with _BUILDING:
        if url not in _ADAPTERS:
            _ADAPTERS[url] = declaration(url, timeout_seconds=2.0).build()
        return _ADAPTERS[url]


def close() -> None:
    """Close every adapter the plans built (their connections)."""
    while _ADAPTERS:
        _ADAPTERS.popitem()[1].close()


@charter.node
def pay_all(ctx: charter.Context, value: dict[str, Any]) -> list[str]:
    """Pay each invoice of the input once; the receipts' payment ids."""
    adapter = sandbox(value["sandbox"])
    paid = []
    for invoice in value["invoices"]:
        request = {
            "amount": value["amount"],
            "currency": "usd",
            "payee": "acme",
            "reference": invoice,
        }
        paid.append(ctx.attempt(adapter, "pay", request, key=invoice))
    return [str(p) for p in paid]


@charter.node
def nap(ctx: charter.Context, value: Any) -> dict[str, Any]:
    ctx.sleep("nap", float(value.get("seconds", 1.0)))
    return {"slept": True}


@charter.node
def ask(ctx: charter.Context, value: Any) -> dict[str, Any]:
    return {"answer": ctx.ask("go", "Go on?", answer=str)}


@charter.node
def think(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    """Work for ``think_seconds`` without a word to the store, as a long computation
    does: meanwhile only the worker's lease keeper holds the run."""
    time.sleep(float(value["think_seconds"]))
    return value


@charter.node
def write_down(ctx: charter.Context, value: Any) -> dict[str, Any]:
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    (ctx.workspace / "notes.txt").write_text(str(value["text"]))
    return ctx.save("notes.txt")


@charter.node
def later(ctx: charter.Context, value: Any) -> Any:
    ctx.sleep("later", 60.0)
    return value


@charter.node(uses=("notes.txt",))
def read_back(ctx: charter.Context, value: Any) -> str:
    return (ctx.workspace / "notes.txt").read_text()


PAY = charter.Plan("pay", (pay_all,), ref="_worker_plans:PAY")
NAP = charter.Plan("nap", (nap,), ref="_worker_plans:NAP")
ASK = charter.Plan("ask", (ask,), ref="_worker_plans:ASK")
NAP_THEN_PAY = charter.Plan("nap-then-pay", (nap, pay_all), ref="_worker_plans:NAP_THEN_PAY")
THINK_THEN_PAY = charter.Plan(
    "think-then-pay", (think, pay_all), ref="_worker_plans:THINK_THEN_PAY"
)
NOTES = charter.Plan("notes", (write_down, later, read_back), ref="_worker_plans:NOTES")
PLANS = (PAY, NAP, ASK, THINK_THEN_PAY, NOTES)


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    # The worker's account of what it did, with the time, in its log file (stderr):
    # what a failed fleet test prints beside its assertion.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(levelname)s %(message)s"
    )
    engine = charter.Engine.open(
        config["store"],
        config=charter.EngineConfig(
            credentials=config["digests"],
            lease_seconds=config.get("lease_seconds", 2.0),
            send_deadline_seconds=config.get("send_deadline_seconds", 1.0),
            evidence_settles=config.get("evidence_settles", "auto"),
            resume="automatic",
        ),
    )
    adapters = [sandbox(config["sandbox"])] if config.get("sandbox") else []
    worker = charter.Worker(
        engine,
        PLANS,
        adapters=adapters,
        concurrency=config.get("concurrency", 2),
        poll_seconds=config.get("poll_seconds", 0.5),
        name=config["name"],
    )
    print(json.dumps({"started": config["name"]}), flush=True)
    worker.run()
    print(json.dumps({"stopped": config["name"], "counts": worker.counts}), flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
