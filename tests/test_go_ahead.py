"""A person's go-ahead lets workers continue a run under the human policy (R9, K1).

Under ``resume = "human"`` a run that was interrupted (its owner lost while it
ran) goes on only on a person's word. For a run workers carry, that word is a
go-ahead: recorded, audited, used by the next worker that takes the run, once.
A run that stopped itself on a wait was not interrupted: once the wait is over,
a worker continues it under any policy (K2). Each test drives a
:class:`charter.Worker` in this process on both stores and asserts on what the
store recorded and what the payments sandbox took.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import _desk
import _worker_plans as plans
import charter
from charter.adapters.http import HttpAdapter
from charter.errors import LeaseHeld, NeedsIntervention, NotAuthorized, RunTerminal, StateError
from charter.runs.model import RunStatus
from charter.sandbox import Sandbox
from charter.testing import ManualClock, credential
from conftest import Principals, default_contract, stored

MakeEngine = Callable[..., charter.Engine]
LEASE = 30.0


@pytest.fixture(autouse=True)
def _plans_adapters() -> Any:
    yield
    plans.close()


def human_engine(make_engine: MakeEngine) -> charter.Engine:
    """Workers under the default policy: an interrupted run needs a person."""
    return make_engine(resume="human", evidence_settles="auto", lease_seconds=LEASE)


def contract(*, approvals: bool = False) -> dict[str, Any]:
    """Alice may let a run go on (``run``); with ``approvals``, every payment
    needs bob's approval first."""
    return default_contract(
        approvals={"required": ["payments.pay"] if approvals else [], "ttl_seconds": 600},
        principals={
            "agent": {"run": ["payments.*"]},
            "alice": ["resolve", "stop", "run"],
            "bob": {"approve": ["payments.*"]},
        },
        allowance={"usd_cents": 100_000},
    )


def pay_input(box: Sandbox, *invoices: str) -> dict[str, Any]:
    return {"sandbox": box.url, "amount": 500, "invoices": list(invoices)}


def paid(box: Sandbox) -> list[str]:
    return [p["reference"] for p in box.payments()]


def kinds(engine: charter.Engine, mission: str) -> list[str]:
    return [e["kind"] for e in engine.audit_events(mission)]


def interrupted(
    engine: charter.Engine,
    who: Principals,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
    *invoices: str,
    approvals: bool = False,
) -> tuple[str, str, charter.Worker]:
    """A submitted run whose first worker began it and was never heard of again:
    the next worker takes it over once the lease ends, and may not continue it
    on its own. The mission, the run, the worker."""
    mission = engine.create_mission(contract(approvals=approvals), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, *invoices))
    assert engine.begin(run.id, "lost-worker") is not None
    clock.advance(LEASE + 1)
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
    assert worker.run_once() == {run.id: "needs_person"}
    assert paid(box) == []
    return mission, run.id, worker


def test_R9_K1_a_persons_go_ahead_lets_the_next_worker_continue_the_run_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken: under the human policy an interrupted worker-carried run could only
    go on in the deciding person's own process, which has neither the plan nor
    the adapters (the console's Resume ran it in the web server); and a
    go-ahead, once given, would let every later continuation through."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = interrupted(
        engine, who, box, payments, clock, "a", "b", approvals=True
    )

    given = engine.coordinator.go_ahead(run_id, by=who.alice)

    assert engine.queued_run(run_id)["go_ahead_by"] == "alice"  # type: ignore[index]
    assert [e["actor"] for e in engine.audit_events(mission) if e["kind"] == "run.go_ahead"] == [
        "alice"
    ]
    assert given.status is not RunStatus.COMPLETED and paid(box) == []  # nothing ran here
    # The worker continues on alice's word, up to "a"'s approval; the go-ahead is used.
    assert worker.run_once() == {run_id: "waiting"}
    assert engine.queued_run(run_id)["go_ahead_by"] is None  # type: ignore[index]
    resumed = [e for e in engine.audit_events(mission) if e["kind"] == "run.resumed"]
    assert [json.loads(e["payload"])["go_ahead_by"] for e in resumed] == ["alice"]

    # Interrupted again (a person resumed it by hand and vanished): the used
    # go-ahead does not let it through; only a new one does.
    [first] = engine.approvals(run_id=run_id, pending=True)
    engine.approve(first.id, by=who.bob)
    owner = engine.run(run_id).owner_segment
    assert owner is not None
    engine.coordinator.resume(run_id, owner, by=who.alice)  # held, and never executed
    clock.advance(LEASE + 1)
    assert worker.run_once() == {run_id: "needs_person"}
    assert paid(box) == []
    engine.coordinator.go_ahead(run_id, by=who.alice)
    assert worker.run_once() == {run_id: "waiting"}  # paid "a", waits for "b"'s approval
    assert paid(box) == ["a"]

    # A wait is no interruption (K2): "b"'s approval lets the worker go on, no go-ahead.
    [second] = engine.approvals(run_id=run_id, pending=True)
    engine.approve(second.id, by=who.bob)
    assert worker.run_once() == {run_id: "ended"}
    assert paid(box) == ["a", "b"]
    assert engine.run(run_id).status is RunStatus.COMPLETED
    assert kinds(engine, mission).count("run.go_ahead") == 2
    assert engine.check_ledger(mission) == []


def test_K2_R9_under_the_human_policy_a_wait_that_is_over_continues_by_itself(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken K2: under the default policy a worker parked every run whose wait was
    over (an approval granted) for a person, as if it had been interrupted; the
    approval in the console continued nothing. Also when its lease ran out
    while it waited (the worker then takes it over as a new segment)."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(contract(approvals=True), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "a", "b"))
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
    assert worker.run_once() == {run.id: "waiting"}
    for _ in range(2):
        [approval] = engine.approvals(run_id=run.id, pending=True)
        engine.approve(approval.id, by=who.bob)
        clock.advance(LEASE + 1)  # a person took longer than a lease to decide
        worker.run_once()
    assert paid(box) == ["a", "b"]
    assert engine.run(run.id).status is RunStatus.COMPLETED
    assert "run.go_ahead" not in kinds(engine, mission)


def test_P3_R9_a_go_ahead_refused_changes_nothing(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken: a go-ahead from a principal without ``run``, or for a run that is
    not carried by workers, not begun, or held by a live executor, was recorded."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = interrupted(engine, who, box, payments, clock, "a")
    queued = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "q"))
    own = engine.start_run(mission, by=who.agent, segment_id="own")
    before = stored(engine, mission)
    rows = {r: engine.queued_run(r) for r in (run_id, queued.id)}

    with pytest.raises(NotAuthorized):
        engine.coordinator.go_ahead(run_id, by=who.bob)  # approves, may not run
    with pytest.raises(StateError, match="not carried by workers"):
        engine.coordinator.go_ahead(own.run_id, by=who.alice)
    with pytest.raises(StateError, match="not begun yet"):
        engine.coordinator.go_ahead(queued.id, by=who.alice)
    with pytest.raises(charter.CharterError):
        engine.coordinator.go_ahead("run_nonesuch", by=who.alice)

    assert stored(engine, mission) == before
    assert {r: engine.queued_run(r) for r in rows} == rows
    assert worker.run_once() == {queued.id: "ended"}  # the interrupted run was not made due
    assert paid(box) == ["q"]

    # An executor holding the run carries it on already: no go-ahead is taken.
    held = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "h"))
    assert engine.begin(held.id, "carrier") is not None
    with pytest.raises(LeaseHeld):
        engine.coordinator.go_ahead(held.id, by=who.alice)
    assert engine.queued_run(held.id)["go_ahead_by"] is None  # type: ignore[index]


def test_R9_a_go_ahead_never_passes_an_unresolved_attempt(
    make_engine: MakeEngine, creds: Any, box: Sandbox
) -> None:
    """Broken R9: a person's go-ahead let a worker continue past an UNKNOWN payment.
    No adapter to look it up: it waits for a person's settlement, and a go-ahead
    is refused (typed, recorded as refused, nothing else changed)."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(contract(), by=who.alice)
    box.fault("drop_after_apply", reference="lost")
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "lost", "b"))
    worker = charter.Worker(engine, plans.PLANS)
    assert worker.run_once() == {run.id: "needs_person"}
    [lost] = engine.attempts(run_id=run.id, unresolved=True)
    before = stored(engine, mission)

    with pytest.raises(NeedsIntervention, match=lost.id) as refused:
        engine.coordinator.go_ahead(run.id, by=who.alice)

    assert refused.value.details["mode"] == "human"
    assert stored(engine, mission) == before
    assert engine.queued_run(run.id)["go_ahead_by"] is None  # type: ignore[index]
    assert kinds(engine, mission)[-1] == "go_ahead.refused"
    assert worker.run_once() == {}
    assert paid(box) == ["lost"]


def test_R9_a_go_ahead_whose_giver_lost_the_run_right_continues_nothing(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken R9: a worker continued on the word of a person whose ``run`` right
    was revoked between the go-ahead and the continuation. The right is checked
    again against the contract the run would continue under."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = interrupted(engine, who, box, payments, clock, "a")
    engine.coordinator.go_ahead(run_id, by=who.alice)
    revoked = contract()
    revoked["principals"]["alice"] = ["resolve", "stop"]
    engine.amend_contract(mission, revoked, by=who.alice, reason="alice no longer runs")
    before = kinds(engine, mission).count("run.resumed")

    assert worker.run_once() == {run_id: "needs_person"}
    assert paid(box) == []
    assert engine.queued_run(run_id)["go_ahead_by"] == "alice"  # type: ignore[index]
    assert kinds(engine, mission).count("run.resumed") == before


def test_R9_a_finished_run_takes_no_go_ahead(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = interrupted(engine, who, box, payments, clock, "a")
    engine.coordinator.go_ahead(run_id, by=who.alice)
    assert worker.run_once() == {run_id: "ended"}
    assert paid(box) == ["a"]
    before = stored(engine, mission)

    with pytest.raises(RunTerminal):
        engine.coordinator.go_ahead(run_id, by=who.alice)
    assert stored(engine, mission) == before


def test_R9_K1_the_desks_resume_gives_a_worker_carried_run_a_go_ahead(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken: the console's and the API's resume ran a worker-carried run's plan in
    the web server's own process. Now it records the person's go-ahead and the
    worker continues the run; the server sends nothing."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    _, run_id, worker = interrupted(engine, who, box, payments, clock, "a")
    bearer = {"Authorization": f"Bearer {creds[0]['alice']}"}

    with (
        _desk.serving(engine) as base,
        httpx.Client(base_url=base, headers=bearer, timeout=10) as http,
    ):
        answer = http.post(f"/api/v1/runs/{run_id}/resume", json={})
    assert answer.status_code == 200, answer.text
    assert answer.json()["go_ahead"] == "alice"
    assert paid(box) == []  # the server ran no node

    assert worker.run_once() == {run_id: "ended"}
    assert paid(box) == ["a"]


def test_R9_K1_charter_resume_without_a_segment_gives_a_go_ahead(
    cli: Callable[..., tuple[int, Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    box: Sandbox,
    payments: HttpAdapter,
) -> None:
    """``charter resume RUN`` on a run workers carry records the go-ahead of the
    principal whose credential is given; on any other run it asks for a segment
    and changes nothing."""
    names = ("agent", "alice")
    pairs = {name: credential(name) for name in names}
    config = tmp_path / "charter.toml"
    config.write_text(
        f'store = "{tmp_path / "charter.db"}"\nresume = "human"\nlease_seconds = 1\n'
        "send_deadline_seconds = 0.5\n"
        "[credentials]\n" + "".join(f'{n} = "{pairs[n][1]}"\n' for n in names)
    )
    with charter.Engine.open(
        str(tmp_path / "charter.db"), config=charter.EngineConfig.from_file(config)
    ) as engine:
        who = {n: engine.authenticate(pairs[n][0]) for n in names}
        mission = engine.create_mission(contract(), by=who["alice"])
        run = engine.submit(mission, by=who["agent"], plan=plans.PAY, input=pay_input(box, "c"))
        assert engine.begin(run.id, "lost-worker") is not None
        worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
        waited = time.monotonic() + 10  # the lost worker's one-second lease runs out
        while (taken := worker.run_once()) != {run.id: "needs_person"}:
            assert taken in ({}, {run.id: "held"}) and time.monotonic() < waited, taken
            time.sleep(0.05)
        own = engine.start_run(mission, by=who["agent"], segment_id="own")
        monkeypatch.setenv("CHARTER_CONFIG", str(config))
        monkeypatch.setenv("CHARTER_CREDENTIAL", pairs["alice"][0])

        code, refused = cli("resume", own.run_id)
        assert code != 0 and "--segment" in refused
        assert "run.go_ahead" not in kinds(engine, mission)

        code, out = cli("resume", run.id, "--json")
        assert (code, out["go_ahead"]) == (0, "alice")
        assert paid(box) == []
        assert worker.run_once() == {run.id: "ended"}
        assert paid(box) == ["c"]


def test_R9_a_go_ahead_is_used_up_by_whichever_continuation_comes_first(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, clock: ManualClock
) -> None:
    """Broken: a go-ahead given for one interruption outlived a continuation made on
    a person's own word (a resume by hand), and let a worker through the next
    interruption, which nobody had looked at."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = interrupted(engine, who, box, payments, clock, "a")
    engine.coordinator.go_ahead(run_id, by=who.alice)
    owner = engine.run(run_id).owner_segment
    assert owner is not None
    engine.coordinator.resume(run_id, owner, by=who.alice)  # held by hand, then lost
    assert engine.queued_run(run_id)["go_ahead_by"] is None  # type: ignore[index]
    clock.advance(LEASE + 1)

    assert worker.run_once() == {run_id: "needs_person"}
    assert paid(box) == []
    assert kinds(engine, mission).count("run.go_ahead") == 1
