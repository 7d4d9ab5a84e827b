"""The queue room's table: every statement on ``run_queue`` (K1, K2).

A row says that workers carry the run: which queue and plan it belongs to, and
when a worker should next look at it (``due_at_us``; NULL: when a person or
service decides something). A worker that takes a run writes its token in
``taken_by`` and moves ``due_at_us`` to its lease's end, renewing it as it
renews the lease: if it dies, the run falls due when its lease ends. A wake that
comes while a worker carries the run is kept in ``woken``, so the carrier's
parking cannot bury it. The row is a hint; the run's epoch and lease decide who
may act (F1), so two workers that take the same run meanwhile are both safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from charter.storage import Row, Tx

#: The channel a worker listens on: told whenever a run falls due now.
CHANNEL = "charter_runs"


def enqueue(tx: Tx, run_id: str, *, queue: str, plan: str, due_us: int | None) -> None:
    """Put the run in ``queue`` for the workers that know ``plan``."""
    tx.run(
        "INSERT INTO run_queue (run_id, queue, plan, due_at_us) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET queue = excluded.queue, plan = excluded.plan, "
        "due_at_us = excluded.due_at_us, taken_by = NULL, woken = 0",
        run_id,
        queue,
        plan,
        due_us,
    )
    if due_us is not None and due_us <= tx.now_us:
        tx.notify(CHANNEL, queue)


def queued(tx: Tx, run_id: str) -> Row | None:
    """The run's row in the queue, if workers carry it."""
    return tx.one(
        "SELECT run_id, queue, plan, due_at_us, taken_by, woken, takes, go_ahead_by "
        "FROM run_queue WHERE run_id = ?",
        run_id,
    )


def give_go_ahead(tx: Tx, run_id: str, by: str) -> None:
    """``by`` lets the next worker continue the run (R9's human policy): kept until
    a continuation uses it, and the run is due now."""
    tx.run("UPDATE run_queue SET go_ahead_by = ? WHERE run_id = ?", by, run_id)
    wake(tx, run_id)


def use_go_ahead(tx: Tx, run_id: str, by: str | None) -> bool:
    """A continuation is being committed: it uses up the run's go-ahead, whoever
    gave it, so none outlives the moment it was given for (one go-ahead, one
    continuation). ``by``: the go-ahead the continuation was judged on; ``False``
    if another continuation used it first."""
    if by is None:
        tx.write("UPDATE run_queue SET go_ahead_by = NULL WHERE run_id = ?", run_id)
        return True
    return bool(
        tx.run(
            "UPDATE run_queue SET go_ahead_by = NULL WHERE run_id = ? AND go_ahead_by = ?",
            run_id,
            by,
        )
    )


def _in(values: Sequence[str]) -> str:
    return ", ".join("?" for _ in values)


def take_due(
    tx: Tx,
    *,
    queues: Sequence[str],
    plans: Sequence[str],
    limit: int,
    token: str,
    hold_until_us: int,
) -> list[str]:
    """Take up to ``limit`` runs due now: each is held for ``token`` until
    ``hold_until_us`` (then it falls due again). Rows another transaction holds
    are passed over on PostgreSQL; SQLite's one writer serialises the takers."""
    rows = tx.all(
        f"SELECT run_id FROM run_queue WHERE queue IN ({_in(queues)}) "
        f"AND plan IN ({_in(plans)}) AND due_at_us <= ? "
        "ORDER BY due_at_us, run_id LIMIT ?{skip_locked}",
        *queues,
        *plans,
        tx.now_us,
        limit,
    )
    taken = [r["run_id"] for r in rows]
    if taken:  # one statement for all of them, sent with the commit
        tx.write(
            "UPDATE run_queue SET due_at_us = ?, taken_by = ?, woken = 0, takes = takes + 1 "
            f"WHERE run_id IN ({_in(taken)})",
            hold_until_us,
            token,
            *taken,
        )
    return taken


def hold_taken(tx: Tx, run_id: str, *, token: str, until_us: int) -> bool:
    """Keep holding a taken run until ``until_us`` (its lease was renewed); ``False``
    if another worker took it meanwhile."""
    return bool(
        tx.run(
            "UPDATE run_queue SET due_at_us = CASE WHEN woken = 1 THEN due_at_us "
            "ELSE CAST(? AS BIGINT) END "
            "WHERE run_id = ? AND taken_by = ?",
            until_us,
            run_id,
            token,
        )
    )


def park(tx: Tx, run_id: str, *, token: str, due_us: int | None) -> bool:
    """Let go of a taken run until ``due_us`` (``None``: until something wakes it),
    unless a wake came while it was held: then it is due now. ``False`` if
    another worker took it meanwhile (the row is theirs)."""
    return bool(
        tx.run(
            "UPDATE run_queue SET due_at_us = CASE WHEN woken = 1 THEN CAST(? AS BIGINT) "
            "ELSE CAST(? AS BIGINT) END, "
            "taken_by = NULL, woken = 0 WHERE run_id = ? AND taken_by = ?",
            tx.now_us,
            due_us,
            run_id,
            token,
        )
    )


def held_owners(tx: Tx) -> list[Row]:
    """Runs a worker holds (their row not due yet) with the process recorded as
    executing them: a worker on that process's host can prove it gone (R1)."""
    return tx.all(
        "SELECT q.run_id, r.owner_process FROM run_queue q JOIN runs r ON r.id = q.run_id "
        "WHERE q.taken_by IS NOT NULL AND q.due_at_us > ? AND r.owner_process IS NOT NULL",
        tx.now_us,
    )


def due_now(tx: Tx, run_ids: Sequence[str]) -> None:
    """These runs' holders are gone: they are due now, for any worker to take."""
    for run_id in run_ids:
        tx.run(
            "UPDATE run_queue SET due_at_us = ?, taken_by = NULL, woken = 0 WHERE run_id = ?",
            tx.now_us,
            run_id,
        )
    if run_ids:
        tx.notify(CHANNEL, "")


def dequeue(tx: Tx, run_id: str) -> None:
    """The run has ended: no worker needs to look at it again."""
    tx.run("DELETE FROM run_queue WHERE run_id = ?", run_id)


def wake(tx: Tx, run_id: str) -> None:
    """Something the run waits for happened: a free worker should look now (K2).
    Sent with the transaction's commit (a written, never a counted, statement:
    a run no worker carries has no row, and that is no failure)."""
    tx.write(
        "UPDATE run_queue SET woken = CASE WHEN taken_by IS NULL THEN 0 ELSE 1 END, "
        "due_at_us = CASE WHEN taken_by IS NULL OR due_at_us IS NULL OR due_at_us > ? "
        "THEN CAST(? AS BIGINT) ELSE due_at_us END WHERE run_id = ?",
        tx.now_us,
        tx.now_us,
        run_id,
    )
    tx.notify(CHANNEL, run_id)


def wake_mission(tx: Tx, mission_id: str) -> None:
    """Something every run of the mission may wait for happened (a limit raised,
    an incident closed, the contract amended): its runs look again now."""
    tx.write(
        "UPDATE run_queue SET woken = CASE WHEN taken_by IS NULL THEN 0 ELSE 1 END, "
        "due_at_us = CASE WHEN taken_by IS NULL OR due_at_us IS NULL OR due_at_us > ? "
        "THEN CAST(? AS BIGINT) ELSE due_at_us END "
        "WHERE run_id IN (SELECT id FROM runs WHERE mission_id = ?)",
        tx.now_us,
        tx.now_us,
        mission_id,
    )
    tx.notify(CHANNEL, mission_id)


def next_due(tx: Tx, *, queues: Sequence[str], plans: Sequence[str]) -> int | None:
    """When the soonest run of these queues and plans falls due (``None``: none will
    by itself)."""
    row = tx.one(
        f"SELECT MIN(due_at_us) AS at FROM run_queue WHERE queue IN ({_in(queues)}) "
        f"AND plan IN ({_in(plans)})",
        *queues,
        *plans,
    )
    return None if row is None or row["at"] is None else int(row["at"])


def queue_counts(tx: Tx) -> list[Row]:
    """Per queue: runs due now, runs held by a worker, runs parked until a decision."""
    return tx.all(
        "SELECT queue, "
        "SUM(CASE WHEN due_at_us <= ? AND taken_by IS NULL THEN 1 ELSE 0 END) AS due, "
        "SUM(CASE WHEN taken_by IS NOT NULL THEN 1 ELSE 0 END) AS held, "
        "SUM(CASE WHEN due_at_us IS NULL THEN 1 ELSE 0 END) AS parked, "
        "COUNT(*) AS runs FROM run_queue GROUP BY queue ORDER BY queue",
        tx.now_us,
    )
