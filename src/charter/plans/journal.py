"""What a run's nodes recorded, for reading: node executions and the journal (N1, A6).

A node execution is one try of one node in one run: its status, its checked
result and that result's hash (N1), and how often it crashed its process
(R6). The journal holds, per execution and in order, the nondeterministic
values a node asked for (``ctx.now()``, ``ctx.random()``, ``ctx.uuid()``), which
a replay returns unchanged (A6). These are read-only views for operators and
tests, on any store; the engine writes both tables itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from charter.storage import Row, Tx


@dataclass(frozen=True)
class NodeExecution:
    """One execution of one node of a run, as recorded.

    ``status`` is ``running`` (started, or its process died in it), ``blocked``
    (waiting for a decision, an unresolved attempt or a person), ``failed`` or
    ``completed``. Only a completed execution has a ``result`` (decoded from
    JSON) and its ``result_hash``, the SHA-256 of the stored JSON text that a
    consumer checks before it starts (N1). ``crashes`` counts the recoveries
    that found it running (R6). An execution carried over into a linked run
    names the run and execution it continues in ``inherited_run`` and
    ``inherited_execution`` (N4).
    """

    run_id: str
    node_id: str
    execution: int
    status: str
    result: Any
    result_hash: str | None
    error: str | None
    started_epoch: int
    crashes: int
    started_at_us: int
    completed_at_us: int | None
    inherited_run: str | None
    inherited_execution: int | None


@dataclass(frozen=True)
class JournalEntry:
    """One journaled value: the ``seq``-th nondeterministic value an execution asked
    for, of ``kind`` ``now`` (microseconds), ``random`` or ``uuid``; ``value`` is
    decoded from JSON."""

    run_id: str
    node_id: str
    execution: int
    seq: int
    kind: str
    value: Any


def _node_execution(r: Row) -> NodeExecution:
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
        _node_execution(r)
        for r in tx.all(
            "SELECT run_id, node_id, execution, status, result, result_hash, error, "
            "started_epoch, crashes, started_at_us, completed_at_us, inherited_run, "
            "inherited_execution FROM node_executions WHERE run_id = ? "
            "ORDER BY node_id, execution",
            run_id,
        )
    ]


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
