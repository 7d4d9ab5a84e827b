"""Attempts: one try at one effect through one adapter (A1-A7).

The lifecycle::

    PREPARED --dispatch commit--> DISPATCHED --result--> SUCCEEDED | FAILED
       |                               |--lost/ambiguous/timeout--> UNKNOWN
       v                               '--owner lost (recover)----> UNKNOWN
    VOIDED (never sent)           UNKNOWN --evidence/resolution--> SUCCEEDED | FAILED | WRITTEN_OFF

An attempt's idempotency key is derived from its ID and never changes (A5); a
retry is a *new* attempt linked by ``retry_of`` (A4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from charter import secret
from charter.errors import NotFound
from charter.plans import store as plans_store
from charter.storage import Row, Tx
from charter.storage.paging import Position, page


class AttemptStatus(StrEnum):
    PREPARED = "prepared"
    DISPATCHED = "dispatched"
    UNKNOWN = "unknown"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    WRITTEN_OFF = "written_off"
    VOIDED = "voided"

    @property
    def holds(self) -> bool:
        """Whether an attempt in this status keeps its hold (L1)."""
        return self in _HOLDING

    @property
    def settled(self) -> bool:
        return self in _SETTLED

    @property
    def ended_unperformed(self) -> bool:
        """Settled as not performed (FAILED) or never sent (VOIDED): a retry is safe."""
        return self in (AttemptStatus.FAILED, AttemptStatus.VOIDED)

    @property
    def unresolved(self) -> bool:
        """Sent or maybe sent, outcome not settled: never retried on a guess."""
        return self in (AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN)


_HOLDING = frozenset({AttemptStatus.PREPARED, AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN})
_SETTLED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.WRITTEN_OFF})


def idempotency_key_for(attempt_id: str) -> str:
    """The key sent to the target: the attempt's own, forever (A5)."""
    return f"charter-{attempt_id}"


@dataclass(frozen=True)
class Effect:
    """Which effect an attempt performs, and which try of it (A4, A6).

    Within one node execution an effect key names one effect; each try of it
    is a generation, and a retry names the attempt it follows.
    """

    node_id: str
    execution: int
    key: str
    generation: int = 1
    retry_of: str | None = None

    def followed(self, linked_from: str | None) -> bool:
        """Whether earlier attempts of this effect may exist besides its first try
        in this execution (which the store's unique index already guards): a
        later generation, a later node execution, or a run that continues another."""
        return (
            self.generation > 1
            or self.retry_of is not None
            or self.execution > 1
            or linked_from is not None
        )

    def retried_after(self, attempt_id: str) -> Effect:
        """The next try, after ``attempt_id`` ended without applying the effect."""
        return Effect(self.node_id, self.execution, self.key, self.generation + 1, attempt_id)


@dataclass(frozen=True)
class Attempt:
    """An attempt as recorded in the store."""

    id: str
    mission_id: str
    run_id: str
    node_id: str
    execution: int
    effect_key: str
    adapter: str
    operation: str
    effect_class: str
    status: AttemptStatus
    principal: str
    admitted_epoch: int
    dispatched_epoch: int | None
    idempotency_key: str
    request_hash: str
    request: Any
    estimate: dict[str, int]
    actual: dict[str, int] | None
    result: Any
    receipt: Any
    price_source: str | None
    retry_of: str | None
    reason: str | None
    send_deadline_us: int | None
    prepared_at_us: int
    dispatched_at_us: int | None
    settled_at_us: int | None
    generation: int = 1
    #: Whether the send's own answer settled it (the sender saw the outcome), or
    #: evidence or a person did later (A4: a node retries what it never saw fail).
    answered: bool = False

    @property
    def scope(self) -> str:
        return f"{self.adapter}.{self.operation}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "mission_id": self.mission_id,
            "run_id": self.run_id,
            "node_id": self.node_id,
            "execution": self.execution,
            "effect_key": self.effect_key,
            "adapter": self.adapter,
            "operation": self.operation,
            "effect_class": self.effect_class,
            "status": self.status.value,
            "principal": self.principal,
            "admitted_epoch": self.admitted_epoch,
            "dispatched_epoch": self.dispatched_epoch,
            "idempotency_key": self.idempotency_key,
            "request_hash": self.request_hash,
            "request": secret.recorded(self.request),
            "estimate": self.estimate,
            "actual": self.actual,
            "result": self.result,
            "receipt": self.receipt,
            "price_source": self.price_source,
            "retry_of": self.retry_of,
            "reason": self.reason,
            "prepared_at_us": self.prepared_at_us,
            "dispatched_at_us": self.dispatched_at_us,
            "settled_at_us": self.settled_at_us,
            "generation": self.generation,
            "answered": self.answered,
        }


def changed(attempt: Attempt, **changes: Any) -> Attempt:
    """``dataclasses.replace`` without re-running ``__init__`` (on the attempt path,
    a tenth of its cost): an Attempt has no ``__post_init__`` to re-run."""
    unknown = changes.keys() - attempt.__dict__.keys()
    if unknown:
        raise TypeError(f"Attempt has no field(s) {sorted(unknown)}")
    new = object.__new__(Attempt)
    new.__dict__.update(attempt.__dict__, **changes)
    return new


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _request(text: str) -> Any:
    """A recorded request; its secrets come back knowing only their names (S3)."""
    request = json.loads(text)
    return secret.rebuild(request) if f'"{secret.MARK}"' in text else request


def from_row(r: Row) -> Attempt:
    return Attempt(
        id=r["id"],
        mission_id=r["mission_id"],
        run_id=r["run_id"],
        node_id=r["node_id"],
        execution=r["execution"],
        effect_key=r["effect_key"],
        adapter=r["adapter"],
        operation=r["operation"],
        effect_class=r["effect_class"],
        status=AttemptStatus(r["status"]),
        principal=r["principal"],
        admitted_epoch=r["admitted_epoch"],
        dispatched_epoch=r["dispatched_epoch"],
        idempotency_key=r["idempotency_key"],
        request_hash=r["request_hash"],
        request=_request(r["request"]),
        estimate=_json(r["estimate"]),
        actual=_json(r["actual"]),
        result=_json(r["result"]),
        receipt=_json(r["receipt"]),
        price_source=r["price_source"],
        retry_of=r["retry_of"],
        reason=r["reason"],
        send_deadline_us=r["send_deadline_us"],
        prepared_at_us=r["prepared_at_us"],
        dispatched_at_us=r["dispatched_at_us"],
        settled_at_us=r["settled_at_us"],
        generation=r["generation"],
        answered=bool(r["answered"]),
    )


def load(tx: Tx, attempt_id: str) -> Attempt:
    row = tx.one("SELECT * FROM attempts WHERE id = ?", attempt_id)
    if row is None:
        raise NotFound(
            f"no attempt {attempt_id!r} in this store; list them with `charter attempts`",
            attempt_id=attempt_id,
        )
    return from_row(row)


def count_unresolved(tx: Tx, run_id: str) -> int:
    """How many attempts of the run are PREPARED, DISPATCHED or UNKNOWN (through
    the partial index: the cost follows what is unresolved, not history)."""
    row = tx.one(
        "SELECT COUNT(*) AS n FROM attempts WHERE run_id = ? "
        "AND status IN ('prepared', 'dispatched', 'unknown')",
        run_id,
    )
    return 0 if row is None else int(row["n"])


def list_attempts(
    tx: Tx,
    *,
    run_id: str | None = None,
    mission_id: str | None = None,
    unresolved: bool = False,
    limit: int | None = None,
    after: Position | None = None,
) -> list[Attempt]:
    where: list[str] = []
    params: list[Any] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if mission_id is not None:
        where.append("mission_id = ?")
        params.append(mission_id)
    if unresolved:
        where.append("status IN ('prepared', 'dispatched', 'unknown')")
    sql, args = page(
        "SELECT * FROM attempts", where, params, key="prepared_at_us", after=after, limit=limit
    )
    return [from_row(r) for r in tx.all(sql, *args)]


#: Where one node's attempts live: (run, newest execution) for this run and
#: then each ended run it continues (N4), newest first.
Lineage = list[tuple[str, int]]


def lineage(tx: Tx, run_id: str, node_id: str, execution: int) -> Lineage:
    """The node executions whose attempts are the same effects as ``execution``'s:
    this one and the earlier ones of the node, then, for a linked run, those of
    the ended run that its first execution continues."""
    out: Lineage = []
    run: str | None = run_id
    top = execution
    while run is not None:
        out.append((run, top))
        link = plans_store.inherited(tx, run, node_id)
        if link is None:
            break
        run, top = link
    return out


def effect_attempts(
    tx: Tx, lines: Lineage, node_id: str, key: str, *, newest: bool = False
) -> list[Attempt]:
    """Every attempt of one effect (A4), newest first: by node execution, each one
    read through the store's unique index, so the cost follows the number of
    executions, not of effects. ``newest`` stops at the first execution that has any."""
    out: list[Attempt] = []
    for run_id, top in lines:
        for execution in range(top, min(top, 1) - 1, -1):
            rows = tx.all(
                "SELECT * FROM attempts WHERE run_id = ? AND node_id = ? AND execution = ? "
                "AND effect_key = ? ORDER BY generation DESC",
                run_id,
                node_id,
                execution,
                key,
            )
            out += [from_row(r) for r in rows]
            if newest and out:
                return out
    return out
