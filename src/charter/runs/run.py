"""Runs: one execution of a mission's plan, with an owner, an epoch and a lease (F1).

Every change of owner increments the epoch, the fencing token checked by every
dispatch commit and node completion (F2). Terminal runs are never reopened (N4).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from charter.clock import seconds_us
from charter.errors import NotFound, RunTerminal, StateError
from charter.storage import Row, Tx
from charter.storage.paging import Position, page
from charter.waits import approvals


class RunStatus(StrEnum):
    ACTIVE = "active"
    WAITING = "waiting"  # a durable wait: approval, input, timer, event
    PAUSED = "paused"  # allowance exhausted or incident open: a decision is needed (L7)
    NEEDS_INTERVENTION = "needs_intervention"
    STOPPING = "stopping"  # no new admissions; settling what is in flight
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def ending(self) -> bool:
        """Stopping or ended: the run will never admit another attempt."""
        return self is RunStatus.STOPPING or self in _TERMINAL


_TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.STOPPED}
)


@dataclass(frozen=True)
class Run:
    id: str
    mission_id: str
    principal: str
    status: RunStatus
    status_reason: str | None
    epoch: int
    owner_segment: str
    lease_expires_us: int
    recoveries: int
    linked_from: str | None
    created_at_us: int
    updated_at_us: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "mission_id": self.mission_id,
            "principal": self.principal,
            "status": self.status.value,
            "status_reason": self.status_reason,
            "epoch": self.epoch,
            "owner_segment": self.owner_segment,
            "lease_expires_us": self.lease_expires_us,
            "recoveries": self.recoveries,
            "linked_from": self.linked_from,
            "created_at_us": self.created_at_us,
            "updated_at_us": self.updated_at_us,
        }


_COLUMNS = (
    "id, mission_id, principal, status, status_reason, epoch, owner_segment, "
    "lease_expires_us, recoveries, linked_from, created_at_us, updated_at_us"
)


def from_row(r: Row) -> Run:
    return Run(
        r["id"],
        r["mission_id"],
        r["principal"],
        RunStatus(r["status"]),
        r["status_reason"],
        r["epoch"],
        r["owner_segment"],
        r["lease_expires_us"],
        r["recoveries"],
        r["linked_from"],
        r["created_at_us"],
        r["updated_at_us"],
    )


def load(tx: Tx, run_id: str) -> Run:
    row = tx.one(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", run_id)
    if row is None:
        raise NotFound(
            f"no run {run_id!r} in this store; list runs with `charter runs`", run_id=run_id
        )
    return from_row(row)


def list_runs(
    tx: Tx,
    mission_id: str | None = None,
    *,
    limit: int | None = None,
    after: Position | None = None,
) -> list[Run]:
    where, params = ([], []) if mission_id is None else (["mission_id = ?"], [mission_id])
    sql, args = page(
        f"SELECT {_COLUMNS} FROM runs", where, params, key="created_at_us", after=after, limit=limit
    )
    return [from_row(r) for r in tx.all(sql, *args)]


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
    changed = tx.run(
        "UPDATE runs SET status = ?, status_reason = ?, updated_at_us = ? "
        "WHERE id = ? AND status = ?",
        after.value,
        reason,
        tx.now_us,
        run_id,
        before.value,
    )
    if not changed:
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
    tx.run(
        "INSERT INTO runs (id, mission_id, principal, status, epoch, owner_segment, "
        "owner_claim, lease_expires_us, created_at_us, updated_at_us, plan, input, "
        "linked_from) VALUES (?, ?, ?, 'active', 1, ?, ?, ?, ?, ?, ?, ?, ?)",
        run_id,
        mission_id,
        principal,
        segment_id,
        claim,
        expires,
        tx.now_us,
        tx.now_us,
        plan,
        input_json,
        linked_from,
    )
    tx.run(
        "INSERT INTO segments (run_id, segment_id, epoch, started_at_us) VALUES (?, ?, 1, ?)",
        run_id,
        segment_id,
        tx.now_us,
    )
    return run_id, expires, claim
