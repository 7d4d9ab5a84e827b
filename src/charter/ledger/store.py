"""The ledger room's tables: entries, cached balances, incidents (L0-L7).

Every statement on ``ledger_entries``, ``allowances`` (a mission's accounts,
opened with its contract, and their cached balances) and ``incidents`` is
here; :mod:`charter.ledger.accounts` computes the moves and
:mod:`charter.ledger.incidents` says what an incident means.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from charter.ledger.accounts import Balance, Move, balances, check_sums
from charter.storage import Row, Tx
from charter.storage.paging import Position, page


def record(
    tx: Tx,
    mission_id: str,
    attempt_id: str | None,
    moves: list[Move],
    price_source: str | None,
) -> None:
    """Append entries and update cached balances in the caller's transaction.

    Refuses (:class:`AmountOverflow`, nothing written by this call) moves whose
    sums with the cached balances would leave the range the ledger holds (A9).
    Only an overrun (it adds to ``spent + held`` beyond any hold) or a higher
    limit can: a hold is bounded by what is available (L3), a spend moves held
    to spent and a release lowers held. So admissions and settlements within
    their holds pay no read.
    """
    if not moves:
        return
    change = balances(moves)
    if any(d.overrun > 0 or d.limit > 0 for d in change.values()):
        check_sums(cached(tx, mission_id), change)
    tx.many(
        "INSERT INTO ledger_entries (mission_id, unit, attempt_id, kind, source, target, "
        "amount, price_source, at_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                mission_id,
                m.unit,
                attempt_id,
                m.kind,
                m.source,
                m.target,
                m.amount,
                price_source,
                tx.now_us,
            )
            for m in moves
        ],
    )
    tx.many(
        "UPDATE allowances SET limit_amount = limit_amount + ?, available = available + ?, "
        "held = held + ?, spent = spent + ?, overrun = overrun + ? "
        "WHERE mission_id = ? AND unit = ?",
        [
            (d.limit, d.available, d.held, d.spent, d.overrun, mission_id, unit)
            for unit, d in change.items()
        ],
    )


def open_account(tx: Tx, mission_id: str, unit: str) -> None:
    """A unit's account at zero; a ``fund`` move then sets its limit (L0)."""
    tx.run(
        "INSERT INTO allowances (mission_id, unit, limit_amount, available, held, spent, "
        "overrun) VALUES (?, ?, 0, 0, 0, 0, 0)",
        mission_id,
        unit,
    )


def overdrawn(tx: Tx, mission_id: str) -> bool:
    """Whether any unit of the mission has less than nothing available (L7)."""
    return (
        tx.one("SELECT 1 AS x FROM allowances WHERE mission_id = ? AND available < 0", mission_id)
        is not None
    )


def cached(tx: Tx, mission_id: str) -> dict[str, Balance]:
    rows = tx.all(
        "SELECT unit, limit_amount, available, held, spent, overrun FROM allowances "
        "WHERE mission_id = ? ORDER BY unit",
        mission_id,
    )
    return {
        r["unit"]: Balance(r["limit_amount"], r["available"], r["held"], r["spent"], r["overrun"])
        for r in rows
    }


def from_entries(tx: Tx, mission_id: str) -> dict[str, Balance]:
    rows = tx.all(
        "SELECT unit, kind, source, target, amount FROM ledger_entries WHERE mission_id = ? "
        "ORDER BY id",
        mission_id,
    )
    return balances(Move(r["unit"], r["kind"], r["source"], r["target"], r["amount"]) for r in rows)


def entries(
    tx: Tx, mission_id: str, *, unit: str | None = None, newest: int | None = None
) -> list[dict[str, Any]]:
    """The mission's ledger entries (of one ``unit``), in the order they were
    written; with ``newest``, only that many of the latest."""
    where, params = "mission_id = ?", [mission_id]
    if unit is not None:
        where += " AND unit = ?"
        params.append(unit)
    if newest is None:
        rows = tx.all(f"SELECT * FROM ledger_entries WHERE {where} ORDER BY id", *params)
    else:
        rows = tx.all(
            f"SELECT * FROM (SELECT * FROM ledger_entries WHERE {where} ORDER BY id DESC LIMIT ?) "
            "AS newest ORDER BY id",
            *params,
            newest,
        )
    return [dict(r) for r in rows]


def problems(tx: Tx, mission_id: str) -> list[str]:
    """Check L0, L1 and L2 for one mission; an empty list means the ledger holds."""
    out: list[str] = []
    cache = cached(tx, mission_id)
    rebuilt = from_entries(tx, mission_id)
    holds: dict[str, int] = {}
    for r in tx.all(
        # Through the runs, so the partial index of open attempts serves it.
        "SELECT estimate FROM attempts WHERE run_id IN (SELECT id FROM runs WHERE mission_id = ?) "
        "AND status IN ('prepared', 'dispatched', 'unknown')",
        mission_id,
    ):
        for unit, amount in json.loads(r["estimate"]).items():
            holds[unit] = holds.get(unit, 0) + amount
    for unit, bal in cache.items():
        if bal.available + bal.held + bal.spent != bal.limit:
            out.append(f"L0 {unit}: available+held+spent != limit ({bal})")
        if bal.held != holds.get(unit, 0):
            out.append(f"L1 {unit}: held {bal.held} != open holds {holds.get(unit, 0)}")
        if rebuilt.get(unit, Balance()) != bal:
            out.append(f"L2 {unit}: cached {bal} != rebuilt from entries {rebuilt.get(unit)}")
    return out


# -- incidents ------------------------------------------------------------------


def insert_incident(
    tx: Tx,
    incident_id: str,
    mission_id: str,
    kind: str,
    detail: Mapping[str, Any],
    *,
    run_id: str | None,
    attempt_id: str | None,
) -> None:
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


def incident(tx: Tx, incident_id: str) -> dict[str, Any] | None:
    row = tx.one("SELECT * FROM incidents WHERE id = ?", incident_id)
    return None if row is None else _incident(row)


def close(tx: Tx, incident_id: str, *, by: str, note: str) -> bool:
    """Close an open incident; ``False`` if it was not open any more."""
    return bool(
        tx.run(
            "UPDATE incidents SET status = 'closed', closed_at_us = ?, closed_by = ?, "
            "close_note = ? WHERE id = ? AND status = 'open'",
            tx.now_us,
            by,
            note,
            incident_id,
        )
    )


def incidents(
    tx: Tx,
    mission_id: str,
    *,
    open_only: bool,
    limit: int | None,
    after: Position | None,
) -> list[dict[str, Any]]:
    where = ["mission_id = ?", *(["status = 'open'"] if open_only else [])]
    sql, args = page(
        "SELECT * FROM incidents", where, [mission_id], key="opened_at_us", after=after, limit=limit
    )
    return [_incident(r) for r in tx.all(sql, *args)]


def any_open(tx: Tx, mission_id: str) -> bool:
    """Whether an incident of the mission is open (it keeps the mission paused, L7)."""
    found = tx.one(
        "SELECT 1 AS x FROM incidents WHERE mission_id = ? AND status = 'open'", mission_id
    )
    return found is not None


def count_open(tx: Tx, mission_id: str) -> int:
    row = tx.one(
        "SELECT COUNT(*) AS n FROM incidents WHERE mission_id = ? AND status = 'open'",
        mission_id,
    )
    assert row is not None  # a count answers one row
    return int(row["n"])


def _incident(row: Row) -> dict[str, Any]:
    return {**dict(row), "detail": json.loads(row["detail"])}


def totals(tx: Tx) -> dict[str, Balance]:
    """Every mission's cached balances summed per unit (for the metrics endpoint)."""
    rows = tx.all(
        "SELECT unit, SUM(limit_amount) AS l, SUM(available) AS a, SUM(held) AS h, "
        "SUM(spent) AS s, SUM(overrun) AS o FROM allowances GROUP BY unit ORDER BY unit"
    )
    return {
        r["unit"]: Balance(int(r["l"]), int(r["a"]), int(r["h"]), int(r["s"]), int(r["o"]))
        for r in rows
    }


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """Allowances, incidents and the ledger's entries in the order they were made
    (without their store-assigned ids: a store numbers its own entries)."""
    entries = [
        dict(r)
        for r in tx.all("SELECT * FROM ledger_entries WHERE mission_id = ? ORDER BY id", mission_id)
    ]
    for entry in entries:
        del entry["id"]
    return {
        "allowances": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM allowances WHERE mission_id = ? ORDER BY unit", mission_id
            )
        ],
        "ledger_entries": entries,
        "incidents": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM incidents WHERE mission_id = ? ORDER BY opened_at_us, id",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    tx.copy("INSERT INTO allowances", tables["allowances"])
    tx.copy("INSERT INTO ledger_entries", tables["ledger_entries"])
    tx.copy("INSERT INTO incidents", tables["incidents"])
