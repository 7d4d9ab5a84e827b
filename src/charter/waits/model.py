"""What the waits room records: approvals (W2), as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"  # the approver lost the right before dispatch
    WITHDRAWN = "withdrawn"  # the run stopped: nothing will be sent under it


def effect_id(run_id: str, node_id: str, execution: int, effect_key: str) -> str:
    return f"{run_id}/{node_id}/{execution}/{effect_key}"


@dataclass(frozen=True)
class Approval:
    id: str
    mission_id: str
    run_id: str
    effect_id: str
    scope: str
    request_hash: str
    status: ApprovalStatus
    requested_at_us: int
    decided_by: str | None
    decided_at_us: int | None
    expires_at_us: int | None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "status": self.status.value}


class WaitKind(StrEnum):
    """The waits beside approvals (W1), each keyed by an ID its node gives."""

    INPUT = "input"  # a question for a person, with a typed answer
    TIMER = "timer"  # a time by the store's clock
    EVENT = "event"  # a named signal from outside


class WaitStatus(StrEnum):
    PENDING = "pending"
    SATISFIED = "satisfied"  # answered, signalled or due; the node has not read it yet
    CONSUMED = "consumed"  # the node read it (a replay reads it again)


#: The answer types a question may ask for, and the JSON values each accepts.
ANSWER_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "json": (str, int, float, bool, list, dict, type(None)),
}


@dataclass(frozen=True)
class Wait:
    """A durable pause of one node of a run (W1), as recorded.

    ``prompt`` is the question (input) or the event's name (event);
    ``answer_type`` what an answer must be; ``due_at_us`` when a timer is due
    by the store's clock; ``value`` the answer or the signal's payload.
    """

    id: str
    mission_id: str
    run_id: str
    node_id: str
    key: str
    kind: WaitKind
    status: WaitStatus
    prompt: str | None
    answer_type: str | None
    due_at_us: int | None
    value: Any
    created_at_us: int
    satisfied_at_us: int | None
    satisfied_by: str | None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "kind": self.kind.value, "status": self.status.value}
