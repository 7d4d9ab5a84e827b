"""The engine's one observation seam: a plan run under an observer.

Used by :meth:`~charter.engine.executor.Executor.execute` only when the engine
has an observer (see :mod:`charter.telemetry`); without one nothing here runs.
Each node function is wrapped: it tells the observer when the node execution
starts and ends and, in between, which of the execution's attempts were
admitted and which settled meanwhile, read back from the store. The attempt
path is left as it is: no observer is consulted while an attempt is admitted,
sent or settled.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from charter.attempts.model import Attempt
from charter.attempts.store import list_attempts
from charter.errors import Blocked, WaitPending
from charter.plans.nodes import Context, Node, Plan
from charter.plans.runner import status_after
from charter.runs.ownership import Segment
from charter.telemetry import ObservedNode, ObservedRun, Observer


def tell(call: Callable[[], None]) -> None:
    """Call the observer; its failure is not the run's (telemetry changes nothing)."""
    with contextlib.suppress(Exception):
        call()


def status_of(exc: BaseException | None) -> str:
    if exc is None:
        return "completed"
    return "blocked" if isinstance(exc, Blocked | WaitPending) else "failed"


@contextlib.contextmanager
def observed_run(seg: Segment, observer: Observer, plan: Plan) -> Iterator[None]:
    """The run's segment executing ``plan``, between ``run_started`` and ``run_finished``."""
    run = ObservedRun(seg.run_id, seg.mission_id, seg.segment_id, seg.epoch, plan.ref or plan.name)
    tell(lambda: observer.run_started(run))
    try:
        yield
    except BaseException as exc:
        status = status_of(exc)
        tell(lambda: observer.run_finished(run, status))
        raise
    tell(lambda: observer.run_finished(run, "completed"))


def observed_plan(seg: Segment, observer: Observer, plan: Plan) -> Plan:
    """``plan`` with every node function wrapped (see the module's text)."""

    def wrap(node: Node) -> Node:
        return replace(node, fn=_observed_fn(seg, observer, node))

    return replace(
        plan,
        nodes=tuple(wrap(n) for n in plan.nodes),
        functions=tuple(wrap(n) for n in plan.functions),
    )


def _observed_fn(seg: Segment, observer: Observer, step: Node) -> Callable[..., Any]:
    fn = step.fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(ctx: Context, value: Any) -> Any:
            with _observed_node(seg, observer, ctx, step):
                return await fn(ctx, value)

        return run_async

    @functools.wraps(fn)
    def run(ctx: Context, value: Any) -> Any:
        with _observed_node(seg, observer, ctx, step):
            return fn(ctx, value)

    return run


@contextlib.contextmanager
def _observed_node(seg: Segment, observer: Observer, ctx: Context, step: Node) -> Iterator[None]:
    node = ObservedNode(ctx.run_id, ctx.node_id, ctx.execution)
    before = {a.id: a.status for a in _attempts(seg, node)}
    tell(lambda: observer.node_started(node))
    outcome: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        with contextlib.suppress(Exception):  # the store may be what failed
            for attempt in _attempts(seg, node):
                report(observer, attempt, before.get(attempt.id))
        # As the runner records it: a node that raised may be blocked, not failed (N6).
        tell(lambda: observer.node_finished(node, status_after(step, outcome)))


def report(observer: Observer, attempt: Attempt, was: Any = None) -> None:
    """Tell what became of ``attempt`` since it stood at ``was`` (``None``: unseen)."""
    if was is None:
        tell(lambda: observer.attempt_admitted(attempt))
    if attempt.status.settled and attempt.status != was:
        tell(lambda: observer.attempt_settled(attempt))


def told(observer: Observer | None, attempt: Attempt, was: Any) -> Attempt:
    """:func:`report` of a settlement made outside any run (reconcile, confirm,
    resolve), once it is committed: a node's execution reports only what
    settled while it ran. ``attempt`` is given back, for the caller to return."""
    if observer is not None:
        report(observer, attempt, was)
    return attempt


def _attempts(seg: Segment, node: ObservedNode) -> list[Attempt]:
    with seg.runtime.db.read() as tx:
        found = list_attempts(tx, run_id=node.run_id)
    return [a for a in found if (a.node_id, a.execution) == (node.node_id, node.execution)]
