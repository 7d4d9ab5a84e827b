"""The audit log (S1): append-only and hash-chained, one chain per mission.

Every transition appends an event in the *same transaction* as the change it
records (see :meth:`charter.storage.Tx.audit`). Each event's hash covers the
previous event's hash and every field of the event, so any edit, insertion or
deletion breaks the chain at a precise sequence number.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64

#: Missions are chains; refusals that concern no mission go on this chain.
ENGINE_CHAIN = "engine"


#: One encoder for every call (``json.dumps`` with options builds a new one each time).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def canonical(value: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace."""
    return _CANONICAL.encode(value)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def event_hash(prev_hash: str, fields: Mapping[str, Any]) -> str:
    """The chained hash of one event."""
    return digest(prev_hash + canonical(fields))


@dataclass(frozen=True)
class Verification:
    """The result of checking one mission's chain."""

    mission_id: str
    events: int
    ok: bool
    broken_at: int | None = None
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mission_id": self.mission_id,
            "events": self.events,
            "ok": self.ok,
            "broken_at": self.broken_at,
            "problem": self.problem,
        }


HASHED_FIELDS = (
    "seq",
    "at_us",
    "actor",
    "segment",
    "epoch",
    "kind",
    "entity",
    "before",
    "after",
    "payload_hash",
)


def verify_events(mission_id: str, rows: Iterable[Mapping[str, Any]]) -> Verification:
    """Recompute a chain from its rows (ordered by ``seq``) and report the first break."""
    prev = GENESIS
    count = 0
    for row in rows:
        count += 1
        seq = row["seq"]
        if seq != count:
            return Verification(mission_id, count, False, seq, f"sequence gap: expected {count}")
        if row["prev_hash"] != prev:
            return Verification(mission_id, count, False, seq, "previous hash does not match")
        if digest(row["payload"]) != row["payload_hash"]:
            return Verification(mission_id, count, False, seq, "payload does not match its hash")
        fields = {k: row[k] for k in HASHED_FIELDS}
        if event_hash(prev, fields) != row["hash"]:
            return Verification(mission_id, count, False, seq, "event does not match its hash")
        prev = row["hash"]
    return Verification(mission_id, count, True)
