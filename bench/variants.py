"""Record variants measured and not kept: what each would have cost an attempt.

    .venv/bin/python bench/variants.py   # the environment tasks.py makes

Each variant is measured against today's record in the same run, on a store
the engine itself wrote (one mission, one run, 300 attempts settled first):

- ``attempts WITHOUT ROWID``: the attempts table clustered on its id, which
  would spare its separate key index. The log pages 64 attempts write, by
  B-tree (``charter_bench.log_pages``), before and after rebuilding the table so.
- ``status read in RETURNING``: the settlement's read of its run's status
  (``runs.store``) sent as the ``RETURNING`` clause of its decisive update, one
  statement instead of two. Raw ``sqlite3`` in a transaction rolled back each
  time, interleaved: the read and the update, the folded update, and for scale
  the update alone and with ``RETURNING 1``.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from charter_bench import CONTRACT, log_pages
from timing import Sample

import charter
from charter.runs import store as runs_store
from charter.testing import RecordingAdapter, credential

_WARM = 300
_PAGES_OVER = 64
_TIMES = 3_000


def _store(folder: Path) -> tuple[Path, charter.EngineConfig, str, str, str]:
    """A store with ``_WARM`` settled attempts and one more admitted; its path,
    configuration, agent credential, run and the admitted attempt."""
    path = folder / "charter.db"
    cred, digest = credential("agent")
    config = charter.EngineConfig(credentials={"agent": digest})
    with charter.Engine.open(str(path), config=config) as engine:
        agent = engine.authenticate(cred)
        mission = engine.create_mission(CONTRACT, by=agent)
        ex = engine.start_run(mission, by=agent, segment_id="warm")
        for k in range(_WARM):
            ex.perform(RecordingAdapter(), "write", {"k": k}, effect_key=f"w{k}")
        admitted = ex.admit(RecordingAdapter(), "write", {"k": -1}, effect_key="held").id
    return path, config, cred, ex.run_id, admitted


def _without_rowid(path: Path) -> None:
    """Rebuild ``attempts`` clustered on its id, with its indexes as they were."""
    with sqlite3.connect(path, isolation_level=None) as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'attempts'").fetchone()
        indexes = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE tbl_name = 'attempts' AND type = 'index' "
            "AND sql IS NOT NULL"
        ).fetchall()
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("BEGIN")
        conn.execute(
            sql.replace("CREATE TABLE attempts", "CREATE TABLE rebuilt") + " WITHOUT ROWID"
        )
        conn.execute("INSERT INTO rebuilt SELECT * FROM attempts")
        conn.execute("DROP TABLE attempts")
        conn.execute("ALTER TABLE rebuilt RENAME TO attempts")
        for (index,) in indexes:
            conn.execute(index)
        conn.execute("COMMIT")
    conn.close()


def pages(rebuilt: bool) -> dict[str, float]:
    """Log pages an attempt writes, by B-tree, with ``attempts`` as today or rebuilt."""
    with tempfile.TemporaryDirectory() as folder:
        path, config, cred, _, _ = _store(Path(folder))
        if rebuilt:
            _without_rowid(path)
        with charter.Engine.open(str(path), config=config) as engine:
            agent = engine.authenticate(cred)
            mission = engine.missions()[0].id
            return log_pages(engine, agent, mission, _PAGES_OVER)


def _folded() -> str:
    """The status read as a RETURNING clause: each column one lookup by key."""
    return (
        "RETURNING (SELECT status FROM runs WHERE id = attempts.run_id) AS status, "
        "(SELECT COUNT(*) FROM escrow_slices s WHERE s.mission_id = attempts.mission_id "
        "AND s.status = 'open') AS slices, "
        "(SELECT COUNT(*) FROM attempts a WHERE a.run_id = attempts.run_id AND a.tallied = 0 "
        f"AND a.status IN {runs_store._SETTLED_SQL} AND a.id <> attempts.id) AS untallied, "
        "attempts.mission_id AS head_of, "
        + ", ".join(
            f"(SELECT {c} FROM missions WHERE id = attempts.mission_id) AS head_{n}"
            for n, c in (("seq", "audit_seq"), ("hash", "audit_hash"), ("sealed", "audit_sealed"))
        )
        + ", (SELECT books FROM missions WHERE id = attempts.mission_id) AS head_books"
    )


def statements() -> dict[str, Sample]:
    """Microseconds of SQLite (and its Python call) per settlement shape."""
    with tempfile.TemporaryDirectory() as folder:
        path, _, _, run_id, attempt = _store(Path(folder))
        conn = sqlite3.connect(path, isolation_level=None)
        update = "UPDATE attempts SET status = 'succeeded', reason = ? WHERE id = ? "
        update += "AND status = 'prepared'"
        read = runs_store._STATUS_AHEAD
        shapes: dict[str, Callable[[int], Any]] = {
            "read, then update": lambda i: (
                conn.execute(read, (run_id,)).fetchone(),
                conn.execute(update, (str(i), attempt)),
            ),
            "update RETURNING the read": lambda i: conn.execute(
                f"{update} {_folded()}", (str(i), attempt)
            ).fetchall(),
            "update alone": lambda i: conn.execute(update, (str(i), attempt)),
            "update RETURNING 1": lambda i: conn.execute(
                f"{update} RETURNING 1", (str(i), attempt)
            ).fetchall(),
        }
        samples = {name: Sample("µs") for name in shapes}
        for i in range(_TIMES):  # interleaved: drift hits every shape alike
            for name, shape in shapes.items():
                conn.execute("BEGIN")
                t0 = time.perf_counter()
                shape(i)
                samples[name].values.append((time.perf_counter() - t0) * 1e6)
                conn.execute("ROLLBACK")
        conn.close()
        return samples


def main() -> None:
    today, rebuilt = pages(False), pages(True)
    trees = sorted({*today, *rebuilt} - {"total"})
    after = f"{_PAGES_OVER} attempts after {_WARM}; SQLite {sqlite3.sqlite_version}"
    print(f"log pages per attempt ({after})")
    print(f"  {'B-tree':<32} {'today':>7} {'WITHOUT ROWID':>14}")
    for tree in [*trees, "total"]:
        print(f"  {tree:<32} {today.get(tree, 0):>7.2f} {rebuilt.get(tree, 0):>14.2f}")
    print(f"\nthe settlement's status read and decisive update ({_TIMES} each, median µs)")
    for name, sample in statements().items():
        print(f"  {name:<28} {sample.median:>6.1f}  (min {sample.low:.1f})")


if __name__ == "__main__":
    main()
