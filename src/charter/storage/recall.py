"""What a networked store's connection remembers of a mission between its
transactions, and the guards that hold a transaction to it.

A transaction on a networked store pays a round trip for every answer it
waits for. Most of an executor's transactions on a mission begin with the same
reads (the run's standing, the chain's head), and between two of them nobody
else usually changes the mission. So a connection keeps what those reads
returned as its last commit on the mission left them (read again inside that
commit, after its writes, under the gate), and the next transaction may decide
on that copy without asking.

Nothing is trusted unchecked. For each remembered row the transaction used, it
sends a **guard** ahead of its writes, in the same pipeline and under the same
gate: the read again, compared with the copy, dividing by zero when they
differ. A conditional write whose row count the transaction assumed (one row)
is sent as a guard too, and so is the clock the transaction estimated. The
server runs them in order, so a failed guard aborts the transaction before any
write it covers, and nothing of it is stored: the engine runs the transaction
again on fresh reads (:class:`~charter.errors.StoreChanged`). A transaction
therefore commits only if every row it decided on was, under the gate, the row
a fresh read returns, which is what a transaction that read first decides on.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

from charter.storage.driver import Head

#: A read as it is sent (statement text and parameters): the key of its copy.
Key = tuple[str, tuple[Any, ...]]
#: A remembered row (``None``: the read found none).
Recalled = dict[str, Any] | None

#: A statement waiting to be sent, and what to do with its result.
Pending = tuple[str, Sequence[Any], "Callable[[Any], None] | None"]

#: Reads kept per mission: each is read again at every commit on the mission,
#: so only those of its last two transactions (an executor's turns), and at
#: most this many of them, the most recently made.
KEYS_PER_MISSION = 4
#: Missions remembered per connection, the most recently committed on kept.
MISSIONS = 256
#: How far the clock a transaction estimated may be from the server's, when
#: the guard runs after the gate: further, and it is run again with the
#: server's clock read after the gate (F1). It bounds how much younger a lease
#: may look than by a clock read after the gate.
CLOCK_SLACK_US = 20_000
#: Transactions on a mission decided on fresh reads after a guard failed there,
#: doubling with each failure in a row up to this (several workers sharing a
#: mission change it under each other: guessing would cost a round trip each).
MOST_DOUBT = 64


class Memory:
    """One mission's copy: its chain head and the rows of its repeated reads."""

    def __init__(self, head: Head, rows: dict[Key, Recalled]) -> None:
        self.head = head
        self.rows = rows


class Memories:
    """A connection's copies of the missions it committed on, and its doubts."""

    def __init__(self) -> None:
        self._memories: collections.OrderedDict[str, Memory] = collections.OrderedDict()
        #: The reads to take again at each commit, per mission, with the number of
        #: the mission's transaction that last made each.
        self._keys: dict[str, dict[Key, int]] = {}
        #: Transactions committed on each mission by this connection.
        self._ticks: dict[str, int] = {}
        #: mission -> (transactions still to decide on fresh reads, failures in a row)
        self._doubt: dict[str, tuple[int, int]] = {}

    def recallable(self, mission_id: str) -> Memory | None:
        """The copy a transaction on the mission may decide on, if it may now."""
        skip, streak = self._doubt.get(mission_id, (0, 0))
        if skip:
            self._doubt[mission_id] = (skip - 1, streak)
            return None
        return self._memories.get(mission_id)

    def copy(self, mission_id: str) -> Memory | None:
        return self._memories.get(mission_id)

    def want(self, mission_id: str, key: Key) -> None:
        """``key`` is read again at the next commits on the mission."""
        keys = self._keys.setdefault(mission_id, {})
        keys.pop(key, None)  # the most recent last
        keys[key] = self._ticks.get(mission_id, 0)
        while len(keys) > KEYS_PER_MISSION:
            del keys[next(iter(keys))]

    def wanted(self, mission_id: str) -> list[Key]:
        """The reads made by the mission's last two transactions here."""
        keys = self._keys.get(mission_id, {})
        recent = self._ticks.get(mission_id, 0) - 1
        for key in [k for k, tick in keys.items() if tick < recent]:
            del keys[key]
        return list(keys)

    def committed(self, mission_id: str) -> None:
        """A transaction on the mission committed here."""
        self._ticks[mission_id] = self._ticks.get(mission_id, 0) + 1

    def keep(self, mission_id: str, memory: Memory) -> None:
        self._memories[mission_id] = memory
        self._memories.move_to_end(mission_id)
        while len(self._memories) > MISSIONS:
            old, _ = self._memories.popitem(last=False)
            for kept in (self._keys, self._ticks, self._doubt):
                kept.pop(old, None)

    def held(self, mission_id: str) -> None:
        """A transaction that decided on the copy committed: no doubt left."""
        self._doubt.pop(mission_id, None)

    def forget(self, mission_id: str) -> None:
        self._memories.pop(mission_id, None)

    def changed(self, mission_id: str) -> None:
        """A guard failed: forget the copy, and decide on fresh reads for a while."""
        self.forget(mission_id)
        _, streak = self._doubt.get(mission_id, (0, 0))
        self._doubt[mission_id] = (min(1 << streak, MOST_DOUBT), streak + 1)

    def clear(self) -> None:
        self._memories.clear()


def matching(sql: str, params: Sequence[Any], row: Recalled) -> tuple[str, list[Any]] | None:
    """A guard that fails unless ``sql`` still returns ``row`` (one row, equal
    in every column, or none); ``None`` when ``row`` holds a value that cannot be
    compared as sent (only text, integers, booleans and NULL are)."""
    if row is None:
        return f"SELECT 1 / (COUNT(*) = 0)::int AS ok FROM ({sql}) AS fresh", list(params)
    if not all(v is None or isinstance(v, str | int) for v in row.values()):
        return None
    columns = ", ".join(f'fresh."{name}"' for name in row)
    marks = ", ".join("%s" for _ in row)
    same = f"ROW({columns}) IS NOT DISTINCT FROM ROW({marks})"
    return (
        f"SELECT 1 / COALESCE(COUNT(*) = 1 AND bool_and({same}), false)::int AS ok "
        f"FROM ({sql}) AS fresh",
        [*row.values(), *params],
    )


def asserting(sql: str) -> str | None:
    """A one-row write as a guard: it fails unless the write changes exactly one
    row; ``None`` for a statement that cannot be wrapped so."""
    head = sql.lstrip()[:6].upper()
    if head not in ("UPDATE", "INSERT", "DELETE") or "RETURNING" in sql.upper():
        return None
    return f"WITH changed AS ({sql} RETURNING 1) SELECT 1 / (COUNT(*) = 1)::int AS ok FROM changed"


class Guard:
    """Marks a statement as a guard: its failure means the transaction decided
    on rows that had changed (see recall); ``take`` gets its row, if wanted."""

    __slots__ = ("take",)

    def __init__(self, take: Callable[[Any], None] | None = None) -> None:
        self.take = take

    def __call__(self, result: Any) -> None:
        if self.take is not None:
            self.take(result)


GUARD = Guard()


def merged(batch: list[Pending]) -> list[Pending]:
    """Consecutive guards that only read, as one statement: the server binds
    and runs one statement instead of several (each returns one row or fails)."""
    out: list[Pending] = []
    reads: list[Pending] = []
    for item in [*batch, None]:
        if item is not None and isinstance(item[2], Guard) and item[0].startswith("SELECT"):
            reads.append(item)
            continue
        if len(reads) > 1:
            # Only the head's guard has a row to give (the clock, as ``now``).
            takes = [(i, g[2]) for i, g in enumerate(reads) if g[2] is not GUARD]
            # Every guard's ``ok`` is part of what is returned: a column nobody
            # asks for may never be computed, and its division never made.
            oks = " + ".join(f"g{i}.ok" for i in range(len(reads)))
            clock = "".join(f"g{i}.now, " for i, _ in takes[:1])
            joined = ", ".join(f"({g[0]}) AS g{i}" for i, g in enumerate(reads))
            params = [v for g in reads for v in g[1]]
            sql = f"SELECT {clock}{oks} AS ok FROM {joined}"
            out.append((sql, params, takes[0][1] if takes else GUARD))
        else:
            out += reads
        reads = []
        if item is not None:
            out.append(item)
    return out
