"""The recovery state: what ``Coordinator.recover`` returns (R5).

Built from the store alone, in the recovering transaction. Its cost follows
what is unresolved, not history: settled attempts are counted, not loaded.
It unpacks as ``state, unresolved`` (the seed's API) and is also available as
``.state`` / ``.unresolved``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from charter import ledger
from charter.attempts.model import Attempt, AttemptStatus
from charter.attempts.store import list_attempts
from charter.contracts import store as contracts_store
from charter.contracts.authority import may_run
from charter.contracts.contract import Contract
from charter.errors import NotFound
from charter.ledger import store as ledger_store
from charter.ledger.escrow import slices as escrow
from charter.plans import store as plans_store
from charter.recovery import store as recovery_store
from charter.runs import store as run_store
from charter.runs.run import Run
from charter.storage import Tx
from charter.waits import store as waits_store
from charter.waits.approvals import ApprovalStatus, list_approvals

#: The recovery table (docs/recovery.md, R1-R9): last durable phase -> next safe action.
NEXT_ACTIONS = {
    "no_admission": "re-evaluate the request against the current contract and authority",
    "prepared": "voided by the new epoch; re-admit if still wanted",
    "uncertain": "keep the hold; obtain evidence (reconcile) and a person's resolution",
    "settled": "never perform again",
    "node_completed": "verify its artifacts before a consumer uses them",
    "run_terminal": "never reopen; a reviewed new linked run if needed",
}


@dataclass(frozen=True)
class NextAction:
    """One item of the recovery state and the next safe action for it."""

    kind: str  # attempt | node | run
    id: str
    phase: str
    action: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "id": self.id, "phase": self.phase, "action": self.action}


@dataclass(frozen=True)
class RecoveryState:
    run: Run
    contract_version: int
    contract: Contract
    plan: str | None
    nodes: list[dict[str, Any]]
    attempts: list[Attempt]  # unresolved ones, in full
    voided: list[str]  # PREPARED attempts voided by this recovery (R3)
    settled_counts: dict[str, int]
    waits: list[dict[str, Any]]
    assessment: dict[str, Any]
    next_actions: list[NextAction] = field(default_factory=list)
    #: The most takeovers any unresolved attempt went through (K1).
    takeovers: int = 0

    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def epoch(self) -> int:
        return self.run.epoch

    @property
    def state(self) -> RecoveryState:
        return self

    @property
    def unresolved(self) -> list[str]:
        return [a.id for a in self.attempts]

    def __iter__(self) -> Iterator[Any]:
        yield self
        yield self.unresolved

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run.id,
            "epoch": self.run.epoch,
            "status": self.run.status.value,
            "status_reason": self.run.status_reason,
            "owner_segment": self.run.owner_segment,
            "linked_from": self.run.linked_from,
            "contract_version": self.contract_version,
            "plan": self.plan,
            "nodes": self.nodes,
            "unresolved": self.unresolved,
            "attempts": [a.to_dict() for a in self.attempts],
            "voided": self.voided,
            "settled_counts": self.settled_counts,
            "waits": self.waits,
            "assessment": self.assessment,
            "next_actions": [n.to_dict() for n in self.next_actions],
        }


def assess(tx: Tx, run: Run, contract: Contract) -> dict[str, Any]:
    """The run's standing against its contract: what would stop it going on."""
    balances = ledger.cached(tx, run.mission_id)
    open_incidents = ledger_store.count_open(tx, run.mission_id)
    counts = contracts_store.counts(tx, run.mission_id)
    if counts is None:
        raise NotFound(f"no mission {run.mission_id!r} in this store", mission_id=run.mission_id)
    stops = [
        label
        for label, _ in contract.stop_conditions.holding(
            now_us=tx.now_us, admitted=counts[0], failed=counts[1]
        )
    ]
    return {
        "allowance": {
            u: {
                "limit": b.limit,
                "available": b.available,
                "held": b.held,
                "spent": b.spent,
                "overrun": b.overrun,
            }
            for u, b in balances.items()
        },
        "exhausted": escrow.exhausted(tx, run.mission_id, balances),
        "open_incidents": open_incidents,
        "stop_conditions": stops,
        "authority": may_run(contract, run.principal),
    }


def build(
    tx: Tx,
    run: Run,
    contract: Contract,
    voided: list[str],
    expired: list[str] | None = None,
) -> RecoveryState:
    """The recovery state; ``expired`` names approvals this recovery retired (W2)."""
    unresolved = list_attempts(tx, run_id=run.id, unresolved=True)
    settled = run_store.settled_counts(tx, run.id)
    if settled is None:
        raise NotFound(f"no run {run.id!r} in this store", run_id=run.id)
    counts = {status: n for status, n in settled.items() if n}
    nodes = [
        {
            "node_id": r["node_id"],
            "execution": r["execution"],
            "status": r["status"],
            "crashes": r["crashes"],
            "result_hash": r["result_hash"],
            # What a failed or raising execution raised, with its last frames (N6).
            "error": r["error"],
        }
        for r in plans_store.recovery_view(tx, run.id)
    ]
    plan = run_store.plan_ref(tx, run.id)
    waits = _waits(tx, run, expired)
    actions = _next_actions(run, voided, unresolved, nodes, counts)
    version = contracts_store.contract_version(tx, run.mission_id)
    if version is None:
        raise NotFound(f"no mission {run.mission_id!r} in this store", mission_id=run.mission_id)
    return RecoveryState(
        run=run,
        contract_version=version,
        contract=contract,
        plan=plan,
        nodes=nodes,
        attempts=unresolved,
        voided=voided,
        settled_counts=counts,
        waits=waits,
        assessment=assess(tx, run, contract),
        next_actions=actions,
        takeovers=recovery_store.most_takeovers(tx, run.id) if unresolved else 0,
    )


def _waits(tx: Tx, run: Run, expired: list[str] | None) -> list[dict[str, Any]]:
    """The run's approvals: lapsed ones flagged, pending ones that renew a lapsed one."""
    waits = []
    retired = set(expired or ())
    for w in list_approvals(tx, run_id=run.id):
        lapsed = w.id in retired or (
            w.status is ApprovalStatus.APPROVED
            and w.expires_at_us is not None
            and w.expires_at_us <= tx.now_us
        )
        if lapsed:
            waits.append({**w.to_dict(), "expired": True, "renews": False})
        elif w.status is ApprovalStatus.PENDING:
            renews = waits_store.expired(tx, w.effect_id, w.request_hash)
            waits.append({**w.to_dict(), "expired": False, "renews": renews})
    # Human input, timers and events (W1): those the node has not read yet.
    for o in waits_store.waits(tx, run_id=run.id, open_only=True):
        waits.append({**o.to_dict(), "expired": False, "renews": False})
    return waits


def _next_actions(
    run: Run,
    voided: list[str],
    unresolved: list[Attempt],
    nodes: list[dict[str, Any]],
    counts: dict[str, int],
) -> list[NextAction]:
    """R5: the next safe action per item of the recovery state."""
    actions: list[NextAction] = []
    if run.status.terminal:
        actions.append(NextAction("run", run.id, "run_terminal", NEXT_ACTIONS["run_terminal"]))
    for attempt_id in voided:
        actions.append(NextAction("attempt", attempt_id, "prepared", NEXT_ACTIONS["prepared"]))
    for a in unresolved:
        phase = "prepared" if a.status is AttemptStatus.PREPARED else "uncertain"
        actions.append(NextAction("attempt", a.id, a.status.value, NEXT_ACTIONS[phase]))
    for n in nodes:
        if n["status"] == "completed":
            actions.append(
                NextAction(
                    "node",
                    f"{n['node_id']}#{n['execution']}",
                    "node_completed",
                    NEXT_ACTIONS["node_completed"],
                )
            )
        elif n["status"] == "running":
            actions.append(
                NextAction(
                    "node",
                    f"{n['node_id']}#{n['execution']}",
                    "no_admission",
                    NEXT_ACTIONS["no_admission"],
                )
            )
    if any(counts.get(s) for s in ("succeeded", "failed", "written_off")):
        actions.append(NextAction("attempts", "settled", "settled", NEXT_ACTIONS["settled"]))
    return actions
