"""A mission as a record: plain data, read and written by :mod:`charter.contracts.store`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
