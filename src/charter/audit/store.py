"""The audit room's reads of ``audit_events`` and the chains' heads (S1).

Events are appended, and heads moved, by :meth:`charter.storage.Tx.audit` in
the transaction of the change they record; everything that reads them back is
here. A mission's head is kept on its row in ``missions``, the engine chain's
in ``audit_chains`` (:func:`charter.hashing.head_table`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from charter.audit.model import ChainHead
from charter.hashing import head_table
from charter.storage import Row, Tx

_END = 2**63 - 1  # past every seq, and no limit at all


def chain_ids(tx: Tx) -> set[str]:
    """Every chain with a head or an event: each mission's, the engine's, and any
    events filed under an id that has no head (found by skipping from one chain
    to the next on the log's key, without reading the events)."""
    rows = tx.all(
        "WITH RECURSIVE c(id) AS ("
        "SELECT MIN(mission_id) FROM audit_events UNION ALL "
        "SELECT (SELECT MIN(mission_id) FROM audit_events WHERE mission_id > c.id) "
        "FROM c WHERE c.id IS NOT NULL) "
        "SELECT id FROM c WHERE id IS NOT NULL "
        "UNION SELECT id FROM missions UNION SELECT id FROM audit_chains "
        "UNION SELECT id FROM escrow_slices"
    )
    return {r["id"] for r in rows}


def head(tx: Tx, chain: str) -> ChainHead | None:
    """``chain``'s recorded head, ``None`` if no row keeps one."""
    row = tx.one(
        f"SELECT audit_seq, audit_hash, audit_legacy_seq FROM {head_table(chain)} WHERE id = ?",
        chain,
    )
    if row is None:
        return None
    return ChainHead(row["audit_seq"], row["audit_hash"], row["audit_legacy_seq"])


def events(tx: Tx, chain: str, page: int) -> Iterator[Row]:
    """``chain``'s events in order, read ``page`` at a time (keyed on ``seq``), so
    a chain of any length is checked in bounded memory."""
    rows = tx.all(
        "SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq LIMIT ?", chain, page
    )
    while rows:
        yield from rows
        if len(rows) < page:
            return
        rows = tx.all(
            "SELECT * FROM audit_events WHERE mission_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            chain,
            rows[-1]["seq"],
            page,
        )


def slices(tx: Tx, mission_id: str) -> list[Row]:
    """The escrow slices a mission lent (L10): each a chain of its own."""
    return tx.all(
        "SELECT id, mission_id, status FROM escrow_slices WHERE mission_id = ? ORDER BY id",
        mission_id,
    )


def lender(tx: Tx, slice_id: str) -> Row | None:
    """The slice's row: its mission and status."""
    return tx.one("SELECT id, mission_id, status FROM escrow_slices WHERE id = ?", slice_id)


def lending(tx: Tx, mission_id: str, slice_id: str) -> list[Row]:
    """The events on the mission's chain that lent and returned the slice."""
    return tx.all(
        "SELECT kind, payload FROM audit_events WHERE mission_id = ? AND entity = ? "
        "AND kind IN ('escrow.leased', 'escrow.returned') ORDER BY seq",
        mission_id,
        slice_id,
    )


def all_events(
    tx: Tx, chain: str, *, before: int | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """``chain``'s events in order (for showing a log, not verifying it): all of them,
    or the newest ``limit`` before ``seq`` ``before``, read backwards on the key."""
    if before is None and limit is None:
        rows = tx.all("SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq", chain)
        return [dict(r) for r in rows]
    rows = tx.all(
        "SELECT * FROM audit_events WHERE mission_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
        chain,
        _END if before is None else before,
        _END if limit is None else limit,
    )
    return [dict(r) for r in reversed(rows)]


#: The entities a run's events are filed under: the run, its nodes and artifacts
#: (``RUN/NAME``), its attempts, approvals and waits. Each is read by its index.
_RUN_ENTITIES = (
    "SELECT id FROM runs WHERE id = ? "
    "UNION ALL SELECT id FROM attempts WHERE run_id = ? "
    "UNION ALL SELECT id FROM approvals WHERE run_id = ? "
    "UNION ALL SELECT id FROM waits WHERE run_id = ? "
    "UNION ALL SELECT run_id || '/' || node_id FROM node_executions WHERE run_id = ? "
    "UNION ALL SELECT run_id || '/' || name FROM artifacts WHERE run_id = ?"
)


def run_events(
    tx: Tx, chain: str, run_id: str, *, before: int | None, limit: int | None
) -> list[dict[str, Any]]:
    """The newest ``limit`` events of ``chain`` about one run before ``seq``
    ``before`` (all of them when ``None``), refusals included, in order. Read by
    the run's entities through ``audit_events_entity``: the cost follows the run,
    never the length of its mission's chain."""
    rows = tx.all(
        "SELECT * FROM audit_events{indexed_by audit_events_entity} "
        f"WHERE mission_id = ? AND entity IN ({_RUN_ENTITIES}) AND seq < ? "
        "ORDER BY seq DESC LIMIT ?",
        chain,
        *[run_id] * 6,
        _END if before is None else before,
        _END if limit is None else limit,
    )
    return [dict(r) for r in reversed(rows)]


# -- snapshots (S2) and checkpoints -----------------------------------------------------


def restore(tx: Tx, events: Sequence[Mapping[str, Any]]) -> None:
    """Write a verified snapshot's chain as it was hashed (never rehashed)."""
    tx.copy("INSERT INTO audit_events", events)


def checkpoint(tx: Tx, chain: str) -> Row | None:
    """The chain's latest signed head (S2), if one was made."""
    return tx.one(
        "SELECT seq, hash, key_id, signature FROM audit_checkpoints WHERE mission_id = ?", chain
    )


def store_id(tx: Tx) -> str:
    """This store's identity, made on first asking: what a handover names its target by."""
    row = tx.one("SELECT id FROM store_identity")
    if row is not None:
        return str(row["id"])
    made = tx.ids.new("sto")
    tx.run("INSERT INTO store_identity (id, created_at_us) VALUES (?, ?)", made, tx.now_us)
    return made


def sealed(tx: Tx, chain: str) -> str | None:
    """Why ``chain`` takes no more events in this store (``None``: it does)."""
    row = tx.one(f"SELECT audit_sealed FROM {head_table(chain)} WHERE id = ?", chain)
    return None if row is None else row["audit_sealed"]


def event_at(tx: Tx, chain: str, seq: int) -> Row | None:
    return tx.one("SELECT hash FROM audit_events WHERE mission_id = ? AND seq = ?", chain, seq)
