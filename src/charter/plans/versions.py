"""Plan changes at run time (N3): a running node adds nodes and edges.

The plan a run starts with is version 1. A node that decides its next steps
calls ``ctx.extend(Step(...), ...)``: the change is checked whole against the
current plan (an id taken, an unknown dependency, a cycle, a function the
plan does not offer: :class:`~charter.errors.PlanError`, nothing recorded),
then recorded as the next version, at the node execution's journal position,
with its audit event. A replay after a crash finds the change it made and
makes no new version; a replay that asks for another change there is a
non-determinism error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from charter.errors import NonDeterminismError
from charter.hashing import digest
from charter.plans import store as plans_store
from charter.plans.graph import Shape, Step
from charter.runs.ownership import Segment
from charter.storage import Row, Tx


def current(tx: Tx, base: Shape, name: str, offered: set[str], run_id: str) -> Shape:
    """The plan's shape as the run's recorded changes made it (``base``: as
    declared; ``offered``: the node functions the plan offers)."""
    return _apply(base, name, offered, plans_store.plan_versions(tx, run_id))


def _apply(shape: Shape, name: str, offered: set[str], rows: list[Row]) -> Shape:
    for r in rows:
        steps = [Step.from_dict(d) for d in json.loads(r["steps"])]
        shape = shape.extended(name, steps, offered)
    return shape


def extend(
    ex: Segment,
    base: Shape,
    *,
    name: str,
    offered: set[str],
    at: tuple[str, int, int],
    steps: Sequence[Step],
) -> int:
    """Record ``steps`` as the run's next plan version; return the version (N3).

    ``at`` is the journal position of the change: node, execution, sequence.
    """
    node_id, execution, seq = at
    text = json.dumps([s.to_dict() for s in steps], sort_keys=True, separators=(",", ":"))
    h = digest(text)
    with ex.runtime.db.transaction(gate=ex.mission_id) as tx:
        ex.own(tx)
        rows = plans_store.plan_versions(tx, ex.run_id)
        for r in rows:
            if (r["node_id"], r["execution"], r["seq"]) == (node_id, execution, seq):
                if r["digest"] != h:
                    raise NonDeterminismError(
                        f"node {node_id} execution {execution} changed the plan at journal "
                        f"position {seq} differently from the recorded version {r['version']}",
                        version=r["version"],
                    )
                return int(r["version"])
        _apply(base, name, offered, rows).extended(name, steps, offered)  # refused, unrecorded
        version = len(rows) + 2  # version 1 is the plan the run started with
        plans_store.insert_version(
            tx,
            ex.run_id,
            version,
            steps=text,
            digest=h,
            node_id=node_id,
            execution=execution,
            seq=seq,
            created_by=ex.principal,
        )
        tx.audit(
            ex.mission_id,
            "plan.versioned",
            ex.run_id,
            actor=ex.principal,
            segment=ex.segment_id,
            epoch=ex.epoch,
            before=str(version - 1),
            after=str(version),
            payload={
                "node_id": node_id,
                "execution": execution,
                "digest": h,
                "steps": json.loads(text),
            },
        )
        return version
