"""A worker's view of its store being away (K5): back off, and say so twice.

While the store cannot be reached (PostgreSQL down or cut off, a SQLite file
that cannot be opened), every look a worker takes at it fails. Looking again
four times a second, with a traceback per carried run each time, buries the
one line an operator needs under thousands. So a worker that finds the store
away says so once, looks again after a wait that doubles from
:data:`FIRST_SECONDS` up to :data:`MOST_SECONDS`, and says once more when the
store answers again, with how long it was away. A busy or contended store is
not away: those failures are the store's ordinary answers, and the worker's
usual look-again covers them.
"""

from __future__ import annotations

import logging
import threading
import time

from charter.errors import StoreBusy, StoreChanged, StoreConflict, StoreError

log = logging.getLogger("charter.worker")

#: The wait after the first failed look, doubled after each one that fails too.
FIRST_SECONDS = 0.25
#: The longest wait between two looks at a store that is away.
MOST_SECONDS = 5.0


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is away, not merely busy or contended."""
    return isinstance(exc, StoreError) and not isinstance(
        exc, StoreBusy | StoreConflict | StoreChanged
    )


class Outage:
    """Whether the store is away as ``worker`` last found it, and when to look
    again; thread-safe (the loop, the lease keeper and carried runs all report)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._since: float | None = None
        self._wait = FIRST_SECONDS
        self._next = 0.0
        #: Looks that found the store away, over the worker's life (for tests and logs).
        self.failures = 0

    @property
    def away(self) -> bool:
        return self._since is not None

    def left(self) -> float:
        """Seconds until the store may be looked at again (0: now)."""
        with self._lock:
            return 0.0 if self._since is None else max(0.0, self._next - time.monotonic())

    def failed(self, exc: BaseException) -> None:
        """A look found the store away: the first says so; a look made when one was
        due doubles the wait (others, made meanwhile by other threads, do not)."""
        now = time.monotonic()
        with self._lock:
            self.failures += 1
            if self._since is None:
                self._since, self._wait = now, FIRST_SECONDS
                log.warning(
                    "worker %s: the store is unreachable (%s); looking again at most every "
                    "%.0fs until it answers",
                    self.worker,
                    " ".join(str(exc).split()),
                    MOST_SECONDS,
                )
            elif now >= self._next:
                self._wait = min(self._wait * 2, MOST_SECONDS)
            else:
                return
            self._next = now + self._wait

    def answered(self) -> None:
        """A look reached the store: if it was away, say that it is back. An
        answer before the next look was due comes from a look begun before the
        store went (another thread's, in flight): it says nothing of now."""
        with self._lock:
            if self._since is None or time.monotonic() < self._next:
                return
            away, self._since = time.monotonic() - self._since, None
        log.warning("worker %s: the store answers again after %.1fs", self.worker, away)
