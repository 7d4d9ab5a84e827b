"""The audit room's records: plain data (its store maps rows to them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChainHead:
    """A chain's head as its row records it: the last event's ``seq`` and ``hash``
    (``0`` and ``None`` for an empty chain), and how many of its first events were
    hashed the pre-6 way (``legacy``: the length of the chain when the store was
    upgraded; ``0`` for chains begun since)."""

    seq: int
    hash: str | None
    legacy: int
