"""The peers and the floor, each measured doing N durable steps in a row.

- **raw floor**: what one attempt must at least cost: two transactions, each
  one ``INSERT`` and a ``COMMIT``, on SQLite in WAL with ``synchronous=FULL``
  (Charter's settings) on a file in steady state, or on PostgreSQL with the
  server's defaults in one round trip per commit;
- **DBOS**: one workflow of N ``@DBOS.step`` calls, on DBOS's own SQLite system
  database (``sqlite:///...``) as shipped and with the file in WAL, or on
  PostgreSQL;
- **LangGraph**: one graph run of N supersteps (a node that loops on itself)
  with ``durability="sync"``, checkpointed by ``SqliteSaver`` or
  ``PostgresSaver``.

Each function runs in its own process (DBOS is a process-wide singleton) and
returns the seconds per step of each repetition: the whole unit — workflow,
graph run or loop — divided by N, so start and end costs are spread over N.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, TypedDict

from timing import clock, repeat


def _sqlite_settings(conn: sqlite3.Connection) -> dict[str, Any]:
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {"journal_mode": journal, "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL"}.get(sync)}


# -- the raw floor ---------------------------------------------------------------------
#: Commits made on the floor's file before it is timed: past SQLite's first
#: automatic checkpoint (1,000 pages), so the write-ahead log has its full size
#: and is reused from its start. A fresh file's log still grows, and every sync
#: then also writes the file's new size, which Charter's own warm-up leaves
#: behind (one warm-up unit of its attempts writes thousands of pages).
FLOOR_PREWARM_COMMITS = 2_500


def floor_sqlite(workdir: str, steps: int, warmup: int, reps: int) -> dict[str, Any]:
    """Two commits per step, each one ``INSERT``, on a file in steady state."""
    path = Path(workdir) / "floor.db"
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE effects (id INTEGER PRIMARY KEY, step INTEGER NOT NULL, "
        "phase TEXT NOT NULL, body TEXT NOT NULL)"
    )
    body = '{"request":{"k":0},"status":"prepared"}'

    def commit(k: int, phase: str) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO effects (step, phase, body) VALUES (?, ?, ?)", (k, phase, body))
        conn.execute("COMMIT")

    t0 = clock()
    for k in range(FLOOR_PREWARM_COMMITS):
        commit(k, "prewarm")
    fresh = (clock() - t0) / FLOOR_PREWARM_COMMITS * 2

    def once(_: int) -> float:
        t0 = clock()
        for k in range(steps):
            commit(k, "dispatched")
            commit(k, "settled")
        return (clock() - t0) / steps

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    settings = _sqlite_settings(conn)
    wal = path.with_name(path.name + "-wal")
    conn.close()
    return {
        "sample": sample.to_dict(),
        "settings": settings,
        "prewarm_commits": FLOOR_PREWARM_COMMITS,
        "fresh_file_per_step": fresh,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
    }


def floor_postgres(
    url: str, steps: int, warmup: int, reps: int, read_first: bool = False
) -> dict[str, Any]:
    """Two commits per step, each one ``INSERT`` in its own implicit transaction:
    one round trip per durable commit, the least a networked store can do.

    ``read_first``: each commit is a transaction that first reads a row and
    waits for it (``BEGIN`` and the read in one round trip), then sends the
    ``INSERT`` with ``COMMIT`` (a second): the shape of a transaction that
    decides on what it read, as Charter's do. What it adds to the floor is
    what a second round trip costs here.
    """
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(
        "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, step INTEGER NOT NULL, "
        "phase TEXT NOT NULL, body TEXT NOT NULL)"
    )
    conn.execute("CREATE TABLE heads (id INTEGER PRIMARY KEY, seq BIGINT NOT NULL)")
    conn.execute("INSERT INTO heads VALUES (1, 0)")
    body = '{"request":{"k":0},"status":"prepared"}'
    insert = "INSERT INTO effects (step, phase, body) VALUES (%s, %s, %s)"

    def commit(k: int, phase: str) -> None:
        if not read_first:
            conn.execute(insert, (k, phase, body), prepare=True)
            return
        with conn.pipeline():
            conn.execute("BEGIN")
            read = conn.execute("SELECT seq FROM heads WHERE id = 1", prepare=True)
        read.fetchone()
        with conn.pipeline():
            conn.execute(insert, (k, phase, body), prepare=True)
            conn.execute("COMMIT")

    def once(_: int) -> float:
        t0 = clock()
        for k in range(steps):
            commit(k, "dispatched")
            commit(k, "settled")
        return (clock() - t0) / steps

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    settings = {
        name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
        for name in ("fsync", "synchronous_commit", "wal_sync_method")
    }
    conn.close()
    return {
        "sample": sample.to_dict(),
        "settings": settings,
        "round_trips_per_commit": 2 if read_first else 1,
    }


# -- DBOS ---------------------------------------------------------------------------------
def dbos_steps(url: str, steps: int, warmup: int, reps: int, wal: bool = False) -> dict[str, Any]:
    """A DBOS workflow of ``steps`` no-op steps; ``url`` is DBOS's system database.

    ``wal`` puts DBOS's SQLite file in write-ahead-log mode before DBOS opens
    it (the mode is kept in the file); DBOS as shipped uses SQLite's default
    rollback journal, which costs several syncs per commit.
    """
    from importlib.metadata import version

    from dbos import DBOS

    if wal and url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()

    @DBOS.step()
    def noop(k: int) -> int:
        return k

    @DBOS.workflow()
    def workflow(n: int) -> int:
        total = 0
        for k in range(n):
            total += noop(k)
        return total

    DBOS(config={"name": "charter-bench", "system_database_url": url})
    DBOS.launch()
    try:

        def once(_: int) -> float:
            t0 = clock()
            result = workflow(steps)
            elapsed = clock() - t0
            assert result == steps * (steps - 1) // 2
            return elapsed / steps

        sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    finally:
        DBOS.destroy()
    settings: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        settings = _sqlite_settings(conn)  # a new connection sees what DBOS's do
        conn.close()
    return {"sample": sample.to_dict(), "settings": settings, "version": version("dbos")}


# -- LangGraph ---------------------------------------------------------------------------
class LoopState(TypedDict):
    i: int
    n: int


def _loop_step(state: LoopState) -> dict[str, int]:
    return {"i": state["i"] + 1}


def _loop_route(state: LoopState) -> str:
    from langgraph.graph import END

    return "step" if state["i"] < state["n"] else END


def _loop_graph(checkpointer: Any) -> Any:
    """One node that loops on itself: N supersteps, one checkpoint each."""
    from langgraph.graph import START, StateGraph

    builder = StateGraph(LoopState)
    builder.add_node("step", _loop_step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", _loop_route)
    return builder.compile(checkpointer=checkpointer)


def _graph_runs(graph: Any, steps: int, warmup: int, reps: int) -> Any:
    def once(i: int) -> float:
        config = {"configurable": {"thread_id": f"bench-{i}"}, "recursion_limit": steps + 10}
        t0 = clock()
        out = graph.invoke({"i": 0, "n": steps}, config, durability="sync")
        elapsed = clock() - t0
        assert out["i"] == steps
        return elapsed / steps

    return repeat(once, warmup=warmup, reps=reps, unit="s")


def langgraph_sqlite(workdir: str, steps: int, warmup: int, reps: int) -> dict[str, Any]:
    from importlib.metadata import version

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(Path(workdir) / "langgraph.sqlite"), check_same_thread=False)
    graph = _loop_graph(SqliteSaver(conn))
    sample = _graph_runs(graph, steps, warmup, reps)
    settings = _sqlite_settings(conn)
    checkpoints = conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    conn.close()
    return {
        "sample": sample.to_dict(),
        "settings": settings,
        "checkpoints": checkpoints,
        "version": version("langgraph"),
        "saver_version": version("langgraph-checkpoint-sqlite"),
    }


def langgraph_postgres(url: str, steps: int, warmup: int, reps: int) -> dict[str, Any]:
    from importlib.metadata import version

    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        graph = _loop_graph(saver)
        sample = _graph_runs(graph, steps, warmup, reps)
    return {
        "sample": sample.to_dict(),
        "version": version("langgraph"),
        "saver_version": version("langgraph-checkpoint-postgres"),
    }
