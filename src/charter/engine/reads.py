"""What the engine lets anyone read: missions and their contracts, runs, attempts
and their evidence, approvals, incidents, node executions and the journal, the
ledger and the audit chains.

Mixed into :class:`~charter.engine.engine.Engine`. Each read is one read
transaction and changes nothing, so reading never needs a principal; what
people decide is in :mod:`~charter.engine.decisions`.
"""

from __future__ import annotations

import json
from typing import Any

from charter import ledger
from charter.attempts import store as attempts_store
from charter.attempts.model import Attempt
from charter.audit import chain as audit
from charter.audit import store as audit_store
from charter.audit.chain import Verification
from charter.contracts import missions
from charter.contracts.authority import Authority
from charter.contracts.contract import Contract
from charter.contracts.model import Mission
from charter.errors import UsageError
from charter.hashing import ENGINE_CHAIN
from charter.ledger import incidents as incidents_mod
from charter.ledger import store as ledger_store
from charter.plans import store as node_reads
from charter.plans.journal import JournalEntry, NodeExecution
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import Run, RunStatus
from charter.storage import Database
from charter.storage.paging import Position
from charter.waits import approvals as approvals_mod
from charter.waits.approvals import Approval


class Reads:
    """The read-only views of a store (see the module docstring)."""

    _db: Database
    _authority: Authority

    # -- missions and contracts ---------------------------------------------------
    def contract(self, mission_id: str, version: int | None = None) -> Contract:
        with self._db.read() as tx:
            v = version if version is not None else missions.load(tx, mission_id).contract_version
            return self._authority.contract(tx, mission_id, v)

    def mission(self, mission_id: str) -> Mission:
        with self._db.read() as tx:
            return missions.load(tx, mission_id)

    def missions(self, *, limit: int | None = None, after: Position | None = None) -> list[Mission]:
        """Missions by creation; paged by ``(created_at_us, id)``."""
        with self._db.read() as tx:
            return missions.list_missions(tx, limit=limit, after=after)

    # -- runs and attempts -----------------------------------------------------------
    def run(self, run_id: str) -> Run:
        with self._db.read() as tx:
            return runs.load(tx, run_id)

    def run_input(self, run_id: str) -> Any:
        """The input the run was started with (decoded from its JSON), or ``None``
        when it was started without one: what its first nodes read, shown beside
        their outputs when an operator reads what the run did. An unknown run is
        :class:`~charter.errors.NotFound`."""
        with self._db.read() as tx:
            runs.load(tx, run_id)
            row = run_store.recorded_plan(tx, run_id)
        text = None if row is None else row["input"]
        return None if text is None else json.loads(text)

    def runs(
        self,
        mission_id: str | None = None,
        *,
        status: RunStatus | None = None,
        limit: int | None = None,
        after: Position | None = None,
    ) -> list[Run]:
        """Runs by creation, of one ``status`` if given; paged by ``(created_at_us,
        id)``; an unknown mission is :class:`~charter.errors.NotFound`."""
        with self._db.read() as tx:
            if mission_id is not None:
                missions.load(tx, mission_id)
            return run_store.list_runs(tx, mission_id, status=status, limit=limit, after=after)

    def get_attempt(self, attempt_id: str) -> Attempt:
        """The attempt as recorded. ``attempt`` is what a node does
        (``ctx.attempt``: perform an effect); reading one back is ``get_attempt``."""
        with self._db.read() as tx:
            return attempts_store.load(tx, attempt_id)

    def attempts(
        self,
        *,
        run_id: str | None = None,
        mission_id: str | None = None,
        unresolved: bool = False,
        limit: int | None = None,
        after: Position | None = None,
    ) -> list[Attempt]:
        """Attempts by preparation; paged by ``(prepared_at_us, id)``; an unknown run
        or mission is :class:`~charter.errors.NotFound`."""
        with self._db.read() as tx:
            if run_id is not None:
                runs.load(tx, run_id)
            if mission_id is not None:
                missions.load(tx, mission_id)
            return attempts_store.list_attempts(
                tx,
                run_id=run_id,
                mission_id=mission_id,
                unresolved=unresolved,
                limit=limit,
                after=after,
            )

    def evidence(self, attempt_id: str) -> list[dict[str, Any]]:
        """Everything on record about an attempt's outcome, as stored, oldest first."""
        with self._db.read() as tx:
            attempts_store.load(tx, attempt_id)
            return [dict(r) for r in attempts_store.evidence_rows(tx, attempt_id)]

    # -- approvals (W2) and incidents (L5, L7) -----------------------------------------
    def approvals(
        self,
        *,
        run_id: str | None = None,
        pending: bool = False,
        limit: int | None = None,
        after: Position | None = None,
    ) -> list[Approval]:
        """Approvals by request time; a page of ``limit`` after the ``(requested_at_us,
        id)`` position ``after`` (see :mod:`charter.storage.paging`). An unknown run
        is :class:`~charter.errors.NotFound`, not an empty list."""
        with self._db.read() as tx:
            if run_id is not None:
                runs.load(tx, run_id)
            return approvals_mod.list_approvals(
                tx, run_id=run_id, pending=pending, limit=limit, after=after
            )

    def incidents(
        self,
        mission_id: str,
        *,
        open_only: bool = False,
        limit: int | None = None,
        after: Position | None = None,
    ) -> list[dict[str, Any]]:
        """A mission's incidents by opening time; paged by ``(opened_at_us, id)``."""
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            return incidents_mod.list_incidents(
                tx, mission_id, open_only=open_only, limit=limit, after=after
            )

    # -- nodes and their journal (N1, A6) ----------------------------------------------
    def node_executions(self, run_id: str) -> list[NodeExecution]:
        """A run's node executions by node, then execution: what ran, how it ended,
        each checked result with its hash (N1); an unknown run is
        :class:`~charter.errors.NotFound`. Lets an operator (or a test) see a run's
        progress on any store without reading its tables."""
        with self._db.read() as tx:
            runs.load(tx, run_id)
            return node_reads.node_executions(tx, run_id)

    def journal(self, run_id: str, node_id: str | None = None) -> list[JournalEntry]:
        """The nondeterministic values a run's nodes (or one node) recorded, by node,
        execution and position: what a replay returns instead of asking again (A6).
        An unknown run is :class:`~charter.errors.NotFound`; a node that journaled
        nothing has an empty journal."""
        with self._db.read() as tx:
            runs.load(tx, run_id)
            return node_reads.journal(tx, run_id, node_id)

    # -- ledger (L0-L2) ---------------------------------------------------------------
    def balances(self, mission_id: str) -> dict[str, ledger.Balance]:
        """Cached balances per unit."""
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            return ledger.cached(tx, mission_id)

    def ledger_entries(
        self, mission_id: str, *, unit: str | None = None, newest: int | None = None
    ) -> list[dict[str, Any]]:
        """The mission's ledger entries (of one ``unit``) in the order they were
        written; with ``newest``, only that many of the latest, so a chart of a
        long mission reads a bounded window."""
        if newest is not None and (
            isinstance(newest, bool) or not isinstance(newest, int) or newest < 1
        ):
            raise UsageError(f"newest is how many entries to read, 1 or more; got {newest!r}")
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            return ledger_store.entries(tx, mission_id, unit=unit, newest=newest)

    def check_ledger(self, mission_id: str) -> list[str]:
        """Problems with L0/L1/L2 for the mission; empty when the ledger holds."""
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            return ledger.problems(tx, mission_id)

    # -- audit (S1) ---------------------------------------------------------------------
    def verify_audit(self, mission_id: str | None = None) -> list[Verification]:
        """Check every chain (or one mission's) end to end against the head on its
        row, and report the first break of each; memory does not grow with a chain."""
        with self._db.read() as tx:
            if mission_id is None:
                return [audit.verify(tx, chain) for chain in audit.chains(tx)]
            if mission_id != ENGINE_CHAIN:
                missions.load(tx, mission_id)
            return [audit.verify(tx, mission_id)]

    def audit_events(
        self, mission_id: str, *, before: int | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """A chain's events in order (a mission's, or the engine's own, ``"engine"``).
        With ``limit``, only the newest ``limit`` before ``seq`` ``before``: a page of
        the mission's timeline, read on the chain's key, so a page costs the same
        on a chain of any length (:meth:`timeline` is one run's)."""
        for name, value in (("limit", limit), ("before", before)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise UsageError(f"{name} is a whole number, 1 or more; got {value!r}")
        with self._db.read() as tx:
            return audit_store.all_events(tx, mission_id, before=before, limit=limit)
