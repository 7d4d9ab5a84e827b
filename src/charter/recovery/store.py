"""The recovery room's table: how many takeovers found each attempt unresolved (K1).

Takeovers are counted per effect left unresolved, not per run: workers carry a
healthy run through many segments (every wake may be another worker), and only
an effect lost again and again is a reason for a person to look.
"""

from __future__ import annotations

from charter.storage import Tx


def count_takeover(tx: Tx, attempt_id: str, run_id: str) -> int:
    """One more takeover found this attempt unresolved; how many have now."""
    row = tx.one(
        "INSERT INTO effect_takeovers (attempt_id, run_id, takeovers) VALUES (?, ?, 1) "
        "ON CONFLICT (attempt_id) DO UPDATE SET takeovers = effect_takeovers.takeovers + 1 "
        "RETURNING takeovers",
        attempt_id,
        run_id,
    )
    assert row is not None
    return int(row["takeovers"])


def most_takeovers(tx: Tx, run_id: str) -> int:
    """The most takeovers any still unresolved attempt of the run went through."""
    row = tx.one(
        "SELECT MAX(t.takeovers) AS n FROM effect_takeovers t JOIN attempts a "
        "ON a.id = t.attempt_id WHERE t.run_id = ? "
        "AND a.status IN ('prepared', 'dispatched', 'unknown')",
        run_id,
    )
    return 0 if row is None or row["n"] is None else int(row["n"])
