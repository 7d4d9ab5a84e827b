"""Runs: one execution of a mission's plan, with an owner, an epoch and a lease (F1).

Every change of owner increments the epoch, the fencing token checked by every
dispatch commit and node completion (F2). Terminal runs are never reopened (N4).
The records are in :mod:`~charter.runs.model`, the statements in
:mod:`~charter.runs.store`.
"""

from __future__ import annotations

from charter.clock import seconds_us
from charter.errors import NotFound, RunTerminal, StateError
from charter.runs import store
from charter.runs.liveness import process_json
from charter.runs.model import Run, RunStatus
from charter.storage import Tx
from charter.waits import approvals

__all__ = ["Run", "RunStatus", "change_status", "insert", "load", "set_status"]


def load(tx: Tx, run_id: str) -> Run:
    found = store.run(tx, run_id)
    if found is None:
        raise NotFound(
            f"no run {run_id!r} in this store; list runs with `charter runs`", run_id=run_id
        )
    return found


def set_status(
    tx: Tx,
    run: Run,
    status: RunStatus,
    reason: str | None,
    *,
    actor: str,
    segment: str | None = None,
) -> None:
    """Change a run's status, audited (no-op if nothing changes)."""
    if run.status == status and run.status_reason == reason:
        return
    change_status(
        tx,
        run_id=run.id,
        mission_id=run.mission_id,
        epoch=run.epoch,
        before=run.status,
        after=status,
        reason=reason,
        actor=actor,
        segment=segment,
    )


def change_status(
    tx: Tx,
    *,
    run_id: str,
    mission_id: str,
    epoch: int,
    before: RunStatus,
    after: RunStatus,
    reason: str | None,
    actor: str,
    segment: str | None,
) -> None:
    """The one place a run's status changes: audited, and a terminal run never
    changes again (N4). Conditional on the status read, so a concurrent change
    is refused rather than overwritten."""
    if before.terminal:
        raise RunTerminal(
            f"run {run_id} is {before.value}; a terminal run is never reopened — start a "
            "reviewed new linked run",
            run_id=run_id,
        )
    if not store.change_status(tx, run_id, before, after, reason):
        raise StateError(f"run {run_id} changed status meanwhile; read it again", run_id=run_id)
    tx.audit(
        mission_id,
        "run.status",
        run_id,
        actor=actor,
        segment=segment,
        epoch=epoch,
        before=before.value,
        after=after.value,
        payload={"reason": reason},
    )
    if after.ending:
        approvals.withdraw(tx, run_id, actor=actor)


def insert(
    tx: Tx,
    *,
    lease_seconds: float,
    mission_id: str,
    principal: str,
    segment_id: str,
    plan: str | None,
    input_json: str | None,
    linked_from: str | None,
) -> tuple[str, int, str]:
    """A new active run owned by its first segment (epoch 1), held by the
    executor about to be returned; its ID, lease end and that executor's claim."""
    run_id = tx.ids.new("run")
    claim = tx.ids.new("clm")
    expires = tx.now_us + seconds_us(lease_seconds)
    store.insert(
        tx,
        run_id,
        mission_id=mission_id,
        principal=principal,
        segment_id=segment_id,
        claim=claim,
        process=process_json(),
        lease_expires_us=expires,
        plan=plan,
        input_json=input_json,
        linked_from=linked_from,
    )
    return run_id, expires, claim
