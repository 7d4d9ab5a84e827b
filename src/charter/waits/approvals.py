"""Approvals (W2): a decision by an authorised principal on one effect.

An approval is bound to one effect — its stable effect ID (run, node, node
execution, effect key) — *and* its request hash: a changed request needs a new
approval. Validity is checked at the dispatch commit, including the approver's
authority under the current contract. An expired or no-longer-authorised
approval makes the engine open a new request for the same effect; the attempt
stays PREPARED with its hold. A denial voids the attempt.
"""

from __future__ import annotations

from collections.abc import Mapping

from charter.contracts.contract import Contract
from charter.contracts.principals import Right
from charter.errors import NotFound, StateError
from charter.storage import Tx
from charter.storage.paging import Position
from charter.waits import store
from charter.waits.model import Approval, ApprovalStatus, effect_id

__all__ = [
    "Approval",
    "ApprovalStatus",
    "decide",
    "effect_id",
    "latest",
    "list_approvals",
    "load",
    "renew_expired",
    "request",
    "standing",
    "withdraw",
]


def load(tx: Tx, approval_id: str) -> Approval:
    found = store.approval(tx, approval_id)
    if found is None:
        raise NotFound(f"no approval {approval_id!r} in this store", approval_id=approval_id)
    return found


def latest(tx: Tx, effect: str, request_hash: str) -> Approval | None:
    """The effect's standing approval: pending, approved or denied.

    Expired and superseded approvals are retired before a new request is
    opened, so at most one approval per effect and request is ever standing;
    the query does not depend on timestamps (two may share a microsecond).
    """
    return store.standing(tx, effect, request_hash)


def list_approvals(
    tx: Tx,
    *,
    run_id: str | None = None,
    pending: bool = False,
    limit: int | None = None,
    after: Position | None = None,
) -> list[Approval]:
    return store.approvals(tx, run_id=run_id, pending=pending, limit=limit, after=after)


def request(
    tx: Tx,
    *,
    mission_id: str,
    run_id: str,
    effect: str,
    scope: str,
    request_hash: str,
    actor: str,
    epoch: int | None,
) -> str:
    approval_id = tx.ids.new("apr")
    store.insert(
        tx,
        approval_id,
        mission_id=mission_id,
        run_id=run_id,
        effect=effect,
        scope=scope,
        request_hash=request_hash,
    )
    tx.audit(
        mission_id,
        "approval.requested",
        approval_id,
        actor=actor,
        epoch=epoch,
        after="pending",
        payload={"effect_id": effect, "scope": scope, "request_hash": request_hash},
    )
    return approval_id


def _retire(tx: Tx, a: Approval, status: ApprovalStatus, actor: str) -> None:
    store.set_status(tx, a.id, status)
    tx.audit(
        a.mission_id,
        "approval." + status.value,
        a.id,
        actor=actor,
        before=a.status.value,
        after=status.value,
    )


def standing(
    tx: Tx,
    contract: Contract,
    *,
    mission_id: str,
    run_id: str,
    effect: str,
    scope: str,
    request_hash: str,
    estimate: Mapping[str, int],
    actor: str,
    epoch: int | None,
) -> tuple[ApprovalStatus, str]:
    """Whether the effect may be dispatched now; opens a new request if needed.
    The one check of an approval's validity (W2), at admission and at the
    dispatch commit alike: unexpired, its approver still holding ``approve``
    on the scope, and (four eyes, P3) not given by ``actor``, whose run
    requested the effect, when the contract asks for four eyes on it now.

    Returns ``(APPROVED, id)`` when a valid approval exists, ``(DENIED, id)``
    when it was denied, and ``(PENDING, id)`` otherwise — after retiring an
    expired or superseded approval and requesting a new decision.
    """
    a = latest(tx, effect, request_hash)
    if a is not None and a.status is ApprovalStatus.APPROVED:
        # A decision without a decider or an expiry is no approval (checked, not
        # asserted: ``python -O`` must not change what may be sent).
        if a.decided_by is None or a.expires_at_us is None or a.expires_at_us <= tx.now_us:
            _retire(tx, a, ApprovalStatus.EXPIRED, actor)
        elif not contract.allows(a.decided_by, Right.APPROVE, scope) or (
            a.decided_by == actor and contract.four_eyes(estimate)
        ):
            _retire(tx, a, ApprovalStatus.SUPERSEDED, actor)
        else:
            return ApprovalStatus.APPROVED, a.id
    elif a is not None and a.status in (ApprovalStatus.PENDING, ApprovalStatus.DENIED):
        return a.status, a.id
    new_id = request(
        tx,
        mission_id=mission_id,
        run_id=run_id,
        effect=effect,
        scope=scope,
        request_hash=request_hash,
        actor=actor,
        epoch=epoch,
    )
    return ApprovalStatus.PENDING, new_id


def renew_expired(
    tx: Tx, run_id: str, *, actor: str, epoch: int | None, ask_again: bool = True
) -> list[str]:
    """Retire the run's expired approvals; ask again for effects still to be sent (W2).

    Returns the IDs of the expired approvals whose effect still waits to be sent.

    An approval whose effect was already dispatched has done its work and is
    simply retired. For an effect not yet sent, a new request is opened: the
    expired decision never authorises a dispatch, and the run is not stuck.
    A run that is stopping or ended (``ask_again=False``) sends nothing more,
    so nobody is asked again.
    """
    retired: list[str] = []
    for a in list_approvals(tx, run_id=run_id):
        if a.status is not ApprovalStatus.APPROVED or a.expires_at_us is None:
            continue
        if a.expires_at_us > tx.now_us:
            continue
        _retire(tx, a, ApprovalStatus.EXPIRED, actor)
        if ask_again and not store.effect_sent(tx, a.effect_id, a.request_hash):
            retired.append(a.id)
            request(
                tx,
                mission_id=a.mission_id,
                run_id=a.run_id,
                effect=a.effect_id,
                scope=a.scope,
                request_hash=a.request_hash,
                actor=actor,
                epoch=epoch,
            )
    return retired


def decide(
    tx: Tx, approval: Approval, *, by: str, approve: bool, ttl_seconds: int
) -> ApprovalStatus:
    if approval.status is not ApprovalStatus.PENDING:
        raise StateError(
            f"approval {approval.id} is {approval.status.value}, not pending; only a pending "
            "request can be decided",
            approval_id=approval.id,
        )
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    expires = tx.now_us + ttl_seconds * 1_000_000 if approve else None
    if not store.decide(
        tx, approval.id, status, by=by, expires_at_us=expires
    ):  # another approver decided it meanwhile
        raise StateError(
            f"approval {approval.id} was decided by someone else meanwhile",
            approval_id=approval.id,
        )
    tx.audit(
        approval.mission_id,
        "approval.decided",
        approval.id,
        actor=by,
        before="pending",
        after=status.value,
        payload={"effect_id": approval.effect_id, "expires_at_us": expires},
    )
    return status


def withdraw(tx: Tx, run_id: str, *, actor: str) -> list[str]:
    """Withdraw the run's pending requests: a run that will never admit again
    leaves nothing in the approvers' queue (N5). Returns their IDs."""
    pending = list_approvals(tx, run_id=run_id, pending=True)
    for a in pending:
        _retire(tx, a, ApprovalStatus.WITHDRAWN, actor)
    return [a.id for a in pending]
