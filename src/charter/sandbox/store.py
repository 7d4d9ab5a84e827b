"""The payments sandbox's own records, in a SQLite file of its own.

What the sandbox applied is the ground truth the tests and the demo check
Charter against, so it is kept apart from Charter's store, written with the
standard library only, and every write is one transaction: a payment, its
idempotency key and the fence it was sent under are recorded together or not
at all.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL UNIQUE,
    body_hash TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    payee TEXT NOT NULL,
    reference TEXT NOT NULL,
    run_id TEXT,
    epoch INTEGER,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS payments_reference ON payments (reference);
CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS closed_keys (idempotency_key TEXT PRIMARY KEY, closed_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    idempotency_key TEXT,
    fencing_token TEXT,
    verdict TEXT NOT NULL,
    status INTEGER NOT NULL,
    at TEXT NOT NULL,
    received_at TEXT
);
"""


@dataclass(frozen=True)
class Payment:
    """One applied payment, as the sandbox answers it."""

    id: str
    idempotency_key: str
    amount: int
    currency: str
    payee: str
    reference: str
    run_id: str | None
    epoch: int | None
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "payment",
            "status": "succeeded",
            "idempotency_key": self.idempotency_key,
            "amount": self.amount,
            "currency": self.currency,
            "payee": self.payee,
            "reference": self.reference,
            "created_at": self.created_at,
        }


class Refusal(Exception):
    """A create the sandbox refused before applying anything."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Ledger:
    """The sandbox's records. Thread-safe: one lock, one short transaction per call."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(requests)")}
        if "received_at" not in columns:  # a file an older sandbox wrote
            self._db.execute("ALTER TABLE requests ADD COLUMN received_at TEXT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create(
        self,
        *,
        key: str,
        body_hash: str,
        body: dict[str, Any],
        fence: tuple[str, int] | None,
        now: str,
    ) -> tuple[Payment, bool]:
        """Apply a payment once per key; return it and whether it was a replay.

        Refuses (before applying) a key reused with another body, a key a lookup
        has closed, and a fencing token older than one seen for its run.
        """
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "SELECT * FROM payments WHERE idempotency_key = ?", (key,)
            ).fetchone()
            if row is not None:
                if row["body_hash"] != body_hash:
                    raise Refusal(
                        422,
                        "idempotency_key_reused",
                        "this idempotency key was used with another request body",
                    )
                return _payment(row), True
            if self._db.execute(
                "SELECT 1 FROM closed_keys WHERE idempotency_key = ?", (key,)
            ).fetchone():
                raise Refusal(
                    409,
                    "idempotency_key_closed",
                    "a lookup found no payment with this key and closed it; nothing was applied",
                )
            if fence is not None:
                self._fence(*fence)
            seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM payments").fetchone()[0]
            payment = Payment(
                f"pay_{seq:06d}",
                key,
                int(body["amount"]),
                str(body["currency"]),
                str(body["payee"]),
                str(body.get("reference", "")),
                None if fence is None else fence[0],
                None if fence is None else fence[1],
                now,
            )
            self._db.execute(
                "INSERT INTO payments (id, idempotency_key, body_hash, amount, currency, payee, "
                "reference, run_id, epoch, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    payment.id,
                    key,
                    body_hash,
                    payment.amount,
                    payment.currency,
                    payment.payee,
                    payment.reference,
                    payment.run_id,
                    payment.epoch,
                    now,
                ),
            )
            return payment, False

    def _fence(self, run_id: str, epoch: int) -> None:
        seen = self._db.execute("SELECT epoch FROM fences WHERE run_id = ?", (run_id,)).fetchone()
        if seen is not None and epoch < seen[0]:
            raise Refusal(
                409,
                "stale_fencing_token",
                f"run {run_id} has sent with epoch {seen[0]}; epoch {epoch} is stale",
            )
        self._db.execute(
            "INSERT INTO fences (run_id, epoch) VALUES (?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET epoch = MAX(epoch, excluded.epoch)",
            (run_id, epoch),
        )

    def lookup(self, key: str, now: str) -> Payment | None:
        """The payment made with ``key``; when there is none, the key is closed, so
        a create still on its way can never apply: the answer "none" stays true."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "SELECT * FROM payments WHERE idempotency_key = ?", (key,)
            ).fetchone()
            if row is not None:
                return _payment(row)
            self._db.execute(
                "INSERT OR IGNORE INTO closed_keys (idempotency_key, closed_at) VALUES (?, ?)",
                (key, now),
            )
            return None

    def by_reference(self, reference: str) -> list[Payment]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM payments WHERE reference = ? ORDER BY seq", (reference,)
            ).fetchall()
        return [_payment(r) for r in rows]

    def payments(self) -> list[Payment]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM payments ORDER BY seq").fetchall()
        return [_payment(r) for r in rows]

    def log(
        self,
        kind: str,
        key: str | None,
        token: str | None,
        *,
        verdict: str,
        status: int,
        now: str,
        received: str,
    ) -> None:
        """Record one request the sandbox received and what it did with it:
        ``received`` when its headers were read, ``now`` when it was decided (a
        request may wait for another's transaction between the two)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO requests (kind, idempotency_key, fencing_token, verdict, status, at, "
                "received_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (kind, key, token, verdict, status, now, received),
            )

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM requests ORDER BY seq").fetchall()
        return [dict(r) for r in rows]


def _payment(row: sqlite3.Row) -> Payment:
    return Payment(
        row["id"],
        row["idempotency_key"],
        row["amount"],
        row["currency"],
        row["payee"],
        row["reference"],
        row["run_id"],
        row["epoch"],
        row["created_at"],
    )


def body_hash(body: dict[str, Any]) -> str:
    """The identity of a create's body: canonical JSON, so key order does not matter."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
