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

from collections.abc import Callable, Sequence
from typing import Any

from charter.clock import Clock, SystemClock
from charter.errors import ConfigError, StoreBusy, StoreConflict, StoreError
from charter.storage import dialect
from charter.storage.database import Head

try:
    import psycopg
    from psycopg import errors as pg_errors
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


#: A statement waiting to be sent, and what to do with its result.
_Pending = tuple[str, Sequence[Any], "Callable[[Any], None] | None"]

_GATE = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
#: A statement of its own after the lock, so its snapshot sees every append before
#: it; the clock is read there too, so a wait for the gate does not age it.
_HEAD = (
    "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT AS now, "
    "(SELECT seq FROM audit_events WHERE mission_id = %s ORDER BY seq DESC LIMIT 1) AS seq, "
    "(SELECT hash FROM audit_events WHERE mission_id = %s ORDER BY seq DESC LIMIT 1) AS hash"
)


class PostgresDriver:
    """One connection to one PostgreSQL database (and schema, via ``search_path``).

    Round trips are what an attempt costs here, so a transaction makes few.
    Nothing is sent until a statement needs its result: ``BEGIN``, the
    server's clock, the mission's gate and the deferred writes wait, and
    travel with that statement or with ``COMMIT``. Such a batch is one
    simple-protocol message with its values bound by the client (psycopg's
    ``ClientCursor``): the server runs its statements in order and stops at the
    first error, which aborts the transaction.
    """

    def __init__(self, url: str, *, busy_timeout: float = 5.0) -> None:
        if psycopg is None:
            raise ConfigError("the PostgreSQL store needs psycopg: pip install 'charter[postgres]'")
        self.dialect = dialect.postgresql()
        self._busy_timeout = busy_timeout
        self._pending: list[_Pending] = []
        self._now: int | None = None
        self._heads: dict[str, Head | None] = {}
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
        if self._pending:
            return self._send((sql, params, None))
        try:
            return self._conn.execute(sql, params or None)
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None

    def defer(self, sql: str, params: Sequence[Any]) -> None:
        self._pending.append((sql, params, None))

    def _send(self, last: _Pending | None = None) -> Any:
        """Everything pending (and ``last``) in one pipeline; returns the last
        statement's cursor."""
        batch = self._pending if last is None else [*self._pending, last]
        self._pending = []
        conn = self._conn
        try:
            with conn.pipeline():
                cursors = [conn.execute(q, p or None) for q, p, _ in batch]
            for cur, (_, _, take) in zip(cursors, batch, strict=True):
                if take is not None:
                    take(cur)
        except psycopg.Error as exc:
            raise _translate(exc, self._busy_timeout) from None
        return cursors[-1]

    def begin(self, write: bool, clock: Clock, gate: str | None) -> None:
        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        self._pending = [(begin, (), None)]
        self._heads = {}
        # The server's clock is read once, with the gate if there is one;
        # tests and simulations may inject a clock instead.
        self._now = None if isinstance(clock, SystemClock) else clock.now_us()
        if gate is not None:
            self.gate(gate)
        elif self._now is None:
            self._pending.append((_NOW, (), self._take_now))

    def _take_now(self, cur: Any) -> None:
        self._now = int(cur.fetchone()["now"])

    def now_us(self) -> int:
        if self._now is None:
            self._send()
        if self._now is None:
            raise StoreError("PostgreSQL did not report its clock")
        return self._now

    def gate(self, mission_id: str) -> None:
        """An advisory lock on the mission until the transaction ends, then its
        chain head (sent with the next statement)."""

        def take(cur: Any) -> None:
            row = cur.fetchone()
            if self._now is None:
                self._now = int(row["now"])
            seq, hash_ = row["seq"], row["hash"]
            self._heads[mission_id] = None if seq is None else (seq, hash_)

        self._pending += [(_GATE, (mission_id,), None), (_HEAD, (mission_id, mission_id), take)]

    def head(self, mission_id: str) -> Head | None:
        if mission_id not in self._heads:
            self._send()
        return self._heads[mission_id]

    def commit(self) -> None:
        if self._pending:
            self._send(("COMMIT", (), None))
        else:
            self.execute("COMMIT", ())

    def rollback(self) -> None:
        self._pending = []
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        self._conn.close()
