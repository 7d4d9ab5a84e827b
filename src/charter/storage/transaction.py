"""One transaction over a driver connection, shared by every backend.

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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from charter.errors import CharterError, MissionSealed, SliceUnavailable, StoreError
from charter.hashing import (
    HASHED_FIELDS,
    canonical,
    checkpoint_statement,
    digest,
    event_hash,
    genesis,
    head_table,
)
from charter.ids import IdFactory
from charter.storage import books as chain_books
from charter.storage import lanes as lane_context
from charter.storage.driver import NO_HEAD, Driver, Head, HeadSigner, Listening, Row
from charter.storage.lanes import Lane

__all__ = ["Driver", "Head", "HeadSigner", "Listening", "Prefetched", "Refused", "Row", "Tx"]


class Prefetched:
    """The row of a read sent ahead (:meth:`Tx.prefetch`)."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._row: Row | None = None
        self._filled = False

    def fill(self, result: Any) -> None:
        self._row = result.fetchone()
        self._filled = True

    @property
    def row(self) -> Row | None:
        if not self._filled:
            self._driver.flush()
        if not self._filled:
            raise StoreError("a prefetched read was not answered")
        return self._row


class Refused(BaseException):
    """Carries a refusal out of a transaction body; see :meth:`Tx.refused`."""

    def __init__(self, error: CharterError, event: dict[str, Any] | None, keep: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.event = event
        self.keep = keep


class Tx:
    """One transaction: statements, the store's time, and pending audit events."""

    def __init__(
        self,
        driver: Driver,
        ids: IdFactory,
        gate: str | None,
        sign: HeadSigner | None = None,
        *,
        lanes: Mapping[str, Lane] | None = None,
    ) -> None:
        self._driver = driver
        self._sql = driver.dialect.sql
        self.ids = ids
        self._now_us: int | None = None
        self._events: list[dict[str, Any]] = []
        self._sign = sign
        #: Chains this transaction seals (with why) or opens again (S2, S5).
        self._seals: dict[str, str | None] = {}
        #: The lanes this transaction's changes of a mission go through (L10):
        #: those its beginning took (their gates held, their slices open), or
        #: (a read) the context's.
        self._lanes = dict(lane_context.current() if lanes is None else lanes)
        #: The missions (and lanes) whose gate this transaction holds.
        self._gates: set[str] = set() if gate is None else {gate}
        if lanes is not None:
            for lane in lanes.values():
                self._gates |= {lane.mission_id, lane.chain}
        #: Counters on a mission's row, added when the transaction ends (see count).
        self._counts: dict[str, dict[str, int]] = {}
        #: Changes of each chain's books, written with its head (see move_books).
        self._moves: dict[str, dict[str, chain_books.Sums]] = {}

    @property
    def now_us(self) -> int:
        """The store's time, fixed for the whole transaction."""
        if self._now_us is None:
            self._now_us = self._driver.now_us()
        return self._now_us

    @property
    def now_known(self) -> int | None:
        """The store's time if it is known without waiting for the store (so a
        write may carry it in its own statement), else ``None``."""
        if self._now_us is None and not self._driver.knows_now():
            return None
        return self.now_us

    # -- statements -----------------------------------------------------------
    def one(self, sql: str, *params: Any) -> Row | None:
        row: Row | None = self._driver.execute(self._sql(sql), params).fetchone()
        return row

    def all(self, sql: str, *params: Any) -> list[Row]:
        return list(self._driver.execute(self._sql(sql), params).fetchall())

    def run(self, sql: str, *params: Any) -> int:
        """Execute a statement; return the number of rows it changed. In a
        transaction that recalls (:meth:`recall`), a one-row write may be
        assumed to change its row, and the store then refuses the whole
        transaction if it did not."""
        return self._driver.count(self._sql(sql), params)

    def recall(self, mission_id: str, sql: str, *params: Any) -> Prefetched:
        """A read of ``mission_id``'s own rows (one row, or none) that the
        engine makes in most of its transactions on the mission, under its
        gate. A store that remembers may answer it from what the read returned
        inside the engine's last commit on the mission, and then checks under
        the gate, before any write, that the read still returns that row
        (:mod:`charter.storage.recall`); otherwise it is a read sent ahead."""
        self.lock_mission(mission_id)
        box = Prefetched(self._driver)
        self._driver.recall(self._chain(mission_id), self._sql(sql), params, box.fill)
        return box

    def expect(self, mission_id: str, sql: str, *params: Any) -> None:
        """A read of ``mission_id``'s own rows that its next transactions will
        make (:meth:`recall`), this one not: a store that remembers takes it
        inside this commit, after the writes, so the next transaction decides on
        that copy instead of reading first. Nothing is read here."""
        self.lock_mission(mission_id)
        self._driver.expect(self._chain(mission_id), self._sql(sql), params)

    def prefetch(self, sql: str, *params: Any) -> Prefetched:
        """A read whose row is needed later in this transaction: it may travel
        with the next statement that is sent (one round trip for both)."""
        box = Prefetched(self._driver)
        self._driver.defer(self._sql(sql), params, box.fill)
        return box

    def write(self, sql: str, *params: Any) -> None:
        """A statement whose result is not needed; it may be sent later, in this
        transaction (see the module's docstring)."""
        self._driver.defer(self._sql(sql), params)

    def notify(self, channel: str, payload: str = "") -> None:
        """Tell the store's listeners on ``channel`` once this transaction commits
        (nothing if it rolls back); a store without notifications ignores it, and
        its listeners look again on their own (:meth:`Database.listener`)."""
        statement = self._driver.dialect.notify
        if statement is not None:
            self._driver.defer(statement, (channel, payload))

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Deferred writes of one statement; an INSERT becomes multi-row statements.

        Each carries at most as many parameters as the store allows in one
        statement, in row counts that are powers of two, so that however many
        rows a transaction writes, few distinct statements are prepared.
        """
        rows = list(rows)
        head, sep, group = sql.rpartition(" VALUES ") if len(rows) > 1 else ("", "", "")
        if not (sep and head.startswith("INSERT") and group.startswith("(")):
            for row in rows:
                self._driver.defer(self._sql(sql), row)
            return
        fits = max(1, self._driver.dialect.max_params // len(rows[0]))
        size = 1 << (fits.bit_length() - 1)  # the largest power of two that fits
        start = 0
        while start < len(rows):
            while size > len(rows) - start:
                size >>= 1
            chunk = rows[start : start + size]
            self._driver.defer(
                self._sql(f"{head}{sep}{', '.join([group] * size)}"),
                [v for row in chunk for v in row],
            )
            start += size

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
        """Stage an audit event; it is chained and written at commit (on the
        chain of the lane the mission's changes go through, if any)."""
        self._events.append(
            {
                "mission_id": self._chain(mission_id),
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

    def count(self, mission_id: str, column: str, by: int = 1) -> None:
        """Add one to a counter on the mission's row (``column``, named by the
        row's owner) as the transaction ends: in the statement that moves the
        mission's chain head when the transaction appends to the chain, as every
        change of a mission does, so a counted change costs no statement of its
        own. Nothing in the transaction reads the counter after counting."""
        counters = self._counts.setdefault(self._chain(mission_id), {})
        counters[column] = counters.get(column, 0) + by

    def books(self, chain: str) -> dict[str, chain_books.Sums]:
        """The chain's books as this transaction leaves them so far: as its head
        row keeps them, with the changes staged by :meth:`move_books` added.
        Under the chain's gate they come with its head (in most transactions no
        statement of their own); without it (a read, or a mission whose gate a
        lane holds only shared) they are read from the row."""
        if chain in self._gates and chain not in self._lanes:
            kept = (self._driver.head(chain) or NO_HEAD)[3]
        else:
            row = self.one(f"SELECT books FROM {head_table(chain)} WHERE id = ?", chain)
            kept = chain_books.EMPTY if row is None else row["books"]
        return chain_books.added(chain_books.read(kept), self._moves.get(chain, {}))

    def move_books(self, chain: str, change: Mapping[str, Sequence[int]]) -> None:
        """Add ``change`` (unit -> five sums) to the chain's books at commit, in
        the statement that moves its head: the transaction must append to the
        chain (the event that carries the entries of the change, L2)."""
        self.lock_mission(chain)
        self._moves[chain] = chain_books.added(self._moves.get(chain, {}), change)

    def restore_books(self, chain: str, books: Mapping[str, chain_books.Sums]) -> None:
        """Write a chain's books as they are, onto its head row: for restoring
        records verified elsewhere (an imported snapshot), never for recording
        a change (:meth:`move_books`)."""
        self.run(
            f"UPDATE {head_table(chain)} SET books = ? WHERE id = ?",
            chain_books.write(books),
            chain,
        )

    def copy(self, into: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``rows`` as they are: ``into`` is the owner's ``INSERT INTO table``,
        every row has the same columns. For restoring records verified elsewhere
        (an imported snapshot), never for recording a change."""
        if rows:
            columns = list(rows[0])
            self.many(
                f"{into} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [tuple(row[c] for c in columns) for row in rows],
            )

    def seal(self, mission_id: str, reason: str | None) -> None:
        """Seal ``mission_id``'s chain at commit, after this transaction's events, so
        nothing more is recorded on it here (``reason`` says why); ``None`` opens a
        sealed chain again for this transaction's events and after (an adoption)."""
        self._seals[mission_id] = reason

    def lock_mission(self, mission_id: str) -> None:
        """Take the mission's gate before changing anything of it.

        Every transaction that changes a mission's runs, attempts or books
        takes its gate first, so there is one lock order and concurrent workers
        queue instead of deadlocking (SQLite's single writer is a gate already).
        """
        if mission_id not in self._gates:
            chain_of = next((m for m, ln in self._lanes.items() if ln.chain == mission_id), None)
            if chain_of is not None:  # a lane's chain: taken as its mission's lane
                self.lock_mission(chain_of)
                return
            lane = self._lanes.get(mission_id)
            if lane is None:
                self._driver.gate(mission_id)
            else:
                self._driver.share(mission_id)
                self._driver.gate(lane.chain)
                self._gates.add(lane.chain)
            self._gates.add(mission_id)

    def lane(self, mission_id: str) -> Lane | None:
        """The lane this transaction's changes of ``mission_id`` go through (L10):
        its ledger moves go to the lane's slice, its events on the slice's chain."""
        return self._lanes.get(mission_id)

    def _chain(self, mission_id: str) -> str:
        """Where ``mission_id``'s events and counters go in this transaction."""
        lane = self._lanes.get(mission_id)
        return mission_id if lane is None else lane.chain

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

    def undone(self, keep: dict[str, Any] | None) -> None:
        """The store undid this transaction's changes (and its gates with them);
        of its audit events only ``keep`` (a refusal's) is still to be written."""
        self._events = [keep] if keep is not None else []
        self._gates = set()
        self._counts = {}
        self._moves = {}

    def flush_audit(self) -> None:
        """Chain and write the staged audit events, just before commit (S1); the
        counters staged with :meth:`count` and the books moved with
        :meth:`move_books` go with the heads."""
        unchained = set(self._moves) - {ev["mission_id"] for ev in self._events}
        if unchained:
            raise StoreError(
                f"the books of {sorted(unchained)} would change with no event on their "
                "chain to carry the entries (L2); nothing was written"
            )
        if not self._events:
            self._write_counts()
            return
        # Gates not held yet are taken in a fixed order, so two transactions
        # never wait on each other's chains.
        chains = sorted({ev["mission_id"] for ev in self._events})
        for mission_id in chains:
            self.lock_mission(mission_id)
        found = {mission_id: self._open_head(mission_id) for mission_id in chains}
        heads = {m: (seq, hash_ or genesis(m)) for m, (seq, hash_, _, _) in found.items()}
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
        for mission_id in chains:
            self._move_head(mission_id, *heads[mission_id], found[mission_id][3])
        self._write_counts()

    def _open_head(self, chain: str) -> Head:
        """The chain's head, under its gate, if the chain takes events."""
        head = self._driver.head(chain) or NO_HEAD
        sealed = head[2]
        if sealed is not None and head_table(chain) == "escrow_slices":
            raise SliceUnavailable(
                f"escrow slice {chain} was {sealed}: nothing more is recorded on it; "
                "the transaction goes through its mission's gate instead",
                slice_id=chain,
                why=sealed,
            )
        if sealed is not None and self._seals.get(chain, sealed) is not None:
            raise MissionSealed(
                f"mission {chain} is sealed here ({sealed}): nothing more is "
                "recorded on it in this store",
                mission_id=chain,
                reason=sealed,
            )
        return head

    def _move_head(self, chain: str, seq: int, hash_: str, books: str) -> None:
        """Move the chain's head to its last event, with the counters and books
        staged for it. A deferred write too, so on PostgreSQL it travels with
        COMMIT and costs no round trip."""
        counters = self._counts.pop(chain, {})
        sealed = self._seals.get(chain)
        # The books are written only when they move: a restore writes them
        # itself, after the head this transaction read.
        moved = ""
        if chain in self._moves:
            books = chain_books.write(
                chain_books.added(chain_books.read(books), self._moves.pop(chain))
            )
            moved = "books = ?, "
        self.write(
            f"UPDATE {head_table(chain)} SET {_added(counters)}{moved}audit_seq = ?, "
            "audit_hash = ?, audit_sealed = ? WHERE id = ?",
            *counters.values(),
            *([books] if moved else []),
            seq,
            hash_,
            sealed,
            chain,
        )
        self._driver.moved(chain, (seq, hash_, sealed, books))
        if self._sign is not None:
            self._checkpoint(chain, seq, hash_)

    def _write_counts(self) -> None:
        """Counters of missions whose chain this transaction left as it was."""
        for mission_id, counters in self._counts.items():
            added = _added(counters).removesuffix(", ")
            self.write(
                f"UPDATE {head_table(mission_id)} SET {added} WHERE id = ?",
                *counters.values(),
                mission_id,
            )
        self._counts = {}

    def _checkpoint(self, chain: str, seq: int, hash_: str) -> None:
        """Sign the head just moved (S2): a store rewritten consistently afterwards
        no longer matches a signature its writer cannot make."""
        assert self._sign is not None
        key, signature = self._sign(checkpoint_statement(chain, seq, hash_))
        self.write(
            "INSERT INTO audit_checkpoints (mission_id, seq, hash, key_id, signature, at_us) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (mission_id) DO UPDATE SET seq = excluded.seq, "
            "hash = excluded.hash, key_id = excluded.key_id, signature = excluded.signature, "
            "at_us = excluded.at_us",
            chain,
            seq,
            hash_,
            key,
            signature,
            self.now_us,
        )


def _added(counters: Mapping[str, int]) -> str:
    """``column = column + ?, `` for each counter, in order."""
    return "".join(f"{c} = {c} + ?, " for c in counters)
