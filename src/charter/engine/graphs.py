"""What people and services do to a graph run: answer, signal, look (W1, N2, N3).

These are the engine's methods for the waits beside approvals, the run's
artifacts and its plan versions, kept here so the engine's own module stays
readable; :class:`~charter.engine.engine.Engine` offers them as its own.
Every decision takes an authenticated principal and is checked against the
mission's current contract; a refusal is audited and changes nothing else.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from charter.artifacts import store as artifacts_store
from charter.artifacts.objects import LocalObjects
from charter.contracts.principals import Principal, Right
from charter.errors import ArtifactError, NotFound
from charter.plans import store as plans_store
from charter.queue import store as run_queue
from charter.runs import run as runs
from charter.runs.run import RunStatus
from charter.runtime import Runtime
from charter.storage import Tx
from charter.waits import pending
from charter.waits import store as waits_store
from charter.waits.model import Wait

_VERSION_KEYS = ("version", "digest", "node_id", "execution", "seq", "created_by", "created_at_us")


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
            run_queue.wake(tx, run_id)  # K2: an answered input
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
            satisfied = pending.signal(tx, run_id, event, payload, by=by.name)
            if satisfied:
                run_queue.wake(tx, run_id)  # K2: a signal the run waits for
            return satisfied

    def waits(self, run_id: str | None = None, *, open_only: bool = False) -> list[Wait]:
        """Waits by creation (``open_only``: not yet read by their node)."""
        with self._runtime.db.read() as tx:
            if run_id is not None:
                runs.load(tx, run_id)
            return waits_store.waits(tx, run_id=run_id, open_only=open_only)

    def plan_versions(self, run_id: str) -> list[dict[str, Any]]:
        """The run's plan changes (N3), version 2 on: the steps each added and the
        node execution that made it (version 1 is the plan the run started with)."""
        with self._runtime.db.read() as tx:
            runs.load(tx, run_id)
            return [
                {**{k: r[k] for k in _VERSION_KEYS}, "steps": json.loads(r["steps"])}
                for r in plans_store.plan_versions(tx, run_id)
            ]

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


class ArtifactOperations:
    """The engine's operations on a run's artifacts (N2)."""

    _runtime: Runtime

    def artifacts(self, run_id: str) -> list[dict[str, Any]]:
        """A run's artifacts by name: who saved them, their hash and size."""
        with self._runtime.db.read() as tx:
            runs.load(tx, run_id)
            return [artifacts_store.to_dict(r) for r in artifacts_store.of_run(tx, run_id)]

    def verify_artifacts(self, run_id: str) -> list[dict[str, Any]]:
        """Each artifact of the run with ``ok``: present in the store and hashing to
        its recorded SHA-256 (streamed), or ``problem`` saying what is wrong."""
        store = LocalObjects(self._runtime.config.artifacts)
        out = []
        for a in self.artifacts(run_id):
            try:
                ok, problem = store.verify(a["sha256"]), "fails its hash"
            except ArtifactError as exc:
                ok, problem = False, exc.message
            out.append({**a, "ok": ok, **({} if ok else {"problem": problem})})
        return out

    def fetch_artifact(
        self, run_id: str, name: str, dest: str | Path, *, by: Principal
    ) -> dict[str, Any]:
        """Copy an artifact to ``dest`` (a new file), verified while copied; ``by``
        needs ``consume`` on ``artifact.NAME`` in the run's mission."""
        with self._runtime.db.transaction() as tx:
            run = runs.load(tx, run_id)
            self._runtime.authority.authorize(
                tx, by, run.mission_id, Right.CONSUME, f"artifact.{name}", entity=run_id
            )
            row = artifacts_store.artifact(tx, run_id, name)
        if row is None:
            raise NotFound(f"run {run_id} has no artifact {name!r}", run_id=run_id, name=name)
        store = LocalObjects(self._runtime.config.artifacts)
        h = hashlib.sha256()
        with Path(dest).open("xb") as out:
            for chunk in store.chunks(row["sha256"]):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != row["sha256"]:
            Path(dest).unlink()
            raise ArtifactError(
                f"artifact {name!r} of run {run_id} fails its hash; nothing was fetched",
                name=name,
                mismatch=True,
            )
        return artifacts_store.to_dict(row)
