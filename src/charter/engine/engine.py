"""The engine: one store, one configuration, no global state.

``Engine.open()`` opens (and migrates) the store, and every public operation
is a method on the instance. Decisions by people — approvals, limit raises,
incident closures, stops — take an authenticated :class:`Principal` (P1) and
are checked against the mission's *current* contract; refusals are audited.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from charter import ledger
from charter.amounts import is_amount
from charter.attempts import settlement
from charter.attempts import store as attempts_store
from charter.attempts.model import Attempt
from charter.audit import chain as audit
from charter.audit import store as audit_store
from charter.audit.chain import Verification
from charter.clock import Clock, SystemClock
from charter.config import EngineConfig
from charter.contracts import missions
from charter.contracts.authority import Authority, refuse_own_approval
from charter.contracts.contract import Contract
from charter.contracts.model import Mission
from charter.contracts.principals import Authenticator, Principal, Right
from charter.crashpoints import CrashHook
from charter.engine.coordinator import Coordinator
from charter.engine.executor import Executor
from charter.engine.graphs import ArtifactOperations, GraphOperations
from charter.engine.overview import Overview
from charter.engine.signins import SignIns
from charter.engine.snapshots import Snapshots
from charter.errors import (
    AuthenticationError,
    ContractError,
    RunTerminal,
    StateError,
    UsageError,
)
from charter.hashing import ENGINE_CHAIN, canonical
from charter.ids import IdFactory, check_text
from charter.ledger import incidents as incidents_mod
from charter.ledger import store as ledger_store
from charter.plans import store as node_reads
from charter.plans.journal import JournalEntry, NodeExecution
from charter.plans.nodes import Plan
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import Run, RunStatus
from charter.runtime import Runtime
from charter.storage import Database, Tx, open_database
from charter.storage.paging import Position
from charter.telemetry import Observer
from charter.waits import approvals as approvals_mod
from charter.waits.approvals import Approval, ApprovalStatus


class Engine(GraphOperations, ArtifactOperations, Overview, SignIns, Snapshots):
    """A Charter engine bound to one store (its operator reads: :class:`Overview`)."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        clock: Clock,
        crash_hook: CrashHook | None,
        rng: random.Random | None = None,
        *,
        observer: Observer | None = None,
    ) -> None:
        self._db = db
        self.config = config
        self.clock = clock
        self._authority = Authority(config.credentials)
        self._runtime = Runtime(
            db,
            config,
            clock,
            self._authority,
            rng or random.SystemRandom(),
            crash_hook,
            observer,
        )
        self._coordinator: Coordinator | None = None
        self._sign_heads()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        config: EngineConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        crash_hook: CrashHook | None = None,
        store_clock: Clock | None = None,
        create: bool = True,
        observer: Observer | None = None,
    ) -> Engine:
        """Open the store at ``url`` (default: ``./.charter/charter.db``).

        A store that does not exist yet is created, unless ``create=False``: then
        it is refused with :class:`~charter.errors.StoreNotFound` and nothing is
        made (tools that only look at a store, like the ``charter`` command).

        ``clock``, ``rng`` and ``crash_hook`` are the test seams: a
        :class:`~charter.clock.ManualClock`, a seeded ``random.Random`` and a
        hook called at every durable boundary (see :mod:`charter.testing`).
        ``clock`` is this process's clock. The store's clock, which leases and
        deadlines are measured by (F1), is the server's on PostgreSQL and this
        process's on SQLite; a test simulating several machines injects it as
        ``store_clock`` (with a skewed ``clock`` per worker).

        ``observer`` is told of runs, nodes and attempts as they pass (see
        :mod:`charter.telemetry`; OpenTelemetry: :mod:`charter.integrations.otel`).
        """
        config = config or EngineConfig()
        clock = clock or SystemClock()
        ids = IdFactory(clock, rng)
        Authenticator(config.credentials)  # refuse bad credentials before opening anything
        db = open_database(
            url if url is not None else config.store,
            clock=store_clock or clock,
            ids=ids,
            busy_timeout=config.busy_timeout_seconds,
            create=create,
        )
        db.on_commit = crash_hook
        return cls(db, config, clock, crash_hook, rng, observer=observer)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def coordinator(self) -> Coordinator:
        """The recovery API: ``recover``, ``reconcile``, ``resolve``, ``resume``."""
        if self._coordinator is None:
            self._coordinator = Coordinator(self._runtime)
        return self._coordinator

    # -- identity (P1) ----------------------------------------------------------
    def authenticate(self, credential: str, *, audit: bool = True) -> Principal:
        """The principal a ``NAME:SECRET`` credential proves; a refusal is audited,
        unless ``audit`` is false: a server counts refusals and records the counts
        (P4, :meth:`record_refusals`)."""
        try:
            return self._authority.authenticator.authenticate(credential)
        except AuthenticationError as exc:
            who = self._authority.claimed(exc, self.config.credentials)
            if "principal" in exc.details:
                exc.details["principal"] = who
            if not audit:
                raise
            with self._db.transaction() as tx:
                raise self._authority.refused_identity(
                    tx, exc, who, reason="bad credential"
                ) from None

    # -- missions and contracts ---------------------------------------------------
    def create_mission(
        self, contract: Contract | Mapping[str, Any], *, by: Principal, name: str = ""
    ) -> str:
        """Record a mission with its first contract version; fund its allowance."""
        check_text("mission name", name)  # A10: text as given, or refused
        parsed = Contract.validate(contract)
        with self._db.transaction() as tx:
            self._authority.vouch(tx, by)
            if by.name not in parsed.principals:
                raise ContractError(
                    f"the creator {by.name!r} must be one of the contract's principals",
                    field="principals",
                )
            return missions.create(tx, parsed, name=name or parsed.objective[:60], by=by.name)

    def contract(self, mission_id: str, version: int | None = None) -> Contract:
        with self._db.read() as tx:
            v = version if version is not None else missions.load(tx, mission_id).contract_version
            return self._authority.contract(tx, mission_id, v)

    def amend_contract(
        self,
        mission_id: str,
        contract: Contract | Mapping[str, Any],
        *,
        by: Principal,
        reason: str,
    ) -> int:
        """A new contract version (e.g. a revoked right); see :func:`missions.amend`
        for who may make which change (P2)."""
        check_text("mission id", mission_id)
        check_text("reason", reason)
        parsed = Contract.validate(contract)
        with self._db.transaction() as tx:
            self._authority.vouch(tx, by)
            tx.lock_mission(mission_id)  # P2 is checked against the version it replaces
            mission = missions.load(tx, mission_id)
            current = self._authority.contract(tx, mission_id, mission.contract_version)
            return missions.amend(tx, mission, current, parsed, by=by.name, reason=reason)

    def raise_limit(self, mission_id: str, unit: str, limit: int, *, by: Principal) -> int:
        """Raise an allowance limit (a new contract version, L7); needs ``raise_limit``."""
        check_text("mission id", mission_id)
        check_text("unit", unit)
        if not is_amount(limit):
            raise ContractError(
                f"limit must be an integer in [0, 2**63 - 1] in {unit}'s smallest step, "
                f"got {limit!r}",
                field=f"allowance.{unit}",
            )
        with self._db.transaction() as tx:
            current = self._authority.authorize(
                tx, by, mission_id, Right.RAISE_LIMIT, entity=mission_id
            )
            old = current.allowance.get(unit)
            if old is None:
                raise ContractError(
                    f"mission {mission_id} has no allowance in unit {unit!r}", field="allowance"
                )
            if limit <= old:
                raise ContractError(
                    f"{unit} limit {limit} is not above the current {old}; raise_limit only raises",
                    field="allowance",
                )
            version = missions.add_version(
                tx,
                mission_id,
                current.with_limit(unit, limit),
                reason=f"raise {unit} limit {old} -> {limit}",
                by=by.name,
                previous=current,
            )
            self._unpause(tx, mission_id, by.name)
            return version

    def _unpause(self, tx: Tx, mission_id: str, actor: str) -> None:
        """Paused runs become active again once nothing keeps the mission paused (L7)."""
        if ledger_store.any_open(tx, mission_id):
            return
        if ledger_store.overdrawn(tx, mission_id):
            return
        for run in run_store.list_runs(tx, mission_id):
            if run.status is RunStatus.PAUSED:
                runs.set_status(tx, run, RunStatus.ACTIVE, "unpaused", actor=actor)

    # -- runs ----------------------------------------------------------------------
    def start_run(
        self,
        mission_id: str,
        *,
        by: Principal,
        segment_id: str,
        plan: Plan | None = None,
        input: Any = None,
    ) -> Executor:
        """Start a run owned by a first segment (epoch 1); ``by`` needs a ``run`` grant.

        ``plan`` (with its ``ref``) and ``input`` are recorded so that a fresh
        process can resume the run; run it with ``executor.execute(plan)``.
        """
        check_text("mission id", mission_id)
        check_text("segment id", segment_id)
        input_json = None if input is None else canonical(input)
        with self._db.transaction() as tx:
            self._authority.authorize_run(tx, by, mission_id)
            run_id, expires, claim = runs.insert(
                tx,
                lease_seconds=self.config.lease_seconds,
                mission_id=mission_id,
                principal=by.name,
                segment_id=segment_id,
                plan=None if plan is None else (plan.ref or plan.name),
                input_json=input_json,
                linked_from=None,
            )
            tx.audit(
                mission_id,
                "run.started",
                run_id,
                actor=by.name,
                segment=segment_id,
                epoch=1,
                after="active",
                payload={"lease_expires_us": expires},
            )
        return Executor(
            self._runtime,
            run_id=run_id,
            mission_id=mission_id,
            segment_id=segment_id,
            epoch=1,
            principal=by.name,
            lease_expires_us=expires,
            claim=claim,
        )

    def new_linked_run(
        self,
        from_run: str,
        *,
        reviewed_by: Principal,
        segment_id: str,
        plan: Plan | None = None,
        input: Any = None,
    ) -> Executor:
        """Follow a terminal run with a new one, reviewed by a principal with ``link`` (N4).

        The ended run is never reopened. The new run belongs to the same mission,
        so it draws on the same allowance, and runs as the same principal under
        the current contract. It carries on from where the old run ended, so
        nothing settled is performed again: nodes the old run completed are not
        run (their checked results are reused), and each node it left unfinished
        continues its last execution (settled attempts replay from their records,
        journaled values are the same). ``plan`` and ``input`` default to the
        old run's; a reviewed fix goes in ``plan``.
        """
        check_text("run id", from_run)
        check_text("segment id", segment_id)
        input_json = None if input is None else canonical(input)
        with self._db.transaction() as tx:
            old = runs.load(tx, from_run)
            self._authority.authorize(tx, reviewed_by, old.mission_id, Right.LINK, entity=from_run)
            if not old.status.terminal:
                raise StateError(
                    f"run {from_run} is {old.status.value}; only an ended run is followed by a "
                    "linked one (stop it first, or recover and resume it)",
                    run_id=from_run,
                    status=old.status.value,
                )
            return self._follow(
                tx,
                old,
                actor=reviewed_by.name,
                segment_id=segment_id,
                plan=plan,
                input_json=input_json,
            )

    def stop_run(self, run_id: str, *, by: Principal, reason: str = "stopped") -> Run:
        """Stop a run: STOPPED if nothing is in flight, else STOPPING (needs ``stop``)."""
        check_text("run id", run_id)
        check_text("reason", reason)
        with self._db.transaction() as tx:
            run = runs.load(tx, run_id)
            self._authority.authorize(tx, by, run.mission_id, Right.STOP, entity=run_id)
            if run.status.terminal:
                raise RunTerminal(f"run {run_id} is already {run.status.value}")
            if run.status is RunStatus.STOPPING:
                return run  # already stopping, for the reason it was first stopped for
            in_flight = attempts_store.count_in_flight(tx, run_id)
            settlement.void_prepared(
                tx, run_id, "run stopped", actor=by.name, segment=None, epoch=run.epoch
            )
            status = RunStatus.STOPPING if in_flight else RunStatus.STOPPED
            runs.set_status(tx, run, status, reason, actor=by.name)
            return runs.load(tx, run_id)

    # -- approvals (W2) --------------------------------------------------------------
    def approve(self, approval_id: str, *, by: Principal, deny: bool = False) -> ApprovalStatus:
        """Decide a pending approval; the approver needs ``approve`` on its scope."""
        check_text("approval id", approval_id)
        with self._db.transaction() as tx:
            approval = approvals_mod.load(tx, approval_id)
            contract = self._authority.authorize(
                tx, by, approval.mission_id, Right.APPROVE, approval.scope, entity=approval_id
            )
            if not deny:  # four eyes (P3): whose run requested the effect never approves it
                refuse_own_approval(
                    tx,
                    contract,
                    by.name,
                    runs.load(tx, approval.run_id).principal,
                    lambda: _estimate(tx, approval),
                    mission_id=approval.mission_id,
                    scope=approval.scope,
                    entity=approval_id,
                )
            status = approvals_mod.decide(
                tx,
                approval,
                by=by.name,
                approve=not deny,
                ttl_seconds=contract.approvals.ttl_seconds,
            )
            run = runs.load(tx, approval.run_id)
            if run.status is RunStatus.WAITING and not approvals_mod.list_approvals(
                tx, run_id=run.id, pending=True
            ):
                runs.set_status(tx, run, RunStatus.ACTIVE, "approval decided", actor=by.name)
            return status

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

    # -- incidents (L5, L7) --------------------------------------------------------------
    def close_incident(self, incident_id: str, *, by: Principal, note: str) -> None:
        """Close an incident by an explicit, audited human action (needs ``resolve``)."""
        check_text("incident id", incident_id)
        check_text("note", note)
        with self._db.transaction() as tx:
            incident = incidents_mod.load(tx, incident_id)
            self._authority.authorize(
                tx, by, incident["mission_id"], Right.RESOLVE, entity=incident_id
            )
            incidents_mod.close_incident(tx, incident_id, by=by.name, note=note)
            self._unpause(tx, incident["mission_id"], by.name)

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

    # -- reading -----------------------------------------------------------------------
    def mission(self, mission_id: str) -> Mission:
        with self._db.read() as tx:
            return missions.load(tx, mission_id)

    def missions(self, *, limit: int | None = None, after: Position | None = None) -> list[Mission]:
        """Missions by creation; paged by ``(created_at_us, id)``."""
        with self._db.read() as tx:
            return missions.list_missions(tx, limit=limit, after=after)

    def run(self, run_id: str) -> Run:
        with self._db.read() as tx:
            return runs.load(tx, run_id)

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

    def attempt(self, attempt_id: str) -> Attempt:
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

    def audit_events(self, mission_id: str) -> list[dict[str, Any]]:
        with self._db.read() as tx:
            return audit_store.all_events(tx, mission_id)


def _estimate(tx: Tx, approval: Approval) -> dict[str, int] | None:
    """The estimate of the effect ``approval`` is for: its attempt with that request
    (PREPARED, or voided by a recovery since); ``None`` when none is recorded."""
    for unresolved in (True, False):
        for a in attempts_store.list_attempts(tx, run_id=approval.run_id, unresolved=unresolved):
            effect = approvals_mod.effect_id(a.run_id, a.node_id, a.execution, a.effect_key)
            if effect == approval.effect_id and a.request_hash == approval.request_hash:
                return dict(a.estimate)
    return None
