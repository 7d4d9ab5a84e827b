"""The waits room's table: every statement on ``approvals``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from charter.storage import Row, Tx
from charter.storage.paging import Position, page
from charter.waits.model import Approval, ApprovalStatus


def from_row(r: Row) -> Approval:
    return Approval(
        r["id"],
        r["mission_id"],
        r["run_id"],
        r["effect_id"],
        r["scope"],
        r["request_hash"],
        ApprovalStatus(r["status"]),
        r["requested_at_us"],
        r["decided_by"],
        r["decided_at_us"],
        r["expires_at_us"],
    )


def approval(tx: Tx, approval_id: str) -> Approval | None:
    row = tx.one("SELECT * FROM approvals WHERE id = ?", approval_id)
    return None if row is None else from_row(row)


def standing(tx: Tx, effect: str, request_hash: str) -> Approval | None:
    """The one pending, approved or denied approval of an effect and request."""
    row = tx.one(
        "SELECT * FROM approvals WHERE effect_id = ? AND request_hash = ? "
        "AND status IN ('pending', 'approved', 'denied')",
        effect,
        request_hash,
    )
    return None if row is None else from_row(row)


def approvals(
    tx: Tx,
    *,
    run_id: str | None,
    pending: bool,
    limit: int | None,
    after: Position | None,
) -> list[Approval]:
    where: list[str] = []
    params: list[Any] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if pending:
        where.append("status = 'pending'")
    sql, args = page(
        "SELECT * FROM approvals", where, params, key="requested_at_us", after=after, limit=limit
    )
    return [from_row(r) for r in tx.all(sql, *args)]


def expired(tx: Tx, effect: str, request_hash: str) -> bool:
    """Whether an approval of the effect and request expired (a pending one renews it)."""
    found = tx.one(
        "SELECT 1 AS x FROM approvals WHERE effect_id = ? AND request_hash = ? "
        "AND status = 'expired'",
        effect,
        request_hash,
    )
    return found is not None


def insert(
    tx: Tx,
    approval_id: str,
    *,
    mission_id: str,
    run_id: str,
    effect: str,
    scope: str,
    request_hash: str,
) -> None:
    tx.run(
        "INSERT INTO approvals (id, mission_id, run_id, effect_id, scope, request_hash, status, "
        "requested_at_us) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
        approval_id,
        mission_id,
        run_id,
        effect,
        scope,
        request_hash,
        tx.now_us,
    )


def set_status(tx: Tx, approval_id: str, status: ApprovalStatus) -> None:
    tx.run("UPDATE approvals SET status = ? WHERE id = ?", status.value, approval_id)


def decide(
    tx: Tx, approval_id: str, status: ApprovalStatus, *, by: str, expires_at_us: int | None
) -> bool:
    """Record a decision on a pending approval; ``False`` if it was no longer pending."""
    return bool(
        tx.run(
            "UPDATE approvals SET status = ?, decided_by = ?, decided_at_us = ?, "
            "expires_at_us = ? WHERE id = ? AND status = 'pending'",
            status.value,
            by,
            tx.now_us,
            expires_at_us,
            approval_id,
        )
    )


def effect_sent(tx: Tx, effect: str, request_hash: str) -> bool:
    """Whether an attempt of the approved effect and request was dispatched."""
    run_id, node_id, execution, effect_key = effect.split("/", 3)
    return (
        tx.one(
            "SELECT 1 AS x FROM attempts WHERE run_id = ? AND node_id = ? AND execution = ? "
            "AND effect_key = ? AND request_hash = ? AND dispatched_epoch IS NOT NULL",
            run_id,
            node_id,
            int(execution),
            effect_key,
            request_hash,
        )
        is not None
    )


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    return {
        "approvals": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM approvals WHERE mission_id = ? ORDER BY requested_at_us, id",
                mission_id,
            )
        ]
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    tx.copy("INSERT INTO approvals", tables["approvals"])
