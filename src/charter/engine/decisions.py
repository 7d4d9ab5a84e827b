"""The decisions people make about a mission: create it, amend its contract,
raise a limit, approve or deny an effect, close an incident, stop a run.

Mixed into :class:`~charter.engine.engine.Engine`. Each decision takes an
authenticated :class:`~charter.contracts.principals.Principal` (P1), is checked
against the mission's *current* contract in the transaction that makes it, and
a refusal is audited (:class:`~charter.contracts.authority.Authority`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from charter.amounts import is_amount
from charter.attempts import settlement
from charter.attempts import store as attempts_store
from charter.contracts import missions
from charter.contracts.authority import Authority, refuse_own_approval
from charter.contracts.contract import Contract
from charter.contracts.principals import Principal, Right
from charter.errors import ContractError, RunTerminal
from charter.ids import check_text
from charter.ledger import incidents as incidents_mod
from charter.ledger import store as ledger_store
from charter.queue import store as run_queue
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import Run, RunStatus
from charter.storage import Database, Tx
from charter.waits import approvals as approvals_mod
from charter.waits.approvals import Approval, ApprovalStatus


class Decisions:
    """What a principal decides (see the module docstring)."""

    _db: Database
    _authority: Authority

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
            version = missions.amend(tx, mission, current, parsed, by=by.name, reason=reason)
            run_queue.wake_mission(tx, mission_id)  # K2: a limit or a right may have changed
            return version

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
            run_queue.wake_mission(tx, mission_id)  # K2: a raised limit
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
            if not in_flight:
                settlement.tally(tx, run_id)
            run_queue.wake(tx, run_id)  # its worker lets go of it, or settles what is in flight
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
            run_queue.wake(tx, run.id)  # K2: a granted or denied approval
            return status

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
            run_queue.wake_mission(tx, incident["mission_id"])  # K2: an incident closed


def _estimate(tx: Tx, approval: Approval) -> dict[str, int] | None:
    """The estimate of the effect ``approval`` is for: its attempt with that request
    (PREPARED, or voided by a recovery since); ``None`` when none is recorded."""
    for unresolved in (True, False):
        for a in attempts_store.list_attempts(tx, run_id=approval.run_id, unresolved=unresolved):
            effect = approvals_mod.effect_id(a.run_id, a.node_id, a.execution, a.effect_key)
            if effect == approval.effect_id and a.request_hash == approval.request_hash:
                return dict(a.estimate)
    return None
