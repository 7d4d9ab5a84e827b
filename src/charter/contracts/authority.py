"""Who may do what (P1-P3): the one place a principal is vouched for and a
right is checked against the mission's current contract.

Whether a principal may run at all (:func:`may_run`: a grant of ``run`` on
some scope) is decided here for starting a run, for authorising a continuation
and for a run's standing in its assessment; whether a requester may approve its
own effect (four eyes, :func:`refuse_own_approval`) is decided here too.

Every refusal is audited on the mission's chain (or the engine's, when no
mission is concerned) and changes nothing else: ``tx.refused`` rolls the rest
of the transaction back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping

from charter.contracts import missions
from charter.contracts.contract import Contract
from charter.contracts.missions import ContractCache
from charter.contracts.principals import Authenticator, Principal, Right
from charter.errors import AuthenticationError, NotAuthorized
from charter.hashing import ENGINE_CHAIN
from charter.storage import Tx
from charter.storage.transaction import Refused


class Authority:
    """Authentication and authorization for one engine."""

    def __init__(self, credentials: Mapping[str, str]) -> None:
        self.authenticator = Authenticator(credentials)
        self.contracts = ContractCache()

    def vouch(
        self,
        tx: Tx,
        principal: Principal,
        *,
        mission_id: str = ENGINE_CHAIN,
        entity: str = "engine",
    ) -> None:
        """Refuse (and audit, on the mission's chain if known) a forged principal."""
        try:
            self.authenticator.vouch(principal)
        except AuthenticationError as exc:
            who = str(getattr(principal, "name", "?"))
            raise self.refused_identity(
                tx,
                exc,
                who,
                mission_id=mission_id,
                entity=entity,
                reason="forged or foreign principal",
            ) from None

    def refused_identity(
        self,
        tx: Tx,
        exc: AuthenticationError,
        who: str,
        *,
        reason: str,
        mission_id: str = ENGINE_CHAIN,
        entity: str | None = None,
    ) -> Refused:
        """The one audited refusal of an identity (P1): a bad credential, a forged
        principal. ``who`` as recorded (see :meth:`claimed`)."""
        return tx.refused(
            exc,
            mission_id=mission_id,
            kind="auth.refused",
            entity=who if entity is None else entity,
            actor=who,
            payload={"reason": reason},
        )

    def claimed(self, exc: AuthenticationError, configured: Collection[str]) -> str:
        """Who a refused credential claimed to be, as it may be recorded: a
        configured name as given; anything else only by its digest, in case a
        secret was typed where the name belongs (S3)."""
        name = exc.details.get("principal")
        if name is None:
            return "?"
        if name in configured:
            return str(name)
        return "unknown:" + hashlib.sha256(str(name).encode()).hexdigest()[:16]

    def current(self, tx: Tx, mission_id: str) -> Contract:
        """The mission's current contract version."""
        return self.contracts.get(tx, mission_id, missions.load(tx, mission_id).contract_version)

    def contract(self, tx: Tx, mission_id: str, version: int) -> Contract:
        """One version of the mission's contract (versions never change: cached)."""
        return self.contracts.get(tx, mission_id, version)

    def authorize_run(
        self, tx: Tx, principal: Principal, mission_id: str, *, entity: str | None = None
    ) -> Contract:
        """Vouch for ``principal`` and refuse (audited) one the mission's current
        contract grants no ``run`` on any scope: to start a run (its attempts are
        then checked scope by scope, A1), or to authorise a run's continuation
        under the ``human`` resume policy (R9; ``entity``: the run)."""
        self.vouch(tx, principal)
        version = missions.load(tx, mission_id).contract_version
        contract = self.contract(tx, mission_id, version)
        if not may_run(contract, principal.name):
            raise tx.refused(
                NotAuthorized(
                    f"principal {principal.name!r} has no 'run' right in mission {mission_id}",
                    principal=principal.name,
                    right="run",
                ),
                mission_id=mission_id,
                kind="authorization.refused",
                entity=entity or mission_id,
                actor=principal.name,
                payload={"right": "run"},
            )
        return contract

    def authorize(
        self,
        tx: Tx,
        principal: Principal,
        mission_id: str,
        right: Right,
        scope: str = "*",
        *,
        entity: str,
    ) -> Contract:
        """Vouch for ``principal`` and check ``right`` on ``scope`` under the current
        contract, taking the mission's gate (every decision changes the mission)."""
        self.vouch(tx, principal, mission_id=mission_id, entity=entity)
        tx.lock_mission(mission_id)
        version = missions.load(tx, mission_id).contract_version
        contract = self.contract(tx, mission_id, version)
        if not contract.allows(principal.name, right, scope):
            raise denied(
                tx,
                principal.name,
                right,
                scope,
                mission_id=mission_id,
                entity=entity,
                why=f"under contract v{version} of mission {mission_id}",
            )
        return contract


def may_run(contract: Contract, principal: str) -> bool:
    """Whether ``contract`` lets ``principal`` run at all: a ``run`` grant on some
    scope. The one place this is decided; each attempt is checked on its scope."""
    return contract.grants(principal, Right.RUN)


def refuse_own_approval(
    tx: Tx,
    contract: Contract,
    approver: str,
    requester: str,
    estimate: Callable[[], Mapping[str, int] | None],
    *,
    mission_id: str,
    scope: str,
    entity: str,
) -> None:
    """Four eyes (P3): refuse, audited like any refusal, ``approver`` approving an
    effect its own run requested when ``contract`` asks for four eyes on it (by
    default, an effect estimated in a money unit). ``estimate`` is read only then."""
    if approver != requester or not contract.four_eyes(estimate()):
        return
    raise tx.refused(
        NotAuthorized(
            f"principal {approver!r} requested this effect (its run asked for it) and the "
            "contract requires four eyes on it: another principal with 'approve' on "
            f"{scope} must decide it",
            principal=approver,
            right=Right.APPROVE.value,
            scope=scope,
            rule="four_eyes",
        ),
        mission_id=mission_id,
        kind="authorization.refused",
        entity=entity,
        actor=approver,
        payload={"right": "approve", "scope": scope, "reason": "four_eyes"},
    )


def require(
    tx: Tx,
    contract: Contract,
    principal: str,
    right: Right,
    scope: str,
    *,
    mission_id: str,
    entity: str,
    why: str,
    kind: str,
) -> None:
    """Refuse (audited, see :func:`denied`) unless ``contract`` grants ``right`` on
    ``scope`` to ``principal``: for checks made where the contract is already read."""
    if not contract.allows(principal, right, scope):
        raise denied(
            tx, principal, right, scope, mission_id=mission_id, entity=entity, why=why, kind=kind
        )


def denied(
    tx: Tx,
    principal: str,
    right: Right,
    scope: str,
    *,
    mission_id: str,
    entity: str,
    why: str,
    kind: str = "authorization.refused",
) -> Refused:
    """The audited "not authorized" refusal, built in one place: raise what it returns."""
    return tx.refused(
        NotAuthorized(
            f"principal {principal!r} has no {right.value!r} right on {scope} {why}",
            principal=principal,
            right=right.value,
            scope=scope,
        ),
        mission_id=mission_id,
        kind=kind,
        entity=entity,
        actor=principal,
        payload={"right": right.value, "scope": scope, "reason": "not_authorized"},
    )
