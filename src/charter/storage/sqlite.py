"""The embedded SQLite backend (stdlib ``sqlite3``).

WAL journal with ``synchronous=FULL`` (a commit is durable when it returns),
``BEGIN IMMEDIATE`` for writes so writers serialise up front instead of
deadlocking on upgrade, and a bounded busy wait that ends in
:class:`~charter.errors.StoreBusy`. Several processes may share one file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from charter.clock import Clock
from charter.errors import StoreBusy, StoreConflict, StoreError
from charter.hashing import head_table
from charter.storage import dialect, text
from charter.storage.driver import Head

#: A chain's head, by the table that keeps it (see :func:`charter.hashing.head_table`).
_HEAD = {
    table: f"SELECT audit_seq, audit_hash, audit_sealed, books FROM {table} WHERE id = ?"
    for table in ("missions", "audit_chains", "escrow_slices")
}


def _translate(exc: sqlite3.Error, busy_timeout: float) -> Exception:
    text = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        # SQLite undoes only the failing statement; the transaction goes on.
        return StoreConflict(f"the store refused a write: {text}")
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return StoreBusy(
            f"the SQLite store stayed busy for {busy_timeout:g}s (another process holds the "
            "write lock); try again, or raise busy_timeout_seconds",
            retryable=True,
        )
    return StoreError(f"SQLite error: {text}")


class _Answered:
    """A read's one row, already fetched (what :meth:`SQLiteDriver.recall` takes)."""

    def __init__(self, row: sqlite3.Row | None) -> None:
        self._row = row

    def fetchone(self) -> sqlite3.Row | None:
        return self._row


class SQLiteDriver:
    """One connection to one SQLite file."""

    #: Writers on one connection share commits, up to this many per commit (the
    #: file's write lock is held meanwhile, so other processes wait no longer).
    group_limit = 32
    #: Every read is fresh: nothing is remembered between transactions.
    recalls = False
    #: WAL pages written before a commit folds them into the database file
    #: (SQLite's default is 1,000; an attempt writes about 22 pages over its two
    #: commits). Each fold writes and syncs the database file, so folding less
    #: often saves time in a long-lived process; but until its first fold, a process's
    #: log is new and grows, and a sync of a growing file also writes its size.
    #: Measured on the bench's disk: while the log grows an attempt took about
    #: 1.5 ms instead of 1.1; in steady state, blocks of 400 attempts on one
    #: file took a median 858 µs at 2,000 pages, 844 at 10,000 and 892 at 1,000.
    #: At 2,000 the growth ends after ~90 attempts (at 10,000, after ~450), for
    #: 2% more time per attempt afterwards. Durability is the same: every commit
    #: still syncs the log before it returns.
    checkpoint_pages = 2_000

    def __init__(self, path: Path, *, busy_timeout: float = 5.0) -> None:
        self.dialect = dialect.sqlite()
        self.path = path
        self._busy_timeout = busy_timeout
        self._now_us = 0
        #: Chain heads read by this transaction (see :meth:`recall`), kept until
        #: it ends: nobody else writes meanwhile (BEGIN IMMEDIATE).
        self._heads: dict[str, Head] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(
                str(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.row_factory = sqlite3.Row
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={self.checkpoint_pages}")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self.dialect.max_params = self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store at {path}: {exc}") from None
        if mode != "wal":
            raise StoreError(f"SQLite store at {path} refused WAL mode (got {mode!r})")

    def execute(self, sql: str, params: Sequence[Any]) -> Any:
        text.check(params)  # what PostgreSQL cannot keep is not kept here either (A10)
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise _translate(exc, self._busy_timeout) from None
        except UnicodeEncodeError:  # a lone surrogate, refused as it was bound
            raise text.refused(params) from None

    def defer(
        self, sql: str, params: Sequence[Any], take: Callable[[Any], None] | None = None
    ) -> None:
        # In-process: nothing is gained by waiting.
        result = self.execute(sql, params)
        if take is not None:
            take(result)

    def flush(self) -> None:
        """Nothing waits."""

    def recall(
        self, mission_id: str, sql: str, params: Sequence[Any], take: Callable[[Any], None]
    ) -> None:
        """In-process, a read costs no round trip: it is simply run. A read that
        also returns a chain's head (``head_of``, ``head_seq``, ``head_hash``,
        ``head_sealed``, ``head_books``: the row that keeps it, a mission's or a
        slice's, read under the write lock) saves :meth:`head` its own statement
        later in the transaction."""
        row = self.execute(sql, params).fetchone()
        columns = [] if row is None else row.keys()  # (``in`` on a Row looks at its values)
        if "head_of" in columns and row["head_of"] is not None:
            self._heads[row["head_of"]] = (
                row["head_seq"],
                row["head_hash"],
                row["head_sealed"],
                row["head_books"],
            )
        take(_Answered(row))

    def expect(self, mission_id: str, sql: str, params: Sequence[Any]) -> None:
        """Nothing is remembered here: every read is made when asked, at no round trip."""

    def count(self, sql: str, params: Sequence[Any]) -> int:
        count: int = self.execute(sql, params).rowcount
        return count

    def confirm(self) -> bool:
        """Nothing is recalled here."""
        return True

    def begin(self, write: bool, clock: Clock, gate: str | None, recall: bool = False) -> None:
        # BEGIN IMMEDIATE makes this transaction the only writer: the gate of
        # every mission at once.
        self.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED", ())
        self._heads = {}
        # On one machine the store's clock is the engine's (injectable) clock.
        self._now_us = clock.now_us()

    def now_us(self) -> int:
        return self._now_us

    def knows_now(self) -> bool:
        return True

    def commit(self) -> None:
        self.execute("COMMIT", ())

    def rollback(self) -> None:
        self._heads = {}
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def join(self, clock: Clock, member: str) -> None:
        self.execute(f"SAVEPOINT {member}", ())
        self._now_us = clock.now_us()
        self._heads = {}

    def leave(self, member: str, *, keep: bool) -> None:
        if not keep:
            self.execute(f"ROLLBACK TO {member}", ())
        self.execute(f"RELEASE {member}", ())
        self._heads = {}

    def gate(self, mission_id: str) -> None:
        """Held since BEGIN IMMEDIATE."""

    def share(self, mission_id: str) -> None:
        """Held whole since BEGIN IMMEDIATE: one writer at a time, lanes or not."""

    def head(self, mission_id: str) -> Head | None:
        if mission_id in self._heads:
            return self._heads[mission_id]
        row = self.execute(_HEAD[head_table(mission_id)], (mission_id,)).fetchone()
        if row is None:
            return None
        return (row["audit_seq"], row["audit_hash"], row["audit_sealed"], row["books"])

    def moved(self, mission_id: str, head: Head) -> None:
        """The head this transaction leaves, for a later read of it in the same
        transaction (its statement is already sent)."""
        self._heads[mission_id] = head

    def listener(self, channel: str) -> None:
        """An embedded store has no notices: its workers look again by themselves."""

    def close(self) -> None:
        self._conn.close()
