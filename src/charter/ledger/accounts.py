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
==========  ======================  =====================================

This module only *computes* moves, as pure arithmetic; :mod:`charter.ledger.store`
applies them and the cached balances in one transaction and rebuilds balances
from entries.

Amounts are integers in [0, 2^63 - 1] (A9): :func:`charter.amounts.is_amount` is the one range
check for a single amount (a limit, an estimate, an actual cost), and
:func:`check_sums` refuses moves whose sums with the recorded balances would leave
that range, with :class:`~charter.errors.AmountOverflow`, before writing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

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


def fund(unit: str, amount: int) -> list[Move]:
    if amount > 0:
        return [Move(unit, "fund", "limit", "available", amount)]
    if amount < 0:
        return [Move(unit, "reduce", "available", "limit", -amount)]
    return []


def hold(estimate: Mapping[str, int]) -> list[Move]:
    return [Move(u, "hold", "available", "held", a) for u, a in estimate.items() if a > 0]


def release(held: Mapping[str, int]) -> list[Move]:
    """Release a hold in full (VOIDED: never sent, L6)."""
    return [Move(u, "release", "held", "available", a) for u, a in held.items() if a > 0]


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
            moves.append(Move(unit, "spend", "held", "spent", spent))
        if h > a:
            moves.append(Move(unit, "release", "held", "available", h - a))
        elif a > h:
            moves.append(Move(unit, "overrun", "available", "spent", a - h))
    return moves


@dataclass
class Balance:
    limit: int = 0
    available: int = 0
    held: int = 0
    spent: int = 0
    overrun: int = 0

    def apply(self, move: Move) -> None:
        for account, sign in ((move.source, -1), (move.target, 1)):
            if account == "limit":
                self.limit -= sign * move.amount
            else:
                setattr(self, account, getattr(self, account) + sign * move.amount)
        if move.kind == "overrun":
            self.overrun += move.amount

    @property
    def exhausted(self) -> bool:
        return self.available <= 0 or self.overrun > 0


def balances(moves: Iterable[Move]) -> dict[str, Balance]:
    """Per-unit sums of moves: the change a transaction makes to cached balances,
    or, over all of a mission's entries, its balances rebuilt from scratch (L2)."""
    out: dict[str, Balance] = {}
    for m in moves:
        out.setdefault(m.unit, Balance()).apply(m)
    return out


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
