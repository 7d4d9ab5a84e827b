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
        if attempt.idempotency_key in keys:
            return charter.Evidence.applied(
                charter.Outcome.succeeded(cost={"calls": 1}, receipt={"log": "found"})
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
