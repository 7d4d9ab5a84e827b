"""Escrow (L10): a worker leases a slice of a mission's allowance and admits
against it without the mission's gate.

Several worker processes on one mission queue on its gate: every admission
and settlement moves the mission's allowance row and its audit chain's head,
and each waits for the one before it to commit (sync included). With escrow a
worker leases a **slice** (say 10,000 micro-dollars of a mission's 5,000,000):
the mission's books hold it whole (L0 holds at every instant), and the
worker's attempts are admitted and settled against the slice's own books,
recorded on the slice's own audit chain, under the mission's gate taken shared
and the slice's taken whole. So workers on one mission share no row; what
changes the mission itself still takes its gate whole and waits for them.

The API (what a worker process wires in)::

    escrow = Escrow(engine, {"usd_micros": 10_000}, holder="worker-7")
    attempt = escrow.perform(executor, adapter, "charge", request, effect_key="k1")
    ...
    escrow.close()            # returns every slice: what was not used is available again

- ``Escrow.perform(executor, ...)`` is ``executor.perform(...)`` through the
  worker's slice of the executor's mission; ``with escrow.lane(mission_id):``
  makes every attempt of the block go through it (``executor.perform``,
  ``admit``). Both lease a slice on first use and lease it afresh at half its
  lease (a renewal re-checks everything a lease checks: open incidents, the
  contract, what is available) or when the slice could not serve.
- Nothing changes for the rules: an admission the slice cannot cover (short,
  lapsed, returned) goes through the mission's gate, as without escrow; the
  gate takes back what other slices did not use when the mission's own money
  falls short, and pauses the run only if the mission cannot cover it even so
  (L7): money only lent never makes a run wait for a person. A worker never
  admits beyond its slice.
- A stop reaches the worker's next admission (the run's status is read in it);
  an open incident too (its count is read in it); a new contract version
  (a lowered limit) revokes every slice at once; a slice whose holder died
  lapses after one lease and is returned by the next lease, renewal,
  :func:`sweep` or admission through the mission's gate. Its open holds stay
  held (L4), now the mission's.
- ``slices(engine, mission_id)`` lists what a mission lent, with the books.

See ``docs/escrow.md`` for the design, its invariants and its figures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from charter.adapters import Adapter
from charter.amounts import is_amount
from charter.attempts.model import Attempt
from charter.clock import seconds_us
from charter.contracts import missions
from charter.engine.engine import Engine, runtime_of
from charter.engine.executor import Executor
from charter.errors import CharterError, SliceUnavailable, UsageError
from charter.ids import check_text
from charter.ledger import store as ledger_store
from charter.ledger.escrow import slices as escrow_slices
from charter.storage import lanes
from charter.storage.lanes import Lane

log = logging.getLogger("charter.worker")


@dataclass
class _Held:
    """A slice this worker holds: its lane, and when to lease it afresh (this
    process's monotonic clock, at half its lease)."""

    lane: Lane | None
    refresh_at: float


class Escrow:
    """A worker's slices of the allowances of the missions it works on (L10).

    ``amounts``: what to lease per mission, by unit (at most what is available
    is lent). ``holder``: the worker's name, recorded on each slice.
    ``lease_seconds``: how long a slice is lent before it lapses (default: the
    engine's ``lease_seconds``); it is leased afresh at half of it.
    """

    def __init__(
        self,
        engine: Engine,
        amounts: Mapping[str, int],
        *,
        holder: str,
        lease_seconds: float | None = None,
    ) -> None:
        check_text("holder", holder)
        if not amounts or not all(
            isinstance(u, str) and is_amount(a) and a > 0 for u, a in amounts.items()
        ):
            raise UsageError(
                f"escrow amounts must map unit names to whole amounts in [1, 2^63 - 1], "
                f"got {dict(amounts)!r}",
                field="amounts",
            )
        runtime = runtime_of(engine)
        seconds = runtime.config.lease_seconds if lease_seconds is None else lease_seconds
        if not seconds > 0:
            raise UsageError(f"lease_seconds must be positive, got {seconds!r}", field="lease")
        self._runtime = runtime
        self._amounts = dict(amounts)
        self._holder = holder
        self._lease_seconds = float(seconds)
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    @contextmanager
    def lane(self, mission_id: str) -> Iterator[Lane | None]:
        """Every attempt this context makes on ``mission_id`` in the block goes
        through this worker's slice of it (leased now if need be); yields the
        lane, or ``None`` when the mission lends no slice now (the attempts go
        through its gate, as without escrow)."""
        lane = self._ensure(mission_id)
        if lane is None:
            yield None
            return
        with lanes.through(lane):
            yield lane

    def perform(
        self, executor: Executor, adapter: Adapter, operation: str, request: Any, **how: Any
    ) -> Attempt:
        """``executor.perform(adapter, operation, request, **how)`` through this
        worker's slice of the executor's mission."""
        with self.lane(executor.mission_id):
            return executor.perform(adapter, operation, request, **how)

    def release(self, mission_id: str) -> None:
        """Return this worker's slice of ``mission_id``: what it did not use is
        available to the mission again."""
        with self._lock:
            held = self._held.pop(mission_id, None)
        if held is not None and held.lane is not None:
            self._give_back(held.lane, "released")

    def close(self) -> None:
        """Return every slice this worker holds."""
        for mission_id in list(self._held):
            self.release(mission_id)

    def __enter__(self) -> Escrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- leasing ---------------------------------------------------------------------
    def _ensure(self, mission_id: str) -> Lane | None:
        """The lane to use now: leased on first use, afresh at half its lease or
        once a transaction could not go through it."""
        with self._lock:
            held = self._held.get(mission_id)
            due = held is None or time.monotonic() >= held.refresh_at
            if held is not None and held.lane is not None and held.lane.fell_back:
                due = True
            if not due:
                assert held is not None
                return held.lane
            try:
                if held is not None and held.lane is not None:
                    self._give_back(held.lane, "renewed")
                lane = self._lease(mission_id)
            except CharterError as exc:  # the store away: its gate serves, a lease lapses
                log.warning("escrow of %s on mission %s: %s", self._holder, mission_id, exc)
                lane = None
            # A mission that lends nothing now is asked again after a tenth of a lease.
            wait = self._lease_seconds / (2 if lane is not None else 10)
            self._held[mission_id] = _Held(lane, time.monotonic() + wait)
            return lane

    def _lease(self, mission_id: str) -> Lane | None:
        """Lease a slice through the mission's gate, held whole; ``None`` when the
        mission lends none now (the refusal says why in its audit trail)."""
        db = self._runtime.db
        try:
            with lanes.bypassed(mission_id), db.transaction(gate=mission_id) as tx:
                mission = missions.load(tx, mission_id)
                contract = self._runtime.authority.contract(
                    tx, mission_id, mission.contract_version
                )
                stops = contract.stop_conditions
                lease_us = seconds_us(self._lease_seconds)
                slice_id, _ = escrow_slices.lease(
                    tx,
                    mission_id,
                    self._amounts,
                    holder=self._holder,
                    lease_us=lease_us,
                    counted=stops.max_attempts is not None or stops.max_failed_attempts is not None,
                    open_incidents=ledger_store.count_open(tx, mission_id),
                )
                expires_us = tx.now_us + lease_us  # as the slice's row says
        except SliceUnavailable:
            return None
        return Lane(mission_id, slice_id, expires_us)

    def _give_back(self, lane: Lane, why: str) -> None:
        db = self._runtime.db
        with lanes.bypassed(lane.mission_id), db.transaction(gate=lane.mission_id) as tx:
            escrow_slices.give_back(tx, lane.chain, why, actor=self._holder)


def sweep(engine: Engine, mission_id: str) -> int:
    """Return the mission's slices whose lease lapsed (their holders died or
    stalled); how many. Their open holds stay held, now the mission's (L4)."""
    with lanes.bypassed(mission_id), runtime_of(engine).db.transaction(gate=mission_id) as tx:
        return escrow_slices.sweep(tx, mission_id)


def slices(engine: Engine, mission_id: str) -> list[dict[str, Any]]:
    """Every slice the mission lent, oldest first, with its books."""
    with runtime_of(engine).db.read() as tx:
        return escrow_slices.describe(tx, mission_id)
