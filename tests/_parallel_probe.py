"""One test that ``test_parallel_databases.py`` runs on two pytest-xdist workers
at once (``--dist each``): each writes a table of a fixed name into its process's
database, tells which database it is in, waits until the other worker has done
the same, and checks that it sees only its own row."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg

from conftest import PG_URL, WORKER


def test_each_worker_sees_only_its_own_table() -> None:
    seen = Path(os.environ["CHARTER_PROBE_DIR"])
    assert PG_URL is not None
    with psycopg.connect(PG_URL, autocommit=True) as con:
        # A fixed name: the second CREATE fails if the workers share a database.
        con.execute("CREATE TABLE probe (worker text)")
        con.execute("INSERT INTO probe VALUES (%s)", (WORKER,))
        row = con.execute("SELECT current_database()").fetchone()
        assert row is not None
        (seen / WORKER).write_text(row[0])
        deadline = time.monotonic() + 60
        while len(list(seen.iterdir())) < 2:  # both tables exist at once from here on
            assert time.monotonic() < deadline, "the other worker never wrote its table"
            time.sleep(0.05)
        assert con.execute("SELECT worker FROM probe").fetchall() == [(WORKER,)]
