"""Attempts (docs/rules.md, A1-A10): admission, write-ahead dispatch, settlement, retries.

Every test names the rule it proves and asserts on what the store recorded and
on what the adapter was actually asked to send, never on message text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import charter
from charter.adapters import Dispatch, Estimate, Outcome
from charter.attempts.calls import request_hash
from charter.attempts.model import idempotency_key_for
from charter.clock import seconds_us
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract
from conftest import stored as stored_with_runs

#: Every test taking ``adapter`` runs with a synchronous and an async one.
ADAPTER_KINDS = ("sync", "async")

Status = charter.AttemptStatus
Script = Callable[[Dispatch], Outcome]

WRITE_COST = {"usd": 5_000, "calls": 1}
READ_COST = {"usd": 1_000, "calls": 1}


# -- helpers -----------------------------------------------------------------------


def stored(engine: charter.Engine, mission: str) -> dict[str, Any]:
    return stored_with_runs(engine, mission, runs=False)


def audit_kinds(engine: charter.Engine, mission: str, *, after: int = 0) -> list[str]:
    return [str(e["kind"]) for e in engine.audit_events(mission)[after:]]


def entries_of(engine: charter.Engine, mission: str, attempt_id: str) -> list[dict[str, Any]]:
    return [e for e in engine.ledger_entries(mission) if e["attempt_id"] == attempt_id]


def amounts(entries: list[dict[str, Any]], kind: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        if e["kind"] == kind:
            out[e["unit"]] = out.get(e["unit"], 0) + int(e["amount"])
    return out


def raising(error: BaseException) -> Script:
    def handler(send: Dispatch) -> Outcome:
        raise error

    return handler


def returning(value: object) -> Script:
    def handler(send: Dispatch) -> Outcome:
        return cast(Outcome, value)

    return handler


def not_applied(send: Dispatch) -> Outcome:
    raise charter.NotApplied("connection refused", evidence={"errno": 111})


def start(
    engine: charter.Engine, who: Principals, mission: str, segment: str = "seg-1"
) -> charter.Executor:
    return engine.start_run(mission, by=who.agent, segment_id=segment)


# -- A1: no admission, no effect ---------------------------------------------------------


def test_A1_admission_refused_without_run_right_records_nothing(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A1: an attempt (or a hold) is recorded, or the adapter is called, for a
    principal whose contract grants no ``run`` right on the operation."""
    contract = default_contract(
        principals={
            "agent": {"run": ["recorder.read"]},
            "alice": ["resolve", "raise_limit", "stop", "approve"],
        }
    )
    mission = engine.create_mission(contract, by=who.alice)
    ex = start(engine, who, mission)
    before = stored(engine, mission)
    events = len(engine.audit_events(mission))

    with pytest.raises(charter.NotAuthorized) as refused:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert refused.value.code == "not_authorized"
    assert refused.value.details["scope"] == "recorder.write"
    assert stored(engine, mission) == before
    assert adapter.sent == []
    assert audit_kinds(engine, mission, after=events) == ["admission.refused"]


def test_A1_authority_is_checked_under_the_current_contract_version(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A1: authority is taken from the contract the run started under, so a right
    revoked by a new contract version still admits attempts."""
    ex = start(engine, who, mission)
    assert ex.perform(adapter, "write", {"n": 1}, effect_key="first").status is Status.SUCCEEDED
    revoked = default_contract()
    revoked["principals"] = {**revoked["principals"], "agent": {"run": ["recorder.read"]}}
    engine.amend_contract(mission, revoked, by=who.alice, reason="agent may only read")
    before = stored(engine, mission)
    sent = list(adapter.sent)

    with pytest.raises(charter.NotAuthorized):
        ex.perform(adapter, "write", {"n": 2}, effect_key="second")

    assert stored(engine, mission) == before
    assert adapter.sent == sent


def test_A1_admission_refused_on_a_stopped_run_records_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A1: a run that was stopped (terminal) still admits and sends attempts."""
    ex = start(engine, who, mission)
    engine.stop_run(ex.run_id, by=who.alice)
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert refused.value.details["run_status"] == "stopped"
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_A1_admission_refused_on_a_paused_run_even_when_it_would_fit(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A1: once a run is paused by an exhausted allowance, a smaller attempt that
    would still fit another unit is admitted anyway (the run must be active)."""
    mission = engine.create_mission(
        default_contract(allowance={"usd": 1_000_000, "calls": 1}), by=who.alice
    )
    ex = start(engine, who, mission)
    assert ex.perform(adapter, "write", {"n": 1}, effect_key="one").status is Status.SUCCEEDED
    with pytest.raises(charter.AllowanceExceeded):
        ex.perform(adapter, "write", {"n": 2}, effect_key="two")
    assert engine.run(ex.run_id).status is charter.RunStatus.PAUSED
    before = stored(engine, mission)
    small = RecordingAdapter(costs={"read": {"usd": 1}})

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(small, "read", {"n": 3}, effect_key="three")

    assert refused.value.details["run_status"] == "paused"
    assert stored(engine, mission) == before
    assert small.sent == []
    assert len(adapter.sent) == 1


def test_A1_stop_condition_max_attempts_refuses_admission(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A1: an attempt beyond the contract's ``max_attempts`` is admitted or sent."""
    mission = engine.create_mission(
        default_contract(stop_conditions={"max_attempts": 1}), by=who.alice
    )
    ex = start(engine, who, mission)
    ex.perform(adapter, "write", {"n": 1}, effect_key="one")
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"n": 2}, effect_key="two")

    assert refused.value.code == "admission_refused"
    assert "stop_condition" in refused.value.details
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1
    with pytest.raises(charter.AdmissionRefused):
        ex.perform(adapter, "write", {"n": 3}, effect_key="three")
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1


def test_A1_stop_condition_max_failed_attempts_refuses_admission(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A1: after ``max_failed_attempts`` FAILED attempts a new one is admitted."""
    mission = engine.create_mission(
        default_contract(stop_conditions={"max_failed_attempts": 1}), by=who.alice
    )
    ex = start(engine, who, mission)
    adapter.script["write"] = not_applied
    assert ex.perform(adapter, "write", {"n": 1}, effect_key="one").status is Status.FAILED
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "read", {"n": 2}, effect_key="two")

    assert "stop_condition" in refused.value.details
    assert stored(engine, mission) == before
    assert [s.operation for s in adapter.sent] == ["write"]


def test_A1_stop_condition_deadline_refuses_admission_by_the_store_clock(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A1: an attempt is admitted after the contract's deadline has passed."""
    deadline = clock.now_us() + seconds_us(5)
    mission = engine.create_mission(
        default_contract(stop_conditions={"deadline_us": deadline}), by=who.alice
    )
    ex = start(engine, who, mission)
    assert ex.perform(adapter, "write", {"n": 1}, effect_key="one").status is Status.SUCCEEDED
    clock.advance(5)
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"n": 2}, effect_key="two")

    assert "stop_condition" in refused.value.details
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1


def test_A1_admission_refused_for_a_unit_the_contract_does_not_budget(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """Broken A1: an attempt estimated in a unit without an allowance is admitted, so
    its cost is never checked against any limit."""
    adapter = RecordingAdapter(costs={"write": {"usd": 5_000, "tokens": 700}})
    ex = start(engine, who, mission)
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert refused.value.details["units"] == ["tokens"]
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_A1_allowance_refusal_holds_nothing_in_any_unit(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A1/L3: a refused admission still holds the units that did fit (here
    ``calls``), or records a PREPARED attempt."""
    mission = engine.create_mission(
        default_contract(allowance={"usd": 4_999, "calls": 100}), by=who.alice
    )
    ex = start(engine, who, mission)
    before = stored(engine, mission)

    with pytest.raises(charter.AllowanceExceeded) as refused:
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert refused.value.code == "allowance_exceeded"
    assert set(refused.value.details["short"]) == {"usd"}
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_A1_admission_records_prepared_with_holds_and_request_hash(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A1: admission records no attempt, records it in another status, holds a
    different amount than the estimate, or stores a hash that does not identify the
    request (key order must not matter, content must)."""
    ex = start(engine, who, mission)
    request = {"to": "x", "body": {"b": 2, "a": 1}}

    attempt = ex.admit(adapter, "write", request, effect_key="send")

    got = engine.get_attempt(attempt.id)
    assert got.status is Status.PREPARED
    assert got.estimate == WRITE_COST
    assert got.request == request
    assert got.dispatched_epoch is None
    assert got.admitted_epoch == ex.epoch
    canonical = json.dumps(
        {"body": {"a": 1, "b": 2}, "to": "x"}, sort_keys=True, separators=(",", ":")
    )
    assert got.request_hash == request_hash("recorder", "write", canonical)
    other = ex.admit(adapter, "write", {"to": "y", "body": {"a": 1, "b": 2}}, effect_key="other")
    assert engine.get_attempt(other.id).request_hash != got.request_hash
    entries = entries_of(engine, mission, attempt.id)
    assert amounts(entries, "hold") == WRITE_COST
    assert {e["kind"] for e in entries} == {"hold"}
    balances = engine.balances(mission)
    assert balances["usd"].held == 2 * WRITE_COST["usd"]
    assert balances["calls"].held == 2
    assert adapter.sent == []
    assert engine.check_ledger(mission) == []


# -- A1: bad input changes nothing --------------------------------------------------------


def test_A1_unknown_operation_is_refused_and_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A1: an operation the adapter does not declare (so no effect class) is
    recorded, held or sent."""
    ex = start(engine, who, mission)
    before = stored(engine, mission)
    events = len(engine.audit_events(mission))

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "delete_everything", {"to": "x"}, effect_key="send")

    assert refused.value.details["operation"] == "delete_everything"
    assert stored(engine, mission) == before
    assert len(engine.audit_events(mission)) == events
    assert adapter.sent == []


@pytest.mark.parametrize(
    "request_body",
    [
        {"payload": object()},
        {"tags": {"a", "b"}},
        {"raw": b"bytes"},
        {"ratio": float("nan")},
        {"limit": float("inf")},
    ],
    ids=["object", "set", "bytes", "nan", "infinity"],
)
def test_A1_non_json_request_is_refused_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    request_body: dict[str, Any],
) -> None:
    """Broken A1: a request that cannot be recorded as JSON is admitted (and so the
    record written before the send is not the request that is sent)."""
    ex = start(engine, who, mission)
    before = stored(engine, mission)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", request_body, effect_key="send")

    assert refused.value.code == "admission_refused"
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_A1_adapter_estimate_that_is_not_an_estimate_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """Broken A1: an adapter whose estimate is not an :class:`Estimate` gets an attempt
    admitted with an unchecked hold."""

    class NoEstimate(RecordingAdapter):
        def estimate(self, operation: str, request: Any) -> Estimate:
            return cast(Estimate, {"usd": 5})

    adapter = NoEstimate()
    ex = start(engine, who, mission)
    before = stored(engine, mission)

    with pytest.raises(charter.AdapterError):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert stored(engine, mission) == before
    assert adapter.sent == []


# -- A2: dispatch is write-ahead --------------------------------------------------------------


@dataclasses.dataclass
class StoreObserver:
    """A target that, when sent to, reads the store through a second engine."""

    engine: charter.Engine
    seen: list[charter.Attempt] = dataclasses.field(default_factory=list)
    dispatched_events: list[int] = dataclasses.field(default_factory=list)

    def __call__(self, send: Dispatch) -> Outcome:
        attempt = self.engine.get_attempt(send.attempt_id)
        self.seen.append(attempt)
        self.dispatched_events.append(
            sum(
                1
                for e in self.engine.audit_events(attempt.mission_id)
                if e["kind"] == "attempt.dispatched" and e["entity"] == send.attempt_id
            )
        )
        return Outcome.succeeded({"ok": True}, cost=WRITE_COST)


def test_A2_dispatched_is_committed_before_the_adapter_is_called(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    make_engine: Callable[..., charter.Engine],
) -> None:
    """Broken A2: the adapter is called while the store (as any other process sees it)
    still says PREPARED or nothing at all, so a crash during the send would leave no
    trace that the effect may have happened."""
    observer = StoreObserver(make_engine())
    adapter.script["write"] = observer
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert len(observer.seen) == 1
    seen = observer.seen[0]
    assert seen.status is Status.DISPATCHED
    assert seen.dispatched_epoch == ex.epoch
    assert seen.send_deadline_us == adapter.sent[0].send_deadline_us
    assert seen.estimate == WRITE_COST
    assert observer.dispatched_events == [1]
    assert engine.get_attempt(attempt.id).status is Status.SUCCEEDED


def test_A2_two_phase_dispatch_commits_before_the_adapter_is_called(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    make_engine: Callable[..., charter.Engine],
) -> None:
    """Broken A2: on the two-phase path (admit, later dispatch) the adapter is called
    before DISPATCHED is durable."""
    observer = StoreObserver(make_engine())
    adapter.script["write"] = observer
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    assert observer.engine.get_attempt(attempt.id).status is Status.PREPARED

    ex.dispatch(attempt.id, adapter)

    assert [a.status for a in observer.seen] == [Status.DISPATCHED]
    assert observer.dispatched_events == [1]
    assert engine.get_attempt(attempt.id).status is Status.SUCCEEDED


def test_A2_combined_path_still_records_both_phases(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2: when admission and dispatch share a transaction the attempt skips
    its PREPARED record, so the audit trail cannot show admission before dispatch."""
    ex = start(engine, who, mission)
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    got = engine.get_attempt(attempt.id)
    assert got.prepared_at_us is not None
    assert got.dispatched_at_us is not None
    assert got.prepared_at_us <= got.dispatched_at_us
    kinds = [str(e["kind"]) for e in engine.audit_events(mission) if e["entity"] == attempt.id]
    assert kinds[:3] == ["attempt.prepared", "attempt.dispatched", "attempt.settled"]


def test_A2_expired_lease_fences_dispatch_and_the_adapter_is_never_called(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A2: an executor whose lease expired by the store's clock (another owner
    may already have taken over) still commits DISPATCHED and sends."""
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    clock.advance(engine.config.lease_seconds + 1)
    before = stored(engine, mission)

    with pytest.raises(charter.Fenced) as fenced:
        ex.dispatch(attempt.id, adapter)

    assert fenced.value.epoch == ex.epoch
    assert adapter.sent == []
    assert stored(engine, mission) == before
    got = engine.get_attempt(attempt.id)
    assert got.status is Status.PREPARED
    assert got.dispatched_epoch is None
    assert "attempt.dispatched" not in audit_kinds(engine, mission)


def test_A2_expired_lease_fences_the_combined_path_and_records_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A2: the combined admit-and-dispatch path skips the lease check."""
    ex = start(engine, who, mission)
    clock.advance(engine.config.lease_seconds)
    before = stored(engine, mission)

    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert adapter.sent == []
    assert stored(engine, mission) == before


def test_A2_executor_of_a_superseded_epoch_never_calls_the_adapter(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2: after another segment took the run over (epoch + 1, fresh lease), the
    old executor still commits DISPATCHED and sends, so two owners send."""
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    engine.coordinator.recover(ex.run_id, "seg-2", force=True, by=who.alice)
    assert engine.run(ex.run_id).epoch == ex.epoch + 1
    before = stored(engine, mission)

    with pytest.raises(charter.Fenced) as fenced:
        ex.dispatch(attempt.id, adapter)
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"to": "y"}, effect_key="other")

    assert fenced.value.current_epoch == ex.epoch + 1
    assert adapter.sent == []
    assert stored(engine, mission) == before
    got = engine.get_attempt(attempt.id)
    assert got.status is Status.VOIDED
    assert got.dispatched_epoch is None
    assert "attempt.dispatched" not in audit_kinds(engine, mission)


def test_A2_dispatch_refused_when_the_run_right_was_revoked_after_admission(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2: authority is only checked at admission, so a PREPARED attempt of a
    principal who lost the right is still sent."""
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    revoked = default_contract()
    revoked["principals"] = {**revoked["principals"], "agent": {"run": ["recorder.read"]}}
    engine.amend_contract(mission, revoked, by=who.alice, reason="agent may only read")
    before = stored(engine, mission)

    with pytest.raises(charter.NotAuthorized):
        ex.dispatch(attempt.id, adapter)

    assert adapter.sent == []
    assert stored(engine, mission) == before
    assert engine.get_attempt(attempt.id).status is Status.PREPARED


def test_A2_attempt_voided_by_a_stop_is_never_dispatched(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2/L6: a PREPARED attempt voided when the run was stopped is dispatched
    anyway, or its hold is released more than once."""
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    engine.stop_run(ex.run_id, by=who.alice)
    assert engine.get_attempt(attempt.id).status is Status.VOIDED
    before = stored(engine, mission)

    with pytest.raises(charter.StateError) as refused:
        ex.dispatch(attempt.id, adapter)

    assert refused.value.details["status"] == "voided"
    assert adapter.sent == []
    assert stored(engine, mission) == before
    entries = entries_of(engine, mission, attempt.id)
    assert amounts(entries, "release") == WRITE_COST
    assert engine.balances(mission)["usd"].held == 0


def test_A2_dispatch_of_an_unknown_attempt_id_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2: dispatching an ID the store does not know sends something or writes."""
    ex = start(engine, who, mission)
    before = stored(engine, mission)

    with pytest.raises(charter.NotFound) as missing:
        ex.dispatch("att_doesnotexist", adapter)

    assert missing.value.details["attempt_id"] == "att_doesnotexist"
    assert adapter.sent == []
    assert stored(engine, mission) == before


def test_A2_dispatch_through_another_adapter_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A2: an attempt admitted for one adapter is sent through another, whose
    operation and effect class were never admitted."""
    ex = start(engine, who, mission)
    attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
    stranger = RecordingAdapter(name="stranger")
    before = stored(engine, mission)

    with pytest.raises(charter.StateError):
        ex.dispatch(attempt.id, stranger)

    assert stranger.sent == []
    assert adapter.sent == []
    assert stored(engine, mission) == before


# -- A3: an exception is not a failure -----------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("connection reset after the request was written"),
        TimeoutError("no response within 30s"),
        ConnectionResetError("peer reset"),
        charter.AdapterError("SDK raised"),
        ValueError("could not parse the response"),
    ],
    ids=["runtime", "timeout", "reset", "adapter-error", "bad-response"],
)
def test_A3_adapter_exception_is_unknown_with_full_hold_kept(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    error: Exception,
) -> None:
    """Broken A3/L4: an exception after the send is recorded as FAILED (so a retry could
    perform the effect twice) or releases/zeroes the hold."""
    adapter.script["write"] = raising(error)
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert attempt.status is Status.UNKNOWN
    got = engine.get_attempt(attempt.id)
    assert got.status is Status.UNKNOWN
    assert got.actual is None
    assert got.settled_at_us is None
    entries = entries_of(engine, mission, attempt.id)
    assert {e["kind"] for e in entries} == {"hold"}
    assert amounts(entries, "hold") == WRITE_COST
    balances = engine.balances(mission)
    assert balances["usd"].held == WRITE_COST["usd"]
    assert balances["usd"].spent == 0
    assert engine.mission(mission).attempts_failed == 0
    assert len(adapter.sent) == 1
    assert engine.check_ledger(mission) == []


def test_A3_not_applied_is_failed_with_hold_released_and_evidence_stored(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A3: the adapter's proof of non-application is lost (no evidence), the
    attempt stays UNKNOWN, or its hold is spent instead of released."""
    adapter.script["write"] = not_applied
    ex = start(engine, who, mission)
    limit = engine.balances(mission)["usd"].available

    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert attempt.status is Status.FAILED
    got = engine.get_attempt(attempt.id)
    assert got.status is Status.FAILED
    assert got.actual == {}
    assert got.settled_at_us is not None
    entries = entries_of(engine, mission, attempt.id)
    assert amounts(entries, "hold") == WRITE_COST
    assert amounts(entries, "release") == WRITE_COST
    assert amounts(entries, "spend") == {}
    balances = engine.balances(mission)
    assert balances["usd"].held == 0
    assert balances["usd"].spent == 0
    assert balances["usd"].available == limit
    evidence = engine.evidence(attempt.id)
    assert len(evidence) == 1
    assert evidence[0]["verdict"] == "not_applied"
    assert evidence[0]["settled"] == 1
    assert json.loads(evidence[0]["detail"]) == {"reason": "connection refused", "errno": 111}
    assert engine.mission(mission).attempts_failed == 1


@pytest.mark.parametrize(
    "garbage",
    [None, {"status": "succeeded"}, "ok", 200, True],
    ids=["none", "dict", "str", "int", "bool"],
)
def test_A3_returned_garbage_is_unknown_with_full_hold_kept(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    garbage: object,
) -> None:
    """Broken A3: an adapter that returns something other than an Outcome is read as a
    success or a failure, although nobody knows what the target did."""
    adapter.script["write"] = returning(garbage)
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    got = engine.get_attempt(attempt.id)
    assert attempt.status is Status.UNKNOWN
    assert got.status is Status.UNKNOWN
    assert got.actual is None
    assert engine.balances(mission)["usd"].held == WRITE_COST["usd"]
    assert engine.balances(mission)["usd"].spent == 0
    assert {e["kind"] for e in entries_of(engine, mission, attempt.id)} == {"hold"}


def test_A3_outcome_failed_is_failed_at_the_reported_cost(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A3: a target that applied the effect as a failure (and billed it) is
    recorded as UNKNOWN or with its cost dropped."""
    adapter.script["write"] = returning(
        Outcome.failed(
            {"error": "card_declined"}, cost={"usd": 300, "calls": 1}, receipt={"id": "rc_1"}
        )
    )
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    got = engine.get_attempt(attempt.id)
    assert got.status is Status.FAILED
    assert got.actual == {"usd": 300, "calls": 1}
    assert got.receipt == {"id": "rc_1"}
    entries = entries_of(engine, mission, attempt.id)
    assert amounts(entries, "spend") == {"usd": 300, "calls": 1}
    assert amounts(entries, "release") == {"usd": 4_700}
    assert engine.check_ledger(mission) == []


OUTCOMES = ["succeeded", "failed", "not_applied", "raised", "garbage"]
EXPECTED = {
    "succeeded": Status.SUCCEEDED,
    "failed": Status.FAILED,
    "not_applied": Status.FAILED,
    "raised": Status.UNKNOWN,
    "garbage": Status.UNKNOWN,
}


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(script=st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=6))
def test_A3_each_send_settles_only_as_far_as_its_outcome_proves(
    engine: charter.Engine, who: Principals, script: list[str]
) -> None:
    """Broken A3/L4: for some sequence of outcomes an uncertain send is settled, a
    proven one is left uncertain, or held/spent stop matching the attempts."""
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = start(engine, who, mission)
    plan = iter(script)

    def handler(send: Dispatch) -> Outcome:
        what = next(plan)
        if what == "succeeded":
            return Outcome.succeeded({"ok": 1}, cost={"usd": 4_000, "calls": 1})
        if what == "failed":
            return Outcome.failed({"ok": 0}, cost={"usd": 100})
        if what == "not_applied":
            raise charter.NotApplied("rejected before processing")
        if what == "raised":
            raise OSError("lost response")
        return cast(Outcome, object())

    adapter = RecordingAdapter(costs={"write": WRITE_COST}, script={"write": handler})
    recorded = [
        ex.perform(adapter, "write", {"i": i}, effect_key=f"e{i}") for i in range(len(script))
    ]

    statuses = [engine.get_attempt(a.id).status for a in recorded]
    assert statuses == [EXPECTED[w] for w in script]
    unknown = sum(1 for w in script if EXPECTED[w] is Status.UNKNOWN)
    spent = sum(4_000 if w == "succeeded" else 100 if w == "failed" else 0 for w in script)
    usd = engine.balances(mission)["usd"]
    assert usd.held == unknown * WRITE_COST["usd"]
    assert usd.spent == spent
    assert len(adapter.sent) == len(script)
    assert engine.check_ledger(mission) == []


# -- A4: a settled attempt is never performed again ----------------------------------------------


def test_A4_retry_after_failed_is_a_new_attempt_with_new_id_and_key_linked_to_it(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: a retry reuses the failed attempt (same ID or idempotency key), edits
    its record, or is not linked to it."""
    adapter.script["write"] = not_applied
    ex = start(engine, who, mission)
    first = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert first.status is Status.FAILED
    first_record = engine.get_attempt(first.id).to_dict()
    del adapter.script["write"]

    retry = ex.perform(
        adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
    )

    assert retry.status is Status.SUCCEEDED
    assert retry.id != first.id
    assert retry.idempotency_key != first.idempotency_key
    got = engine.get_attempt(retry.id)
    assert got.retry_of == first.id
    assert got.generation == 2
    assert got.effect_key == "send"
    assert engine.get_attempt(first.id).to_dict() == first_record
    assert [s.idempotency_key for s in adapter.sent] == [
        first.idempotency_key,
        retry.idempotency_key,
    ]
    assert [s.attempt_id for s in adapter.sent] == [first.id, retry.id]


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "not_applied"])
def test_A4_settled_attempt_dispatched_again_is_refused_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    outcome: str,
) -> None:
    """Broken A4: dispatching a settled attempt again sends it a second time or touches
    its record, hold or the balances."""
    if outcome == "failed":
        adapter.script["write"] = returning(Outcome.failed(cost={"usd": 10}))
    elif outcome == "not_applied":
        adapter.script["write"] = not_applied
    ex = start(engine, who, mission)
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert attempt.status.settled
    before = stored(engine, mission)
    evidence = engine.evidence(attempt.id)
    events = len(engine.audit_events(mission))

    with pytest.raises(charter.StateError) as refused:
        ex.dispatch(attempt.id, adapter)

    assert refused.value.details["status"] == attempt.status.value
    assert len(adapter.sent) == 1
    assert stored(engine, mission) == before
    assert engine.evidence(attempt.id) == evidence
    assert len(engine.audit_events(mission)) == events


def test_A4_unknown_attempt_is_not_retried(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: a retry linked to an UNKNOWN attempt is admitted and sent, so an effect
    that may already have happened is performed again instead of being reconciled."""
    adapter.script["write"] = raising(TimeoutError("no response"))
    ex = start(engine, who, mission)
    first = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert first.status is Status.UNKNOWN
    del adapter.script["write"]
    before = stored(engine, mission)

    with pytest.raises(charter.CharterError):
        ex.perform(
            adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
        )

    assert [s.attempt_id for s in adapter.sent] == [first.id]
    assert stored(engine, mission) == before


def test_A4_same_effect_key_and_generation_is_never_performed_again(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: asking again for an effect key and generation that already has a
    settled attempt sends it again, changes the store, or fails with an untyped
    database error instead of a Charter error."""
    ex = start(engine, who, mission)
    first = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert first.status is Status.SUCCEEDED
    before = stored(engine, mission)

    error: BaseException | None = None
    again: charter.Attempt | None = None
    try:
        again = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    except Exception as exc:
        error = exc

    if error is not None:
        assert isinstance(error, charter.CharterError), f"untyped error {type(error)!r}"
    else:
        assert again is not None
        assert again.id == first.id
    assert len(adapter.sent) == 1
    assert stored(engine, mission) == before


# -- A5: the idempotency key, the fencing token, the deadline -------------------------------


def test_A5_idempotency_key_is_the_attempts_own_and_stable_forever(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    make_engine: Callable[..., charter.Engine],
) -> None:
    """Broken A5: the key sent is not derived from the attempt ID, changes between
    admission, dispatch and settlement, is shared by two attempts, or reads differently
    from another process."""
    adapter.script["read"] = raising(TimeoutError("no response"))
    ex = start(engine, who, mission)
    prepared = ex.admit(adapter, "write", {"to": "x"}, effect_key="two-phase")
    key_at_admission = engine.get_attempt(prepared.id).idempotency_key
    ex.dispatch(prepared.id, adapter)
    combined = ex.perform(adapter, "write", {"to": "y"}, effect_key="combined")
    unknown = ex.perform(adapter, "read", {"q": 1}, effect_key="unknown")
    assert unknown.status is Status.UNKNOWN

    attempts = [prepared, combined, unknown]
    assert [s.attempt_id for s in adapter.sent] == [a.id for a in attempts]
    other = make_engine()
    for attempt, sent in zip(attempts, adapter.sent, strict=True):
        assert sent.idempotency_key == idempotency_key_for(attempt.id)
        assert attempt.id in sent.idempotency_key
        assert engine.get_attempt(attempt.id).idempotency_key == sent.idempotency_key
        assert other.get_attempt(attempt.id).idempotency_key == sent.idempotency_key
    assert key_at_admission == adapter.sent[0].idempotency_key
    assert len({s.idempotency_key for s in adapter.sent}) == 3
    dispatched = {
        e["entity"]: json.loads(e["payload"])["idempotency_key"]
        for e in engine.audit_events(mission)
        if e["kind"] == "attempt.dispatched"
    }
    assert dispatched == {s.attempt_id: s.idempotency_key for s in adapter.sent}


def test_A5_fencing_token_sent_is_the_runs_epoch(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A5/F3: the adapter is not given the run's epoch as fencing token, so a
    target that checks it cannot reject a stale owner's send."""
    ex = start(engine, who, mission)
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    two_phase = ex.admit(adapter, "write", {"to": "y"}, effect_key="later")
    ex.dispatch(two_phase.id, adapter)

    epoch = engine.run(ex.run_id).epoch
    assert epoch == ex.epoch == 1
    assert [s.fencing_token for s in adapter.sent] == [f"{ex.run_id}:{epoch}"] * 2
    assert engine.get_attempt(attempt.id).dispatched_epoch == epoch
    assert engine.get_attempt(two_phase.id).dispatched_epoch == epoch


def test_A5_send_deadline_never_exceeds_the_lease(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A5/F3: the send deadline runs past the owner's lease, so a paused owner
    could still send after another owner took the run over."""
    ex = start(engine, who, mission)
    clock.advance(10)  # a third of the lease used: not renewed, 20 s left
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    lease = engine.run(ex.run_id).lease_expires_us
    sent = adapter.sent[0]
    assert sent.send_deadline_us <= lease
    assert sent.send_deadline_us <= clock.now_us() + seconds_us(engine.config.send_deadline_seconds)
    assert sent.send_deadline_us > clock.now_us()
    assert engine.get_attempt(attempt.id).send_deadline_us == sent.send_deadline_us

    clock.advance(10)  # less than half the lease left: the dispatch commit renews it
    later = ex.admit(adapter, "write", {"to": "y"}, effect_key="later")
    clock.advance(1)
    ex.dispatch(later.id, adapter)
    lease = engine.run(ex.run_id).lease_expires_us
    assert adapter.sent[1].send_deadline_us <= lease
    assert engine.get_attempt(later.id).send_deadline_us == adapter.sent[1].send_deadline_us


def test_A5_send_deadline_follows_the_configured_send_window(
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
    make_engine: Callable[..., charter.Engine],
) -> None:
    """Broken A5/F3: the configured ``send_deadline_seconds`` is ignored and the adapter
    may send for the whole lease."""
    short = make_engine(send_deadline_seconds=5)
    agent = short.authenticate(who.credentials["agent"])
    ex = short.start_run(mission, by=agent, segment_id="seg-short")

    ex.perform(adapter, "write", {"to": "x"}, effect_key="send")

    assert adapter.sent[0].send_deadline_us == clock.now_us() + seconds_us(5)
    assert adapter.sent[0].send_deadline_us < short.run(ex.run_id).lease_expires_us


# -- A7: effect classes ----------------------------------------------------------------------------


def test_A7_read_only_unknown_is_written_off_at_full_hold_and_retried_as_a_new_attempt(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A7/L9: under the ``write_off`` opt-in a read-only UNKNOWN is settled below
    its hold, is retried under its own ID or key, or the retry is not linked to it."""
    mission = engine.create_mission(default_contract(read_only_unknown="write_off"), by=who.alice)
    tries: list[str] = []

    def flaky(send: Dispatch) -> Outcome:
        tries.append(send.attempt_id)
        if len(tries) == 1:
            raise TimeoutError("model call timed out")
        return Outcome.succeeded({"text": "hi"}, cost={"usd": 400, "calls": 1})

    adapter.script["read"] = flaky
    ex = start(engine, who, mission)

    result = ex.perform(adapter, "read", {"prompt": "hi"}, effect_key="ask")

    attempts = engine.attempts(mission_id=mission)
    assert len(attempts) == 2
    first = next(a for a in attempts if a.retry_of is None)
    assert first.status is Status.WRITTEN_OFF
    assert first.actual == READ_COST
    assert result.id != first.id
    assert result.status is Status.SUCCEEDED
    retry = engine.get_attempt(result.id)
    assert retry.retry_of == first.id
    assert retry.effect_key == first.effect_key
    assert retry.generation == first.generation + 1
    assert retry.idempotency_key != first.idempotency_key
    assert [s.idempotency_key for s in adapter.sent] == [
        first.idempotency_key,
        retry.idempotency_key,
    ]
    first_entries = entries_of(engine, mission, first.id)
    assert amounts(first_entries, "spend") == READ_COST
    assert amounts(first_entries, "release") == {}
    usd = engine.balances(mission)["usd"]
    assert usd.spent == READ_COST["usd"] + 400
    assert usd.held == 0
    assert engine.check_ledger(mission) == []


@pytest.mark.parametrize("operation", ["write", "charge"], ids=["unsafe", "idempotent_keyed"])
def test_A7_unsafe_and_keyed_unknown_are_never_written_off(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, operation: str
) -> None:
    """Broken A7: the read-only opt-in also writes off (and re-sends) an operation that
    may have had an outside effect."""
    mission = engine.create_mission(default_contract(read_only_unknown="write_off"), by=who.alice)
    adapter.script[operation] = raising(TimeoutError("no response"))
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, operation, {"amount": 1}, effect_key="pay")

    assert attempt.status is Status.UNKNOWN
    attempts = engine.attempts(mission_id=mission)
    assert [(a.id, a.status) for a in attempts] == [(attempt.id, Status.UNKNOWN)]
    assert len(adapter.sent) == 1
    hold = dict(adapter.costs[operation])
    assert amounts(entries_of(engine, mission, attempt.id), "hold") == hold
    assert engine.balances(mission)["usd"].held == hold["usd"]
    assert engine.balances(mission)["usd"].spent == 0


def test_A7_default_contract_keeps_a_read_only_unknown_waiting(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A7: without the contract's opt-in a read-only UNKNOWN is written off or
    retried instead of waiting for evidence or a person."""
    assert engine.contract(mission).read_only_unknown == "wait"
    adapter.script["read"] = raising(TimeoutError("model call timed out"))
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "read", {"prompt": "hi"}, effect_key="ask")

    assert attempt.status is Status.UNKNOWN
    assert [a.status for a in engine.attempts(mission_id=mission)] == [Status.UNKNOWN]
    assert len(adapter.sent) == 1
    assert engine.balances(mission)["usd"].held == READ_COST["usd"]
    assert engine.balances(mission)["usd"].spent == 0


def test_A7_read_only_retries_are_bounded_and_the_caller_sees_what_is_stored(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken A7: a target that never answers drains the allowance by unbounded
    retries, or the attempt handed back to the caller says something other than the
    store (e.g. UNKNOWN while the store says WRITTEN_OFF)."""
    mission = engine.create_mission(default_contract(read_only_unknown="write_off"), by=who.alice)
    adapter.script["read"] = raising(TimeoutError("model call timed out"))
    ex = start(engine, who, mission)

    result = ex.perform(adapter, "read", {"prompt": "hi"}, effect_key="ask")

    assert len(adapter.sent) == 1 + adapter.operations["read"].retries
    attempts = engine.attempts(mission_id=mission)
    assert len(attempts) == 1 + adapter.operations["read"].retries
    by_id = {a.id: a for a in attempts}
    for a in attempts:
        if a.retry_of is not None:
            assert by_id[a.retry_of].status is Status.WRITTEN_OFF
    assert result.status is engine.get_attempt(result.id).status
    assert engine.check_ledger(mission) == []


def test_S1_F1_a_lease_renewal_is_an_audited_transition(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken S1: the run's lease moves (a change of its stored row) with no audit
    event, or a renewal extends a lease the run's owner no longer holds."""
    ex = start(engine, who, mission)
    first = engine.run(ex.run_id).lease_expires_us

    clock.advance(16)  # past half of the 30 s lease: the next commit renews it
    ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    renewed = engine.run(ex.run_id).lease_expires_us
    clock.advance(1)
    explicit = ex.renew_lease()

    events = [e for e in engine.audit_events(mission) if e["kind"] == "run.lease_renewed"]
    assert [(int(e["before"]), int(e["after"])) for e in events] == [
        (first, renewed),
        (renewed, explicit),
    ]
    assert renewed == first + 16_000_000 and engine.run(ex.run_id).lease_expires_us == explicit
    assert all(v.ok for v in engine.verify_audit(mission))
