"""The lineage of a node's executions: where the earlier tries of its effects live (A4, N4).

A node's context reads it once and hands it down with each effect
(:attr:`charter.attempts.model.Effect.lineage`), so the attempts room checks
an effect against all its earlier tries without reading the plans room's
tables itself.
"""

from __future__ import annotations

from charter.attempts import store as attempts_store
from charter.attempts.model import Lineage
from charter.errors import UsageError
from charter.plans import store as plans_store
from charter.runs.ownership import Segment
from charter.storage import Tx


def lineage(tx: Tx, run_id: str, node_id: str, execution: int) -> Lineage:
    """The node executions whose attempts are the same effects as ``execution``'s:
    this one and the earlier ones of the node, then, for a linked run, those of
    the ended run that its first execution continues."""
    out: Lineage = []
    run: str | None = run_id
    top = execution
    while run is not None:
        out.append((run, top))
        link = plans_store.inherited(tx, run, node_id)
        if link is None:
            break
        run, top = link
    return out


#: How far past the newest execution it knows of (the node's, its attempts', the
#: run's epoch) a caller may number a node's execution (a remote client, or
#: ``Executor.perform``): an effect's earlier tries are read execution by
#: execution, so this bounds the reads one admission makes.
EXECUTIONS_AHEAD = 1_000


def check_execution(seg: Segment, node_id: str, execution: int) -> None:
    """Refuse an execution number no caller could mean (A4): more than
    :data:`EXECUTIONS_AHEAD` past the newest one known. Unbounded, one request
    naming execution 1.7e12 held a server thread for hours (and one call of
    ``Executor.perform`` its thread)."""
    with seg.runtime.db.read() as tx:
        started = plans_store.latest(tx, seg.run_id, node_id)
        tried = attempts_store.newest_execution(tx, seg.run_id, node_id)
    newest = max(seg.epoch, tried, 0 if started is None else int(started["execution"]))
    bound = newest + EXECUTIONS_AHEAD
    if execution > bound:
        raise UsageError(
            f"execution {execution} of node {node_id!r} is more than {EXECUTIONS_AHEAD} past "
            f"the newest one known ({newest}); start the node to be given its execution",
            node_id=node_id,
            execution=execution,
            most=bound,
        )
