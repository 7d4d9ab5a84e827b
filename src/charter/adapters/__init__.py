"""What an adapter needs, and nothing of the store (A1-A7, F3, R7).

An adapter is handed a :class:`Dispatch` and answers an :class:`Outcome`, or
:class:`Evidence` when asked to reconcile. The protocol lives in
:mod:`~charter.adapters.protocol`; importing this package loads no store.
"""

from charter.adapters.protocol import (
    Adapter,
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    RecordedAttempt,
)

__all__ = [
    "Adapter",
    "Dispatch",
    "EffectClass",
    "Estimate",
    "Evidence",
    "Operation",
    "Outcome",
    "RecordedAttempt",
]
