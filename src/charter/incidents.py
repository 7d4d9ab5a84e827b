"""Incidents: preserved anomalies (overruns, conflicting evidence, hash mismatches).

An incident is never edited away: it closes only by an explicit, audited action
of a principal with ``resolve`` (L7), and while one is open the mission admits
nothing new.
"""

from __future__ import annotations

import json
from typing import Any

from charter.errors import NotFound, StateError
from charter.storage import Tx
from charter.storage.paging import Position, page


def open_incident(
    tx: Tx,
    mission_id: str,
    kind: str,
    detail: dict[str, Any],
    *,
    actor: str,
    run_id: str | None = None,
    attempt_id: str | None = None,
    epoch: int | None = None,
) -> str:
    incident_id = tx.ids.new("inc")
    tx.run(
        "INSERT INTO incidents (id, mission_id, run_id, attempt_id, kind, detail, status, "
        "opened_at_us) VALUES (?, ?, ?, ?, ?, ?, 'open', ?)",
        incident_id,
        mission_id,
        run_id,
        attempt_id,
        kind,
        json.dumps(detail, sort_keys=True),
        tx.now_us,
    )
    tx.audit(
        mission_id,
        "incident.opened",
        incident_id,
        actor=actor,
        epoch=epoch,
        after="open",
        payload={"kind": kind, "attempt_id": attempt_id, "detail": detail},
    )
    return incident_id


def load(tx: Tx, incident_id: str) -> dict[str, Any]:
    row = tx.one("SELECT * FROM incidents WHERE id = ?", incident_id)
    if row is None:
        raise NotFound(f"no incident {incident_id!r} in this store", incident_id=incident_id)
    out = dict(row)
    out["detail"] = json.loads(out["detail"])
    return out


def close_incident(tx: Tx, incident_id: str, *, by: str, note: str) -> dict[str, Any]:
    incident = load(tx, incident_id)
    if incident["status"] != "open":
        raise StateError(f"incident {incident_id} is already closed", incident_id=incident_id)
    if not note.strip():
        raise StateError("closing an incident needs a note saying why it is safe to go on")
    closed = tx.run(
        "UPDATE incidents SET status = 'closed', closed_at_us = ?, closed_by = ?, close_note = ? "
        "WHERE id = ? AND status = 'open'",
        tx.now_us,
        by,
        note,
        incident_id,
    )
    if not closed:  # closed by someone else meanwhile
        raise StateError(f"incident {incident_id} is already closed", incident_id=incident_id)
    tx.audit(
        incident["mission_id"],
        "incident.closed",
        incident_id,
        actor=by,
        before="open",
        after="closed",
        payload={"note": note},
    )
    return incident


def list_incidents(
    tx: Tx,
    mission_id: str,
    *,
    open_only: bool = False,
    limit: int | None = None,
    after: Position | None = None,
) -> list[dict[str, Any]]:
    where = ["mission_id = ?", *(["status = 'open'"] if open_only else [])]
    sql, args = page(
        "SELECT * FROM incidents", where, [mission_id], key="opened_at_us", after=after, limit=limit
    )
    rows = tx.all(sql, *args)
    return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]
