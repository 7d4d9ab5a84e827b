"""The audit room's reads of ``audit_events`` and the chains' heads (S1).

Events are appended, and heads moved, by :meth:`charter.storage.Tx.audit` in
the transaction of the change they record; everything that reads them back is
here. A mission's head is kept on its row in ``missions``, the engine chain's
in ``audit_chains`` (:func:`charter.hashing.head_table`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from charter.audit.model import ChainHead
from charter.hashing import head_table
from charter.storage import Row, Tx


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
        "UNION SELECT id FROM missions UNION SELECT id FROM audit_chains"
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


def all_events(tx: Tx, chain: str) -> list[dict[str, Any]]:
    """``chain``'s events in order, all at once (for showing a log, not verifying it)."""
    return [
        dict(r)
        for r in tx.all("SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq", chain)
    ]


def run_events(tx: Tx, chain: str, run_id: str) -> list[dict[str, Any]]:
    """The events of ``chain`` about one run: the run itself, its attempts and its
    approvals (refusals included), in order."""
    rows = tx.all(
        "SELECT * FROM audit_events WHERE mission_id = ? AND (entity = ? "
        "OR entity IN (SELECT id FROM attempts WHERE run_id = ?) "
        "OR entity IN (SELECT id FROM approvals WHERE run_id = ?)) ORDER BY seq",
        chain,
        run_id,
        run_id,
        run_id,
    )
    return [dict(r) for r in rows]
