"""A mission and a sign-in as records: plain data, read and written by
:mod:`charter.contracts.store`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from charter.contracts.principals import Principal


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


@dataclass(frozen=True)
class SignIn:
    """A held sign-in: a credential checked once, then held as a session (P1). ``id``
    is the bearer value: given to its holder, kept in the store only by digest."""

    id: str = field(repr=False)
    principal: Principal
    csrf: str = field(repr=False)  # the token every form of this sign-in carries
    expires_us: int
