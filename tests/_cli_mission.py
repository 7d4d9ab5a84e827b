"""A mission importable by a fresh ``charter`` process (used by test_cli.py).

The mail target is a file: each line is one message the target received,
keyed by our idempotency key, so a test can count what was really sent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import charter


class FileMail:
    name = "mail"
    operations: ClassVar[dict[str, charter.Operation]] = {
        "send": charter.Operation(charter.EffectClass.UNSAFE)
    }

    def __init__(self) -> None:
        self.outbox = Path(os.environ["CHARTER_TEST_OUTBOX"])

    def estimate(self, operation: str, request: Any) -> charter.Estimate:
        return charter.Estimate({"calls": 1}, "mail/flat")

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        send.check_deadline()
        with self.outbox.open("a") as f:
            f.write(json.dumps({"key": send.idempotency_key, "request": send.request}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return charter.Outcome.succeeded({"queued": True}, cost={"calls": 1}, receipt={"ok": 1})

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        keys = [json.loads(line)["key"] for line in self.outbox.read_text().splitlines()]
        if attempt.idempotency_key in keys:  # the target's answer to a send, as its log says
            return charter.Evidence.applied(
                charter.Outcome.succeeded(
                    {"queued": True}, cost={"calls": 1}, receipt={"log": "found"}
                )
            )
        return charter.Evidence.not_applied({"log": "no such message"})


def make_mail() -> FileMail:
    return FileMail()


MAIL = make_mail


@charter.node
def announce(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    ctx.attempt(make_mail(), "send", {"to": "team", "n": 1})
    return value


@charter.node
def remind(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    ctx.attempt(make_mail(), "send", {"to": "team", "n": 2})
    return {**value, "done": True}


plan = charter.Plan("announce", (announce, remind), ref="_cli_mission:plan")


# -- N6: a node whose environment is broken --------------------------------------------------

#: What the payments node reads from the operator's shell.
LEDGER_ACCOUNT = "CHARTER_TEST_LEDGER_ACCOUNT"


@charter.node
def pay_invoices(ctx: charter.Context, value: Any) -> dict[str, Any]:
    """Pays four invoices, then needs a variable the operator's shell may lack: a
    broken environment, not the world's answer (N6)."""
    for n in range(4):
        ctx.attempt(make_mail(), "send", {"invoice": n})
    account = os.environ[LEDGER_ACCOUNT]  # a KeyError when the shell lacks it
    ctx.attempt(make_mail(), "send", {"invoice": 4, "account": account})
    return {"paid": 5}


payments = charter.Plan("payments", (pay_invoices,), ref="_cli_mission:payments")


@charter.node
def ask_budget(ctx: charter.Context, value: Any) -> int:
    budget: int = ctx.ask("budget", "How many invoices may we pay?", answer=int)
    return budget


asking = charter.Plan("asking", (ask_budget,), ref="_cli_mission:asking")


def broken_mail() -> FileMail:
    """An adapter factory that fails as no Charter error: a bug in loaded code."""
    raise RuntimeError("MAIL_TOKEN is not set")
