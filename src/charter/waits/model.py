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
