"""The allowance ledger (L0-L9): double-entry, append-only, integer amounts.

:mod:`~charter.ledger.accounts` computes the moves (pure arithmetic),
:mod:`~charter.ledger.store` owns the ledger's tables, and
:mod:`~charter.ledger.incidents` keeps the anomalies a person must close.
"""

from charter.ledger.accounts import (
    ACCOUNTS,
    Balance,
    Move,
    balances,
    check_sums,
    fund,
    hold,
    release,
    settle,
)
from charter.ledger.store import cached, from_entries, problems, record

__all__ = [
    "ACCOUNTS",
    "Balance",
    "Move",
    "balances",
    "cached",
    "check_sums",
    "from_entries",
    "fund",
    "hold",
    "problems",
    "record",
    "release",
    "settle",
]
