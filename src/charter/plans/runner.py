"""Running a plan (N1, A6): node executions in order, each checked and durable.

Completed nodes are skipped and their checked results, verified against their
stored hash, feed the next node; a node that blocks (an approval, an uncertain
attempt) leaves its execution durable for a resume; one that fails runs again
as a new execution up to its ``retries``; the run ends when the last node has
completed (or failed, with nothing in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from charter.attempts.store import count_unresolved
from charter.errors import Blocked, CharterError, NonDeterminismError, StateError
from charter.hashing import digest
from charter.ledger.incidents import open_incident
from charter.plans import store as plans_store
from charter.plans.nodes import Context, Node, NodeFn, Plan
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.storage import Row, Tx

T = TypeVar("T")


def call_node(fn: NodeFn, ctx: Context, value: Any) -> Any:
    """Run a node function, sync or async."""
    if inspect.iscoroutinefunction(fn):
        coro: Awaitable[Any] = fn(ctx, value)
        return asyncio.run(_await(coro))
    result = fn(ctx, value)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(aw: Awaitable[T]) -> T:
    return await aw


def execute(ex: Segment, plan: Plan, value: Any) -> Any:
    """Run ``plan``'s nodes in order from the first one not completed (N1).

    Completed nodes are skipped and their checked results, verified against
    their stored hash, feed the next node. The run is completed at the end.
    """
    for n in plan.nodes:
        done = _completed(ex, n.name)
        value = done if done is not _MISSING else _run_node(ex, n, value)
    finish(ex, RunStatus.COMPLETED)
    return value


_MISSING = object()


def _completed(ex: Segment, node_id: str) -> Any:
    with ex.runtime.db.transaction() as tx:
        row = plans_store.completed(tx, ex.run_id, node_id)
        if row is None:
            return _MISSING
        if digest(row["result"]) == row["result_hash"]:
            return json.loads(row["result"])
        # Keep the incident and the status (commit), then stop the consumer.
        open_incident(
            tx,
            ex.mission_id,
            "hash_mismatch",
            {"node_id": node_id, "execution": row["execution"]},
            actor=ex.principal,
            run_id=ex.run_id,
            epoch=ex.epoch,
        )
        ex.mark_in(tx, RunStatus.NEEDS_INTERVENTION, f"result of node {node_id} fails its hash")
    raise Blocked(f"the stored result of node {node_id} does not match its hash", run_id=ex.run_id)


def _run_node(ex: Segment, n: Node, value: Any) -> Any:
    execution = _start(ex, n.name)
    while True:
        ctx = Context(ex, n.name, execution)
        try:
            result = call_node(n.fn, ctx, value)
            if n.check is not None and not n.check(result):
                raise _CheckFailed(f"node {n.name} result failed its check")
            result_json = json.dumps(result, sort_keys=True, separators=(",", ":"))
        except Blocked:
            # Best effort: the store may be what blocked the node (a settlement
            # it refused); recovery finds a node left running just as well.
            with contextlib.suppress(CharterError):
                _set_node(ex, n.name, execution, "blocked", None)
            raise
        except NonDeterminismError as exc:
            _set_node(ex, n.name, execution, "blocked", None)
            ex.mark(
                RunStatus.NEEDS_INTERVENTION, f"non-determinism in node {n.name}: {exc.message}"
            )
            raise
        except Exception as exc:
            failed = _set_node(ex, n.name, execution, "failed", f"{type(exc).__name__}: {exc}")
            if failed <= n.retries:
                execution = _start(ex, n.name)
                continue
            _give_up(ex, n.name, failed, exc)
            raise
        ex.runtime.crash("node.completed.before")
        _complete(ex, n.name, execution, result_json)
        ex.runtime.crash("node.completed.after")
        return json.loads(result_json)


class _CheckFailed(Exception):
    pass


def inherit(tx: Tx, from_run: str, run_id: str) -> list[dict[str, Any]]:
    """Carry an ended run's node state into the linked run that follows it (N4).

    Each node's last execution in the old run becomes execution 1 of the new
    one: a completed execution with its checked result and hash, so the node
    is not run again; an unfinished one as ``blocked``, with its journal copied
    and a pointer to it, so that the new execution replays its settled
    attempts from their records instead of sending them again.
    """
    last: dict[str, Row] = {}
    for r in plans_store.executions(tx, from_run):
        last[r["node_id"]] = r
    carried = []
    for node_id, r in last.items():
        done = r["status"] == "completed"
        plans_store.inherit(
            tx,
            run_id,
            node_id,
            status="completed" if done else "blocked",
            result=r["result"] if done else None,
            result_hash=r["result_hash"] if done else None,
            completed_at_us=tx.now_us if done else None,
            from_run=from_run,
            from_execution=r["execution"],
        )
        if not done:
            plans_store.copy_journal(tx, run_id, from_run, node_id, r["execution"])
        carried.append(
            {"node_id": node_id, "from_execution": r["execution"], "status": r["status"]}
        )
    return carried


def _give_up(ex: Segment, node_id: str, failed: int, exc: Exception) -> None:
    """Retries exhausted: the run fails, or needs a person if effects are in flight."""
    reason = f"node {node_id} failed {failed} time(s): {type(exc).__name__}: {exc}"
    try:
        finish(ex, RunStatus.FAILED, reason)
    except StateError:
        ex.mark(RunStatus.NEEDS_INTERVENTION, reason)


def _start(ex: Segment, node_id: str) -> int:
    """The node execution to run: the same one after a crash, a new one after failure."""
    with ex.runtime.db.transaction() as tx:
        ex.own(tx)
        row = plans_store.latest(tx, ex.run_id, node_id)
        if row is not None and row["status"] in ("running", "blocked"):
            plans_store.resume(tx, ex.run_id, node_id, row["execution"])
            return int(row["execution"])
        execution = 1 if row is None else row["execution"] + 1
        plans_store.start(tx, ex.run_id, node_id, execution, ex.epoch)
        tx.audit(
            ex.mission_id,
            "node.started",
            f"{ex.run_id}/{node_id}",
            actor=ex.principal,
            segment=ex.segment_id,
            epoch=ex.epoch,
            after="running",
            payload={"execution": execution},
        )
        return execution


def _set_node(ex: Segment, node_id: str, execution: int, status: str, error: str | None) -> int:
    """Record a node execution's status; return how many executions have failed.

    Fenced like a completion (F2): an owner that lost the run changes nothing.
    """
    with ex.runtime.db.transaction() as tx:
        ex.own(tx)
        plans_store.set_status(tx, ex.run_id, node_id, execution, status=status, error=error)
        tx.audit(
            ex.mission_id,
            "node." + status,
            f"{ex.run_id}/{node_id}",
            actor=ex.principal,
            segment=ex.segment_id,
            epoch=ex.epoch,
            after=status,
            payload={"execution": execution, "error": error},
        )
        return plans_store.failures(tx, ex.run_id, node_id)


def _complete(ex: Segment, node_id: str, execution: int, result_json: str) -> None:
    """N1: the checked result and its hash are durable before any consumer starts (F2)."""
    with ex.runtime.db.transaction() as tx:
        ex.own(tx)
        h = digest(result_json)
        plans_store.complete(tx, ex.run_id, node_id, execution, result=result_json, result_hash=h)
        tx.audit(
            ex.mission_id,
            "node.completed",
            f"{ex.run_id}/{node_id}",
            actor=ex.principal,
            segment=ex.segment_id,
            epoch=ex.epoch,
            before="running",
            after="completed",
            payload={"execution": execution, "result_hash": h},
        )


def finish(seg: Segment, status: RunStatus, reason: str | None = None) -> None:
    """End the run (fenced); refused while any attempt of the run is unresolved."""
    if not status.terminal:
        raise StateError(f"{status.value} is not a terminal status")
    with seg.runtime.db.transaction(gate=seg.mission_id) as tx:
        row = seg.own(tx)
        unresolved = count_unresolved(tx, seg.run_id)
        if unresolved:
            raise StateError(
                f"run {seg.run_id} has {unresolved} unresolved attempt(s); settle or "
                "resolve them before ending the run",
                unresolved=unresolved,
            )
        seg.set_status(tx, row, status, reason or status.value)
