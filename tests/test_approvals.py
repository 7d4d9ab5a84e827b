"""W2: an approval is bound to one effect (effect key + request hash), checked at
the dispatch commit together with the approver's authority, expires, and a
denial voids the attempt.

Every test asserts on what the store recorded (attempts, approvals, ledger,
balances, audit) and on what the adapter was actually asked to send.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import charter
from charter.adapters import Dispatch, Outcome
from charter.testing import ManualClock, RecordingAdapter
from charter.waits.approvals import Approval, ApprovalStatus, effect_id
from conftest import Principals, default_contract
from conftest import stored as stored_with_runs

Status = charter.AttemptStatus

TTL = 10
WRITE_COST = {"usd": 5_000, "calls": 1}


def stored(engine: charter.Engine, mission: str) -> dict[str, Any]:
    return stored_with_runs(engine, mission, runs=False)


def gated_contract(**overrides: Any) -> dict[str, Any]:
    """``recorder.write`` needs an approval that lasts ``TTL`` seconds."""
    contract = default_contract(approvals={"required": ["recorder.write"], "ttl_seconds": TTL})
    contract.update(overrides)
    return contract


def without_bob(contract: dict[str, Any]) -> dict[str, Any]:
    """The same contract with bob's approve right narrowed to reads only."""
    principals = {**contract["principals"], "bob": {"approve": ["recorder.read"]}}
    return {**contract, "principals": principals}


@pytest.fixture
def gated(engine: charter.Engine, who: Principals) -> str:
    return engine.create_mission(gated_contract(), by=who.alice)


def start(engine: charter.Engine, who: Principals, mission: str) -> charter.Executor:
    return engine.start_run(mission, by=who.agent, segment_id="seg-1")


def effect_of(attempt: charter.Attempt) -> str:
    return effect_id(attempt.run_id, attempt.node_id, attempt.execution, attempt.effect_key)


def approvals_of(engine: charter.Engine, attempt: charter.Attempt) -> list[Approval]:
    return [a for a in engine.approvals(run_id=attempt.run_id) if a.effect_id == effect_of(attempt)]


def pending_of(engine: charter.Engine, attempt: charter.Attempt) -> Approval:
    pending = [a for a in approvals_of(engine, attempt) if a.status is ApprovalStatus.PENDING]
    assert len(pending) == 1, pending
    return pending[0]


def ledger_of(engine: charter.Engine, mission: str, attempt_id: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for e in engine.ledger_entries(mission):
        if e["attempt_id"] == attempt_id:
            kind = out.setdefault(str(e["kind"]), {})
            kind[str(e["unit"])] = kind.get(str(e["unit"]), 0) + int(e["amount"])
    return out


def not_applied(send: Dispatch) -> Outcome:
    raise charter.NotApplied("connection refused")


# -- waiting for a decision -----------------------------------------------------------------


def test_W2_effect_needing_approval_stays_prepared_with_its_hold_and_sends_nothing(
    engine: charter.Engine, who: Principals, gated: str, adapter: RecordingAdapter
) -> None:
    """Broken W2/A2: an effect whose scope needs approval is sent (or DISPATCHED) before
    anyone approved it, its hold is dropped while it waits, or no approval request
    bound to its effect and request hash is opened."""
    ex = start(engine, who, gated)

    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert waiting.value.code == "approval_required"
    attempt = engine.get_attempt(waiting.value.details["attempt_id"])
    assert attempt.status is Status.PREPARED
    assert attempt.dispatched_epoch is None
    assert attempt.send_deadline_us is None
    assert ledger_of(engine, gated, attempt.id) == {"hold": WRITE_COST}
    assert engine.balances(gated)["usd"].held == WRITE_COST["usd"]
    request = pending_of(engine, attempt)
    assert request.scope == "recorder.write"
    assert request.request_hash == attempt.request_hash
    assert request.decided_by is None
    assert adapter.sent == []


def test_W2_dispatch_while_pending_sends_nothing_and_opens_no_second_request(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: the dispatch commit lets a PREPARED attempt through while its approval
    is still pending, or every retry of the dispatch piles up another request."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    request = pending_of(engine, attempt)
    before = stored(engine, gated)

    for _ in range(3):
        clock.advance(1)
        with pytest.raises(charter.ApprovalRequired) as waiting:
            ex.dispatch(attempt.id, adapter)
        assert waiting.value.details["approval_id"] == request.id
        assert waiting.value.details["attempt_id"] == attempt.id

    assert stored(engine, gated) == before
    assert adapter.sent == []


def test_W2_approved_effect_is_sent_once_under_its_own_key(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: an approved effect is not sent at its dispatch, is sent more than
    once, or the approval does not record who decided and until when it is valid."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    clock.advance(1)

    decided = engine.approve(pending_of(engine, attempt).id, by=who.bob)

    assert decided is ApprovalStatus.APPROVED
    [approval] = approvals_of(engine, attempt)
    assert approval.status is ApprovalStatus.APPROVED
    assert approval.decided_by == "bob"
    assert approval.decided_at_us == clock.now_us()
    assert approval.expires_at_us == clock.now_us() + TTL * 1_000_000
    assert adapter.sent == []
    clock.advance(1)

    settled = ex.dispatch(attempt.id, adapter)

    assert settled.status is Status.SUCCEEDED
    assert engine.get_attempt(attempt.id).status is Status.SUCCEEDED
    assert [(s.attempt_id, s.idempotency_key) for s in adapter.sent] == [
        (attempt.id, attempt.idempotency_key)
    ]
    with pytest.raises(charter.StateError):
        ex.dispatch(attempt.id, adapter)
    assert len(adapter.sent) == 1


# -- validity at the dispatch commit: expiry and the approver's authority ----------------------


def test_W2_approval_expired_before_dispatch_opens_a_new_request_and_keeps_the_hold(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: an approval is used after it expired, the attempt is voided or loses
    its hold instead of waiting, or no new request is opened for the same effect."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    clock.advance(1)
    first = pending_of(engine, attempt)
    engine.approve(first.id, by=who.bob)
    clock.advance(TTL + 1)

    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.dispatch(attempt.id, adapter)

    renewed = pending_of(engine, attempt)
    assert waiting.value.details["approval_id"] == renewed.id != first.id
    assert renewed.request_hash == attempt.request_hash
    statuses = {a.id: a.status for a in approvals_of(engine, attempt)}
    assert statuses == {first.id: ApprovalStatus.EXPIRED, renewed.id: ApprovalStatus.PENDING}
    assert engine.get_attempt(attempt.id).status is Status.PREPARED
    assert ledger_of(engine, gated, attempt.id) == {"hold": WRITE_COST}
    assert adapter.sent == []

    clock.advance(1)
    engine.approve(renewed.id, by=who.bob)
    assert ex.dispatch(attempt.id, adapter).status is Status.SUCCEEDED
    assert [s.attempt_id for s in adapter.sent] == [attempt.id]


def test_W2_approvers_authority_is_rechecked_at_the_dispatch_commit(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: an approval given by a principal who has since lost the approve right
    still lets the effect be sent."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    clock.advance(1)
    first = pending_of(engine, attempt)
    engine.approve(first.id, by=who.bob)
    clock.advance(1)
    engine.amend_contract(gated, without_bob(gated_contract()), by=who.alice, reason="rotate")
    clock.advance(1)

    with pytest.raises(charter.ApprovalRequired):
        ex.dispatch(attempt.id, adapter)

    renewed = pending_of(engine, attempt)
    statuses = {a.id: a.status for a in approvals_of(engine, attempt)}
    assert statuses == {first.id: ApprovalStatus.SUPERSEDED, renewed.id: ApprovalStatus.PENDING}
    assert engine.get_attempt(attempt.id).status is Status.PREPARED
    assert engine.balances(gated)["usd"].held == WRITE_COST["usd"]
    assert adapter.sent == []
    with pytest.raises(charter.NotAuthorized):
        engine.approve(renewed.id, by=who.bob)
    assert pending_of(engine, attempt).id == renewed.id

    clock.advance(1)
    engine.approve(renewed.id, by=who.alice)
    assert ex.dispatch(attempt.id, adapter).status is Status.SUCCEEDED
    assert [s.attempt_id for s in adapter.sent] == [attempt.id]


def test_W2_reapproval_is_honoured_when_requests_share_a_timestamp(
    engine: charter.Engine, who: Principals, gated: str, adapter: RecordingAdapter
) -> None:
    """Broken W2: when a retired approval and its replacement were requested at the same
    store time, the dispatch commit looks at the retired one, ignores the fresh
    decision and opens yet another request, so the effect can never be sent."""
    ex = start(engine, who, gated)
    attempts = [
        ex.admit(adapter, "write", {"to": f"x{i}"}, effect_key=f"send-{i}") for i in range(6)
    ]
    for attempt in attempts:
        engine.approve(pending_of(engine, attempt).id, by=who.bob)
    engine.amend_contract(gated, without_bob(gated_contract()), by=who.alice, reason="rotate")
    for attempt in attempts:
        with pytest.raises(charter.ApprovalRequired):
            ex.dispatch(attempt.id, adapter)
        engine.approve(pending_of(engine, attempt).id, by=who.alice)

    outcomes: dict[str, str] = {}
    for attempt in attempts:
        try:
            outcomes[attempt.effect_key] = ex.dispatch(attempt.id, adapter).status.value
        except charter.ApprovalRequired:
            outcomes[attempt.effect_key] = "approval_required"

    assert outcomes == {a.effect_key: "succeeded" for a in attempts}
    assert sorted(s.attempt_id for s in adapter.sent) == sorted(a.id for a in attempts)


# -- denial -----------------------------------------------------------------------------------


def test_W2_denial_voids_the_attempt_and_releases_exactly_its_hold(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2/L6: a denied effect is sent, stays PREPARED holding allowance, or its
    hold is released more (or less) than once."""
    limit = dataclasses.asdict(engine.balances(gated)["usd"])
    ex = start(engine, who, gated)
    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    attempt = engine.get_attempt(waiting.value.details["attempt_id"])
    clock.advance(1)

    decided = engine.approve(pending_of(engine, attempt).id, by=who.bob, deny=True)
    clock.advance(1)
    voided = ex.dispatch(attempt.id, adapter)

    assert decided is ApprovalStatus.DENIED
    assert voided.status is Status.VOIDED
    got = engine.get_attempt(attempt.id)
    assert got.status is Status.VOIDED
    assert got.dispatched_epoch is None
    assert ledger_of(engine, gated, attempt.id) == {"hold": WRITE_COST, "release": WRITE_COST}
    assert dataclasses.asdict(engine.balances(gated)["usd"]) == limit
    assert adapter.sent == []
    before = stored(engine, gated)
    with pytest.raises(charter.StateError):
        ex.dispatch(attempt.id, adapter)
    assert stored(engine, gated) == before
    assert adapter.sent == []
    assert engine.check_ledger(gated) == []


def test_W2_denied_effect_admitted_again_with_the_same_request_is_voided_unsent(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: a denial is bound to nothing, so admitting the same effect with the
    same request again slips past it and is sent."""
    ex = start(engine, who, gated)
    first = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    engine.approve(pending_of(engine, first).id, by=who.bob, deny=True)
    clock.advance(1)
    assert ex.dispatch(first.id, adapter).status is Status.VOIDED
    clock.advance(1)

    again = ex.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
    )

    assert again.status is Status.VOIDED
    assert engine.get_attempt(again.id).status is Status.VOIDED
    assert ledger_of(engine, gated, again.id) == {"hold": WRITE_COST, "release": WRITE_COST}
    assert engine.balances(gated)["usd"].held == 0
    assert adapter.sent == []


# -- binding: effect key and request hash -------------------------------------------------------


def test_W2_approval_is_bound_to_the_request_hash(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: an approval given for one request lets a changed request under the
    same effect key be sent (e.g. a payment of 10 approved, 9 999 sent).

    The changed request is re-admitted the only way A4 allows while an approved
    attempt exists: after recovery voided the first one (R3)."""
    ex = start(engine, who, gated)
    approved = ex.admit(adapter, "write", {"amount": 10}, effect_key="pay")
    engine.approve(pending_of(engine, approved).id, by=who.bob)
    clock.advance(31)
    engine.coordinator.recover(ex.run_id, "seg-2")
    assert engine.get_attempt(approved.id).status is Status.VOIDED
    # The approval for 10 expired meanwhile: the engine asked again (W2); bob decides.
    [renewed] = engine.approvals(pending=True)
    assert renewed.request_hash == approved.request_hash
    engine.approve(renewed.id, by=who.bob)
    ex2 = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)

    changed = ex2.admit(
        adapter, "write", {"amount": 9_999}, effect_key="pay", generation=2, retry_of=approved.id
    )
    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex2.dispatch(changed.id, adapter)

    assert effect_of(changed) == effect_of(approved)
    assert changed.request_hash != approved.request_hash
    for_changed = [a for a in engine.approvals() if a.request_hash == changed.request_hash]
    assert [(a.id, a.status.value) for a in for_changed] == [
        (waiting.value.details["approval_id"], "pending")
    ]
    assert engine.get_attempt(changed.id).status is Status.PREPARED
    assert adapter.sent == []


def test_W2_approval_is_bound_to_the_effect_key(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2: an approval for one effect also covers another effect that happens to
    carry an identical request."""
    ex = start(engine, who, gated)
    approved = ex.admit(adapter, "write", {"to": "x"}, effect_key="first")
    engine.approve(pending_of(engine, approved).id, by=who.bob)
    clock.advance(1)
    other = ex.admit(adapter, "write", {"to": "x"}, effect_key="second")
    assert other.request_hash == approved.request_hash

    with pytest.raises(charter.ApprovalRequired):
        ex.dispatch(other.id, adapter)

    assert pending_of(engine, other).effect_id != effect_of(approved)
    assert engine.get_attempt(other.id).status is Status.PREPARED
    assert adapter.sent == []


def test_W2_retry_of_the_same_effect_and_request_reuses_its_approval(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2/A4: an approval is bound to an attempt instead of its effect, so a
    retry after a proven non-application asks a person again for the very same
    effect."""
    adapter.script["write"] = not_applied
    ex = start(engine, who, gated)
    first = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    engine.approve(pending_of(engine, first).id, by=who.bob)
    clock.advance(1)
    assert ex.dispatch(first.id, adapter).status is Status.FAILED
    del adapter.script["write"]

    retry = ex.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
    )

    assert retry.status is Status.SUCCEEDED
    assert [a.status for a in approvals_of(engine, retry)] == [ApprovalStatus.APPROVED]
    assert [s.attempt_id for s in adapter.sent] == [first.id, retry.id]


def test_W2_operation_outside_the_policy_is_sent_without_an_approval(
    engine: charter.Engine, who: Principals, gated: str, adapter: RecordingAdapter
) -> None:
    """Broken W2: the approval policy is applied to scopes it does not name (or not at
    all), so reads wait for a person or writes do not."""
    ex = start(engine, who, gated)

    read = ex.perform(adapter, "read", {"q": 1}, effect_key="look")

    assert read.status is Status.SUCCEEDED
    assert engine.approvals() == []
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert [s.operation for s in adapter.sent] == ["read"]


# -- who may decide -------------------------------------------------------------------------------


@pytest.mark.parametrize("decider", ["mallory", "agent"])
def test_W2_only_a_principal_with_approve_decides(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    decider: str,
) -> None:
    """Broken W2/P1: a principal without the approve right (a stranger, or the agent
    approving its own effect) decides an approval, or the refusal is not audited."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    request = pending_of(engine, attempt)
    principal: charter.Principal = getattr(who, decider)
    before = stored(engine, gated)

    for deny in (False, True):
        with pytest.raises(charter.NotAuthorized) as refused:
            engine.approve(request.id, by=principal, deny=deny)
        assert refused.value.details["right"] == "approve"

    assert stored(engine, gated) == before
    refusals = [
        e
        for e in engine.audit_events(gated)
        if e["kind"] == "authorization.refused" and e["entity"] == request.id
    ]
    assert [e["actor"] for e in refusals] == [decider, decider]
    with pytest.raises(charter.ApprovalRequired):
        ex.dispatch(attempt.id, adapter)
    assert adapter.sent == []


def test_W2_approve_right_covers_only_its_scopes(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken W2: a principal allowed to approve writes also approves charges."""
    contract = default_contract(approvals={"required": ["recorder.*"], "ttl_seconds": TTL})
    contract["principals"] = {**contract["principals"], "bob": {"approve": ["recorder.write"]}}
    mission = engine.create_mission(contract, by=who.alice)
    ex = start(engine, who, mission)
    charge = ex.admit(adapter, "charge", {"amount": 10}, effect_key="pay")
    request = pending_of(engine, charge)
    before = stored(engine, mission)

    with pytest.raises(charter.NotAuthorized) as refused:
        engine.approve(request.id, by=who.bob)

    assert refused.value.details["scope"] == "recorder.charge"
    assert stored(engine, mission) == before
    with pytest.raises(charter.ApprovalRequired):
        ex.dispatch(charge.id, adapter)
    assert adapter.sent == []


@pytest.mark.parametrize("first_deny", [False, True], ids=["approved", "denied"])
def test_W2_a_decided_approval_is_never_decided_again(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    first_deny: bool,
) -> None:
    """Broken W2: a decision is overwritten by a later one (a denial turned into an
    approval, or the reverse), so what was sent no longer matches what was decided."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    request = pending_of(engine, attempt)
    engine.approve(request.id, by=who.bob, deny=first_deny)
    before = stored(engine, gated)

    with pytest.raises(charter.StateError) as refused:
        engine.approve(request.id, by=who.alice, deny=not first_deny)

    assert refused.value.details["approval_id"] == request.id
    assert stored(engine, gated) == before
    [decided] = approvals_of(engine, attempt)
    assert decided.decided_by == "bob"
    outcome = ex.dispatch(attempt.id, adapter)
    if first_deny:
        assert outcome.status is Status.VOIDED
        assert adapter.sent == []
    else:
        assert outcome.status is Status.SUCCEEDED
        assert [s.attempt_id for s in adapter.sent] == [attempt.id]


# -- expiry across a crash -------------------------------------------------------------------------


def test_W2_approval_expired_during_downtime_is_renewed_not_a_dead_end(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2/R3/R9: an approval that expired while no process ran is either used
    anyway, or leaves the run stuck: resume refuses because of the expired approval
    and nothing ever opens the new request a person could decide."""
    ex = start(engine, who, gated)
    first = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    approval = pending_of(engine, first)
    engine.approve(approval.id, by=who.bob)
    clock.advance(engine.config.lease_seconds + 1)  # the process is gone; TTL passes too

    engine.coordinator.recover(ex.run_id, "seg-2")
    assert engine.get_attempt(first.id).status is Status.VOIDED
    for request in engine.approvals(pending=True):
        engine.approve(request.id, by=who.bob)
    resumed = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    try:
        again = resumed.perform(
            adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
        )
    except charter.ApprovalRequired as waiting:
        readmitted = engine.get_attempt(waiting.details["attempt_id"])
        engine.approve(pending_of(engine, readmitted).id, by=who.bob)
        again = resumed.dispatch(readmitted.id, adapter)

    assert again.status is Status.SUCCEEDED
    assert [s.attempt_id for s in adapter.sent] == [again.id]
    statuses = {a.id: a.status for a in approvals_of(engine, first)}
    assert statuses[approval.id] is not ApprovalStatus.APPROVED


def test_W2_spent_approval_does_not_block_resume_after_it_expires(
    engine: charter.Engine,
    who: Principals,
    gated: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken W2/R9: an approval whose effect was already sent and settled is still
    treated as a live wait, so once its TTL passes the run can never resume."""
    ex = start(engine, who, gated)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    engine.approve(pending_of(engine, attempt).id, by=who.bob)
    assert ex.dispatch(attempt.id, adapter).status is Status.SUCCEEDED
    clock.advance(engine.config.lease_seconds + 1)

    engine.coordinator.recover(ex.run_id, "seg-2")
    resumed = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    read = resumed.perform(adapter, "read", {"q": 1}, effect_key="look")

    assert read.status is Status.SUCCEEDED
    assert [s.attempt_id for s in adapter.sent] == [attempt.id, read.id]
    assert engine.get_attempt(attempt.id).status is Status.SUCCEEDED


def test_N5_W2_stopping_a_waiting_run_withdraws_its_pending_approval(
    engine: charter.Engine, who: Principals, gated: str, adapter: RecordingAdapter
) -> None:
    """Breaking it looks like an approval request of a stopped run left pending in
    the approvers' queue, and a later approval being taken for a decision that
    can never lead to a send."""
    ex = start(engine, who, gated)
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="gated")
    [attempt] = engine.attempts(run_id=ex.run_id)
    request = pending_of(engine, attempt)

    assert engine.stop_run(ex.run_id, by=who.alice).status is charter.RunStatus.STOPPED

    assert engine.approvals(pending=True) == []
    [withdrawn] = approvals_of(engine, attempt)
    assert (withdrawn.id, withdrawn.status) == (request.id, ApprovalStatus.WITHDRAWN)
    assert engine.get_attempt(attempt.id).status is charter.AttemptStatus.VOIDED
    before = stored(engine, gated)
    with pytest.raises(charter.StateError):
        engine.approve(request.id, by=who.bob)
    assert stored(engine, gated) == before
    trail = [(e["kind"], e["entity"]) for e in engine.audit_events(gated)]
    assert ("approval.withdrawn", request.id) in trail
    assert adapter.sent == []
