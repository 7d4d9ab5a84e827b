"""The coordinator on a real store: recover, reconcile, confirm, resolve, resume.

Tests are named by the rule they prove (docs/rules.md: R1-R9, A8, with W2, L4,
L9 where they meet recovery), plus one test per row of the recovery table
that is observable without node execution. Every assertion reads stored data
(runs, attempts, evidence, ledger, balances, approvals, audit events) or what
the adapter was actually asked to send.

A process that dies inside the adapter call is staged by an adapter script
that raises a ``BaseException`` the executor does not catch: the attempt is
left DISPATCHED exactly as a killed process leaves it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import charter
from charter import AttemptStatus, RunStatus
from charter.adapters import Dispatch, EffectClass, Evidence, Operation, Outcome
from charter.engine.coordinator import Resolution
from charter.recovery.state import NEXT_ACTIONS, RecoveryState
from charter.testing import ManualClock, RecordingAdapter
from charter.waits.approvals import ApprovalStatus
from conftest import Principals, default_contract, stored

Creds = tuple[dict[str, str], dict[str, str]]
MakeEngine = Callable[..., charter.Engine]

#: One default lease (30 s) and a little more: the owner's lease has expired.
LEASE = 31
MODES = ("automatic", "rules", "human")
OUTCOMES: tuple[Resolution, ...] = ("succeeded", "failed", "written_off")


class ProcessDied(BaseException):
    """The process dies inside the adapter call; nothing after the send runs."""


def die(send: Dispatch) -> Outcome:
    raise ProcessDied(send.attempt_id)


def lose(send: Dispatch) -> Outcome:
    raise TimeoutError("the response was lost")


def fail(send: Dispatch) -> Outcome:
    return Outcome.failed(
        {"error": "declined"}, cost={"usd": 0, "calls": 1}, receipt={"id": "declined"}
    )


def always(state: RecoveryState) -> bool:
    return True


# -- helpers --------------------------------------------------------------------


def open_engine(
    make_engine: MakeEngine, creds: Creds, contract: dict[str, Any] | None = None, **config: Any
) -> tuple[charter.Engine, Principals, str]:
    """An engine with ``config`` on the test store, its principals and a new mission."""
    eng = make_engine(**config)
    people = Principals(creds[0], creds[1], eng)
    mission = eng.create_mission(contract or default_contract(), by=people.alice)
    return eng, people, mission


def left_dispatched(
    ex: charter.Executor, adapter: RecordingAdapter, operation: str = "write", key: str = "died"
) -> str:
    """An attempt left DISPATCHED: the process died while the adapter was sending."""
    adapter.script[operation] = die
    with pytest.raises(ProcessDied):
        ex.perform(adapter, operation, {"key": key}, effect_key=key)
    del adapter.script[operation]
    return adapter.sent[-1].attempt_id


def left_unknown(
    ex: charter.Executor, adapter: RecordingAdapter, operation: str = "write", key: str = "lost"
) -> str:
    """An attempt left UNKNOWN: the adapter call timed out."""
    adapter.script[operation] = lose
    attempt = ex.perform(adapter, operation, {"key": key}, effect_key=key)
    del adapter.script[operation]
    assert attempt.status is AttemptStatus.UNKNOWN
    return attempt.id


def events(engine: charter.Engine, mission: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in engine.audit_events(mission) if e["kind"] == kind]


def payload(event: dict[str, Any]) -> Any:
    return json.loads(event["payload"])


def new_events(engine: charter.Engine, mission: str, seen: int) -> list[dict[str, Any]]:
    return engine.audit_events(mission)[seen:]


def held(engine: charter.Engine, mission: str) -> dict[str, int]:
    return {u: b.held for u, b in engine.balances(mission).items()}


def spent(engine: charter.Engine, mission: str) -> dict[str, int]:
    return {u: b.spent for u, b in engine.balances(mission).items()}


def entries_for(
    engine: charter.Engine, mission: str, attempt_id: str
) -> list[tuple[str, str, int]]:
    return sorted(
        (e["kind"], e["unit"], e["amount"])
        for e in engine.ledger_entries(mission)
        if e["attempt_id"] == attempt_id
    )


def forged(name: str) -> charter.Principal:
    """A principal built by hand: it carries no proof this engine issued."""
    return charter.Principal(name, "0" * 64)


def approval_contract(
    scope: str = "recorder.write", ttl: int = 3600, **more: Any
) -> dict[str, Any]:
    return default_contract(approvals={"required": [scope], "ttl_seconds": ttl}, **more)


def wait_for_approval(
    engine: charter.Engine,
    ex: charter.Executor,
    adapter: RecordingAdapter,
    operation: str,
    request: Any,
    *,
    key: str,
    generation: int = 1,
    retry_of: str | None = None,
) -> tuple[str, str]:
    """Admit an effect that needs approval; return (attempt ID, pending approval ID)."""
    with pytest.raises(charter.ApprovalRequired) as refused:
        ex.perform(
            adapter, operation, request, effect_key=key, generation=generation, retry_of=retry_of
        )
    attempt_id = refused.value.details["attempt_id"]
    pending = [
        a
        for a in engine.approvals(run_id=ex.run_id, pending=True)
        if a.effect_id.endswith(f"/{key}")
    ]
    assert len(pending) == 1
    return attempt_id, pending[0].id


# -- R1: segments are never reused; a live lease is not taken without force -----------


def test_r1_reused_segment_refused_and_nothing_changed(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    clock.advance(LEASE)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.SegmentReused):
        engine.coordinator.recover(ex.run_id, "seg-1")

    assert stored(engine, mission) == before
    assert new_events(engine, mission, seen) == []
    engine.coordinator.recover(ex.run_id, "seg-2")
    clock.advance(LEASE)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))
    for used in ("seg-1", "seg-2"):
        with pytest.raises(charter.SegmentReused):
            engine.coordinator.recover(ex.run_id, used)
    assert stored(engine, mission) == before
    assert new_events(engine, mission, seen) == []
    assert engine.run(ex.run_id).epoch == 2


def test_r1_live_lease_refused_and_the_owner_keeps_working(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(29)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.LeaseHeld):
        engine.coordinator.recover(ex.run_id, "seg-2")

    assert stored(engine, mission) == before
    assert new_events(engine, mission, seen) == []
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert [s.epoch for s in adapter.sent] == [1]
    # The refused segment was not recorded as used: it can take over later.
    clock.advance(LEASE)
    assert engine.coordinator.recover(ex.run_id, "seg-2").epoch == 2


def test_r1_force_needs_a_principal_with_stop_is_audited_and_fences_the_owner(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    run_id = ex.run_id
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.NotAuthorized):
        engine.coordinator.recover(run_id, "seg-2", force=True)
    with pytest.raises(charter.NotAuthorized):
        engine.coordinator.recover(run_id, "seg-2", force=True, by=who.agent)
    with pytest.raises(charter.AuthenticationError):
        engine.coordinator.recover(run_id, "seg-2", force=True, by=forged("alice"))

    assert stored(engine, mission) == before
    refusals = new_events(engine, mission, seen)
    assert [(e["kind"], e["actor"]) for e in refusals] == [
        ("authorization.refused", "agent"),
        ("auth.refused", "alice"),
    ]

    state = engine.coordinator.recover(run_id, "seg-2", force=True, by=who.alice)

    run = engine.run(run_id)
    assert (run.epoch, run.owner_segment, state.epoch) == (2, "seg-2", 2)
    [recovered] = events(engine, mission, "run.recovered")
    assert recovered["actor"] == "alice"
    assert payload(recovered)["forced"] is True
    assert payload(recovered)["previous_segment"] == "seg-1"
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert adapter.sent == []
    assert engine.attempts(run_id=run_id) == []


def test_r1_recover_refuses_a_forged_principal_and_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, clock: ManualClock
) -> None:
    # P1: every decision records the authenticated identity; a forgery is refused.
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)
    before = stored(engine, mission)

    with pytest.raises(charter.AuthenticationError):
        engine.coordinator.recover(ex.run_id, "seg-2", by=forged("alice"))

    assert stored(engine, mission) == before
    assert events(engine, mission, "run.recovered") == []


# -- R2: every recovery increments the epoch and installs the new segment ---------------


def test_r2_every_recovery_increments_the_epoch_and_makes_the_segment_owner(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    for epoch, segment in ((2, "seg-2"), (3, "seg-3"), (4, "seg-4")):
        clock.advance(LEASE)
        state = engine.coordinator.recover(ex.run_id, segment)
        run = engine.run(ex.run_id)
        assert (run.epoch, run.owner_segment, run.recoveries) == (epoch, segment, epoch - 1)
        assert run.lease_expires_us > clock.now_us()
        assert (state.epoch, state.run.owner_segment) == (epoch, segment)
    recovered = events(engine, mission, "run.recovered")
    assert [(e["before"], e["after"], e["segment"]) for e in recovered] == [
        ("1", "2", "seg-2"),
        ("2", "3", "seg-3"),
        ("3", "4", "seg-4"),
    ]
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert adapter.sent == []


def test_r2_resume_with_a_new_segment_is_a_change_of_owner(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)

    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")

    run = eng.run(ex.run_id)
    assert (run.epoch, run.owner_segment, ex2.epoch) == (2, "seg-2", 2)
    assert len(events(eng, mission, "run.recovered")) == 1


# -- R3: PREPARED of older epochs voided; approvals stay bound to the effect ------------


def test_r3_prepared_attempts_of_older_epochs_are_voided_releasing_exactly_their_hold(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, approval_contract())
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    first = ex.admit(adapter, "write", {"to": "a"}, effect_key="a").id
    second, _ = wait_for_approval(eng, ex, adapter, "write", {"to": "b"}, key="b")
    assert held(eng, mission) == {"usd": 10_000, "calls": 2}
    clock.advance(LEASE)

    state = eng.coordinator.recover(ex.run_id, "seg-2")

    assert sorted(state.voided) == sorted([first, second])
    for attempt_id in (first, second):
        attempt = eng.get_attempt(attempt_id)
        assert attempt.status is AttemptStatus.VOIDED
        assert attempt.dispatched_epoch is None
        assert entries_for(eng, mission, attempt_id) == [
            ("hold", "calls", 1),
            ("hold", "usd", 5_000),
            ("release", "calls", 1),
            ("release", "usd", 5_000),
        ]
    assert held(eng, mission) == {"usd": 0, "calls": 0}
    assert spent(eng, mission) == {"usd": 0, "calls": 0}
    assert eng.check_ledger(mission) == []
    assert adapter.sent == []
    # They can no longer be sent: not by the old owner, not by the new one.
    with pytest.raises(charter.Fenced):
        ex.dispatch(first, adapter)
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.StateError):
        ex2.dispatch(first, adapter)
    assert adapter.sent == []
    assert eng.get_attempt(first).status is AttemptStatus.VOIDED


def test_r3_w2_an_approved_effect_readmitted_after_recovery_reuses_its_approval(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, approval_contract(), resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    old, approval_id = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    assert eng.approve(approval_id, by=who.bob) is ApprovalStatus.APPROVED
    clock.advance(LEASE)  # the process died before dispatching

    eng.coordinator.recover(ex.run_id, "seg-2")
    assert eng.get_attempt(old).status is AttemptStatus.VOIDED
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")
    attempt = ex2.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=old
    )

    assert attempt.status is AttemptStatus.SUCCEEDED
    assert attempt.id != old
    assert attempt.retry_of == old
    assert [a.id for a in eng.approvals(run_id=ex.run_id)] == [approval_id]
    assert events(eng, mission, "approval.requested")[-1]["entity"] == approval_id
    assert [(s.attempt_id, s.epoch) for s in adapter.sent] == [(attempt.id, 2)]


def test_r3_w2_a_pending_approval_stays_bound_and_a_changed_request_needs_a_new_one(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, approval_contract(), resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    old, approval_id = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    clock.advance(LEASE)
    eng.coordinator.recover(ex.run_id, "seg-2")
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")

    again, still = wait_for_approval(
        eng, ex2, adapter, "write", {"to": "x"}, key="send", generation=2, retry_of=old
    )
    assert still == approval_id
    assert len(eng.approvals(run_id=ex.run_id)) == 1
    eng.approve(approval_id, by=who.bob)
    assert ex2.dispatch(again, adapter).status is AttemptStatus.SUCCEEDED
    # The effect is settled: it is never performed again, with this request or
    # another (A4), and no approval is asked for it.
    with pytest.raises(charter.AttemptAlreadySettled):
        ex2.perform(adapter, "write", {"to": "y"}, effect_key="send", generation=3, retry_of=again)
    assert len(eng.approvals(run_id=ex.run_id)) == 1
    assert [s.attempt_id for s in adapter.sent] == [again]


# -- R4: DISPATCHED of older owners become UNKNOWN, keeping every hold ---------------------


def test_r4_dispatched_of_the_lost_owner_becomes_unknown_hold_kept_nothing_resent(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_dispatched(ex, adapter, "write")
    sent = list(adapter.sent)
    assert engine.get_attempt(attempt_id).status is AttemptStatus.DISPATCHED
    clock.advance(LEASE)

    state = engine.coordinator.recover(ex.run_id, "seg-2")

    attempt = engine.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.UNKNOWN
    assert attempt.reason is not None and "owner lost" in attempt.reason
    assert attempt.actual is None
    assert attempt.settled_at_us is None
    assert attempt.dispatched_epoch == 1
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}
    assert spent(engine, mission) == {"usd": 0, "calls": 0}
    assert entries_for(engine, mission, attempt_id) == [
        ("hold", "calls", 1),
        ("hold", "usd", 5_000),
    ]
    assert adapter.sent == sent
    assert adapter.reconciled == []
    [unknown] = events(engine, mission, "attempt.unknown")
    assert (unknown["entity"], unknown["before"], unknown["after"], unknown["epoch"]) == (
        attempt_id,
        "dispatched",
        "unknown",
        2,
    )
    assert state.unresolved == [attempt_id]
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    # L4: time passing releases nothing.
    clock.advance(86_400)
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}
    assert engine.check_ledger(mission) == []


def test_r4_an_unknown_attempt_stays_unknown_with_its_hold_across_recoveries(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    before = engine.get_attempt(attempt_id)
    for segment in ("seg-2", "seg-3"):
        clock.advance(LEASE)
        engine.coordinator.recover(ex.run_id, segment)
    assert engine.get_attempt(attempt_id) == before
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}
    assert len(adapter.sent) == 1


# -- R5: the recovery state ------------------------------------------------------------------


def test_r5_recovery_state_holds_what_an_operator_needs(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    contract = approval_contract("recorder.charge", ttl=10)
    eng, who, mission = open_engine(make_engine, creds, contract)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    ok = ex.perform(adapter, "read", {"q": 1}, effect_key="ok")
    adapter.script["write"] = fail
    bad = ex.perform(adapter, "write", {"to": "x"}, effect_key="bad")
    del adapter.script["write"]
    assert (ok.status, bad.status) == (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED)
    unknown = left_unknown(ex, adapter, "write", key="lost")
    dispatched = left_dispatched(ex, adapter, "write", key="died")
    approved, approved_id = wait_for_approval(eng, ex, adapter, "charge", {"n": 1}, key="pay")
    eng.approve(approved_id, by=who.bob)
    pending, pending_id = wait_for_approval(eng, ex, adapter, "charge", {"n": 2}, key="pay2")
    version = eng.amend_contract(
        mission, {**contract, "objective": "v2"}, by=who.alice, reason="new objective"
    )
    clock.advance(LEASE)  # the approval (10 s) expired during the downtime

    recovered = eng.coordinator.recover(ex.run_id, "seg-2")
    state, unresolved = recovered

    assert state is recovered.state
    assert state.run_id == ex.run_id
    assert state.epoch == 2 == eng.run(ex.run_id).epoch
    assert state.run.status is RunStatus.NEEDS_INTERVENTION
    assert state.contract_version == version == 2
    assert sorted(unresolved) == sorted([unknown, dispatched])
    assert unresolved == state.unresolved == [a.id for a in state.attempts]
    assert state.attempts == [eng.get_attempt(i) for i in unresolved]  # in full
    assert all(a.status is AttemptStatus.UNKNOWN for a in state.attempts)
    assert state.settled_counts == {"succeeded": 1, "failed": 1, "voided": 2}
    assert sorted(state.voided) == sorted([approved, pending])
    waits = {w["id"]: w for w in state.waits}
    assert (waits[approved_id]["expired"], waits[pending_id]["expired"]) == (True, False)
    # Anything else waiting is a new request for the expired effect (W2), not expired.
    renewals = [w for i, w in waits.items() if i not in (approved_id, pending_id)]
    assert all(
        not w["expired"] and w["effect_id"] == waits[approved_id]["effect_id"] for w in renewals
    )
    a = state.assessment
    assert a["allowance"]["usd"]["held"] == 10_000 == eng.balances(mission)["usd"].held
    assert a["allowance"]["calls"]["held"] == 2
    assert a["authority"] is True
    assert (a["stop_conditions"], a["exhausted"], a["open_incidents"]) == ([], [], 0)
    actions = {(n.kind, n.id): (n.phase, n.action) for n in state.next_actions}
    assert actions == {
        ("attempt", unknown): ("unknown", NEXT_ACTIONS["uncertain"]),
        ("attempt", dispatched): ("unknown", NEXT_ACTIONS["uncertain"]),
        ("attempt", approved): ("prepared", NEXT_ACTIONS["prepared"]),
        ("attempt", pending): ("prepared", NEXT_ACTIONS["prepared"]),
        ("attempts", "settled"): ("settled", NEXT_ACTIONS["settled"]),
    }
    out = json.loads(json.dumps(state.to_dict()))
    assert (out["run_id"], out["epoch"], out["unresolved"]) == (ex.run_id, 2, unresolved)
    assert len(out["next_actions"]) == len(state.next_actions)
    # A read of the state takes no ownership and changes nothing.
    assert eng.coordinator.state(ex.run_id).unresolved == unresolved
    assert eng.run(ex.run_id).epoch == 2


def test_r5_the_next_actions_are_the_recovery_table() -> None:
    assert set(NEXT_ACTIONS) == {
        "no_admission",
        "prepared",
        "uncertain",
        "settled",
        "node_completed",
        "run_terminal",
    }
    assert len(set(NEXT_ACTIONS.values())) == len(NEXT_ACTIONS)


# -- R6: recover reads and fences; it is not a retry loop -------------------------------------


def test_r6_recover_never_dispatches_never_reconciles_never_resumes(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(
        make_engine, creds, approval_contract("recorder.charge"), resume="automatic"
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    ready, approval_id = wait_for_approval(eng, ex, adapter, "charge", {"n": 1}, key="pay")
    eng.approve(approval_id, by=who.bob)  # could be sent: recover must not send it
    left_unknown(ex, adapter, "read", key="lost")
    left_dispatched(ex, adapter, "write", key="died")
    admitted = ex.admit(adapter, "read", {"q": 1}, effect_key="later").id
    sent, count = list(adapter.sent), len(eng.attempts(run_id=ex.run_id))
    clock.advance(LEASE)

    eng.coordinator.recover(ex.run_id, "seg-2")

    assert adapter.sent == sent
    assert adapter.reconciled == []
    attempts = eng.attempts(run_id=ex.run_id)
    assert len(attempts) == count
    assert not [a for a in attempts if a.status is AttemptStatus.DISPATCHED]
    assert {eng.get_attempt(i).status for i in (ready, admitted)} == {AttemptStatus.VOIDED}
    assert events(eng, mission, "run.resumed") == []
    assert events(eng, mission, "attempt.dispatched")[-1]["epoch"] == 1


def test_K1_R6_a_run_taken_over_more_often_than_the_limit_with_nothing_unresolved_goes_on(
    make_engine: MakeEngine, creds: Creds, clock: ManualClock, adapter: RecordingAdapter
) -> None:
    """Takeovers are counted per unresolved effect, not per run (K1): a fleet
    that carries a healthy run through many segments never stops it for that."""
    eng, who, mission = open_engine(
        make_engine, creds, default_contract(max_recoveries=2), resume="automatic"
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    for segment in ("seg-2", "seg-3", "seg-4", "seg-5"):
        clock.advance(LEASE)
        eng.coordinator.recover(ex.run_id, segment)
        assert eng.run(ex.run_id).status is RunStatus.ACTIVE

    last = eng.coordinator.resume(ex.run_id, "seg-5")

    assert last.perform(adapter, "write", {"to": "x"}, effect_key="k").status.value == "succeeded"
    assert eng.run(ex.run_id).recoveries == 4
    assert [s.epoch for s in adapter.sent] == [5]


def test_K1_R6_an_effect_left_unresolved_by_more_takeovers_than_allowed_needs_intervention(
    make_engine: MakeEngine, creds: Creds, clock: ManualClock
) -> None:
    def lost(send: Any) -> Any:
        raise TimeoutError("the answer was lost")

    adapter = RecordingAdapter(script={"write": lost})
    eng, who, mission = open_engine(
        make_engine, creds, default_contract(max_recoveries=2), resume="automatic"
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    uncertain = ex.perform(adapter, "write", {"to": "x"}, effect_key="w")
    assert uncertain.status is AttemptStatus.UNKNOWN
    for segment in ("seg-2", "seg-3"):
        clock.advance(LEASE)
        eng.coordinator.recover(ex.run_id, segment)
        assert "takeovers" not in (eng.run(ex.run_id).status_reason or "")
    clock.advance(LEASE)

    state = eng.coordinator.recover(ex.run_id, "seg-4")

    run = eng.run(ex.run_id)
    assert run.status is RunStatus.NEEDS_INTERVENTION
    assert run.status_reason == (
        "an attempt was left unresolved by 3 takeovers, more than the contract's limit of 2"
    )
    assert state.takeovers == 3
    with pytest.raises(charter.NeedsIntervention) as refused:
        eng.coordinator.resume(ex.run_id, "seg-4")
    assert "left unresolved by 3 takeovers (limit 2)" in str(refused.value)
    eng.coordinator.resolve(
        uncertain.id, by=who.alice, outcome="written_off", evidence="not in the target's log"
    )
    eng.coordinator.resume(ex.run_id, "seg-4")  # settled: the count no longer stands
    assert eng.run(ex.run_id).status is RunStatus.ACTIVE
    assert [s.epoch for s in adapter.sent] == [1]


def test_r7_reconcile_refused_on_a_live_dispatched_attempt(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_dispatched(ex, adapter, "write")
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.StateError):
        engine.coordinator.reconcile(attempt_id, adapter)

    assert engine.evidence(attempt_id) == []
    assert adapter.reconciled == []
    assert stored(engine, mission) == before
    assert [
        e["kind"] for e in new_events(engine, mission, seen) if not e["kind"].endswith(".refused")
    ] == []


def test_r7_reconcile_accepted_on_a_dispatched_attempt_whose_lease_expired(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_dispatched(ex, adapter, "write")
    clock.advance(LEASE)

    engine.coordinator.reconcile(attempt_id, adapter)

    assert adapter.reconciled == [attempt_id]
    assert [e["verdict"] for e in engine.evidence(attempt_id)] == ["indeterminate"]
    assert engine.get_attempt(attempt_id).status is AttemptStatus.DISPATCHED
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}


def test_r7_under_confirm_evidence_is_stored_and_a_person_confirms_it(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_dispatched(ex, adapter, "write")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    adapter.evidence[attempt_id] = Evidence.applied(
        Outcome.succeeded(
            {"id": "msg-1"}, cost={"usd": 4_000, "calls": 1}, receipt={"id": "rcpt-1"}
        )
    )

    evidence = engine.coordinator.reconcile(attempt_id, adapter)

    assert evidence.verdict == "applied"
    [row] = engine.evidence(attempt_id)
    assert (row["verdict"], row["settled"]) == ("applied", 0)
    assert json.loads(row["outcome"])["cost"] == {"usd": 4_000, "calls": 1}
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}
    assert len(events(engine, mission, "evidence.recorded")) == 1
    for outsider in (who.mallory, who.agent):
        with pytest.raises(charter.NotAuthorized):
            engine.coordinator.confirm(attempt_id, by=outsider)
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN

    attempt = engine.coordinator.confirm(attempt_id, by=who.alice)

    assert attempt.status is AttemptStatus.SUCCEEDED
    assert engine.get_attempt(attempt_id).actual == {"usd": 4_000, "calls": 1}
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert spent(engine, mission) == {"usd": 4_000, "calls": 1}
    assert [r["settled"] for r in engine.evidence(attempt_id)] == [1]
    assert events(engine, mission, "attempt.settled")[-1]["actor"] == "alice"
    assert engine.check_ledger(mission) == []
    assert len(adapter.sent) == 1


def test_r7_under_auto_conclusive_evidence_with_a_receipt_settles(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter
) -> None:
    eng, who, mission = open_engine(make_engine, creds, evidence_settles="auto")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    with_receipt = left_unknown(ex, adapter, "write", key="a")
    without_receipt = left_unknown(ex, adapter, "write", key="b")
    outcome = Outcome.succeeded({"id": "m"}, cost={"usd": 3_000, "calls": 1}, receipt={"id": "r"})
    adapter.evidence[with_receipt] = Evidence.applied(outcome)
    adapter.evidence[without_receipt] = Evidence.applied(
        Outcome.succeeded({"id": "m"}, cost={"usd": 3_000, "calls": 1})
    )

    eng.coordinator.reconcile(with_receipt, adapter)
    eng.coordinator.reconcile(without_receipt, adapter)

    settled = eng.get_attempt(with_receipt)
    assert settled.status is AttemptStatus.SUCCEEDED
    assert settled.actual == {"usd": 3_000, "calls": 1}
    assert [r["settled"] for r in eng.evidence(with_receipt)] == [1]
    assert eng.get_attempt(without_receipt).status is AttemptStatus.UNKNOWN
    assert [r["settled"] for r in eng.evidence(without_receipt)] == [0]
    assert held(eng, mission) == {"usd": 5_000, "calls": 1}
    assert spent(eng, mission) == {"usd": 3_000, "calls": 1}
    assert eng.check_ledger(mission) == []
    assert len(adapter.sent) == 2


@pytest.mark.parametrize("settles", ["confirm", "auto"])
def test_r7_indeterminate_evidence_never_settles(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, settles: str
) -> None:
    eng, who, mission = open_engine(make_engine, creds, evidence_settles=settles)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    lookups: list[str] = []

    def broken(attempt: charter.Attempt) -> Evidence:
        lookups.append(attempt.id)
        raise ConnectionError("lookup endpoint down")

    eng.coordinator.reconcile(attempt_id, adapter)  # indeterminate by default
    adapter.reconcile = broken  # type: ignore[method-assign]
    eng.coordinator.reconcile(attempt_id, adapter)

    assert lookups == [attempt_id]
    rows = eng.evidence(attempt_id)
    assert [(r["verdict"], r["settled"]) for r in rows] == [("indeterminate", 0)] * 2
    assert eng.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    assert held(eng, mission) == {"usd": 5_000, "calls": 1}
    with pytest.raises(charter.StateError):
        eng.coordinator.confirm(attempt_id, by=who.alice)
    assert eng.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    assert len(adapter.sent) == 1


def test_r7_reconcile_on_a_settled_attempt_is_refused_and_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    done = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.AttemptAlreadySettled):
        engine.coordinator.reconcile(done.id, adapter, executor=ex)
    with pytest.raises(charter.AttemptAlreadySettled):
        engine.coordinator.confirm(done.id, by=who.alice)

    assert stored(engine, mission) == before
    assert [
        e for e in new_events(engine, mission, seen) if not e["kind"].endswith(".refused")
    ] == []
    assert adapter.reconciled == []
    assert len(adapter.sent) == 1


def test_r7_reconcile_refuses_a_forged_principal(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    # P1: the evidence records who asked; a forged identity is refused, not recorded.
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")

    with pytest.raises(charter.AuthenticationError):
        engine.coordinator.reconcile(attempt_id, adapter, by=forged("alice"))

    assert [r["actor"] for r in engine.evidence(attempt_id)] == []


# -- A8: same-key replay, only by the owner, inside the window ----------------------------------


def test_a8_replay_sends_the_same_key_again_with_an_owning_executor_inside_the_window(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    key = engine.get_attempt(attempt_id).idempotency_key
    clock.advance(10)

    evidence = engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert adapter.reconciled == [attempt_id]  # the lookup comes first
    assert [(s.attempt_id, s.idempotency_key, s.epoch) for s in adapter.sent] == [
        (attempt_id, key, 1),
        (attempt_id, key, 1),
    ]
    assert evidence.verdict == "applied"
    [row] = engine.evidence(attempt_id)
    assert (row["verdict"], row["settled"]) == ("applied", 0)
    [replayed] = events(engine, mission, "attempt.replayed")
    assert (replayed["entity"], payload(replayed)["idempotency_key"]) == (attempt_id, key)
    # Under 'confirm' the replay's answer is evidence, not a settlement.
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    assert held(engine, mission) == {"usd": 20_000, "calls": 1}
    assert len(engine.attempts(run_id=ex.run_id)) == 1


def test_a8_no_replay_when_the_lookup_is_conclusive(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    adapter.evidence[attempt_id] = Evidence.not_applied({"lookup": "no such charge"})

    engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert len(adapter.sent) == 1
    assert events(engine, mission, "attempt.replayed") == []


def test_a8_no_replay_without_an_owning_executor(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")

    engine.coordinator.reconcile(attempt_id, adapter)

    assert len(adapter.sent) == 1
    assert [r["verdict"] for r in engine.evidence(attempt_id)] == ["indeterminate"]
    assert events(engine, mission, "attempt.replayed") == []


def test_a8_after_a_recovery_the_recovered_segment_replays_with_the_same_key(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """The owner is gone; recover installs seg-2, whose name is all a later process
    (``charter reconcile --segment``) has. The replay goes out as seg-2 with the
    attempt's own key and the new epoch as fencing token; any other segment sends
    nothing and changes nothing."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    key = engine.get_attempt(attempt_id).idempotency_key
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    before = stored(engine, mission)

    with pytest.raises(charter.StateError):
        engine.coordinator.reconcile(attempt_id, adapter, segment_id="seg-1")
    assert stored(engine, mission) == before
    evidence = engine.coordinator.reconcile(attempt_id, adapter, segment_id="seg-2")

    assert evidence.verdict == "applied"
    assert [(s.idempotency_key, s.epoch) for s in adapter.sent] == [(key, 1), (key, 2)]
    [replayed] = events(engine, mission, "attempt.replayed")
    assert (replayed["entity"], replayed["segment"], replayed["epoch"]) == (attempt_id, "seg-2", 2)
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN  # confirm decides

    clock.advance(LEASE)  # nobody renewed seg-2's lease: it holds the run no more
    before = stored(engine, mission)
    with pytest.raises(charter.StateError):
        engine.coordinator.reconcile(attempt_id, adapter, segment_id="seg-2")
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 2


@pytest.mark.parametrize("takeover", [True, False])
def test_a8_an_executor_that_no_longer_owns_the_run_sends_no_replay(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
    *,
    takeover: bool,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    clock.advance(LEASE)  # its lease expired ...
    if takeover:  # ... and another segment took the run over
        engine.coordinator.recover(ex.run_id, "seg-2")

    with contextlib.suppress(charter.Fenced):
        engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert len(adapter.sent) == 1
    assert events(engine, mission, "attempt.replayed") == []
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN


def test_r7_a8_a_reconcile_with_a_fenced_executor_still_stores_the_lookup(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    # R7: every call is audited and its evidence stored; a replay that may not be
    # sent leaves the lookup's answer as the evidence.
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")

    with contextlib.suppress(charter.Fenced):
        engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert adapter.reconciled == [attempt_id]
    assert [r["verdict"] for r in engine.evidence(attempt_id)] == ["indeterminate"]
    assert len(events(engine, mission, "evidence.recorded")) == 1


def test_a8_no_replay_outside_the_dedupe_window(
    engine: charter.Engine, who: Principals, mission: str, clock: ManualClock
) -> None:
    adapter = RecordingAdapter(
        operations={"charge": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=10)},
        costs={"charge": {"usd": 20_000, "calls": 1}},
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")
    clock.advance(11)  # past the window; the lease (30 s) is still ours

    engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert len(adapter.sent) == 1
    assert events(engine, mission, "attempt.replayed") == []
    assert [r["verdict"] for r in engine.evidence(attempt_id)] == ["indeterminate"]
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN


@pytest.mark.parametrize("operation", ["write", "read"])
def test_a8_no_replay_for_operations_the_target_does_not_deduplicate(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    operation: str,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, operation)

    engine.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert len(adapter.sent) == 1
    assert events(engine, mission, "attempt.replayed") == []
    assert engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN


def test_a8_a_replay_under_auto_settles_on_the_targets_answer(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter
) -> None:
    eng, who, mission = open_engine(make_engine, creds, evidence_settles="auto")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")

    eng.coordinator.reconcile(attempt_id, adapter, executor=ex)

    attempt = eng.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert attempt.actual == {"usd": 20_000, "calls": 1}
    assert len({s.idempotency_key for s in adapter.sent}) == 1
    assert eng.check_ledger(mission) == []


def test_a8_a_replay_that_was_not_applied_proves_nothing_about_the_first_send(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter
) -> None:
    # The first send may have been applied; a replay refused before any byte was
    # sent says nothing about it. The attempt stays UNKNOWN with its hold (L4).
    eng, who, mission = open_engine(make_engine, creds, evidence_settles="auto")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "charge")

    def refused(send: Dispatch) -> Outcome:
        raise charter.NotApplied("connection refused before sending")

    adapter.script["charge"] = refused
    eng.coordinator.reconcile(attempt_id, adapter, executor=ex)

    assert len(adapter.sent) == 2
    assert eng.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    assert held(eng, mission) == {"usd": 20_000, "calls": 1}
    assert spent(eng, mission) == {"usd": 0, "calls": 0}


# -- R8: resolve by a person with 'resolve' ---------------------------------------------------


def test_r8_resolve_succeeded_settles_at_the_given_cost(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")

    engine.coordinator.resolve(
        attempt_id,
        by=who.alice,
        outcome="succeeded",
        evidence={"seen": "provider dashboard"},
        cost={"usd": 3_500, "calls": 1},
        result={"id": "m-1"},
    )

    attempt = engine.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert attempt.actual == {"usd": 3_500, "calls": 1}
    assert attempt.result == {"id": "m-1"}
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert spent(engine, mission) == {"usd": 3_500, "calls": 1}
    [row] = engine.evidence(attempt_id)
    assert (row["verdict"], row["actor"], row["settled"]) == ("applied", "alice", 1)
    assert events(engine, mission, "attempt.settled")[-1]["actor"] == "alice"
    assert engine.check_ledger(mission) == []
    assert len(adapter.sent) == 1


def test_r8_resolve_failed_releases_the_hold(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")

    engine.coordinator.resolve(
        attempt_id, by=who.alice, outcome="failed", evidence="the target has no record of it"
    )

    attempt = engine.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.FAILED
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert spent(engine, mission) == {"usd": 0, "calls": 0}
    assert engine.check_ledger(mission) == []


def test_r8_l9_written_off_settles_at_the_full_hold(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_dispatched(ex, adapter, "write")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")

    engine.coordinator.resolve(
        attempt_id,
        by=who.alice,
        outcome="written_off",
        evidence="nobody can tell whether it was sent",
    )

    attempt = engine.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.WRITTEN_OFF
    assert attempt.actual == attempt.estimate == {"usd": 5_000, "calls": 1}
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert spent(engine, mission) == {"usd": 5_000, "calls": 1}
    assert entries_for(engine, mission, attempt_id) == [
        ("hold", "calls", 1),
        ("hold", "usd", 5_000),
        ("spend", "calls", 1),
        ("spend", "usd", 5_000),
    ]
    assert engine.check_ledger(mission) == []


@pytest.mark.parametrize("name", ["mallory", "agent", "bob"])
def test_r8_resolve_without_the_right_is_refused_audited_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    name: str,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    principal = getattr(who, name)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    for outcome in OUTCOMES:
        with pytest.raises(charter.NotAuthorized):
            engine.coordinator.resolve(
                attempt_id, by=principal, outcome=outcome, evidence="trust me", cost={"usd": 0}
            )

    assert stored(engine, mission) == before
    refusals = new_events(engine, mission, seen)
    assert [(e["kind"], e["actor"], e["entity"]) for e in refusals] == [
        ("authorization.refused", name, attempt_id)
    ] * 3
    assert all(payload(e)["right"] == "resolve" for e in refusals)
    assert all(v.ok for v in engine.verify_audit(mission))


def test_r8_a_forged_principal_is_refused_audited_and_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    with pytest.raises(charter.AuthenticationError):
        engine.coordinator.resolve(
            attempt_id, by=forged("alice"), outcome="written_off", evidence="forged"
        )

    assert stored(engine, mission) == before
    [refusal] = new_events(engine, mission, seen)
    assert (refusal["kind"], refusal["entity"]) == ("auth.refused", attempt_id)


def test_r8_resolve_on_a_settled_attempt_is_refused_and_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    done = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    attempt_id = left_unknown(ex, adapter, "write", key="other")
    engine.coordinator.resolve(
        attempt_id, by=who.alice, outcome="written_off", evidence="unknowable"
    )
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    for settled in (done.id, attempt_id):
        for outcome in OUTCOMES:
            with pytest.raises(charter.AttemptAlreadySettled):
                engine.coordinator.resolve(
                    settled, by=who.alice, outcome=outcome, evidence="again", cost={"usd": 1}
                )

    assert stored(engine, mission) == before
    assert [
        e for e in new_events(engine, mission, seen) if not e["kind"].endswith(".refused")
    ] == []


# -- R9: resume under the policy ------------------------------------------------------------


def test_r9_automatic_continues_when_clean_with_an_executor_of_the_current_epoch(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    first = ex.perform(adapter, "write", {"to": "x"}, effect_key="one")
    clock.advance(LEASE)

    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")

    run = eng.run(ex.run_id)
    assert (ex2.epoch, ex2.segment_id, ex2.run_id) == (run.epoch, "seg-2", ex.run_id)
    assert run.status is RunStatus.ACTIVE
    second = ex2.perform(adapter, "write", {"to": "y"}, effect_key="two")
    assert second.status is AttemptStatus.SUCCEEDED
    assert second.admitted_epoch == run.epoch == 2
    assert [(s.attempt_id, s.epoch) for s in adapter.sent] == [
        (first.id, 1),
        (second.id, 2),
    ]
    [resumed] = events(eng, mission, "run.resumed")
    assert (resumed["segment"], payload(resumed)["mode"]) == ("seg-2", "automatic")


def test_r9_the_executor_returned_to_the_recovered_segment_can_attempt_after_a_long_pause(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    # recover, then a person takes an hour to resolve, then resume the same segment.
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    clock.advance(3_600)
    engine.coordinator.resolve(
        attempt_id,
        by=who.alice,
        outcome="succeeded",
        evidence="delivered",
        cost={"usd": 5_000, "calls": 1},
    )

    ex2 = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)

    assert ex2.epoch == engine.run(ex.run_id).epoch == 2
    attempt = ex2.perform(adapter, "write", {"to": "y"}, effect_key="next")
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert adapter.sent[-1].epoch == 2


def test_r9_human_needs_a_principal_with_a_run_grant(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    assert engine.config.resume == "human"
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    seen = len(engine.audit_events(mission))

    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(ex.run_id, "seg-2")
    for name in ("alice", "bob", "mallory"):  # none has 'run': refused as any decision is
        with pytest.raises(charter.NotAuthorized):
            engine.coordinator.resume(ex.run_id, "seg-2", by=getattr(who, name))
    with pytest.raises(charter.AuthenticationError):
        engine.coordinator.resume(ex.run_id, "seg-2", by=forged("agent"))

    new = new_events(engine, mission, seen)
    refused = [e for e in new if e["kind"] == "resume.refused"]
    assert [e["actor"] for e in refused] == ["segment:seg-2"]
    assert all(payload(e)["mode"] == "human" for e in refused)
    denied = [(e["actor"], e["entity"]) for e in new if e["kind"] == "authorization.refused"]
    assert denied == [(name, ex.run_id) for name in ("alice", "bob", "mallory")]
    assert events(engine, mission, "run.resumed") == []

    ex2 = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)

    assert ex2.epoch == 2
    assert [e["actor"] for e in events(engine, mission, "run.resumed")] == ["agent"]
    assert ex2.perform(adapter, "write", {"to": "x"}, effect_key="k").status is (
        AttemptStatus.SUCCEEDED
    )


def test_r9_rules_consults_the_configured_predicates(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    seen: list[RecoveryState] = []
    allow = {"go": False}

    def no_failures(state: RecoveryState) -> bool:
        seen.append(state)
        return allow["go"] and not state.settled_counts.get("failed")

    eng, who, mission = open_engine(
        make_engine, creds, resume="rules", resume_rules=(always, no_failures)
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)

    with pytest.raises(charter.NeedsIntervention):
        eng.coordinator.resume(ex.run_id, "seg-2")

    assert [s.run_id for s in seen] == [ex.run_id]
    assert seen[0].epoch == 2
    [refused] = events(eng, mission, "resume.refused")
    assert payload(refused)["mode"] == "rules"
    allow["go"] = True

    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")

    assert ex2.epoch == 2
    assert len(seen) == 2
    adapter.script["write"] = fail
    ex2.perform(adapter, "write", {"to": "x"}, effect_key="k")
    clock.advance(LEASE)
    with pytest.raises(charter.NeedsIntervention):
        eng.coordinator.resume(ex.run_id, "seg-3")
    assert len(events(eng, mission, "run.resumed")) == 1


def test_r9_a_contract_makes_the_engine_stricter_never_looser(
    make_engine: MakeEngine, creds: Creds, clock: ManualClock
) -> None:
    eng, who, strict = open_engine(
        make_engine, creds, default_contract(resume="human"), resume="automatic"
    )
    ex = eng.start_run(strict, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)
    with pytest.raises(charter.NeedsIntervention):
        eng.coordinator.resume(ex.run_id, "seg-2")
    assert eng.coordinator.resume(ex.run_id, "seg-2", by=who.agent).epoch == 2
    assert payload(events(eng, strict, "run.resumed")[0])["mode"] == "human"

    human, people, loose = open_engine(
        make_engine, creds, default_contract(resume="automatic"), resume="human"
    )
    ex = human.start_run(loose, by=people.agent, segment_id="seg-1")
    clock.advance(LEASE)
    with pytest.raises(charter.NeedsIntervention):
        human.coordinator.resume(ex.run_id, "seg-2")
    [refused] = events(human, loose, "resume.refused")
    assert payload(refused)["mode"] == "human"
    assert events(human, loose, "run.resumed") == []


def _resume_engine(
    make_engine: MakeEngine, creds: Creds, mode: str, contract: dict[str, Any] | None = None
) -> tuple[charter.Engine, Principals, str]:
    return open_engine(make_engine, creds, contract, resume=mode, resume_rules=(always,))


def _refused_in_every_mode(
    eng: charter.Engine,
    mission: str,
    run_id: str,
    by: charter.Principal,
    *,
    mode: str,
    adapter: RecordingAdapter,
    calls: int = 2,
) -> None:
    """Resume is refused as a takeover by a new segment, then (again) as its owner."""
    sent = list(adapter.sent)
    for _ in range(calls):
        with pytest.raises(charter.NeedsIntervention):
            eng.coordinator.resume(run_id, "seg-2", by=by)
    assert eng.run(run_id).owner_segment == "seg-2"
    assert events(eng, mission, "run.resumed") == []
    refused = events(eng, mission, "resume.refused")
    assert len(refused) == calls
    assert all(payload(e)["mode"] == mode and payload(e)["blockers"] for e in refused)
    assert adapter.sent == sent


@pytest.mark.parametrize("mode", MODES)
def test_r9_no_mode_continues_past_an_unresolved_attempt(
    make_engine: MakeEngine,
    creds: Creds,
    adapter: RecordingAdapter,
    clock: ManualClock,
    mode: str,
) -> None:
    eng, who, mission = _resume_engine(make_engine, creds, mode)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id = left_unknown(ex, adapter, "write")
    clock.advance(LEASE)

    _refused_in_every_mode(eng, mission, ex.run_id, who.agent, mode=mode, adapter=adapter)

    assert eng.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN
    eng.coordinator.resolve(attempt_id, by=who.alice, outcome="failed", evidence="bounced")
    assert eng.coordinator.resume(ex.run_id, "seg-2", by=who.agent).epoch == 2


@pytest.mark.parametrize("mode", MODES)
def test_r9_no_mode_continues_past_an_approval_that_expired_during_downtime(
    make_engine: MakeEngine,
    creds: Creds,
    adapter: RecordingAdapter,
    clock: ManualClock,
    mode: str,
) -> None:
    eng, who, mission = _resume_engine(make_engine, creds, mode, approval_contract(ttl=10))
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    _, approval_id = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    eng.approve(approval_id, by=who.bob)
    clock.advance(LEASE)

    # Once: W2 lets the engine ask again for the effect; that new request is a wait.
    _refused_in_every_mode(eng, mission, ex.run_id, who.agent, mode=mode, adapter=adapter, calls=1)


@pytest.mark.parametrize("mode", MODES)
def test_r9_no_mode_continues_for_a_principal_whose_run_right_was_revoked(
    make_engine: MakeEngine,
    creds: Creds,
    adapter: RecordingAdapter,
    clock: ManualClock,
    mode: str,
) -> None:
    alice = ["resolve", "raise_limit", "stop", "link", "adopt", "consume", "approve", "run"]
    start = default_contract()
    start["principals"]["alice"] = alice
    eng, who, mission = _resume_engine(make_engine, creds, mode, start)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)  # downtime: the creator revokes the agent's grants
    revoked = default_contract(principals={"alice": alice, "bob": {"approve": ["recorder.*"]}})
    assert eng.amend_contract(mission, revoked, by=who.alice, reason="revoke agent") == 2

    _refused_in_every_mode(eng, mission, ex.run_id, who.alice, mode=mode, adapter=adapter)


@pytest.mark.parametrize("mode", MODES)
def test_r9_no_mode_continues_past_a_stop_condition(
    make_engine: MakeEngine,
    creds: Creds,
    adapter: RecordingAdapter,
    clock: ManualClock,
    mode: str,
) -> None:
    deadline = clock.now_us() + 20_000_000
    eng, who, mission = _resume_engine(
        make_engine, creds, mode, default_contract(stop_conditions={"deadline_us": deadline})
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE)  # the deadline passed during the downtime

    _refused_in_every_mode(eng, mission, ex.run_id, who.agent, mode=mode, adapter=adapter)


@pytest.mark.parametrize("mode", MODES)
def test_r9_no_mode_continues_past_an_exhausted_allowance(
    make_engine: MakeEngine,
    creds: Creds,
    adapter: RecordingAdapter,
    clock: ManualClock,
    mode: str,
) -> None:
    eng, who, mission = _resume_engine(
        make_engine, creds, mode, default_contract(allowance={"usd": 1_000_000, "calls": 1})
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "read", {"q": 1}, effect_key="only")
    clock.advance(LEASE)

    _refused_in_every_mode(eng, mission, ex.run_id, who.agent, mode=mode, adapter=adapter)

    eng.raise_limit(mission, "calls", 2, by=who.alice)
    assert eng.coordinator.resume(ex.run_id, "seg-2", by=who.agent).epoch == 2


@pytest.mark.parametrize("end", ["finish", "stop"])
def test_r9_resume_on_a_terminal_run_is_refused(
    engine: charter.Engine, who: Principals, mission: str, clock: ManualClock, end: str
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    if end == "finish":
        ex.finish()
    else:
        engine.stop_run(ex.run_id, by=who.alice)
    clock.advance(LEASE)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    for segment in ("seg-1", "seg-2"):
        with pytest.raises(charter.RunTerminal):
            engine.coordinator.resume(segment_id=segment, run_id=ex.run_id, by=who.agent)

    assert stored(engine, mission) == before
    assert new_events(engine, mission, seen) == []


def test_w2_r9_an_expired_approval_is_asked_again_and_resume_continues_once_decided(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    # W2: an approval that expired during downtime makes the engine open a new
    # request for the same effect; once a person decides it, the run can go on.
    eng, who, mission = open_engine(
        make_engine, creds, approval_contract(ttl=10), resume="automatic"
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    old, first = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    eng.approve(first, by=who.bob)
    clock.advance(LEASE)
    eng.coordinator.recover(ex.run_id, "seg-2")
    with pytest.raises(charter.NeedsIntervention):
        eng.coordinator.resume(ex.run_id, "seg-2")

    [again] = eng.approvals(run_id=ex.run_id, pending=True)
    assert again.id != first
    assert again.effect_id == eng.approvals(run_id=ex.run_id)[0].effect_id
    eng.approve(again.id, by=who.bob)
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")
    attempt = ex2.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=old
    )

    assert attempt.status is AttemptStatus.SUCCEEDED
    assert len(eng.approvals(run_id=ex.run_id)) == 2


def test_r9_an_approval_that_expires_after_it_was_used_blocks_nothing(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(
        make_engine, creds, approval_contract(ttl=10), resume="automatic"
    )
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt_id, approval_id = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    eng.approve(approval_id, by=who.bob)
    assert ex.dispatch(attempt_id, adapter).status is AttemptStatus.SUCCEEDED
    clock.advance(LEASE)  # the used approval's 10 s pass; nothing waits on it any more

    state = eng.coordinator.recover(ex.run_id, "seg-2")
    assert state.waits == []
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")

    assert ex2.epoch == 2
    assert len(adapter.sent) == 1


# -- the recovery table (docs/recovery.md), rows observable without nodes ---------------------


def test_table_prepared_is_voided_by_the_new_epoch_and_can_be_readmitted(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds, resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    prepared = ex.admit(adapter, "write", {"to": "x"}, effect_key="send").id
    clock.advance(LEASE)

    state = eng.coordinator.recover(ex.run_id, "seg-2")

    assert [(n.id, n.phase, n.action) for n in state.next_actions] == [
        (prepared, "prepared", NEXT_ACTIONS["prepared"])
    ]
    assert eng.get_attempt(prepared).status is AttemptStatus.VOIDED
    assert held(eng, mission) == {"usd": 0, "calls": 0}
    ex2 = eng.coordinator.resume(ex.run_id, "seg-2")
    again = ex2.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=prepared
    )
    assert again.status is AttemptStatus.SUCCEEDED
    assert again.id != prepared
    assert again.retry_of == prepared
    assert again.idempotency_key != eng.get_attempt(prepared).idempotency_key
    assert [s.attempt_id for s in adapter.sent] == [again.id]
    assert eng.check_ledger(mission) == []


def test_table_dispatched_and_unknown_keep_their_hold_until_evidence_or_a_person(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    unknown = left_unknown(ex, adapter, "write", key="lost")
    dispatched = left_dispatched(ex, adapter, "charge", key="died")
    sent = list(adapter.sent)
    clock.advance(LEASE)

    state, unresolved = engine.coordinator.recover(ex.run_id, "seg-2")

    assert sorted(unresolved) == sorted([unknown, dispatched])
    assert {n.id: (n.phase, n.action) for n in state.next_actions if n.kind == "attempt"} == {
        unknown: ("unknown", NEXT_ACTIONS["uncertain"]),
        dispatched: ("unknown", NEXT_ACTIONS["uncertain"]),
    }
    assert held(engine, mission) == {"usd": 25_000, "calls": 2}
    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    adapter.evidence[dispatched] = Evidence.applied(
        Outcome.succeeded(
            {"charge": "ch_1"}, cost={"usd": 20_000, "calls": 1}, receipt={"id": "ch_1"}
        )
    )
    engine.coordinator.reconcile(dispatched, adapter)
    engine.coordinator.confirm(dispatched, by=who.alice)
    engine.coordinator.resolve(unknown, by=who.alice, outcome="written_off", evidence="unknowable")
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert spent(engine, mission) == {"usd": 25_000, "calls": 2}

    ex2 = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)

    assert engine.run(ex.run_id).status is RunStatus.ACTIVE
    assert ex2.epoch == 2
    assert adapter.sent == sent
    assert engine.check_ledger(mission) == []


def test_table_settled_attempts_are_never_performed_again(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    succeeded = ex.perform(adapter, "charge", {"n": 1}, effect_key="ok").id
    adapter.script["write"] = fail
    failed = ex.perform(adapter, "write", {"to": "x"}, effect_key="bad").id
    del adapter.script["write"]
    written_off = left_unknown(ex, adapter, "write", key="lost")
    engine.coordinator.resolve(
        written_off, by=who.alice, outcome="written_off", evidence="unknowable"
    )
    settled = (succeeded, failed, written_off)
    clock.advance(LEASE)

    state = engine.coordinator.recover(ex.run_id, "seg-2")

    assert state.unresolved == []
    assert state.settled_counts == {"succeeded": 1, "failed": 1, "written_off": 1}
    assert [(n.kind, n.phase, n.action) for n in state.next_actions] == [
        ("attempts", "settled", NEXT_ACTIONS["settled"])
    ]
    ex2 = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    before, sent = stored(engine, mission), list(adapter.sent)
    for attempt_id in settled:
        with pytest.raises(charter.StateError):
            ex2.dispatch(attempt_id, adapter)
        with pytest.raises(charter.AttemptAlreadySettled):
            engine.coordinator.reconcile(attempt_id, adapter, executor=ex2)
        with pytest.raises(charter.AttemptAlreadySettled):
            engine.coordinator.resolve(
                attempt_id, by=who.alice, outcome="succeeded", evidence="again", cost={"usd": 1}
            )
    assert adapter.sent == sent
    assert adapter.reconciled == []
    assert stored(engine, mission) == before


def test_table_a_terminal_run_is_never_reopened(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    ex.finish()
    clock.advance(LEASE)
    before, seen = stored(engine, mission), len(engine.audit_events(mission))

    state = engine.coordinator.recover(ex.run_id, "seg-2")

    assert state.run.status is RunStatus.COMPLETED
    assert ("run", ex.run_id, "run_terminal", NEXT_ACTIONS["run_terminal"]) in [
        (n.kind, n.id, n.phase, n.action) for n in state.next_actions
    ]
    assert stored(engine, mission) == before
    assert new_events(engine, mission, seen) == []
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "y"}, effect_key="again")
    run = engine.run(ex.run_id)
    assert (run.status, run.epoch, run.owner_segment) == (RunStatus.COMPLETED, 1, "seg-1")
    assert len(adapter.sent) == 1


def test_f2_a_late_result_that_contradicts_recorded_evidence_opens_an_incident(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    # F2: while the old owner is still waiting for its answer, the run is recovered
    # and a lookup records "not applied" (unconfirmed). The late answer says it was
    # applied: neither may win on its own — the attempt stays UNKNOWN with its hold
    # and a person decides, with both pieces of evidence kept.
    eng, who, mission = open_engine(make_engine, creds)
    other = make_engine()
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")

    def slow(send: Dispatch) -> Outcome:
        clock.advance(31)
        other.coordinator.recover(ex.run_id, "seg-2")
        lookup = RecordingAdapter(name=adapter.name, operations=adapter.operations)
        lookup.evidence[send.attempt_id] = Evidence.not_applied({"lookup": "no such charge"})
        other.coordinator.reconcile(send.attempt_id, lookup)
        return Outcome.succeeded({"ok": True}, cost={"usd": 5_000, "calls": 1}, receipt={"r": 1})

    adapter.script["write"] = slow
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="late")

    assert attempt.status is AttemptStatus.UNKNOWN
    assert eng.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert held(eng, mission) == {"usd": 5_000, "calls": 1}
    [incident] = eng.incidents(mission, open_only=True)
    assert (incident["kind"], incident["attempt_id"]) == ("conflicting_evidence", attempt.id)
    kept = sorted((e["verdict"], e["epoch"], e["settled"]) for e in eng.evidence(attempt.id))
    assert kept == [("applied", 1, 0), ("not_applied", None, 0)]
    assert len(adapter.sent) == 1


# -- races between engines on one store (both backends) ----------------------------------


def _race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at the same moment from threads; return results or exceptions."""
    import threading

    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def go(i: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            out[i] = call()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_f1_r1_two_engines_recovering_at_once_make_exactly_one_owner(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    lost = left_unknown(ex, adapter, "write")
    clock.advance(LEASE)
    a, b = make_engine(), make_engine()

    results = _race(
        lambda: a.coordinator.recover(ex.run_id, "seg-a"),
        lambda: b.coordinator.recover(ex.run_id, "seg-b"),
    )

    won = [r for r in results if isinstance(r, RecoveryState)]
    refused = [r for r in results if isinstance(r, charter.LeaseHeld)]
    assert (len(won), len(refused)) == (1, 1), results
    run = eng.run(ex.run_id)
    assert run.epoch == 2 and run.owner_segment == won[0].run.owner_segment
    assert eng.get_attempt(lost).status is AttemptStatus.UNKNOWN
    assert held(eng, mission) == {"usd": 5_000, "calls": 1}
    assert len(events(eng, mission, "run.recovered")) == 1


def test_r8_l6_two_people_resolving_at_once_settle_the_hold_once(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    eng, who, mission = open_engine(make_engine, creds)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    lost = left_unknown(ex, adapter, "write")
    a, b = make_engine(), make_engine()
    alice_a = Principals(creds[0], creds[1], a).alice
    alice_b = Principals(creds[0], creds[1], b).alice

    results = _race(
        lambda: a.coordinator.resolve(lost, by=alice_a, outcome="written_off", evidence="x"),
        lambda: b.coordinator.resolve(
            lost, by=alice_b, outcome="succeeded", evidence="y", cost={"usd": 4_000, "calls": 1}
        ),
    )

    settled = [r for r in results if isinstance(r, charter.Attempt)]
    refused = [r for r in results if isinstance(r, charter.AttemptAlreadySettled)]
    assert (len(settled), len(refused)) == (1, 1), results
    assert eng.get_attempt(lost).status is settled[0].status
    assert held(eng, mission) == {"usd": 0, "calls": 0}
    resolved = [
        amount
        for kind, unit, amount in entries_for(eng, mission, lost)
        if kind in ("spend", "release") and unit == "usd"
    ]
    assert sum(resolved) == 5_000  # the hold was resolved once, not twice
    assert eng.check_ledger(mission) == []


def test_w2_two_approvers_deciding_at_once_decide_once(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter
) -> None:
    eng, who, mission = open_engine(make_engine, creds, approval_contract(ttl=60))
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    _, approval_id = wait_for_approval(eng, ex, adapter, "write", {"to": "x"}, key="send")
    a, b = make_engine(), make_engine()
    bob_a = Principals(creds[0], creds[1], a).bob
    alice_b = Principals(creds[0], creds[1], b).alice

    results = _race(
        lambda: a.approve(approval_id, by=bob_a),
        lambda: b.approve(approval_id, by=alice_b, deny=True),
    )

    decided = [r for r in results if isinstance(r, ApprovalStatus)]
    refused = [r for r in results if isinstance(r, charter.StateError)]
    assert (len(decided), len(refused)) == (1, 1), results
    [approval] = [x for x in eng.approvals() if x.id == approval_id]
    assert approval.status is decided[0]
    assert len(events(eng, mission, "approval.decided")) == 1


def test_s1_l0_mixed_workers_on_one_mission_queue_without_deadlock(
    make_engine: MakeEngine, creds: Creds
) -> None:
    # Attempts from three runs, limit raises and forced takeovers of a fourth run,
    # all at once on one mission: each worker waits its turn (the mission's write
    # gate), nothing deadlocks or fails, and the ledger and the chain hold after.
    eng, _, mission = open_engine(
        make_engine, creds, default_contract(allowance={"usd": 10**9, "calls": 10**6})
    )
    errors: list[BaseException] = []
    # One engine per worker, opened here: each has its own seeded ID source.
    engines = [make_engine(busy_timeout_seconds=20) for _ in range(5)]

    def attempts(i: int) -> None:
        e = engines[i]
        ex = e.start_run(mission, by=Principals(creds[0], creds[1], e).agent, segment_id=f"w{i}")
        adapter = RecordingAdapter()
        for k in range(30):
            ex.perform(adapter, "write", {"k": k}, effect_key=f"k{k}")

    def raises() -> None:
        e = engines[3]
        alice = Principals(creds[0], creds[1], e).alice
        for k in range(15):
            e.raise_limit(mission, "calls", 10**6 + k + 1, by=alice)

    def takeovers() -> None:
        e = engines[4]
        people = Principals(creds[0], creds[1], e)
        ex = e.start_run(mission, by=people.agent, segment_id="victim")
        for k in range(10):
            e.coordinator.recover(ex.run_id, f"take-{k}", force=True, by=people.alice)

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # reported below, with the others
                errors.append(exc)

        return run

    import threading

    threads = [
        *(threading.Thread(target=guarded(lambda i=i: attempts(i))) for i in range(3)),
        threading.Thread(target=guarded(raises)),
        threading.Thread(target=guarded(takeovers)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert errors == []
    assert len([a for a in eng.attempts(mission_id=mission) if a.status.settled]) == 90
    assert eng.contract(mission).allowance["calls"] == 10**6 + 15
    assert eng.check_ledger(mission) == []
    assert all(v.ok for v in eng.verify_audit(mission))


def test_n4_a_finished_run_is_never_changed_again_even_by_its_owner(
    make_engine: MakeEngine, creds: Creds, adapter: RecordingAdapter
) -> None:
    eng, who, mission = open_engine(make_engine, creds)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    ex.finish(RunStatus.COMPLETED)
    before = stored(eng, mission)

    with pytest.raises(charter.RunTerminal):
        ex.finish(RunStatus.FAILED, "second thoughts")
    with pytest.raises(charter.RunTerminal):
        eng.stop_run(ex.run_id, by=who.alice)

    assert eng.run(ex.run_id).status is RunStatus.COMPLETED
    assert stored(eng, mission) == before
    assert [e["after"] for e in events(eng, mission, "run.status")] == ["completed"]


# -- R9: resume rules see a read-only view; F1: one executor per segment --------------------


def test_R9_a_resume_rule_that_reads_the_engine_does_not_deadlock(
    make_engine: MakeEngine, creds: Creds, clock: ManualClock, adapter: RecordingAdapter
) -> None:
    """Broken R9: rules ran inside resume's write transaction; a rule that read the
    engine waited forever for the lock resume itself held (SQLite)."""
    import threading

    engines: list[charter.Engine] = []

    def ledger_is_clean(state: Any) -> bool:
        eng = engines[0]
        return eng.check_ledger(state.run.mission_id) == [] and eng.run(state.run.id) is not None

    eng, who, mission = open_engine(
        make_engine, creds, resume="rules", resume_rules=(ledger_is_clean,), busy_timeout_seconds=2
    )
    engines.append(eng)
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"to": "x"}, effect_key="k")
    clock.advance(LEASE)
    result: list[Any] = []
    worker = threading.Thread(
        target=lambda: result.append(eng.coordinator.resume(ex.run_id, "seg-2")), daemon=True
    )
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "resume hung on its own rule"
    assert [r.epoch for r in result] == [2]
    assert events(eng, mission, "run.resumed")


def test_F1_a_segment_is_held_by_one_live_executor_only(
    make_engine: MakeEngine, creds: Creds, clock: ManualClock, adapter: RecordingAdapter
) -> None:
    """Confirmed: resume as the current owner's segment needed no proof of being
    that owner and did not check the lease, so anyone naming the segment got a
    second executor of the same epoch, and both could send."""
    eng, who, mission = open_engine(make_engine, creds, resume="automatic")
    ex = eng.start_run(mission, by=who.agent, segment_id="seg-1")
    before = stored(eng, mission)
    with pytest.raises(charter.LeaseHeld):
        eng.coordinator.resume(ex.run_id, "seg-1", by=who.agent)  # it is executing
    assert stored(eng, mission) == before
    clock.advance(LEASE)  # the executor is presumed dead: its segment continues anew
    second = eng.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="zombie")
    with pytest.raises(charter.LeaseHeld):
        eng.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert second.perform(adapter, "write", {"to": "x"}, effect_key="k").status is (
        AttemptStatus.SUCCEEDED
    )
    assert [s.attempt_id for s in adapter.sent] == [a.id for a in eng.attempts(mission_id=mission)]
    assert eng.run(ex.run_id).epoch == 1
    refusals = [payload(e) for e in events(eng, mission, "resume.refused")]
    assert [r.get("reason") for r in refusals] == ["segment_held", "segment_held"]


def test_F1_an_executor_that_blocked_lets_its_segment_resume_at_once(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """An executor whose nodes wait (an approval, a person) stops holding the run:
    its segment resumes without waiting for the lease, and the old object is fenced."""
    mission = engine.create_mission(
        default_contract(approvals={"required": ["recorder.write"]}), by=who.alice
    )

    @charter.node
    def pay(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(adapter, "write", {"to": "x"})

    plan = charter.Plan("pay", (pay,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    (request,) = engine.approvals(pending=True)
    engine.approve(request.id, by=who.bob)
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    with pytest.raises(charter.Fenced):
        ex.execute(plan)
    assert resumed.execute(plan)["echo"] == {"to": "x"}
    assert len(adapter.sent) == 1
