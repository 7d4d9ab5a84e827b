"""F3, A8, X3 (item 6): a target's refusal of an older epoch's send is evidence, not a conflict.

An owner is frozen after the engine built its payment and before the bytes
left (a GC pause, a VM stall). Its lease ends; the next owner takes the run
over, finds the payment UNKNOWN, looks it up (nothing yet) and replays it
with the same key under the next epoch (A8): the target applies it. Then the
old owner wakes and its request goes out with the old epoch's fencing token;
the target refuses it before it looks at the key (409, exactly what F3 asks
of targets). That refusal proves only that *that request* was not applied:
it is kept as evidence and opens no incident, so the mission goes on.

Real processes, a real loopback payments server that checks the fence first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import charter
from _frozen_sender import FencedPayments
from charter.sandbox.server import POLL_SECONDS
from charter.testing import credential

LEASE_SECONDS = 2.0
CHILD = Path(__file__).with_name("_frozen_sender.py")
CONTRACT: dict[str, Any] = {
    "objective": "pay invoices",
    "principals": {"agent": {"run": ["payments.*"]}, "alice": ["resolve", "recover"]},
    "allowance": {"usd": 10_000},
}


class FenceFirst:
    """Payments by key, each fencing token checked before the key (the highest
    epoch seen per run wins); what it applied is its own record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.payments: dict[str, dict[str, Any]] = {}
        self.fences: dict[str, int] = {}
        self.refused: list[str] = []
        this = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                run_id, _, epoch = self.headers["X-Fencing-Token"].rpartition(":")
                status, answer = this.pay(self.headers["Idempotency-Key"], run_id, int(epoch), body)
                self.answer(status, answer)

            def do_GET(self) -> None:
                key = self.path.rpartition("/")[2]
                with this.lock:
                    found = this.payments.get(key)
                self.answer(404, {"error": "no such payment"}) if found is None else self.answer(
                    200, found
                )

            def answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self.thread.start()

    def pay(self, key: str, run_id: str, epoch: int, body: Any) -> tuple[int, Any]:
        with self.lock:
            if epoch < self.fences.get(run_id, 0):
                self.refused.append(key)
                return 409, {"error": "stale_fencing_token"}
            self.fences[run_id] = epoch
            if key not in self.payments:
                n = len(self.payments) + 1
                self.payments[key] = {"id": f"pay_{n}", "amount": body["amount"], "epoch": epoch}
            return 200, self.payments[key]

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target() -> Iterator[FenceFirst]:
    server = FenceFirst()
    yield server
    server.close()


def test_F3_A8_X3_item6_a_stale_epochs_refused_send_after_a_replay_opens_no_incident(
    tmp_path: Path, store_address: str, target: FenceFirst
) -> None:
    """Broken F3/X3 (item 6): the old owner's refused send "conflicts" with the
    replay's success, opens an incident and stops every admission on the mission."""
    pairs = {name: credential(name) for name in ("agent", "alice")}
    creds = {n: c for n, (c, _) in pairs.items()}
    digests = {n: d for n, (_, d) in pairs.items()}
    config = charter.EngineConfig(
        credentials=digests, lease_seconds=LEASE_SECONDS, send_deadline_seconds=LEASE_SECONDS
    )
    with charter.Engine.open(store_address, config=config) as engine:
        alice = engine.authenticate(creds["alice"])
        mission = engine.create_mission(CONTRACT, by=alice)
        cfg = tmp_path / "child.json"
        cfg.write_text(json.dumps({
            "store": store_address, "digests": digests, "credential": creds["agent"],
            "mission_id": mission, "target": target.url, "lease_seconds": LEASE_SECONDS,
        }))  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with subprocess.Popen(
            [sys.executable, str(CHILD), str(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        ) as child:  # fmt: skip
            try:
                told = _take_over_while_frozen(engine, alice, child, target)
            finally:
                if child.poll() is None:
                    child.kill()
        attempt_id = told["attempt_id"]
        assert told == {"event": "settled", "attempt_id": attempt_id, "status": "succeeded"}
        assert len(target.refused) == 1 and len(target.payments) == 1  # paid once
        attempt = engine.get_attempt(attempt_id)
        assert attempt.status is charter.AttemptStatus.SUCCEEDED and attempt.actual == {"usd": 300}
        late = [e for e in engine.evidence(attempt_id) if e["source"].startswith("late")]
        assert [(e["verdict"], e["epoch"], e["settled"]) for e in late] == [("not_applied", 1, 0)]
        assert engine.incidents(mission) == []  # nothing stops the mission
        assert engine.balances(mission)["usd"].spent == 300
        assert engine.check_ledger(mission) == []
        # Admissions go on: a new run pays its invoice.
        agent = engine.authenticate(creds["agent"])
        again = engine.start_run(mission, by=agent, segment_id="seg-9")
        more = again.perform(FencedPayments(target.url), "pay", {"amount": 5}, effect_key="inv-8")
        assert more.status is charter.AttemptStatus.SUCCEEDED and len(target.payments) == 2


def _take_over_while_frozen(
    engine: charter.Engine,
    alice: charter.Principal,
    child: subprocess.Popen[str],
    target: FenceFirst,
) -> dict[str, Any]:
    """While the child is frozen before its send: take its run over, replay the
    payment under epoch 2 and confirm it; then wake the child, whose epoch-1
    request the target refuses. Returns what the child said its send settled to."""
    assert child.stdout is not None and child.stdin is not None
    paused = json.loads(child.stdout.readline())
    assert paused["event"] == "paused" and paused["epoch"] == 1
    run_id, attempt_id = paused["run_id"], paused["attempt_id"]
    time.sleep(LEASE_SECONDS + 0.3)  # the frozen owner's lease ends
    # The next owner: takes over, looks up (nothing yet), replays with the key.
    engine.coordinator.recover(run_id, "seg-2", by=alice)
    payments = FencedPayments(target.url)
    found = engine.coordinator.reconcile(attempt_id, payments, by=alice, segment_id="seg-2")
    assert (found.verdict, found.source) == ("applied", "same-key replay")
    engine.coordinator.confirm(attempt_id, by=alice)
    assert target.payments[engine.get_attempt(attempt_id).idempotency_key]["epoch"] == 2
    # The old owner wakes: its epoch-1 request is refused before the key is looked at.
    child.stdin.write("go\n")
    child.stdin.flush()
    told: dict[str, Any] = json.loads(child.stdout.readline())
    assert child.wait(timeout=30) == 0
    return told
