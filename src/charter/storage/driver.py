"""What a backend provides to a transaction: the driver protocol.

:class:`~charter.storage.transaction.Tx` is written once over this protocol;
:mod:`~charter.storage.sqlite` and :mod:`~charter.storage.postgres` implement
it, each the way its store does best (an embedded store runs every statement at
once, a networked one pipelines them and sends writes with the next read or
with ``COMMIT``). Here too are the shapes both sides share: a row, and a chain's
head as the row that keeps it holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from charter.clock import Clock
from charter.storage import books as chain_books
from charter.storage.dialect import Dialect

Row = Mapping[str, Any]
#: An audit chain's head as its row keeps it: the last event's sequence number
#: and hash (``hash`` is ``None`` while the chain is empty), why the chain is
#: sealed (``None`` while it takes events), and the chain's books as the column
#: keeps them (:mod:`charter.storage.books`).
Head = tuple[int, str | None, str | None, str]
#: The head of a chain with no row yet (a mission being created).
NO_HEAD: Head = (0, None, None, chain_books.EMPTY)
#: Signs a chain head's statement: returns the key's id and the signature (base64).
HeadSigner = Callable[[bytes], tuple[str, str]]


class Driver(Protocol):
    """What a backend provides: raw statements and transaction control."""

    dialect: Dialect

    def execute(self, sql: str, params: Sequence[Any]) -> Any: ...

    def defer(
        self, sql: str, params: Sequence[Any], take: Callable[[Any], None] | None = None
    ) -> None:
        """Run a statement now or with the next one; ``take`` gets its result
        (something with ``fetchone``) once it has run."""
        ...

    def flush(self) -> None:
        """Send the deferred statements now."""
        ...

    def recall(
        self, mission_id: str, sql: str, params: Sequence[Any], take: Callable[[Any], None]
    ) -> None:
        """A read of the mission's own rows (see :meth:`Tx.recall`); ``take`` gets
        its result, now or with the next statement."""
        ...

    def expect(self, mission_id: str, sql: str, params: Sequence[Any]) -> None:
        """A read of the mission's own rows its next transactions will make (see
        :meth:`Tx.expect`); nothing is read now."""
        ...

    def count(self, sql: str, params: Sequence[Any]) -> int:
        """Run a write and return how many rows it changed (see :meth:`Tx.run`)."""
        ...

    def confirm(self) -> bool:
        """Before a transaction ends other than by its commit: whether the rows
        it recalled held (``True`` when it recalled nothing)."""
        ...

    #: Whether transactions may decide on rows remembered from earlier ones.
    recalls: bool

    def begin(self, write: bool, clock: Clock, gate: str | None, recall: bool = False) -> None:
        """Start a transaction (``gate``: taking that mission's gate first); a
        backend may send this with the transaction's first statement.
        ``recall``: the transaction may decide on what the connection remembers
        of the gated mission (see :mod:`charter.storage.recall`)."""
        ...

    def now_us(self) -> int:
        """The store's time for the current transaction (µs)."""
        ...

    def knows_now(self) -> bool:
        """Whether :meth:`now_us` answers without sending anything (a networked
        store may learn its clock only with the next statements it sends)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    #: How many transactions may share one commit (1: each commits alone).
    group_limit: int

    def join(self, clock: Clock, member: str) -> None:
        """Start another transaction inside the open one, as savepoint ``member``
        (only for backends whose ``group_limit`` is above 1)."""
        ...

    def leave(self, member: str, *, keep: bool) -> None:
        """End savepoint ``member``, keeping its changes or undoing them."""
        ...

    def gate(self, mission_id: str) -> None:
        """Take the mission's gate until the transaction ends, before any later
        statement: this transaction becomes the only one changing the mission
        or appending to its audit chain."""
        ...

    def share(self, mission_id: str) -> None:
        """Take the mission's gate shared until the transaction ends, before the
        gate of a lane of it (see :mod:`charter.storage.lanes`): transactions in
        lanes pass one another; one holding the gate whole waits for them all."""
        ...

    def head(self, mission_id: str) -> Head | None:
        """The head kept on the row of a mission whose gate is held (``None``:
        no such row yet, as while the mission is being created)."""
        ...

    def moved(self, mission_id: str, head: Head) -> None:
        """This transaction moves the mission's head to ``head`` (the statement
        that writes it is deferred): a backend may keep it for what follows."""
        ...

    def close(self) -> None: ...

    def listener(self, channel: str) -> Listening | None:
        """Something to sleep on until a transaction tells ``channel`` (see
        :meth:`Tx.notify`); ``None`` where the store cannot tell listeners."""
        ...


class Listening(Protocol):
    """A wait for a store's notices (PostgreSQL's LISTEN)."""

    def wait(self, seconds: float) -> bool: ...

    def close(self) -> None: ...
