"""How statements reach PostgreSQL and come back: one connection, each batch
one libpq pipeline, one round trip.

:class:`~charter.storage.postgres.PostgresDriver` decides what a transaction
sends and when (the gate, the clock, the guards, the commit); this is the
connection it sends on. A statement is prepared on the connection the first
time it is seen and later only bound and executed; its parameters go as text,
given or refused (A10); each result is read as it arrives, in order, and a
server error becomes the store's own (:func:`translate`). The connection
belongs to the process that opened it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import time
from typing import Any

from charter.errors import ConfigError, MissingExtra, StoreBusy, StoreConflict, StoreError
from charter.storage.recall import Pending
from charter.storage.text import postgres as encoded

try:
    import psycopg
    import psycopg.sql
    from psycopg import errors as pg_errors
    from psycopg.adapt import Transformer
    from psycopg.pq import ExecStatus

    COMMAND_OK = ExecStatus.COMMAND_OK
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]


def translate(exc: Exception, busy_timeout: float) -> Exception:
    """A server's error as the store's: busy and retryable, a refused write, or
    neither; the caller acts on the type, never on PostgreSQL's codes."""
    if isinstance(exc, pg_errors.DeadlockDetected):
        return StoreBusy(
            "two workers waited on each other's rows and the server chose this one to give "
            "way; nothing was changed — try again",
            retryable=True,
        )
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled):
        return StoreBusy(
            f"the PostgreSQL store stayed busy for {busy_timeout:g}s (another worker holds "
            "the mission's gate or its rows); try again, or raise busy_timeout_seconds",
            retryable=True,
        )
    if isinstance(exc, psycopg.IntegrityError):
        return StoreConflict(f"the store refused a write: {exc}")
    return StoreError(f"PostgreSQL error: {exc}")


#: Statements with more parameters than this are not kept prepared.
_PREPARED_PARAMS = 1_000


class Result:
    """One statement's rows and row count, as a pipeline returns them."""

    def __init__(self, rows: list[dict[str, Any]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> dict[str, Any] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[dict[str, Any]]:
        return self._rows


def _numbered(sql: str) -> str:
    """``%s`` placeholders as libpq numbers them: ``$1``, ``$2``, ..."""
    n = itertools.count(1)
    return re.sub("%s", lambda _: f"${next(n)}", sql)


def _result(pg: Any) -> Any:
    """The next result, waiting for it in ``select`` (which lets other threads
    run: one may be about to release the lock this one waits for)."""
    while pg.is_busy():
        select.select([pg.socket], [], [])
        pg.consume_input()
    return pg.get_result()


class Pipeline:
    """One connection to one PostgreSQL database, sending statements as pipelines.

    The driver builds on it: it holds what a transaction has pending and sends
    it through :meth:`_exchange`.
    """

    def __init__(self, url: str, *, busy_timeout: float = 5.0) -> None:
        if psycopg is None:
            raise MissingExtra(
                "the PostgreSQL store needs psycopg: pip install 'charter[postgres]'",
                extra="postgres",
            )
        if not psycopg.Pipeline.is_supported():
            raise ConfigError(
                f"the PostgreSQL store needs libpq 14 or newer (psycopg uses libpq "
                f"{psycopg.pq.version()}); pip install 'charter[postgres]' brings one"
            )
        self._url = url
        self._busy_timeout = busy_timeout
        self._names = itertools.count()

    def _connect(self) -> None:
        """Open the connection: at start, and again when a failure left it unusable
        (a transaction on a lost or abandoned connection is rolled back by the
        server), so that a failed transaction never breaks the engine."""
        try:
            self._conn = psycopg.connect(self._url, autocommit=True)
            ms = max(1, round(self._busy_timeout * 1000))
            self._conn.execute(f"SET lock_timeout = {ms}")
            self._conn.execute("SET synchronous_commit = on")
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the PostgreSQL store: {exc}") from None
        #: The process that opened the connection: the only one that may use it.
        self._pid = os.getpid()
        #: Statement text -> the name it is prepared under on this connection.
        self._prepared: dict[str, bytes] = {}
        self._loaders = Transformer(self._conn)

    def _commands(
        self, batch: list[Pending]
    ) -> list[tuple[bytes | None, bytes | None, list[bytes | None] | None]]:
        """(name, text to prepare or None, parameters) of each statement, built
        before anything is sent; no name: a statement sent once, unnamed."""
        commands: list[tuple[bytes | None, bytes | None, list[bytes | None] | None]] = []
        new: dict[str, bytes] = {}
        for sql, params, _ in batch:
            name = self._prepared.get(sql) or new.get(sql)
            text = None
            if name is None:
                text = _numbered(sql).encode()
                if len(params) <= _PREPARED_PARAMS:
                    name = new[sql] = b"charter_%d" % next(self._names)
            values = encoded(params) if params else None  # text as given, or refused (A10)
            commands.append((name, text, values))
        return commands

    def _exchange(
        self,
        pg: Any,
        commands: list[tuple[bytes | None, bytes | None, list[bytes | None] | None]],
        split: int | None,
    ) -> list[Any]:
        """Send ``commands`` as one pipeline (with a sync point before the one at
        ``split``) and return each one's result."""
        pg.nonblocking = 0  # so the sync below flushes everything queued
        pg.enter_pipeline_mode()
        try:
            for i, (name, text, values) in enumerate(commands):
                if i == split:
                    pg.pipeline_sync()
                if name is None:
                    assert text is not None
                    pg.send_query_params(text, values)
                    continue
                if text is not None:
                    pg.send_prepare(name, text)
                pg.send_query_prepared(name, values)
            pg.pipeline_sync()
            results: list[Any] = []
            for i, (name, text, _) in enumerate(commands):
                if i == split:
                    self._synced(pg)
                prepared = self._next(pg) if name and text is not None else None
                result = self._next(pg)
                failed_prepare = prepared is not None and prepared.status != COMMAND_OK
                results.append(prepared if failed_prepare else result)
            self._synced(pg)
            return results
        finally:
            try:
                pg.exit_pipeline_mode()
                pg.nonblocking = 1
            except psycopg.Error:
                # Interrupted with results in flight (or already broken): the
                # connection cannot be reused; closing it rolls its transaction back.
                self._conn.close()

    @staticmethod
    def _synced(pg: Any) -> None:
        sync = _result(pg)
        if sync is None or sync.status != ExecStatus.PIPELINE_SYNC:
            raise StoreError("PostgreSQL answered a pipeline out of order")

    @staticmethod
    def _next(pg: Any) -> Any:
        """One command's result (in a pipeline, each is followed by an end marker)."""
        res = _result(pg)
        while _result(pg) is not None:
            pass
        return res

    def _load(self, res: Any) -> Result:
        rows: list[dict[str, Any]] = []
        if res.status == ExecStatus.TUPLES_OK and res.ntuples:
            names = [res.fname(i).decode() for i in range(res.nfields)]
            self._loaders.set_pgresult(res)
            rows = self._loaders.load_rows(
                0, res.ntuples, lambda values: dict(zip(names, values, strict=True))
            )
        return Result(rows, res.command_tuples or 0)

    def listener(self, channel: str) -> Listener:
        """A connection of its own listening on ``channel`` (see :class:`Listener`)."""
        return Listener(self._url, channel)

    def close(self) -> None:
        if os.getpid() == self._pid:  # closing would end the parent's session too
            self._conn.close()


class Listener:
    """PostgreSQL's LISTEN on a connection of its own: a worker sleeps on it and is
    woken when a transaction that made a run due commits (its NOTIFY), instead of
    asking the store over and over. A lost connection is opened again at the next
    wait; meanwhile the wait is a plain sleep, so the worker's own bounded look
    at the store (it always looks by its poll interval) still finds the work."""

    def __init__(self, url: str, channel: str) -> None:
        self._url = url
        self._channel = channel
        self._conn: Any = None

    def _open(self) -> Any:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self._url, autocommit=True)
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel)))
            self._conn = conn
        return self._conn

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a notice; whether one came."""
        try:
            conn = self._open()
            return any(True for _ in conn.notifies(timeout=max(0.0, seconds), stop_after=1))
        except psycopg.Error:
            self.close()
            time.sleep(max(0.0, seconds))
            return False

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
