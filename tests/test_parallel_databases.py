"""Test processes that run at once never share a PostgreSQL database.

``python3 tasks.py test`` runs the suite over several pytest-xdist workers, and
the tests' engines are deterministic: the same manual clock and seeded random
source give the same mission ids in every test. A schema per test keeps their
tables apart, but not what PostgreSQL keeps per database: advisory locks (a
mission's gate is one, keyed by the mission's id) and LISTEN/NOTIFY channels
(the run queue's). So each test process works in a database of its own
(``conftest.database``), created when its session starts and dropped when it
ends. These tests show that two such databases share no gate, no notice and no
table, and that a real two-worker run gets two of them and leaves neither.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import charter
from charter.queue.store import CHANNEL
from charter.testing import ManualClock
from conftest import ADMIN_URL, PG_DATABASE, PG_URL, WORKER, database, default_contract

pytestmark = pytest.mark.skipif(ADMIN_URL is None, reason="needs CHARTER_TEST_POSTGRES_URL")

ROOT = Path(__file__).resolve().parent.parent
#: A mission's gate, as ``charter.storage.postgres`` takes it, tried without waiting.
TRY_GATE = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"


def _databases() -> set[str]:
    import psycopg

    assert ADMIN_URL is not None
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        return {r[0] for r in admin.execute("SELECT datname FROM pg_database").fetchall()}


def test_this_test_process_works_in_a_database_named_after_its_worker() -> None:
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(PG_URL) as con:
        row = con.execute("SELECT current_database()").fetchone()
    assert row == (PG_DATABASE,)
    assert PG_DATABASE.endswith(f"_{WORKER}")
    assert PG_DATABASE in _databases()


def test_two_workers_databases_share_no_gate_no_notice_and_no_table(
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    import psycopg

    assert ADMIN_URL is not None
    run = uuid.uuid4().hex[:12]
    with (
        database(ADMIN_URL, f"charter_{run}_gw0") as one,
        database(ADMIN_URL, f"charter_{run}_gw1") as two,
    ):
        missions = []
        for url in (one, two):  # the same clock and seed in each, as two workers' tests have
            config = charter.EngineConfig(credentials=creds[1])
            with charter.Engine.open(
                url, config=config, clock=ManualClock(), rng=random.Random(0)
            ) as eng:
                alice = eng.authenticate(creds[0]["alice"])
                missions.append(eng.create_mission(default_contract(), by=alice))
                assert [m.id for m in eng.missions()] == missions[-1:]
        mission = missions[0]
        assert missions == [mission, mission]  # one id in both: their gates have one key

        with (
            psycopg.connect(one) as holder,
            psycopg.connect(one, autocommit=True) as same,
            psycopg.connect(two, autocommit=True) as other,
        ):
            holder.execute(TRY_GATE, (mission,))  # held until ``holder``'s transaction ends
            assert same.execute(TRY_GATE, (mission,)).fetchone() == (False,)
            assert other.execute(TRY_GATE, (mission,)).fetchone() == (True,)

            same.execute(f"LISTEN {CHANNEL}")
            other.execute("SELECT pg_notify(%s, 'from the other worker')", (CHANNEL,))
            holder.execute("SELECT pg_notify(%s, 'from this worker')", (CHANNEL,))
            holder.commit()
            heard = [n.payload for n in same.notifies(timeout=1.0, stop_after=2)]
            assert heard == ["from this worker"]

            other.execute("CREATE TABLE probe (n int)")
            assert same.execute("SELECT to_regclass('probe')").fetchone() == (None,)
    assert not {f"charter_{run}_gw0", f"charter_{run}_gw1"} & _databases()


def test_a_two_worker_run_gets_two_databases_and_drops_both(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CHARTER_PROBE"))}
    env["CHARTER_PROBE_DIR"] = str(seen)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
    command += ["--dist", "each", "--basetemp", str(tmp_path / "t"), "-q"]
    done = subprocess.run(
        [*command, "tests/_parallel_probe.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    names = {p.name: p.read_text() for p in seen.iterdir()}
    assert set(names) == {"gw0", "gw1"}
    assert names["gw0"] != names["gw1"]
    for worker, name in names.items():
        assert name.startswith("charter_") and name.endswith(f"_{worker}")
    assert not set(names.values()) & _databases()  # each dropped when its worker ended
