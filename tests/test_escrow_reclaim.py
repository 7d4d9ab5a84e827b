"""L10: money lent to slices never makes a run wait for a person.

An admission that neither its worker's slice nor the mission's own available
money covers goes through the mission's gate, which takes back what the
mission's slices did not use (returning them) when that covers it: the run is
admitted, as it would be without escrow. Only when the mission, lent money
included, cannot cover it does the run pause (L7).

Each test asserts on what the store recorded (runs, slices, balances, audit
events) and on what the target received: the recording adapter's sends, or
the payments sandbox's records with four real worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import charter
from charter.errors import AllowanceExceeded
from charter.runs.model import RunStatus
from charter.sandbox import Sandbox
from charter.testing import ManualClock, RecordingAdapter
from charter.workers.escrow import Escrow, slices
from conftest import Principals, default_contract

HERE = Path(__file__).resolve().parent
COSTS = {"read": {"calls": 1}}


def _refusals(engine: charter.Engine, mission: str) -> list[dict[str, Any]]:
    """The admissions refused on the mission, as audited (its slices' chains included)."""
    return [e for e in engine.audit_events(mission) if e["kind"] == "admission.refused"]


def test_L10_K5_item10_an_admission_short_at_the_gate_takes_back_what_slices_did_not_use(
    engine: charter.Engine, who: Principals
) -> None:
    """Two holders share a mission of 10 calls, 6 and 4 lent: the first holder's
    seventh read fits neither its slice nor the mission's own (nothing) and is
    admitted with the other holder's unused calls, taken back at the gate. Once
    no money is left anywhere, lent or not, the run pauses (L7)."""
    mission = engine.create_mission(default_contract(allowance={"calls": 10}), by=who.alice)
    first = engine.start_run(mission, by=who.agent, segment_id="s1")
    second = engine.start_run(mission, by=who.agent, segment_id="s2")
    adapter = RecordingAdapter(costs=COSTS)
    one = Escrow(engine, {"calls": 6}, holder="w1")
    two = Escrow(engine, {"calls": 6}, holder="w2")
    try:
        with one.lane(mission):
            for n in range(6):
                first.perform(adapter, "read", {"n": n}, effect_key=f"a{n}")
        with two.lane(mission):  # leased what was left: 4
            [lent] = [s for s in slices(engine, mission) if s["holder"] == "w2"]
            assert lent["accounts"]["calls"]["limit"] == 4
            second.perform(adapter, "read", {"n": 0}, effect_key="b0")
        assert engine.balances(mission)["calls"].available == 0  # all lent
        with one.lane(mission):
            seventh = first.perform(adapter, "read", {"n": 6}, effect_key="a6")
        assert seventh.status is charter.AttemptStatus.SUCCEEDED
        assert engine.run(first.run_id).status is RunStatus.ACTIVE
        back = {s["holder"]: s for s in slices(engine, mission) if s["status"] == "returned"}
        assert back["w2"]["returned_why"].startswith("reclaimed")
        assert engine.check_ledger(mission) == []
        # The other holder goes on through the gate, then leases afresh.
        with two.lane(mission):
            second.perform(adapter, "read", {"n": 1}, effect_key="b1")
            second.perform(adapter, "read", {"n": 2}, effect_key="b2")
        assert _refusals(engine, mission) == []
        assert engine.balances(mission)["calls"].available == 0
        # Nothing left, lent or not: the run pauses, as without escrow (L7).
        with one.lane(mission), pytest.raises(AllowanceExceeded):
            first.perform(adapter, "read", {"n": 7}, effect_key="a7")
        paused = engine.run(first.run_id)
        assert paused.status is RunStatus.PAUSED
        assert paused.status_reason == "allowance exhausted: calls needs 1, 0 available"
    finally:
        one.close()
        two.close()
    assert len(adapter.sent) == 10
    calls = engine.balances(mission)["calls"]
    assert (calls.spent, calls.held, calls.available) == (10, 0, 0)
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())


_CHILD = r"""
import json, sys
import charter
import _worker_plans as plans
config = json.loads(sys.argv[1])
engine = charter.Engine.open(config["store"], config=charter.EngineConfig(
    credentials=config["digests"], lease_seconds=config["lease_seconds"],
    send_deadline_seconds=2, evidence_settles="auto", resume="automatic"))
worker = charter.Worker(engine, plans.PLANS, adapters=[plans.sandbox(config["sandbox"])],
    poll_seconds=0.1, name=config["name"], escrow=config["escrow"])
print(json.dumps({"started": config["name"]}), flush=True)
worker.run()
engine.close()
"""

RUNS = 16
AMOUNT = 3_000  # cents: a slice of 10,000 pays three and lends 1,000 it cannot use


def test_L10_K5_item10_four_workers_on_a_tight_mission_pay_every_invoice_without_a_pause(
    tmp_path: Path, store_address: str, creds: Any, box: Sandbox
) -> None:
    """Four worker processes, each leasing a slice of 10,000 cents of a mission
    of exactly what its sixteen payments cost (48,000): each worker's fourth
    payment fits neither its slice nor the mission's own money, and is paid
    with what the others' slices did not use. No run pauses, every invoice is
    paid once, the books check clean throughout."""
    config = charter.EngineConfig(credentials=creds[1], lease_seconds=30, resume="automatic")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    box.fault("slow", times=10_000, seconds=0.15)  # payments in flight at once
    with charter.Engine.open(store_address, config=config) as engine:
        who = Principals(creds[0], creds[1], engine)
        contract = default_contract(
            principals={"agent": {"run": ["payments.*"]}, "alice": ["resolve", "stop"]},
            allowance={"usd_cents": RUNS * AMOUNT},
        )
        mission = engine.create_mission(contract, by=who.alice)
        children = []
        try:
            for n in range(4):
                child_config = {
                    "store": store_address,
                    "digests": creds[1],
                    "sandbox": box.url,
                    "lease_seconds": 30,
                    "name": f"w{n}",
                    "escrow": {"usd_cents": 10_000},
                }
                child = subprocess.Popen(
                    [sys.executable, "-c", _CHILD, json.dumps(child_config)],
                    cwd=HERE,
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert child.stdout is not None and "started" in child.stdout.readline()
                children.append(child)
            invoices = [f"inv-{n}" for n in range(RUNS)]
            runs = [
                engine.submit(
                    mission,
                    by=who.agent,
                    plan="_worker_plans:PAY",
                    input={"sandbox": box.url, "amount": AMOUNT, "invoices": [invoice]},
                ).id
                for invoice in invoices
            ]
            paused: list[tuple[str, str | None]] = []
            checks: list[list[str]] = []
            deadline = time.monotonic() + 90
            while True:
                now = [engine.run(r) for r in runs]
                paused += [(r.id, r.status_reason) for r in now if r.status is RunStatus.PAUSED]
                checks.append(engine.check_ledger(mission))
                if all(r.status is RunStatus.COMPLETED for r in now) or paused:
                    break
                assert time.monotonic() < deadline, [(r.status, r.status_reason) for r in now]
                time.sleep(0.05)
            assert paused == []
            assert checks and all(c == [] for c in checks)
            for child in children:
                child.send_signal(signal.SIGTERM)  # K4: every slice comes back
            for child in children:
                assert child.wait(30) == 0
        finally:
            for child in children:
                child.kill()
                child.wait(10)
                assert child.stdout is not None
                child.stdout.close()
        assert _refusals(engine, mission) == []
        # Every invoice paid once, by the sandbox's records.
        assert sorted(p["reference"] for p in box.payments()) == sorted(invoices)
        attempts = engine.attempts(mission_id=mission)
        assert [a.status.value for a in attempts] == ["succeeded"] * RUNS
        usd = engine.balances(mission)["usd_cents"]
        assert (usd.spent, usd.held, usd.available) == (RUNS * AMOUNT, 0, 0)
        # Every slice is back, and what each did not use was spent by another
        # worker: none of the 48,000 was left stranded in a slice.
        lent = slices(engine, mission)
        assert len({s["holder"] for s in lent}) > 1 and {s["status"] for s in lent} == {"returned"}
        whys = Counter(s["returned_why"].split(":")[0] for s in lent)
        print(f"\nslices of {len(lent)} leases returned: {dict(whys)}")
        assert engine.check_ledger(mission) == []
        assert all(v.ok for v in engine.verify_audit())


def test_L10_K5_item10_a_run_taken_over_while_the_money_is_lent_goes_on(
    make_engine: Any, creds: Any, clock: ManualClock
) -> None:
    """Every call of the mission is lent to a worker's slice (none of its own
    available): a run whose owner's lease ended is taken over and goes on, as
    without escrow; it is not paused as if its allowance were exhausted."""
    engine = make_engine(resume="automatic")
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(allowance={"calls": 10}), by=who.alice)
    adapter = RecordingAdapter(costs=COSTS)
    lost = engine.start_run(mission, by=who.agent, segment_id="lost")
    lost.perform(adapter, "read", {"n": 0}, effect_key="k0")
    carrier = engine.start_run(mission, by=who.agent, segment_id="carrier")
    with Escrow(engine, {"calls": 50}, holder="w1", lease_seconds=3_600) as escrow:
        with escrow.lane(mission):
            carrier.perform(adapter, "read", {"n": 0}, effect_key="c0")
        assert engine.balances(mission)["calls"].available == 0  # all lent
        clock.advance(engine.config.lease_seconds + 1)  # the lost segment's lease ends
        taken = engine.coordinator.resume(lost.run_id, "taker")
        assert engine.run(lost.run_id).status is RunStatus.ACTIVE
        attempt = taken.perform(adapter, "read", {"n": 1}, effect_key="k1")
        assert attempt.status is charter.AttemptStatus.SUCCEEDED
        assert [e for e in engine.audit_events(mission) if e["kind"] == "resume.refused"] == []
        assert engine.check_ledger(mission) == []
    assert [s.request for s in adapter.sent] == [{"n": 0}, {"n": 0}, {"n": 1}]
    calls = engine.balances(mission)["calls"]
    assert (calls.spent, calls.held, calls.available) == (3, 0, 7)
    assert engine.check_ledger(mission) == []
