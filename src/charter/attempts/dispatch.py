"""The one send path (A2, A3, A8, F3): an attempt reaching its adapter.

A live dispatch and a reconcile's same-key replay are the same act, a send, so
both go through here: a dispatch commit that checks, in the transaction that
records the send, the segment's epoch, claim and lease (F1), the run's
status, the principal's authority and that the attempt is still PREPARED (a
live dispatch) or still unresolved (a replay); then :func:`send`, which checks
the deadline on this process's monotonic clock one last time and calls the
adapter once; then the settlement of what it reported, in one transaction
(:mod:`charter.attempts.evidence` is the format). A settlement that cannot be committed
is an uncertainty (A4): the attempt stays DISPATCHED and nothing is retried.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from charter import secret
from charter.adapters import Adapter, Dispatch, EffectClass, Evidence, Outcome
from charter.adapters.protocol import blocking, is_async
from charter.attempts import admission, late, settlement, store
from charter.attempts.calls import encode_request, request_hash
from charter.attempts.evidence import (
    Report,
    from_answer,
    from_late,
    from_raised,
    record,
    unrecorded,
)
from charter.attempts.late import LateSettles
from charter.attempts.model import Attempt, AttemptStatus, changed
from charter.clock import seconds_us
from charter.contracts.authority import require
from charter.contracts.contract import Contract
from charter.contracts.principals import Right
from charter.errors import (
    AmountOverflow,
    ApprovalRequired,
    CharterError,
    Fenced,
    StateError,
)
from charter.ledger.incidents import open_incident
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.secret import Secret
from charter.storage import Tx
from charter.waits import approvals
from charter.waits.approvals import ApprovalStatus

#: Run statuses in which a same-key replay may be sent: a replay can perform the
#: effect for the first time, so a paused, stopping or ended run sends none.
_REPLAYABLE = frozenset({RunStatus.ACTIVE, RunStatus.WAITING, RunStatus.NEEDS_INTERVENTION})

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """One send a sending generator asks its driver for; it gets the :class:`Report`."""

    adapter: Adapter
    order: Dispatch
    secrets: list[Secret]
    #: The most bytes of JSON kept of each part of the answer (A10).
    limit: int


#: The engine's side of a send, one generator for both kinds of adapter: it
#: yields each :class:`Send` (after the dispatch commit) and receives what was
#: reported (before the settlement), so every rule is written once, and a
#: driver decides only how the adapter is called: :func:`drive` for a
#: synchronous caller, :func:`adrive` on the caller's event loop.
Sending = Generator[Send, Report, T]


def drive(steps: Sending[T], adapter: Adapter) -> T:
    """Run ``steps`` to the end for a synchronous caller; an async adapter is
    awaited on a private loop (:func:`~charter.adapters.protocol.blocking`)."""
    if is_async(adapter):
        return blocking(adrive(steps))
    try:
        step = next(steps)
        while True:
            step = steps.send(send(step.adapter, step.order, step.secrets, step.limit))
    except StopIteration as done:
        return cast(T, done.value)


async def adrive(steps: Sending[T]) -> T:
    """Run ``steps`` to the end on the caller's event loop: the short store
    commits in a worker thread, each send awaited here. A send cancelled while
    the adapter is awaited is settled UNKNOWN (A3) before the cancellation goes on."""
    import asyncio  # noqa: PLC0415 - the running loop loaded it (see blocking)

    step = await asyncio.to_thread(_advance, steps, None)
    while isinstance(step, Send):
        try:
            report = await asend(step.adapter, step.order, step.secrets, step.limit)
        except asyncio.CancelledError:
            cut = Report(Evidence.indeterminate(), "cancelled while the adapter was awaited")
            with contextlib.suppress(CharterError):
                await asyncio.to_thread(_advance, steps, cut)
            steps.close()
            raise
        step = await asyncio.to_thread(_advance, steps, report)
    return cast(T, step.value)


@dataclass(frozen=True)
class _Done:
    value: Any


def _advance(steps: Sending[Any], report: Report | None) -> Send | _Done:
    """One step of ``steps`` (a StopIteration cannot cross a thread's future)."""
    try:
        return next(steps) if report is None else steps.send(report)
    except StopIteration as done:
        return _Done(done.value)


def send(adapter: Adapter, order: Dispatch, secrets: list[Secret], limit: int) -> Report:
    """Call ``adapter`` once with ``order`` (unless its deadline has passed);
    what it reports is recorded without ``secrets`` and at most ``limit``
    bytes of JSON per part (S3, A10)."""
    if is_async(adapter):
        return blocking(asend(adapter, order, secrets, limit))
    if order.expired:
        return from_late(order)
    try:
        answer = adapter.dispatch(order)
    except Exception as exc:
        return from_raised(exc, secrets, limit)
    return from_answer(answer, secrets, limit)


async def asend(adapter: Adapter, order: Dispatch, secrets: list[Secret], limit: int) -> Report:
    """:func:`send` on the caller's event loop: an async adapter is awaited
    here, a synchronous one is sent from a worker thread so the loop goes on."""
    if not is_async(adapter):
        import asyncio  # noqa: PLC0415 - the running loop loaded it (see blocking)

        return await asyncio.to_thread(send, adapter, order, secrets, limit)
    if order.expired:
        return from_late(order)
    try:
        answer = await cast(Awaitable[Outcome], adapter.dispatch(order))
    except Exception as exc:
        return from_raised(exc, secrets, limit)
    return from_answer(answer, secrets, limit)


def dispatch_prepared(
    seg: Segment, attempt_id: str, adapter: Adapter, *, request: Any = None
) -> Attempt:
    """Commit DISPATCHED for a PREPARED attempt of this epoch, send it, settle it.

    ``request`` is the live request, with its secrets' values (S3), when the
    caller has it (a replayed node does); it must be the recorded one. Without
    it the request is rebuilt from the record.
    """
    return drive(dispatching_prepared(seg, attempt_id, adapter, request=request), adapter)


def dispatching_prepared(
    seg: Segment, attempt_id: str, adapter: Adapter, *, request: Any = None
) -> Sending[Attempt]:
    """:func:`dispatch_prepared`, as the steps a driver runs."""
    seg.runtime.crash("dispatch.before")
    started = seg.runtime.clock.monotonic_us()  # before the dispatch commit (F3)
    # transact: in a lane (L10), a voided hold that is not the slice's goes again
    # through the mission's gate, whole.
    attempt, units = seg.runtime.db.transact(
        lambda tx: _commit_dispatch(seg, tx, attempt_id, adapter, request), gate=seg.mission_id
    )
    if attempt.status is AttemptStatus.VOIDED:
        return attempt
    return (yield from sending(seg, attempt, adapter, started, units=units))


def _commit_dispatch(
    seg: Segment, tx: Tx, attempt_id: str, adapter: Adapter, request: Any
) -> admission.Admitted:
    """The dispatch commit of a PREPARED attempt; the units its contract
    budgets now, which its settlement counts as budgeted."""
    row = seg.own(tx)
    attempt = store.load(tx, attempt_id)
    if attempt.run_id != seg.run_id:
        raise StateError(f"attempt {attempt_id} belongs to run {attempt.run_id}, not {seg.run_id}")
    if request is not None:
        live = request_hash(attempt.adapter, attempt.operation, encode_request(request))
        if live != attempt.request_hash:
            raise StateError(
                f"the request given for attempt {attempt_id} is not the one recorded; "
                "nothing is sent",
                attempt_id=attempt_id,
            )
        attempt = changed(attempt, request=request)
    for hidden in secret.found(attempt.request):
        hidden.reveal()  # one that cannot be had here stops the send before it commits
    if attempt.adapter != adapter.name:
        raise StateError(
            f"attempt {attempt_id} is for adapter {attempt.adapter!r}, not {adapter.name!r}"
        )
    if attempt.status is not AttemptStatus.PREPARED or attempt.admitted_epoch != seg.epoch:
        raise StateError(
            f"attempt {attempt_id} is {attempt.status.value} (admitted in epoch "
            f"{attempt.admitted_epoch}); only a PREPARED attempt of this epoch "
            f"({seg.epoch}) can be dispatched",
            status=attempt.status.value,
        )
    status = RunStatus(row["status"])
    if status not in (RunStatus.ACTIVE, RunStatus.WAITING):
        raise StateError(f"run {seg.run_id} is {status.value}; nothing is dispatched")
    contract = seg.runtime.authority.contract(tx, seg.mission_id, row["contract_version"])
    units = frozenset(contract.allowance)
    require(
        tx,
        contract,
        seg.principal,
        Right.RUN,
        attempt.scope,
        mission_id=seg.mission_id,
        entity=attempt.id,
        why="any more: it was revoked after admission",
        kind="dispatch.refused",
    )
    if contract.approvals.requires(attempt.scope) and not _approved(seg, tx, contract, attempt):
        return admission.Admitted(
            changed(attempt, status=AttemptStatus.VOIDED, reason="approval denied"), units
        )
    deadline = seg.send_deadline(tx.now_us)
    # Not PREPARED any more: voided concurrently, it must never be sent.
    if not store.mark_dispatched(tx, attempt.id, epoch=seg.epoch, deadline_us=deadline):
        raise StateError(f"attempt {attempt.id} is no longer PREPARED; nothing is sent")
    attempt = changed(
        attempt,
        status=AttemptStatus.DISPATCHED,
        dispatched_epoch=seg.epoch,
        dispatched_at_us=tx.now_us,
        send_deadline_us=deadline,
    )
    admission.audit_dispatched(seg, tx, attempt)
    return admission.Admitted(attempt, units)


def _approved(seg: Segment, tx: Tx, contract: Contract, attempt: Attempt) -> bool:
    """W2 at the dispatch commit: a valid approval of this effect and request.
    A denial voids the attempt (``False``); a pending one waits, hold kept."""
    standing, approval_id = approvals.standing(
        tx,
        contract,
        mission_id=seg.mission_id,
        run_id=seg.run_id,
        effect=approvals.effect_id(
            seg.run_id, attempt.node_id, attempt.execution, attempt.effect_key
        ),
        scope=attempt.scope,
        request_hash=attempt.request_hash,
        estimate=attempt.estimate,
        actor=seg.principal,
        epoch=seg.epoch,
    )
    if standing is ApprovalStatus.DENIED:
        admission.void_denied(seg, tx, attempt)
        return False
    if standing is not ApprovalStatus.APPROVED:
        raise tx.refused(
            ApprovalRequired(
                f"attempt {attempt.id} ({attempt.scope}) waits for approval "
                f"{approval_id}; decide it with `charter approve {approval_id}`",
                approval_id=approval_id,
                attempt_id=attempt.id,
            ),
            mission_id=None,
            kind="",
            entity="",
            actor=seg.principal,
            keep_changes=True,
        )
    return True


def order(
    seg: Segment, attempt: Attempt, *, deadline_us: int, now_us: int, started_us: int
) -> Dispatch:
    """What the adapter is told. The deadline on this process's monotonic clock
    is the time the store left (``deadline_us - now_us``, both by the store's
    clock) counted from ``started_us``, taken before the dispatch commit was
    sent: a skewed wall clock cannot move it, and it can only err early (F3)."""
    return Dispatch(
        attempt_id=attempt.id,
        operation=attempt.operation,
        request=attempt.request,
        idempotency_key=attempt.idempotency_key,
        run_id=seg.run_id,
        epoch=seg.epoch,
        send_deadline_us=deadline_us,
        deadline_monotonic_us=started_us + (deadline_us - now_us),
        clock=seg.runtime.clock,
    )


def sending(
    seg: Segment,
    attempt: Attempt,
    adapter: Adapter,
    started_us: int,
    hidden: list[Secret] | None = None,
    *,
    units: frozenset[str],
    reports: list[Report] | None = None,
) -> Sending[Attempt]:
    """Send through the one send path, then settle. ``hidden``: the request's
    secrets, when the caller already knows them (otherwise it is searched);
    ``reports`` gets what the send reported."""
    if attempt.send_deadline_us is None or attempt.dispatched_at_us is None:
        raise StateError(f"attempt {attempt.id} has no dispatch commit; nothing is sent")
    seg.runtime.crash("dispatch.after")
    req = order(
        seg,
        attempt,
        deadline_us=attempt.send_deadline_us,
        now_us=attempt.dispatched_at_us,
        started_us=started_us,
    )
    if hidden is None:
        hidden = list(secret.found(attempt.request))
    report = yield Send(adapter, req, hidden, seg.runtime.config.answer_bytes)
    if reports is not None:
        reports.append(report)
    return settle_sent(seg, attempt, report, units=units)


def settle_sent(
    seg: Segment,
    attempt: Attempt,
    report: Report,
    *,
    units: frozenset[str],
    late_settles: LateSettles | None = None,
) -> Attempt:
    """Settle what the send of ``attempt`` (DISPATCHED by ``seg``) reported, in
    one transaction: the second half of :func:`sending`, also where a send made
    by a remote client is reported (X1), so both are settled by one code.
    ``late_settles``: whether a report that comes after the attempt left
    DISPATCHED may settle it (a client's report is evidence, X3); ``None``: the
    engine's own send's answer, which settles what nothing contradicts (F2)."""
    seg.runtime.crash("settlement.before")
    try:
        try:
            settled = seg.runtime.db.transact(
                lambda tx: _settle_live(seg, tx, attempt, report, units, late_settles=late_settles),
                gate=seg.mission_id,
            )
        except AmountOverflow as exc:  # a valid cost the ledger's sums cannot take (A9)
            settled = _unaddable(seg, attempt, report, exc)
    except Exception as exc:  # A4: an unrecordable settlement is an uncertainty
        raise unrecorded(attempt.id, report, exc) from exc
    seg.runtime.crash("settlement.after")
    return settled


def _unaddable(seg: Segment, attempt: Attempt, report: Report, exc: AmountOverflow) -> Attempt:
    """A report whose cost the ledger cannot add settles nothing (A9): the
    attempt is UNKNOWN with its hold, the report is kept as evidence and an
    incident asks a person (whose resolution must fit the ledger)."""
    with seg.runtime.db.transaction(gate=seg.mission_id) as tx:
        settlement.mark_unknown(
            tx,
            attempt,
            f"the reported cost cannot be added to the ledger ({exc.message})",
            actor=seg.principal,
            segment=seg.segment_id,
            epoch=seg.epoch,
        )
        record(tx, attempt, report.evidence, actor=seg.principal, epoch=seg.epoch, settled=False)
        outcome = report.evidence.outcome
        open_incident(
            tx,
            seg.mission_id,
            "amount_overflow",
            {
                "actual": None if outcome is None else dict(outcome.cost),
                "receipt": None if outcome is None else outcome.receipt,
                **exc.details,
            },
            actor=seg.principal,
            run_id=seg.run_id,
            attempt_id=attempt.id,
            epoch=seg.epoch,
        )
        return store.load(tx, attempt.id)


def _settle_live(
    seg: Segment,
    tx: Tx,
    attempt: Attempt,
    report: Report,
    units: frozenset[str],
    *,
    late_settles: LateSettles | None,
) -> Attempt:
    """Settle what the live send reported (it was DISPATCHED by this executor);
    ``units``: what its contract budgeted at its admission or dispatch commit."""
    evidence = report.evidence
    kw: dict[str, Any] = {
        "units": units,
        "actor": seg.principal,
        "segment": seg.segment_id,
        "epoch": seg.epoch,
    }
    heard: dict[str, Any] = {"actor": seg.principal, "epoch": seg.epoch}
    if not evidence.conclusive:
        marked = settlement.mark_unknown(
            tx,
            attempt,
            report.reason or "outcome unknown",
            actor=seg.principal,
            segment=seg.segment_id,
            epoch=seg.epoch,
        )
        # What an adapter knew, or all there is of an unholdable report (A9); kept
        # apart if a handover sealed the mission while the send was under way (S5).
        if report.keep and (marked or not late.keep_sealed(tx, attempt, evidence, **heard)):
            record(tx, attempt, evidence, actor=seg.principal, epoch=seg.epoch, settled=False)
        if marked:
            return changed(attempt, status=AttemptStatus.UNKNOWN, reason=report.reason)
        return store.load(tx, attempt.id)
    not_applied = evidence.verdict == "not_applied"
    reason = report.reason if not_applied else None
    if not settlement.settle_by_evidence(
        tx,
        attempt,
        evidence,
        reason=reason,
        from_statuses=(AttemptStatus.DISPATCHED,),
        answered=not report.unsent,
        **kw,
    ):
        current, source = store.load(tx, attempt.id), f"late settlement (epoch {seg.epoch})"
        may = late_settles is None or late_settles(current, evidence)
        if not late.keep_sealed(tx, current, evidence, source=source, **heard):
            late.record_late(tx, current, evidence, source=source, may_settle=may, **kw)
        return store.load(tx, attempt.id)
    if not_applied:  # the proof is kept as evidence (A3)
        record(tx, attempt, evidence, actor=seg.principal, epoch=seg.epoch, settled=True)
    o = evidence.outcome
    return changed(
        attempt,
        status=AttemptStatus.FAILED if o is None else AttemptStatus(o.status),
        actual={} if o is None else dict(o.cost),
        result=None if o is None else o.result,
        receipt=None if o is None else o.receipt,
        price_source=(o.price_source if o is not None else None) or attempt.price_source,
        reason=reason if reason is not None else attempt.reason,
        settled_at_us=tx.now_us,
        answered=not report.unsent,
    )


def replay(seg: Segment, attempt: Attempt, adapter: Adapter) -> Evidence | None:
    """A8: send an uncertain ``idempotent_keyed`` attempt again, with its own key.

    A replay is a send: it goes through the one send path after a commit
    that checks, under the mission's gate, this executor's epoch and lease,
    that the attempt is *still* unresolved (UNKNOWN, or DISPATCHED by an
    earlier epoch), that the run may send (active, waiting or needing
    intervention; not paused, stopping or ended), the principal's authority,
    and the target's dedupe window. Returns the replay's evidence, or
    ``None`` when no replay was sent (a person decides then).
    """
    op = adapter.operations.get(attempt.operation)
    if op is None or op.effect is not EffectClass.IDEMPOTENT_KEYED:
        return None
    window_us = seconds_us(op.dedupe_window_seconds or 0)
    started = seg.runtime.clock.monotonic_us()
    try:
        with seg.runtime.db.transaction(gate=seg.mission_id) as tx:
            sendable = _commit_replay(seg, tx, attempt.id, window_us)
    except Fenced:
        return None  # an executor that no longer owns the run sends nothing (R7)
    if sendable is None:
        return None
    attempt, deadline, now = sendable
    hidden = list(secret.found(attempt.request))
    req = order(seg, attempt, deadline_us=deadline, now_us=now, started_us=started)
    report = send(adapter, req, hidden, seg.runtime.config.answer_bytes)
    found = report.evidence
    if found.verdict == "applied":
        return Evidence("applied", found.outcome, {"replay": True}, source=store.REPLAY_SOURCE)
    # Refused before sending, lost, or unrecordable: it proves nothing about the first send.
    detail = {"replay": True, "replay_reason": report.reason, "report": found.detail}
    return Evidence("indeterminate", None, detail, source=store.REPLAY_SOURCE)


def _commit_replay(
    seg: Segment, tx: Tx, attempt_id: str, window_us: int
) -> tuple[Attempt, int, int] | None:
    """The replay's dispatch commit (A2 + "still unresolved"); ``None``: no send."""
    row = seg.own(tx)
    attempt = store.load(tx, attempt_id)
    if attempt.run_id != seg.run_id or secret.missing(attempt.request):
        return None  # a secret this process cannot have (S3): a person decides
    unresolved = attempt.status is AttemptStatus.UNKNOWN or (
        attempt.status is AttemptStatus.DISPATCHED and attempt.dispatched_epoch != seg.epoch
    )
    if not unresolved or RunStatus(row["status"]) not in _REPLAYABLE:
        return None
    contract = seg.runtime.authority.contract(tx, seg.mission_id, row["contract_version"])
    if not contract.allows(seg.principal, Right.RUN, attempt.scope):
        return None
    sent_at = attempt.dispatched_at_us or attempt.prepared_at_us
    if tx.now_us - sent_at > window_us:
        return None
    deadline = seg.send_deadline(tx.now_us)
    tx.audit(
        attempt.mission_id,
        "attempt.replayed",
        attempt.id,
        actor=seg.principal,
        segment=seg.segment_id,
        epoch=seg.epoch,
        payload={"idempotency_key": attempt.idempotency_key, "send_deadline_us": deadline},
    )
    return attempt, deadline, tx.now_us
