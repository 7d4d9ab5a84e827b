"""Admission (A1, A4, L3, L7): what must hold before an attempt is recorded, and
its record.

Admission checks, in one transaction under the mission's gate, that the
segment still owns the run (F1), the run is active, the principal has the
``run`` right under the current contract, no stop condition holds, the
allowance covers the estimate in every unit, and the effect may be tried;
then it records the attempt PREPARED with its holds. When no approval wait
comes between them, the same transaction is the dispatch commit (A2).

Each check either returns or raises a refusal that is audited; the refusals
that the rules say must change the run (a stop condition makes it stopping,
an exhausted allowance pauses it) keep that change.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from charter import ledger
from charter.attempts import effects, settlement, store
from charter.attempts.calls import Call
from charter.attempts.model import Attempt, AttemptStatus, Effect, changed, idempotency_key_for
from charter.contracts import store as contracts_store
from charter.contracts.authority import require
from charter.contracts.contract import Contract
from charter.contracts.principals import Right
from charter.errors import (
    AdmissionRefused,
    AllowanceExceeded,
    SliceUnavailable,
    StoreConflict,
)
from charter.ids import check_text
from charter.ledger.escrow import slices as escrow
from charter.ledger.escrow import store as escrow_store
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.storage import Row, Tx
from charter.waits import approvals
from charter.waits.approvals import ApprovalStatus


def check_effect(seg: Segment, tx: Tx, effect: Effect) -> None:
    """A4 under the mission's gate: the effect's attempts read now must admit
    this try (:func:`effects.check_admissible`, the decider's rule)."""
    lines = effect.lines(seg.run_id)
    rows = store.effect_attempts(tx, lines, effect.node_id, effect.key)
    effects.check_admissible(rows, effect, seg.run_id)


def check_stop(seg: Segment, tx: Tx, contract: Contract, row: Row, call: Call) -> None:
    held = contract.stop_conditions.holding(
        now_us=tx.now_us, admitted=row["attempts_admitted"], failed=row["attempts_failed"]
    )
    if not held:
        return
    why = held[0][1]
    seg.set_status(tx, row, RunStatus.STOPPING, f"stop condition: {why}")
    settlement.void_prepared(
        tx, seg.run_id, "run stopping", actor=seg.principal, segment=seg.segment_id, epoch=seg.epoch
    )
    settlement.conclude_stop(tx, seg.run_id, actor=seg.principal, segment=seg.segment_id)
    raise tx.refused(
        AdmissionRefused(f"stop condition holds: {why}; the run is stopping", stop_condition=why),
        mission_id=seg.mission_id,
        kind="admission.refused",
        entity=seg.run_id,
        actor=seg.principal,
        payload={"scope": call.scope, "stop_condition": why},
        keep_changes=True,
    )


def check_allowance(seg: Segment, tx: Tx, contract: Contract, row: Row, call: Call) -> None:
    """L3 and L7: all units or none; exhausted or incident -> pause and ask."""
    estimate = call.estimate.amounts
    unbudgeted = sorted(set(estimate) - set(contract.allowance))
    if unbudgeted:
        raise tx.refused(
            AdmissionRefused(
                f"{call.scope} is estimated in unit(s) {unbudgeted} that the contract does "
                f"not budget; add them to the contract's allowance",
                units=unbudgeted,
            ),
            mission_id=seg.mission_id,
            kind="admission.refused",
            entity=seg.run_id,
            actor=seg.principal,
            payload={"scope": call.scope, "units": unbudgeted},
        )
    # Read with ownership, under the mission's gate: no other admission can
    # hold from the same allowance until this transaction ends.
    lane = tx.lane(seg.mission_id)
    books = ledger.cached(tx, seg.mission_id if lane is None else lane.chain)
    available = {unit: bal.available for unit, bal in books.items()}
    short = {
        u: {"estimate": a, "available": available.get(u, 0)}
        for u, a in estimate.items()
        if a > available.get(u, 0)
    }
    if not short and not row["open_incidents"]:
        return
    if short and not row["open_incidents"] and lane is not None:
        # L10: the slice cannot cover it; the mission's gate decides, as without it.
        raise SliceUnavailable(
            f"escrow slice {lane.chain} cannot cover {call.scope}: {short}",
            slice_id=lane.chain,
            why="short",
        )
    if not row["open_incidents"] and escrow.reclaim(
        tx, seg.mission_id, estimate, actor=seg.principal
    ):
        return  # L10: what the mission's slices did not use covers it
    if row["open_incidents"]:
        why = f"{row['open_incidents']} open incident(s) on the mission"
    else:
        why = "allowance exhausted: " + ", ".join(
            f"{u} needs {v['estimate']}, {v['available']} available"
            for u, v in sorted(short.items())
        )
    seg.set_status(tx, row, RunStatus.PAUSED, why)
    raise tx.refused(
        AllowanceExceeded(
            f"admission of {call.scope} refused ({why}); the run is paused until a "
            "principal with raise_limit raises the limit or the incident is closed, or "
            "the run is stopped",
            short=short,
            open_incidents=row["open_incidents"],
        ),
        mission_id=seg.mission_id,
        kind="admission.refused",
        entity=seg.run_id,
        actor=seg.principal,
        payload={"scope": call.scope, "short": short, "open_incidents": row["open_incidents"]},
        keep_changes=True,
    )


class Admitted(NamedTuple):
    """An admitted attempt and the units its contract budgeted then: what its
    settlement counts as budgeted (L5). Kept with the call, never on the
    executor, which concurrent calls share."""

    attempt: Attempt
    units: frozenset[str]


def admission(seg: Segment, call: Call, effect: Effect, *, dispatch: bool = True) -> Admitted:
    """The admission transaction; a repeat of an effect's generation is reported
    as such, and records nothing. An effect key or node id no store would keep
    as given is refused first (A10)."""
    check_text("effect key", effect.key)
    check_text("node id", effect.node_id)
    try:
        return seg.runtime.db.transact(
            lambda tx: admit(seg, tx, call, effect, dispatch=dispatch), gate=seg.mission_id
        )
    except StoreConflict:
        # The unique index refused the row (it may travel with COMMIT): say
        # which attempt the effect already has.
        with seg.runtime.db.read() as tx:
            check_effect(seg, tx, effect)
        raise


def admit(seg: Segment, tx: Tx, call: Call, effect: Effect, *, dispatch: bool = True) -> Admitted:
    """A1 + (when no approval wait intervenes) A2, in the caller's transaction."""
    row = _lent(seg, tx, seg.own(tx))
    contract = seg.runtime.authority.contract(tx, seg.mission_id, row["contract_version"])
    _check_active(seg, tx, row, call)
    require(
        tx,
        contract,
        seg.principal,
        Right.RUN,
        call.scope,
        mission_id=seg.mission_id,
        entity=seg.run_id,
        why=f"under contract v{row['contract_version']}",
        kind="admission.refused",
    )
    check_stop(seg, tx, contract, row, call)
    check_allowance(seg, tx, contract, row, call)
    if effect.followed(row["linked_from"]):
        check_effect(seg, tx, effect)
    standing = ApprovalStatus.APPROVED
    if contract.approvals.requires(call.scope):
        standing, _ = approvals.standing(
            tx,
            contract,
            mission_id=seg.mission_id,
            run_id=seg.run_id,
            effect=approvals.effect_id(seg.run_id, effect.node_id, effect.execution, effect.key),
            scope=call.scope,
            request_hash=call.request_hash,
            estimate=call.estimate.amounts,
            actor=seg.principal,
            epoch=seg.epoch,
        )
    attempt = _record(seg, tx, call, effect, dispatch and standing is ApprovalStatus.APPROVED)
    if standing is ApprovalStatus.DENIED:
        attempt = void_denied(seg, tx, attempt)
    return Admitted(attempt, frozenset(contract.allowance))


def _lent(seg: Segment, tx: Tx, row: Row) -> Row:
    """L10 at admission. In a lane: its slice must be open and its lease running
    (else the mission's gate admits). Through the mission's gate: slices whose
    lease lapsed are returned first, and what they did not use is available."""
    lane = tx.lane(seg.mission_id)
    if lane is not None:
        if row["slice_status"] != "open" or row["slice_expires_us"] <= tx.now_us:
            raise SliceUnavailable(
                f"escrow slice {lane.chain} is {row['slice_status']} (lease to "
                f"{row['slice_expires_us']}); the mission's gate admits instead",
                slice_id=lane.chain,
                why="lapsed" if row["slice_status"] == "open" else row["slice_status"],
            )
        return row
    lapse = row["escrow_lapse"]
    if lapse is not None and lapse <= tx.now_us:
        # What they did not use goes back to the mission's books, staged in
        # this transaction, where the allowance check reads them.
        escrow.sweep(tx, seg.mission_id)
    return row


def void_denied(seg: Segment, tx: Tx, attempt: Attempt) -> Attempt:
    """W2: a denied effect is never sent; its attempt is voided and its hold released."""
    settlement.void(
        tx, attempt, "approval denied", actor=seg.principal, segment=seg.segment_id, epoch=seg.epoch
    )
    return changed(attempt, status=AttemptStatus.VOIDED, reason="approval denied")


def _check_active(seg: Segment, tx: Tx, row: Row, call: Call) -> None:
    status = RunStatus(row["status"])
    if status is RunStatus.ACTIVE:
        return
    raise tx.refused(
        AdmissionRefused(
            f"run {seg.run_id} is {status.value}; "
            + (
                "a terminal run admits nothing more (start a reviewed new linked run)"
                if status.terminal
                else "nothing new is admitted until it is active again (see `charter show RUN`)"
            ),
            run_status=status.value,
        ),
        mission_id=seg.mission_id,
        kind="admission.refused",
        entity=seg.run_id,
        actor=seg.principal,
        payload={"scope": call.scope, "run_status": status.value},
    )


def _record(seg: Segment, tx: Tx, call: Call, effect: Effect, dispatch_now: bool) -> Attempt:
    """Write the attempt PREPARED (and DISPATCHED, when sent now) with its holds."""
    attempt_id = tx.ids.new("att")
    now = tx.now_us
    deadline = seg.send_deadline(now) if dispatch_now else None
    attempt = Attempt(
        id=attempt_id,
        mission_id=seg.mission_id,
        run_id=seg.run_id,
        node_id=effect.node_id,
        execution=effect.execution,
        effect_key=effect.key,
        adapter=call.adapter.name,
        operation=call.operation,
        effect_class=call.effect_class.value,
        status=AttemptStatus.DISPATCHED if dispatch_now else AttemptStatus.PREPARED,
        principal=seg.principal,
        admitted_epoch=seg.epoch,
        dispatched_epoch=seg.epoch if dispatch_now else None,
        idempotency_key=idempotency_key_for(attempt_id),
        request_hash=call.request_hash,
        request=call.request,
        estimate=dict(call.estimate.amounts),
        actual=None,
        result=None,
        receipt=None,
        price_source=call.estimate.price_source,
        retry_of=effect.retry_of,
        reason=None,
        send_deadline_us=deadline,
        prepared_at_us=now,
        dispatched_at_us=now if dispatch_now else None,
        settled_at_us=None,
        generation=effect.generation,
    )
    store.insert(tx, attempt, call.request_json)
    lane = tx.lane(seg.mission_id)
    if lane is not None:  # L10: the hold is the slice's
        escrow_store.held_in(tx, attempt.id, lane.chain)
        lane.members.add(attempt.id)
    holds = ledger.record(
        tx, seg.mission_id, attempt.id, ledger.hold(attempt.estimate), attempt.price_source
    )
    contracts_store.count_admitted(tx, seg.mission_id)
    _audit_prepared(seg, tx, call, effect, attempt, holds=holds)
    if dispatch_now:
        audit_dispatched(seg, tx, attempt)
    return attempt


def _audit_prepared(
    seg: Segment,
    tx: Tx,
    call: Call,
    effect: Effect,
    attempt: Attempt,
    *,
    holds: dict[str, Any],
) -> None:
    """The admission's event, carrying its holds (the ledger's entries)."""
    tx.audit(
        seg.mission_id,
        "attempt.prepared",
        attempt.id,
        actor=seg.principal,
        segment=seg.segment_id,
        epoch=seg.epoch,
        after="prepared",
        payload={
            "scope": call.scope,
            "node_id": effect.node_id,
            "execution": effect.execution,
            "effect_key": effect.key,
            "generation": effect.generation,
            "request_hash": call.request_hash,
            "estimate": attempt.estimate,
            "price_source": attempt.price_source,
            "retry_of": effect.retry_of,
            **holds,
        },
    )


def audit_dispatched(seg: Segment, tx: Tx, attempt: Attempt) -> None:
    """The dispatch commit's event (A2), with the key and deadline the send carries."""
    tx.audit(
        seg.mission_id,
        "attempt.dispatched",
        attempt.id,
        actor=seg.principal,
        segment=seg.segment_id,
        epoch=seg.epoch,
        before="prepared",
        after="dispatched",
        payload={
            "idempotency_key": attempt.idempotency_key,
            "send_deadline_us": attempt.send_deadline_us,
        },
    )
