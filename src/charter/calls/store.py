"""The calls a gateway carries (G3): a client's call identity mapped to its run.

A row maps ``(mission, principal, call key)`` to the run that carries the call.
It is written before the call's attempt is admitted, in a transaction of its
own, and the insert that loses a race changes nothing: whoever holds the row
carries the call, and everyone else answers from its run. A key with a window
(the same arguments within ``same_call_seconds``) names a new call once the
window is over: its row is moved to the new run, conditionally, so two
requests past the window cannot both move it.
"""

from __future__ import annotations

from charter.clock import seconds_us
from charter.storage import Tx


def run_of(tx: Tx, mission: str, principal: str, call: str, window: int | None) -> str | None:
    """The run carrying the call, or ``None`` (none yet, or its window is over)."""
    row = tx.one(
        "SELECT run_id, created_at_us FROM gateway_calls "
        "WHERE mission_id = ? AND principal = ? AND call_key = ?",
        mission,
        principal,
        call,
    )
    if row is None or (
        window is not None and tx.now_us - row["created_at_us"] > seconds_us(window)
    ):
        return None
    return str(row["run_id"])


def claim(
    tx: Tx,
    mission: str,
    principal: str,
    call: str,
    window: int | None,
    *,
    run_id: str,
    tool: str,
) -> str:
    """Make ``run_id`` the call's run unless another holds it (within its window);
    returns the run that carries the call."""
    inserted = tx.run(
        "INSERT INTO gateway_calls (mission_id, principal, call_key, run_id, tool, "
        "created_at_us) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        mission,
        principal,
        call,
        run_id,
        tool,
        tx.now_us,
    )
    if not inserted and window is not None:  # a new call once the window is over
        tx.run(
            "UPDATE gateway_calls SET run_id = ?, created_at_us = ? WHERE mission_id = ? "
            "AND principal = ? AND call_key = ? AND created_at_us < ?",
            run_id,
            tx.now_us,
            mission,
            principal,
            call,
            tx.now_us - seconds_us(window),
        )
    row = tx.one(
        "SELECT run_id FROM gateway_calls WHERE mission_id = ? AND principal = ? AND call_key = ?",
        mission,
        principal,
        call,
    )
    assert row is not None
    return str(row["run_id"])


def forget(tx: Tx, run_id: str) -> None:
    """A call refused before anything moved (its allowance, its rights) is no
    call: the same call asked again is admitted afresh (after a raised limit)."""
    tx.run("DELETE FROM gateway_calls WHERE run_id = ?", run_id)


def unfinished(tx: Tx, mission: str) -> list[str]:
    """The runs of the mission's calls that are still active: sent by a gateway
    that may have died, or under way in a live one (its lease tells which)."""
    rows = tx.all(
        "SELECT g.run_id FROM gateway_calls g JOIN runs r ON r.id = g.run_id "
        "WHERE g.mission_id = ? AND r.status = 'active' ORDER BY g.created_at_us",
        mission,
    )
    return [str(r["run_id"]) for r in rows]
