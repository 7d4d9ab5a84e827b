"""A payments owner frozen between building a send and sending it (F3, X3 item 6).

Run as ``python _frozen_sender.py CONFIG.json``. The process starts a run and
pays one invoice to the fence-first target of ``test_fenced_refusal.py``
through :class:`FencedPayments`, which passes the engine's send-deadline
check, says ``paused`` and waits for ``go`` on stdin: a GC pause or a VM stall
after the request was built and before its bytes leave. Meanwhile the run is
taken over and the payment replayed under the next epoch; once woken, this
process's request goes out with the old epoch's fencing token and the target
refuses it. The process reports what its own send settled to, then exits.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import charter

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


class FencedPayments:
    """An adapter for a payments API that refuses a stale fencing token before it
    looks at the key (409, documented as nothing applied), deduplicates by key,
    and looks a payment up by key (absence proves nothing: no key is closed)."""

    name = "payments"
    operations: Mapping[str, charter.Operation] = {
        "pay": charter.Operation(charter.EffectClass.IDEMPOTENT_KEYED, 3_600)
    }

    def __init__(self, url: str, *, freeze: bool = False) -> None:
        self.url = url
        self.freeze = freeze

    def estimate(self, operation: str, request: Any) -> charter.Estimate:
        return charter.Estimate({"usd": int(request["amount"])}, "payments/amount")

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        send.check_deadline()  # the engine's last word before the bytes leave
        if self.freeze:
            self.freeze = False
            emit("paused", attempt_id=send.attempt_id, run_id=send.run_id, epoch=send.epoch)
            if sys.stdin.readline().strip() != "go":
                sys.exit(3)
        request = urllib.request.Request(
            f"{self.url}/payments",
            data=json.dumps(send.request).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": send.idempotency_key,
                "X-Fencing-Token": str(send.fencing_token),
            },
        )
        try:
            with _OPENER.open(request, timeout=10) as response:
                paid = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                raise charter.NotApplied(
                    "stale_fencing_token", evidence={"status": 409, "body": exc.read().decode()}
                ) from None
            raise
        return charter.Outcome.succeeded(
            paid, cost={"usd": int(paid["amount"])}, receipt={"payment": paid["id"]}
        )

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        key = attempt.idempotency_key
        try:
            with _OPENER.open(f"{self.url}/payments/by-key/{key}", timeout=10) as response:
                paid = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return charter.Evidence.indeterminate({"lookup": "no payment with this key yet"})
            raise
        outcome = charter.Outcome.succeeded(
            paid, cost={"usd": int(paid["amount"])}, receipt={"payment": paid["id"]}
        )
        return charter.Evidence.applied(outcome, detail={"lookup": "by key"})


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[1]).read_text())
    config = charter.EngineConfig(
        credentials=cfg["digests"],
        lease_seconds=cfg["lease_seconds"],
        send_deadline_seconds=cfg["lease_seconds"],
    )
    with charter.Engine.open(cfg["store"], config=config) as engine:
        agent = engine.authenticate(cfg["credential"])
        ex = engine.start_run(cfg["mission_id"], by=agent, segment_id="seg-1")
        target = FencedPayments(cfg["target"], freeze=True)
        try:
            invoice = {"invoice": "inv-7", "amount": 300}
            done = ex.perform(target, "pay", invoice, effect_key="inv-7")
        except charter.Fenced as exc:
            emit("fenced", current_epoch=exc.current_epoch)
        except charter.CharterError as exc:
            emit("refused", code=exc.code, message=exc.message)
        else:
            emit("settled", attempt_id=done.id, status=done.status.value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
