"""Which serialiser limits one mission shared by several worker processes?

A prototype on the raw driver (psycopg), before escrow was built: each process
makes "attempts" of two transactions (an admission and a settlement), each as
the engine's are on PostgreSQL: ``BEGIN``, a gate, a change to an allowance's
balances, an event row, the move of a chain head, ``COMMIT`` (``fsync`` and
``synchronous_commit`` as the server has them: on), sent as one pipeline. The
variants move the three things a transaction serialises on, one at a time,
from the mission to a row of the process's own:

- ``separate``  every process its own mission: gate, allowance and head its own;
- ``shared``    one mission: its gate (exclusive), its allowance row, its head;
- ``no gate``   one mission, no advisory lock: the two rows' locks still queue;
- ``allowance`` only the allowance row shared (head and gate each process's own);
- ``head``      only the chain head shared (allowance and gate each process's own);
- ``escrow``    the mission's gate taken *shared*, allowance and head a slice's own.

    python3 bench/fleet_prototype.py postgresql://bench@127.0.0.1:55432/postgres
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from typing import Any

SECONDS = 3.0
VARIANTS = ("separate", "shared", "no gate", "allowance", "head", "escrow")
PROCESSES = (1, 2, 4)

_SCHEMA = (
    "DROP TABLE IF EXISTS p_heads, p_balances, p_events",
    "CREATE TABLE p_heads (id TEXT PRIMARY KEY, seq BIGINT NOT NULL, hash TEXT NOT NULL)",
    "CREATE TABLE p_balances (id TEXT PRIMARY KEY, available BIGINT NOT NULL, "
    "held BIGINT NOT NULL, spent BIGINT NOT NULL)",
    "CREATE TABLE p_events (chain TEXT NOT NULL, seq BIGSERIAL, payload TEXT NOT NULL, "
    "PRIMARY KEY (chain, seq))",
)


def _keys(variant: str, me: int) -> tuple[str | None, str, str, str]:
    """(gate lock, allowance row, head row) for process ``me``; the gate's kind."""
    own, mission = f"w{me}", "m"
    return {
        "separate": ("x", own, own, own),
        "shared": ("x", mission, mission, mission),
        "no gate": (None, mission, mission, mission),
        "allowance": ("x", own, mission, own),
        "head": ("x", own, own, mission),
        "escrow": ("s", mission, own, own),
    }[variant]


def _worker(url: str, variant: str, me: int, barrier: Any, out: Any) -> None:
    import psycopg

    kind, gate, allowance, head = _keys(variant, me)
    lock = {
        "x": "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
        "s": "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))",
    }.get(kind or "")
    with psycopg.connect(url) as conn:
        barrier.wait()
        done, start = 0, time.perf_counter()
        end = start + SECONDS
        while time.perf_counter() < end:
            for move in ((-1, 1, 0), (1, -1, 0)):  # admission (hold), settlement (release)
                with conn.transaction(), conn.pipeline():
                    if lock is not None:
                        conn.execute(lock, (gate,))
                    conn.execute(
                        "UPDATE p_balances SET available = available + %s, held = held + %s, "
                        "spent = spent + %s WHERE id = %s",
                        (*move, allowance),
                    )
                    conn.execute(
                        "INSERT INTO p_events (chain, payload) VALUES (%s, %s)", (head, "x" * 300)
                    )
                    conn.execute(
                        "UPDATE p_heads SET seq = seq + 1, hash = %s WHERE id = %s",
                        ("h" * 64, head),
                    )
            done += 1
        out.put((done, time.perf_counter() - start))


def measure(url: str, variant: str, processes: int) -> float:
    """Attempts a second made by ``processes`` processes of ``variant``."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, variant, me, barrier, out))
        for me in range(processes)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    return float(sum(n for n, _ in results) / max(s for _, s in results))


def main(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for sql in _SCHEMA:
            conn.execute(sql)
        for key in ["m", *(f"w{i}" for i in range(max(PROCESSES)))]:
            conn.execute("INSERT INTO p_heads VALUES (%s, 0, '')", (key,))
            conn.execute("INSERT INTO p_balances VALUES (%s, 1000000000, 0, 0)", (key,))
    print(f"{'variant':<10} " + " ".join(f"{n} proc".rjust(9) for n in PROCESSES))
    for variant in VARIANTS:
        rates = [measure(url, variant, n) for n in PROCESSES]
        print(f"{variant:<10} " + " ".join(f"{r:9.0f}" for r in rates), flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_SCHEMA[0])


if __name__ == "__main__":
    main(sys.argv[1])
