"""A person's go-ahead lets workers continue a run under the human policy (R9, K1).

Under ``resume = "human"`` every continuation needs a person's word. For a run
workers carry, that word is a go-ahead: recorded, audited, used by the next
worker that takes the run, once. Each test drives a :class:`charter.Worker` in
this process on both stores and asserts on what the store recorded and what
the payments sandbox took.
"""

from __future__ import annotations

import json
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
from charter.testing import credential
from conftest import Principals, default_contract, stored

MakeEngine = Callable[..., charter.Engine]


@pytest.fixture(autouse=True)
def _plans_adapters() -> Any:
    yield
    plans.close()


def human_engine(make_engine: MakeEngine, **config: Any) -> charter.Engine:
    """Workers under the default policy: every continuation needs a person."""
    return make_engine(resume="human", evidence_settles="auto", lease_seconds=30.0, **config)


def contract() -> dict[str, Any]:
    """Every payment needs bob's approval; alice may let a run go on (``run``)."""
    return default_contract(
        approvals={"required": ["payments.pay"], "ttl_seconds": 600},
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


def waiting_for_a_person(
    engine: charter.Engine, who: Principals, box: Sandbox, payments: HttpAdapter, *invoices: str
) -> tuple[str, str, charter.Worker]:
    """A submitted run begun by a worker, its first payment approved, parked: the
    worker may not continue it on its own. The mission, the run, the worker."""
    mission = engine.create_mission(contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, *invoices))
    worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
    assert worker.run_once() == {run.id: "waiting"}
    [approval] = engine.approvals(run_id=run.id, pending=True)
    engine.approve(approval.id, by=who.bob)
    assert worker.run_once() == {run.id: "needs_person"}
    assert paid(box) == []
    return mission, run.id, worker


def test_R9_K1_a_persons_go_ahead_lets_the_next_worker_continue_the_run_once(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Broken: under the human policy a worker-carried run could only go on in the
    deciding person's own process, which has neither the plan nor the adapters;
    and a go-ahead, once given, let every later continuation through."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = waiting_for_a_person(engine, who, box, payments, "a", "b")

    given = engine.coordinator.go_ahead(run_id, by=who.alice)

    assert engine.queued_run(run_id)["go_ahead_by"] == "alice"  # type: ignore[index]
    assert [e["actor"] for e in engine.audit_events(mission) if e["kind"] == "run.go_ahead"] == [
        "alice"
    ]
    assert given.status is not RunStatus.COMPLETED and paid(box) == []  # nothing ran here
    # The worker continues on alice's word, pays "a", and waits for "b"'s approval.
    assert worker.run_once() == {run_id: "waiting"}
    assert paid(box) == ["a"]
    assert engine.queued_run(run_id)["go_ahead_by"] is None  # type: ignore[index]
    resumed = [e for e in engine.audit_events(mission) if e["kind"] == "run.resumed"]
    assert [json.loads(e["payload"])["go_ahead_by"] for e in resumed] == ["alice"]

    # One go-ahead, one continuation: the next one needs a person's word again.
    [second] = engine.approvals(run_id=run_id, pending=True)
    engine.approve(second.id, by=who.bob)
    assert worker.run_once() == {run_id: "needs_person"}
    assert paid(box) == ["a"]
    engine.coordinator.go_ahead(run_id, by=who.alice)
    assert worker.run_once() == {run_id: "ended"}
    assert paid(box) == ["a", "b"]
    assert engine.run(run_id).status is RunStatus.COMPLETED
    assert engine.check_ledger(mission) == []


def test_P3_R9_a_go_ahead_refused_changes_nothing(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Broken: a go-ahead from a principal without ``run``, or for a run that is
    not carried by workers, not begun, or held by a live executor, was recorded."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = waiting_for_a_person(engine, who, box, payments, "a")
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
    assert worker.run_once() == {queued.id: "waiting"}  # the parked run was not made due

    # An executor holding the run carries it on already: no go-ahead is taken.
    held = engine.submit(mission, by=who.agent, plan=plans.PAY, input=pay_input(box, "h"))
    executor = engine.begin(held.id, "carrier")
    assert executor is not None
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
    mission = engine.create_mission(
        default_contract(
            principals={"agent": {"run": ["payments.*"]}, "alice": ["resolve", "stop", "run"]},
            allowance={"usd_cents": 100_000},
        ),
        by=who.alice,
    )
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
    assert [e["kind"] for e in engine.audit_events(mission)][-1] == "go_ahead.refused"
    assert worker.run_once() == {}
    assert paid(box) == ["lost"]


def test_R9_a_finished_run_takes_no_go_ahead(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = waiting_for_a_person(engine, who, box, payments, "a")
    engine.coordinator.go_ahead(run_id, by=who.alice)
    assert worker.run_once() == {run_id: "ended"}
    before = stored(engine, mission)

    with pytest.raises(RunTerminal):
        engine.coordinator.go_ahead(run_id, by=who.alice)
    assert stored(engine, mission) == before


def test_R9_K1_the_desks_resume_gives_a_worker_carried_run_a_go_ahead(
    make_engine: MakeEngine,
    creds: Any,
    box: Sandbox,
    payments: HttpAdapter,
) -> None:
    """Broken: the console's and the API's resume ran a worker-carried run's plan in
    the web server's own process. Now it records the person's go-ahead and the
    worker continues the run; the server sends nothing."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    _, run_id, worker = waiting_for_a_person(engine, who, box, payments, "a")
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
    names = ("agent", "alice", "bob")
    pairs = {name: credential(name) for name in names}
    config = tmp_path / "charter.toml"
    config.write_text(
        f'store = "{tmp_path / "charter.db"}"\nresume = "human"\nevidence_settles = "auto"\n'
        "[credentials]\n" + "".join(f'{n} = "{pairs[n][1]}"\n' for n in names)
    )
    with charter.Engine.open(
        str(tmp_path / "charter.db"), config=charter.EngineConfig.from_file(config)
    ) as engine:
        who = {n: engine.authenticate(pairs[n][0]) for n in names}
        mission = engine.create_mission(contract(), by=who["alice"])
        run = engine.submit(mission, by=who["agent"], plan=plans.PAY, input=pay_input(box, "c"))
        worker = charter.Worker(engine, plans.PLANS, adapters=[payments])
        assert worker.run_once() == {run.id: "waiting"}
        [approval] = engine.approvals(run_id=run.id, pending=True)
        engine.approve(approval.id, by=who["bob"])
        assert worker.run_once() == {run.id: "needs_person"}
        own = engine.start_run(mission, by=who["agent"], segment_id="own")
        monkeypatch.setenv("CHARTER_CONFIG", str(config))
        monkeypatch.setenv("CHARTER_CREDENTIAL", pairs["alice"][0])

        code, refused = cli("resume", own.run_id)
        assert code != 0 and "--segment" in refused
        assert engine.audit_events(mission)[-1]["kind"] != "run.go_ahead"

        code, out = cli("resume", run.id, "--json")
        assert (code, out["go_ahead"]) == (0, "alice")
        assert paid(box) == []
        assert worker.run_once() == {run.id: "ended"}
        assert paid(box) == ["c"]


def test_R9_P3_a_go_ahead_whose_giver_lost_the_run_right_continues_nothing(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """Broken R9: a worker continued on the word of a person whose ``run`` right
    was revoked between the go-ahead and the continuation. The right is checked
    again against the contract the run would continue under."""
    engine = human_engine(make_engine)
    who = Principals(creds[0], creds[1], engine)
    mission, run_id, worker = waiting_for_a_person(engine, who, box, payments, "a")
    engine.coordinator.go_ahead(run_id, by=who.alice)
    revoked = contract()
    revoked["principals"]["alice"] = ["resolve", "stop"]
    engine.amend_contract(mission, revoked, by=who.alice, reason="alice no longer runs")
    kinds = [e["kind"] for e in engine.audit_events(mission)]

    assert worker.run_once() == {run_id: "needs_person"}
    assert paid(box) == []
    assert engine.queued_run(run_id)["go_ahead_by"] == "alice"  # type: ignore[index]
    after = [e["kind"] for e in engine.audit_events(mission)]
    assert after.count("run.resumed") == kinds.count("run.resumed")
