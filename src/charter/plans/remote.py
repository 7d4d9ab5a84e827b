"""A node whose code runs in a remote client (X1): its journal is kept here.

The client asks which execution of a node to run
(:func:`~charter.plans.runner.start_execution`: the same one after a crash, a
new one after a failure, the runner's own rule) and, when the node returns,
records its result as the runner does (N1: the result and its hash durable
before any consumer starts, fenced by the segment, F2). A completion sent
twice is answered as recorded; one that names another execution, or a
different result for a completed one, is refused.
"""

from __future__ import annotations

import json
from typing import Any

from charter.errors import StateError, UsageError
from charter.hashing import digest
from charter.plans import store as plans_store
from charter.plans.runner import complete_execution, start_execution
from charter.runs.ownership import Segment


def start(seg: Segment, node_id: str) -> int:
    """The execution of ``node_id`` the client runs now (fenced by ``seg``)."""
    return start_execution(seg, node_id)


def complete(seg: Segment, node_id: str, execution: int, result: Any) -> str:
    """Record ``result`` as execution ``execution`` of ``node_id``; its hash."""
    try:
        result_json = json.dumps(result, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a node's result must be plain JSON (it is recorded): {exc}") from None
    with seg.runtime.db.read() as tx:
        newest = plans_store.latest(tx, seg.run_id, node_id)
        done = plans_store.completed(tx, seg.run_id, node_id)
    if done is not None:
        if (done["execution"], done["result_hash"]) == (execution, digest(result_json)):
            return str(done["result_hash"])  # the same completion again
        raise StateError(
            f"node {node_id} of run {seg.run_id} is completed (execution {done['execution']}) "
            "with another result; a completed node is never completed again",
            node_id=node_id,
            execution=done["execution"],
        )
    if newest is None or (newest["execution"], newest["status"]) != (execution, "running"):
        raise StateError(
            f"node {node_id} of run {seg.run_id} has no running execution {execution} "
            f"(newest: {None if newest is None else dict(newest)}); start it first",
            node_id=node_id,
            execution=execution,
        )
    complete_execution(seg, node_id, execution, result_json)
    return digest(result_json)
