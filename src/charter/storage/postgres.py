"""The PostgreSQL backend (psycopg 3), for several workers on several machines.

The same SQL as SQLite runs here through the dialect layer. What differs is
how writers are kept apart: SQLite has one writer at a time, PostgreSQL has
row locks. Every statement that decides (ownership, allowances) locks its rows
with ``FOR UPDATE`` (allowances in a fixed order, L3), conditional updates
re-check their ``WHERE`` after a wait (so a hold is still resolved once), and
appends to a mission's audit chain are serialised by a transaction-scoped
advisory lock on the mission. ``lock_timeout`` bounds every wait: a busy store
gives :class:`~charter.errors.StoreBusy`, never an unbounded wait.

The store's clock is the server's (``clock_timestamp()``), so leases mean the
same on every machine; tests may inject a clock instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from charter.clock import Clock, SystemClock
from charter.errors import ConfigError, StoreBusy, StoreConflict, StoreError
from charter.storage import dialect

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.rows import dict_row
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]


_NOW = "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT AS now"


def _translate(exc: Exception, busy_timeout: float) -> Exception:
    if isinstance(exc, pg_errors.DeadlockDetected):
        return StoreBusy(
            "two workers waited on each other's rows and the server chose this one to give "
            "way; nothing was changed — try again",
            retryable=True,
        )
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled):
        return StoreBusy(
            f"the PostgreSQL store stayed busy for {busy_timeout:g}s (rows locked by another "
            "worker); try again, or raise busy_timeout_seconds",
            retryable=True,
        )
    if isinstance(exc, psycopg.IntegrityError):
        return StoreConflict(f"the store refused a write: {exc}")
    return StoreError(f"PostgreSQL error: {exc}")


class PostgresDriver:
    """One connection to one PostgreSQL database (and schema, via ``search_path``)."""

    def __init__(self, url: str, *, busy_timeout: float = 5.0) -> None:
        if psycopg is None:
            raise ConfigError("the PostgreSQL store needs psycopg: pip install 'charter[postgres]'")
        self.dialect = dialect.postgresql()
        self._busy_timeout = busy_timeout
        try:
            self._conn = psycopg.connect(
                url, autocommit=True, row_factory=dict_row, prepare_threshold=0
            )
            ms = max(1, round(busy_timeout * 1000))
            self._conn.execute(f"SET lock_timeout = {ms}")
            self._conn.execute("SET synchronous_commit = on")
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the PostgreSQL store: {exc}") from None

    def execute(self, sql: str, params: Sequence[Any]) -> Any:
        try:
            return self._conn.execute(sql, params or None)
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if not rows:
            return
        head, sep, group = sql.rpartition(" VALUES ")
        if len(rows) == 1 or (sep and head.startswith("INSERT") and group.startswith("(")):
            # One statement, one round trip: a multi-row VALUES list for inserts.
            many = f"{head}{sep}{', '.join([group] * len(rows))}" if sep else sql
            self.execute(many, [v for row in rows for v in row])
            return
        try:
            with self._conn.cursor() as cur:
                cur.executemany(sql, rows)
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None

    def begin(self, write: bool, clock: Clock) -> int:
        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        if not isinstance(clock, SystemClock):
            self.execute(begin, ())
            return clock.now_us()  # an injected clock (tests, simulations)
        # The server's clock, read in the same round trip as BEGIN.
        try:
            # Two statements in one message: simple protocol, never prepared.
            cur = self._conn.execute(f"{begin}; {_NOW}", prepare=False)
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None
        while cur.nextset():
            row = cur.fetchone()
            if row is not None:
                return int(row["now"])
        raise StoreError("PostgreSQL did not report its clock")

    def commit(self) -> None:
        self.execute("COMMIT", ())

    def rollback(self) -> None:
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")

    def chain_head(self, mission_id: str) -> tuple[int, str] | None:
        """Lock the mission's chain (advisory, until the transaction ends), then read
        its head: two statements in one round trip, run in order, the read with a
        fresh snapshot taken after the lock is held."""
        m = sql.Literal(mission_id)
        query = sql.SQL(
            "SELECT pg_advisory_xact_lock(hashtextextended({m}, 0)); "
            "SELECT seq, hash FROM audit_events WHERE mission_id = {m} "
            "ORDER BY seq DESC LIMIT 1"
        ).format(m=m)
        try:
            cur = self._conn.execute(query, prepare=False)
            cur.nextset()
            row = cur.fetchone()
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None
        return None if row is None else (row["seq"], row["hash"])

    def close(self) -> None:
        self._conn.close()
