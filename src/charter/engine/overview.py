"""What an operator's desk reads: a run's audit timeline, the request an approval
is bound to, and the store's figures for a metrics endpoint.

Mixed into :class:`~charter.engine.engine.Engine`; reads only, each in one read
transaction, so a console page or a scrape costs a few indexed queries whatever
the store holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from charter import secret
from charter.attempts import store as attempts_store
from charter.attempts.model import Attempt
from charter.audit import store as audit_store
from charter.clock import Clock
from charter.errors import UsageError
from charter.ids import check_text
from charter.ledger import store as ledger_store
from charter.ledger.accounts import Balance
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.model import Run
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


#: The most attempts one search call reads (see :meth:`Overview.search`).
SEARCH_SCAN = 2000
#: The longest text a search takes: a key or a value, not a document.
SEARCH_MAX_TEXT = 200
_ATTEMPT_ID = re.compile(r"att_[0-9a-z]{1,40}")


def _search_text(text: object) -> str:
    """The query, trimmed; refused (changing nothing) when it cannot be one."""
    if not isinstance(text, str):
        raise UsageError(f"a search takes text, got {text!r}")
    check_text("q", text)
    query = text.strip()
    if not query:
        raise UsageError("a search needs something to find: an effect key, a request value, an ID")
    if len(query) > SEARCH_MAX_TEXT:
        raise UsageError(
            f"a search text is at most {SEARCH_MAX_TEXT} characters (a key or a value), "
            f"got {len(query)}"
        )
    return query


def _found_run(run: Run) -> dict[str, Any]:
    return {
        "kind": "run",
        "id": run.id,
        "run_id": run.id,
        "mission_id": run.mission_id,
        "status": run.status.value,
        "matched": "id",
        "at_us": run.created_at_us,
    }


def _found(attempt: Attempt, query: str) -> dict[str, Any]:
    """An attempt as a search shows it, with the field that held ``query``."""
    needle = query.lower()
    matched = "effect_key"  # a part of it, unless something names the text better
    if attempt.effect_key in (query, "k:" + query):  # a key given is stored as k:KEY
        matched = "effect_key"
    elif needle in attempt.id:
        matched = "id"
    elif isinstance(attempt.request, dict):
        for name, value in attempt.request.items():
            if needle in json.dumps(value, ensure_ascii=False).lower():
                matched = f"request.{name}"
                break
    return {
        "kind": "attempt",
        "id": attempt.id,
        "run_id": attempt.run_id,
        "mission_id": attempt.mission_id,
        "status": attempt.status.value,
        "effect_key": attempt.effect_key,
        "adapter": attempt.adapter,
        "operation": attempt.operation,
        "matched": matched,
        "request": secret.recorded(attempt.request),
        "at_us": attempt.prepared_at_us,
    }


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

    def search(self, text: str, *, limit: int = 50, before: str | None = None) -> dict[str, Any]:
        """Runs and attempts an operator names by a business key: an effect key, a
        value in an attempt's request (a payee, a reference, an invoice number), an
        ID or its prefix. Case does not matter.

        Returns ``{"items": [...], "next": CURSOR | None, "scanned": N}``, newest
        first: each item a run (``kind`` ``"run"``, matched by its ID's prefix, read
        as a range of the primary key) or an attempt (``kind`` ``"attempt"``, with
        its run, effect key, status and ``matched``: which field held the text).
        Attempts are read newest first through their primary key (IDs sort by
        creation), at most :data:`SEARCH_SCAN` of them per call before the attempt
        ID ``before``: a request is free text that no index holds, so a search
        reads a bounded window instead of the whole history, and costs the same on
        a store of ten attempts or ten million. ``next`` is where the next window
        starts when more remain (pass it as ``before``); runs come on the first page
        only. An empty text, a NUL in it or one longer than
        :data:`SEARCH_MAX_TEXT` is :class:`~charter.errors.UsageError` (the NUL
        :class:`~charter.errors.TextRefused`)."""
        query = _search_text(text)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise UsageError(f"limit is how many matches a page shows, 1 to 1000; got {limit!r}")
        if before is not None and not (isinstance(before, str) and _ATTEMPT_ID.fullmatch(before)):
            raise UsageError(
                f"before is the `next` a search returned (an attempt ID); got {before!r}"
            )
        pattern = "%" + re.sub(r"([!%_])", r"!\1", query.lower()) + "%"
        with self._db.read() as tx:
            window = attempts_store.search_window(
                tx, pattern, query, before=before or "att_~", scan=SEARCH_SCAN
            )
            hits = [r["id"] for r in window if r["hit"]]
            runs_found = [] if before else run_store.by_id_prefix(tx, query.lower(), limit=limit)
            attempts = attempts_store.load_many(tx, hits[:limit])
        more = len(hits) > limit or len(window) == SEARCH_SCAN
        next_ = attempts[-1].id if len(hits) > limit else (window[-1]["id"] if more else None)
        items = [_found_run(r) for r in runs_found] + [_found(a, query) for a in attempts]
        return {"items": items, "next": next_, "scanned": len(window)}

    def runs_needing_people(self, *, limit: int = 200) -> list[Run]:
        """The runs no worker can carry on until a person decides something (K3):
        ``needs_intervention`` (settle an attempt), ``paused`` (raise a limit,
        close an incident) and ``stopping`` (settle what was sent), the most
        recently changed first, at most ``limit``. Read through a partial index
        that holds only those runs, so an inbox costs the same on a store of ten
        finished runs or ten million."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"limit is how many runs to read, 1 or more; got {limit!r}")
        with self._db.read() as tx:
            return run_store.needing_people(tx, limit=limit)

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
