"""Lanes: a mission's transactions made through a slice of its allowance (L10).

A mission's gate serialises every transaction that changes it: its allowance's
row and its audit chain's head are each one row that every such transaction
moves, so concurrent workers on one mission queue on them, through every
commit's sync. A worker that has leased a slice of the allowance
(:mod:`charter.ledger.escrow`) makes its own transactions on the mission in a
**lane**: for the time the lane is open in its context, a transaction on the
mission takes the mission's gate *shared* (any number of lanes at once, none
while anyone holds it whole) and the slice's gate whole; it appends to the
slice's own chain, moves the slice's own accounts and counters. What changes
the mission itself (a lease, a return, a limit, a recovery, a person's
decision) takes the mission's gate whole, as before, and so never meets a lane
half-way through.

A lane is opened for one context (:func:`through`: a thread, a task), never
for a process: the same process's other transactions on the mission (an
operator's decision, a recovery) keep taking the mission's gate whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Lane:
    """A slice of ``mission_id``'s allowance its holder admits against.

    ``chain`` is the slice's id: its gate, its audit chain and the row keeping
    both. ``expires_us``: when its lease ends, by the store's clock (a
    transaction that begins at or after it goes through the mission's gate).
    ``members``: attempts this process admitted in the slice and has
    not settled (the one thing a settlement in the lane needs to know: the
    hold it resolves is the slice's). ``fell_back``: a transaction could not
    go through the slice (it was short, lapsed or returned) and went through
    the mission's gate instead; its holder renews the slice.

    Whether a transaction goes through the lane is decided when it begins,
    before its body runs (:meth:`charter.storage.Database.transaction`): the
    slice's head is read under the slice's gate, with the mission's held
    shared, so nothing can return the slice until the transaction ends; a
    slice returned or lapsed sends the whole transaction through the
    mission's gate instead. No body is ever half on a slice.
    """

    mission_id: str
    chain: str
    expires_us: int
    members: set[str] = field(default_factory=set)
    fell_back: bool = False


_LANES: ContextVar[dict[str, Lane]] = ContextVar("charter_lanes", default={})  # noqa: B039


def current() -> dict[str, Lane]:
    """The lanes open in this context, by mission."""
    return _LANES.get()


def of(mission_id: str | None) -> Lane | None:
    """The lane open for ``mission_id`` in this context, if any."""
    return None if mission_id is None else _LANES.get().get(mission_id)


@contextmanager
def through(lane: Lane) -> Iterator[Lane]:
    """Make this context's transactions on ``lane.mission_id`` go through the lane."""
    token = _LANES.set({**_LANES.get(), lane.mission_id: lane})
    try:
        yield lane
    finally:
        _LANES.reset(token)


@contextmanager
def bypassed(mission_id: str) -> Iterator[None]:
    """This context's transactions on ``mission_id`` take its gate whole again."""
    lanes = _LANES.get()
    token = _LANES.set({m: lane for m, lane in lanes.items() if m != mission_id})
    try:
        yield
    finally:
        _LANES.reset(token)
