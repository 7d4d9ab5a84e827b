"""The waits room's tables: every statement on ``approvals`` and ``waits``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from charter.storage import Row, Tx
from charter.storage.paging import Position, page
from charter.waits.model import Approval, ApprovalStatus, Wait, WaitKind, WaitStatus


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


# -- waits (W1) -----------------------------------------------------------------------


def wait_from_row(r: Row) -> Wait:
    return Wait(
        id=r["id"],
        mission_id=r["mission_id"],
        run_id=r["run_id"],
        node_id=r["node_id"],
        key=r["wait_key"],
        kind=WaitKind(r["kind"]),
        status=WaitStatus(r["status"]),
        prompt=r["prompt"],
        answer_type=r["answer_type"],
        due_at_us=r["due_at_us"],
        value=None if r["value"] is None else json.loads(r["value"]),
        created_at_us=r["created_at_us"],
        satisfied_at_us=r["satisfied_at_us"],
        satisfied_by=r["satisfied_by"],
    )


def wait(tx: Tx, run_id: str, key: str) -> Wait | None:
    row = tx.one("SELECT * FROM waits WHERE run_id = ? AND wait_key = ?", run_id, key)
    return None if row is None else wait_from_row(row)


def waits(tx: Tx, *, run_id: str | None = None, open_only: bool = False) -> list[Wait]:
    """Waits by creation; ``open_only``: those not yet read by their node."""
    where, params = [], []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if open_only:
        where.append("status <> 'consumed'")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return [
        wait_from_row(r)
        for r in tx.all(f"SELECT * FROM waits{clause} ORDER BY created_at_us, id", *params)
    ]


def insert_wait(
    tx: Tx,
    wait_id: str,
    *,
    mission_id: str,
    run_id: str,
    node_id: str,
    key: str,
    kind: WaitKind,
    prompt: str | None,
    answer_type: str | None,
    due_at_us: int | None,
) -> None:
    tx.run(
        "INSERT INTO waits (id, mission_id, run_id, node_id, wait_key, kind, status, prompt, "
        "answer_type, due_at_us, created_at_us) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
        wait_id,
        mission_id,
        run_id,
        node_id,
        key,
        kind.value,
        prompt,
        answer_type,
        due_at_us,
        tx.now_us,
    )


def satisfy(tx: Tx, wait_id: str, *, value: str | None, by: str) -> bool:
    """Record an answer, a signal or a due timer on a pending wait; ``False`` if it
    was no longer pending (someone else was first)."""
    return bool(
        tx.run(
            "UPDATE waits SET status = 'satisfied', value = ?, satisfied_at_us = ?, "
            "satisfied_by = ? WHERE id = ? AND status = 'pending'",
            value,
            tx.now_us,
            by,
            wait_id,
        )
    )


def consume(tx: Tx, wait_id: str) -> None:
    tx.run("UPDATE waits SET status = 'consumed' WHERE id = ? AND status = 'satisfied'", wait_id)


def pending_events(tx: Tx, run_id: str, event: str) -> list[Wait]:
    return [
        wait_from_row(r)
        for r in tx.all(
            "SELECT * FROM waits WHERE run_id = ? AND kind = 'event' AND prompt = ? "
            "AND status = 'pending' ORDER BY created_at_us, id",
            run_id,
            event,
        )
    ]


def due_runs(tx: Tx) -> list[Row]:
    """Runs waiting on something that has arrived: a satisfied wait, or a timer due
    by the store's clock (``run_id``, ``at_us``: since when), and the next timers."""
    return tx.all(
        "SELECT run_id, MIN(CASE WHEN status = 'satisfied' THEN satisfied_at_us "
        "ELSE due_at_us END) AS at_us FROM waits WHERE status = 'satisfied' "
        "OR (status = 'pending' AND kind = 'timer') GROUP BY run_id ORDER BY at_us",
    )


def wake_at(tx: Tx, run_id: str) -> int | None:
    """When the run should be looked at again by itself: the earliest of a wait
    already met (since when), a pending timer's due time and a pending or granted
    approval's coming expiry (then asked again, W2); ``None`` if only a decision moves it."""
    row = tx.one(
        "SELECT MIN(at_us) AS at FROM ("
        "SELECT CASE WHEN status = 'satisfied' THEN satisfied_at_us ELSE due_at_us END "
        "AS at_us FROM waits WHERE run_id = ? AND (status = 'satisfied' "
        "OR (status = 'pending' AND kind = 'timer')) "
        "UNION ALL SELECT expires_at_us AS at_us FROM approvals WHERE run_id = ? "
        "AND status IN ('pending', 'approved') AND expires_at_us > ?) w",
        run_id,
        run_id,
        tx.now_us,
    )
    return None if row is None or row["at"] is None else int(row["at"])


def count_pending(tx: Tx) -> int:
    """How many approvals wait for a decision, in every mission."""
    row = tx.one("SELECT COUNT(*) AS n FROM approvals WHERE status = 'pending'")
    return 0 if row is None else int(row["n"])


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
