"""What an attempt's record costs SQLite by itself: its statements, replayed.

The statements one attempt sends to its SQLite store (both transactions,
``BEGIN`` to ``COMMIT``) are captured off the store driver, then sent again
many times on a plain ``sqlite3`` connection to the same file, with the
settings Charter's own connection has (WAL, ``synchronous=FULL``, the same
checkpoint interval, foreign keys on). Each replay gets a fresh attempt id,
effect key and audit sequence numbers, so every row is new, as it is for a
real attempt; nothing else is computed (no hashing, no rules, no JSON).

Charter's time per attempt minus this is what its own code adds; this minus
the floor is what the record adds: its statements and the pages they write.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from timing import Sample, clock, repeat, row

import charter
from charter.storage.sqlite import SQLiteDriver
from charter.testing import RecordingAdapter

Statement = tuple[str, tuple[Any, ...]]


def capture(engine: charter.Engine, agent: charter.Principal, mission: str) -> dict[str, Any]:
    """The statements of one attempt (after one that prepares the statements),
    with the attempt's id and effect key, which a replay renames."""
    driver: Any = engine._db.driver  # not public API: this explains a figure
    ex = engine.start_run(mission, by=agent, segment_id="seg-replay")
    adapter = RecordingAdapter()
    ex.perform(adapter, "write", {"k": -1}, effect_key="replay-warm")
    sent: list[Statement] = []
    changed: list[int] = []
    original = driver.execute

    def recording(sql: str, params: Sequence[Any]) -> Any:
        sent.append((sql, tuple(params)))
        result = original(sql, params)
        changed.append(result.rowcount)
        return result

    driver.execute = recording
    try:
        attempt = ex.perform(adapter, "write", {"k": 0}, effect_key="replay")
    finally:
        del driver.execute
    ex.finish()
    return {
        "statements": sent,
        "rowcounts": changed,
        "attempt_id": attempt.id,
        "effect_key": "replay",
    }


def _seq_positions(sql: str, n_params: int) -> list[int]:
    """Where the audit sequence numbers are among a statement's parameters."""
    if sql.startswith("INSERT INTO audit_events"):
        width = sql[sql.index("(") + 1 : sql.index(")")].count(",") + 1
        return list(range(1, n_params, width))  # seq is the second column
    if sql.startswith("UPDATE") and "audit_seq = ?" in sql:
        return [sql[: sql.index("audit_seq = ?")].count("?")]
    return []


def _renamed(captured: dict[str, Any], i: int, seq_shift: int) -> list[Statement]:
    """Replay ``i`` of the captured statements: a new id, key and sequence numbers."""
    old_id, old_key = captured["attempt_id"], captured["effect_key"]
    new_id = old_id[:-6] + f"{i:06d}"
    out: list[Statement] = []
    for sql, params in captured["statements"]:
        values: list[Any] = [
            (f"{old_key}-{i}" if v == old_key else v.replace(old_id, new_id))
            if isinstance(v, str)
            else v
            for v in params
        ]
        for at in _seq_positions(sql, len(values)):
            values[at] += seq_shift
        out.append((sql, tuple(values)))
    return out


def replay(
    store: Path, captured: dict[str, Any], steps: int, warmup: int, reps: int
) -> dict[str, Any]:
    """Time units of ``steps`` replays (wall and process CPU per attempt)."""
    inserts = [
        (sql, p) for sql, p in captured["statements"] if sql.startswith("INSERT INTO audit_events")
    ]
    assert inserts, "the captured attempt wrote no audit event"
    mission, first = inserts[0][1][0], inserts[0][1][1]
    events = sum(len(_seq_positions(sql, len(p))) for sql, p in inserts)
    cpu = Sample("s")
    with closing(sqlite3.connect(str(store), isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint={SQLiteDriver.checkpoint_pages}")
        conn.execute("PRAGMA foreign_keys=ON")
        # Sequence numbers past the chain's head (the run's finish appended to it).
        (head,) = conn.execute(
            "SELECT MAX(seq) FROM audit_events WHERE mission_id = ?", (mission,)
        ).fetchone()

        def renamed(n: int) -> list[Statement]:
            return _renamed(captured, n, head + 1 - first + n * events)

        # A replay changes what the attempt changed, row for row, or it would time
        # less work than the attempt did.
        seen = [conn.execute(sql, params).rowcount for sql, params in renamed(0)]
        assert seen == captured["rowcounts"], (seen, captured["rowcounts"])
        # Everything a replay sends is prepared before the clock starts.
        units = [
            [renamed(n) for n in range(1 + u * steps, 1 + (u + 1) * steps)]
            for u in range(warmup + reps)
        ]

        def once(u: int) -> float:
            t0, c0 = clock(), time.process_time()
            for attempt in units[u]:
                for sql, params in attempt:
                    conn.execute(sql, params).fetchall()
            t1, c1 = clock(), time.process_time()
            n = len(units[u])
            (cpu.warmup if u < warmup else cpu.values).append((c1 - c0) / n)
            return (t1 - t0) / n

        sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    return {
        "sample": sample.to_dict(),
        "cpu": cpu.to_dict(),
        "statements": len(captured["statements"]),
        "replayed": 1 + sum(len(unit) for unit in units),
    }


#: What one attempt may send and write (docs/record.md): (what, its key in the
#: bench's shape, the store, the most it may be).
SHAPE_TARGETS = (
    ("statements per attempt", "statements", "sqlite", 10),
    ("log pages per attempt", "log_pages", "sqlite", 6),
    ("round trips per attempt", "round_trips", "postgresql", 2),
)


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What an attempt sends to its store and writes to SQLite's log, counted
    after the timed runs (charter_bench.attempt_shape), against docs/record.md's aims."""
    out = []
    for what, key, backend, most in SHAPE_TARGETS:
        shape = results["attempts"].get(backend, {}).get("charter", {}).get("shape", {})
        value = shape.get(key)
        if isinstance(value, dict):  # log pages: by B-tree, with their total
            value = value.get("total")
        label = "SQLite" if backend == "sqlite" else "PostgreSQL"
        beside = f"{shape['statements']:g} statements" if key == "round_trips" else ""
        out.append(
            row(
                f"{what} ({label})",
                "pending" if value is None else f"{value:.1f}",
                beside,
                value=value,
                shown="" if value is None else f"{value:.1f}",
                target=most,
                target_text=f"≤ {most}",
            )
        )
    return out
