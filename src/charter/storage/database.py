"""Transactions over a driver connection, shared by every backend.

A :class:`Tx` is the only way domain code touches the store. It fixes the
store's clock for the transaction, runs SQL through the dialect, and collects
audit events that are chained and written *inside the same transaction* just
before commit (S1). A refusal that must be recorded (an unauthenticated caller,
a denied resolution) is staged with :meth:`Tx.refuse`: the audit event commits,
then the error is raised, and nothing else changes.
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


class Driver(Protocol):
    """What a backend provides: raw statements and transaction control."""

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any]) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def begin(self, write: bool, clock: Clock) -> int:
        """Start a transaction; return the store's time for it (µs)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def chain_head(self, mission_id: str) -> tuple[int, str] | None:
        """The last (seq, hash) of a mission's audit chain, with this transaction
        made its only appender until it ends."""
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

    def __init__(self, driver: Driver, now_us: int, ids: IdFactory) -> None:
        self._driver = driver
        self._sql = driver.dialect.sql
        self.now_us = now_us
        self.ids = ids
        self._events: list[dict[str, Any]] = []
        self._heads: dict[str, tuple[int, str]] = {}

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

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._driver.executemany(self._sql(sql), rows)

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
        """Take the mission's write gate (PostgreSQL; SQLite has one writer anyway).

        Every transaction that changes a mission's runs, attempts or allowances
        takes its mission row first, so there is one lock order and concurrent
        workers queue instead of deadlocking.
        """
        if not self._driver.dialect.single_writer:
            self.one("SELECT 1 AS x FROM missions WHERE id = ? {lock}", mission_id)

    def seed_head(self, mission_id: str, seq: int | None, hash_: str | None) -> None:
        """The chain head read earlier in this transaction (saves a query at commit)."""
        self._heads[mission_id] = (seq, hash_) if seq is not None and hash_ else (0, GENESIS)

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
        heads = self._heads
        if not self._driver.dialect.single_writer:
            heads.clear()  # other writers may append meanwhile: seeds are not enough
        # In a fixed order, so two transactions never wait on each other's chains.
        for mission_id in sorted({ev["mission_id"] for ev in self._events}):
            if mission_id not in heads:
                last = self._driver.chain_head(mission_id)
                heads[mission_id] = last if last is not None else (0, GENESIS)
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
    def transaction(self, *, write: bool = True) -> Iterator[Tx]:
        """A transaction; ``write`` takes the writer lock up front (BEGIN IMMEDIATE)."""
        with self._lock:
            tx = Tx(self.driver, self.driver.begin(write, self.clock), self.ids)
            try:
                yield tx
            except Refused as refusal:
                if not refusal.keep:
                    self.driver.rollback()
                    tx._events = [refusal.event] if refusal.event else []
                    tx._heads = {}  # another writer may have appended meanwhile
                    if tx._events:
                        self.driver.begin(True, self.clock)
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
