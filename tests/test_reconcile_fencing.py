"""F1-F3 for the executor a reconcile builds for an idle owner (R7, A8).

``Coordinator.reconcile(attempt, adapter, segment_id=...)`` acts as the segment
that ``recover`` installed, with no executor holding the run: after the lookup,
it may replay an ``idempotent_keyed`` send with the attempt's own key. The
lookup takes as long as the target takes, so the run can change hands while it
runs: the lease can pass, another engine can recover the run as a newer
segment, the mission can be handed over to another store. The replay is a
send, so its commit is fenced like any dispatch (F2): by then the executor is
no longer the owner, and it must send nothing and settle nothing.

Every test asserts on what the payments sandbox received over real sockets
(its request log: the only create is the first send) and on what the store
holds. The engine settles conclusive evidence by itself
(``evidence_settles="auto"``), so a replay that got out would also settle the
attempt: it stays UNKNOWN with its hold.

An executor's explicit lease renewal is a write of the run's row like any
other, so it is fenced the same way: by the lease, the epoch and owning
segment, and the claim (the last tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import charter
from charter import AttemptStatus, Evidence
from charter.adapters.http import HttpAdapter
from charter.sandbox import Sandbox
from charter.testing import ManualClock
from conftest import Principals, default_contract, payment, payments_contract

UNIT = "usd_cents"
SANDBOX_KEY = "sk_test"
MakeEngine = Callable[..., charter.Engine]


@pytest.fixture
def engine(make_engine: MakeEngine, key: str) -> charter.Engine:
    """Conclusive evidence settles at once: a stray replay would show as a settlement."""
    return make_engine(evidence_settles="auto", signing_key=key)


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    return engine.create_mission(payments_contract(), by=who.alice)


def creates(box: Sandbox) -> list[dict[str, Any]]:
    """Every payment creation the sandbox received, applied or not."""
    return [r for r in box.requests() if r["kind"] == "create"]


def events(engine: charter.Engine, mission: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in engine.audit_events(mission) if e["kind"] == kind]


@pytest.fixture
def lost(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> charter.Attempt:
    """A payment the sandbox applied whose answer never came back; its owner's
    lease ran out and ``seg-2`` recovered the run, idle (nobody holds it)."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("drop_after_apply")
    attempt = ex.perform(payments, "pay", payment(7_00, "inv-1"), effect_key="inv-1")
    assert attempt.status is AttemptStatus.UNKNOWN
    expire_lease(engine, ex.run_id, clock)
    engine.coordinator.recover(ex.run_id, "seg-2")
    run = engine.run(ex.run_id)
    assert (run.owner_segment, run.epoch) == ("seg-2", 2)
    return attempt


def expire_lease(engine: charter.Engine, run_id: str, clock: ManualClock) -> None:
    """Move the store's clock to the very microsecond the run's lease ends."""
    clock.advance((engine.run(run_id).lease_expires_us - clock.now_us()) / 1e6)
    assert clock.now_us() == engine.run(run_id).lease_expires_us


def looking_up_while(payments: HttpAdapter, box: Sandbox, meanwhile: Callable[[], None]) -> None:
    """The adapter's lookup lets ``meanwhile`` happen, then asks a sandbox whose
    lookups are down: the evidence is indeterminate, so a replay is wanted."""
    lookup = payments.reconcile

    def slow_lookup(attempt: charter.RecordedAttempt) -> Evidence:
        meanwhile()
        box.fault("lookups_unavailable")
        return lookup(attempt)

    payments.reconcile = slow_lookup  # type: ignore[method-assign]


def assert_fenced_executor_did_nothing(
    engine: charter.Engine, mission: str, box: Sandbox, attempt: charter.Attempt
) -> None:
    """The sandbox saw the first send only; the store shows no replay and no settlement."""
    [first] = creates(box)
    assert (first["idempotency_key"], first["fencing_token"]) == (
        attempt.idempotency_key,
        f"{attempt.run_id}:1",
    )
    assert len(box.payments()) == 1
    assert events(engine, mission, "attempt.replayed") == []
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 7_00
    assert engine.balances(mission)[UNIT].spent == 0
    sources = [row["source"] for row in engine.evidence(attempt.id)]
    assert "same-key replay" not in sources


def test_F2_a_recovery_during_the_lookup_fences_the_idle_owners_replay(
    make_engine: MakeEngine,
    engine: charter.Engine,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
    lost: charter.Attempt,
) -> None:
    """While seg-2's lookup runs, its lease passes and another engine recovers the
    run as seg-3 (epoch 3). seg-2's replay would go out with the attempt's key and
    the stale token ``run:2``, which the sandbox, never having seen epoch 3, would
    answer: only the fence stops it. seg-3, the owner now, may replay."""
    elsewhere = make_engine()

    def taken_over() -> None:
        expire_lease(engine, lost.run_id, clock)
        elsewhere.coordinator.recover(lost.run_id, "seg-3")

    looking_up_while(payments, box, taken_over)
    evidence = engine.coordinator.reconcile(lost.id, payments, segment_id="seg-2")

    assert evidence.verdict == "indeterminate"
    assert evidence.detail["status"] == 503  # the lookup's own answer, kept as it was
    run = engine.run(lost.run_id)
    assert (run.owner_segment, run.epoch) == ("seg-3", 3)
    assert_fenced_executor_did_nothing(engine, mission, box, lost)
    assert [row["verdict"] for row in engine.evidence(lost.id)] == ["indeterminate"]

    # The owner now can: the same reconcile as seg-3 replays, and settles (auto).
    payments.reconcile = HttpAdapter.reconcile.__get__(payments)  # type: ignore[method-assign]
    box.fault("lookups_unavailable")
    assert engine.coordinator.reconcile(lost.id, payments, segment_id="seg-3").verdict == (
        "applied"
    )
    assert [(r["verdict"], r["fencing_token"]) for r in creates(box)][1:] == [
        ("replayed", f"{lost.run_id}:3")
    ]
    assert len(box.payments()) == 1
    assert engine.get_attempt(lost.id).status is AttemptStatus.SUCCEEDED


def test_F2_a_lease_that_ends_during_the_lookup_fences_the_idle_owners_replay(
    engine: charter.Engine,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
    lost: charter.Attempt,
) -> None:
    """Nobody takes the run over, but seg-2's lease ends (to the microsecond, by
    the store's clock) while its lookup runs: an owner whose lease expired is
    fenced (F1, F2), so nothing is replayed and nothing renews the lease."""
    lease = engine.run(lost.run_id).lease_expires_us

    looking_up_while(payments, box, lambda: expire_lease(engine, lost.run_id, clock))
    evidence = engine.coordinator.reconcile(lost.id, payments, segment_id="seg-2")

    assert evidence.verdict == "indeterminate"
    run = engine.run(lost.run_id)
    assert (run.owner_segment, run.epoch, run.lease_expires_us) == ("seg-2", 2, lease)
    assert events(engine, mission, "run.lease_renewed") == []
    assert_fenced_executor_did_nothing(engine, mission, box, lost)


def test_F2_S5_a_handover_during_the_lookup_fences_the_idle_owners_replay(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    lost: charter.Attempt,
) -> None:
    """While seg-2's lookup runs, the mission is handed over to another store: the
    run's epoch moves on under the same owning segment, with nobody holding it.
    A replay would make two stores able to send the same effect (S5): none goes
    out. The mission is sealed here now, so the lookup's answer cannot be recorded
    either: the reconcile says so with a typed error."""

    def handed_over() -> None:
        engine.export_snapshot(mission, handover_to="store-elsewhere", by=who.alice)

    looking_up_while(payments, box, handed_over)
    with pytest.raises(charter.MissionSealed):
        engine.coordinator.reconcile(lost.id, payments, segment_id="seg-2")

    run = engine.run(lost.run_id)
    assert (run.status.value, run.owner_segment, run.epoch) == ("handed_off", "seg-2", 3)
    assert_fenced_executor_did_nothing(engine, mission, box, lost)


# -- renewing a lease is fenced like any write (F1) ----------------------------------


def renewals(engine: charter.Engine, mission: str) -> list[tuple[str, int]]:
    return [(e["segment"], e["epoch"]) for e in events(engine, mission, "run.lease_renewed")]


def test_F1_a_lease_that_ended_cannot_be_renewed(
    engine: charter.Engine, who: Principals, mission: str, clock: ManualClock
) -> None:
    """At the microsecond its lease ends (by the store's clock), the executor no
    longer holds the run: renewing it then would revive an owner whom a recovery
    may already treat as gone. Refused, and the run is free to be recovered."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    expire_lease(engine, ex.run_id, clock)
    lease = engine.run(ex.run_id).lease_expires_us

    with pytest.raises(charter.Fenced) as fenced:
        ex.renew_lease()

    assert (fenced.value.epoch, fenced.value.current_epoch) == (1, 1)
    assert engine.run(ex.run_id).lease_expires_us == lease
    assert renewals(engine, mission) == []
    engine.coordinator.recover(ex.run_id, "seg-2")  # no force needed: the lease is over
    assert engine.run(ex.run_id).owner_segment == "seg-2"


def test_F1_an_executor_that_let_go_cannot_renew_the_lease_of_a_newer_owner(
    engine: charter.Engine,
    who: Principals,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    """An executor whose node waits for an approval lets go of the run (no claim);
    the run is then recovered as seg-2, idle, with a fresh lease and no claim
    either. Only the epoch and the owning segment tell the old executor apart:
    its renewal must not extend seg-2's lease, and it must send nothing."""
    contract = default_contract(
        principals={
            "agent": {"run": ["payments.*"]},
            "alice": ["resolve", "stop", "approve"],
        },
        allowance={UNIT: 100_000},
        approvals={"required": ["payments.pay"]},
    )
    mission = engine.create_mission(contract, by=who.alice)
    pay = payment(3_00, "inv-2")

    @charter.node
    def paying(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(payments, "pay", pay)

    plan = charter.Plan("paying", (paying,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    expire_lease(engine, ex.run_id, clock)
    engine.coordinator.recover(ex.run_id, "seg-2")
    taken = engine.run(ex.run_id)
    clock.advance(20)  # past half of seg-2's lease: a renewal would move it

    with pytest.raises(charter.Fenced) as fenced:
        ex.renew_lease()
    (request,) = engine.approvals(pending=True)
    engine.approve(request.id, by=who.alice)
    with pytest.raises(charter.Fenced):
        ex.execute(plan)

    assert (fenced.value.epoch, fenced.value.current_epoch) == (1, 2)
    run = engine.run(ex.run_id)
    assert (run.owner_segment, run.epoch, run.lease_expires_us) == (
        "seg-2",
        2,
        taken.lease_expires_us,
    )
    assert renewals(engine, mission) == []
    assert creates(box) == []


def test_F1_an_executor_whose_segment_another_resumed_cannot_renew_its_lease(
    make_engine: MakeEngine,
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    """seg-1's executor stalls past its lease; another engine resumes seg-1 (the
    same owner at the same epoch, another claim). Only the claim tells the stalled
    executor apart: it renews nothing and sends nothing; the one holding the
    segment now renews."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    expire_lease(engine, ex.run_id, clock)
    elsewhere = make_engine()
    agent = elsewhere.authenticate(who.credentials["agent"])
    second = elsewhere.coordinator.resume(ex.run_id, "seg-1", by=agent)
    held = engine.run(ex.run_id)
    clock.advance(20)

    with pytest.raises(charter.Fenced) as fenced:
        ex.renew_lease()
    pay = payment(3_00, "inv-3")
    with pytest.raises(charter.Fenced):
        ex.perform(payments, "pay", pay, effect_key="inv-3")

    assert (fenced.value.epoch, fenced.value.current_epoch) == (1, 1)
    assert engine.run(ex.run_id).lease_expires_us == held.lease_expires_us
    assert renewals(engine, mission) == []
    assert creates(box) == []
    renewed = second.renew_lease()
    assert engine.run(ex.run_id).lease_expires_us == renewed > held.lease_expires_us
    assert renewals(engine, mission) == [("seg-1", 1)]
