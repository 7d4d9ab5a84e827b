"""Attempts as records: one try at one effect through one adapter (A1-A7).

Plain data: :mod:`charter.attempts.store` reads and writes them.

The lifecycle::

    PREPARED --dispatch commit--> DISPATCHED --result--> SUCCEEDED | FAILED
       |                               |--lost/ambiguous/timeout--> UNKNOWN
       v                               '--owner lost (recover)----> UNKNOWN
    VOIDED (never sent)           UNKNOWN --evidence/resolution--> SUCCEEDED | FAILED | WRITTEN_OFF

An attempt's idempotency key is derived from its ID and never changes (A5); a
retry is a *new* attempt linked by ``retry_of`` (A4).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from charter import secret


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


#: Node executions as (run_id, execution): where an effect's earlier tries live.
Lineage = list[tuple[str, int]]


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
    #: The node executions whose attempts are this effect's (this one, the
    #: node's earlier ones, those of the run it continues), as the node's
    #: context read them; ``None``: this execution only.
    lineage: Lineage | None = None

    def lines(self, run_id: str) -> Lineage:
        """The node executions to read this effect's attempts from: its lineage,
        or this execution of ``run_id`` alone."""
        return [(run_id, self.execution)] if self.lineage is None else self.lineage

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


#: Where one node's attempts live: (run, newest execution) for this run and
#: then each ended run it continues (N4), newest first.
