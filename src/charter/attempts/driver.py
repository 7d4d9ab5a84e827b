"""The one driver of an effect (A4, A6, A7): decide, try, decide again.

A node's call (:func:`calling`) and an executor's named try (:func:`perform`)
go through :func:`performing`, one generator: it takes the step
:func:`charter.attempts.effects.decide` chose, admits and sends through the one
send path (:mod:`charter.attempts.dispatch`), and after every try asks the
decider again with what that try left, until the decision is to replay a
record. A driver of the send path (:func:`~charter.attempts.dispatch.drive`,
:func:`~charter.attempts.dispatch.adrive`) runs it for a synchronous caller
or on an event loop.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from charter.adapters import Adapter, EffectClass
from charter.attempts import admission, calls, effects, settlement, store
from charter.attempts.calls import Call
from charter.attempts.dispatch import Send, Sending, dispatching_prepared, drive, sending
from charter.attempts.evidence import Report
from charter.attempts.model import Attempt, AttemptStatus, Effect, Lineage
from charter.errors import ApprovalRequired
from charter.runs.ownership import Segment
from charter.storage import Tx


def perform(
    seg: Segment,
    adapter: Adapter,
    operation: str,
    request: Any,
    *,
    effect_key: str,
    node_id: str = "",
    execution: int = 0,
    generation: int = 1,
    retry_of: str | None = None,
    call: Call | None = None,
    lineage: Lineage | None = None,
) -> Attempt:
    """Admit, dispatch, send and settle one effect as the caller names its try;
    return the recorded attempt.

    The returned attempt is SUCCEEDED, FAILED or UNKNOWN. A required approval
    that is not yet given raises :class:`~charter.errors.ApprovalRequired`
    with the attempt left PREPARED and its hold kept.
    """
    if call is None:
        call = calls.prepare(adapter, operation, request)
    at = Effect(node_id, execution, effect_key, generation, retry_of, lineage)
    first = effects.Step(effects.Decision.SEND, None, generation, retry_of)
    return drive(performing(seg, adapter, call, request, at, step=first), adapter)


def calling(
    seg: Segment, adapter: Adapter, operation: str, request: Any, at: Effect
) -> Sending[Attempt]:
    """A node's call of effect ``at``: the step :func:`effects.decide` takes from
    the effect's newest recorded attempt, then :func:`performing`."""
    call = calls.prepare(adapter, operation, request)
    lines = at.lines(seg.run_id)
    with seg.runtime.db.read() as tx:
        newest = store.effect_attempts(tx, lines, at.node_id, at.key, newest=True)
    step = effects.decide(newest[0] if newest else None, effects.InHand.of(call, seg.run_id, at))
    return (yield from performing(seg, adapter, call, request, at, step=step))


def performing(
    seg: Segment, adapter: Adapter, call: Call, request: Any, at: Effect, *, step: effects.Step
) -> Sending[Attempt]:
    """The one driver of an effect: it takes ``step`` (from :func:`effects.decide`,
    or the try a caller names), and after every try asks :func:`effects.decide`
    again with what that try left, until the decision is to replay a record.

    So a retry after the engine did not send (its deadline passed), after a
    read-only outcome written off under the contract's opt-in (A7), or of a
    PREPARED attempt now sent, is decided by the same rule, under the same
    retry policy, as a node's replay is.
    """
    hand = effects.InHand.of(call, seg.run_id, at)
    while True:
        if step.decision is effects.Decision.REPLAY:
            assert step.prior is not None
            return step.prior
        seen: bool | None = None
        if step.decision is effects.Decision.DISPATCH:
            assert step.prior is not None
            attempt = yield from dispatching_prepared(seg, step.prior.id, adapter, request=request)
        else:
            attempt, seen = yield from _try(seg, adapter, call, step.effect(at))
        if attempt.status is AttemptStatus.VOIDED:
            return attempt  # denied, or voided meanwhile: never sent, the caller is told
        step = effects.decide(_written_off(seg, attempt, call), hand, seen=seen)


def _try(
    seg: Segment, adapter: Adapter, call: Call, effect: Effect
) -> Generator[Send, Report, tuple[Attempt, bool]]:
    """One new attempt of the effect: admitted, and when nothing waits for an
    approval, sent and settled. Also says whether this call saw its outcome
    (not when the engine did not send it: its deadline had passed)."""
    seg.runtime.crash("admission.before")
    started = seg.runtime.clock.monotonic_us()  # before the dispatch commit (F3)
    attempt, units = admission.admission(seg, call, effect)
    if attempt.status is AttemptStatus.VOIDED:
        return attempt, False
    if attempt.status is AttemptStatus.PREPARED:
        seg.runtime.crash("admission.after")
        raise ApprovalRequired(
            f"{call.scope} needs an approval before it is sent; attempt {attempt.id} "
            "is PREPARED with its hold kept (see `charter approvals`)",
            attempt_id=attempt.id,
        )
    reports: list[Report] = []
    attempt = yield from sending(
        seg, attempt, adapter, started, call.secrets, units=units, reports=reports
    )
    return attempt, not reports[-1].unsent


def _written_off(seg: Segment, attempt: Attempt, call: Call) -> Attempt:
    """``attempt`` written off if it is a read-only UNKNOWN and the contract opts
    in (A7, the one rule in :func:`settlement.write_off_read_only`)."""
    if attempt.status is not AttemptStatus.UNKNOWN or call.effect_class is not (
        EffectClass.READ_ONLY
    ):
        return attempt

    def write_off(tx: Tx) -> Attempt:
        row = seg.own(tx)  # a fenced executor settles nothing (F2)
        contract = seg.runtime.authority.contract(tx, seg.mission_id, row["contract_version"])
        lost = "its send's outcome is unknown"
        if settlement.write_off_read_only(
            tx, attempt, contract, why=lost, segment=seg.segment_id, epoch=seg.epoch
        ):
            return store.load(tx, attempt.id)
        return attempt

    # transact: in a lane (L10), a hold that is not the slice's is written off
    # through the mission's gate, whole.
    return seg.runtime.db.transact(write_off, gate=seg.mission_id)
