"""Amounts (A9): integers in [0, 2^63 - 1], in each unit's smallest step.

The one range check for a single amount, below every floor that handles
money (the adapter protocol, contracts, the ledger); each caller raises its
own typed error, which names what was wrong where. Sums are checked where they
are made, in the ledger.
"""

from __future__ import annotations

from typing import TypeGuard

#: The largest amount: what both stores hold exactly in a BIGINT.
MAX_AMOUNT = 2**63 - 1


def is_amount(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an amount: an ``int`` (not a ``bool``) in [0, 2^63 - 1]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_AMOUNT
