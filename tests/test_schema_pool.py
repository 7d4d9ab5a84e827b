"""A PostgreSQL schema handed from one test to the next holds nothing of the first.

The tests' PostgreSQL stores are schemas made once per test process and made new
again between tests (``_schemas.py``): a test given one must find exactly what a
schema just made by the store's migrations holds, whatever the test before it
wrote, changed or left connected. Each test here works in a database of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import charter
from _schemas import SchemaPool, store_url
from charter.testing import RecordingAdapter, credential
from conftest import ADMIN_URL, database, default_contract

pytestmark = pytest.mark.skipif(ADMIN_URL is None, reason="needs CHARTER_TEST_POSTGRES_URL")


@pytest.fixture
def pool() -> Iterator[SchemaPool]:
    assert ADMIN_URL is not None
    with database(ADMIN_URL, f"charter_pool_{uuid.uuid4().hex[:12]}") as url:
        yield SchemaPool(url)


def schemas(pool: SchemaPool) -> set[str]:
    with pool._admin() as admin:
        rows = admin.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 't\\_%'")
        return {r[0] for r in rows}


def rows(pool: SchemaPool, schema: str) -> dict[str, list[Any]]:
    """Every row of every table in ``schema``, by table."""
    with pool._admin() as admin:
        tables = admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        ).fetchall()
        return {
            t: admin.execute(f'SELECT * FROM "{schema}"."{t}" ORDER BY 1').fetchall()
            for (t,) in tables
        }


def work(url: str) -> None:
    """A mission, a run and two settled attempts: rows in most tables, the ledger's
    sequence moved on."""
    agent, alice = credential("agent"), credential("alice")
    config = charter.EngineConfig(credentials={"agent": agent[1], "alice": alice[1]})
    contract = default_contract(principals={"agent": {"run": ["recorder.*"]}, "alice": ["stop"]})
    with charter.Engine.open(url, config=config) as engine:
        mission = engine.create_mission(contract, by=engine.authenticate(alice[0]))
        run = engine.start_run(mission, by=engine.authenticate(agent[0]), segment_id="s1")
        adapter = RecordingAdapter(costs={"write": {"usd": 5, "calls": 1}})
        for k in range(2):
            run.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
        run.finish()


def test_a_schema_given_back_is_handed_on_holding_what_a_new_one_holds(pool: SchemaPool) -> None:
    made = pool.take()
    new = rows(pool, made)
    work(store_url(pool.database_url, made))
    assert rows(pool, made) != new
    pool.give_back(made)
    again = pool.take()
    assert again != made  # renamed: a straggler with the old URL finds no store
    assert schemas(pool) == {again}
    assert rows(pool, again) == new
    work(store_url(pool.database_url, again))  # the same mission ids, the sequence from 1


def test_a_schema_its_test_changed_is_dropped_not_handed_on(pool: SchemaPool) -> None:
    for change in (
        "DROP INDEX attempts_untallied",
        "CREATE TABLE in_the_way (x int)",
        "ALTER TABLE runs ADD COLUMN extra int",
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;"
        " CREATE TRIGGER refuse BEFORE INSERT ON attempts FOR EACH ROW EXECUTE FUNCTION refuse()",
    ):
        made = pool.take()
        with pool._admin() as admin:
            admin.execute(f'SET search_path = "{made}"; {change}')
        pool.give_back(made)
        assert schemas(pool) == set(), change


def test_a_session_left_connected_is_ended_and_a_straggler_finds_no_store(
    pool: SchemaPool,
) -> None:
    import psycopg

    made = pool.take()
    url = store_url(pool.database_url, made)
    left = psycopg.connect(url, autocommit=True)
    holding = psycopg.connect(url)
    holding.execute("SELECT * FROM runs FOR UPDATE")  # a transaction left open
    pool.give_back(made)
    for ended in (left, holding):
        with pytest.raises(psycopg.OperationalError):
            ended.execute("SELECT 1")
        ended.close()
    assert len(pool.idle) == 1
    with (
        psycopg.connect(url, autocommit=True) as straggler,
        pytest.raises(psycopg.errors.UndefinedTable),
    ):
        straggler.execute("SELECT * FROM runs")


def test_a_bare_schema_holds_nothing_and_is_dropped(pool: SchemaPool) -> None:
    made = pool.bare()
    assert rows(pool, made) == {}
    pool.give_back(made, reuse=False)
    assert schemas(pool) == set() and pool.idle == []
