"""The PostgreSQL backend (psycopg 3), for several workers on several machines.

The same SQL as SQLite runs here through the dialect layer. What differs is
how writers are kept apart: SQLite has one writer at a time; here each
mission has a **gate**, a transaction-scoped advisory lock that every
transaction changing the mission takes before anything else (one lock order,
so workers queue instead of deadlocking). The gate also serialises appends to
the mission's audit chain, so the chain head read just after taking it stays
valid until commit. Conditional updates still re-check their ``WHERE`` (a hold
is resolved once even by a writer that forgot the gate), and ``lock_timeout``
bounds every wait: a busy store gives :class:`~charter.errors.StoreBusy`.

The store's clock is the server's (``clock_timestamp()``, read after the gate,
so leases mean the same on every machine); tests may inject a clock instead.

Round trips are what an attempt costs here. Nothing is sent until a statement
needs its result: ``BEGIN``, the gate, the clock and the deferred writes wait
and travel with that statement, or with ``COMMIT``, as one libpq pipeline of
prepared statements. A transaction deciding on what this connection remembers
of the mission (:mod:`charter.storage.recall`) sends nothing before its
``COMMIT``: an attempt then makes two round trips, one per commit.

How a batch travels (prepared statements, one pipeline, results in order) is
the connection's, :mod:`charter.storage.pipeline`; this module decides what a
transaction sends and when.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from charter.clock import Clock, SystemClock
from charter.errors import StoreChanged, StoreError
from charter.hashing import head_table
from charter.storage import dialect
from charter.storage.driver import Head
from charter.storage.pipeline import Pipeline, Result, translate
from charter.storage.recall import (
    CLOCK_SLACK_US,
    GUARD,
    Guard,
    Key,
    Memories,
    Memory,
    Pending,
    Recalled,
    asserting,
    matching,
    merged,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.pq import ExecStatus

    FATAL_ERROR = ExecStatus.FATAL_ERROR
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]


_CLOCK_US = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT"
_NOW = f"SELECT {_CLOCK_US} AS now"
_GATE = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
#: The mission's gate taken shared, by a transaction in a lane (see :mod:`charter.storage.lanes`).
_SHARE = "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
#: A chain's head (by the table that keeps it, see :func:`charter.hashing.head_table`),
#: read in a statement of its own after the lock, so its snapshot sees every
#: append before it; the clock is read there too, so a wait for the gate does not
#: age it.
_HEAD = {
    table: "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT AS now, "
    "h.audit_seq, h.audit_hash, h.audit_sealed, h.books FROM (SELECT 1) AS one LEFT JOIN "
    f"(SELECT audit_seq, audit_hash, audit_sealed, books FROM {table} WHERE id = %s) AS h ON true"
    for table in ("missions", "audit_chains", "escrow_slices")
}
#: The guard of a recalled head and of the estimated clock, in one statement after
#: the gate: the head is still the one recalled, and the server's clock is within
#: the slack of the estimate (parameters: the mission and its head, then the
#: estimate and the slack). It returns the clock, as the head's read does.
_HEADGUARD = {
    table: f"SELECT c.now, 1 / ((SELECT COUNT(*) FROM {table} WHERE id = %s AND audit_seq = %s "
    "AND audit_hash IS NOT DISTINCT FROM %s AND audit_sealed IS NOT DISTINCT FROM %s "
    "AND books = %s) = 1 "
    "AND ABS(c.now - %s::BIGINT) <= %s::BIGINT)::int AS ok "
    f"FROM (SELECT {_CLOCK_US} AS now) AS c"
    for table in ("missions", "audit_chains", "escrow_slices")
}
#: The slack given to the clock's guard when the clock is injected (it is not the server's).
_ANY_TIME = 1 << 62


class PostgresDriver(Pipeline):
    """One connection to one PostgreSQL database (and schema, via ``search_path``).

    Transactions commit one by one here: a shared commit would hold the gates
    of several missions in whatever order its members took them, and two such
    groups on two machines could wait on each other.
    """

    group_limit = 1
    #: Transactions may decide on what the connection remembers (see recall).
    recalls = True

    def __init__(self, url: str, *, busy_timeout: float = 5.0) -> None:
        super().__init__(url, busy_timeout=busy_timeout)
        self.dialect = dialect.postgresql()
        self._pending: list[Pending] = []
        self._now: int | None = None
        self._heads: dict[str, Head | None] = {}
        self._memories = Memories()
        self._clock: Clock = SystemClock()
        #: The server's clock as last read, and this process's monotonic clock
        #: when the pipeline that read it was sent: the server's time now is at
        #: most ``server + (monotonic now - sent)`` (an estimate never early).
        self._base: tuple[int, int] | None = None
        self._sent_us = 0
        #: The mission whose copy this transaction decided on, until its guards
        #: have been answered (see recall).
        self._recalling: str | None = None
        self._trusted: str | None = None  # ... and once they all held
        #: The missions whose gate this transaction holds: their reads are taken
        #: again at its commit.
        self._gated: list[str] = []
        #: The repeated reads this transaction made: not read again at its commit.
        self._used: set[Key] = set()
        self._connect()

    def _connect(self) -> None:
        """A new connection is a new session: it remembers nothing of the missions
        the one before it did (see recall)."""
        super()._connect()
        self._memories.clear()

    def execute(self, sql: str, params: Sequence[Any]) -> Result:
        return self._send((sql, params, None))

    def defer(
        self, sql: str, params: Sequence[Any], take: Callable[[Any], None] | None = None
    ) -> None:
        self._pending.append((sql, params, take))

    def flush(self) -> None:
        if self._pending:
            self._send()

    def recall(
        self, mission_id: str, sql: str, params: Sequence[Any], take: Callable[[Any], None]
    ) -> None:
        """A read of the mission's own rows: answered from the copy when this
        transaction decides on it (and guarded), otherwise sent ahead; either way
        taken again at every commit on the mission from now on."""
        key = (sql, tuple(params))
        self._memories.want(mission_id, key)
        self._used.add(key)
        memory = self._memories.copy(mission_id) if self._recalling == mission_id else None
        if memory is not None and key in memory.rows:
            row = memory.rows[key]
            guard = matching(sql, params, row)
            if guard is not None:
                self._pending.append((guard[0], guard[1], GUARD))
                take(Result([] if row is None else [dict(row)], 0))  # the copy stays as read
                return
        self._pending.append((sql, params, take))

    def expect(self, mission_id: str, sql: str, params: Sequence[Any]) -> None:
        """Taken again inside this commit and the next on the mission, as if this
        transaction had made it, so the next may decide on its copy."""
        self._memories.want(mission_id, (sql, tuple(params)))

    def count(self, sql: str, params: Sequence[Any]) -> int:
        """The rows a write changed. A transaction deciding on a copy assumes one
        and sends the write as a guard of that (no round trip)."""
        if self._recalling is not None:
            wrapped = asserting(sql)
            if wrapped is not None:
                self._pending.append((wrapped, params, GUARD))
                return 1
        return self.execute(sql, params).rowcount

    def confirm(self) -> bool:
        """Before a transaction that decided on a copy ends other than by its
        commit: whether every row it decided on held (its pending statements are
        sent, then rolled back). A store that cannot be asked leaves the ending
        as it was."""
        if self._recalling is None:
            return True
        try:
            self._send(("ROLLBACK", (), None))
        except StoreChanged:
            return False
        except StoreError:
            return True
        return True

    def _send(self, last: Pending | None = None) -> Result:
        """Everything pending (and ``last``) in one pipeline: one round trip.

        A statement is prepared the first time it is seen (in the same
        pipeline) and later only bound and executed; a big one (a multi-row
        write) is sent unnamed, so the server keeps no plan of it. The server
        runs the statements in order; after an error it skips the rest, and
        the transaction is aborted. ``COMMIT`` and ``ROLLBACK`` go alone after
        a sync point, so they end the transaction whatever came before (in an
        aborted transaction ``COMMIT`` rolls back).
        """
        if os.getpid() != self._pid:
            # A forked process shares the socket: what it sent would land in its
            # parent's session (and be answered to whichever reads first).
            raise StoreError(
                f"this PostgreSQL connection belongs to process {self._pid}; a forked "
                "process opens an engine of its own"
            )
        batch = merged(self._pending if last is None else [*self._pending, last])
        self._pending = []
        ending = last[0] if last is not None and last[0] in ("COMMIT", "ROLLBACK") else None
        alone = ending is not None
        commands = self._commands(batch)
        new = {sql: c[0] for (sql, _, _), c in zip(batch, commands, strict=True) if c[1] and c[0]}
        pg = self._conn.pgconn
        self._sent_us = self._clock.monotonic_us()
        try:
            results = self._exchange(pg, commands, split=len(commands) - 1 if alone else None)
        except psycopg.Error as exc:
            raise translate(exc, self._busy_timeout) from None
        failed = next((i for i, r in enumerate(results) if r.status == FATAL_ERROR), None)
        if failed is not None:
            if isinstance(batch[failed][2], Guard):
                self._changed()
            # Statements first seen here are prepared afresh next time.
            error = pg_errors.error_from_result(results[failed], self._conn.info.encoding)
            raise translate(error, self._busy_timeout)
        self._prepared.update(new)
        if self._recalling is not None:
            self._trusted, self._recalling = self._recalling, None
        # Only what somebody reads is loaded: deferred writes' results are not.
        for res, (_, _, take) in zip(results, batch, strict=True):
            if take is not None and take is not GUARD:
                take(self._load(res))
        if ending is not None and results[-1].command_status != ending.encode():
            raise StoreError(f"PostgreSQL ended the transaction otherwise than by {ending}")
        return self._load(results[-1])

    def _changed(self) -> None:
        """A guard failed: the transaction decided on a copy that no longer held."""
        mission_id = self._recalling
        self._recalling = None
        if mission_id is not None:
            self._memories.changed(mission_id)
        raise StoreChanged(
            f"rows of mission {mission_id} this transaction decided on had changed in the "
            "store; nothing of it was written",
            mission_id=mission_id,
            retryable=True,
        )

    def begin(self, write: bool, clock: Clock, gate: str | None, recall: bool = False) -> None:
        if self._conn.closed:
            self._connect()
        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        self._pending = [(begin, (), None)]
        self._heads = {}
        self._gated = []
        self._used = set()
        self._recalling = self._trusted = None
        self._clock = clock
        # The server's clock is read once, with the gate if there is one;
        # tests and simulations may inject a clock instead.
        system = isinstance(clock, SystemClock)
        self._now = None if system else clock.now_us()
        if gate is not None and write and recall and self._recall(gate, system):
            return
        if gate is not None:
            self.gate(gate)
        elif system:
            self._pending.append((_NOW, (), self._take_now))

    def _recall(self, mission_id: str, system: bool) -> bool:
        """Begin on the mission's copy, if there is one and the clock can be
        estimated: its head and the clock are guarded after the gate."""
        memory = self._memories.recallable(mission_id)
        if memory is None or (system and self._base is None):
            return False
        self._recalling = mission_id
        self._gated.append(mission_id)
        self._heads[mission_id] = memory.head
        if system:
            # Never early: the server read its clock after that pipeline was sent.
            assert self._base is not None
            server, sent = self._base
            self._now = server + self._clock.monotonic_us() - sent
        assert self._now is not None
        slack = CLOCK_SLACK_US if system else _ANY_TIME
        guard = (mission_id, *memory.head, self._now if system else 0, slack)
        self._pending += [
            (_GATE, (mission_id,), None),
            (_HEADGUARD[head_table(mission_id)], guard, Guard(self._take_base)),
        ]
        return True

    def _take_base(self, result: Result) -> None:
        """A reading of the server's clock: what later estimates start from."""
        row = result.fetchone()
        assert row is not None
        if isinstance(self._clock, SystemClock):
            self._base = (int(row["now"]), self._sent_us)

    def _take_now(self, result: Result) -> None:
        self._take_base(result)
        row = result.fetchone()
        assert row is not None
        self._now = int(row["now"])

    def knows_now(self) -> bool:
        return self._now is not None

    def now_us(self) -> int:
        if self._now is None:
            self._send()
        if self._now is None:
            raise StoreError("PostgreSQL did not report its clock")
        return self._now

    def join(self, clock: Clock, member: str) -> None:
        raise StoreError("the PostgreSQL store does not group transactions")

    def leave(self, member: str, *, keep: bool) -> None:
        raise StoreError("the PostgreSQL store does not group transactions")

    def gate(self, mission_id: str) -> None:
        """An advisory lock on the mission until the transaction ends, then its
        chain head and the clock (sent with the next statement)."""

        def take(result: Result) -> None:
            row = result.fetchone()
            assert row is not None
            if self._now is None:
                self._now = int(row["now"])
                self._take_base(result)
            seq, hash_ = row["audit_seq"], row["audit_hash"]
            self._heads[mission_id] = (
                None if seq is None else (seq, hash_, row["audit_sealed"], row["books"])
            )

        # A clock reading not sent yet is dropped: the one after the gate replaces it.
        self._pending = [p for p in self._pending if p[2] != self._take_now]
        self._gated.append(mission_id)
        head = _HEAD[head_table(mission_id)]
        self._pending += [(_GATE, (mission_id,), None), (head, (mission_id,), take)]

    def share(self, mission_id: str) -> None:
        """The mission's gate, shared until the transaction ends, before its lane's
        gate: lanes pass one another, and wait for whoever holds it whole."""
        begun = bool(self._pending) and self._pending[0][0].startswith("BEGIN")
        self._pending.insert(1 if begun else len(self._pending), (_SHARE, (mission_id,), None))

    def head(self, mission_id: str) -> Head | None:
        if mission_id not in self._heads:
            self._send()
        return self._heads[mission_id]

    def moved(self, mission_id: str, head: Head) -> None:
        self._heads[mission_id] = head

    def commit(self) -> None:
        """Commit, reading the gated missions' repeated reads again just before
        (after every write, under their gates): with the heads the transaction
        left, the copies the next transactions on them may decide on."""
        again = [self._read_again(mission_id) for mission_id in self._gated]
        self.execute("COMMIT", ())
        for mission_id in self._gated:
            self._memories.committed(mission_id)
        if self._trusted is not None:
            self._memories.held(self._trusted)
        # Every copy of a gated mission is replaced, or forgotten: one older than
        # this commit would only fail its guards.
        for mission_id, head, rows in again:
            if head is None:
                self._memories.forget(mission_id)
            else:
                self._memories.keep(mission_id, Memory(head, rows))

    def _read_again(self, mission_id: str) -> tuple[str, Head | None, dict[Key, Recalled]]:
        """Send the mission's repeated reads with the commit; their rows arrive in
        the dict returned, with the head as this transaction leaves it (known:
        read or recalled under the gate, or moved by the transaction itself;
        ``None`` while the mission has none: nothing is read then)."""
        # Those this transaction made are left out: an executor's transactions
        # take turns (an admission reads the run's standing, its settlement the
        # run's status), so the next one needs the others. One that needs a read
        # left out sends it ahead, as it would without a copy.
        keys = [k for k in self._memories.wanted(mission_id) if k not in self._used]
        head = self._heads.get(mission_id)
        rows: dict[Key, Recalled] = {}
        if not keys or head is None:
            return mission_id, head, rows
        if len(keys) == 1:
            [key] = keys
            self._pending.append((key[0], key[1], lambda r: rows.__setitem__(key, r.fetchone())))
            return mission_id, head, rows
        # Several reads as one statement (one bind and run on the server), each
        # row as JSON, which gives back the text, integers, booleans and NULLs
        # the reads return.
        columns = ", ".join(f"row_to_json(r{i}) AS r{i}" for i in range(len(keys)))
        joined = " FULL JOIN ".join(
            f"({k[0]}) AS r{i}" + " ON true" * (i > 0) for i, k in enumerate(keys)
        )

        def take(result: Result) -> None:
            row = result.fetchone() or {}
            for i, key in enumerate(keys):
                rows[key] = row.get(f"r{i}")

        params = [v for key in keys for v in key[1]]
        self._pending.append((f"SELECT {columns} FROM {joined}", params, take))
        return mission_id, head, rows

    def rollback(self) -> None:
        self._pending = []
        self._recalling = self._trusted = None
        if self._conn.closed or os.getpid() != self._pid:
            return  # nothing to undo here, or not this process's to undo
        if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                self._conn.execute("ROLLBACK")
            except psycopg.Error:
                # Unusable: closing it rolls back on the server; the next
                # transaction opens a new one.
                self._conn.close()
