"""The allowance ledger (L0-L9): double-entry, append-only, integer amounts.

Per mission and unit there are three balance accounts — ``available``,
``held``, ``spent`` — funded from a ``limit`` source account, plus the
``overrun`` memo (the sum of ``overrun`` entries). Every entry moves a positive
amount from one account to another, in the manner of two-phase transfers:

==========  ======================  =====================================
entry kind  move                    when
==========  ======================  =====================================
fund        limit -> available      contract created or a limit raised
hold        available -> held       admission (L3)
spend       held -> spent           settlement, up to the hold (L2)
release     held -> available       settlement below the hold, or VOIDED
overrun     available -> spent      settlement above the hold (L5)
reduce      available -> limit      a limit lowered
lease       available -> held       a slice lent to a worker (L10)
==========  ======================  =====================================

A slice lent to a worker (L10) is held whole in its mission's books; in its
own books, kept on its own chain, the grant is a ``fund`` and its attempts'
holds and settlements are the same entries as a mission's. When it is
returned, its mission settles the grant as one hold: what its attempts spent
is spent, the rest released, what they spent above it an overrun; the holds
of its attempts still open stay held.

This module only *computes* moves, as pure arithmetic; :mod:`charter.ledger.store`
applies them to the chain's books in one transaction and rebuilds balances
from entries. An entry is carried by the audit event of the transition that
makes it (:func:`carry`): the event is hashed into the mission's chain (S1),
so an entry edited, added or removed afterwards breaks the chain, and the
ledger costs no table of its own per attempt.

Amounts are integers in [0, 2^63 - 1] (A9): :func:`charter.amounts.is_amount` is the one range
check for a single amount (a limit, an estimate, an actual cost), and
:func:`check_sums` refuses moves whose sums with the recorded balances would leave
that range, with :class:`~charter.errors.AmountOverflow`, before writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, fields
from typing import Any

from charter.amounts import MAX_AMOUNT
from charter.errors import AmountOverflow

ACCOUNTS = ("available", "held", "spent")


#: The largest amount, and the largest sum, the ledger holds: a signed 64-bit
#: integer is what both stores keep exactly (A9).
@dataclass(frozen=True)
class Move:
    unit: str
    kind: str
    source: str
    target: str
    amount: int


#: Each kind of entry and the accounts it moves its amount from and to: an entry
#: is its kind, unit and amount, and its accounts follow from its kind.
ROUTES: dict[str, tuple[str, str]] = {
    "fund": ("limit", "available"),
    "reduce": ("available", "limit"),
    "hold": ("available", "held"),
    "spend": ("held", "spent"),
    "release": ("held", "available"),
    "overrun": ("available", "spent"),
    "lease": ("available", "held"),
}


def _move(unit: str, kind: str, amount: int) -> Move:
    source, target = ROUTES[kind]
    return Move(unit, kind, source, target, amount)


def fund(unit: str, amount: int) -> list[Move]:
    if amount > 0:
        return [_move(unit, "fund", amount)]
    if amount < 0:
        return [_move(unit, "reduce", -amount)]
    return []


def hold(estimate: Mapping[str, int]) -> list[Move]:
    return [_move(u, "hold", a) for u, a in estimate.items() if a > 0]


def release(held: Mapping[str, int]) -> list[Move]:
    """Release a hold in full (VOIDED: never sent, L6)."""
    return [_move(u, "release", a) for u, a in held.items() if a > 0]


def settle(held: Mapping[str, int], actual: Mapping[str, int]) -> list[Move]:
    """Resolve a hold exactly once against an actual cost (L2, L5, L6).

    Spend up to the hold, release the rest; an actual above the hold is
    recorded in full as an overrun (never clamped).
    """
    moves: list[Move] = []
    for unit in sorted(set(held) | set(actual)):
        h = held.get(unit, 0)
        a = actual.get(unit, 0)
        spent = min(h, a)
        if spent:
            moves.append(_move(unit, "spend", spent))
        if h > a:
            moves.append(_move(unit, "release", h - a))
        elif a > h:
            moves.append(_move(unit, "overrun", a - h))
    return moves


@dataclass
class Balance:
    """One unit's accounts in a mission (L0-L2), in the unit's smallest step:
    ``available + held + spent == limit``; ``overrun`` is what settlements spent
    above their holds (L5)."""

    limit: int = 0
    available: int = 0
    held: int = 0
    spent: int = 0
    overrun: int = 0

    @property
    def exhausted(self) -> bool:
        """Nothing left to admit against (L7), as admission reads it. An overrun
        leaves ``available`` below zero until a raised limit covers it; ``overrun``
        itself is a memo of what was ever spent above holds and never goes down,
        so it cannot say whether the unit is exhausted now."""
        return self.available <= 0


#: A balance's accounts as a snapshot's records name them, in a balance's order
#: (the columns of the ``allowances`` and ``escrow_accounts`` tables before
#: schema 23; a snapshot still carries them so).
RECORD_FIELDS = ("limit_amount", "available", "held", "spent", "overrun")


def as_records(key: str, chain: str, books: Mapping[str, Balance]) -> list[dict[str, Any]]:
    """A chain's balances as a snapshot's records: one per unit, in unit order,
    the chain named under ``key``."""
    return [
        {key: chain, "unit": unit, **dict(zip(RECORD_FIELDS, astuple(bal), strict=True))}
        for unit, bal in sorted(books.items())
    ]


def from_records(
    key: str, records: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, tuple[int, int, int, int, int]]]:
    """Balance records (as :func:`as_records` makes them) back to each chain's
    books: chain -> unit -> its five sums."""
    books: dict[str, dict[str, tuple[int, int, int, int, int]]] = {}
    for r in records:
        limit, available, held, spent, overrun = (r[f] for f in RECORD_FIELDS)
        books.setdefault(r[key], {})[r["unit"]] = (limit, available, held, spent, overrun)
    return books


def balances(moves: Iterable[Move]) -> dict[str, Balance]:
    """Per-unit sums of moves: the change a transaction makes to cached balances,
    or, over all of a mission's entries, its balances rebuilt from scratch (L2)."""
    out: dict[str, Balance] = {}
    for m in moves:
        _apply(out.setdefault(m.unit, Balance()), m)
    return out


def _apply(balance: Balance, move: Move) -> None:
    """Add one move to a per-unit sum (the ledger's arithmetic, not the balance's:
    a :class:`Balance` a reader is handed is a record)."""
    for account, sign in ((move.source, -1), (move.target, 1)):
        if account == "limit":
            balance.limit -= sign * move.amount
        else:
            setattr(balance, account, getattr(balance, account) + sign * move.amount)
    if move.kind == "overrun":
        balance.overrun += move.amount


def check_sums(current: Mapping[str, Balance], change: Mapping[str, Balance]) -> None:
    """Refuse a change that takes a balance out of the ledger's range (A9).

    ``limit``, ``held``, ``spent``, ``overrun`` and ``spent + held`` stay in
    [0, 2^63 - 1]. Keeping what is spent and held together in range means
    every open hold can always be settled up to its size (a write-off always
    fits), and ``available`` (limit minus both) never falls below -(2^63 - 1).
    """
    for unit, delta in sorted(change.items()):
        before = current.get(unit, Balance())
        after = Balance(
            *(getattr(before, f.name) + getattr(delta, f.name) for f in fields(Balance))
        )
        sums = {
            "limit": after.limit,
            "held": after.held,
            "spent": after.spent,
            "overrun": after.overrun,
            "spent + held": after.spent + after.held,
        }
        for account, amount in sums.items():
            if not 0 <= amount <= MAX_AMOUNT:
                raise AmountOverflow(
                    f"{unit} {account} would be {amount}, outside the ledger's range "
                    "[0, 2**63 - 1]; nothing was recorded. A sum this large means some "
                    "report is wrong: check it, and settle at a cost that fits",
                    unit=unit,
                    account=account,
                    amount=amount,
                )


def carry(
    moves: Iterable[Move], attempt_id: str | None, price_source: str | None
) -> dict[str, Any]:
    """A transaction's entries as its audit event carries them (the payload's
    ``ledger``): the attempt they belong to, where the price came from (L8),
    and each entry as ``[kind, unit, amount]``."""
    return {
        "attempt": attempt_id,
        "price_source": price_source,
        "moves": [[m.kind, m.unit, m.amount] for m in moves],
    }


def carried(ledger: Any) -> tuple[str | None, str | None, list[Move]]:
    """The attempt, price source and entries an event carries (see :func:`carry`);
    :class:`ValueError` when it is not that shape, as in a store or snapshot
    edited by hand."""
    try:
        attempt, source = ledger["attempt"], ledger["price_source"]
        moves = [_move(unit, kind, amount) for kind, unit, amount in ledger["moves"]]
    except (KeyError, TypeError, ValueError):
        raise ValueError("not a ledger's entries") from None
    fine = all(
        isinstance(m.unit, str) and type(m.amount) is int and 0 < m.amount <= MAX_AMOUNT
        for m in moves
    )
    if not fine or not all(isinstance(v, str | None) for v in (attempt, source)):
        raise ValueError("not a ledger's entries")
    return attempt, source, moves
