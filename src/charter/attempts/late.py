"""What a send reports after its attempt left DISPATCHED: late evidence (F2, X3, S5).

The attempt was recovered by another owner, settled by a person, written off,
or its mission handed over to another store while the send was under way.
What the send reports is kept as evidence with its epoch, whatever it says:
it settles an UNKNOWN attempt only where nothing contradicts it and the
caller lets it (a remote client's report only as the contract lets evidence
settle, :func:`late_report_settles`), and a contradiction of a recorded
settlement opens an incident, except a refusal of an older epoch's request
against a success a same-key replay brought (F3). Nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, cast

from charter.adapters import Evidence
from charter.attempts import store
from charter.attempts.evidence import record
from charter.attempts.model import Attempt, AttemptStatus
from charter.attempts.settlement import settle_by_evidence
from charter.audit import store as audit_store
from charter.hashing import ENGINE_CHAIN
from charter.ledger.incidents import open_incident
from charter.storage import Tx

#: Whether a report that came after its attempt left DISPATCHED may settle the
#: attempt as it stands now (:func:`record_late`'s ``may_settle``).
LateSettles = Callable[[Attempt, Evidence], bool]


def settles_by_itself(evidence: Evidence) -> bool:
    """Whether evidence is what ``evidence_settles = "auto"`` lets settle an
    attempt without a person (R7): a proof of non-application, or an outcome
    applied with a receipt."""
    if evidence.verdict == "not_applied":
        return True
    o = evidence.outcome
    return evidence.verdict == "applied" and o is not None and o.receipt is not None


def late_report_settles(mode: str, current: Attempt, evidence: Evidence) -> bool:
    """Whether a remote client's late report settles ``current`` by itself (X3,
    R7): it is evidence from a fenced segment, so it settles only as a lookup's
    would under ``evidence_settles = mode`` (:func:`settles_by_itself`), and
    never at a cost its hold did not cover, which waits for a person."""
    o = evidence.outcome
    within = o is None or all(a <= current.estimate.get(u, 0) for u, a in o.cost.items())
    return mode == "auto" and settles_by_itself(evidence) and within


def record_late(
    tx: Tx,
    current: Attempt,
    evidence: Evidence,
    *,
    units: Collection[str],
    actor: str,
    segment: str | None,
    epoch: int | None,
    source: str,
    may_settle: bool,
) -> None:
    """What a send reported after its attempt left DISPATCHED (F2, A8, L5).

    The attempt was recovered by another owner, settled by a person or written
    off while the send was under way. The report is kept as evidence, with its
    epoch, whatever it says. It settles an UNKNOWN attempt (when ``may_settle``)
    if no evidence on record contradicts it; it opens an incident when it
    contradicts a recorded settlement, or reports a cost above the hold of an
    attempt that was written off at that hold. An open incident pauses the
    mission's admissions until a person closes it (L7). Nothing is lost.
    """
    settled = False
    if current.status is AttemptStatus.UNKNOWN:
        if _disputed(tx, current, evidence):
            _incident(tx, current, evidence, actor, epoch, recorded="unconfirmed evidence")
        elif may_settle:
            settled = settle_by_evidence(
                tx,
                current,
                evidence,
                reason=f"late {evidence.verdict} evidence ({source})",
                units=units,
                actor=actor,
                segment=segment,
                epoch=epoch,
                from_statuses=(AttemptStatus.UNKNOWN,),
            )
    elif current.status.settled and (
        _conflicts(tx, current, evidence, epoch) or _above_hold(current, evidence)
    ):
        _incident(tx, current, evidence, actor, epoch, recorded=current.status.value)
    record(
        tx,
        current,
        Evidence(evidence.verdict, evidence.outcome, evidence.detail, source=source),
        actor=actor,
        epoch=epoch,
        settled=settled,
    )


def keep_sealed(
    tx: Tx,
    current: Attempt,
    evidence: Evidence,
    *,
    actor: str,
    epoch: int | None,
    source: str | None = None,
) -> bool:
    """What a send in flight reported for a mission sealed here since (S5, F2).

    A handover fenced and sealed the mission while the send was under way. Its
    report is kept as evidence with its epoch, as after any takeover, and
    nothing else changes: the mission is the other store's to settle now (a
    person brings this evidence there). The sealed chain takes no event, so
    the evidence's event goes on the engine's chain, naming the mission, as a
    refusal about a sealed mission does. Returns whether the mission is sealed
    (and the report was kept so); ``False`` changes nothing.
    """
    if audit_store.sealed(tx, current.mission_id) is None:
        return False
    if source is not None:
        evidence = Evidence(evidence.verdict, evidence.outcome, evidence.detail, source=source)
    record(
        cast("Tx", _OnEngineChain(tx)), current, evidence, actor=actor, epoch=epoch, settled=False
    )
    return True


class _OnEngineChain:
    """``tx`` with its audit events moved to the engine's chain, each naming the
    mission it is about: so the one writer of evidence records for a mission
    whose own chain is sealed."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def audit(self, mission_id: str, kind: str, entity: str, **how: Any) -> None:
        payload = {"mission_id": mission_id, **(how.pop("payload", None) or {})}
        self._tx.audit(ENGINE_CHAIN, kind, entity, payload=payload, **how)


def _incident(
    tx: Tx, current: Attempt, evidence: Evidence, actor: str, epoch: int | None, *, recorded: str
) -> None:
    outcome = evidence.outcome
    open_incident(
        tx,
        current.mission_id,
        "conflicting_evidence",
        {
            "recorded": recorded,
            "hold": current.estimate,
            "late_verdict": evidence.verdict,
            "late_outcome": None if outcome is None else outcome.status,
            "late_cost": None if outcome is None else dict(outcome.cost),
            "from_epoch": epoch,
        },
        actor=actor,
        run_id=current.run_id,
        attempt_id=current.id,
        epoch=epoch,
    )


def _disputed(tx: Tx, current: Attempt, found: Evidence) -> bool:
    """Whether conclusive evidence on record contradicts ``found``."""
    mine = None if found.outcome is None else found.outcome.status
    for recorded in store.conclusive(tx, current.id):
        theirs = None if recorded.outcome is None else recorded.outcome.status
        if recorded.verdict != found.verdict or theirs != mine:
            return True
    return False


def _conflicts(tx: Tx, recorded: Attempt, evidence: Evidence, epoch: int | None) -> bool:
    """Whether conclusive evidence contradicts a recorded settlement.

    A refusal of the send made at ``epoch`` proves only that *that* request was
    not applied: against a success a later owner's same-key replay brought
    (A8) it is no contradiction (a stale fencing token refused, F3)."""
    o = evidence.outcome
    if evidence.verdict == "not_applied":
        resent = epoch is not None and store.replay_applied(tx, recorded.id)
        return recorded.status is AttemptStatus.SUCCEEDED and not resent
    if o is None or recorded.status is AttemptStatus.WRITTEN_OFF:
        return False  # indeterminate; or a write-off, which claims no outcome
    return o.status != recorded.status.value or dict(o.cost) != (recorded.actual or {})


def _above_hold(recorded: Attempt, evidence: Evidence) -> bool:
    """A cost reported above the hold of an attempt settled at its hold (L5)."""
    o = evidence.outcome
    if o is None or recorded.status is not AttemptStatus.WRITTEN_OFF:
        return False
    return any(a > recorded.estimate.get(u, 0) for u, a in o.cost.items())
