"""Missions and their versioned contracts.

A mission lives across runs. Its contract is stored as versions; the mission row
points at the current one. Creating a mission funds its allowance accounts from
the contract's limits; a new version with different limits moves the difference
(``fund``/``reduce`` entries), so the ledger always explains the limit (L0).
An amendment is a new version its author's rights must cover (P2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charter import ledger
from charter.contracts.contract import Contract, amendment_needs
from charter.errors import ContractError, NotAuthorized, NotFound
from charter.storage import Tx
from charter.storage.database import Refused
from charter.storage.paging import Position, page


@dataclass(frozen=True)
class Mission:
    id: str
    name: str
    created_by: str
    created_at_us: int
    contract_version: int
    attempts_admitted: int
    attempts_failed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "created_by": self.created_by,
            "created_at_us": self.created_at_us,
            "contract_version": self.contract_version,
            "attempts_admitted": self.attempts_admitted,
            "attempts_failed": self.attempts_failed,
        }


class ContractCache:
    """Parsed contract versions; versions are immutable, so caching is safe."""

    def __init__(self) -> None:
        self._by_version: dict[tuple[str, int], Contract] = {}

    def get(self, tx: Tx, mission_id: str, version: int) -> Contract:
        key = (mission_id, version)
        contract = self._by_version.get(key)
        if contract is None:
            row = tx.one(
                "SELECT body FROM contract_versions WHERE mission_id = ? AND version = ?",
                mission_id,
                version,
            )
            if row is None:
                raise NotFound(
                    f"mission {mission_id!r} has no contract version {version}",
                    mission_id=mission_id,
                    version=version,
                )
            contract = Contract.from_json(row["body"])
            self._by_version[key] = contract
        return contract


def load(tx: Tx, mission_id: str) -> Mission:
    row = tx.one(
        "SELECT id, name, created_by, created_at_us, contract_version, attempts_admitted, "
        "attempts_failed FROM missions WHERE id = ?",
        mission_id,
    )
    if row is None:
        raise NotFound(
            f"no mission {mission_id!r} in this store; list missions with `charter missions`",
            mission_id=mission_id,
        )
    return Mission(*(row[k] for k in row.keys()))  # noqa: SIM118 - sqlite3.Row has keys()


def list_missions(
    tx: Tx, *, limit: int | None = None, after: Position | None = None
) -> list[Mission]:
    sql, args = page(
        "SELECT id, name, created_by, created_at_us, contract_version, attempts_admitted, "
        "attempts_failed FROM missions",
        [],
        [],
        key="created_at_us",
        after=after,
        limit=limit,
    )
    rows = tx.all(sql, *args)
    return [Mission(*(r[k] for k in r.keys())) for r in rows]  # noqa: SIM118


def create(tx: Tx, contract: Contract, *, name: str, by: str) -> str:
    mission_id = tx.ids.new("msn")
    tx.run(
        "INSERT INTO missions (id, name, created_by, created_at_us, contract_version) "
        "VALUES (?, ?, ?, ?, 0)",
        mission_id,
        name,
        by,
        tx.now_us,
    )
    tx.audit(mission_id, "mission.created", mission_id, actor=by, payload={"name": name})
    add_version(tx, mission_id, contract, reason="created", by=by, previous=None)
    return mission_id


def amend(
    tx: Tx, mission: Mission, current: Contract, proposed: Contract, *, by: str, reason: str
) -> int:
    """Record ``proposed`` as the mission's next version, if ``by`` may make it.

    Only the mission's creator amends, and only with, for each change that
    widens what anyone may do, the right that change would need on its own,
    under ``current`` (P2, :func:`~charter.contracts.contract.amendment_needs`);
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
    """Record a new contract version, fund allowance changes, audit the change."""
    tx.lock_mission(mission_id)
    row = tx.one("SELECT contract_version FROM missions WHERE id = ?", mission_id)
    if row is None:
        raise NotFound(f"no mission {mission_id!r} in this store", mission_id=mission_id)
    version: int = row["contract_version"] + 1
    tx.run(
        "INSERT INTO contract_versions (mission_id, version, body, digest, reason, created_by, "
        "created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
        mission_id,
        version,
        contract.canonical_json(),
        contract.digest(),
        reason,
        by,
        tx.now_us,
    )
    tx.run("UPDATE missions SET contract_version = ? WHERE id = ?", version, mission_id)
    old_limits = dict(previous.allowance) if previous else {}
    moves: list[ledger.Move] = []
    for unit, limit in contract.allowance.items():
        if unit not in old_limits:
            tx.run(
                "INSERT INTO allowances (mission_id, unit, limit_amount, available, held, spent, "
                "overrun) VALUES (?, ?, 0, 0, 0, 0, 0)",
                mission_id,
                unit,
            )
        moves += ledger.fund(unit, limit - old_limits.get(unit, 0))
    ledger.record(tx, mission_id, None, moves, f"contract v{version}")
    tx.audit(
        mission_id,
        "contract.version",
        mission_id,
        actor=by,
        before=str(version - 1) if version > 1 else None,
        after=str(version),
        payload={"reason": reason, "digest": contract.digest(), "contract": contract.to_dict()},
    )
    return version
