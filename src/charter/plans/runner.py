"""Running a plan (N1, A6): a DAG of node executions, each checked and durable.

Completed nodes are skipped and their checked results, verified against their
stored hash, feed the next node; a node that blocks (an approval, an uncertain
attempt) leaves its execution durable for a resume; one that fails runs again
as a new execution up to its ``retries``; the run ends when the last node has
completed (or failed, with nothing in flight).

A node fails on a declared failure (N6): :class:`~charter.errors.NodeFailed`,
a check that refuses its result, or an effect the target settled as failed
(:class:`~charter.errors.AttemptFailed`, the world's answer). Any other
exception is a bug or a broken environment, not the world's answer: under a
retry policy it is retried like a failure, and without one the execution is
kept ``blocked`` with its error and the run needs intervention, so that once
the cause is fixed a resume replays the same execution from its journal.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import traceback
from collections.abc import Awaitable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, TypeVar

from charter.attempts.settlement import tally
from charter.attempts.store import count_unresolved
from charter.errors import (
    AttemptFailed,
    Blocked,
    CharterError,
    Fenced,
    NodeFailed,
    NonDeterminismError,
    StateError,
    StoreError,
    WaitPending,
)
from charter.hashing import digest
from charter.ledger.incidents import open_incident
from charter.plans import files, versions
from charter.plans import store as plans_store
from charter.plans.graph import Shape
from charter.plans.nodes import Context, Node, NodeFn, Plan
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.secret import scrub_text
from charter.storage import Row, Tx

T = TypeVar("T")


def call_node(fn: NodeFn, ctx: Context, value: Any) -> Any:
    """Run a node function, sync or async."""
    if inspect.iscoroutinefunction(fn):
        coro: Awaitable[Any] = fn(ctx, value)
        return _run(coro)
    result = fn(ctx, value)
    if inspect.isawaitable(result):
        return _run(result)
    return result


def _run(aw: Awaitable[T]) -> T:
    """An async node's value, on a loop of its own; asyncio is loaded only for
    plans that have such nodes (see :func:`charter.adapters.protocol.blocking`)."""
    import asyncio  # noqa: PLC0415 - loaded on first use

    return asyncio.run(_await(aw))


async def _await(aw: Awaitable[T]) -> T:
    """``aw``'s value. A node that blocks or is fenced inside a task group (an
    MCP client's, an HTTP/2 pool's) has its signal wrapped in a group by the
    time it leaves: the signal itself goes on, so the run is left as it says
    and not failed on an error it never had."""
    try:
        return await aw
    except BaseExceptionGroup as group:
        signal = _signal(group)
        if signal is None:
            raise
        raise signal from None


def _signal(group: BaseExceptionGroup[BaseException]) -> Blocked | Fenced | None:
    """The engine's control-flow signal inside ``group``, if it holds one."""
    for exc in group.exceptions:
        if isinstance(exc, Blocked | Fenced):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _signal(exc)
            if found is not None:
                return found
    return None


def execute(ex: Segment, plan: Plan, value: Any) -> Any:
    """Run ``plan``'s DAG from where it stands; complete the run (N1).

    Completed nodes are skipped and their checked results, verified against
    their stored hash, feed their consumers. Ready nodes run at once, at most
    ``plan.workers`` together. A node that blocks or fails lets the nodes
    already running finish; then the first such exception is raised (after
    a failure has failed the run). The run is completed when every node is;
    the result is the one sink's result, or ``{sink: result}`` of several.
    """
    done = _Schedule(ex, plan, value).run()
    finish(ex, RunStatus.COMPLETED)
    sinks = _shape(ex, plan).sinks
    return done[sinks[0]] if len(sinks) == 1 else {n: done[n] for n in sinks}


def _shape(ex: Segment, plan: Plan) -> Shape:
    """The current plan's shape: as declared, with the changes recorded so far (N3)."""
    with ex.runtime.db.read() as tx:
        return versions.current(tx, plan.shape, plan.name, plan.offered, ex.run_id)


class _Schedule:
    """One pass over a run's DAG: start ready nodes, collect what they return."""

    def __init__(self, ex: Segment, plan: Plan, value: Any) -> None:
        self.ex, self.plan, self.value = ex, plan, value
        self.done: dict[str, Any] = {}
        self.running: dict[Future[Any], str] = {}
        self.stop: BaseException | None = None
        self.failed: _NodeFailed | None = None
        #: Nodes that wait (W1), or block on an attempt: the others go on meanwhile.
        self.held: dict[str, Blocked] = {}

    def run(self) -> dict[str, Any]:
        with ThreadPoolExecutor(self.plan.workers, thread_name_prefix="charter-node") as pool:
            while True:
                if self.stop is None:
                    self._start_ready(pool)
                if not self.running:
                    break
                finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
                for f in finished:
                    self._collect(self.running.pop(f), f)
        if self.failed is not None:
            _give_up(self.ex, self.failed.node_id, self.failed.failed, self.failed.cause)
            raise self.failed.cause
        if self.stop is not None:
            raise self.stop
        if self.held:
            _waiting(self.ex, self.held)
            raise next(iter(self.held.values()))
        return self.done

    def _start_ready(self, pool: ThreadPoolExecutor) -> None:
        shape = _shape(self.ex, self.plan)
        busy = set(self.running.values())
        for name in shape.order:
            if name in self.done or name in busy or name in self.held:
                continue
            if not all(d in self.done for d in shape.deps[name]):
                continue
            try:
                found = _completed(self.ex, name)
            except BaseException as exc:  # a hash mismatch: no consumer starts (N1)
                self.stop = exc
                return
            if found is not _MISSING:
                self.done[name] = found
                continue
            node = self.plan.function(shape.fns[name])
            if name != node.name:
                node = replace(node, name=name)
            try:
                files.prepare(self.ex, name, shape.deps[name], node.uses)
            except Blocked as exc:  # its artifacts are not there, or not right (N2)
                self.held[name] = exc
                continue
            value = _input(shape, name, self.done, self.value)
            # In the caller's context (a copy each): its lanes of escrow (L10) reach the node.
            run = contextvars.copy_context().run
            self.running[pool.submit(run, _run_node, self.ex, node, value, self.plan)] = name

    def _collect(self, name: str, f: Future[Any]) -> None:
        try:
            self.done[name] = f.result()
        except _NodeFailed as exc:
            self.failed = self.failed or exc
            self.stop = self.stop or exc.cause
        except Blocked as exc:
            self.held[name] = exc
        except BaseException as exc:
            self.stop = self.stop or exc


def _waiting(ex: Segment, held: dict[str, Blocked]) -> None:
    """An active run whose nodes wait (W1) is ``waiting``: nothing runs until a
    resume; a run some node already marked (an approval, an uncertainty) keeps
    its status."""
    waits = sorted(n for n, b in held.items() if isinstance(b, WaitPending))
    if not waits:
        return
    with ex.runtime.db.transaction(gate=ex.mission_id) as tx:
        row = ex.own(tx)
        if row["status"] == RunStatus.ACTIVE.value:
            ex.set_status(tx, row, RunStatus.WAITING, f"node(s) {', '.join(waits)} wait")


def _input(shape: Shape, name: str, done: dict[str, Any], run_input: Any) -> Any:
    """What a node receives: its given input, else its dependencies' results."""
    if name in shape.inputs:
        return shape.inputs[name]
    deps = shape.deps[name]
    if not deps:
        return run_input
    if len(deps) == 1:
        return done[deps[0]]
    return {d: done[d] for d in deps}


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


def _run_node(ex: Segment, n: Node, value: Any, plan: Plan | None = None) -> Any:
    execution = start_execution(ex, n.name)
    while True:
        ctx = Context(ex, n.name, execution)
        ctx.plan = plan
        try:
            result = call_node(n.fn, ctx, value)
            if n.check is not None and not n.check(result):
                raise _CheckFailed(f"node {n.name} result failed its check")
            result_json = json.dumps(result, sort_keys=True, separators=(",", ":"))
        except Blocked:
            _blocked(ex, n.name, execution, None)
            raise
        except NonDeterminismError as exc:
            _set_node(ex, n.name, execution, "blocked", None)
            ex.mark(
                RunStatus.NEEDS_INTERVENTION, f"non-determinism in node {n.name}: {exc.message}"
            )
            raise
        except StoreError as exc:
            # The store failed under the node (an artifact's record, a journaled
            # value, a wait): not the node's failure to end the run with (A4).
            _blocked(ex, n.name, execution, f"the store failed in node {n.name}: {exc}")
            raise Blocked(exc.message, run_id=ex.run_id) from exc
        except Exception as exc:
            if _undeclared(n, exc):
                # A bug or a broken environment, and no retry policy (N6).
                raise _raised(ex, n.name, execution, exc) from exc
            error = describe(exc, excerpt=not isinstance(exc, _DECLARED))
            failed = _set_node(ex, n.name, execution, "failed", error)
            if failed <= n.retries:
                execution = start_execution(ex, n.name)
                continue
            raise _NodeFailed(n.name, failed, exc) from exc
        ex.runtime.crash("node.completed.before")
        complete_execution(ex, n.name, execution, result_json)
        ex.runtime.crash("node.completed.after")
        return json.loads(result_json)


def _blocked(ex: Segment, node_id: str, execution: int, intervene: str | None) -> None:
    """Best effort: the store may be what blocked the node (a settlement it
    refused); recovery finds a node left running just as well. ``intervene``:
    why the run needs a person."""
    with contextlib.suppress(CharterError):
        _set_node(ex, node_id, execution, "blocked", None)
        if intervene is not None:
            ex.mark(RunStatus.NEEDS_INTERVENTION, intervene)


def _raised(ex: Segment, node_id: str, execution: int, exc: Exception) -> Blocked:
    """N6: keep the execution ``blocked`` with its error and mark the run as
    needing intervention, in one fenced transaction; the :class:`Blocked` to
    raise. Best effort, as for any block: if the store refuses, recovery finds
    the execution left running and the run resumable just the same."""
    error = describe(exc)
    first = error.partition("\n")[0]
    reason = (
        f"node {node_id} raised {first} (execution {execution}); a bug or a broken "
        "environment, not the node's declared failure: fix the cause, then resume the run"
    )
    with contextlib.suppress(CharterError), ex.runtime.db.transaction(gate=ex.mission_id) as tx:
        _record(ex, tx, node_id, execution, status="blocked", error=error)
        ex.mark_in(tx, RunStatus.NEEDS_INTERVENTION, reason)
    return Blocked(reason, run_id=ex.run_id)


#: How much of an exception a node execution's record keeps (N6, A10).
MESSAGE_CHARS = 500
FRAMES = 6
FRAME_CHARS = 400


def describe(exc: BaseException, *, excerpt: bool = True) -> str:
    """``Type: message`` of a node's exception, then (with ``excerpt``) its last
    frames: bounded, and with every secret this process knows scrubbed (S3)."""
    message = scrub_text(str(exc), [])  # before it is cut: no part of a secret stays
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + f"... ({len(message)} characters)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if excerpt:
        frames = traceback.extract_tb(exc.__traceback__)
        while frames and frames[0].filename == __file__:
            frames.pop(0)  # the runner's own frames say nothing about the node
        if frames:
            shown = [f[:FRAME_CHARS] for f in traceback.format_list(frames[-FRAMES:])]
            skipped = (
                f" ({len(frames) - FRAMES} earlier frames left out)" if len(frames) > FRAMES else ""
            )
            text += f"\nTraceback, last frames{skipped}:\n" + "".join(shown).rstrip("\n")
    return scrub_text(text, [])


class _CheckFailed(Exception):
    pass


#: A node's declared failures (N6): what it raises to say its step failed, its
#: check refusing its result, an effect the target settled as failed.
_DECLARED = (NodeFailed, _CheckFailed, AttemptFailed)


def _undeclared(n: Node, exc: BaseException) -> bool:
    """N6: an exception of node code that neither the node declares as its
    failure nor a retry policy covers: it blocks the node, it fails nothing."""
    return isinstance(exc, Exception) and not n.retries and not isinstance(exc, _DECLARED)


def status_after(n: Node, exc: BaseException | None) -> str:
    """What an execution of ``n`` whose code ended with ``exc`` is recorded as:
    ``completed``; ``blocked`` (a wait, an uncertainty, the store, a replay that
    differs, an exception it does not declare, N6); else ``failed``. Telemetry
    reports node executions by it, so it says what the store says."""
    if exc is None:
        return "completed"
    if isinstance(exc, Blocked | NonDeterminismError | StoreError) or _undeclared(n, exc):
        return "blocked"
    return "failed"


class _NodeFailed(Exception):
    """A node's retries are exhausted; the schedule gives up once the others stop."""

    def __init__(self, node_id: str, failed: int, cause: Exception) -> None:
        super().__init__(node_id)
        self.node_id, self.failed, self.cause = node_id, failed, cause


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
    reason = f"node {node_id} failed {failed} time(s): {describe(exc, excerpt=False)}"
    try:
        finish(ex, RunStatus.FAILED, reason)
    except StateError:
        ex.mark(RunStatus.NEEDS_INTERVENTION, reason)


def start_execution(ex: Segment, node_id: str) -> int:
    """The node execution to run: the same one after a crash, a new one after failure
    (also a remote client's, X1: its node code runs elsewhere, its journal here)."""
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
        _record(ex, tx, node_id, execution, status=status, error=error)
        return plans_store.failures(tx, ex.run_id, node_id)


def _record(
    ex: Segment, tx: Tx, node_id: str, execution: int, *, status: str, error: str | None
) -> None:
    """A node execution's new status and error, fenced (F2) and audited."""
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


def complete_execution(ex: Segment, node_id: str, execution: int, result_json: str) -> None:
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
        tally(tx, seg.run_id)  # an ended run keeps none of its attempts in the open index
