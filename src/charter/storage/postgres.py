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
    from psycopg.rows import dict_row
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]


def _translate(exc: Exception, busy_timeout: float) -> Exception:
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
        try:
            with self._conn.cursor() as cur:
                cur.executemany(sql, list(rows))
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None

    def begin(self, write: bool) -> None:
        self.execute("BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())

    def commit(self) -> None:
        self.execute("COMMIT", ())

    def rollback(self) -> None:
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")

    def now_us(self, clock: Clock) -> int:
        if not isinstance(clock, SystemClock):
            return clock.now_us()  # an injected clock (tests, simulations)
        row = self._conn.execute(
            "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT AS now"
        ).fetchone()
        assert row is not None
        return int(row["now"])

    def lock_chain(self, mission_id: str) -> None:
        """Serialise appends to one mission's audit chain until the transaction ends."""
        self.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (mission_id,))

    def close(self) -> None:
        self._conn.close()
