"""Missions and their versioned contracts.

A mission lives across runs. Its contract is stored as versions; the mission row
points at the current one. Creating a mission funds its allowance accounts from
the contract's limits; a new version with different limits moves the difference
(``fund``/``reduce`` entries), so the ledger always explains the limit (L0).
An amendment is a new version its author's rights must cover (P2). The records
are in :mod:`charter.contracts.model`; :mod:`charter.contracts.store` reads and
writes them.
"""

from __future__ import annotations

from typing import Any

from charter import ledger
from charter.contracts import store
from charter.contracts.amendments import amendment_needs
from charter.contracts.contract import Contract
from charter.contracts.model import Mission
from charter.errors import ContractError, NotAuthorized, NotFound
from charter.ids import check_text
from charter.ledger import store as ledger_store
from charter.ledger.escrow import slices as escrow
from charter.storage import Tx
from charter.storage.paging import Position
from charter.storage.transaction import Refused


class ContractCache:
    """Parsed contract versions; versions are immutable, so caching is safe."""

    def __init__(self) -> None:
        self._by_version: dict[tuple[str, int], Contract] = {}

    def get(self, tx: Tx, mission_id: str, version: int) -> Contract:
        key = (mission_id, version)
        contract = self._by_version.get(key)
        if contract is None:
            body = store.contract_body(tx, mission_id, version)
            if body is None:
                raise NotFound(
                    f"mission {mission_id!r} has no contract version {version}",
                    mission_id=mission_id,
                    version=version,
                )
            contract = Contract.from_json(body)
            self._by_version[key] = contract
        return contract


def load(tx: Tx, mission_id: str) -> Mission:
    mission = store.mission(tx, mission_id)
    if mission is None:
        raise NotFound(
            f"no mission {mission_id!r} in this store; list missions with `charter missions`",
            mission_id=mission_id,
        )
    return mission


def list_missions(
    tx: Tx, *, limit: int | None = None, after: Position | None = None
) -> list[Mission]:
    return store.missions(tx, limit=limit, after=after)


def create(tx: Tx, contract: Contract, *, name: str, by: str) -> str:
    mission_id = tx.ids.new("msn")
    store.insert(tx, mission_id, name=name, by=by)
    tx.audit(mission_id, "mission.created", mission_id, actor=by, payload={"name": name})
    add_version(tx, mission_id, contract, reason="created", by=by, previous=None)
    return mission_id


def amend(
    tx: Tx, mission: Mission, current: Contract, proposed: Contract, *, by: str, reason: str
) -> int:
    """Record ``proposed`` as the mission's next version, if ``by`` may make it.

    Only the mission's creator amends, and only with, for each change that
    widens what anyone may do, the right that change would need on its own,
    under ``current`` (P2, :func:`~charter.contracts.amendments.amendment_needs`);
    narrowing needs no right. A refusal lists every missing right, is audited
    and changes nothing else.
    """
    if by != mission.created_by:
        raise _refused(
            tx,
            mission.id,
            by,
            f"only the mission's creator ({mission.created_by}) may amend its contract; "
            "a limit raise needs raise_limit (Engine.raise_limit)",
        )
    missing = [
        n.to_dict()
        for n in amendment_needs(current, proposed)
        if not current.allows(by, n.right, n.scope)
    ]
    if missing:
        lacking = "; ".join(f"{m['change']} needs {m['right']!r} on {m['scope']}" for m in missing)
        raise _refused(
            tx,
            mission.id,
            by,
            f"principal {by!r} lacks rights this amendment of mission {mission.id} needs "
            f"(P2): {lacking}. Make only the changes your rights cover; a principal with "
            "raise_limit may raise a limit on its own (Engine.raise_limit)",
            missing=missing,
        )
    removed = sorted(set(current.allowance) - set(proposed.allowance))
    if removed:
        raise ContractError(
            f"a contract version cannot drop allowance units {removed}; set them to "
            "their spent amount instead",
            field="allowance",
        )
    # L10: what slices hold unused comes back before a limit is judged.
    escrow.revoke(tx, mission.id, "a new contract version", actor=by)
    for unit, bal in ledger.cached(tx, mission.id).items():
        if proposed.allowance[unit] < bal.held + bal.spent:
            raise ContractError(
                f"allowance.{unit} cannot go below what is held and spent "
                f"({bal.held + bal.spent}); available would turn negative (L0)",
                field=f"allowance.{unit}",
            )
    return add_version(tx, mission.id, proposed, reason=reason, by=by, previous=current)


def _refused(tx: Tx, mission_id: str, by: str, message: str, **details: Any) -> Refused:
    """A refused amendment: only the audited refusal is recorded."""
    return tx.refused(
        NotAuthorized(message, principal=by, **details),
        mission_id=mission_id,
        kind="authorization.refused",
        entity=mission_id,
        actor=by,
        payload={"action": "amend_contract", **details},
    )


def add_version(
    tx: Tx,
    mission_id: str,
    contract: Contract,
    *,
    reason: str,
    by: str,
    previous: Contract | None,
) -> int:
    """Record a new contract version, fund allowance changes, audit the change.

    Its principals' names are identifiers, stored as given or refused (A10)."""
    for principal in contract.principals:
        check_text("principal name", principal)
    check_text("reason", reason)
    tx.lock_mission(mission_id)
    current = store.contract_version(tx, mission_id)
    if current is None:
        raise NotFound(f"no mission {mission_id!r} in this store", mission_id=mission_id)
    version = current + 1
    store.insert_version(tx, mission_id, version, contract, reason=reason, by=by)
    store.set_contract_version(tx, mission_id, version)
    old_limits = dict(previous.allowance) if previous else {}
    if previous is not None:  # L10: a new version revokes the slices lent under the old
        escrow.revoke(tx, mission_id, f"contract v{version}", actor=by)
    moves: list[ledger.Move] = []
    for unit, limit in contract.allowance.items():
        if unit not in old_limits:
            ledger_store.open_accounts(tx, mission_id, [unit])
        moves += ledger.fund(unit, limit - old_limits.get(unit, 0))
    entries = ledger.record(tx, mission_id, None, moves, f"contract v{version}")
    tx.audit(
        mission_id,
        "contract.version",
        mission_id,
        actor=by,
        before=str(version - 1) if version > 1 else None,
        after=str(version),
        payload={
            "reason": reason,
            "digest": contract.digest(),
            "contract": contract.to_dict(),
            **entries,
        },
    )
    return version
