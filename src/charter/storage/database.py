"""Transactions over a driver connection, shared by every backend.

A :class:`Tx` is the only way domain code touches the store. It fixes the
store's clock for the transaction, runs SQL through the dialect, and collects
audit events that are chained and written *inside the same transaction* just
before commit (S1). A refusal that must be recorded (an unauthenticated caller,
a denied resolution) is staged with :meth:`Tx.refuse`: the audit event commits,
then the error is raised, and nothing else changes.

Two things keep a transaction short on a networked store:

- **the mission's gate.** Every transaction that changes a mission takes its
  gate first (:meth:`Tx.lock_mission`, or ``transaction(gate=...)`` to take it
  with ``BEGIN``). The gate is also the only way onto the mission's audit
  chain, so the chain's head read under it stays valid until commit.
- **deferred writes.** A statement whose result nobody reads (a ledger entry,
  a counter, an audit event) is given to :meth:`Tx.write`; a backend may send
  it together with the next statement that returns something, or with
  ``COMMIT``. It is still inside the transaction: it commits with everything
  else or not at all, and a failure aborts the whole transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from charter.audit import GENESIS, HASHED_FIELDS, canonical, digest, event_hash
from charter.clock import Clock
from charter.errors import CharterError
from charter.ids import IdFactory
from charter.storage.dialect import Dialect

Row = Mapping[str, Any]
#: An audit chain's head: the last event's sequence number and hash.
Head = tuple[int, str]


class Driver(Protocol):
    """What a backend provides: raw statements and transaction control."""

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any]) -> Any: ...

    def defer(self, sql: str, params: Sequence[Any]) -> None:
        """Run a statement whose result is not needed, now or with the next one."""
        ...

    def begin(self, write: bool, clock: Clock, gate: str | None) -> None:
        """Start a transaction (``gate``: taking that mission's gate first); a
        backend may send this with the transaction's first statement."""
        ...

    def now_us(self) -> int:
        """The store's time for the current transaction (µs)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def gate(self, mission_id: str) -> None:
        """Take the mission's gate until the transaction ends, before any later
        statement: this transaction becomes the only one changing the mission
        or appending to its audit chain."""
        ...

    def head(self, mission_id: str) -> Head | None:
        """The last (seq, hash) of the chain of a mission whose gate is held."""
        ...

    def close(self) -> None: ...


class Refused(BaseException):
    """Carries a refusal out of a transaction body; see :meth:`Tx.refused`."""

    def __init__(self, error: CharterError, event: dict[str, Any] | None, keep: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.event = event
        self.keep = keep


class Tx:
    """One transaction: statements, the store's time, and pending audit events."""

    def __init__(self, driver: Driver, ids: IdFactory, gate: str | None) -> None:
        self._driver = driver
        self._sql = driver.dialect.sql
        self.ids = ids
        self._now_us: int | None = None
        self._events: list[dict[str, Any]] = []
        #: The missions whose gate this transaction holds.
        self._gates: set[str] = set() if gate is None else {gate}

    @property
    def now_us(self) -> int:
        """The store's time, fixed for the whole transaction."""
        if self._now_us is None:
            self._now_us = self._driver.now_us()
        return self._now_us

    # -- statements -----------------------------------------------------------
    def one(self, sql: str, *params: Any) -> Row | None:
        row: Row | None = self._driver.execute(self._sql(sql), params).fetchone()
        return row

    def all(self, sql: str, *params: Any) -> list[Row]:
        return list(self._driver.execute(self._sql(sql), params).fetchall())

    def run(self, sql: str, *params: Any) -> int:
        """Execute a statement; return the number of rows it changed."""
        count: int = self._driver.execute(self._sql(sql), params).rowcount
        return count

    def write(self, sql: str, *params: Any) -> None:
        """A statement whose result is not needed; it may be sent later, in this
        transaction (see the module's docstring)."""
        self._driver.defer(self._sql(sql), params)

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Deferred writes of one statement; an INSERT becomes one multi-row statement."""
        rows = list(rows)
        if len(rows) > 1:
            head, sep, group = sql.rpartition(" VALUES ")
            if sep and head.startswith("INSERT") and group.startswith("("):
                sql = f"{head}{sep}{', '.join([group] * len(rows))}"
                rows = [[v for row in rows for v in row]]
        for row in rows:
            self._driver.defer(self._sql(sql), row)

    # -- audit (S1) ---------------------------------------------------------------
    def audit(
        self,
        mission_id: str,
        kind: str,
        entity: str,
        *,
        actor: str,
        segment: str | None = None,
        epoch: int | None = None,
        before: str | None = None,
        after: str | None = None,
        payload: Any = None,
    ) -> None:
        """Stage an audit event; it is chained and written at commit."""
        self._events.append(
            {
                "mission_id": mission_id,
                "at_us": self.now_us,
                "actor": actor,
                "segment": segment,
                "epoch": epoch,
                "kind": kind,
                "entity": entity,
                "before": before,
                "after": after,
                "payload": canonical(payload if payload is not None else {}),
            }
        )

    def lock_mission(self, mission_id: str) -> None:
        """Take the mission's gate before changing anything of it.

        Every transaction that changes a mission's runs, attempts or allowances
        takes its gate first, so there is one lock order and concurrent workers
        queue instead of deadlocking (SQLite's single writer is a gate already).
        """
        if mission_id not in self._gates:
            self._driver.gate(mission_id)
            self._gates.add(mission_id)

    def refused(
        self,
        error: CharterError,
        *,
        mission_id: str | None,
        kind: str,
        entity: str,
        actor: str,
        payload: Any = None,
        keep_changes: bool = False,
    ) -> Refused:
        """An exception to raise that records a refusal and then raises ``error``.

        By default the transaction's other changes roll back and only the
        refusal's audit event commits: the caller is told, the store records
        who was refused, nothing else changes. ``keep_changes`` commits
        everything staged so far, for refusals whose rule requires a change
        (pausing a run whose allowance is exhausted, L7).
        """
        if mission_id is not None:
            self.audit(mission_id, kind, entity, actor=actor, payload=payload)
        event = self._events[-1] if mission_id is not None else None
        return Refused(error, event, keep_changes)

    def _flush_audit(self) -> None:
        if not self._events:
            return
        # Gates not held yet are taken in a fixed order, so two transactions
        # never wait on each other's chains.
        chains = sorted({ev["mission_id"] for ev in self._events})
        for mission_id in chains:
            self.lock_mission(mission_id)
        heads = {m: self._driver.head(m) or (0, GENESIS) for m in chains}
        rows: list[tuple[Any, ...]] = []
        for ev in self._events:
            mission_id = ev["mission_id"]
            seq, prev = heads[mission_id]
            ev["seq"] = seq + 1
            ev["payload_hash"] = digest(ev["payload"])
            h = event_hash(prev, {k: ev[k] for k in HASHED_FIELDS})
            heads[mission_id] = (seq + 1, h)
            rows.append(
                (
                    mission_id,
                    ev["seq"],
                    ev["at_us"],
                    ev["actor"],
                    ev["segment"],
                    ev["epoch"],
                    ev["kind"],
                    ev["entity"],
                    ev["before"],
                    ev["after"],
                    ev["payload"],
                    ev["payload_hash"],
                    prev,
                    h,
                )
            )
        self.many(
            "INSERT INTO audit_events (mission_id, seq, at_us, actor, segment, epoch, kind, "
            "entity, before, after, payload, payload_hash, prev_hash, hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )


class Database:
    """A backend connection with serialised, bounded transactions."""

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        ids: IdFactory,
    ) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.clock = clock
        self.ids = ids
        self._lock = threading.RLock()

    @contextmanager
    def transaction(self, *, write: bool = True, gate: str | None = None) -> Iterator[Tx]:
        """A transaction; ``write`` takes the writer lock up front (BEGIN IMMEDIATE),
        ``gate`` takes that mission's gate with ``BEGIN`` (one round trip)."""
        with self._lock:
            self.driver.begin(write, self.clock, gate)
            tx = Tx(self.driver, self.ids, gate)
            try:
                yield tx
            except Refused as refusal:
                if not refusal.keep:
                    self.driver.rollback()
                    tx._events = [refusal.event] if refusal.event else []
                    tx._gates = set()  # the gates went with the rollback
                    if tx._events:
                        self.driver.begin(True, self.clock, None)
                if tx._events or refusal.keep:
                    self._commit(tx)
                raise refusal.error from None
            except BaseException:
                self.driver.rollback()
                raise
            else:
                self._commit(tx)

    def _commit(self, tx: Tx) -> None:
        try:
            tx._flush_audit()
            self.driver.commit()
        except BaseException:
            self.driver.rollback()
            raise

    def read(self) -> Any:
        """A read-only transaction with a consistent snapshot."""
        return self.transaction(write=False)

    def close(self) -> None:
        with self._lock:
            self.driver.close()
