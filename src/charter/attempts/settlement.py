"""Transitions that end or suspend an attempt's hold: settle, void, mark unknown.

Each function runs inside the caller's transaction and writes the attempt row
(through :mod:`charter.attempts.store`), its ledger entries and its audit event
together. Every one is conditional on the attempt's current status (``WHERE
status IN ...``), so a hold is resolved exactly once (L6) even when two
processes race: the loser changes nothing and is told so by the return value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from charter import ledger
from charter.adapters import Adapter, Evidence
from charter.amounts import is_amount
from charter.attempts import store
from charter.attempts.model import Attempt, AttemptStatus
from charter.contracts import store as contracts_store
from charter.contracts.contract import Contract
from charter.errors import CharterError, SliceUnavailable, StateError, UsageError
from charter.hashing import by_reference, dumped
from charter.ledger.escrow import slices as escrow
from charter.ledger.incidents import open_incident
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import RunStatus
from charter.storage import Prefetched, Tx

#: Settled attempts a run leaves out of its row's counts before they are added
#: there (:func:`tally`): a settlement writes no run row, and a run's counts
#: are its row's plus at most this many more, found through the index that
#: finds its unresolved attempts (``attempts_untallied``, schema 25).
TALLY_EVERY = 32


def tally_due(run: Prefetched) -> bool:
    """Whether a settlement, given the run's status read before it
    (:func:`_run_status`), brings the run's untallied settled attempts to
    :data:`TALLY_EVERY`."""
    row = run.row
    return row is not None and row["untallied"] + 1 >= TALLY_EVERY


def tally(tx: Tx, run_id: str) -> None:
    """Add the run's settled attempts not yet counted to its row's counts (R5),
    and mark them counted, in this transaction: a crash keeps both or neither,
    so the counts are never short nor counted twice, and two tallies at once
    each add only the attempts they marked."""
    run_store.add_tally(tx, run_id, store.mark_tallied(tx, run_id))


def _count(tx: Tx, status: AttemptStatus, attempt: Attempt, run: Prefetched) -> None:
    """The mission's failures (a stop condition, A1); and the run's settled
    counts, when this settlement brings its attempts not tallied yet to a sweep's
    worth (R5: the counts read are the run's row's plus those)."""
    if tally_due(run):
        tally(tx, attempt.run_id)
    if status is AttemptStatus.FAILED:
        contracts_store.count_failed(tx, attempt.mission_id)


def _run_status(tx: Tx, attempt: Attempt) -> Prefetched:
    """The run's status, read under the gate and sent with the decisive update
    (no round trip of its own): settling the last attempt of a stopping run ends it."""
    return run_store.status_ahead(tx, attempt.mission_id, attempt.run_id)


def _in_lane(tx: Tx, attempt: Attempt) -> None:
    """In a lane (L10) only a hold taken from its slice is resolved there: another
    is the mission's, resolved through the mission's gate instead."""
    lane = tx.lane(attempt.mission_id)
    if lane is not None and attempt.id not in lane.members:
        raise SliceUnavailable(
            f"attempt {attempt.id}'s hold is not in escrow slice {lane.chain}; it is "
            "resolved through its mission's gate",
            slice_id=lane.chain,
            why="not its hold",
        )


def _outside_lane(tx: Tx, attempt: Attempt, run: Prefetched, actor: str) -> None:
    """Through the mission's gate, while the mission has lent slices (L10): a hold
    taken from a slice still open is made the mission's first (the slice is
    returned), so it is resolved exactly once, in the books that hold it (L6)."""
    row = run.row
    if tx.lane(attempt.mission_id) is None and row is not None and row["slices"]:
        escrow.outside(tx, attempt.id, actor=actor)


def _conclude(
    tx: Tx, attempt: Attempt, run: Prefetched, *, actor: str, segment: str | None
) -> None:
    """The attempt left the run's in-flight set: a stopping run may now be stopped (N5)."""
    row = run.row
    if row is not None and row["status"] == RunStatus.STOPPING.value:
        conclude_stop(tx, attempt.run_id, actor=actor, segment=segment)


def settle(
    tx: Tx,
    attempt: Attempt,
    status: AttemptStatus,
    *,
    actual: Mapping[str, int],
    result: Any,
    receipt: Any,
    price_source: str | None,
    reason: str | None,
    units: Collection[str],
    actor: str,
    segment: str | None,
    epoch: int | None,
    from_statuses: tuple[AttemptStatus, ...],
    answered: bool = False,
) -> bool:
    """Settle ``attempt`` if it is still in one of ``from_statuses``; else change
    nothing and return ``False``. Spends up to the hold and releases the rest;
    a cost above the hold or in an unbudgeted unit opens an incident (L5).
    ``answered``: the send's own answer settles it, so its sender saw the outcome.
    """
    if not status.settled:
        raise StateError(f"{status.value} is not a settlement")
    tx.lock_mission(attempt.mission_id)
    _in_lane(tx, attempt)
    price_source = price_source or attempt.price_source  # L8: entries always name a source
    run = _run_status(tx, attempt)
    result_json, receipt_json = dumped(result), dumped(receipt)
    if not store.settle(
        tx,
        attempt.id,
        status,
        actual=actual,
        result_json=result_json,
        receipt_json=receipt_json,
        price_source=price_source,
        reason=reason,
        answered=answered,
        from_statuses=from_statuses,
    ):
        return False
    _outside_lane(tx, attempt, run, actor)
    budgeted = {u: a for u, a in actual.items() if u in units}
    entries = ledger.record(
        tx, attempt.mission_id, attempt.id, ledger.settle(attempt.estimate, budgeted), price_source
    )
    _incidents(
        tx,
        attempt,
        actual,
        units,
        receipt=receipt,
        price_source=price_source,
        actor=actor,
        epoch=epoch,
    )
    _count(tx, status, attempt, run)
    tx.audit(
        attempt.mission_id,
        "attempt.settled",
        attempt.id,
        actor=actor,
        segment=segment,
        epoch=epoch,
        before=",".join(s.value for s in from_statuses),
        after=status.value,
        payload={
            "actual": dict(actual),
            "result": by_reference(result, result_json),
            "receipt": by_reference(receipt, receipt_json),
            "price_source": price_source,
            "reason": reason,
            **entries,
        },
    )
    _conclude(tx, attempt, run, actor=actor, segment=segment)
    return True


def _incidents(
    tx: Tx,
    attempt: Attempt,
    actual: Mapping[str, int],
    units: Collection[str],
    *,
    receipt: Any,
    price_source: str | None,
    actor: str,
    epoch: int | None,
) -> None:
    """L5: a cost above the hold is recorded in full and opens an ``overrun``
    incident with the raw receipt; a cost in a unit the contract does not budget
    opens an ``unbudgeted_cost`` one. Nothing is edited to make them fit."""
    budgeted = {u: a for u, a in actual.items() if u in units}
    overruns = {
        u: {"hold": attempt.estimate.get(u, 0), "actual": a}
        for u, a in budgeted.items()
        if a > attempt.estimate.get(u, 0)
    }
    found = []
    if overruns:
        found.append(
            ("overrun", {"units": overruns, "receipt": receipt, "price_source": price_source})
        )
    unbudgeted = {u: a for u, a in actual.items() if u not in units and a}
    if unbudgeted:
        found.append(("unbudgeted_cost", {"actual": unbudgeted, "receipt": receipt}))
    for kind, details in found:
        open_incident(
            tx,
            attempt.mission_id,
            kind,
            details,
            actor=actor,
            run_id=attempt.run_id,
            attempt_id=attempt.id,
            epoch=epoch,
        )


#: A person's resolution at more than this many times an attempt's hold, in any
#: unit, needs confirming (R8): a typo (2^62 on a hold of 500) is caught before
#: it is recorded as an overrun; a unit it holds nothing in has a hold of 0.
FAR_ABOVE_HOLD = 10


def person_cost(cost: object) -> dict[str, int]:
    """A cost a person reports (R8) checked as their input: unit names mapped to
    amounts (A9). Anything else is a :class:`UsageError`, before anything is read."""
    if cost is None:
        return {}
    if not isinstance(cost, Mapping):
        raise UsageError(f"cost must map unit names to amounts, got {cost!r}", field="cost")
    for unit, amount in cost.items():
        if not isinstance(unit, str) or not unit:
            raise UsageError(f"cost names a unit as {unit!r}; use the unit's name", field="cost")
        if not is_amount(amount):
            raise UsageError(
                f"cost.{unit} must be a whole number in [0, 2^63 - 1], in the unit's smallest "
                f"step (floats never touch the ledger), got {amount!r}",
                field=f"cost.{unit}",
                value=repr(amount),
            )
    return dict(cost)


def person_result(adapter: Adapter | None, attempt: Attempt, outcome: str, result: Any) -> Any:
    """A person's ``result`` (R8) as the attempt's adapter will read it back (N6).

    An adapter whose results have a form of their own (an agent integration
    records a tool call as its framework does) may declare
    ``resolved_result(operation, outcome, result)``: it puts a plain value in
    that form, or raises :class:`UsageError` for one its reader could not
    decode, before anything is written. The engine never knows the form.
    Without the adapter the result is recorded as given."""
    if adapter is None or result is None:
        return result
    if adapter.name != attempt.adapter:
        raise UsageError(
            f"attempt {attempt.id} belongs to adapter {attempt.adapter!r}, not {adapter.name!r}",
            field="adapter",
        )
    form = getattr(adapter, "resolved_result", None)
    if form is None:
        return result
    try:
        return form(attempt.operation, outcome, result)
    except CharterError:
        raise
    except Exception as exc:
        raise UsageError(
            f"adapter {adapter.name!r} cannot read the result given for attempt {attempt.id} "
            f"({type(exc).__name__}: {exc}); give it in the form the adapter records",
            field="result",
        ) from exc


def refuse_far_above_hold(attempt: Attempt, actual: Mapping[str, int]) -> None:
    """Refuse (a :class:`UsageError`) a person's cost more than
    :data:`FAR_ABOVE_HOLD` times the attempt's hold in some unit, unless confirmed."""
    far = {
        u: {"hold": attempt.estimate.get(u, 0), "cost": a}
        for u, a in actual.items()
        if a > FAR_ABOVE_HOLD * attempt.estimate.get(u, 0)
    }
    if far:
        shown = ", ".join(f"{u} {v['cost']} on a hold of {v['hold']}" for u, v in far.items())
        raise UsageError(
            f"the cost is more than {FAR_ABOVE_HOLD} times attempt {attempt.id}'s hold ({shown}); "
            "if that much was spent, resolve again with confirm_above_hold=True (CLI: "
            "--confirm-above-hold): it is recorded in full and opens an overrun incident (L5)",
            attempt_id=attempt.id,
            above_hold=far,
            confirm="confirm_above_hold",
        )


def settle_by_evidence(
    tx: Tx,
    attempt: Attempt,
    evidence: Evidence,
    *,
    reason: str | None,
    units: Collection[str],
    actor: str,
    segment: str | None,
    epoch: int | None,
    from_statuses: tuple[AttemptStatus, ...],
    answered: bool = False,
) -> bool:
    """Settle on conclusive evidence: as its outcome says, or FAILED at no cost when
    it proves non-application. Indeterminate evidence settles nothing."""
    kw: dict[str, Any] = {
        "reason": reason,
        "units": units,
        "actor": actor,
        "segment": segment,
        "epoch": epoch,
        "from_statuses": from_statuses,
        "answered": answered,
    }
    o = evidence.outcome
    if evidence.verdict == "applied" and o is not None:
        return settle(
            tx,
            attempt,
            AttemptStatus(o.status),
            actual=o.cost,
            result=o.result,
            receipt=o.receipt,
            price_source=o.price_source,
            **kw,
        )
    if evidence.verdict == "not_applied":
        return settle(
            tx,
            attempt,
            AttemptStatus.FAILED,
            actual={},
            result=None,
            receipt=None,
            price_source=None,
            **kw,
        )
    return False


def void(
    tx: Tx,
    attempt: Attempt,
    reason: str,
    *,
    actor: str,
    segment: str | None,
    epoch: int | None,
) -> bool:
    """VOIDED releases exactly its hold, and only if never DISPATCHED (L6)."""
    tx.lock_mission(attempt.mission_id)
    _in_lane(tx, attempt)
    run = _run_status(tx, attempt)
    if not store.void(tx, attempt.id, reason):
        return False
    _outside_lane(tx, attempt, run, actor)
    entries = ledger.record(
        tx, attempt.mission_id, attempt.id, ledger.release(attempt.estimate), attempt.price_source
    )
    _count(tx, AttemptStatus.VOIDED, attempt, run)
    tx.audit(
        attempt.mission_id,
        "attempt.voided",
        attempt.id,
        actor=actor,
        segment=segment,
        epoch=epoch,
        before="prepared",
        after="voided",
        payload={"reason": reason, **entries},
    )
    _conclude(tx, attempt, run, actor=actor, segment=segment)
    return True


def void_prepared(
    tx: Tx, run_id: str, reason: str, *, actor: str, segment: str | None, epoch: int | None
) -> list[str]:
    """Void every PREPARED attempt of a run that is stopping: never sent, so
    nothing to wait for; each releases exactly its hold (L6). Returns their IDs."""
    voided = []
    for a in store.list_attempts(tx, run_id=run_id, unresolved=True):
        if a.status is AttemptStatus.PREPARED and void(
            tx, a, reason, actor=actor, segment=segment, epoch=epoch
        ):
            voided.append(a.id)
    return voided


def mark_unknown(
    tx: Tx,
    attempt: Attempt,
    reason: str,
    *,
    actor: str,
    segment: str | None,
    epoch: int | None,
) -> bool:
    """DISPATCHED -> UNKNOWN, keeping 100% of the hold (A3, L4)."""
    tx.lock_mission(attempt.mission_id)
    changed = store.mark_unknown(tx, attempt.id, reason)
    if changed:
        tx.audit(
            attempt.mission_id,
            "attempt.unknown",
            attempt.id,
            actor=actor,
            segment=segment,
            epoch=epoch,
            before="dispatched",
            after="unknown",
            payload={"reason": reason},
        )
    return changed


#: Who writes off a read-only UNKNOWN under the contract's opt-in (A7).
READ_ONLY_POLICY = "engine:read_only_policy"


def write_off_read_only(
    tx: Tx, attempt: Attempt, contract: Contract, *, why: str, segment: str | None, epoch: int
) -> bool:
    """A7's opt-in, wherever an attempt becomes UNKNOWN: a ``read_only`` one is
    settled WRITTEN_OFF at its full hold (L9) when the contract says
    ``read_only_unknown = "write_off"``, so that the effect may be asked again
    as a new attempt. Changes nothing and says ``False`` otherwise."""
    if attempt.effect_class != "read_only" or contract.read_only_unknown != "write_off":
        return False
    return settle(
        tx,
        attempt,
        AttemptStatus.WRITTEN_OFF,
        actual=attempt.estimate,
        result=None,
        receipt=None,
        price_source=attempt.price_source,
        reason=f"read_only UNKNOWN ({why}) written off at its full hold (contract opt-in)",
        units=contract.allowance.keys(),
        actor=READ_ONLY_POLICY,
        segment=segment,
        epoch=epoch,
        from_statuses=(AttemptStatus.UNKNOWN,),
    )


def conclude_stop(tx: Tx, run_id: str, *, actor: str, segment: str | None = None) -> bool:
    """A STOPPING run with nothing left in flight becomes STOPPED (N5).

    Stopping means no new admissions while what was sent settles; once the
    last attempt of the run is settled, resolved or voided there is nothing
    left to wait for, so whoever settled it ends the run, with the reason it
    was stopped for. Returns whether the run was ended.
    """
    run = runs.load(tx, run_id)
    if run.status is not RunStatus.STOPPING:
        return False
    if store.count_unresolved(tx, run_id):
        return False
    runs.set_status(tx, run, RunStatus.STOPPED, run.status_reason, actor=actor, segment=segment)
    tally(tx, run_id)
    return True
