"""The worker: a long-running process that carries runs on by itself (K1-K4).

``Worker(engine, plans=[...]).run()`` takes due runs of the plans it knows from
its queues, as many at once as ``concurrency`` allows (a thread each; a plan's
async nodes run on the node's own event loop), and carries each as its own
segment (:mod:`~charter.workers.scheduler`). Leases are renewed by the store's
clock every third of a lease, and the queue's hold with them, so a worker that
dies or stalls past its lease is taken over by any other.

It never busy-loops: with nothing due it sleeps until the soonest run falls due
or its poll interval passes, whichever is first, and on PostgreSQL a run made
due elsewhere (a submission, an approval, an answer) wakes it at once (LISTEN /
NOTIFY). On SQLite, a wake from another process is seen at the next look: the
looks back off from a twentieth of the poll interval to the whole of it while
nothing is found, and start again fast once something is.

When a run needs a person, the worker tells the engine's configured webhooks
(:mod:`~charter.workers.notify`, K3), or the ``teller`` it is given. While its
store is away it backs off, and says so once and once again when the store is
back (:mod:`~charter.workers.outage`, K5).

With ``escrow={"usd_micros": 50_000}`` (L10) the worker leases a slice of each
carried run's mission and executes the run's plan in its lane (its node
threads included), so several workers on one mission do not queue on its gate;
whatever the slice cannot serve goes through the gate, and every slice is
returned when the worker stops (:mod:`~charter.workers.escrow`).

Stopping (K4): :meth:`stop`, or SIGTERM to :meth:`run` in the main thread,
takes no more runs; every carried run's nodes start no new effect, sends under
way settle (bounded by the send deadline), and each run is let go of with its
lease ended and made due at once, so another worker carries it on without
waiting for the lease. A second SIGTERM ends the process at once, leaving only
what recovery handles (R4).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from types import FrameType
from typing import Protocol, TypeVar

from charter.adapters import Adapter
from charter.config import import_path
from charter.engine.engine import Engine, runtime_of
from charter.engine.executor import Executor
from charter.engine.submitted import DEFAULT_QUEUE, plan_ref
from charter.errors import CharterError, ConfigError, Fenced
from charter.plans.nodes import Plan
from charter.queue.store import CHANNEL
from charter.workers.escrow import Escrow
from charter.workers.notify import Notices
from charter.workers.outage import Outage, unreachable
from charter.workers.scheduler import Carry

log = logging.getLogger("charter.worker")

#: How often a worker looks for runs whose executing process died on its host (a
#: cheap read of the held runs): a killed worker's runs are carried on within it.
ORPHAN_SECONDS = 0.25
#: A slow round of lease renewals is said at most this often (seconds).
SLOW_SAID_EVERY = 60.0


class Teller(Protocol):
    """Who hears that a run needs a person (K3): the webhook notices."""

    def post(
        self, run_id: str, mission_id: str, kind: str, needs: list[str], attempts: list[str]
    ) -> str | None: ...


class Worker:
    """Carries on the runs of ``plans`` submitted to ``queues`` (see the module)."""

    def __init__(
        self,
        engine: Engine,
        plans: Iterable[Plan | str],
        *,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        concurrency: int = 4,
        adapters: Iterable[Adapter | str] = (),
        poll_seconds: float = 1.0,
        name: str | None = None,
        teller: Teller | None = None,
        escrow: Mapping[str, int] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency!r}")
        if not poll_seconds > 0:
            raise ConfigError(f"poll_seconds must be above 0, got {poll_seconds!r}")
        if not queues:
            raise ConfigError("a worker needs at least one queue to take runs from")
        self.engine = engine
        known = [_load(p, Plan, "plan") for p in plans]
        self.plans: dict[str, Plan] = {plan_ref(p): p for p in known}
        if not self.plans:
            raise ConfigError("a worker needs at least one plan (with its ref) to run")
        held = [_load(a, Adapter, "adapter") for a in adapters]  # type: ignore[type-abstract]
        self.adapters: dict[str, Adapter] = {a.name: a for a in held}
        self.queues = tuple(queues)
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        #: The slice leased per mission carried (L10), by unit; off by default.
        self.escrow = None if escrow is None else Escrow(engine, escrow, holder=self.name)
        #: The engine's configured webhooks, told by this worker when no teller is given.
        self._notices = Notices(engine) if teller is None and engine.config.webhooks else None
        self.teller: Teller | None = teller or self._notices
        #: What the worker's carries ended in, counted (for logs and tests).
        self.counts: dict[str, int] = {}
        self._stopping = threading.Event()
        self._nudge = threading.Event()
        self._lock = threading.Lock()
        #: The runs being carried: their executor and the queue token holding them.
        self._carried: dict[str, tuple[Executor, str]] = {}
        self._busy: dict[Future[str], str] = {}
        self._orphans_at = 0.0
        #: Whether the store is away, and when to look at it again (K5).
        self._outage = Outage(self.name)
        # On PostgreSQL, a connection that hears runs falling due elsewhere.
        self._listener = runtime_of(engine).db.listener(CHANNEL)

    # -- the loop ----------------------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> None:
        """Carry runs until :meth:`stop` (or SIGTERM, when called in the main thread)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        renewer = threading.Thread(target=self._renew, name="charter-lease", daemon=True)
        renewer.start()
        if self._notices is not None:
            self._notices.start()
        backoff = self.poll_seconds / 20
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="charter-run") as pool:
            while not self._stopping.is_set():
                away = self._outage.left()
                if away > 0:  # the store is away: one look per backoff, no more
                    self._nudge.wait(away)
                    self._nudge.clear()
                    continue
                if not self._orphans():
                    continue
                taken = self._take(pool)
                backoff = self.poll_seconds / 20 if taken else min(backoff * 2, self.poll_seconds)
                if not taken:
                    self._sleep(backoff)
            self._drain()
        if self.escrow is not None:
            self.escrow.close()  # K4: every slice back, what was not used available again
        if self._listener is not None:
            self._listener.close()
        if self._notices is not None:
            self._notices.stop()

    def run_once(self) -> dict[str, str]:
        """Take what is due now and carry each run as far as it goes, in this
        thread; each run's outcome (a step for tests and scripts)."""
        token = self._token()
        try:
            return {
                run_id: self._carry(run_id, token)
                for run_id in self._taken(self.concurrency, token)
            }
        finally:
            if self.escrow is not None:
                self.escrow.close()

    def stop(self) -> None:
        """Stop well (K4): take nothing more, let every carried run go to another worker."""
        self._stopping.set()
        with self._lock:
            for executor, _ in self._carried.values():
                executor.drain()
        self._nudge.set()
        if self._listener is not None:
            self._listener.close()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            os._exit(128 + signum)  # the second one: recovery handles what is left
        log.info("worker %s stopping: no new runs, carried runs go on elsewhere", self.name)
        threading.Thread(target=self.stop, name="charter-stop", daemon=True).start()

    # -- taking and carrying -------------------------------------------------------------
    def _take(self, pool: ThreadPoolExecutor) -> int:
        with self._lock:
            for done in [f for f in self._busy if f.done()]:
                del self._busy[done]
            free = self.concurrency - len(self._busy)
        token = self._token()
        taken = self._taken(free, token) if free > 0 else []
        for run_id in taken:
            future = pool.submit(self._carry, run_id, token)
            with self._lock:
                self._busy[future] = run_id
            future.add_done_callback(lambda _: self._nudge.set())
        return len(taken)

    def _taken(self, limit: int, token: str) -> list[str]:
        try:
            taken = self.engine.take_runs(
                queues=self.queues,
                plans=list(self.plans),
                limit=limit,
                token=token,
                hold_seconds=self.engine.config.lease_seconds,
            )
        except CharterError as exc:  # the store is away or busy: look again later
            self._store_failed(exc, "could not take runs")
            return []
        self._outage.answered()
        return taken

    def _orphans(self) -> bool:
        """Runs whose executing process died on this host fall due now (R1), looked
        for every :data:`ORPHAN_SECONDS` (or poll interval, if shorter); ``False``
        when the store was found away."""
        now = time.monotonic()
        if now < self._orphans_at:
            return True
        self._orphans_at = now + min(self.poll_seconds, ORPHAN_SECONDS)
        try:
            gone = self.engine.wake_orphans()
        except CharterError as exc:
            self._store_failed(exc, "could not look for orphaned runs")
            return not self._outage.away
        self._outage.answered()
        if gone:
            log.info("worker %s: the owners of %s are gone; taking over", self.name, gone)
        return True

    def _store_failed(self, exc: BaseException, what: str) -> None:
        """A store that is away is the outage's to report, once (K5); any other
        failure is this look's own."""
        if unreachable(exc):
            self._outage.failed(exc)
        else:
            log.warning("worker %s %s: %s", self.name, what, exc)

    def _token(self) -> str:
        return f"{self.name}/{uuid.uuid4().hex[:12]}"

    def _carry(self, run_id: str, token: str) -> str:
        carry = Carry(
            self.engine,
            run_id,
            token,
            f"{self.name}-{uuid.uuid4().hex[:12]}",
            self.plans,
            self.adapters,
            holding=lambda executor: self._holding(executor, token),
            tell=self._tell,
            stopping=self._stopping.is_set,
            lane=self._lane,
        )
        try:
            outcome = carry()
        except Exception as exc:  # a worker outlives any one run's failure
            if unreachable(exc):  # said once per outage; the run's lease decides
                self._outage.failed(exc)
                outcome = "store_away"
            else:
                log.exception("worker %s: carrying run %s failed", self.name, run_id)
                outcome = "error"
        finally:
            with self._lock:
                # Only this carry's own entry: a carry fenced off its run can end
                # after this worker took the run again, and the newer carry's lease
                # must still be kept.
                if self._carried.get(run_id, (None, None))[1] == token:
                    del self._carried[run_id]
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
        return outcome

    def _lane(self, mission_id: str) -> AbstractContextManager[object]:
        """The context a carried run's plan executes in: with escrow, the lane of
        this worker's slice of its mission (leased on first use, afresh at half
        its lease; the mission's gate when it lends none)."""
        if self.escrow is None:
            return contextlib.nullcontext()
        return self.escrow.lane(mission_id)

    def _holding(self, executor: Executor, token: str) -> None:
        with self._lock:
            self._carried[executor.run_id] = (executor, token)
            if self._stopping.is_set():
                executor.drain()

    def _tell(self, run_id: str, kind: str, needs: list[str], attempts: list[str]) -> None:
        if self.teller is None:
            return
        try:
            mission = self.engine.run(run_id).mission_id
            self.teller.post(run_id, mission, kind, needs, attempts)
        except Exception:  # telling must never stop the worker; the inbox shows it too
            log.exception("worker %s: telling people about run %s failed", self.name, run_id)

    # -- leases, sleep, stop -----------------------------------------------------------------
    def _renew(self) -> None:
        """Renew every carried run's lease, and the queue's hold with it (F1), a
        third of a lease after the last round began: a round slowed by a busy
        store eats into the wait, not into the lease. A round longer than the
        wait is said (a lease may then lapse under a live worker), at most once
        a minute with how many there were, so a store slow for an hour is not
        a line every second."""
        every = self.engine.config.lease_seconds / 3
        wait, slow, said = every, 0, -SLOW_SAID_EVERY
        while not self._stopping.wait(wait):
            began = time.monotonic()
            answered = self._outage.left() == 0 and self._renew_round()
            took = time.monotonic() - began
            if answered and took > every:  # (a store away is the outage's to say)
                slow += 1
                if began - said >= SLOW_SAID_EVERY:
                    log.warning(
                        "worker %s: renewing its leases took %.2fs, over a third of the lease"
                        " (%ss); %d such round(s) since this was last said",
                        self.name,
                        took,
                        self.engine.config.lease_seconds,
                        slow,
                    )
                    slow, said = 0, began
            wait = max(0.0, every - took)

    def _renew_round(self) -> bool:
        """One round over the carried runs; whether the store answered it. The
        store away is the outage's, and is not tried in vain for the others until
        the next round (their leases decide)."""
        with self._lock:
            carried = list(self._carried.items())
        for run_id, (executor, token) in carried:
            try:
                until = executor.renew_lease()
                self.engine.hold_run(run_id, token=token, until_us=until)
            except (CharterError, Fenced) as exc:
                # Fenced is a signal, not a CharterError: that run is another's now
                # and the keeper goes on with the others.
                if unreachable(exc):
                    self._outage.failed(exc)
                    return False
                log.info("worker %s: lease of run %s not renewed: %s", self.name, run_id, exc)
        return True

    def _sleep(self, backoff: float) -> None:
        """Until the soonest run falls due, a run is made due elsewhere (a notice),
        a carried run ends, or the look-again interval passes (the store away: the
        loop waits out the outage's backoff instead)."""
        if self._outage.away:
            return
        with self._lock:
            full = sum(not f.done() for f in self._busy) >= self.concurrency
        listening = self._listener is not None and not full
        seconds = self.poll_seconds if listening else backoff
        try:
            due = self.engine.next_due_us(queues=self.queues, plans=list(self.plans))
            if due is not None:
                seconds = max(0.0, min(seconds, (due - self.engine.now_us()) / 1e6))
        except CharterError:
            pass  # the store is away: look again after the interval
        seconds = min(seconds, max(0.0, self._orphans_at - time.monotonic()))
        if listening and self._listener is not None:
            self._listener.wait(seconds)
        else:
            self._nudge.wait(seconds)
        self._nudge.clear()

    def _drain(self) -> None:
        """Wait for carried runs to let go, as long as a send may take (K4)."""
        deadline = time.monotonic() + self.engine.config.send_deadline_seconds + 5
        while time.monotonic() < deadline:
            with self._lock:
                if not any(not f.done() for f in self._busy):
                    return
            self._nudge.wait(0.05)
            self._nudge.clear()


T = TypeVar("T")


def _load(given: T | str, kind: type[T], what: str) -> T:
    """``given`` itself, or the object its ``module:attribute`` reference names."""
    if not isinstance(given, str):
        return given
    found = import_path(given)
    if not isinstance(found, kind):
        raise ConfigError(f"{given} is not a charter {kind.__name__} (a worker's {what})")
    return found


__all__ = ["Teller", "Worker"]
