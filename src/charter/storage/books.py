"""A chain's books as its head row keeps them: per unit, five running sums.

Since schema 23 the balances a mission (or an escrow slice, L10) holds are not
rows of their own: they sit on the row that keeps the chain's head, in the
column ``books``, and move in the statement that moves the head. Every change of
the books is carried, as ledger entries, by an event that moves the head (L2),
so the two are written by one statement and a crash cannot leave them apart;
and the read that finds the head under the gate (S1) hands over the books with
it, so admission decides on them (L3) without a read of its own.

The storage room knows only the shape: a JSON object, unit -> ``[limit,
available, held, spent, overrun]``, in canonical form. What the five sums mean,
and which moves change them, is the ledger's (:mod:`charter.ledger.accounts`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence

from charter.hashing import canonical

#: One unit's five sums, in the order the column keeps them.
Sums = tuple[int, int, int, int, int]

#: The books of a chain that has none yet (the column's default).
EMPTY = "{}"


@functools.lru_cache(maxsize=1024)
def read(text: str) -> Mapping[str, Sums]:
    """The books a head row keeps, by unit. Read once per text (a mission's
    admission and settlement read the books its last commit left): the mapping
    is shared, so it is never changed, only :func:`added` to."""
    found: dict[str, list[int]] = json.loads(text)
    return {unit: (s[0], s[1], s[2], s[3], s[4]) for unit, s in found.items()}


def added(books: Mapping[str, Sums], change: Mapping[str, Sequence[int]]) -> dict[str, Sums]:
    """``books`` with ``change`` added, unit by unit (a unit not there yet starts
    at zero: opening an account is a change of nothing)."""
    out = dict(books)
    for unit, delta in change.items():
        l, a, h, s, o = out.get(unit, (0, 0, 0, 0, 0))  # noqa: E741 (the five sums)
        out[unit] = (l + delta[0], a + delta[1], h + delta[2], s + delta[3], o + delta[4])
    return out


def write(books: Mapping[str, Sums]) -> str:
    """The column's text for ``books`` (canonical: equal books, equal text)."""
    return canonical({unit: list(sums) for unit, sums in books.items()})
