"""The audit log (S1): append-only and hash-chained, one chain per mission.

Every transition appends an event in the *same transaction* as the change it
records (see :meth:`charter.storage.Tx.audit`). Each event's hash covers the
previous event's hash, the mission's id and every field of the event, and a
chain starts from a genesis derived from the mission's id; the chain's head
(last ``seq`` and hash) is kept on the mission's row, moved in the same
transaction. So an edit, insertion, deletion, truncated tail, or a chain moved
to another mission breaks the chain at a precise sequence number. Rewriting
the whole store consistently (events and heads) is caught only by a signature
(S2); ``docs/audit.md`` says which is which.

Chains begun before schema 6 keep their first events as they were hashed then
(without the mission's id, from an all-zero genesis): an audit log is never
rehashed. Their row says how many (:class:`ChainHead`); later events are
hashed the current way.

This module checks chains; :mod:`~charter.audit.store` reads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charter.audit import store
from charter.audit.model import ChainHead
from charter.hashing import (
    ENGINE_CHAIN,
    HASHED_FIELDS,
    LEGACY_GENESIS,
    LEGACY_HASHED_FIELDS,
    digest,
    event_hash,
    genesis,
    head_table,
)

if TYPE_CHECKING:
    from charter.storage import Tx


#: How many events verification holds at a time, whatever the chain's length.
PAGE = 1000


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


def _problem(
    chain: str, row: Mapping[str, Any], count: int, prev: str, head: ChainHead | None
) -> str | None:
    """What is wrong with the ``count``-th event of a chain, after ``prev``."""
    seq = row["seq"]
    if seq != count:
        return f"sequence gap: expected {count}"
    if head is None:
        if chain == ENGINE_CHAIN:
            return "the engine chain's head is missing"
        return "events of a chain that has no head: no mission has this id"
    if seq > head.seq:
        return f"an event after the chain's head (event {head.seq}) on its row"
    if row["prev_hash"] != prev:
        return "previous hash does not match"
    if digest(row["payload"]) != row["payload_hash"]:
        return "payload does not match its hash"
    names = LEGACY_HASHED_FIELDS if seq <= head.legacy else HASHED_FIELDS
    if event_hash(prev, {k: row[k] for k in names}) != row["hash"]:
        return "event does not match its hash"
    return None


def verify_events(
    chain: str, rows: Iterable[Mapping[str, Any]], head: ChainHead | None
) -> Verification:
    """Recompute a chain from its rows (ordered by ``seq``) up to its recorded
    ``head`` and report the first break; ``head`` is ``None`` when no row keeps one."""
    prev = LEGACY_GENESIS if head is not None and head.legacy else genesis(chain)
    count = 0
    for row in rows:
        count += 1
        problem = _problem(chain, row, count, prev, head)
        if problem is not None:
            return Verification(chain, count, False, row["seq"], problem)
        prev = row["hash"]
    if head is None:
        if chain == ENGINE_CHAIN:
            return Verification(chain, 0, False, 1, "the engine chain's head is missing")
        return Verification(chain, count, True)
    if count < head.seq:
        return Verification(
            chain,
            count,
            False,
            count + 1,
            f"the chain ends at event {count} but its head records {head.seq}: "
            "events are missing from its end",
        )
    if count and prev != head.hash:
        return Verification(
            chain, count, False, count, "the last event does not match the chain's head"
        )
    return Verification(chain, count, True)


# -- checking chains in the store ---------------------------------------------------


def chains(tx: Tx) -> list[str]:
    """Every chain to verify: those the store holds, and the engine's always."""
    return sorted(store.chain_ids(tx) | {ENGINE_CHAIN})


def verify(tx: Tx, chain: str) -> Verification:
    """Check ``chain`` end to end against its recorded head. A mission's chain
    is checked with the chains of the escrow slices it lent (L10), and a
    slice's chain is checked against the events of its mission's chain that
    lent it and, once returned, recorded its final head."""
    head = store.head(tx, chain)
    result = verify_events(chain, store.events(tx, chain, PAGE), head)
    if not result.ok:
        return result
    table = head_table(chain)
    if table == "escrow_slices":
        problem = _lent(tx, chain, head)
        return (
            result if problem is None else Verification(chain, result.events, False, None, problem)
        )
    if table == "missions":
        for lent in store.slices(tx, chain):
            found = verify(tx, lent["id"])
            if not found.ok:
                return Verification(
                    chain,
                    result.events,
                    False,
                    found.broken_at,
                    f"escrow slice {lent['id']}: {found.problem}",
                )
    return result


def _lent(tx: Tx, slice_id: str, head: ChainHead | None) -> str | None:
    """What is wrong with how a slice's chain is tied into its mission's (L10)."""
    row = store.lender(tx, slice_id)
    if row is None or head is None:
        return "a slice's chain without its slice's row"
    kinds = {
        r["kind"]: json.loads(r["payload"]) for r in store.lending(tx, row["mission_id"], slice_id)
    }
    if "escrow.leased" not in kinds:
        return f"no event on mission {row['mission_id']}'s chain lent this slice"
    if row["status"] == "open":
        return None
    returned = kinds.get("escrow.returned")
    if returned is None:
        return f"returned, but no event on mission {row['mission_id']}'s chain says so"
    if returned.get("head") != [head.seq, head.hash]:
        return (
            f"the slice's chain ends at event {head.seq}, not where its return on mission "
            f"{row['mission_id']}'s chain recorded it ({returned.get('head')})"
        )
    return None
