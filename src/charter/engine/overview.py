"""What an operator's desk reads: a run's audit timeline, the request an approval
is bound to, and the store's figures for a metrics endpoint.

Mixed into :class:`~charter.engine.engine.Engine`; reads only, each in one read
transaction, so a console page or a scrape costs a few indexed queries whatever
the store holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from charter.attempts import store as attempts_store
from charter.attempts.model import Attempt
from charter.audit import store as audit_store
from charter.clock import Clock
from charter.errors import UsageError
from charter.ledger import store as ledger_store
from charter.ledger.accounts import Balance
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.storage import Database
from charter.waits import approvals as approvals_mod
from charter.waits import store as waits_store
from charter.waits.model import Approval, effect_id


@dataclass(frozen=True)
class Figures:
    """The store at a glance: what the metrics endpoint exports."""

    runs: dict[str, int] = field(default_factory=dict)  # by status
    attempts: dict[str, int] = field(default_factory=dict)  # by status
    balances: dict[str, Balance] = field(default_factory=dict)  # summed per unit
    in_flight: int = 0  # DISPATCHED or UNKNOWN: sent, not settled
    oldest_in_flight_seconds: float = 0.0  # how long the oldest of them has waited
    approvals_pending: int = 0


class Overview:
    """Reads for people watching the engine (see the module docstring)."""

    _db: Database
    clock: Clock

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Reads in this block (on this thread) see the store at one moment and
        share one read transaction: a page that shows a run's state, its
        attempts and its timeline shows them as they were together, never a
        settlement in one and not the other. A decision inside is
        :class:`~charter.errors.UsageError` (it would act on a moment that has
        passed); other threads' transactions wait until the block ends, so keep
        it to the reads."""
        with self._db.reading():
            yield

    def timeline(
        self, run_id: str, *, before: int | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The audit events about one run, in order: the run's own and its nodes',
        its attempts', approvals' and waits', refusals included (who tried what,
        and was refused). With ``limit``, the newest ``limit`` of those before
        ``seq`` ``before``, so a page costs the same for a run of ten events or ten
        thousand. An unknown run is :class:`~charter.errors.NotFound`."""
        if limit is not None and limit < 1:
            raise UsageError(f"limit is the most events a page shows, 1 or more; got {limit}")
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
            return audit_store.run_events(tx, run.mission_id, run_id, before=before, limit=limit)

    def approval(self, approval_id: str) -> Approval:
        """One approval; an unknown one is :class:`~charter.errors.NotFound`."""
        with self._db.read() as tx:
            return approvals_mod.load(tx, approval_id)

    def approval_request(self, approval_id: str) -> Attempt | None:
        """The attempt an approval is bound to: same effect, same request hash (W2);
        ``None`` once no attempt of its run carries that request. An unknown
        approval is :class:`~charter.errors.NotFound`."""
        with self._db.read() as tx:
            approval = approvals_mod.load(tx, approval_id)
            for attempt in attempts_store.list_attempts(tx, run_id=approval.run_id):
                bound = effect_id(
                    attempt.run_id, attempt.node_id, attempt.execution, attempt.effect_key
                )
                if bound == approval.effect_id and attempt.request_hash == approval.request_hash:
                    return attempt
            return None

    def figures(self) -> Figures:
        """Counts by status, balances per unit, what is in flight and what waits."""
        with self._db.read() as tx:
            attempts = attempts_store.count_by_status(tx)
            oldest = attempts_store.oldest_in_flight_us(tx)
            return Figures(
                runs=run_store.count_by_status(tx),
                attempts=attempts,
                balances=ledger_store.totals(tx),
                in_flight=attempts.get("dispatched", 0) + attempts.get("unknown", 0),
                oldest_in_flight_seconds=(
                    0.0 if oldest is None else max(0, self.clock.now_us() - oldest) / 1e6
                ),
                approvals_pending=waits_store.count_pending(tx),
            )
