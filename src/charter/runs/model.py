"""A run's record and its statuses: plain data (the runs room's store maps rows to them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class RunStatus(StrEnum):
    QUEUED = "queued"  # submitted; the first free worker starts it (K1)
    ACTIVE = "active"
    WAITING = "waiting"  # a durable wait: approval, input, timer, event
    PAUSED = "paused"  # allowance exhausted or incident open: a decision is needed (L7)
    NEEDS_INTERVENTION = "needs_intervention"
    STOPPING = "stopping"  # no new admissions; settling what is in flight
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    HANDED_OFF = "handed_off"  # continued on another store (S5); fenced here

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def ending(self) -> bool:
        """Stopping or ended: the run will never admit another attempt."""
        return self is RunStatus.STOPPING or self in _TERMINAL


_TERMINAL = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.STOPPED,
        RunStatus.HANDED_OFF,
    }
)


@dataclass(frozen=True)
class Run:
    id: str
    mission_id: str
    principal: str
    status: RunStatus
    status_reason: str | None
    epoch: int
    owner_segment: str
    lease_expires_us: int
    recoveries: int
    linked_from: str | None
    created_at_us: int
    updated_at_us: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "mission_id": self.mission_id,
            "principal": self.principal,
            "status": self.status.value,
            "status_reason": self.status_reason,
            "epoch": self.epoch,
            "owner_segment": self.owner_segment,
            "lease_expires_us": self.lease_expires_us,
            "recoveries": self.recoveries,
            "linked_from": self.linked_from,
            "created_at_us": self.created_at_us,
            "updated_at_us": self.updated_at_us,
        }
