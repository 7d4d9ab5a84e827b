"""The notices' tables: every statement on ``notices`` and ``notice_deliveries`` (K3).

A notice is what a run needs a person for, written once per run and reason;
each webhook that takes its kind has a delivery row, the outbox a deliverer
claims from. :mod:`~charter.workers.notify` decides; the SQL is here.

The tables are operational, like the run queue: they are not part of a
mission's record, so no audit event is written for them and a snapshot leaves
them behind.
"""

from __future__ import annotations

from collections.abc import Sequence

from charter.storage import Row, Tx

_NOTICE_COLUMNS = "id, run_id, mission_id, kind, needs, attempts, created_at_us"
_DELIVERY_COLUMNS = (
    "notice_id, webhook, status, tries, due_at_us, claimed_until_us, last_error, delivered_at_us"
)

#: A claim passes over deliveries another deliverer holds: their claim has not
#: run out, or (PostgreSQL) another transaction is claiming them right now.
_DUE = (
    "SELECT notice_id, webhook, tries FROM notice_deliveries "
    "WHERE status = 'pending' AND due_at_us <= ? "
    "AND (claimed_until_us IS NULL OR claimed_until_us <= ?) AND webhook IN ({names}) "
    "ORDER BY due_at_us, notice_id LIMIT 1{{skip_locked}}"
)

#: The same conditions again, so the claim holds even where the read took no lock.
_CLAIM = (
    "UPDATE notice_deliveries SET claimed_by = ?, claimed_until_us = ?, tries = tries + 1 "
    "WHERE notice_id = ? AND webhook = ? AND status = 'pending' "
    "AND (claimed_until_us IS NULL OR claimed_until_us <= ?)"
)


def run_of(tx: Tx, run_id: str) -> Row | None:
    """The run's id and mission, as the runs room recorded them."""
    return tx.one("SELECT id, mission_id FROM runs WHERE id = ?", run_id)


def attempts_of(tx: Tx, run_id: str, attempt_ids: Sequence[str]) -> set[str]:
    """Which of ``attempt_ids`` are attempts of ``run_id``."""
    if not attempt_ids:
        return set()
    marks = ", ".join("?" * len(attempt_ids))
    rows = tx.all(
        f"SELECT id FROM attempts WHERE run_id = ? AND id IN ({marks})", run_id, *attempt_ids
    )
    return {r["id"] for r in rows}


def add(
    tx: Tx,
    notice_id: str,
    *,
    run_id: str,
    mission_id: str,
    kind: str,
    reason: str,
    needs: str,
    attempts: str,
    webhooks: Sequence[str],
) -> bool:
    """Write a notice and its deliveries, due now; ``False`` (and nothing
    written) when the run already has a notice for ``reason``."""
    added = tx.run(
        "INSERT INTO notices (id, run_id, mission_id, kind, reason, needs, attempts, "
        "created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, reason) DO NOTHING",
        notice_id,
        run_id,
        mission_id,
        kind,
        reason,
        needs,
        attempts,
        tx.now_us,
    )
    if not added:
        return False
    tx.many(
        "INSERT INTO notice_deliveries (notice_id, webhook, status, tries, due_at_us) "
        "VALUES (?, ?, 'pending', 0, ?)",
        [(notice_id, name, tx.now_us) for name in webhooks],
    )
    return True


def claim(tx: Tx, webhooks: Sequence[str], token: str, lease_us: int) -> Row | None:
    """Claim the delivery due first among ``webhooks`` for ``lease_us`` under
    ``token``: its notice, the webhook and how many tries this one makes;
    ``None`` when none is due and free."""
    now = tx.now_us
    found = tx.one(_DUE.format(names=", ".join("?" * len(webhooks))), now, now, *webhooks)
    if found is None:
        return None
    if not tx.run(_CLAIM, token, now + lease_us, found["notice_id"], found["webhook"], now):
        return None
    notice = tx.one(f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE id = ?", found["notice_id"])
    assert notice is not None  # a delivery is written with its notice
    return {**notice, "webhook": found["webhook"], "tries": found["tries"] + 1}


def delivered(tx: Tx, notice_id: str, webhook: str) -> bool:
    """The delivery was answered 2xx. Whoever holds its claim now, it is done:
    the endpoint has the notice (``False``: it was marked done already)."""
    return bool(
        tx.run(
            "UPDATE notice_deliveries SET status = 'delivered', delivered_at_us = ?, "
            "claimed_by = NULL, claimed_until_us = NULL, last_error = NULL "
            "WHERE notice_id = ? AND webhook = ? AND status = 'pending'",
            tx.now_us,
            notice_id,
            webhook,
        )
    )


def failed(tx: Tx, notice_id: str, webhook: str, token: str, *, wait_us: int, error: str) -> bool:
    """The claimed delivery was not answered 2xx: due again ``wait_us`` from now
    (``False``: the claim ran out and another deliverer holds it now)."""
    return bool(
        tx.run(
            "UPDATE notice_deliveries SET due_at_us = ?, last_error = ?, "
            "claimed_by = NULL, claimed_until_us = NULL "
            "WHERE notice_id = ? AND webhook = ? AND claimed_by = ?",
            tx.now_us + wait_us,
            error,
            notice_id,
            webhook,
            token,
        )
    )


def notices(tx: Tx, run_id: str) -> list[Row]:
    """A run's notices, oldest first."""
    return tx.all(
        f"SELECT {_NOTICE_COLUMNS} FROM notices WHERE run_id = ? ORDER BY created_at_us, id",
        run_id,
    )


def deliveries(tx: Tx, notice_id: str) -> list[Row]:
    """A notice's deliveries, by webhook."""
    return tx.all(
        f"SELECT {_DELIVERY_COLUMNS} FROM notice_deliveries WHERE notice_id = ? ORDER BY webhook",
        notice_id,
    )


def pending(tx: Tx, webhooks: Sequence[str]) -> int:
    """How many deliveries to ``webhooks`` have not been answered 2xx yet."""
    if not webhooks:
        return 0
    row = tx.one(
        "SELECT COUNT(*) AS n FROM notice_deliveries WHERE status = 'pending' "
        f"AND webhook IN ({', '.join('?' * len(webhooks))})",
        *webhooks,
    )
    return 0 if row is None else int(row["n"])


def next_due(tx: Tx, webhooks: Sequence[str]) -> int | None:
    """When the soonest pending delivery to ``webhooks`` may be claimed (its due
    time, or its claim's end if later), in the store's time; ``None``: none."""
    if not webhooks:
        return None
    row = tx.one(
        "SELECT MIN(CASE WHEN claimed_until_us > due_at_us THEN claimed_until_us "
        "ELSE due_at_us END) AS due FROM notice_deliveries WHERE status = 'pending' "
        f"AND webhook IN ({', '.join('?' * len(webhooks))})",
        *webhooks,
    )
    return None if row is None or row["due"] is None else int(row["due"])
