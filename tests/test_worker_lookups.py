"""Workers finish what a lookup can, and leave nothing invisible (K5).

A payment whose answer is lost while its worker lives is looked up by that
worker, with backoff and a bound, as after a takeover; only what no lookup
settles waits for a person. A settlement by ``reconcile`` wakes its run as a
person's does. A run nothing can continue is never left ``active`` with a
lease nobody renews: it is ``paused`` or ``needs_intervention``, with its
reason, in the inbox. Each test drives a :class:`charter.Worker` in this
process on both stores and asserts on what the store recorded and what the
payments sandbox received.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import _worker_plans as plans
import charter
from _fleet import unwatched
from charter.adapters.http import HttpAdapter
from charter.runs.model import RunStatus
from charter.sandbox import Sandbox
from charter.testing import ManualClock
from conftest import Principals, default_contract, payment, payments_contract
from test_workers import Told, paid, pay_input

LEASE = 30.0
MakeEngine = Callable[..., charter.Engine]


@pytest.fixture(autouse=True)
def _plans_adapters() -> Any:
    yield
    plans.close()


def engine_for(make_engine: MakeEngine, settles: str = "auto") -> charter.Engine:
    return make_engine(resume="automatic", evidence_settles=settles, lease_seconds=LEASE)


def requests(box: Sandbox, kind: str) -> list[str]:
    """The verdicts of the sandbox's requests of ``kind``, in order."""
    return [r["verdict"] for r in box.requests() if r["kind"] == kind]


@pytest.mark.parametrize("fault", ["drop_after_apply", "slow"])
def test_K5_item7_a_payment_whose_answer_is_lost_is_looked_up_by_its_worker_and_the_run_goes_on(
    fault: str, make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Broken: the answer lost while the worker lived (the connection dropped, or
    the plan's adapter timed out after 2 s on a 3 s answer), no worker ran the
    declared lookup: the run waited for a person, who was told, although the
    lookup said "applied" at once."""
    engine = engine_for(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault(fault, reference="lost", seconds=3.0)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "next"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)

    assert worker.run_once() == {run.id: "ended"}

    done = engine.run(run.id)
    assert (done.status, done.epoch) == (RunStatus.COMPLETED, 1)  # its own segment went on
    assert paid(box) == ["lost", "next"]
    attempts = {a.request["reference"]: a for a in engine.attempts(run_id=run.id)}
    lost = attempts["lost"]
    assert [attempts[r].status.value for r in ("lost", "next")] == ["succeeded"] * 2
    assert lost.result["reference"] == "lost"
    [found] = engine.evidence(lost.id)
    assert (found["source"], found["verdict"], found["actor"], found["settled"]) == (
        "adapter",
        "applied",
        "engine:reconcile",
        1,
    )
    assert requests(box, "lookup") == ["found"]
    assert told.notices == []  # nobody was asked what a lookup could say
    assert engine.check_ledger(mission) == []
    deadline = time.monotonic() + 5  # the slow answer is still being written
    while len(requests(box, "create")) < 2:
        assert time.monotonic() < deadline, box.requests()
        time.sleep(0.05)


def test_K5_item7_evidence_a_person_must_confirm_is_looked_up_once_and_the_person_told(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Under ``evidence_settles = "confirm"`` the worker's lookup records what it
    found and settles nothing; it asks no more (the evidence is there), tells the
    person, and the person's confirmation wakes the run."""
    engine = engine_for(make_engine, settles="confirm")
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "next"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)

    assert worker.run_once() == {run.id: "needs_person"}
    assert worker.run_once() == {}

    [lost] = engine.attempts(run_id=run.id)
    assert lost.status.value == "unknown"
    [found] = engine.evidence(lost.id)
    assert (found["verdict"], found["settled"]) == ("applied", 0)
    assert requests(box, "lookup") == ["found"]
    assert [(r, kind, ids) for r, kind, _, ids in told.notices] == [
        (run.id, "unknown_attempt", [lost.id])
    ]
    assert engine.run(run.id).id in {r.id for r in engine.runs_needing_people()}

    engine.coordinator.confirm(lost.id, by=who.alice)

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["lost", "next"]
    assert requests(box, "lookup") == ["found"]
    assert engine.check_ledger(mission) == []


def test_K5_item7_item8_lookups_back_off_are_bounded_and_a_reconcile_that_settles_wakes_the_run(
    make_engine: MakeEngine,
    creds: Any,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
    raw: Any,
) -> None:
    """The sandbox's lookups are down and a same-key replay is refused: the worker
    looks again after 0.5, 1, 2, 4 and 8 seconds, six lookups in all, then leaves
    the payment to a person and tells them once. Nothing is paid twice. When
    lookups answer again, a person's ``reconcile`` settles it (``auto``) and that
    wakes the run, which a worker finishes."""
    engine = engine_for(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    box.fault("refuse", reference="lost", times=100)
    box.fault("lookups_unavailable", times=100)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "next"))
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)

    waits = []
    assert worker.run_once() == {run.id: "looking_up"}
    for _ in range(5):
        (due,) = raw.rows("SELECT due_at_us FROM run_queue WHERE run_id = ?", run.id)
        waits.append((due["due_at_us"] - engine.now_us()) / 1e6)
        assert worker.run_once() == {}  # not due before its wait is over
        assert told.notices == []
        clock.advance(waits[-1])
        outcome = worker.run_once()
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert outcome == {run.id: "needs_person"}
    assert requests(box, "lookup") == ["lookup_unavailable"] * 6
    [lost] = engine.attempts(run_id=run.id)
    assert lost.status.value == "unknown"
    assert [e["verdict"] for e in engine.evidence(lost.id)] == ["indeterminate"] * 6
    assert [(kind, ids) for _, kind, _, ids in told.notices] == [("unknown_attempt", [lost.id])]
    assert raw.rows("SELECT due_at_us FROM run_queue WHERE run_id = ?", run.id) == [
        {"due_at_us": None}
    ]
    assert worker.run_once() == {}
    assert paid(box) == ["lost"]  # applied once; every replay was refused

    box.clear_faults()
    evidence = engine.coordinator.reconcile(lost.id, payments)

    assert evidence.verdict == "applied"
    assert engine.get_attempt(lost.id).status.value == "succeeded"
    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["lost", "next"]
    assert engine.run(run.id).status is RunStatus.COMPLETED
    assert len(told.notices) == 1
    assert engine.check_ledger(mission) == []


def test_K5_item8_a_settlement_by_reconcile_wakes_the_run_like_a_persons(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Broken: a worker without the adapter left the lost payment to a person;
    ``charter reconcile`` then settled it on evidence (``auto``), but nothing
    made the run due: it stayed parked, "… is unknown: reconcile or resolve it"."""
    engine = engine_for(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "next"))
    worker = charter.Worker(engine, plans.PLANS)  # no adapter to look anything up with
    assert worker.run_once() == {run.id: "needs_person"}
    [lost] = engine.attempts(run_id=run.id, unresolved=True)
    assert (engine.queued_run(run.id) or {})["due_at_us"] is None

    engine.coordinator.reconcile(lost.id, payments)

    assert (engine.queued_run(run.id) or {})["due_at_us"] is not None
    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["lost", "next"]
    done = engine.run(run.id)
    assert done.status is RunStatus.COMPLETED
    assert requests(box, "lookup") == ["found"]
    assert engine.check_ledger(mission) == []


def test_K5_item9_a_run_taken_over_with_its_allowance_exhausted_is_paused_in_the_inbox(
    make_engine: MakeEngine,
    creds: Any,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    """Broken: the run's first worker paid two of three invoices, all its allowance,
    and was never heard of again. The next worker took it over; its resume was
    refused ("allowance exhausted") and the run was left ``active``, with no
    reason, a lease nobody renewed and nothing scheduled: not paused, not in the
    inbox. It must wait paused, with its reason, until a raised limit wakes it."""
    engine = engine_for(make_engine)
    who = Principals(creds[0], creds[1], engine)
    contract = default_contract(
        principals={"agent": {"run": ["payments.*"]}, "alice": ["resolve", "raise_limit"]},
        allowance={"usd_cents": 1_000},
    )
    mission = engine.create_mission(contract, by=who.alice)
    run = engine.submit(
        mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "a", "b", "c", amount=500)
    )
    lost = engine.begin(run.id, "lost-worker")
    assert lost is not None
    execution = lost.start_node("pay_all")
    for invoice in ("a", "b"):  # as the plan's node pays them (its keys are "k:" + invoice)
        request = payment(500, invoice)
        at = {"effect_key": f"k:{invoice}", "node_id": "pay_all", "execution": execution}
        lost.perform(payments, "pay", request, **at)
    clock.advance(LEASE + 1)
    told = Told()
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments], teller=told)

    assert worker.run_once() == {run.id: "needs_person"}
    clock.advance(LEASE + 1)  # the takeover's lease is long over: nothing holds the run

    waiting = engine.run(run.id)
    assert waiting.status is RunStatus.PAUSED
    assert waiting.status_reason == "resume refused: allowance exhausted: usd_cents"
    assert [r.id for r in engine.runs(mission, status=RunStatus.PAUSED)] == [run.id]
    assert run.id in {r.id for r in engine.runs_needing_people()}
    assert unwatched(engine, mission) == []
    assert [kind for _, kind, _, _ in told.notices] == ["allowance"]
    refused = [e for e in engine.audit_events(mission) if e["kind"] == "resume.refused"]
    assert len(refused) == 1
    assert paid(box) == ["a", "b"]
    assert worker.run_once() == {}

    engine.raise_limit(mission, "usd_cents", 1_500, by=who.alice)

    assert worker.run_once() == {run.id: "ended"}
    assert paid(box) == ["a", "b", "c"]
    assert engine.run(run.id).status is RunStatus.COMPLETED
    assert engine.check_ledger(mission) == []
