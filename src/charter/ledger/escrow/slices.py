"""Slices of a mission's allowance, lent to workers (L10).

A **slice** is lent under the mission's gate, held whole: the mission's books
move its grant ``available -> held`` (a ``lease`` entry on the mission's
chain), so L0 holds at every instant and no other admission can spend it. The
slice has books of its own and a chain of its own (its id; its head and books
on its row), which begins with the grant as ``fund`` entries.
Its holder admits and settles against it in a lane
(:mod:`charter.storage.lanes`): the mission's gate shared, the slice's whole,
so holders of different slices share no row.

A slice is **returned** (:func:`give_back`) by its holder, by whoever finds its
lease lapsed (:func:`sweep`: every lease, renewal and admission through the
mission's gate), revoked (:func:`revoke`) by a new contract version, an
open incident or a settlement through the mission's gate of one of its
attempts, or reclaimed (:func:`reclaim`) by an admission through the
mission's gate that needs what it did not use. Returning settles the grant
on the mission as one hold: what the slice's attempts spent is spent, the
rest released (or, if they spent more than the grant, the excess is an
overrun); the holds of its attempts still open stay held, now the mission's.
Its chain is sealed, and the mission's chain records its final head, so
`charter audit verify` ties every slice's chain into its mission's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from charter.errors import SliceUnavailable
from charter.hashing import genesis
from charter.ledger import store as ledger_store
from charter.ledger.accounts import Balance, Move, fund, settle
from charter.ledger.escrow import store
from charter.storage import Tx

#: The price source a slice's own entries name (L8): the grant, not a price.
SOURCE = "escrow"


def lease(
    tx: Tx,
    mission_id: str,
    amounts: Mapping[str, int],
    *,
    holder: str,
    lease_us: int,
    counted: bool,
    open_incidents: int,
) -> tuple[str, dict[str, int]]:
    """Lend ``holder`` a slice of at most ``amounts`` (what is available, per unit)
    for ``lease_us``; returns its id and its grant. Under the mission's gate, held
    whole. Refused (:class:`SliceUnavailable`) while an incident is open, when the
    contract counts attempts (``counted``: a count is not lent) or when nothing
    of ``amounts`` is available."""
    tx.lock_mission(mission_id)
    sweep(tx, mission_id)
    why = None
    if open_incidents:
        why = f"{open_incidents} open incident(s) on the mission (L7)"
    elif counted:
        why = "the contract counts attempts (max_attempts, max_failed_attempts)"
    balance = ledger_store.cached(tx, mission_id)
    grant = {
        u: min(a, balance[u].available)
        for u, a in sorted(amounts.items())
        if u in balance and balance[u].overrun == 0 and min(a, balance[u].available) > 0
    }
    if why is None and not grant:
        why = f"nothing of {dict(amounts)} is available"
    if why is not None:
        raise SliceUnavailable(
            f"mission {mission_id} lends no slice now: {why}; admissions go through the "
            "mission's gate meanwhile",
            mission_id=mission_id,
            why=why,
        )
    slice_id = tx.ids.new("esc")
    expires = tx.now_us + lease_us
    store.insert_slice(tx, slice_id, mission_id, holder, expires)
    ledger_store.open_accounts(tx, slice_id, grant)
    moves = [Move(u, "lease", "available", "held", a) for u, a in grant.items()]
    entries = ledger_store.record(tx, mission_id, None, moves, SOURCE)
    tx.audit(
        mission_id,
        "escrow.leased",
        slice_id,
        actor=holder,
        after="open",
        payload={"holder": holder, "lease_expires_us": expires, "genesis": genesis(slice_id)}
        | entries,
    )
    granted = [m for u, a in grant.items() for m in fund(u, a)]
    tx.audit(
        slice_id,
        "escrow.granted",
        slice_id,
        actor=holder,
        after="open",
        payload={"mission_id": mission_id}
        | ledger_store.record(tx, slice_id, None, granted, SOURCE),
    )
    return slice_id, grant


def renew(tx: Tx, slice_id: str, lease_us: int, *, open_incidents: int, counted: bool) -> int:
    """Move an open slice's lease on, after checking again what its lease checked:
    an open incident or a contract that counts attempts revokes it. Returns the
    new end; :class:`SliceUnavailable` when it is not open (any more)."""
    row = store.row(tx, slice_id)
    if row is None or row["status"] != "open":
        raise SliceUnavailable(
            f"escrow slice {slice_id} is not open (returned: "
            f"{None if row is None else row['returned_why']})",
            slice_id=slice_id,
            why="returned",
        )
    tx.lock_mission(row["mission_id"])
    if open_incidents or counted:
        why = "an open incident" if open_incidents else "the contract counts attempts"
        give_back(tx, slice_id, f"revoked: {why}", actor=row["holder"])
        raise tx.refused(
            SliceUnavailable(
                f"escrow slice {slice_id} was revoked ({why}); admissions go through the "
                "mission's gate until a slice is lent again",
                slice_id=slice_id,
                why=why,
            ),
            mission_id=row["mission_id"],
            kind="escrow.refused",
            entity=slice_id,
            actor=row["holder"],
            payload={"why": why},
            keep_changes=True,
        )
    expires = tx.now_us + lease_us
    store.extend(tx, slice_id, expires)
    tx.audit(
        slice_id,
        "escrow.renewed",
        slice_id,
        actor=row["holder"],
        before=str(row["lease_expires_us"]),
        after=str(expires),
    )
    return expires


def give_back(tx: Tx, slice_id: str, why: str, *, actor: str) -> bool:
    """Return an open slice to its mission (see the module's docstring); ``False``
    when it was not open. Under the mission's gate, held whole."""
    row = store.row(tx, slice_id)
    if row is None or row["status"] != "open":
        return False
    mission_id = row["mission_id"]
    tx.lock_mission(mission_id)
    accounts = ledger_store.cached(tx, slice_id)
    moves: list[Move] = []
    for unit, b in accounts.items():
        moves += settle({unit: b.limit - b.held}, {unit: b.spent})
    if not store.mark_returned(tx, slice_id, why):
        return False
    # What the slice counted is the mission's now (A1's stop conditions count it).
    tx.count(mission_id, "attempts_admitted", row["attempts_admitted"])
    tx.count(mission_id, "attempts_failed", row["attempts_failed"])
    entries = ledger_store.record(tx, mission_id, None, moves, SOURCE)
    tx.audit(
        mission_id,
        "escrow.returned",
        slice_id,
        actor=actor,
        before="open",
        after="returned",
        payload={
            "why": why,
            # The slice's chain ends here: verify checks it against this head.
            "head": [row["audit_seq"], row["audit_hash"]],
            "admitted": row["attempts_admitted"],
            "failed": row["attempts_failed"],
            "accounts": {u: vars(b) for u, b in accounts.items()},
        }
        | entries,
    )
    return True


def sweep(tx: Tx, mission_id: str) -> int:
    """Return the mission's slices whose lease lapsed (a holder that died or
    stalled); how many. Under the mission's gate, held whole."""
    lapsed = store.open_slices(tx, mission_id, lapsed=True)
    for s in lapsed:
        give_back(tx, s["id"], "lapsed", actor="engine:escrow")
    return len(lapsed)


def reclaim(tx: Tx, mission_id: str, estimate: Mapping[str, int], *, actor: str) -> bool:
    """An admission through the mission's gate that the mission's available money
    cannot cover takes back what its slices did not use, when that covers it:
    the slices with the most of the missing units are returned (their holders
    lease afresh) until the mission's own available covers ``estimate``. Money
    lent is the mission's, so a run never waits for a person while it is only
    lent (L10, K5); ``False``, with nothing changed, when the mission cannot
    cover it even so (or a unit is overrun): the run pauses as without escrow
    (L7). Under the mission's gate, held whole: no lane is in flight."""
    balance = ledger_store.cached(tx, mission_id)
    missing = {
        u: a - balance[u].available
        for u, a in estimate.items()
        if u in balance and a > balance[u].available
    }
    if not missing or any(balance[u].overrun for u in missing):
        return False
    lent = store.unused(tx, mission_id)
    if any(sum(s.get(u, 0) for s in lent.values()) < need for u, need in missing.items()):
        return False
    by_most = sorted(lent.items(), key=lambda s: (-sum(s[1].get(u, 0) for u in missing), s[0]))
    for slice_id, amounts in by_most:
        if not any(amounts.get(u, 0) > 0 for u, need in missing.items() if need > 0):
            continue
        give_back(tx, slice_id, "reclaimed: an admission through the mission's gate", actor=actor)
        missing = {u: need - amounts.get(u, 0) for u, need in missing.items()}
    after = ledger_store.cached(tx, mission_id)
    return all(a <= after[u].available for u, a in estimate.items() if u in after)


def exhausted(tx: Tx, mission_id: str, balance: Mapping[str, Balance]) -> list[str]:
    """The units of the mission's ``balance`` nothing is left of (L7), counting what
    its open slices lent and did not use: that money is the mission's, so a run
    is not held back for a person while it is only lent (L10, K5). The slices
    are read only when a unit is out of the mission's own money."""
    out = sorted(u for u, b in balance.items() if b.exhausted)
    if not out:
        return out
    lent = store.unused(tx, mission_id).values()
    return [u for u in out if balance[u].available + sum(s.get(u, 0) for s in lent) <= 0]


def revoke(tx: Tx, mission_id: str, why: str, *, actor: str) -> int:
    """Return every open slice of the mission (a new contract version, L10)."""
    lent = store.open_slices(tx, mission_id)
    for s in lent:
        give_back(tx, s["id"], f"revoked: {why}", actor=actor)
    return len(lent)


def outside(tx: Tx, attempt_id: str, *, actor: str) -> None:
    """An attempt is settled or voided through the mission's gate: if its hold
    was taken from a slice still open, the slice is returned first, so the hold
    is the mission's when it is resolved (L1, L6)."""
    found = store.slice_of(tx, attempt_id)
    if found is not None and found["status"] == "open":
        give_back(tx, found["id"], f"attempt {attempt_id} resolved outside it", actor=actor)


def describe(tx: Tx, mission_id: str) -> list[dict[str, Any]]:
    """Every slice the mission lent, with its books, for a reader."""
    return [
        {
            **dict(s),
            "accounts": {u: vars(b) for u, b in ledger_store.cached(tx, s["id"]).items()},
        }
        for s in store.slices(tx, mission_id)
    ]
