"""What people and services do to a graph run: answer, signal, look (W1, N2, N3).

These are the engine's methods for the waits beside approvals, the run's
artifacts and its plan versions, kept here so the engine's own module stays
readable; :class:`~charter.engine.engine.Engine` offers them as its own.
Every decision takes an authenticated principal and is checked against the
mission's current contract; a refusal is audited and changes nothing else.
"""

from __future__ import annotations

from typing import Any

from charter.contracts.principals import Principal, Right
from charter.runs import run as runs
from charter.runs.run import RunStatus
from charter.runtime import Runtime
from charter.storage import Tx
from charter.waits import pending
from charter.waits import store as waits_store
from charter.waits.model import Wait


class GraphOperations:
    """The engine's operations on waits, artifacts and plan versions."""

    _runtime: Runtime

    # -- waits (W1) -------------------------------------------------------------------
    def answer(self, run_id: str, key: str, value: Any, *, by: Principal) -> Wait:
        """Answer a node's question; ``by`` needs ``approve`` on ``input.KEY``.

        The answer must have the type the node asked for. The run becomes due:
        a resume (``charter wait``) replays the node, which reads the answer.
        """
        db = self._runtime.db
        with db.transaction() as tx:
            w = pending.load(tx, run_id, key)
            self._runtime.authority.authorize(
                tx, by, w.mission_id, Right.APPROVE, f"input.{key}", entity=w.id
            )
            pending.answer(tx, w, value, by=by.name)
            return pending.load(tx, run_id, key)

    def signal(self, run_id: str, event: str, payload: Any = None, *, by: Principal) -> list[str]:
        """Deliver a named event to the run's waits on it; ``by`` needs ``run`` on
        ``signal.EVENT``. Returns the IDs of the waits it satisfied."""
        db = self._runtime.db
        with db.transaction() as tx:
            run = runs.load(tx, run_id)
            self._runtime.authority.authorize(
                tx, by, run.mission_id, Right.RUN, f"signal.{event}", entity=run_id
            )
            return pending.signal(tx, run_id, event, payload, by=by.name)

    def waits(self, run_id: str | None = None, *, open_only: bool = False) -> list[Wait]:
        """Waits by creation (``open_only``: not yet read by their node)."""
        with self._runtime.db.read() as tx:
            if run_id is not None:
                runs.load(tx, run_id)
            return waits_store.waits(tx, run_id=run_id, open_only=open_only)

    def due(self) -> list[dict[str, Any]]:
        """Waiting runs and when each is due: ``{"run_id", "due_at_us", "ready"}``,
        soonest first. ``ready``: an answer, a signal or a timer has arrived by
        the store's clock, so a resume makes progress now."""
        with self._runtime.db.read() as tx:
            return _due(tx)


def _due(tx: Tx) -> list[dict[str, Any]]:
    out = []
    for r in waits_store.due_runs(tx):
        run = runs.load(tx, r["run_id"])
        if run.status is not RunStatus.WAITING:
            continue
        out.append({"run_id": run.id, "due_at_us": r["at_us"], "ready": r["at_us"] <= tx.now_us})
    return out
