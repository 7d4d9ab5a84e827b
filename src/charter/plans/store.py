"""The plans room's tables: every statement on ``node_executions`` and ``journal``.

The runner starts, fails and completes node executions (N1) and carries them
into a linked run (N4); a node's context journals its nondeterministic values
(A6); recovery counts the crashes of executions it finds running (R6); the
attempts room follows a linked run back to the execution it continues (N4);
operators read both tables as :mod:`charter.plans.journal` records. This
module sits on the attempts floor for that lineage walk, so it imports only
storage, the basics and those records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from charter.plans.journal import JournalEntry, NodeExecution
from charter.storage import Row, Tx

# -- node executions ----------------------------------------------------------------


def from_row(r: Row) -> NodeExecution:
    return NodeExecution(
        run_id=r["run_id"],
        node_id=r["node_id"],
        execution=r["execution"],
        status=r["status"],
        result=None if r["result"] is None else json.loads(r["result"]),
        result_hash=r["result_hash"],
        error=r["error"],
        started_epoch=r["started_epoch"],
        crashes=r["crashes"],
        started_at_us=r["started_at_us"],
        completed_at_us=r["completed_at_us"],
        inherited_run=r["inherited_run"],
        inherited_execution=r["inherited_execution"],
    )


def node_executions(tx: Tx, run_id: str) -> list[NodeExecution]:
    """A run's node executions by node, then execution."""
    return [
        from_row(r)
        for r in tx.all(
            "SELECT run_id, node_id, execution, status, result, result_hash, error, "
            "started_epoch, crashes, started_at_us, completed_at_us, inherited_run, "
            "inherited_execution FROM node_executions WHERE run_id = ? "
            "ORDER BY node_id, execution",
            run_id,
        )
    ]


def completed(tx: Tx, run_id: str, node_id: str) -> Row | None:
    """The node's completed execution: ``execution``, ``result`` (JSON text) and
    ``result_hash``, for the consumer to check before it starts (N1)."""
    return tx.one(
        "SELECT execution, result, result_hash FROM node_executions WHERE run_id = ? "
        "AND node_id = ? AND status = 'completed'",
        run_id,
        node_id,
    )


def executions(tx: Tx, run_id: str) -> list[Row]:
    """Every execution's ``node_id``, ``execution``, ``status``, ``result`` and
    ``result_hash``, by node, then execution: what a linked run inherits (N4)."""
    return tx.all(
        "SELECT node_id, execution, status, result, result_hash FROM node_executions "
        "WHERE run_id = ? ORDER BY node_id, execution",
        run_id,
    )


def inherit(
    tx: Tx,
    run_id: str,
    node_id: str,
    *,
    status: str,
    result: str | None,
    result_hash: str | None,
    completed_at_us: int | None,
    from_run: str,
    from_execution: int,
) -> None:
    """Execution 1 of a linked run's node, pointing at the one it continues (N4)."""
    tx.run(
        "INSERT INTO node_executions (run_id, node_id, execution, status, result, "
        "result_hash, started_epoch, started_at_us, completed_at_us, inherited_run, "
        "inherited_execution) VALUES (?, ?, 1, ?, ?, ?, 1, ?, ?, ?, ?)",
        run_id,
        node_id,
        status,
        result,
        result_hash,
        tx.now_us,
        completed_at_us,
        from_run,
        from_execution,
    )


def inherited(tx: Tx, run_id: str, node_id: str) -> tuple[str, int] | None:
    """The run and execution that the node's first execution in a linked run
    continues (N4), or ``None`` when it continues none."""
    link = tx.one(
        "SELECT inherited_run, inherited_execution FROM node_executions WHERE run_id = ? "
        "AND node_id = ? AND execution = 1",
        run_id,
        node_id,
    )
    if link is None or link["inherited_run"] is None:
        return None
    return str(link["inherited_run"]), int(link["inherited_execution"])


def latest(tx: Tx, run_id: str, node_id: str) -> Row | None:
    """The node's newest execution: its ``execution`` and ``status``."""
    return tx.one(
        "SELECT execution, status FROM node_executions WHERE run_id = ? AND node_id = ? "
        "ORDER BY execution DESC LIMIT 1",
        run_id,
        node_id,
    )


def resume(tx: Tx, run_id: str, node_id: str, execution: int) -> None:
    """Run an execution left running or blocked again, as the same execution."""
    tx.run(
        "UPDATE node_executions SET status = 'running' WHERE run_id = ? "
        "AND node_id = ? AND execution = ?",
        run_id,
        node_id,
        execution,
    )


def start(tx: Tx, run_id: str, node_id: str, execution: int, epoch: int) -> None:
    tx.run(
        "INSERT INTO node_executions (run_id, node_id, execution, status, started_epoch, "
        "started_at_us) VALUES (?, ?, ?, 'running', ?, ?)",
        run_id,
        node_id,
        execution,
        epoch,
        tx.now_us,
    )


def set_status(
    tx: Tx, run_id: str, node_id: str, execution: int, *, status: str, error: str | None
) -> None:
    tx.run(
        "UPDATE node_executions SET status = ?, error = ? WHERE run_id = ? "
        "AND node_id = ? AND execution = ?",
        status,
        error,
        run_id,
        node_id,
        execution,
    )


def failures(tx: Tx, run_id: str, node_id: str) -> int:
    """How many of the node's executions have failed (against its ``retries``)."""
    row = tx.one(
        "SELECT COUNT(*) AS n FROM node_executions WHERE run_id = ? "
        "AND node_id = ? AND status = 'failed'",
        run_id,
        node_id,
    )
    return 0 if row is None else int(row["n"])


def complete(
    tx: Tx, run_id: str, node_id: str, execution: int, *, result: str, result_hash: str
) -> None:
    """The checked result (JSON text) and its hash, durable before a consumer starts (N1)."""
    tx.run(
        "UPDATE node_executions SET status = 'completed', result = ?, result_hash = ?, "
        "completed_at_us = ? WHERE run_id = ? AND node_id = ? AND execution = ?",
        result,
        result_hash,
        tx.now_us,
        run_id,
        node_id,
        execution,
    )


# -- recovery -------------------------------------------------------------------------


def recovery_view(tx: Tx, run_id: str) -> list[Row]:
    """Every execution's ``node_id``, ``execution``, ``status``, ``crashes``,
    ``result_hash`` and ``error``, in the order they started: the nodes of the
    recovery state."""
    return tx.all(
        "SELECT node_id, execution, status, crashes, result_hash, error FROM node_executions "
        "WHERE run_id = ? ORDER BY started_at_us, node_id, execution",
        run_id,
    )


def running(tx: Tx, run_id: str) -> list[Row]:
    """The executions left running (``node_id``, ``execution``, ``crashes``): at a
    takeover, each one crashed its process (R6)."""
    return tx.all(
        "SELECT node_id, execution, crashes FROM node_executions WHERE run_id = ? "
        "AND status = 'running'",
        run_id,
    )


def count_crashes(tx: Tx, run_id: str) -> None:
    """One more crash for every execution left running (R6)."""
    tx.run(
        "UPDATE node_executions SET crashes = crashes + 1 WHERE run_id = ? AND status = 'running'",
        run_id,
    )


# -- the journal ----------------------------------------------------------------------


def journal(tx: Tx, run_id: str, node_id: str | None = None) -> list[JournalEntry]:
    """A run's journal (or one node's) by node, execution and position."""
    where, params = "run_id = ?", [run_id]
    if node_id is not None:
        where, params = "run_id = ? AND node_id = ?", [run_id, node_id]
    return [
        JournalEntry(
            r["run_id"], r["node_id"], r["execution"], r["seq"], r["kind"], json.loads(r["value"])
        )
        for r in tx.all(
            f"SELECT run_id, node_id, execution, seq, kind, value FROM journal WHERE {where} "
            "ORDER BY node_id, execution, seq",
            *params,
        )
    ]


def journaled(tx: Tx, run_id: str, node_id: str, execution: int, seq: int) -> Row | None:
    """The ``seq``-th journaled value of an execution: its ``kind`` and ``value``
    (JSON text), for a replay to return unchanged (A6)."""
    return tx.one(
        "SELECT kind, value FROM journal WHERE run_id = ? AND node_id = ? "
        "AND execution = ? AND seq = ?",
        run_id,
        node_id,
        execution,
        seq,
    )


def write_journal(
    tx: Tx, run_id: str, node_id: str, execution: int, seq: int, *, kind: str, value: str
) -> None:
    """Journal a value (JSON text) at its position in the execution (A6)."""
    tx.run(
        "INSERT INTO journal (run_id, node_id, execution, seq, kind, value) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        run_id,
        node_id,
        execution,
        seq,
        kind,
        value,
    )


def copy_journal(tx: Tx, run_id: str, from_run: str, node_id: str, execution: int) -> None:
    """Copy an unfinished execution's journal to execution 1 of the linked run that
    continues it, so that the new execution replays it (N4)."""
    tx.run(
        "INSERT INTO journal (run_id, node_id, execution, seq, kind, value) "
        "SELECT ?, node_id, 1, seq, kind, value FROM journal "
        "WHERE run_id = ? AND node_id = ? AND execution = ?",
        run_id,
        from_run,
        node_id,
        execution,
    )


# -- plan versions (N3) -------------------------------------------------------------


def plan_versions(tx: Tx, run_id: str) -> list[Row]:
    """A run's plan changes by version: ``version``, ``steps`` (JSON text), ``digest``,
    the ``node_id``, ``execution`` and ``seq`` that made it, ``created_by``/``_at_us``."""
    return tx.all(
        "SELECT version, steps, digest, node_id, execution, seq, created_by, created_at_us "
        "FROM plan_versions WHERE run_id = ? ORDER BY version",
        run_id,
    )


def insert_version(
    tx: Tx,
    run_id: str,
    version: int,
    *,
    steps: str,
    digest: str,
    node_id: str,
    execution: int,
    seq: int,
    created_by: str,
) -> None:
    tx.run(
        "INSERT INTO plan_versions (run_id, version, steps, digest, node_id, execution, seq, "
        "created_by, created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        run_id,
        version,
        steps,
        digest,
        node_id,
        execution,
        seq,
        created_by,
        tx.now_us,
    )


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    return {
        "node_executions": [
            dict(r)
            for r in tx.all(
                "SELECT n.* FROM node_executions n JOIN runs r ON r.id = n.run_id "
                "WHERE r.mission_id = ? ORDER BY n.run_id, n.node_id, n.execution",
                mission_id,
            )
        ],
        "journal": [
            dict(r)
            for r in tx.all(
                "SELECT j.* FROM journal j JOIN runs r ON r.id = j.run_id "
                "WHERE r.mission_id = ? ORDER BY j.run_id, j.node_id, j.execution, j.seq",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    tx.copy("INSERT INTO node_executions", tables["node_executions"])
    tx.copy("INSERT INTO journal", tables["journal"])
