"""Serialised, bounded transactions over one driver connection.

:class:`Database` lends its connection to one transaction at a time
(:class:`~charter.storage.transaction.Tx`, where the statements, the store's
time and the audit events of one transaction live), hands it to waiting
threads one at a time, and lets writers that wait on each other share one
commit (group commit), never answering any of them before that commit is
durable.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from charter.clock import Clock
from charter.errors import SliceUnavailable, StoreChanged, StoreError, UsageError
from charter.ids import IdFactory
from charter.storage import lanes
from charter.storage.transaction import Driver, HeadSigner, Listening, Refused, Tx

T = TypeVar("T")


class _Group:
    """Transactions that share one physical transaction and its one commit."""

    def __init__(self) -> None:
        self.size = 0
        self.spoiled = False  # a member's changes could not be undone
        self.error: BaseException | None = None
        #: Set once the group's commit has ended, well or not; made only when a
        #: member waits for it (a writer alone commits without one).
        self.done: threading.Event | None = None


class _Waiter:
    """A thread in line for the connection; it is woken alone, when its turn comes."""

    __slots__ = ("turn", "write")

    def __init__(self, write: bool) -> None:
        self.write = write
        self.turn = threading.Lock()
        self.turn.acquire()  # released by whoever hands the connection over


class _Reading(threading.local):
    """The read transaction this thread holds open for several reads, if any."""

    tx: Tx | None = None


class Database:
    """A backend connection with serialised, bounded transactions.

    **Group commit.** When several threads write through one connection (a
    store whose driver allows it: SQLite), a transaction that finishes while
    other writers are waiting does not commit alone: it leaves its changes in
    the open physical transaction and waits; the next writer runs inside it
    (as a savepoint, so its failure undoes only its own changes), and the last
    one commits for all of them. Every member returns, or raises, only after
    that commit is durable; if it fails, every member gets the failure and
    nothing of the group is stored. A single writer commits at once, as
    before. Readers never see a group's uncommitted changes: they wait for it.

    **Hand-off.** Threads wait in line, and the connection is handed to one
    of them at a time (the first writer, or the first reader once no group is
    open), which alone is woken: waking every waiter on each release made
    eight threads no faster than one, each spending its turn on the lock.
    """

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
        self._mutex = threading.Lock()  # guards the fields below
        self._busy = False  # a transaction body (or a commit) is using the connection
        self._line: collections.deque[_Waiter] = collections.deque()
        self._waiting = {True: 0, False: 0}  # threads in line to write / to read
        self._group: _Group | None = None
        #: The read transaction a thread holds open for several reads (:meth:`reading`).
        self._reading = _Reading()
        #: Physical commits made (a group counts once): for the curious and for tests.
        self.commits = 0
        #: A test seam, called with ``"commit.before"`` and ``"commit.after"`` around
        #: every physical commit of a write (see :mod:`charter.crashpoints`). What it
        #: raises before is a commit that failed (nothing stored); after, a commit
        #: that succeeded while its caller was told it failed (a lost connection).
        self.on_commit: Callable[[str], None] | None = None
        #: Signs each chain head as it moves, when the engine has a signing key (S2).
        self.sign: HeadSigner | None = None

    def _acquire(self, write: bool) -> None:
        with self._mutex:
            if not self._busy and not self._line and (write or self._group is None):
                self._busy = True
                return
            waiter = _Waiter(write)
            self._line.append(waiter)
            self._waiting[write] += 1
        waiter.turn.acquire()  # handed over: the connection is this thread's now

    def _hand_over(self) -> None:
        """Give the free connection to the first in line who may have it (holding
        the mutex): a writer, or a reader once no group is open."""
        for waiter in self._line:
            if waiter.write or self._group is None:
                self._line.remove(waiter)
                self._waiting[waiter.write] -= 1
                self._busy = True
                waiter.turn.release()
                return
        self._busy = False

    def _release(self) -> None:
        with self._mutex:
            self._hand_over()

    @contextmanager
    def transaction(
        self, *, write: bool = True, gate: str | None = None, recall: bool = False
    ) -> Iterator[Tx]:
        """A transaction; ``write`` takes the writer lock up front (BEGIN IMMEDIATE),
        ``gate`` takes that mission's gate with ``BEGIN`` (one round trip).
        Inside :meth:`reading`, a read is part of the open one, and a write is
        refused: it would see a moment that has passed. ``recall``: the body may
        decide on rows remembered from this engine's last commit on the mission
        (see :meth:`transact`, which runs it again when they had changed)."""
        held = self._reading.tx
        if held is not None:
            if write:
                raise UsageError("a reading only reads: decide outside it")
            yield held
            return
        self._acquire(write)
        group = self._group if write else None
        member = None if group is None else f"member_{group.size}"
        # L10: the lanes this transaction goes through are decided before its body runs.
        taken = self._lanes_for(write, gate)
        try:
            self._begin(write, gate, member, recall, taken)
            while lapsed := [lane for lane in taken if not self._serves(lane)]:
                # A slice returned or lapsed: the whole body goes through the
                # mission's gate instead, exactly as without the lane.
                for lane in lapsed:
                    lane.fell_back = True
                taken = [lane for lane in taken if all(lane is not x for x in lapsed)]
                if not self._undo(group, member):
                    raise StoreError("a transaction could not leave a lapsed escrow lane")
                self._begin(write, gate, member, recall, taken)
        except BaseException as exc:  # nothing of this transaction exists
            self._end(write, group, kept=False, outcome=exc)
        tx = Tx(
            self.driver,
            self.ids,
            gate,
            self.sign,
            lanes=None if not write and gate is None else {ln.mission_id: ln for ln in taken},
        )
        outcome: BaseException | None = None
        kept = True
        try:
            yield tx
        except Refused as refusal:
            # A refusal that keeps its changes commits them, guards included.
            outcome = refusal.error if refusal.keep else self._held(refusal.error)
            if outcome is not refusal.error:
                kept = False
                self._undo(group, member)
            elif not refusal.keep:
                # Only the refusal's audit event is kept (see Tx.refused).
                kept = self._undo(group, member) and refusal.event is not None
                tx.undone(refusal.event if kept else None)
                if kept:
                    try:
                        self._start(True, None, member)
                    except BaseException as exc:
                        outcome, kept = exc, False
        except BaseException as exc:
            outcome, kept = self._held(exc), False
            self._undo(group, member)
        if kept:
            try:
                tx.flush_audit()
                if member is not None:
                    self.driver.leave(member, keep=True)
            except BaseException as exc:
                outcome, kept = self._held(exc), False
                self._undo(group, member)
        self._end(write, group, kept, outcome)

    @staticmethod
    def _lanes_for(write: bool, gate: str | None) -> list[lanes.Lane]:
        """The lanes a transaction goes through (L10): the lane of its mission
        ``gate``, or, for a write without a gate, every lane open in this context
        (the missions it changes are known only to its body), in the order of
        their missions."""
        if gate is not None:
            lane = lanes.of(gate)
            return [] if lane is None else [lane]
        if not write:
            return []
        return [lane for _, lane in sorted(lanes.current().items())]

    def _begin(
        self,
        write: bool,
        gate: str | None,
        member: str | None,
        recall: bool,
        taken: list[lanes.Lane],
    ) -> None:
        """Begin, with the gates of ``taken`` lanes: each one's mission shared and
        its slice's whole (the mission ``gate``'s own, if any, with ``BEGIN``)."""
        if gate is not None and taken:
            self._start(write, taken[0].chain, member, recall, shared=gate)
            return
        self._start(write, gate, member, recall)
        for lane in taken:
            self.driver.share(lane.mission_id)
            self.driver.gate(lane.chain)

    def _serves(self, lane: lanes.Lane) -> bool:
        """Whether a transaction just begun in ``lane`` may go through it (L10): its
        slice is open (its chain not sealed by a return) and its lease runs at the
        transaction's time. Read under the slice's gate, the mission's held shared:
        nothing returns the slice before this transaction ends. The head and the
        clock come with the gate (on a store that remembers them, no round trip)."""
        head = self.driver.head(lane.chain)
        return head is not None and head[2] is None and self.driver.now_us() < lane.expires_us

    def _held(self, outcome: BaseException) -> BaseException:
        """What a transaction that ends otherwise than by its commit reports: its
        own outcome, unless it decided on recalled rows that had changed (then
        that outcome may rest on them; a dying process is not asked)."""
        if isinstance(outcome, KeyboardInterrupt | SystemExit | StoreChanged):
            return outcome
        if self.driver.confirm():
            return outcome
        return StoreChanged(
            "rows this transaction decided on had changed in the store; nothing of it was written",
            retryable=True,
        )

    def transact(self, body: Callable[[Tx], T], *, gate: str) -> T:
        """``body`` in a write transaction on the mission ``gate``, first on the
        rows this engine remembers of the mission (on a store that remembers: no
        round trip before the commit), then, if the store found that any of them
        had changed, once more on fresh reads. ``body`` may therefore run twice:
        it must change nothing outside its transaction that its second run does
        not set again. Nothing of a first run that did not hold is stored.

        In a lane of the mission (:mod:`charter.storage.lanes`), a body its
        slice cannot serve (:class:`SliceUnavailable`: short, lapsed, returned)
        runs again through the mission's gate, as it would without the lane."""
        lane = lanes.of(gate)
        if lane is None:
            return self._transact(body, gate)
        try:
            return self._transact(body, gate)
        except SliceUnavailable:
            lane.fell_back = True
        with lanes.bypassed(gate):
            return self._transact(body, gate)

    def _transact(self, body: Callable[[Tx], T], gate: str) -> T:
        """:meth:`transact`, on remembered rows first."""
        if self.driver.recalls:
            try:
                with self.transaction(gate=gate, recall=True) as tx:
                    return body(tx)
            except StoreChanged:
                pass
        with self.transaction(gate=gate) as tx:
            return body(tx)

    def _start(
        self,
        write: bool,
        gate: str | None,
        member: str | None,
        recall: bool = False,
        *,
        shared: str | None = None,
    ) -> None:
        """Begin (or join the open group); ``shared``: a mission whose gate is
        taken shared before ``gate``, its lane's (L10)."""
        if member is None:
            self.driver.begin(write, self.clock, gate, recall)
        else:
            self.driver.join(self.clock, member)
            if gate is not None:
                self.driver.gate(gate)
        if shared is not None:
            self.driver.share(shared)

    def _undo(self, group: _Group | None, member: str | None) -> bool:
        """Undo a transaction's changes: all of them, or its savepoint's. A
        savepoint that cannot be undone spoils its group: nothing of it commits."""
        try:
            if member is None:
                self.driver.rollback()
            else:
                self.driver.leave(member, keep=False)
            return True
        except BaseException:
            if group is not None:
                group.spoiled = True
            return False

    def _end(
        self, write: bool, group: _Group | None, kept: bool, outcome: BaseException | None
    ) -> None:
        if write:
            self._end_write(group, kept, outcome)
        else:
            self._end_read(outcome)

    def _end_read(self, outcome: BaseException | None) -> None:
        try:
            if outcome is None:
                self.driver.commit()
        except BaseException:
            self.driver.rollback()
            raise
        finally:
            self._release()
        if outcome is not None:
            raise outcome

    def _end_write(self, group: _Group | None, kept: bool, outcome: BaseException | None) -> None:
        """Commit (alone, or for the group), or wait for the group's commit."""
        if group is None and not kept:
            # The first writer failed before anyone joined: nothing is open.
            self._release()
            assert outcome is not None
            raise outcome
        if group is None:
            group = self._group = _Group()
        group.size += 1
        with self._mutex:
            join = (
                self._waiting[True]
                and not self._waiting[False]
                and group.size < self.driver.group_limit
            )
            if join:
                if group.done is None:
                    group.done = threading.Event()
                self._hand_over()  # the next writer runs inside this transaction
        if join:
            assert group.done is not None
            group.done.wait()
        else:
            self._commit_group(group)
        if group.error is not None:
            if not join:
                raise group.error
            raise StoreError(
                f"the commit shared by {group.size} transactions failed "
                f"({group.error}); nothing of this one was stored"
            ) from group.error
        if outcome is not None:
            raise outcome

    def _commit_group(self, group: _Group) -> None:
        """Commit the open physical transaction. The connection is this thread's
        until it is handed over: nobody else can start meanwhile, while threads
        arriving during the sync take their place in line."""
        try:
            if group.spoiled:
                raise StoreError("a transaction's changes could not be undone")
            if self.on_commit is not None:
                self.on_commit("commit.before")
            self.driver.commit()
            self.commits += 1
            if self.on_commit is not None:
                self.on_commit("commit.after")
        except BaseException as exc:
            with contextlib.suppress(Exception):  # a broken connection says so next time
                self.driver.rollback()
            group.error = exc
        with self._mutex:
            self._group = None
            if group.done is not None:
                group.done.set()
            self._hand_over()

    def read(self) -> Any:
        """A read-only transaction with a consistent snapshot."""
        return self.transaction(write=False)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """One read transaction for every read this thread makes in the block:
        they see the store at one moment, and pay for one transaction. Nested,
        it is the enclosing one."""
        if self._reading.tx is not None:
            yield
            return
        with self.transaction(write=False) as tx:
            self._reading.tx = tx
            try:
                yield
            finally:
                self._reading.tx = None

    def listener(self, channel: str) -> Listening | None:
        """A wait for notices on ``channel`` (:meth:`Tx.notify`), on a connection of
        its own; ``None`` where the store has none (SQLite)."""
        return self.driver.listener(channel)

    def close(self) -> None:
        if self._reading.tx is not None:
            raise UsageError("close the engine after its reading, not inside it")
        self._acquire(False)  # as a reader: after any open group has committed
        try:
            self.driver.close()
        finally:
            self._release()
