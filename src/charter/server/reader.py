"""The one thread per process that reads the store for requests.

The engine runs one transaction at a time and Python one thread at a time, so
a second reading thread would add no work done, only interleaving: with one,
pages are answered in the order they came, and a slow one (verifying every
chain) holds up the others no longer than the engine's lock would anyway.
Several processes use several cores (:mod:`charter.server.workers`).

A general-purpose thread pool hands each call over with a cancel scope, a
capacity token and a copied context; measured here that was 0.3 ms of CPU per
request, more than a small page costs to read and render. This reader is a
queue and a thread: a call is put on the queue, and its answer is handed back
to the event loop in one thread-safe callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]
_STOP = None


class Reader:
    """Runs blocking reads, one at a time and in order, on a thread of its own."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # The thread holds the queue, not the reader: once nobody holds the
        # reader, the thread is told to end instead of waiting forever.
        weakref.finalize(self, self._jobs.put, _STOP)

    async def __call__(self, work: Callable[[], T]) -> T:
        """``work()`` on the reading thread; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        self._start()
        self._jobs.put((loop, answer, work))
        return await answer

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=_serve, args=(self._jobs,), name="charter-reader", daemon=True
                    )
                    self._thread.start()


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not _STOP:
        loop, answer, work = job
        try:
            result = work()
        except BaseException as exc:  # handed to the waiting request, raised there
            _hand_back(loop, answer, exc, failed=True)
        else:
            _hand_back(loop, answer, result, failed=False)


def _hand_back(
    loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any], value: Any, *, failed: bool
) -> None:
    def settle() -> None:
        if answer.done():  # the request was cancelled meanwhile: nobody waits
            return
        if failed:
            answer.set_exception(value)
        else:
            answer.set_result(value)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
        loop.call_soon_threadsafe(settle)
