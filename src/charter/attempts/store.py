"""The attempts room's tables: every statement on ``attempts`` and ``evidence``.

The records are in :mod:`charter.attempts.model` and the evidence format in
:mod:`charter.attempts.evidence`; this module maps them to rows. The attempt
path is measured statement by statement, so each function sends one statement
(:func:`effect_attempts` one per node execution), and writes whose result is
not needed are deferred (:meth:`~charter.storage.Tx.write`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from charter import secret
from charter.adapters import Evidence, Outcome
from charter.attempts.model import Attempt, AttemptStatus, Lineage
from charter.errors import NotFound
from charter.hashing import canonical
from charter.storage import Row, Tx
from charter.storage.paging import Position, page

# -- attempts ------------------------------------------------------------------------------


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _request(text: str) -> Any:
    """A recorded request; its secrets come back knowing only their names (S3)."""
    request = json.loads(text)
    return secret.rebuild(request) if f'"{secret.MARK}"' in text else request


def from_row(r: Row) -> Attempt:
    return Attempt(
        id=r["id"],
        mission_id=r["mission_id"],
        run_id=r["run_id"],
        node_id=r["node_id"],
        execution=r["execution"],
        effect_key=r["effect_key"],
        adapter=r["adapter"],
        operation=r["operation"],
        effect_class=r["effect_class"],
        status=AttemptStatus(r["status"]),
        principal=r["principal"],
        admitted_epoch=r["admitted_epoch"],
        dispatched_epoch=r["dispatched_epoch"],
        idempotency_key=r["idempotency_key"],
        request_hash=r["request_hash"],
        request=_request(r["request"]),
        estimate=_json(r["estimate"]),
        actual=_json(r["actual"]),
        result=_json(r["result"]),
        receipt=_json(r["receipt"]),
        price_source=r["price_source"],
        retry_of=r["retry_of"],
        reason=r["reason"],
        send_deadline_us=r["send_deadline_us"],
        prepared_at_us=r["prepared_at_us"],
        dispatched_at_us=r["dispatched_at_us"],
        settled_at_us=r["settled_at_us"],
        generation=r["generation"],
        answered=bool(r["answered"]),
    )


def load(tx: Tx, attempt_id: str) -> Attempt:
    row = tx.one("SELECT * FROM attempts WHERE id = ?", attempt_id)
    if row is None:
        raise NotFound(
            f"no attempt {attempt_id!r} in this store; list them with `charter attempts`",
            attempt_id=attempt_id,
        )
    return from_row(row)


def count_unresolved(tx: Tx, run_id: str) -> int:
    """How many attempts of the run are PREPARED, DISPATCHED or UNKNOWN (through
    the partial index: the cost follows what is unresolved, not history)."""
    row = tx.one(
        "SELECT COUNT(*) AS n FROM attempts WHERE run_id = ? "
        "AND status IN ('prepared', 'dispatched', 'unknown')",
        run_id,
    )
    return 0 if row is None else int(row["n"])


def count_in_flight(tx: Tx, run_id: str) -> int:
    """How many attempts of the run were sent and are not settled (DISPATCHED or
    UNKNOWN): what a stopping run waits for (N5)."""
    row = tx.one(
        "SELECT COUNT(*) AS n FROM attempts WHERE run_id = ? "
        "AND status IN ('dispatched', 'unknown')",
        run_id,
    )
    return 0 if row is None else int(row["n"])


def list_attempts(
    tx: Tx,
    *,
    run_id: str | None = None,
    mission_id: str | None = None,
    unresolved: bool = False,
    limit: int | None = None,
    after: Position | None = None,
) -> list[Attempt]:
    where: list[str] = []
    params: list[Any] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if mission_id is not None:
        where.append("mission_id = ?")
        params.append(mission_id)
    if unresolved:
        where.append("status IN ('prepared', 'dispatched', 'unknown')")
    sql, args = page(
        "SELECT * FROM attempts", where, params, key="prepared_at_us", after=after, limit=limit
    )
    return [from_row(r) for r in tx.all(sql, *args)]


def effect_attempts(
    tx: Tx, lines: Lineage, node_id: str, key: str, *, newest: bool = False
) -> list[Attempt]:
    """Every attempt of one effect (A4), newest first: by node execution, each one
    read through the store's unique index, so the cost follows the number of
    executions, not of effects. ``newest`` stops at the first execution that has any."""
    out: list[Attempt] = []
    for run_id, top in lines:
        for execution in range(top, min(top, 1) - 1, -1):
            rows = tx.all(
                "SELECT * FROM attempts WHERE run_id = ? AND node_id = ? AND execution = ? "
                "AND effect_key = ? ORDER BY generation DESC",
                run_id,
                node_id,
                execution,
                key,
            )
            out += [from_row(r) for r in rows]
            if newest and out:
                return out
    return out


def newest_execution(tx: Tx, run_id: str, node_id: str) -> int:
    """The highest execution of ``node_id`` any attempt of the run was made in (0:
    none), read at one end of the store's unique index."""
    row = tx.one(
        "SELECT MAX(execution) AS n FROM attempts WHERE run_id = ? AND node_id = ?",
        run_id,
        node_id,
    )
    return 0 if row is None or row["n"] is None else int(row["n"])


_INSERT_ATTEMPT = (
    "INSERT INTO attempts (id, mission_id, run_id, node_id, execution, effect_key, generation, "
    "adapter, operation, effect_class, status, principal, admitted_epoch, dispatched_epoch, "
    "idempotency_key, request_hash, request, estimate, price_source, retry_of, "
    "send_deadline_us, prepared_at_us, dispatched_at_us, tallied) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)"
)


def insert(tx: Tx, attempt: Attempt, request_json: str) -> None:
    """Record an admitted attempt; ``request_json`` is its request as recorded,
    secrets by name only (S3), where ``attempt.request`` still holds them."""
    tx.write(
        _INSERT_ATTEMPT,
        attempt.id,
        attempt.mission_id,
        attempt.run_id,
        attempt.node_id,
        attempt.execution,
        attempt.effect_key,
        attempt.generation,
        attempt.adapter,
        attempt.operation,
        attempt.effect_class,
        attempt.status.value,
        attempt.principal,
        attempt.admitted_epoch,
        attempt.dispatched_epoch,
        attempt.idempotency_key,
        attempt.request_hash,
        request_json,
        canonical(attempt.estimate),
        attempt.price_source,
        attempt.retry_of,
        attempt.send_deadline_us,
        attempt.prepared_at_us,
        attempt.dispatched_at_us,
    )


def mark_dispatched(tx: Tx, attempt_id: str, *, epoch: int, deadline_us: int | None) -> bool:
    """The dispatch commit's write (A2); ``False`` if the attempt is no longer PREPARED."""
    return bool(
        tx.run(
            "UPDATE attempts SET status = 'dispatched', dispatched_epoch = ?, "
            "dispatched_at_us = ?, send_deadline_us = ? WHERE id = ? AND status = 'prepared'",
            epoch,
            tx.now_us,
            deadline_us,
            attempt_id,
        )
    )


def _marks(statuses: tuple[AttemptStatus, ...]) -> str:
    return ", ".join("?" for _ in statuses)


def settle(
    tx: Tx,
    attempt_id: str,
    status: AttemptStatus,
    *,
    actual: Mapping[str, int],
    result_json: str | None,
    receipt_json: str | None,
    price_source: str | None,
    reason: str | None,
    answered: bool,
    from_statuses: tuple[AttemptStatus, ...],
) -> bool:
    """Record a settlement if the attempt is still in one of ``from_statuses``
    (L6: a hold is resolved once); ``False`` if it was not. The result and the
    receipt come as their stored JSON (the caller encoded them once). Its time goes in
    the same statement when the store's clock is known without a wait, else in
    one sent after it, so the decisive update never waits for the clock."""
    at_us = tx.now_known
    settled = bool(
        tx.run(
            "UPDATE attempts SET status = ?, actual = ?, result = ?, receipt = ?, "
            "price_source = COALESCE(?, price_source), reason = COALESCE(?, reason), "
            "settled_at_us = ?, "
            f"answered = ? WHERE id = ? AND status IN ({_marks(from_statuses)})",
            status.value,
            canonical(dict(actual)),
            result_json,
            receipt_json,
            price_source,
            reason,
            at_us,
            int(answered),
            attempt_id,
            *(s.value for s in from_statuses),
        )
    )
    if settled and at_us is None:
        tx.write("UPDATE attempts SET settled_at_us = ? WHERE id = ?", tx.now_us, attempt_id)
    return settled


def mark_tallied(tx: Tx, run_id: str) -> list[str]:
    """Mark the run's settled attempts not yet in its counts as counted, and
    return the statuses of those this statement marked (one another transaction
    marked first is left out), for the caller to add to the run's counts."""
    rows = tx.all(
        "UPDATE attempts SET tallied = 1 WHERE run_id = ? AND tallied = 0 "
        "AND status IN ('succeeded', 'failed', 'written_off', 'voided') RETURNING status",
        run_id,
    )
    return [r["status"] for r in rows]


def void(tx: Tx, attempt_id: str, reason: str) -> bool:
    """VOIDED, only if never dispatched (L6); ``False`` if it was no longer PREPARED."""
    return bool(
        tx.run(
            "UPDATE attempts SET status = 'voided', reason = ?, settled_at_us = ? "
            "WHERE id = ? AND status = 'prepared'",
            reason,
            tx.now_us,
            attempt_id,
        )
    )


def mark_unknown(tx: Tx, attempt_id: str, reason: str) -> bool:
    """DISPATCHED -> UNKNOWN (A3); ``False`` if it was no longer DISPATCHED."""
    return bool(
        tx.run(
            "UPDATE attempts SET status = 'unknown', reason = ? "
            "WHERE id = ? AND status = 'dispatched'",
            reason,
            attempt_id,
        )
    )


# -- evidence: immutable, one row per report -----------------------------------------------


def insert_evidence(
    tx: Tx,
    evidence_id: str,
    attempt: Attempt,
    evidence: Evidence,
    outcome_json: str | None,
    *,
    actor: str,
    epoch: int | None,
    settled: bool,
) -> None:
    tx.run(
        "INSERT INTO evidence (id, attempt_id, mission_id, source, verdict, outcome, detail, "
        "epoch, actor, recorded_at_us, settled) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        evidence_id,
        attempt.id,
        attempt.mission_id,
        evidence.source,
        evidence.verdict,
        outcome_json,
        None if evidence.detail is None else canonical(evidence.detail),
        epoch,
        actor,
        tx.now_us,
        1 if settled else 0,
    )


def evidence_from_row(row: Row) -> Evidence:
    """Evidence as :func:`insert_evidence` stored it."""
    outcome = None
    if row["outcome"] is not None:
        o = json.loads(row["outcome"])
        outcome = Outcome(o["status"], o["result"], o["cost"], o["receipt"], o["price_source"])
    detail = None if row["detail"] is None else json.loads(row["detail"])
    return Evidence(row["verdict"], outcome, detail, source=row["source"])


def conclusive(tx: Tx, attempt_id: str) -> list[Evidence]:
    """The attempt's conclusive evidence on record (applied or not applied)."""
    return [evidence_from_row(r) for r in conclusive_rows(tx, attempt_id)]


#: The source of the evidence a same-key replay brought (A8): a send of its own.
REPLAY_SOURCE = "same-key replay"


def replay_applied(tx: Tx, attempt_id: str) -> bool:
    """Whether a same-key replay of the attempt was answered as applied: a send
    after its first, whose success a refusal of the first does not contradict."""
    row = tx.one(
        "SELECT 1 AS x FROM evidence WHERE attempt_id = ? AND source = ? AND verdict = 'applied'",
        attempt_id,
        REPLAY_SOURCE,
    )
    return row is not None


def conclusive_rows(tx: Tx, attempt_id: str) -> list[Row]:
    """The rows of :func:`conclusive`, newest first (a person confirms one by its id)."""
    return tx.all(
        "SELECT * FROM evidence WHERE attempt_id = ? AND verdict != 'indeterminate' "
        "ORDER BY recorded_at_us DESC, id DESC",
        attempt_id,
    )


def settled_by(tx: Tx, evidence_id: str) -> None:
    """Mark recorded evidence as the one a person confirmed to settle its attempt."""
    tx.run("UPDATE evidence SET settled = 1 WHERE id = ?", evidence_id)


def evidence_rows(tx: Tx, attempt_id: str) -> list[Row]:
    """Everything on record about an attempt's outcome, oldest first."""
    return tx.all(
        "SELECT * FROM evidence WHERE attempt_id = ? ORDER BY recorded_at_us, id", attempt_id
    )


def count_by_status(tx: Tx) -> dict[str, int]:
    """How many attempts the store holds in each status (for the metrics endpoint)."""
    rows = tx.all("SELECT status, COUNT(*) AS n FROM attempts GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}


def oldest_in_flight_us(tx: Tx) -> int | None:
    """When the oldest attempt still DISPATCHED or UNKNOWN was prepared (None if none is)."""
    row = tx.one(
        "SELECT MIN(prepared_at_us) AS t FROM attempts WHERE status IN ('dispatched', 'unknown')"
    )
    return None if row is None or row["t"] is None else int(row["t"])


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """The mission's attempts and evidence as recorded; whether an attempt is in
    its run's counts yet is the store's own (the runs carry whole counts)."""
    return {
        "attempts": [
            {c: v for c, v in dict(r).items() if c != "tallied"}
            for r in tx.all(
                "SELECT * FROM attempts WHERE mission_id = ? ORDER BY prepared_at_us, id",
                mission_id,
            )
        ],
        "evidence": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM evidence WHERE mission_id = ? ORDER BY recorded_at_us, id",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Write a snapshot's attempts and evidence. Its runs carry their whole
    settled counts, so every settled attempt is written counted; an unresolved
    one is not yet (``attempts.settlement.tally``)."""
    tx.copy(
        "INSERT INTO attempts",
        [{**a, "tallied": int(not AttemptStatus(a["status"]).holds)} for a in tables["attempts"]],
    )
    tx.copy("INSERT INTO evidence", tables["evidence"])


# -- search: a bounded window of the newest attempts ---------------------------------------


def search_window(tx: Tx, pattern: str, key: str, *, before: str, scan: int) -> list[Row]:
    """The ``scan`` attempts before the ID ``before``, newest first (read on the
    primary key: IDs sort by creation), each with ``hit`` 1 when its effect key is
    ``key`` or its ID or recorded request holds the lower-case LIKE ``pattern``
    (escaped with ``!``). Only the window's IDs come back, never its requests."""
    return tx.all(
        "SELECT id, CASE WHEN effect_key = ? OR LOWER(effect_key) LIKE ? ESCAPE '!' "
        "OR id LIKE ? ESCAPE '!' OR LOWER(request) LIKE ? ESCAPE '!' THEN 1 ELSE 0 END AS hit "
        "FROM attempts WHERE id < ? ORDER BY id DESC LIMIT ?",
        key,
        pattern,
        pattern,
        pattern,
        before,
        scan,
    )


def load_many(tx: Tx, attempt_ids: Sequence[str]) -> list[Attempt]:
    """The attempts with these IDs, in the order given (by the primary key)."""
    if not attempt_ids:
        return []
    marks = ", ".join("?" * len(attempt_ids))
    rows = {
        r["id"]: r for r in tx.all(f"SELECT * FROM attempts WHERE id IN ({marks})", *attempt_ids)
    }
    return [from_row(rows[i]) for i in attempt_ids if i in rows]
