"""Workers carry submitted runs by themselves, and waits wake them (K1, K2, K4).

Each test drives a :class:`charter.Worker` in this process on both stores and
asserts on what the store recorded and what the payments sandbox took. Crashes,
power outages and SIGTERM with real worker processes are in test_fleet.py.
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

import _worker_plans as plans
import charter
from charter.adapters.http import HttpAdapter
from charter.errors import NotAuthorized, StateError, UsageError
from charter.runs.model import RunStatus
from charter.sandbox import Sandbox
from charter.storage.text import TextRefused
from charter.testing import ManualClock, credential
from conftest import Principals, default_contract, payments_contract, stored

LEASE = 30.0
HERE = Path(__file__).resolve().parent
MakeEngine = Callable[..., charter.Engine]


@pytest.fixture(autouse=True)
def _plans_adapters() -> Any:
    """The plans' own adapters (built in the node, as in a worker process) are closed."""
    yield
    plans.close()


def worker_engine(make_engine: MakeEngine) -> charter.Engine:
    return worker_engine_at(make_engine)


def worker_engine_at(make_engine: MakeEngine, **config: Any) -> charter.Engine:
    """An engine configured as workers run: they continue runs by themselves."""
    return make_engine(resume="automatic", evidence_settles="auto", lease_seconds=LEASE, **config)


def approved_payments(*, ttl_seconds: int) -> dict[str, Any]:
    """A payments contract whose every payment needs ``bob``'s approval first."""
    return default_contract(
        approvals={"required": ["payments.pay"], "ttl_seconds": ttl_seconds},
        principals={
            "agent": {"run": ["payments.*"]},
            "alice": ["resolve", "stop"],
            "bob": {"approve": ["payments.*"]},
        },
        allowance={"usd_cents": 100_000},
    )


def pay_input(box: Sandbox, *invoices: str, amount: int = 500) -> dict[str, Any]:
    return {"sandbox": box.url, "amount": amount, "invoices": list(invoices)}


def paid(box: Sandbox) -> list[str]:
    """The references of every payment the sandbox applied, in order."""
    return [p["reference"] for p in box.payments()]


def test_K1_a_submitted_run_is_begun_by_a_free_worker_and_pays_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "a", "b"))
    assert run.status is RunStatus.QUEUED
    assert engine.queued_run(run.id) is not None

    outcomes = charter.Worker(engine, plans.PLANS, adapters=[payments]).run_once()

    assert outcomes == {run.id: "ended"}
    done = engine.run(run.id)
    assert (done.status, done.epoch) == (RunStatus.COMPLETED, 1)
    assert paid(box) == ["a", "b"]
    assert [a.status.value for a in engine.attempts(mission_id=mission)] == ["succeeded"] * 2
    assert engine.queued_run(run.id) is None
    assert engine.check_ledger(mission) == []
    kinds = [e["kind"] for e in engine.audit_events(mission)]
    assert kinds.index("run.submitted") < kinds.index("run.started")


def test_K1_a_submission_refused_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    before = stored(engine, mission)
    unreferenced = charter.Plan("adhoc", plans.PAY.nodes)

    with pytest.raises(StateError, match="importable by the workers"):
        engine.submit(mission, by=who.agent, plan=unreferenced)
    with pytest.raises(NotAuthorized):
        engine.submit(mission, by=who.bob, plan=plans.PAY)
    with pytest.raises(TextRefused):
        engine.submit(mission, by=who.agent, plan=plans.PAY, queue="a\x00b")
    for lossy in ({"at": object()}, {"ratio": float("nan")}):
        with pytest.raises(UsageError, match="plain JSON"):
            engine.submit(mission, by=who.agent, plan=plans.PAY, input=lossy)
        with pytest.raises(UsageError, match="plain JSON"):
            engine.start_run(mission, by=who.agent, segment_id="s", input=lossy)

    assert stored(engine, mission) == before
    assert engine.queues() == []


def test_K1_a_worker_takes_only_the_queues_and_plans_it_knows(
    make_engine: MakeEngine, creds: Any
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    batch = engine.submit(
        mission, by=who.agent, plan=plans.NAP, input={"seconds": 0}, queue="batch"
    )
    other = engine.submit(mission, by=who.agent, plan=plans.ASK)

    assert charter.Worker(engine, [plans.NAP]).run_once() == {}  # default queue, no ASK
    assert charter.Worker(engine, [plans.NAP], queues=["batch"]).run_once() == {batch.id: "ended"}
    assert engine.run(other.id).status is RunStatus.QUEUED
    assert {q["queue"]: q["runs"] for q in engine.queues()} == {"default": 1}


def test_K2_a_timer_run_falls_due_at_its_time_and_a_worker_continues_it(
    make_engine: MakeEngine, creds: Any, clock: ManualClock
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.NAP, input={"seconds": 60})
    worker = charter.Worker(engine, plans.PLANS)

    assert worker.run_once() == {run.id: "waiting"}
    due = engine.next_due_us(queues=["default"], plans=[plans.NAP.ref or ""])
    assert due == engine.now_us() + 60_000_000
    clock.advance(59)
    assert worker.run_once() == {}  # not due yet: nothing taken, nothing recovered
    clock.advance(1)

    assert worker.run_once() == {run.id: "ended"}
    assert engine.run(run.id).status is RunStatus.COMPLETED
    # Its lease ran out while it slept: the worker took it over as a new segment.
    assert engine.run(run.id).epoch == 2


def test_K2_an_answer_wakes_its_run_at_once(make_engine: MakeEngine, creds: Any) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.ASK)
    worker = charter.Worker(engine, plans.PLANS)
    assert worker.run_once() == {run.id: "waiting"}
    assert engine.queued_run(run.id)["due_at_us"] is None  # only an answer moves it
    assert worker.run_once() == {}

    engine.answer(run.id, "go", "yes", by=who.alice)

    assert engine.queued_run(run.id)["due_at_us"] == engine.now_us()
    assert worker.run_once() == {run.id: "ended"}
    assert engine.run(run.id).status is RunStatus.COMPLETED


def test_K2_W2_a_granted_approval_wakes_its_run_and_the_payment_is_sent_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(approved_payments(ttl_seconds=600), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "inv-9"))
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
    assert worker.run_once() == {run.id: "waiting"}
    assert paid(box) == []
    [approval] = engine.approvals(run_id=run.id)

    engine.approve(approval.id, by=who.bob)

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["inv-9"]
    assert engine.run(run.id).status is RunStatus.COMPLETED


def test_K1_a_run_whose_owner_lease_ended_is_taken_over_by_another_worker(
    make_engine: MakeEngine, creds: Any, clock: ManualClock, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "x"))
    # A worker took the run and began it, then died before any node ran.
    [taken] = engine.take_runs(
        queues=["default"], plans=[plans.PAY.ref or ""], limit=1, token="dead", hold_seconds=LEASE
    )
    assert engine.begin(taken, "dead-seg") is not None
    other = charter.Worker(engine, plans.PLANS, adapters=[payments])
    assert other.run_once() == {}  # held by its lease
    clock.advance(LEASE)

    assert other.run_once() == {run.id: "ended"}
    done = engine.run(run.id)
    assert (done.status, done.epoch, done.recoveries) == (RunStatus.COMPLETED, 2, 1)
    assert paid(box) == ["x"]


class SlowRounds:
    """The lease keeper's time, made by hand: each round of renewals takes
    ``took`` seconds; the waits between rounds are recorded, and the keeper
    stops after ``rounds`` of them."""

    def __init__(self, took: float, rounds: int) -> None:
        self.now, self.took, self.rounds = 1_000.0, took, rounds
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 6))
        self.now += seconds
        return len(self.waits) > self.rounds  # stopping

    def round(self) -> bool:
        self.now += self.took
        return True


@pytest.mark.parametrize(
    ("took", "waits"),
    [(0.4, [1.0, 0.6, 0.6, 0.6]), (1.5, [1.0, 0.0, 0.0, 0.0])],
    ids=["a-busy-store", "slower-than-a-third"],
)
def test_K1_leases_are_renewed_a_third_of_a_lease_after_each_round_began(
    make_engine: MakeEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    took: float,
    waits: list[float],
) -> None:
    """A round of renewals slowed by a busy store eats into the wait before the
    next, not into the lease (before: a third of a lease was waited after each
    round, so renewals of a run were a third of a lease *plus* a round apart). A
    round longer than a third of a lease is said, once a minute at most."""
    import charter.workers.worker as module

    engine = make_engine(resume="automatic", lease_seconds=3.0, send_deadline_seconds=1.0)
    worker = charter.Worker(engine, [plans.NAP])
    rounds = SlowRounds(took, rounds=len(waits) - 1)
    monkeypatch.setattr(module, "time", rounds)
    monkeypatch.setattr(worker._stopping, "wait", rounds.wait)
    monkeypatch.setattr(worker, "_renew_round", rounds.round)
    with caplog.at_level("WARNING", logger="charter.worker"):
        worker._renew()
    assert rounds.waits == waits
    said = [r.getMessage() for r in caplog.records if "renewing its leases" in r.getMessage()]
    assert len(said) == (1 if took > 1.0 else 0), said
    if said:  # a minute later it is said again, with the rounds meanwhile
        rounds = SlowRounds(took, rounds=int(61 / took) + 1)
        monkeypatch.setattr(module, "time", rounds)
        monkeypatch.setattr(worker._stopping, "wait", rounds.wait)
        monkeypatch.setattr(worker, "_renew_round", rounds.round)
        caplog.clear()
        with caplog.at_level("WARNING", logger="charter.worker"):
            worker._renew()
        said = [r.getMessage() for r in caplog.records if "renewing its leases" in r.getMessage()]
        assert len(said) == 2 and "; 1 such round(s)" in said[0], said
        assert "; 40 such round(s)" in said[1], said


def test_K1_two_workers_on_two_engines_carry_every_run_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    first, second = worker_engine(make_engine), worker_engine(make_engine)
    who = Principals(creds[0], creds[1], first)
    mission = first.create_mission(payments_contract(), by=who.alice)
    runs = [
        first.submit(
            mission, by=who.agent, plan=plans.PAY, input=pay_input(box, f"r{i}", amount=100)
        )
        for i in range(12)
    ]
    workers = [
        charter.Worker(eng, plans.PLANS, adapters=[payments], concurrency=2)
        for eng in (first, second)
    ]
    carried: list[dict[str, str]] = []

    def drain(worker: charter.Worker) -> None:
        for _ in range(50):
            got = worker.run_once()
            carried.append(got)
            if not got and not first.queues():
                return

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(paid(box)) == sorted(f"r{i}" for i in range(12))
    assert {first.run(r.id).status for r in runs} == {RunStatus.COMPLETED}
    assert sum(1 for c in carried for o in c.values() if o == "ended") == 12
    assert first.check_ledger(mission) == []


def test_K2_a_timer_continues_within_one_poll_interval_of_its_due_time(tmp_path: Path) -> None:
    """Real time, a worker thread sleeping until the soonest due run (no busy loop)."""
    creds = {n: charter.testing.credential(n) for n in ("agent", "alice")}
    config = charter.EngineConfig(
        credentials={n: d for n, (_, d) in creds.items()},
        resume="automatic",
        lease_seconds=5,
        send_deadline_seconds=2,
    )
    poll = 0.5
    with charter.Engine.open(str(tmp_path / "store.db"), config=config) as engine:
        agent = engine.authenticate(creds["agent"][0])
        alice = engine.authenticate(creds["alice"][0])
        mission = engine.create_mission(default_contract(), by=alice)
        worker = charter.Worker(engine, plans.PLANS, poll_seconds=poll)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            run = engine.submit(mission, by=agent, plan=plans.NAP, input={"seconds": 1.5})
            deadline = time.monotonic() + 10
            while engine.run(run.id).status is not RunStatus.COMPLETED:
                assert time.monotonic() < deadline, engine.run(run.id)
                time.sleep(0.02)
            finished = time.time()
        finally:
            worker.stop()
            thread.join(10)
        [timer] = [w for w in engine.waits(run.id) if w.kind.value == "timer"]
        late = finished - timer.due_at_us / 1e6
    print(f"timer continued {late * 1000:.0f} ms after its due time (poll {poll} s)")
    assert 0 <= late <= poll + 0.25


class Told:
    """A teller that keeps what the worker told it (the webhook path itself is
    proven in test_notify.py; here: what the worker decides to tell, and when)."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str, list[str], list[str]]] = []

    def post(
        self, run_id: str, mission_id: str, kind: str, needs: list[str], attempts: list[str]
    ) -> str | None:
        self.notices.append((run_id, kind, needs, attempts))
        return f"ntc-{len(self.notices)}"


def test_K3_a_run_waiting_for_a_person_is_told_once_and_a_timer_run_never(
    make_engine: MakeEngine, creds: Any
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    asked = engine.submit(mission, by=who.agent, plan=plans.ASK)
    napping = engine.submit(mission, by=who.agent, plan=plans.NAP, input={"seconds": 600})
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, teller=told)

    assert worker.run_once() == {asked.id: "waiting", napping.id: "waiting"}
    assert worker.run_once() == {}

    assert told.notices == [(asked.id, "input", ["an answer to 'go'"], [])]


def test_K2_K3_an_exhausted_allowance_is_told_and_a_raised_limit_wakes_the_run(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    contract = default_contract(
        principals={"agent": {"run": ["payments.*"]}, "alice": ["resolve", "raise_limit"]},
        allowance={"usd_cents": 1_000},
    )
    mission = engine.create_mission(contract, by=who.alice)
    run = engine.submit(
        mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "p1", "p2", amount=600)
    )
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)
    assert worker.run_once() == {run.id: "needs_person"}
    assert engine.run(run.id).status is RunStatus.PAUSED
    assert paid(box) == ["p1"]
    [(_, kind, _, _)] = told.notices
    assert kind == "allowance"
    assert worker.run_once() == {}

    engine.raise_limit(mission, "usd_cents", 2_000, by=who.alice)

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["p1", "p2"]
    assert engine.check_ledger(mission) == []


def test_K2_K3_a_lost_payment_waits_for_a_person_whose_settlement_wakes_the_run(
    make_engine: MakeEngine, creds: Any, box: Sandbox
) -> None:
    """No lookup adapter is given: the UNKNOWN payment waits for a person (R7), who
    is told; settling it makes the run due, and the worker finishes it."""
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "next"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, teller=told)
    assert worker.run_once() == {run.id: "needs_person"}
    [lost] = engine.attempts(run_id=run.id, unresolved=True)
    assert told.notices == [(run.id, "unknown_attempt", told.notices[0][2], [lost.id])]
    assert worker.run_once() == {}

    engine.coordinator.resolve(
        lost.id,
        by=who.alice,
        outcome="succeeded",
        evidence="in the sandbox's log",
        cost={"usd_cents": 500},
        result={"status": "paid", "reference": "lost"},
    )

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["lost", "next"]  # the lost one was applied once, never again
    assert engine.check_ledger(mission) == []


def test_K2_W2_an_approval_that_expired_while_no_worker_ran_is_asked_again(
    make_engine: MakeEngine, creds: Any, clock: ManualClock, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(approved_payments(ttl_seconds=60), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "late"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)
    assert worker.run_once() == {run.id: "waiting"}
    [first] = engine.approvals(run_id=run.id)
    engine.approve(first.id, by=who.bob)
    clock.advance(120)  # granted, then expired before any worker looked

    assert worker.run_once() == {run.id: "needs_person"}

    assert paid(box) == []
    statuses = sorted(a.status.value for a in engine.approvals(run_id=run.id))
    assert statuses == ["expired", "pending"]
    [again] = engine.approvals(run_id=run.id, pending=True)
    assert [kind for _, kind, _, _ in told.notices] == ["approval", "approval"]
    engine.approve(again.id, by=who.bob)
    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["late"]


def test_K4_stop_lets_the_send_in_flight_settle_and_hands_the_run_on_at_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, raw: Any
) -> None:
    """The store's clock stands still here: the second worker continues the run
    without any lease running out."""
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("slow", seconds=1.0, reference="first")
    run = engine.submit(
        mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "first", "second")
    )
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], poll_seconds=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    deadline = time.monotonic() + 10
    while not engine.attempts(run_id=run.id):
        assert time.monotonic() < deadline
        time.sleep(0.01)

    worker.stop()  # while "first" is being sent
    thread.join(10)

    assert not thread.is_alive()
    assert worker.counts == {"handed_on": 1}
    assert paid(box) == ["first"]
    assert [a.status.value for a in engine.attempts(run_id=run.id)] == ["succeeded"]
    assert raw.rows("SELECT owner_claim FROM runs WHERE id = ?", run.id) == [{"owner_claim": None}]
    queued = engine.queued_run(run.id)
    assert queued is not None and queued["taken_by"] is None
    assert queued["due_at_us"] <= engine.now_us()

    assert charter.Worker(engine, plans.PLANS).run_once() == {run.id: "ended"}
    assert paid(box) == ["first", "second"]
    assert engine.run(run.id).epoch == 1  # continued as its segment: no lease waited out


def test_K4_R1_an_owner_on_another_host_is_never_judged_dead_by_this_one(
    make_engine: MakeEngine, creds: Any, clock: ManualClock, raw: Any
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.NAP, input={"seconds": 0})
    [taken] = engine.take_runs(
        queues=["default"], plans=[plans.NAP.ref or ""], limit=1, token="far", hold_seconds=1
    )
    assert engine.begin(taken, "far-seg") is not None
    gone = '{"host": "elsewhere/boot/pid:[1]", "pid": 4194305, "started": "1"}'
    raw.execute("UPDATE runs SET owner_process = ? WHERE id = ?", gone, run.id)
    clock.advance(2)  # the queue's hold ended; the run's lease has not
    worker = charter.Worker(engine, plans.PLANS)

    assert worker.run_once() == {run.id: "held"}
    assert engine.queued_run(run.id)["due_at_us"] == engine.run(run.id).lease_expires_us
    clock.advance(LEASE)
    assert worker.run_once() == {run.id: "ended"}
    assert engine.run(run.id).epoch == 2


@pytest.mark.crash
def test_K1_R1_a_worker_killed_on_this_host_is_taken_over_at_once_not_after_its_lease(
    tmp_path: Path, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """A 30 s lease; the killed worker's run is carried on within a second, its
    in-flight payment reconciled by lookup, nothing paid twice."""
    store = str(tmp_path / "store.db")
    config = charter.EngineConfig(
        credentials=creds[1],
        resume="automatic",
        evidence_settles="auto",
        lease_seconds=LEASE,
        send_deadline_seconds=5,
    )
    child_config = tmp_path / "worker.json"
    child_config.write_text(
        json.dumps(
            {
                "store": store,
                "digests": creds[1],
                "sandbox": box.url,
                "lease_seconds": LEASE,
                "send_deadline_seconds": 5,
                "name": "doomed",
            }
        )
    )
    with charter.Engine.open(store, config=config) as engine:
        who = Principals(creds[0], creds[1], engine)
        mission = engine.create_mission(payments_contract(), by=who.alice)
        box.fault("slow", seconds=30, reference="stuck")
        run = engine.submit(
            mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "stuck", "after")
        )
        child = subprocess.Popen(
            [sys.executable, str(HERE / "_worker_plans.py"), str(child_config)],
            cwd=HERE,
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while paid(box) != ["stuck"]:  # applied; its answer is held back
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.02)
            child.kill()
            child.wait(10)
            killed = time.monotonic()
            worker = charter.Worker(engine, plans.PLANS, adapters=[payments], poll_seconds=0.2)
            thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
            thread.start()
            while engine.run(run.id).status is not RunStatus.COMPLETED:
                assert time.monotonic() < killed + LEASE / 2, engine.run(run.id)
                time.sleep(0.02)
            took = time.monotonic() - killed
            worker.stop()
            thread.join(10)
        finally:
            child.kill()
        print(f"a run of a worker killed on this host was finished {took:.2f}s later")
        assert took < 2.0
        assert paid(box) == ["stuck", "after"]
        done = engine.run(run.id)
        assert (done.epoch, done.recoveries) == (2, 1)
        assert [a.status.value for a in engine.attempts(run_id=run.id)] == ["succeeded"] * 2
        assert engine.check_ledger(mission) == []


def test_K4_N2_a_worker_on_another_machine_finds_the_artifacts_in_the_shared_store(
    make_engine: MakeEngine, creds: Any, clock: ManualClock, tmp_path: Path
) -> None:
    """Two machines: each its own workspace, one artifact directory they share.
    The run saves a file on the first, sleeps, and reads it back on the second."""
    shared = str(tmp_path / "shared-artifacts")
    here, there = (
        worker_engine_at(make_engine, artifacts=shared, workspace=str(tmp_path / name))
        for name in ("here", "there")
    )
    who = Principals(creds[0], creds[1], here)
    mission = here.create_mission(default_contract(), by=who.alice)
    run = here.submit(mission, by=who.agent, plan=plans.NOTES, input={"text": "kept"})
    assert charter.Worker(here, plans.PLANS).run_once() == {run.id: "waiting"}
    clock.advance(LEASE * 3)

    assert charter.Worker(there, plans.PLANS).run_once() == {run.id: "ended"}
    assert (tmp_path / "there" / run.id / "notes.txt").read_text() == "kept"
    assert [a["ok"] for a in there.verify_artifacts(run.id)] == [True]


def test_K1_N5_a_submitted_run_stopped_before_any_worker_begins_it_is_never_begun(
    make_engine: MakeEngine, creds: Any
) -> None:
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.NAP, input={"seconds": 0})

    assert engine.stop_run(run.id, by=who.alice).status is RunStatus.STOPPED

    assert charter.Worker(engine, plans.PLANS).run_once() == {run.id: "ended"}
    done = engine.run(run.id)
    assert (done.status, done.epoch) == (RunStatus.STOPPED, 0)
    assert [e["kind"] for e in engine.audit_events(mission)].count("run.started") == 0
    assert engine.queued_run(run.id) is None


def test_K1_S2_a_mission_with_a_queued_run_exports_and_imports_whole(
    make_engine: MakeEngine, creds: Any, key: str, target: charter.Engine
) -> None:
    engine = make_engine(signing_key=key)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.NAP, input={"seconds": 0})

    assert target.import_snapshot(engine.export_snapshot(mission)) == mission

    assert target.run(run.id).to_dict() == engine.run(run.id).to_dict()
    assert all(v.ok for v in target.verify_audit(mission))
    assert target.queued_run(run.id) is None  # the queue is the store's own


def test_K1_A8_a_run_recovered_by_a_person_is_looked_up_before_a_worker_continues_it(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, raw: Any
) -> None:
    """The operator's recovered segment still has its lease when the run falls due:
    the worker continues as that segment, and looks the lost payment up first."""
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "b"))
    assert charter.Worker(engine, plans.PLANS).run_once() == {run.id: "needs_person"}
    engine.coordinator.recover(run.id, "operator-seg", force=True, by=who.alice)
    raw.execute("UPDATE run_queue SET due_at_us = 0 WHERE run_id = ?", run.id)

    outcome = charter.Worker(engine, plans.PLANS, adapters=[payments]).run_once()

    assert outcome == {run.id: "ended"}
    assert paid(box) == ["lost", "b"]
    assert engine.run(run.id).owner_segment == "operator-seg"
    [lost] = [a for a in engine.attempts(run_id=run.id) if a.request["reference"] == "lost"]
    assert [e["verdict"] for e in engine.evidence(lost.id)] == ["applied"]  # the lookup's


def test_K2_closing_the_incident_a_run_waits_on_wakes_it(
    make_engine: MakeEngine, creds: Any, box: Sandbox
) -> None:
    """A person settles a lost payment above its hold (an overrun: an incident,
    L5); the run waits for the incident, and closing it is what moves it on."""
    engine = worker_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="over")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "over", "b"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, teller=told)
    assert worker.run_once() == {run.id: "needs_person"}
    [lost] = engine.attempts(run_id=run.id, unresolved=True)
    engine.coordinator.resolve(
        lost.id,
        by=who.alice,
        outcome="succeeded",
        evidence="the bank charged a fee on top",
        cost={"usd_cents": 900},
        result={"status": "paid", "reference": "over"},
    )
    [incident] = engine.incidents(mission)
    assert worker.run_once() == {run.id: "needs_person"}
    assert told.notices[-1][1] == "incident"
    assert worker.run_once() == {}

    engine.close_incident(incident["id"], by=who.alice, note="the fee is agreed")

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["over", "b"]


@pytest.mark.crash
def test_K1_K4_the_cli_submits_a_run_a_worker_process_carries_it_and_sigterm_stops_it(
    tmp_path: Path,
) -> None:
    (agent, agent_digest), (alice, alice_digest) = credential("agent"), credential("alice")
    (tmp_path / "charter.toml").write_text(
        'store = "charter.db"\nresume = "automatic"\n'
        f'[credentials]\nagent = "{agent_digest}"\nalice = "{alice_digest}"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(HERE), "CHARTER_CONFIG": str(tmp_path / "charter.toml")}
    with charter.Engine.open(
        str(tmp_path / "charter.db"),
        config=charter.EngineConfig.from_file(tmp_path / "charter.toml"),
    ) as engine:
        mission = engine.create_mission(default_contract(), by=engine.authenticate(alice))

    def cli(*args: str, who: str = agent) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "charter", *args, "--json"],
            cwd=tmp_path,
            env={**env, "CHARTER_CREDENTIAL": who},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    run = cli("submit", mission, "_worker_plans:NAP", "--input", '{"seconds": 0.5}')
    assert run["status"] == "queued"
    assert cli("queues")["queues"] == [
        {"queue": "default", "due": 1, "held": 0, "parked": 0, "runs": 1}
    ]
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "charter",
            "worker",
            "--plan",
            "_worker_plans:NAP",
            "--poll",
            "0.2",
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while cli("queues")["queues"]:  # the run ended: the queue forgets it
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 0
    assert json.loads(out)["counts"] == {"waiting": 1, "ended": 1}
    with charter.Engine.open(
        str(tmp_path / "charter.db"),
        config=charter.EngineConfig.from_file(tmp_path / "charter.toml"),
    ) as engine:
        assert engine.run(run["id"]).status is RunStatus.COMPLETED
