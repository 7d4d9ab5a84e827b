"""The artifacts room's table: every statement on ``artifacts`` (N2).

One row per name a run's node saved: the node execution that saved it, and
the object's SHA-256 and size. The bytes are in the object store.
"""

from __future__ import annotations

from typing import Any

from charter.storage import Row, Tx

_COLUMNS = "run_id, name, mission_id, node_id, execution, sha256, size, created_at_us"


def to_dict(r: Row) -> dict[str, Any]:
    return {k: r[k] for k in _COLUMNS.split(", ")}


def artifact(tx: Tx, run_id: str, name: str) -> Row | None:
    return tx.one(f"SELECT {_COLUMNS} FROM artifacts WHERE run_id = ? AND name = ?", run_id, name)


def of_run(tx: Tx, run_id: str, node_ids: tuple[str, ...] | None = None) -> list[Row]:
    """A run's artifacts by name (``node_ids``: only those these nodes saved)."""
    rows = tx.all(f"SELECT {_COLUMNS} FROM artifacts WHERE run_id = ? ORDER BY name", run_id)
    return [r for r in rows if node_ids is None or r["node_id"] in node_ids]


def record(
    tx: Tx,
    *,
    run_id: str,
    name: str,
    mission_id: str,
    node_id: str,
    execution: int,
    sha256: str,
    size: int,
) -> None:
    """Record (or, for a new execution of the same node, replace) a saved artifact."""
    tx.run("DELETE FROM artifacts WHERE run_id = ? AND name = ?", run_id, name)
    tx.run(
        f"INSERT INTO artifacts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        run_id,
        name,
        mission_id,
        node_id,
        execution,
        sha256,
        size,
        tx.now_us,
    )
