"""Incidents: preserved anomalies (overruns, conflicting evidence, hash mismatches).

An incident is never edited away: it closes only by an explicit, audited action
of a principal with ``resolve`` (L7), and while one is open the mission admits
nothing new.
"""

from __future__ import annotations

from typing import Any

from charter.errors import NotFound, StateError
from charter.ledger import store
from charter.storage import Tx
from charter.storage.paging import Position


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
    """Record an anomaly and its audit event; it stays open until a person closes it."""
    incident_id = tx.ids.new("inc")
    store.insert_incident(
        tx, incident_id, mission_id, kind, detail, run_id=run_id, attempt_id=attempt_id
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
    found = store.incident(tx, incident_id)
    if found is None:
        raise NotFound(f"no incident {incident_id!r} in this store", incident_id=incident_id)
    return found


def close_incident(tx: Tx, incident_id: str, *, by: str, note: str) -> dict[str, Any]:
    incident = load(tx, incident_id)
    if incident["status"] != "open":
        raise StateError(f"incident {incident_id} is already closed", incident_id=incident_id)
    if not note.strip():
        raise StateError("closing an incident needs a note saying why it is safe to go on")
    if not store.close(tx, incident_id, by=by, note=note):  # closed by someone else meanwhile
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
    return store.incidents(tx, mission_id, open_only=open_only, limit=limit, after=after)
