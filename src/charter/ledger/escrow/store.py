"""The escrow tables (L10): ``escrow_slices`` (a slice, its lease, its counters,
its chain's head and its books) and ``escrow_holds`` (which slice an attempt's
hold was taken from). The head, counters and books on a slice's row are moved
with its events (:meth:`charter.storage.Tx.audit`, :meth:`~charter.storage.Tx.move_books`),
as a mission's are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from charter.ledger.accounts import Balance, as_records, from_records
from charter.storage import Row, Tx
from charter.storage import books as chain_books

#: A run's standing (:func:`charter.runs.store.standing`) in a lane (L10): what is
#: available is the slice's, and the slice's status and lease come with it
#: (parameters: the slice, then the run).
STANDING = (
    "SELECT r.status, r.epoch, r.owner_segment, r.owner_claim, r.lease_expires_us, r.linked_from, "
    "m.contract_version, m.attempts_admitted, m.attempts_failed, "
    "(SELECT COUNT(*) FROM incidents i WHERE i.mission_id = r.mission_id "
    "AND i.status = 'open') AS open_incidents, "
    "s.id AS head_of, s.audit_seq AS head_seq, s.audit_hash AS head_hash, "
    "s.audit_sealed AS head_sealed, s.books AS head_books, "
    "s.status AS slice_status, s.lease_expires_us AS slice_expires_us, NULL AS escrow_lapse "
    "FROM escrow_slices s JOIN missions m ON m.id = s.mission_id "
    "JOIN runs r ON m.id = r.mission_id WHERE s.id = ? AND r.id = ?"
)


def insert_slice(tx: Tx, slice_id: str, mission_id: str, holder: str, expires_us: int) -> None:
    tx.run(
        "INSERT INTO escrow_slices (id, mission_id, holder, status, lease_expires_us, "
        "leased_at_us) VALUES (?, ?, ?, 'open', ?, ?)",
        slice_id,
        mission_id,
        holder,
        expires_us,
        tx.now_us,
    )


def held_in(tx: Tx, attempt_id: str, slice_id: str) -> None:
    """The attempt's hold was taken from the slice (deferred: nobody reads it now)."""
    tx.write("INSERT INTO escrow_holds (attempt_id, slice_id) VALUES (?, ?)", attempt_id, slice_id)


def slice_of(tx: Tx, attempt_id: str) -> Row | None:
    """The slice an attempt's hold was taken from, with its status, if any."""
    return tx.one(
        "SELECT s.id, s.status FROM escrow_holds h JOIN escrow_slices s ON s.id = h.slice_id "
        "WHERE h.attempt_id = ?",
        attempt_id,
    )


def row(tx: Tx, slice_id: str) -> Row | None:
    return tx.one("SELECT * FROM escrow_slices WHERE id = ?", slice_id)


def open_slices(tx: Tx, mission_id: str, *, lapsed: bool = False) -> list[Row]:
    """The mission's open slices (only those whose lease has ended, with ``lapsed``)."""
    sql = "SELECT * FROM escrow_slices WHERE mission_id = ? AND status = 'open'"
    if lapsed:
        return tx.all(sql + " AND lease_expires_us <= ? ORDER BY id", mission_id, tx.now_us)
    return tx.all(sql + " ORDER BY id", mission_id)


def unused(tx: Tx, mission_id: str) -> dict[str, dict[str, int]]:
    """What each of the mission's open slices has available, by unit: lent money
    no attempt holds or spent."""
    found: dict[str, dict[str, int]] = {}
    for s in open_slices(tx, mission_id):
        books = sorted(tx.books(s["id"]).items())
        found[s["id"]] = {unit: Balance(*sums).available for unit, sums in books}
    return found


def slices(tx: Tx, mission_id: str) -> list[Row]:
    """Every slice the mission lent, oldest first."""
    return tx.all(
        "SELECT * FROM escrow_slices WHERE mission_id = ? ORDER BY leased_at_us, id", mission_id
    )


def extend(tx: Tx, slice_id: str, expires_us: int) -> bool:
    """Move an open slice's lease on; ``False`` if it is not open any more."""
    return bool(
        tx.run(
            "UPDATE escrow_slices SET lease_expires_us = ? WHERE id = ? AND status = 'open'",
            expires_us,
            slice_id,
        )
    )


def mark_returned(tx: Tx, slice_id: str, why: str) -> bool:
    """Close the slice and seal its chain (its final head is on its mission's chain)."""
    return bool(
        tx.run(
            "UPDATE escrow_slices SET status = 'returned', returned_at_us = ?, returned_why = ?, "
            "audit_sealed = 'returned' WHERE id = ? AND status = 'open'",
            tx.now_us,
            why,
            slice_id,
        )
    )


def open_holds(tx: Tx, mission_id: str) -> list[tuple[dict[str, int], str | None]]:
    """The holds of the mission's PREPARED, DISPATCHED and UNKNOWN attempts, each
    with the open slice it was taken from (``None``: the mission's own)."""
    rows = tx.all(
        "SELECT a.estimate, s.id AS slice_id FROM attempts a "
        "LEFT JOIN escrow_holds h ON h.attempt_id = a.id "
        "LEFT JOIN escrow_slices s ON s.id = h.slice_id AND s.status = 'open' "
        "WHERE a.run_id IN (SELECT id FROM runs WHERE mission_id = ?) "
        "AND a.status IN ('prepared', 'dispatched', 'unknown')",
        mission_id,
    )
    return [(json.loads(r["estimate"]), r["slice_id"]) for r in rows]


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """The mission's slices (their head rows without the books), their books as
    ``escrow_accounts`` records (one per unit) and their holds, as recorded."""
    rows = [dict(r) for r in slices(tx, mission_id)]
    accounts: list[dict[str, Any]] = []
    holds: list[dict[str, Any]] = []
    for row in rows:
        slice_id, books = row["id"], chain_books.read(row.pop("books"))
        accounts += as_records("slice_id", slice_id, {u: Balance(*s) for u, s in books.items()})
        holds += [
            dict(r)
            for r in tx.all(
                "SELECT * FROM escrow_holds WHERE slice_id = ? ORDER BY attempt_id", slice_id
            )
        ]
    return {"escrow_slices": rows, "escrow_accounts": accounts, "escrow_holds": holds}


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Write a verified snapshot's slices, their books and holds as they were."""
    tx.copy("INSERT INTO escrow_slices", tables["escrow_slices"])
    for slice_id, books in from_records("slice_id", tables["escrow_accounts"]).items():
        tx.restore_books(slice_id, books)
    tx.copy("INSERT INTO escrow_holds", tables["escrow_holds"])
