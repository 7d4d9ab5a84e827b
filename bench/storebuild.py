"""Big stores, built fast: copy real rows with direct SQL inserts.

Running 100,000 attempts one by one would take minutes of fsyncs, so the
bench runs a *template* through Charter's API (one attempt, or one whole run)
and copies every row it wrote — attempts, audit events (which carry the
ledger's entries), runs, segments, node executions, evidence — ``copies`` times in one transaction,
renaming its IDs. The copies keep the store's invariants:

- the audit chain is extended event by event, each copy re-hashed on top of
  the previous one, and its head on the mission's row moved to the end, so
  ``Engine.verify_audit`` holds;
- the cached allowance balances move by exactly the entries the copied events
  carry, so
  ``Engine.check_ledger`` holds (both are checked after every build);
- the mission's admitted-attempt counter counts the copies.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Any

from charter.hashing import HASHED_FIELDS, digest, event_hash, genesis
from charter.ledger.accounts import Move, balances, carried
from charter.storage import books as chain_books

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id(prefix: str) -> str:
    """An ID shaped like Charter's: 48 bits of milliseconds, 80 random bits, base32."""
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _rename(row: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        text = value
        if isinstance(text, str):
            for old, new in mapping.items():
                if old in text:
                    text = text.replace(old, new)
        out[key] = text
    return out


def _insert(conn: sqlite3.Connection, table: str, rows: Iterable[dict[str, Any]]) -> None:
    rows = list(rows)
    if not rows:
        return
    cols = list(rows[0])
    conn.executemany(
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({_marks(cols)})",
        [tuple(r[c] for c in cols) for r in rows],
    )


def clone(
    path: Path,
    *,
    mission_id: str,
    run_ids: Sequence[str],
    attempt_ids: Sequence[str],
    copies: int,
    rename: Callable[[str, int], str],
) -> None:
    """Append ``copies`` renamed copies of the template runs and attempts.

    ``rename(token, k)`` gives copy ``k``'s replacement for each template ID
    and for the template effect key :data:`KEY_TEMPLATE`; every text column
    of every copied row has the template's tokens replaced.
    """
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        runs = _rows(conn, f"SELECT * FROM runs WHERE id IN ({_marks(run_ids)})", run_ids)
        per_run = {
            table: _rows(
                conn, f"SELECT * FROM {table} WHERE run_id IN ({_marks(run_ids)})", run_ids
            )
            for table in ("segments", "node_executions", "journal")
        }
        attempts = _rows(
            conn, f"SELECT * FROM attempts WHERE id IN ({_marks(attempt_ids)})", attempt_ids
        )
        evidence = _rows(
            conn,
            f"SELECT * FROM evidence WHERE attempt_id IN ({_marks(attempt_ids)})",
            attempt_ids,
        )
        tokens = [*run_ids, *attempt_ids]
        events = [
            e
            for e in _rows(
                conn,
                "SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq",
                [mission_id],
            )
            if any(e["entity"] == t or e["entity"].startswith(t + "/") for t in tokens)
        ]
        ledger = [m for e in events for m in _carried(e)]
        seq, prev = conn.execute(
            "SELECT audit_seq, audit_hash FROM missions WHERE id = ?", (mission_id,)
        ).fetchone()
        prev = prev or genesis(mission_id)
        extra_tokens = _extra_tokens(attempts)
        for k in range(copies):
            mapping = {t: rename(t, k) for t in (*tokens, *extra_tokens)}
            _insert(conn, "runs", (_rename(r, mapping) for r in runs))
            for table, rows in per_run.items():
                _insert(conn, table, (_rename(r, mapping) for r in rows))
            _insert(conn, "attempts", (_rename(r, mapping) for r in attempts))
            _insert(conn, "evidence", (_rename(r, mapping) for r in evidence))
            chained = []
            for event in events:
                ev = _rename(event, mapping)
                seq += 1
                ev["seq"] = seq
                ev["payload_hash"] = digest(ev["payload"])
                ev["prev_hash"] = prev
                ev["hash"] = event_hash(prev, {f: ev[f] for f in HASHED_FIELDS})
                prev = ev["hash"]
                chained.append(ev)
            _insert(conn, "audit_events", chained)
        _move_head(conn, mission_id, seq, prev)
        _move_balances(conn, mission_id, ledger, copies)
        conn.execute(
            "UPDATE missions SET attempts_admitted = attempts_admitted + ? WHERE id = ?",
            (copies * len(attempts), mission_id),
        )
        # Keep the per-run settled counters the engine maintains (schema v3), with
        # every settled attempt in them, as the engine's tallies leave a run's
        # attempts (schema 25).
        conn.execute(
            "UPDATE attempts SET tallied = 1 WHERE mission_id = ? "
            "AND status IN ('succeeded', 'failed', 'written_off', 'voided')",
            (mission_id,),
        )
        conn.execute(
            "UPDATE runs SET "
            + ", ".join(
                f"n_{s} = (SELECT COUNT(*) FROM attempts a WHERE a.run_id = runs.id "
                f"AND a.status = '{s}')"
                for s in ("succeeded", "failed", "written_off", "voided")
            )
            + " WHERE mission_id = ?",
            (mission_id,),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


#: Effect keys in templates start with this; copy k gets its own number.
KEY_PREFIX = "bulk-"
KEY_TEMPLATE = KEY_PREFIX + "0" * 9


def _extra_tokens(attempts: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({a["effect_key"] for a in attempts if a["effect_key"] == KEY_TEMPLATE})


def rename_ids(token: str, k: int) -> str:
    """The usual ``rename``: a fresh ID per copy, a numbered effect key."""
    if token == KEY_TEMPLATE:
        return f"{KEY_PREFIX}{k + 1:09d}"
    prefix, _, _ = token.partition("_")
    return new_id(prefix)


def _carried(event: dict[str, Any]) -> list[Move]:
    """The ledger entries an audit event carries (its payload's ``ledger``)."""
    ledger = json.loads(event["payload"]).get("ledger")
    return [] if ledger is None else carried(ledger)[2]


def _move_balances(
    conn: sqlite3.Connection, mission_id: str, ledger: Sequence[Move], copies: int
) -> None:
    """Apply the copied entries to the mission's books, on its row (L0-L2 stay true)."""
    change = {
        unit: astuple(bal)
        for unit, bal in balances(
            Move(m.unit, m.kind, m.source, m.target, m.amount * copies) for m in ledger
        ).items()
    }
    [(text,)] = conn.execute("SELECT books FROM missions WHERE id = ?", (mission_id,))
    books = chain_books.write(chain_books.added(chain_books.read(text), change))
    conn.execute("UPDATE missions SET books = ? WHERE id = ?", (books, mission_id))


def append_events(path: Path, mission_id: str, count: int, *, batch: int = 10_000) -> None:
    """Append ``count`` correctly chained audit events to a mission's chain and
    move its head, in one transaction, a batch at a time (so that building a
    chain of millions holds only one batch in memory)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        seq, prev = conn.execute(
            "SELECT audit_seq, audit_hash FROM missions WHERE id = ?", (mission_id,)
        ).fetchone()
        prev = prev or genesis(mission_id)
        at_us = time.time_ns() // 1000
        payload = '{"bench":true}'
        payload_hash = digest(payload)
        while count > 0:
            chained = []
            for _ in range(min(batch, count)):
                seq += 1
                ev = {
                    "mission_id": mission_id,
                    "seq": seq,
                    "at_us": at_us,
                    "actor": "agent",
                    "segment": "seg-1",
                    "epoch": 1,
                    "kind": "bench.event",
                    "entity": f"bench/{seq}",
                    "before": None,
                    "after": None,
                    "payload": payload,
                    "payload_hash": payload_hash,
                    "prev_hash": prev,
                }
                ev["hash"] = prev = event_hash(prev, {f: ev[f] for f in HASHED_FIELDS})
                chained.append(ev)
            _insert(conn, "audit_events", chained)
            count -= len(chained)
        _move_head(conn, mission_id, seq, prev)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def _move_head(conn: sqlite3.Connection, mission_id: str, seq: int, hash_: str) -> None:
    """Where the mission's chain now ends, on its row (as the engine keeps it)."""
    conn.execute(
        "UPDATE missions SET audit_seq = ?, audit_hash = ? WHERE id = ?", (seq, hash_, mission_id)
    )
