"""L10, escrow: a worker leases a slice of a mission's allowance and admits
against it without the mission's gate, and L0-L2, S1 hold at every instant.

Each test asserts on what the store recorded (balances, slices, which slice an
attempt's hold was taken from, the chains) and on what the adapter received.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import charter
from charter.errors import AllowanceExceeded, UsageError
from charter.testing import ManualClock, RecordingAdapter
from charter.workers.escrow import Escrow, slices, sweep
from conftest import Principals, default_contract

COSTS = {"read": {"usd": 1_000, "calls": 1}, "charge": {"usd": 20_000, "calls": 1}}


def _mission(engine: charter.Engine, who: Principals, **overrides: Any) -> str:
    return engine.create_mission(default_contract(**overrides), by=who.alice)


def _held_in(raw: Any) -> dict[str, str]:
    """Attempt -> the slice its hold was taken from, as stored."""
    return {r["attempt_id"]: r["slice_id"] for r in raw.rows("SELECT * FROM escrow_holds")}


def test_L10_L0_a_lent_slice_is_held_whole_in_the_missions_books(
    engine: charter.Engine, who: Principals
) -> None:
    mission = _mission(engine, who)
    before = engine.balances(mission)["usd"]
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as escrow:
        attempt = escrow.perform(ex, adapter, "read", {"n": 1}, effect_key="k1")
        assert attempt.status is charter.AttemptStatus.SUCCEEDED
        lent = slices(engine, mission)
        assert [s["status"] for s in lent] == ["open"]
        book = lent[0]["accounts"]["usd"]
        assert book == {
            "limit": 50_000,
            "available": 49_000,
            "held": 0,
            "spent": 1_000,
            "overrun": 0,
        }
        now = engine.balances(mission)["usd"]
        # The mission holds the whole grant: L0 at every instant, nothing spent yet.
        assert (now.available, now.held, now.spent) == (before.available - 50_000, 50_000, 0)
        assert engine.check_ledger(mission) == []
    after = engine.balances(mission)["usd"]
    assert (after.available, after.held, after.spent) == (before.available - 1_000, 0, 1_000)
    assert [s["returned_why"] for s in slices(engine, mission)] == ["released"]
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    assert [s.request for s in adapter.sent] == [{"n": 1}]


def test_L10_a_worker_never_admits_beyond_its_slice(
    engine: charter.Engine, who: Principals, raw: Any
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 2_500, "calls": 50}, holder="w1") as escrow:
        done = [escrow.perform(ex, adapter, "read", {"n": n}, effect_key=f"k{n}") for n in range(4)]
        held_in = _held_in(raw)
        lent = {x["id"]: x for x in slices(engine, mission)}
        # Two reads fit a slice of 2,500; the third went through the mission's gate
        # (the slice was short) and the worker leased afresh: never beyond a slice.
        assert [a.id in held_in for a in done][:3] == [True, True, False]
        for slice_id, book in lent.items():
            usd = book["accounts"]["usd"]
            assert usd["spent"] + usd["held"] <= usd["limit"] == 2_500
            assert sum(held_in[a.id] == slice_id for a in done if a.id in held_in) <= 2
        assert engine.check_ledger(mission) == []
    assert engine.balances(mission)["usd"].spent == 4_000
    assert len(adapter.sent) == 4


def test_L10_bad_escrow_amounts_are_refused_and_change_nothing(
    engine: charter.Engine, who: Principals
) -> None:
    mission = _mission(engine, who)
    for amounts in ({"usd": 0}, {}, {"usd": 1.5}, {"usd": -3}):
        with pytest.raises(UsageError):
            Escrow(engine, amounts, holder="w1")
    with pytest.raises(UsageError):
        Escrow(engine, {"usd": 5, "calls": 50}, holder="w1", lease_seconds=0)
    assert slices(engine, mission) == []


def test_L10_a_stop_reaches_a_worker_at_its_next_admission(
    engine: charter.Engine, who: Principals
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as escrow:
        escrow.perform(ex, adapter, "read", {"n": 0}, effect_key="k0")
        engine.stop_run(ex.run_id, by=who.alice, reason="enough")
        with pytest.raises(charter.errors.AdmissionRefused):
            escrow.perform(ex, adapter, "read", {"n": 1}, effect_key="k1")
        assert engine.check_ledger(mission) == []
    assert len(adapter.sent) == 1
    assert engine.run(ex.run_id).status.value in ("stopping", "stopped")


def test_L10_a_lowered_limit_revokes_every_slice_at_once(
    engine: charter.Engine, who: Principals, raw: Any
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 500_000, "calls": 50}, holder="w1") as escrow:
        escrow.perform(ex, adapter, "read", {"n": 0}, effect_key="k0")
        # Lower the limit below what the slice holds unused: the slice comes back first.
        engine.amend_contract(
            mission,
            default_contract(allowance={"usd": 100_000, "calls": 100}),
            by=who.alice,
            reason="budget cut",
        )
        [lent] = slices(engine, mission)
        assert lent["status"] == "returned" and lent["returned_why"].startswith("revoked")
        assert engine.balances(mission)["usd"].limit == 100_000
        # The worker's next attempt cannot go through the returned slice.
        second = escrow.perform(ex, adapter, "read", {"n": 1}, effect_key="k1")
        assert second.id not in _held_in(raw) or _held_in(raw)[second.id] != lent["id"]
        assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())


def _overbilled(send: Any) -> Any:
    """A read estimated at 1,000 and billed 9,000: an overrun (L5)."""
    return charter.Outcome.succeeded({"ok": True}, cost={"usd": 9_000, "calls": 1})


def test_L10_an_incident_reaches_every_worker_at_its_next_admission(
    make_engine: Callable[..., charter.Engine], who: Principals, engine: charter.Engine, raw: Any
) -> None:
    mission = _mission(engine, who)
    other = make_engine()
    ex1 = engine.start_run(mission, by=who.agent, segment_id="s1")
    ex2 = other.start_run(mission, by=other.authenticate(who.credentials["agent"]), segment_id="s2")
    cheap = RecordingAdapter(costs=COSTS)
    dear = RecordingAdapter(costs=COSTS, script={"read": _overbilled})
    with (
        Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as e1,
        Escrow(other, {"usd": 50_000, "calls": 50}, holder="w2") as e2,
    ):
        e1.perform(ex1, cheap, "read", {"n": 0}, effect_key="a0")
        e2.perform(ex2, cheap, "read", {"n": 0}, effect_key="b0")
        overrun = e1.perform(ex1, dear, "read", {"n": "dear"}, effect_key="a-dear")
        assert overrun.actual == {"usd": 9_000, "calls": 1}
        [incident] = raw.rows("SELECT * FROM incidents WHERE status = 'open'")
        assert incident["kind"] == "overrun"
        for escrow, ex, key in ((e2, ex2, "b1"), (e1, ex1, "a1")):
            with pytest.raises(AllowanceExceeded):
                escrow.perform(ex, cheap, "read", {"n": 1}, effect_key=key)
        assert engine.check_ledger(mission) == []
    assert [s.request for s in cheap.sent].count({"n": 1}) == 0
    usd = engine.balances(mission)["usd"]
    # The overrun is in the slice's books (its grant covered it), with its incident.
    assert (usd.spent, usd.held) == (11_000, 0)
    first = next(s for s in slices(engine, mission) if s["holder"] == "w1")
    assert first["accounts"]["usd"]["overrun"] == 8_000
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())


def test_L10_a_lapsed_slice_is_returned_by_whoever_next_touches_the_mission(
    engine: charter.Engine, who: Principals, clock: ManualClock
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    escrow = Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1", lease_seconds=5)
    escrow.perform(ex, adapter, "read", {"n": 0}, effect_key="k0")
    # The holder stalls (it never releases) and its lease lapses by the store's clock.
    clock.advance(6)
    ex2 = engine.start_run(mission, by=who.agent, segment_id="s2")
    ex2.perform(adapter, "read", {"n": 1}, effect_key="k1")  # through the mission's gate
    [lent] = slices(engine, mission)
    assert (lent["status"], lent["returned_why"]) == ("returned", "lapsed")
    usd = engine.balances(mission)["usd"]
    assert (usd.held, usd.spent) == (0, 2_000)
    assert engine.check_ledger(mission) == []
    assert sweep(engine, mission) == 0
    assert all(v.ok for v in engine.verify_audit())


def test_L10_S1_verify_checks_each_slice_chain_and_where_its_mission_ended_it(
    engine: charter.Engine, who: Principals, raw: Any
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as escrow:
        for n in range(3):
            escrow.perform(ex, adapter, "read", {"n": n}, effect_key=f"k{n}")
    [lent] = slices(engine, mission)
    events = raw.rows("SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq", lent["id"])
    assert events[0]["kind"] == "escrow.granted"
    assert sum(e["kind"] == "attempt.prepared" for e in events) == 3
    assert all(v.ok for v in engine.verify_audit())
    # A slice's event edited: its mission's verification reports it.
    raw.execute(
        "UPDATE audit_events SET actor = 'mallory' WHERE mission_id = ? AND seq = 2", lent["id"]
    )
    [found] = engine.verify_audit(mission)
    assert not found.ok and lent["id"] in (found.problem or "")
    raw.execute(
        "UPDATE audit_events SET actor = ? WHERE mission_id = ? AND seq = 2",
        events[1]["actor"],
        lent["id"],
    )
    assert all(v.ok for v in engine.verify_audit())
    # Its tail cut (and its row's head moved to match): the return on the mission's
    # chain recorded where it ended.
    last = events[-1]["seq"]
    raw.execute("DELETE FROM audit_events WHERE mission_id = ? AND seq = ?", lent["id"], last)
    raw.execute(
        "UPDATE escrow_slices SET audit_seq = ?, audit_hash = ? WHERE id = ?",
        last - 1,
        events[-2]["hash"],
        lent["id"],
    )
    bad = [v for v in engine.verify_audit() if not v.ok]
    assert bad and any("return" in (v.problem or "") for v in bad)


def test_L10_L0_L1_L2_hold_at_every_instant_under_concurrent_threads(
    make_engine: Callable[..., charter.Engine], who: Principals, engine: charter.Engine
) -> None:
    mission = _mission(engine, who, allowance={"usd": 200_000, "calls": 1_000})
    stop = threading.Event()
    seen: list[list[str]] = []
    errors: list[BaseException] = []

    def watch() -> None:
        while not stop.is_set():
            seen.append(engine.check_ledger(mission))

    engines = [make_engine() for _ in range(3)]

    def work(w: int) -> None:
        try:
            eng = engines[w]
            agent = eng.authenticate(who.credentials["agent"])
            ex = eng.start_run(mission, by=agent, segment_id=f"t{w}")
            adapter = RecordingAdapter(costs=COSTS)
            with Escrow(eng, {"usd": 7_000, "calls": 50}, holder=f"t{w}") as escrow:
                for n in range(25):
                    escrow.perform(ex, adapter, "read", {"n": n}, effect_key=f"k{n}")
            ex.finish()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [threading.Thread(target=work, args=(w,)) for w in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    watcher.join()
    assert errors == []
    assert seen and all(p == [] for p in seen)
    usd = engine.balances(mission)["usd"]
    assert (usd.held, usd.spent) == (0, 75 * 1_000)
    assert len(slices(engine, mission)) >= 3
    assert all(v.ok for v in engine.verify_audit())


_CHILD = r"""
import json, sys, time
import charter
from charter.testing import RecordingAdapter, kill_at
from charter.workers.escrow import Escrow
job = json.loads(sys.argv[1])
config = charter.EngineConfig(credentials=job["digests"], busy_timeout_seconds=60.0)
hook = kill_at("dispatch.after") if job["mode"] == "crash" else None
engine = charter.Engine.open(job["store"], config=config, crash_hook=hook)
agent = engine.authenticate(job["credential"])
ex = engine.start_run(job["mission"], by=agent, segment_id=job["segment"])
adapter = RecordingAdapter(costs={"read": {"usd": 1_000, "calls": 1}})
amounts = {"usd": job["slice"], "calls": 50}
escrow = Escrow(engine, amounts, holder=job["segment"], lease_seconds=job["lease"])
for n in range(job["tries"]):
    escrow.perform(ex, adapter, "read", {"n": n}, effect_key=f"k{n}")
escrow.close()
ex.finish()
print(json.dumps({"sent": len(adapter.sent)}))
"""


def _child(job: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(charter.__file__).parents[1])}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_L10_L0_L1_L2_hold_at_every_instant_under_concurrent_processes(
    engine: charter.Engine, who: Principals, store_address: str
) -> None:
    mission = _mission(engine, who, allowance={"usd": 100_000, "calls": 1_000})
    base = {
        "store": store_address,
        "mission": mission,
        "credential": who.credentials["agent"],
        "digests": who.digests,
        "slice": 6_000,
        "lease": 30,
        "tries": 20,
        "mode": "race",
    }
    procs = [_child({**base, "segment": f"p{n}"}) for n in range(3)]
    checks: list[list[str]] = []
    while any(p.poll() is None for p in procs):
        checks.append(engine.check_ledger(mission))
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert checks and all(c == [] for c in checks)
    usd = engine.balances(mission)["usd"]
    assert (usd.held, usd.spent) == (0, 60 * 1_000)
    assert sum(json.loads(o)["sent"] for o, _ in outs) == 60
    assert all(v.ok for v in engine.verify_audit())


def test_L10_L4_a_killed_holder_loses_no_hold(
    engine: charter.Engine, who: Principals, store_address: str, clock: ManualClock, raw: Any
) -> None:
    mission = _mission(engine, who)
    job = {
        "store": store_address,
        "mission": mission,
        "credential": who.credentials["agent"],
        "digests": who.digests,
        "slice": 20_000,
        "lease": 30,
        "tries": 1,
        "mode": "crash",
        "segment": "doomed",
    }
    child = _child(job)
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    [lent] = slices(engine, mission)
    [attempt_id] = _held_in(raw)
    assert engine.get_attempt(attempt_id).status is charter.AttemptStatus.DISPATCHED
    assert engine.check_ledger(mission) == []
    # After its lease, the next to touch the mission returns the slice; the
    # dispatched attempt's hold stays held, now the mission's (L4).
    # (the child's store clock is the system's: the test's is moved past its lease)
    clock.advance(max(0.0, time.time() + 31 - clock.now_us() / 1e6))
    assert sweep(engine, mission) == 1
    usd = engine.balances(mission)["usd"]
    assert (usd.held, usd.spent) == (1_000, 0)
    assert usd.available == 1_000_000 - 1_000
    assert [s["status"] for s in slices(engine, mission)] == ["returned"]
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    del lent


def test_L10_a_lease_refused_leaves_the_worker_on_the_missions_gate(
    engine: charter.Engine, who: Principals, raw: Any
) -> None:
    # A contract that counts attempts lends no slice: a count is not lent.
    mission = _mission(engine, who, stop_conditions={"max_attempts": 5})
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    with Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as escrow:
        with escrow.lane(mission) as lane:
            assert lane is None
        escrow.perform(ex, adapter, "read", {"n": 0}, effect_key="k0")
    assert slices(engine, mission) == [] and _held_in(raw) == {}
    assert engine.balances(mission)["usd"].spent == 1_000


def _elsewhere(fn: Callable[[], Any]) -> None:
    """Run ``fn`` in a thread of its own: a fresh context, in no lane (as another
    process, or a person's decision, would)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - re-raised below
            failed.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def test_L10_a_node_completing_after_its_slice_was_revoked_completes_through_the_gate(
    engine: charter.Engine, who: Principals, raw: Any
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)

    def revoke() -> None:
        engine.amend_contract(
            mission,
            default_contract(allowance={"usd": 900_000, "calls": 100}),
            by=who.alice,
            reason="budget cut",
        )

    @charter.node
    def read_then_cut(ctx: charter.Context, value: Any) -> str:
        attempt = ctx.attempt(adapter, "read", {"n": 1}, key="r1")
        _elsewhere(revoke)  # the slice is returned while the node runs
        return str(attempt)

    plan = charter.Plan("cut", (read_then_cut,))
    with Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1") as escrow:
        with escrow.lane(mission) as lane:
            assert lane is not None
            ex.execute(plan)
        [lent] = slices(engine, mission)
        assert lent["status"] == "returned" and lent["returned_why"].startswith("revoked")
        assert lane.fell_back
    assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED
    [attempt_id] = _held_in(raw)
    assert _held_in(raw)[attempt_id] == lent["id"]
    # The completion went on the mission's chain, nothing after the return on the slice's.
    kinds = [
        r["kind"]
        for r in raw.rows("SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq", mission)
    ]
    assert "node.completed" in kinds and kinds.index("node.completed") > kinds.index(
        "escrow.returned"
    )
    assert engine.balances(mission)["usd"].spent == 1_000
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    assert [s.request for s in adapter.sent] == [{"n": 1}]


def test_L10_L4_a_two_phase_dispatch_after_its_slice_lapsed_goes_through_the_gate(
    engine: charter.Engine, who: Principals, clock: ManualClock, raw: Any
) -> None:
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    escrow = Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1", lease_seconds=5)
    with escrow.lane(mission) as lane:
        assert lane is not None
        prepared = ex.admit(adapter, "charge", {"n": 1}, effect_key="c1")
        assert _held_in(raw) == {prepared.id: lane.chain}
        clock.advance(6)  # the lease lapses between admission and dispatch
        _elsewhere(lambda: sweep(engine, mission))
        sent = ex.dispatch(prepared.id, adapter)
        assert sent.status is charter.AttemptStatus.SUCCEEDED
        assert lane.fell_back
    [lent] = slices(engine, mission)
    assert (lent["status"], lent["returned_why"]) == ("returned", "lapsed")
    usd = engine.balances(mission)["usd"]
    # The hold came back to the mission with the slice (L4) and was settled there once.
    assert (usd.held, usd.spent) == (0, 20_000)
    assert lent["accounts"]["usd"]["held"] == 20_000
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    assert [s.request for s in adapter.sent] == [{"n": 1}]


def test_L10_S2_an_export_returns_open_slices_and_carries_their_chains(
    make_engine: Callable[..., charter.Engine], creds: Any, key: str, target: charter.Engine
) -> None:
    engine = make_engine(signing_key=key)
    who = Principals(creds[0], creds[1], engine)
    mission = _mission(engine, who)
    ex = engine.start_run(mission, by=who.agent, segment_id="s1")
    adapter = RecordingAdapter(costs=COSTS)
    released = Escrow(engine, {"usd": 30_000, "calls": 50}, holder="w0")
    released.perform(ex, adapter, "read", {"n": 0}, effect_key="k0")
    released.close()
    escrow = Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1")
    escrow.perform(ex, adapter, "read", {"n": 1}, effect_key="k1")
    assert {s["holder"]: s["status"] for s in slices(engine, mission)} == {
        "w0": "returned",
        "w1": "open",
    }

    data = engine.export_snapshot(mission)

    # The open slice came back first: the snapshot's books hold no grant.
    lent = slices(engine, mission)
    assert {s["holder"]: s["returned_why"] for s in lent} == {
        "w0": "released",
        "w1": "revoked: exported",
    }
    assert engine.balances(mission)["usd"].held == 0
    assert target.import_snapshot(data) == mission
    assert slices(target, mission) == lent
    assert target.balances(mission) == engine.balances(mission)
    assert target.check_ledger(mission) == []
    assert all(v.ok for v in target.verify_audit(mission))
    # The worker's next attempt here goes through the mission's gate, as without escrow.
    second = escrow.perform(ex, adapter, "read", {"n": 2}, effect_key="k2")
    assert second.status is charter.AttemptStatus.SUCCEEDED
    escrow.close()
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
