"""The contracts room's tables: every statement on ``missions``, ``contract_versions``
and ``sign_ins``.

A mission's allowance accounts are the ledger's: their books, on the mission's
row with its chain's head, are opened and moved by :mod:`charter.ledger.store`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from charter.contracts.contract import Contract
from charter.contracts.model import Mission
from charter.storage import Row, Tx
from charter.storage.paging import Position, page

# -- missions ------------------------------------------------------------------------------


def from_row(row: Row) -> Mission:
    return Mission(*(row[k] for k in row.keys()))  # noqa: SIM118 - sqlite3.Row has keys()


def mission(tx: Tx, mission_id: str) -> Mission | None:
    row = tx.one(
        "SELECT id, name, created_by, created_at_us, contract_version, attempts_admitted, "
        "attempts_failed FROM missions WHERE id = ?",
        mission_id,
    )
    return None if row is None else from_row(row)


def missions(tx: Tx, *, limit: int | None, after: Position | None) -> list[Mission]:
    sql, args = page(
        "SELECT id, name, created_by, created_at_us, contract_version, attempts_admitted, "
        "attempts_failed FROM missions",
        [],
        [],
        key="created_at_us",
        after=after,
        limit=limit,
    )
    return [from_row(r) for r in tx.all(sql, *args)]


def insert(tx: Tx, mission_id: str, *, name: str, by: str) -> None:
    """A new mission, at contract version 0 until its first version is added."""
    tx.run(
        "INSERT INTO missions (id, name, created_by, created_at_us, contract_version) "
        "VALUES (?, ?, ?, ?, 0)",
        mission_id,
        name,
        by,
        tx.now_us,
    )


def contract_version(tx: Tx, mission_id: str) -> int | None:
    """The mission's current contract version; ``None`` if there is no such mission."""
    row = tx.one("SELECT contract_version FROM missions WHERE id = ?", mission_id)
    return None if row is None else int(row["contract_version"])


def set_contract_version(tx: Tx, mission_id: str, version: int) -> None:
    tx.run("UPDATE missions SET contract_version = ? WHERE id = ?", version, mission_id)


def count_admitted(tx: Tx, mission_id: str) -> None:
    """One more attempt admitted: the count stop conditions read (A1)."""
    tx.count(mission_id, "attempts_admitted")


def count_failed(tx: Tx, mission_id: str) -> None:
    """One more attempt settled FAILED: the count stop conditions read (A1)."""
    tx.count(mission_id, "attempts_failed")


def counts(tx: Tx, mission_id: str) -> tuple[int, int] | None:
    """The mission's attempts admitted and failed; ``None`` if there is no such mission."""
    row = tx.one("SELECT attempts_admitted, attempts_failed FROM missions WHERE id = ?", mission_id)
    return None if row is None else (row["attempts_admitted"], row["attempts_failed"])


# -- contract versions: immutable ----------------------------------------------------------


def contract_body(tx: Tx, mission_id: str, version: int) -> str | None:
    """A version's contract as stored (canonical JSON); ``None`` if there is none."""
    row = tx.one(
        "SELECT body FROM contract_versions WHERE mission_id = ? AND version = ?",
        mission_id,
        version,
    )
    return None if row is None else str(row["body"])


def insert_version(
    tx: Tx, mission_id: str, version: int, contract: Contract, *, reason: str, by: str
) -> None:
    tx.run(
        "INSERT INTO contract_versions (mission_id, version, body, digest, reason, created_by, "
        "created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
        mission_id,
        version,
        contract.canonical_json(),
        contract.digest(),
        reason,
        by,
        tx.now_us,
    )


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """The mission's row (its head included, whether it is sealed left out: that
    belongs to the store holding it) and its contract versions."""
    mission = [dict(r) for r in tx.all("SELECT * FROM missions WHERE id = ?", mission_id)]
    for row in mission:
        row.pop("audit_sealed", None)
        row.pop("books", None)  # carried as ``allowances`` records (the ledger's)
    return {
        "missions": mission,
        "contract_versions": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM contract_versions WHERE mission_id = ? ORDER BY version",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]], *, sealed: str) -> None:
    """Write a verified snapshot's mission, sealed with ``sealed``, and its versions."""
    tx.copy("INSERT INTO missions", [{**r, "audit_sealed": sealed} for r in tables["missions"]])
    tx.copy("INSERT INTO contract_versions", tables["contract_versions"])


# -- sign-ins ------------------------------------------------------------------------------
# A sign-in's ID is a bearer secret: the table holds its digest (S3). The principal
# is named, not proven, by a row: :class:`~charter.engine.signins.SignIns` asks the
# authenticator whether that name still has a credential.


def sign_in_digest(sign_in_id: str) -> str:
    """The stored form of a sign-in ID."""
    return hashlib.sha256(sign_in_id.encode()).hexdigest()


def insert_sign_in(tx: Tx, sign_in_id: str, principal: str, csrf: str, expires_us: int) -> None:
    tx.run(
        "INSERT INTO sign_ins (id_digest, principal, csrf, created_at_us, expires_us) "
        "VALUES (?, ?, ?, ?, ?)",
        sign_in_digest(sign_in_id),
        principal,
        csrf,
        tx.now_us,
        expires_us,
    )


def live_sign_in(tx: Tx, sign_in_id: str) -> Row | None:
    """The sign-in's row if it has not ended by the store's clock."""
    return tx.one(
        "SELECT principal, csrf, expires_us FROM sign_ins WHERE id_digest = ? AND expires_us > ?",
        sign_in_digest(sign_in_id),
        tx.now_us,
    )


def end_sign_in(tx: Tx, sign_in_id: str) -> int:
    return tx.run("DELETE FROM sign_ins WHERE id_digest = ?", sign_in_digest(sign_in_id))


def purge_sign_ins(tx: Tx) -> int:
    """Forget the sign-ins that have ended; their rows prove nothing any more."""
    return tx.run("DELETE FROM sign_ins WHERE expires_us <= ?", tx.now_us)
