"""Eight worker processes on one store, paused and killed at random (A2, A4, F1-F3, L0, S1).

Each worker owns a run of one mission and pays its invoices through the
payments sandbox. A seeded schedule SIGSTOPs workers past their lease and
SIGCONTs them (a paused owner must find itself fenced and send nothing more),
and SIGKILLs some in the middle of their work. Then an operator recovers every
run that did not finish, reconciles what is uncertain by the sandbox's lookup
and confirms it. Checked against the store and the sandbox's own records: no
invoice paid twice, no attempt sent twice, the ledger spent what the sandbox
took and holds nothing, the audit chain verifies. The p99 of an attempt's wall
time, store waits included, is printed.

A failure prints its seed; ``CHARTER_CHAOS_SEED=<seed>`` replays the schedule.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import charter
from charter import AttemptStatus
from charter.cli.demo import payments_adapter
from charter.sandbox import Sandbox
from conftest import LONG, Principals

HERE = Path(__file__).resolve().parent
WORKERS = 8
INVOICES = 12 * (5 if LONG else 1)
LEASE = 2.0

CONTRACT = {
    "objective": "Pay the suppliers",
    "principals": {"agent": {"run": ["payments.*"]}, "alice": ["resolve", "stop", "run"]},
    "allowance": {"usd": 1_000_00 * (5 if LONG else 1)},
}


class Worker:
    def __init__(self, index: int, job: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_chaos_worker.py"), json.dumps({**job, "worker": index})],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # how it ended is its last event
            text=True,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)


def chaos(workers: list[Worker], rng: random.Random, kills: int) -> list[str]:
    """Pause and kill at random until every worker has ended; what was done."""
    done: list[str] = []
    while any(w.proc.poll() is None for w in workers):
        live = [i for i, w in enumerate(workers) if w.proc.poll() is None]
        i = rng.choice(live)
        roll = rng.random()
        if roll < 0.1 and kills:
            workers[i].signal(signal.SIGKILL)
            kills -= 1
            done.append(f"kill {i}")
        elif roll < 0.5:
            pause = rng.choice([0.2, LEASE * 1.5])  # a short pause, or one past the lease
            workers[i].signal(signal.SIGSTOP)
            time.sleep(pause)
            workers[i].signal(signal.SIGCONT)
            done.append(f"pause {i} {pause}s")
        time.sleep(rng.uniform(0.05, 0.3))
    return done


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_A2_A4_F2_L0_eight_workers_paused_and_killed_at_random_pay_each_invoice_once(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]], tmp_path: Path
) -> None:
    seed = int(os.environ.get("CHARTER_CHAOS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    config = charter.EngineConfig(
        credentials=creds[1], lease_seconds=LEASE, send_deadline_seconds=1
    )
    with (
        charter.Engine.open(store_address, config=config) as engine,
        Sandbox(tmp_path / "sandbox.db") as box,
    ):
        who = Principals(*creds, engine)
        mission = engine.create_mission(CONTRACT, by=who.alice)
        job = {
            "store": store_address,
            "digests": creds[1],
            "credential": creds[0]["agent"],
            "mission": mission,
            "url": box.url,
            "count": INVOICES,
            "lease_seconds": LEASE,
            "busy_timeout_seconds": 10.0,
        }
        workers = [Worker(i, job) for i in range(WORKERS)]
        schedule = chaos(workers, rng, kills=3)
        for w in workers:
            w.proc.wait(timeout=60)
            w.reader.join(timeout=10)
            if w.proc.stdout is not None:
                w.proc.stdout.close()
        operate(engine, who, mission, box)
        found = violations(engine, mission, box)
        seconds = sorted(e["seconds"] for w in workers for e in w.events if "seconds" in e)
        p99 = seconds[int(0.99 * (len(seconds) - 1))] if seconds else 0.0
        ends = Counter(next((e["end"] for e in w.events if "end" in e), "killed") for w in workers)
        print(f"seed {seed}: {len(seconds)} attempts, p99 {p99 * 1000:.0f} ms, ends {dict(ends)}")
        assert found == [], f"seed {seed} ({schedule}): " + "; ".join(found)


def operate(engine: charter.Engine, who: Principals, mission: str, box: Sandbox) -> None:
    """An operator settles every run the workers left: recover, reconcile, confirm."""
    with payments_adapter(box.url) as payments:
        for run in engine.runs(mission):
            if run.status.terminal:
                continue
            time.sleep(max(0.0, (run.lease_expires_us - engine.clock.now_us()) / 1e6) + 0.05)
            engine.coordinator.recover(run.id, "operator")
            for attempt in engine.attempts(run_id=run.id, unresolved=True):
                if attempt.status is AttemptStatus.UNKNOWN:
                    evidence = engine.coordinator.reconcile(attempt.id, payments, by=who.alice)
                    assert evidence.conclusive, evidence
                    engine.coordinator.confirm(attempt.id, by=who.alice)
            engine.stop_run(run.id, by=who.alice, reason="chaos over")


def violations(engine: charter.Engine, mission: str, box: Sandbox) -> list[str]:
    found: list[str] = []
    attempts = engine.attempts(mission_id=mission)
    keys = {a.idempotency_key for a in attempts}
    paid = [p for p in box.payments() if p["idempotency_key"] in keys]
    twice = [ref for ref, n in Counter(p["reference"] for p in paid).items() if n > 1]
    if twice:
        found.append(f"A4: paid twice {twice}")
    sends = Counter(
        r["idempotency_key"]
        for r in box.requests()
        if r["kind"] == "create" and r["idempotency_key"] in keys
    )
    if any(n > 1 for n in sends.values()):
        found.append(f"A2: sent twice {[k for k, n in sends.items() if n > 1]}")
    if [a.id for a in attempts if a.status.unresolved]:
        found.append("R7: attempts left unresolved")
    usd = engine.balances(mission)["usd"]
    if usd.spent != sum(p["amount"] for p in paid) or usd.held != 0:
        found.append(
            f"L0: spent {usd.spent}, held {usd.held}; the sandbox took {len(paid)} payments"
        )
    found += [f"L0: {p}" for p in engine.check_ledger(mission)]
    found += [f"S1: chain {v.chain} broken" for v in engine.verify_audit(mission) if not v.ok]
    return found
